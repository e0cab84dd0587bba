#include "store/admin_requests.h"

#include <unistd.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <bit>

#include "depot/ipc/protocol.h"
#include "depot/ipc/units.h"
#include "store/largest_scan.h"
#include "store/version.h"

namespace depot::store {

namespace {

// Most objects in one page of a list reply, and about the most bytes.
constexpr uint32_t kMaxListPage = 10'000;
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

void ToWire(const ObjectView& v, wire::ObjectInfo::Builder o) {
  ipc::ToWire(v.id, o.initId());
  o.setName(v.name);
  o.setState(v.sealed ? wire::ObjectState::SEALED : wire::ObjectState::CREATING);
  o.setFailed(v.failed);
  o.setDataSize(v.data_size);
  o.setMetadataSize(v.metadata_size);
  o.setRefCount(static_cast<uint32_t>(v.references));
  o.setPinned(v.pinned);
  o.setHasChecksum(v.has_checksum);
  o.setChecksum(v.checksum);
  o.setCreateTimeNs(v.create_time_ns);
  o.setAccessTimeNs(v.access_time_ns);
  o.setSegment(v.segment);
  o.setOffset(v.offset);
  o.setDeletePending(v.delete_pending);
  o.setOwnerUid(v.owner_uid);
  o.setOnHost(v.tiers & ipc::kTierHost);
  o.setOnDisk(v.tiers & ipc::kTierDisk);
  const auto devices = static_cast<unsigned>(std::popcount(v.tiers & ipc::kTierGpus));
  auto out = o.initDevices(devices);
  unsigned i = 0;
  for (uint32_t d = 0; i < devices; ++d) {
    if (v.tiers & ipc::TierBit(static_cast<int32_t>(d))) out.set(i++, d);
  }
}

wire::VerifyState ToWire(VerifyState state) {
  switch (state) {
    case VerifyState::kOk:
      return wire::VerifyState::OK;
    case VerifyState::kMismatch:
      return wire::VerifyState::MISMATCH;
    case VerifyState::kNoChecksum:
      return wire::VerifyState::NO_CHECKSUM;
    case VerifyState::kNotFound:
      return wire::VerifyState::NOT_FOUND;
    case VerifyState::kNotSealed:
      return wire::VerifyState::NOT_SEALED;
    case VerifyState::kNotOnHost:
      return wire::VerifyState::NOT_ON_HOST;
  }
  return wire::VerifyState::NOT_FOUND;
}
}  // namespace

void ToWire(const ObjectStore& store, uint32_t device, wire::Device::Builder out) {
  const gpu::DevicePool& pool = *store.pools()[device];
  const gpu::DeviceInfo& info = pool.info();
  out.setUuid(capnp::Data::Reader(info.uuid.data(), info.uuid.size()));
  out.setName(info.name);
  out.setSimulated(info.simulated);
  out.setTotalBytes(info.total_bytes);
  out.setLimitBytes(pool.limit());
  out.setReservedBytes(pool.reserved_bytes());
  out.setUsedBytes(pool.used_bytes());
  out.setHeldBytes(store.device_usage(device).held_bytes);
  out.setChunks(pool.chunk_count());
  out.setReplicas(store.device_usage(device).replicas);
}

void AdminRequests::Status(const Responder& reply) const {
  const ObjectStore& store = store_;
  const Arena& arena = store.arena();
  const StoreCounters c = store.counters();
  capnp::MallocMessageBuilder message;
  auto r = message.initRoot<wire::Reply>();
  auto s = r.initStatus();
  s.setDaemonVersion(kDepotVersion);
  s.setPid(static_cast<uint32_t>(::getpid()));
  s.setUptimeNs(ipc::MonotonicNanos() - daemon_.start_ns());
  s.setSocketPath(daemon_.socket_path());
  s.setArenaBackend(arena.backend());
  s.setCapacityBytes(arena.capacity());
  s.setMappedBytes(arena.mapped_bytes());
  s.setUsedBytes(arena.used_bytes());
  s.setHeldBytes(c.held_bytes);
  s.setPinnedBytes(c.pinned_bytes);
  s.setSegments(arena.segment_count());
  s.setObjectsSealed(c.objects_sealed);
  s.setObjectsCreating(c.objects_creating);
  s.setClients(static_cast<uint32_t>(daemon_.session_count()));
  s.setEvictions(c.evictions);
  s.setEvictedBytes(c.evicted_bytes);
  s.setEvictionEnabled(store.eviction_enabled());
  s.setLargestFreeBlock(arena.largest_free_block());
  s.setHeaderSlots(store.headers().slots());
  auto devices = s.initDevices(static_cast<unsigned>(store.pools().size()));
  for (unsigned d = 0; d < devices.size(); ++d) ToWire(store, d, devices[d]);
  s.setDeviceBackend(daemon_.device_backend());
  s.setSpills(c.spills);
  s.setSpilledBytes(c.spilled_bytes);
  s.setReplicasMade(c.replicas_made);
  s.setReplicasDropped(c.replicas_dropped);
  s.setArenaPageLockedBytes(arena.page_locked_bytes());
  s.setObjectsOnHost(store.ObjectsOnHost());
  s.setMetadataBytes(c.metadata_bytes);
  s.setMetadataBudgetBytes(store.limits().metadata_budget);
  s.setRequestBytes(c.request_bytes);
  s.setRequests(daemon_.requests());
  daemon_.FillSchedulerStatus(s.initScheduler());
  s.setConfigFile(daemon_.config_file());
  const std::vector<SettingValue>& values = daemon_.settings();
  auto settings = s.initSettings(static_cast<unsigned>(values.size()));
  for (unsigned i = 0; i < settings.size(); ++i) {
    settings[i].setName(values[i].name);
    settings[i].setValue(values[i].value);
  }
  if (const DiskPool* pool = store.disk()) {
    const TierCounters& t = store.tier_counters();
    auto d = s.initDisk();
    d.setEnabled(true);
    d.setDir(pool->dir());
    d.setLimitBytes(pool->capacity());
    d.setUsedBytes(pool->used_bytes());
    d.setFileBytes(pool->file_bytes());
    d.setFiles(pool->file_count());
    d.setObjects(store.ObjectsOnDisk());
    d.setSpills(t.disk_spills);
    d.setSpilledBytes(t.disk_spilled_bytes);
    d.setSpillSeconds(t.disk_spill_seconds);
    d.setRestores(t.disk_restores);
    d.setRestoredBytes(t.disk_restored_bytes);
    d.setRestoreSeconds(t.disk_restore_seconds);
    d.setDrops(t.disk_drops);
    d.setDroppedBytes(t.disk_dropped_bytes);
    d.setSpillFailures(t.disk_spill_failures);
    d.setRestoreFailures(t.disk_restore_failures);
    d.setCopiesInFlight(store.DiskCopiesInFlight());
    d.setDirectIo(pool->direct_io());
  }
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
    auto c = out[i];
    c.setSessionId(client.id);
    c.setPid(static_cast<uint32_t>(client.peer.pid));
    c.setUid(client.peer.uid);
    c.setCommand(client.peer.command);
    c.setClientName(client.client_name);
    c.setObjectsHeld(client.usage.objects);
    c.setReferences(client.usage.references);
    c.setBytesHeld(client.usage.bytes);
    c.setRequests(client.requests);
    c.setConnectedTimeNs(client.connected_time_ns);
  }
  reply.Send(message, r);
}

