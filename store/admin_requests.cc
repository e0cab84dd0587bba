#include "store/admin_requests.h"

#include <unistd.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <bit>

#include "depot/ipc/protocol.h"
#include "depot/ipc/units.h"
#include "info_fields.h"
#include "store/largest_scan.h"
#include "store/version.h"

namespace depot::store {

namespace {

// Most objects in one page of a list reply, and about the most bytes.
constexpr uint32_t kMaxListPage = 10'000;
// The longest prefix a list may filter names by: the longest name (data_requests.cc).
constexpr size_t kMaxListPrefixBytes = 4096;
constexpr size_t kMaxListReplyBytes = 1u << 20;
// What an object costs in a list reply besides its name (ObjectInfo, a little generously).
constexpr size_t kListEntryBytes = 192;
// The disk tier in a `show` reply's replicas (protocol.capnp Replica.device).
constexpr int32_t kWireDisk = -2;
// A slice of a job (SliceQueue) looks at this many header slots, or writes this many list
// entries, or starts verifying this many objects: each a few microseconds (bench_fairness),
// since a request arriving meanwhile waits for about two slices.
constexpr uint32_t kSliceSlots = 1024;
constexpr uint32_t kSliceEntries = 8;
constexpr size_t kSliceVerifies = 8;
// Batches of a verify hashing on the workers at once.
constexpr int kVerifiesInFlight = 8;
// Most results in one page of a verify of every object.
constexpr uint32_t kVerifyPage = 4096;
// What a list job holds per object at most (scan entry, found entry, reply entry), and a
// verify job (id, batch copy, result), counted against the client's limits while it runs.
constexpr uint32_t kListJobEntryBytes = 48 + 24 + kListEntryBytes;
constexpr uint32_t kVerifyJobEntryBytes = 16 + 16 + 48;

// What the daemon knows of one object, as the admin replies give it.
depot::ObjectInfo InfoOf(const ObjectView& v) {
  depot::ObjectInfo o{
      .id = v.id,
      .name = v.name,
      .state = v.sealed ? ObjectState::kSealed : ObjectState::kCreating,
      .data_size = v.data_size,
      .metadata_size = v.metadata_size,
      .ref_count = static_cast<uint32_t>(v.references),
      .pinned = v.pinned,
      .delete_pending = v.delete_pending,
      .has_checksum = v.has_checksum,
      .checksum = v.checksum,
      .create_time_ns = v.create_time_ns,
      .access_time_ns = v.access_time_ns,
      .segment = v.segment,
      .offset = v.offset,
      .on_host = (v.tiers & ipc::kTierHost) != 0,
      .gpus = {},
      .owner_uid = v.owner_uid,
      .failed = v.failed,
      .on_disk = (v.tiers & ipc::kTierDisk) != 0,
  };
  const auto gpus = static_cast<size_t>(std::popcount(v.tiers & ipc::kTierGpus));
  for (uint32_t d = 0; o.gpus.size() < gpus; ++d) {
    if (v.tiers & ipc::TierBit(static_cast<int32_t>(d))) o.gpus.push_back(d);
  }
  return o;
}

depot::VerifyState Public(VerifyState state) {
  switch (state) {
    case VerifyState::kOk:
      return depot::VerifyState::kOk;
    case VerifyState::kMismatch:
      return depot::VerifyState::kMismatch;
    case VerifyState::kNoChecksum:
      return depot::VerifyState::kNoChecksum;
    case VerifyState::kNotFound:
      return depot::VerifyState::kNotFound;
    case VerifyState::kNotSealed:
      return depot::VerifyState::kNotSealed;
    case VerifyState::kNotOnHost:
      return depot::VerifyState::kNotOnHost;
  }
  return depot::VerifyState::kNotFound;
}

// Who holds an object, for `show`: a session, or the daemon itself for one of its parts.
depot::Holder HolderOf(const DaemonViews& daemon, const HolderInfo& held) {
  depot::Holder h{.session_id = held.client, .references = held.references};
  for (const auto& [device, references] : held.tiers) {
    h.tiers.push_back({.device = device == kDisk ? kWireDisk : device, .references = references});
  }
  const auto self = [&](uint32_t uid, const char* client_name) {
    h.pid = static_cast<uint32_t>(::getpid());
    h.uid = uid;
    h.command = "depotd";
    h.client_name = client_name;
  };
  if (held.client == kDaemonClient) {  // a verify or a copy between tiers reading the object
    self(::getuid(), "depotd (verify or copy)");
  } else if (held.client == kSchedulerClient) {  // the task graph: inputs of pending tasks
    self(::getuid(), "depotd (task graph)");
  } else if (const std::optional<uint32_t> uid = daemon.GroupUid(held.client)) {
    self(*uid, "group (handed off, not yet claimed)");
  } else if (const std::optional<ClientView> holder = daemon.FindClient(held.client)) {
    h.pid = static_cast<uint32_t>(holder->peer.pid);
    h.uid = holder->peer.uid;
    h.command = holder->peer.command;
    h.client_name = holder->client_name;
  }
  return h;
}
}  // namespace

GpuInfo GpuInfoOf(const ObjectStore& store, uint32_t device) {
  const gpu::DevicePool& pool = *store.pools()[device];
  const gpu::DeviceInfo& info = pool.info();
  GpuInfo g{
      .uuid = {},
      .name = info.name,
      .simulated = info.simulated,
      .total_bytes = info.total_bytes,
      .limit_bytes = pool.limit(),
      .reserved_bytes = pool.reserved_bytes(),
      .used_bytes = pool.used_bytes(),
      .held_bytes = store.device_usage(device).held_bytes,
      .chunks = pool.chunk_count(),
      .replicas = store.device_usage(device).replicas,
  };
  std::copy_n(info.uuid.begin(), std::min(info.uuid.size(), g.uuid.size()), g.uuid.begin());
  return g;
}

namespace {

std::vector<GpuInfo> GpusOf(const ObjectStore& store) {
  std::vector<GpuInfo> gpus;
  for (uint32_t d = 0; d < store.pools().size(); ++d) gpus.push_back(GpuInfoOf(store, d));
  return gpus;
}

// The disk tier's part of the status; all zero without one.
DiskStatus DiskStatusOf(const ObjectStore& store) {
  const DiskPool* pool = store.disk();
  if (pool == nullptr) return {};
  const TierCounters& t = store.tier_counters();
  return {
      .enabled = true,
      .dir = pool->dir(),
      .limit_bytes = pool->capacity(),
      .used_bytes = pool->used_bytes(),
      .file_bytes = pool->file_bytes(),
      .files = pool->file_count(),
      .objects = store.ObjectsOnDisk(),
      .spills = t.disk_spills,
      .spilled_bytes = t.disk_spilled_bytes,
      .spill_seconds = t.disk_spill_seconds,
      .restores = t.disk_restores,
      .restored_bytes = t.disk_restored_bytes,
      .restore_seconds = t.disk_restore_seconds,
      .drops = t.disk_drops,
      .dropped_bytes = t.disk_dropped_bytes,
      .spill_failures = t.disk_spill_failures,
      .restore_failures = t.disk_restore_failures,
      .copies_in_flight = store.DiskCopiesInFlight(),
      .direct_io = pool->direct_io(),
      .writes = t.disk_writes,
      .reads = store.DiskReads(),
  };
}

}  // namespace

StoreStatus StatusOf(const ObjectStore& store, const DaemonViews& daemon) {
  const Arena& arena = store.arena();
  const StoreCounters c = store.counters();
  StoreStatus s{
      .daemon_version = kDepotVersion,
      .pid = static_cast<uint32_t>(::getpid()),
      .uptime_ns = ipc::MonotonicNanos() - daemon.start_ns(),
      .socket_path = daemon.socket_path(),
      .arena_backend = arena.backend(),
      .capacity_bytes = arena.capacity(),
      .mapped_bytes = arena.mapped_bytes(),
      .used_bytes = arena.used_bytes(),
      .held_bytes = c.held_bytes,
      .pinned_bytes = c.pinned_bytes,
      .largest_free_block = arena.largest_free_block(),
      .kept_bytes = arena.kept_bytes(),
      .arena_page_bytes = arena.page_bytes(),
      .arena_pages = arena.page_note(),
      .segments = arena.segment_count(),
      .objects_sealed = c.objects_sealed,
      .objects_creating = c.objects_creating,
      .clients = static_cast<uint32_t>(daemon.session_count()),
      .evictions = c.evictions,
      .evicted_bytes = c.evicted_bytes,
      .eviction_enabled = store.eviction_enabled(),
      .header_slots = store.headers().slots(),
      .requests = daemon.requests(),
      .gpus = GpusOf(store),
      .gpu_backend = daemon.device_backend(),
      .spills = c.spills,
      .spilled_bytes = c.spilled_bytes,
      .replicas_made = c.replicas_made,
      .replicas_dropped = c.replicas_dropped,
      .arena_page_locked_bytes = arena.page_locked_bytes(),
      .objects_on_host = store.ObjectsOnHost(),
      .metadata_bytes = c.metadata_bytes,
      .metadata_budget_bytes = store.limits().metadata_budget,
      .request_bytes = c.request_bytes,
      .scheduler = daemon.scheduler_status(),
      .disk = DiskStatusOf(store),
      .config_file = daemon.config_file(),
      .settings = {},
  };
  for (const SettingValue& value : daemon.settings()) {
    s.settings.push_back({.name = value.name, .value = value.value});
  }
  return s;
}

void AdminRequests::Status(const Responder& reply) const {
  capnp::MallocMessageBuilder message;
  auto r = message.initRoot<wire::Reply>();
  internal::ToWire(StatusOf(store_, daemon_), r.initStatus());
  reply.Send(message, r);
}

void AdminRequests::Metrics(const Responder& reply) const {
  capnp::MallocMessageBuilder message;
  auto r = message.initRoot<wire::Reply>();
  r.setMetrics(daemon_.RenderMetrics());
  reply.Send(message, r);
}

void AdminRequests::Clients(const Responder& reply) const {
  const std::vector<ClientView> clients = daemon_.Clients();
  capnp::MallocMessageBuilder message;
  auto r = message.initRoot<wire::Reply>();
  auto out = r.initClients(static_cast<unsigned>(clients.size()));
  for (unsigned i = 0; i < clients.size(); ++i) {
    const ClientView& client = clients[i];
    internal::ToWire(ClientInfo{.session_id = client.id,
                                .pid = static_cast<uint32_t>(client.peer.pid),
                                .uid = client.peer.uid,
                                .command = client.peer.command,
                                .client_name = client.client_name,
                                .objects_held = client.usage.objects,
                                .references = client.usage.references,
                                .bytes_held = client.usage.bytes,
                                .requests = client.requests,
                                .connected_time_ns = client.connected_time_ns},
                     out[i]);
  }
  reply.Send(message, r);
}

void AdminRequests::ObjectInfo(const Responder& reply, const ObjectId& id) const {
  const ObjectStore& store = store_;
  const uint32_t slot = store.SlotOf(id);
  if (slot == HeaderTable::kNoSlot) {
    return reply.Error(Status::NotFound("object " + id.Hex() + " does not exist"));
  }
  ObjectDetails details{.info = InfoOf(store.Describe(slot)), .holders = {}, .replicas = {}};
  for (const auto& held : store.HoldersOf(slot)) details.holders.push_back(HolderOf(daemon_, held));
  for (const auto& copy : store.ReplicasOf(slot)) {
    details.replicas.push_back({.device = copy.device == kDisk ? kWireDisk : copy.device,
                                .segment = copy.segment,
                                .offset = copy.offset,
                                .references = copy.references,
                                .ready = copy.ready});
  }
  capnp::MallocMessageBuilder message;
  auto r = message.initRoot<wire::Reply>();
  internal::ToWire(details, r.initObjectInfo());
  reply.Send(message, r);
}

void AdminRequests::Evict(const Responder& reply, const std::string& who_for_logs,
                          wire::Request::Evict::Reader evict) {
  if (evict.getBytes() == 0 && !evict.getAllUnreferenced()) {
    return reply.Error(
        Status::InvalidArgument("evict needs a number of bytes to free, or allUnreferenced"));
  }
  const EvictOutcome outcome =
      store_.EvictUnreferenced(evict.getBytes(), evict.getAllUnreferenced());
  spdlog::info("{}: evicted {} objects ({})", who_for_logs, outcome.objects,
               ipc::FormatSize(outcome.bytes));
  capnp::MallocMessageBuilder message;
  auto r = message.initRoot<wire::Reply>();
  internal::ToWire(EvictResult{.objects = outcome.objects, .bytes = outcome.bytes}, r.initEvict());
  reply.Send(message, r);
}

struct AdminRequests::ListJob {
  ListJob(Responder reply, std::weak_ptr<Jobs> jobs, uint32_t largest)
      : reply(std::move(reply)), jobs(std::move(jobs)), scan(largest) {}