void AdminRequests::ObjectInfo(const Responder& reply, const ObjectId& id) const {
  const ObjectStore& store = store_;
  const uint32_t slot = store.SlotOf(id);
  if (slot == HeaderTable::kNoSlot) {
    return reply.Error(Status::NotFound("object " + id.Hex() + " does not exist"));
  }
  const auto holders = store.HoldersOf(slot);
  capnp::MallocMessageBuilder message;
  auto r = message.initRoot<wire::Reply>();
  auto details = r.initObjectInfo();
  ToWire(store.Describe(slot), details.initInfo());
  auto out = details.initHolders(static_cast<unsigned>(holders.size()));
  for (unsigned i = 0; i < holders.size(); ++i) {
    const ClientId client = holders[i].client;
    auto h = out[i];
    h.setSessionId(client);
    h.setReferences(holders[i].references);
    auto tiers = h.initTiers(static_cast<unsigned>(holders[i].tiers.size()));
    for (unsigned t = 0; t < tiers.size(); ++t) {
      tiers[t].setDevice(holders[i].tiers[t].first);
      tiers[t].setReferences(holders[i].tiers[t].second);
    }
    if (client == kDaemonClient) {  // a verify or a copy between tiers reading the object
      h.setPid(static_cast<uint32_t>(::getpid()));
      h.setUid(::getuid());
      h.setCommand("depotd");
      h.setClientName("depotd (verify or copy)");
    } else if (client == kSchedulerClient) {  // the task graph: inputs of pending tasks
      h.setPid(static_cast<uint32_t>(::getpid()));
      h.setUid(::getuid());
      h.setCommand("depotd");
      h.setClientName("depotd (task graph)");
    } else if (const std::optional<uint32_t> uid = daemon_.GroupUid(client)) {
      h.setPid(static_cast<uint32_t>(::getpid()));
      h.setUid(*uid);
      h.setCommand("depotd");
      h.setClientName("group (handed off, not yet claimed)");
    } else if (const std::optional<ClientView> holder = daemon_.FindClient(client)) {
      h.setPid(static_cast<uint32_t>(holder->peer.pid));
      h.setUid(holder->peer.uid);
      h.setCommand(holder->peer.command);
      h.setClientName(holder->client_name);
    }
  }
  const auto replicas = store.ReplicasOf(slot);
  auto copies = details.initReplicas(static_cast<unsigned>(replicas.size()));
  for (unsigned i = 0; i < replicas.size(); ++i) {
    copies[i].setDevice(replicas[i].device == kDisk ? kWireDisk : replicas[i].device);
    copies[i].setSegment(replicas[i].segment);
    copies[i].setOffset(replicas[i].offset);
    copies[i].setReferences(replicas[i].references);
    copies[i].setReady(replicas[i].ready);
  }
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
  auto out = r.initEvict();
  out.setObjects(outcome.objects);
  out.setBytes(outcome.bytes);
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
  auto job = std::make_shared<ListJob>(reply, jobs, std::min(list.getLargest(), kMaxListPage));
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
      for (uint32_t slot : more.slots) job.found.emplace_back(slot, store.IdAt(slot));
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
    ToWire(store.Describe(slot), objects[job.kept++]);
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
    auto r = out[first + static_cast<unsigned>(k)];
    ipc::ToWire(outcomes[k].id, r.initId());
    r.setState(ToWire(outcomes[k].state));
    r.setExpected(outcomes[k].expected);
    r.setActual(outcomes[k].actual);
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