  Responder reply;
  std::weak_ptr<Jobs> jobs;
  uint64_t charge = 0;  // counted for it (BeginJob)
  bool largest = false;
  LargestScan scan;        // largest: the walk
  uint32_t limit = 0;      // paged: most entries
  std::string prefix;      // paged: only names that start with it
  ObjectStore::Page page;  // paged: where the walk stopped (its slots go to `found`)
  bool walked = false;
  std::vector<std::pair<uint32_t, ObjectId>> found;  // what the walk found, in reply order
  // The reply, built a slice at a time from `found`.
  capnp::MallocMessageBuilder message;
  capnp::Orphan<capnp::List<wire::ObjectInfo>> objects;
  size_t looked = 0;  // entries of `found` looked at so far
  unsigned kept = 0;  // entries written to `objects`
  size_t bytes = 0;   // about what the reply takes
};

void AdminRequests::List(const Responder& reply, const std::shared_ptr<Jobs>& jobs,
                         wire::Request::ListObjects::Reader list) {
  const auto prefix = list.getPrefix();
  if (prefix.size() > kMaxListPrefixBytes) {
    return reply.Error(Status::InvalidArgument(
        "a list's name prefix of " + std::to_string(prefix.size()) +
        " bytes is longer than the longest name, " + std::to_string(kMaxListPrefixBytes)));
  }
  if (prefix.size() > 0 && list.getLargest() != 0) {
    return reply.Error(
        Status::InvalidArgument("a list of the largest objects takes no name prefix"));
  }
  auto job = std::make_shared<ListJob>(reply, jobs, std::min(list.getLargest(), kMaxListPage));
  job->prefix.assign(prefix.cStr(), prefix.size());
  job->largest = list.getLargest() != 0;
  job->limit = std::clamp<uint32_t>(list.getLimit(), 1, kMaxListPage);
  job->page.next = list.getStartSlot();
  // What it may hold at most: a scan entry, a found entry and a reply entry per object.
  job->charge = (job->largest ? std::min(list.getLargest(), kMaxListPage) : job->limit) *
                uint64_t{kListJobEntryBytes};
  if (!jobs->BeginJob(reply, job->charge)) return;
  jobs->RunSlices([this, job] { return ListSlice(*job); });
}

bool AdminRequests::ListSlice(ListJob& job) {
  const ObjectStore& store = store_;
  if (!job.walked) {
    if (job.largest) {
      if (!job.scan.Step(store, kSliceSlots)) return false;
      job.found = job.scan.Finish(store);
      job.page.done = true;
    } else {
      const auto more = store.List(
          job.page.next, job.limit - static_cast<uint32_t>(job.found.size()), kSliceSlots);
      for (uint32_t slot : more.slots) {
        if (store.NameOf(slot).starts_with(job.prefix)) {
          job.found.emplace_back(slot, store.IdAt(slot));
        }
      }
      job.page.next = more.next;
      job.page.done = more.done;
      if (!more.done && job.found.size() < job.limit) return false;
    }
    job.walked = true;
    job.objects = job.message.getOrphanage().newOrphan<capnp::List<wire::ObjectInfo>>(
        static_cast<unsigned>(job.found.size()));
  }
  auto objects = job.objects.get();
  for (const size_t stop = std::min(job.found.size(), job.looked + kSliceEntries);
       job.looked < stop; ++job.looked) {
    const auto& [slot, id] = job.found[job.looked];
    if (!store.Holds(slot, id)) continue;  // gone since the walk found it
    // Long names make entries large: end the page early rather than send a reply of tens of
    // MiB; the client asks for the next page from where this one ends.
    job.bytes += kListEntryBytes + store.NameOf(slot).size();
    if (job.bytes > kMaxListReplyBytes && job.kept > 0) {
      if (!job.largest) {
        job.page.next = slot;
        job.page.done = false;
      }
      job.looked = job.found.size();
      break;
    }
    internal::ToWire(InfoOf(store.Describe(slot)), objects[job.kept++]);
  }
  if (job.looked < job.found.size()) return false;
  job.objects.truncate(job.kept);
  auto r = job.message.initRoot<wire::Reply>();
  auto out = r.initList();
  out.setNextSlot(job.page.next);
  out.setDone(job.page.done);
  out.adoptObjects(kj::mv(job.objects));
  job.reply.Send(job.message, r);
  if (auto jobs = job.jobs.lock()) jobs->EndJob(job.charge);
  return true;
}

struct AdminRequests::VerifyJob {
  VerifyJob(Responder reply, std::weak_ptr<Jobs> jobs)
      : reply(std::move(reply)), jobs(std::move(jobs)) {}

  Responder reply;
  std::weak_ptr<Jobs> jobs;
  uint64_t charge = 0;  // counted for it (BeginJob)
  bool all = false;
  std::vector<ObjectId> ids;   // not all: what to verify
  size_t next_id = 0;          // not all: the first of `ids` not yet started
  ObjectStore::Page page;      // all: where the walk stopped
  bool collected_all = false;  // every object of the request (or page) has been started
  unsigned started = 0;        // results handed out, in order, to batches
  int in_flight = 0;           // batches hashing on the workers
  bool queued = false;         // a VerifySlice is on the SliceQueue
  bool replied = false;
  // The reply, filled in as batches finish.
  capnp::MallocMessageBuilder message;
  capnp::Orphan<capnp::List<wire::VerifyResult>> results;
};

void AdminRequests::Verify(const Responder& reply, const Requester& who,
                           const std::shared_ptr<Jobs>& jobs,
                           wire::Request::Verify::Reader verify) {
  auto list = verify.getIds();
  if (verify.getAll() && list.size() != 0) {
    return reply.Error(Status::InvalidArgument("verify takes ids or all, not both"));
  }
  if (auto st = who.CheckBatch(list.size()); !st.ok()) return reply.Error(st);
  auto job = std::make_shared<VerifyJob>(reply, jobs);
  job->all = verify.getAll();
  job->charge = (job->all ? kVerifyPage : list.size()) * uint64_t{kVerifyJobEntryBytes};
  if (!jobs->BeginJob(reply, job->charge)) return;
  job->page.next = verify.getStartSlot();
  job->page.done = false;
  job->ids.reserve(list.size());
  for (auto id : list) job->ids.push_back(ipc::FromWire(id));
  job->results = job->message.getOrphanage().newOrphan<capnp::List<wire::VerifyResult>>(
      job->all ? kVerifyPage : static_cast<unsigned>(job->ids.size()));
  job->queued = true;
  jobs->RunSlices([this, job] { return VerifySlice(job); });
}

bool AdminRequests::VerifySlice(const std::shared_ptr<VerifyJob>& job) {
  // Starts one small batch per slice, keeping up to kVerifiesInFlight of them hashing.
  ObjectStore& store = store_;
  std::vector<ObjectId> batch;
  if (job->all) {
    const auto page =
        store.List(job->page.next, std::min<uint32_t>(kSliceVerifies, kVerifyPage - job->started),
                   kSliceSlots, ObjectStore::Filter::kVerifiable);
    for (uint32_t slot : page.slots) batch.push_back(store.IdAt(slot));
    job->page.next = page.next;
    job->page.done = page.done;
    job->collected_all = page.done || job->started + batch.size() >= kVerifyPage;
  } else {
    const size_t n = std::min(kSliceVerifies, job->ids.size() - job->next_id);
    batch.assign(job->ids.begin() + static_cast<std::ptrdiff_t>(job->next_id),
                 job->ids.begin() + static_cast<std::ptrdiff_t>(job->next_id + n));
    job->next_id += n;
    job->collected_all = job->next_id == job->ids.size();
  }
  if (!batch.empty()) {
    const unsigned first = job->started;
    job->started += static_cast<unsigned>(batch.size());
    job->in_flight++;
    // The callback may run inside this call, when there is nothing to hash.
    store.Verify(std::move(batch), [this, job, first](std::vector<VerifyOutcome> outcomes) {
      if (auto jobs = job->jobs.lock()) {
        jobs->RunGuarded([&] { VerifyBatchDone(job, first, std::move(outcomes)); });
      }
    });
  }
  if (!job->collected_all && job->in_flight < kVerifiesInFlight) return false;
  job->queued = false;  // VerifyBatchDone queues it again, or replies
  if (job->collected_all && job->in_flight == 0) SendVerifyReply(*job);
  return true;
}

void AdminRequests::VerifyBatchDone(const std::shared_ptr<VerifyJob>& job, unsigned first,
                                    std::vector<VerifyOutcome> outcomes) {
  auto out = job->results.get();
  for (size_t k = 0; k < outcomes.size(); ++k) {
    internal::ToWire(VerifyResult{.id = outcomes[k].id,
                                  .state = Public(outcomes[k].state),
                                  .expected = outcomes[k].expected,
                                  .actual = outcomes[k].actual},
                     out[first + static_cast<unsigned>(k)]);
  }
  job->in_flight--;
  if (job->queued) return;  // its next slice is on the way
  if (!job->collected_all) {
    job->queued = true;
    if (auto jobs = job->jobs.lock()) jobs->RunSlices([this, job] { return VerifySlice(job); });
    return;
  }
  if (job->in_flight == 0) SendVerifyReply(*job);
}

void AdminRequests::SendVerifyReply(VerifyJob& job) {
  if (job.replied) return;
  job.replied = true;
  job.results.truncate(job.started);
  auto r = job.message.initRoot<wire::Reply>();
  auto out = r.initVerify();
  out.setNextSlot(job.page.next);
  out.setDone(!job.all || job.page.done);
  out.adoptResults(kj::mv(job.results));
  job.reply.Send(job.message, r);
  if (auto jobs = job.jobs.lock()) jobs->EndJob(job.charge);
}

}  // namespace depot::store
