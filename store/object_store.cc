#include "store/object_store.h"

#include <spdlog/spdlog.h>
#include <xxhash.h>

#include <algorithm>
#include <cstring>

#include "depot/ipc/checked.h"
#include "depot/ipc/units.h"
#include "scheduler/store_access.h"
#include "store/copy_probe.h"

namespace depot::store {

namespace {
// Checksums of objects at least this large run on the worker pool, not on the loop.
constexpr uint64_t kInlineChecksumBytes = 1u << 20;

std::string Mention(const ObjectId& id) { return "object " + id.Hex(); }
}  // namespace

ObjectStore::ObjectStore(boost::asio::io_context& loop, Executor& executor, Arena& arena,
                         HeaderTable& headers, ClientLimits limits, bool eviction,
                         std::vector<gpu::DevicePool*> gpus, uint32_t lease_entries, DiskPool* disk)
    : executor_(executor),
      arena_(arena),
      eviction_(eviction),
      gpus_(std::move(gpus)),
      table_(headers),
      leases_(loop, table_, lease_entries),
      accounts_(limits, static_cast<int32_t>(gpus_.size() + 1)),
      waiting_(loop, accounts_),
      tiers_(table_, policy_, executor, arena, gpus_, disk, eviction, *this),
      policy_(table_, tiers_.pools(), disk != nullptr && eviction),
      handoff_timer_(loop) {
  leases_.OnEnded([this](uint32_t slot) { LeaseEnded(slot); });
  waiting_.BeforeAnswer([this](WaitingGets::Get& get) { KeepWhatIsStillHeld(get); });
}

ObjectStore::~ObjectStore() = default;

void ObjectStore::KeepWhatIsStillHeld(WaitingGets::Get& get) const {
  if (!get.hold) return;  // a prefetch holds nothing, and its results name no place
  const Account* account = accounts_.Find(get.client);
  for (size_t i = 0; i < get.results.size(); ++i) {
    GetResult& r = get.results[i];
    if (r.code != StatusCode::kOk) continue;
    const uint32_t slot = r.location.slot;
    // The client may release what the get granted before its reply is sent (it knows what
    // it asked for), and the object go; while the client holds it, it stays where it is.
    if (account != nullptr && accounts_.RefsOf(*account, slot, get.tier) != 0 &&
        table_.IdAt(slot) == get.ids[i]) {
      r.location = LocationOf(slot, get.tier);
    } else {
      r = GetResult{StatusCode::kNotHeld,
                    {},
                    std::make_shared<const std::string>(
                        "its reference was released before this get's reply was sent")};
    }
  }
}

StoreCounters ObjectStore::counters() const {
  StoreCounters c = counters_;
  const TierCounters& t = tiers_.counters();
  c.pinned_bytes = t.pinned_bytes;
  c.evictions = t.evictions;
  c.evicted_bytes = t.evicted_bytes;
  c.replicas_made = t.replicas_made;
  c.replicas_dropped = t.replicas_dropped;
  c.spills = t.spills;
  c.spilled_bytes = t.spilled_bytes;
  const TierUsage& host = tiers_.usage(kHost);
  c.held_bytes = host.held_bytes;
  c.objects_on_host = host.replicas;
  c.bytes_in = host.bytes_in;
  c.bytes_out = host.bytes_out;
  c.get_timeouts = waiting_.timeouts();
  c.metadata_bytes = accounts_.metadata_bytes();
  c.request_bytes = accounts_.request_bytes();
  return c;
}

Location ObjectStore::LocationOf(uint32_t slot, int32_t tier) const {
  const auto& h = table_.header(slot);
  if (tier == kHost) {  // the header has the host copy's place: no allocator lookup
    return Location{slot, h.segment, h.offset, h.data_size, h.metadata_size, kHost};
  }
  const Replica& r = *table_.FindReplica(slot, tier);
  return Location{slot,
                  r.region,
                  tiers_.pool(tier).OffsetOf(r.region, r.handle),
                  h.data_size,
                  h.metadata_size,
                  tier,
                  table_.at(slot).replicas.kept_metadata()};
}

Status ObjectStore::CheckTier(int32_t tier) const {
  if (tiers_.Has(tier)) return Status::OK();
  return Status::InvalidArgument(
      "there is no GPU " + std::to_string(tier) + ": this daemon serves " +
      std::to_string(gpus_.size()) + " GPU" + (gpus_.size() == 1 ? "" : "s") +
      (gpus_.empty() ? " (start depotd on a host with GPUs, or with --simulate-gpus)" : ""));
}

void ObjectStore::Notify(std::function<void(StoreListener&)> event) {
  if (listeners_.empty()) return;
  executor_.Defer([this, event = std::move(event)] {
    // A copy: a listener may unsubscribe while it is told.
    const std::vector<StoreListener*> listeners = listeners_;
    for (StoreListener* listener : listeners) event(*listener);
  });
}

void ObjectStore::RemoveClient(ClientId client) {
  Account* account = accounts_.Find(client);
  if (account == nullptr) return;
  waiting_.DropClient(client);
  // What it handed off with a grace, unclaimed, now has a time to go back.
  if (handoff_deadlines_.graced() != 0) SenderEnded(client, ipc::MonotonicNanos());
  // A group's deadlines go with it (its references are dropped below).
  if (const uint64_t charged = handoff_deadlines_.ForgetGroup(client); charged != 0) {
    accounts_.CountMetadata(client, -static_cast<int64_t>(charged));
  }
  // Drop every reference; the last reference to an unsealed object aborts it.
  std::vector<std::pair<uint64_t, uint32_t>> refs(account->refs.begin(), account->refs.end());
  for (auto [key, count] : refs) {
    for (uint32_t i = 0; i < count; ++i) {
      DropRef(*account, ClientAccounts::SlotOfKey(key), ClientAccounts::TierOfKey(key));
    }
  }
  accounts_.Close(client);
  leases_.Close(client);
}

Result<ObjectStore::LeaseTable> ObjectStore::OpenLeases(ClientId client) {
  const LeaseAllowance allowance =
      AllowanceFor(accounts_.limits(), leases_.entries(), Arena::ReservedSize(1));
  DEPOT_ASSIGN_OR_RETURN(const int fd,
                         leases_.Open(client, allowance.entries, allowance.max_object_bytes));
  if (fd < 0) return LeaseTable{};
  accounts_.at(client).lease = allowance;
  return LeaseTable{fd, allowance};
}

void ObjectStore::ChargeObject(uint32_t slot, uint64_t bytes) {
  // At most the entry, a name and a frame's metadata: far below 4 GiB.
  Object& o = table_.at(slot);
  o.metadata_cost += static_cast<uint32_t>(bytes);
  accounts_.CountObjectMetadata(o.creator, o.owner, static_cast<int64_t>(bytes));
}

uint64_t ObjectStore::CreateCost(const CreateParams& p) {
  return kObjectMetadataBytes + p.name.size() + (p.device == kHost ? 0 : p.metadata.size());
}

uint64_t ObjectStore::BytesOnTier(const CreateParams& p) {
  return p.data_size + (p.device == kHost ? p.metadata.size() : 0);
}

void ObjectStore::HoldSource(uint32_t slot, int32_t tier) {
  AddRef(accounts_.at(kDaemonClient), slot, tier);
}

void ObjectStore::LetGoOfSource(uint32_t slot, int32_t tier) {
  DropRef(accounts_.at(kDaemonClient), slot, tier);
}

void ObjectStore::CopyDone(uint32_t slot, int32_t tier, const Status& status,
                           std::span<const WaitingGets::Id> waiters) {
  const ObjectId id = table_.IdAt(slot);
  // The scheduler places by where bytes are for clients: the disk is not such a place.
  if (status.ok() && tier != kDisk) {
    Notify([id, tier](StoreListener& l) { l.OnReplicaReady(id, tier); });
  }
  if (status.ok()) MoveGraphHold(slot, tier);
  // The waiting gets take their references before the copy lets go of its source.
  for (WaitingGets::Id waiter : waiters) Answer(waiter, slot, id, status);
}

void ObjectStore::MoveGraphHold(uint32_t slot, int32_t to) {
  // Down the tiers only: a GPU's to host memory, host memory's to disk. A copy made up the
  // tiers (a restore, a prefetch) leaves the reference where it is, so that the copy made
  // for a reader may go again under pressure.
  const auto rank = [](int32_t tier) { return tier == kDisk ? 2 : tier == kHost ? 1 : 0; };
  int32_t from = kAnyTier;
  table_.at(slot).replicas.ForEach([&](const Replica& r) {
    if (r.graph_held && from == kAnyTier && rank(r.tier) < rank(to)) from = r.tier;
  });
  if (from == kAnyTier) return;
  // Taken before the other goes, so that the object is never unreferenced between.
  Account& graph = accounts_.at(kSchedulerClient);
  for (uint32_t n = accounts_.RefsOf(graph, slot, from); n > 0; --n) {
    AddRef(graph, slot, to);
    DropRef(graph, slot, from);
  }
}

void ObjectStore::Evict(uint32_t slot) { FreeObject(slot); }

void ObjectStore::LeftMemory(uint32_t slot) {
  Notify([id = table_.IdAt(slot)](StoreListener& l) { l.OnLeftMemory(id); });
}

bool ObjectStore::SpillToDisk(const ObjectId& id) {
  const uint32_t slot = table_.Find(id);
  if (slot == HeaderTable::kNoSlot || !table_.IsUsable(slot)) return false;
  // A graph's reference taken while the object had a ready disk copy beside its host copy
  // went to the host copy (Hold prefers it): it goes down to the disk copy, as a spill takes
  // it, so that the host copy may go.
  if (table_.IsReady(slot, kDisk)) MoveGraphHold(slot, kDisk);
  return tiers_.SpillToDisk(slot);
}

bool ObjectStore::Reclaim(uint32_t slot) {
  const bool free = leases_.Reclaim(slot);
  if (free == table_.at(slot).leased) tiers_.SetLeased(slot, !free);
  return free;
}

void ObjectStore::FreeDeleted(uint32_t slot) {
  // Failed objects have no bytes to lease, and nothing can lease an object with no host
  // copy now: it never had one, or the free of the last went through Reclaim.
  if (table_.IsFailed(slot) || !table_.IsReady(slot, kHost) || Reclaim(slot)) FreeObject(slot);
}

void ObjectStore::LeasedReads(std::span<const ObjectId> ids) {
  const uint64_t now = ipc::WallNanos();
  bool recheck = false;
  for (const ObjectId& id : ids) {
    const uint32_t slot = table_.Find(id);
    if (slot == HeaderTable::kNoSlot || !table_.IsReady(slot, kHost)) continue;
    recheck |= table_.at(slot).leased;
    if (!table_.IsUsable(slot)) continue;
    table_.header(slot).access_time_ns = now;
    table_.headers().Publish(slot);
    policy_.Touch(slot, kHost);
    counters_.get_hits++;
    counters_.leased_reads++;
    tiers_.usage(kHost).bytes_out += table_.BytesOn(slot, kHost);
  }
  if (recheck) leases_.RecheckSoon();
}

void ObjectStore::LeaseEnded(uint32_t slot) {
  tiers_.SetLeased(slot, false);  // a candidate again, if nothing else holds it
  if (table_.IsDeletePending(slot) && table_.headers().refs(slot) == 0) FreeDeleted(slot);
}

void ObjectStore::FreeObject(uint32_t slot) {
  const ObjectId id = table_.IdAt(slot);
  if (table_.IsSealed(slot)) {
    counters_.objects_sealed--;
  } else {
    counters_.objects_creating--;
  }
  Object& o = table_.at(slot);
  tiers_.SetLeased(slot, false);
  while (!o.replicas.empty()) tiers_.FreeReplica(slot, o.replicas[0].tier);
  accounts_.CountObjectMetadata(o.creator, o.owner, -static_cast<int64_t>(o.metadata_cost));
  table_.Remove(slot);
  Notify([id](StoreListener& l) { l.OnFreed(id); });
}

void ObjectStore::AddRef(Account& account, uint32_t slot, int32_t tier) {
  const uint64_t bytes = tiers_.ReplicaBytes(slot, tier);
  accounts_.AddRef(account, slot, tier, bytes);
  Replica& r = *table_.FindReplica(slot, tier);
  const bool moves = policy_.GraphHoldMoves(tier);
  const bool held = r.held_here(moves);
  r.refs++;
  if (account.client == kSchedulerClient) r.graph_held = true;
  if (!held && r.held_here(moves) && !tiers_.IsLeased(slot, tier)) {
    tiers_.usage(tier).held_bytes += bytes;
  }
  HeaderTable& headers = table_.headers();
  headers.SetStateRefs(slot, headers.state(slot), headers.refs(slot) + 1);
  policy_.Reconsider(slot);
}

void ObjectStore::DropRef(Account& account, uint32_t slot, int32_t tier) {
  const uint64_t bytes = tiers_.ReplicaBytes(slot, tier);
  accounts_.DropRef(account, slot, tier, bytes);
  Replica& r = *table_.FindReplica(slot, tier);
  const bool moves = policy_.GraphHoldMoves(tier);
  const bool held = r.held_here(moves);
  r.refs--;
  if (account.client == kSchedulerClient) {
    r.graph_held = accounts_.RefsOf(account, slot, tier) > 0;
  }
  if (held && !r.held_here(moves) && !tiers_.IsLeased(slot, tier)) {
    tiers_.usage(tier).held_bytes -= bytes;
  }
  HeaderTable& headers = table_.headers();
  const uint64_t refs = headers.refs(slot) - 1;
  const auto state = headers.state(slot);
  headers.SetStateRefs(slot, state, refs);
  if (refs == 0 && state == ipc::ObjectState::kCreating) {
    // The creator let go of an object it never sealed: abort it. An object whose seal is
    // running on the worker pool is finished by FinishSeal instead.
    if (!table_.at(slot).sealing) FreeObject(slot);
    return;
  }
  if (refs == 0 && table_.IsDeletePending(slot)) return FreeDeleted(slot);
  policy_.Reconsider(slot);
}

Status ObjectStore::CheckReference(const Account& holder, uint32_t slot, int32_t tier) const {
  const uint32_t held = accounts_.RefsOf(holder, slot, tier);
  if (held >= kMaxClientReferences) {
    return Status::LimitExceeded("client " + std::to_string(holder.client) + " holds " +
                                 std::to_string(held) + " references to " +
                                 Mention(table_.IdAt(slot)) + " already, the most one may");
  }
  if (table_.FindReplica(slot, tier)->refs >= kMaxReplicaReferences) {
    return Status::LimitExceeded(Mention(table_.IdAt(slot)) + " has " +
                                 std::to_string(kMaxReplicaReferences) +
                                 " references already, the most it may");
  }
  // Another reference to what it holds costs nothing more.
  if (held != 0) return Status::OK();
  return accounts_.CheckHolding(holder.client, holder, tiers_.ReplicaBytes(slot, tier));
}

GetResult ObjectStore::Grant(Account* holder, uint32_t slot, int32_t tier, uint64_t now) {
  if (holder == nullptr) return GetResult{StatusCode::kOk, {}};
  if (Status st = CheckReference(*holder, slot, tier); !st.ok()) {
    return GetResult{st.code(), {}, std::make_shared<const std::string>(st.message())};
  }
  table_.header(slot).access_time_ns = now;  // published by AddRef
  AddRef(*holder, slot, tier);
  tiers_.usage(tier).bytes_out += table_.BytesOn(slot, tier);
  return GetResult{StatusCode::kOk, LocationOf(slot, tier)};
}

uint32_t ObjectStore::AcquireSlot() {
  uint32_t slot = HeaderTable::kNoSlot;
  // Only evicting a whole object gives a slot back.
  EvictWholeObjects([&] { return (slot = table_.headers().Acquire()) != HeaderTable::kNoSlot; });
  return slot;
}

bool ObjectStore::EvictWholeObjects(const std::function<bool()>& enough) {
  if (enough()) return true;
  if (!eviction_) return false;
  // Host copies that are their object's only copy, least recently used first.
  const EvictionPlanner& planner = tiers_.planner();
  const auto evict = EvictionPlanner::Of(EvictionPolicy::Action::kEvict);
  for (EvictionPlanner::Plan plan = planner.Require({.tier = kHost, .actions = evict});
       auto victim = plan.Next();) {
    if (tiers_.FreeHostBlock(victim->slot) == Tiers::Freed::kObject && enough()) return true;
  }
  // With a spill directory, objects whose only copy is on disk.
  if (tiers_.disk() != nullptr) {
    for (EvictionPlanner::Plan plan = planner.Require({.tier = kDisk, .actions = evict});
         auto victim = plan.Next();) {
      tiers_.CountDiskDrop(victim->slot);
      FreeObject(victim->slot);
      if (enough()) return true;
    }
  }
  return false;
}

Status ObjectStore::CheckMetadataRoom(ClientId client, const Account& account, uint64_t bytes) {
  DEPOT_RETURN_NOT_OK(accounts_.CheckOwnMetadata(client, account, bytes));
  // What objects nobody holds keep of the budget (entries, names, GPU metadata) is taken
  // back by evicting them, as their bytes are when memory is short.
  EvictWholeObjects([&] { return accounts_.BudgetHasRoom(bytes); });
  return accounts_.CheckMetadata(client, account, bytes);
}

Status ObjectStore::CheckNew(const CreateParams& p) const {
  if (p.id.IsNil()) return Status::InvalidArgument("the nil object id (all zeros) is reserved");
  // Readers add the two sizes (Location), on every tier: a sum that wraps would place the
  // metadata before the object's block.
  DEPOT_RETURN_NOT_OK(
      ipc::CheckedAdd<uint64_t>(p.data_size, p.metadata.size(),
                                "dataSize plus the metadata's size of " + Mention(p.id))
          .status());
  if (!p.data.empty() && p.data.size() != p.data_size) {
    return Status::InvalidArgument("inline data of " + std::to_string(p.data.size()) +
                                   " bytes for " + Mention(p.id) + " of " +
                                   std::to_string(p.data_size) + " bytes");
  }
  DEPOT_RETURN_NOT_OK(CheckTier(p.device));
  if (uint32_t existing = table_.Find(p.id); existing != HeaderTable::kNoSlot) {
    return Status::AlreadyExists(
        Mention(p.id) +
        (table_.IsSealed(existing)
             ? (table_.IsDeletePending(existing)
                    ? " was deleted but is still referenced; it cannot be created again until "
                      "released"
                    : " exists already")
             : " is already being created"));
  }
  if (creating_.contains(p.id)) {
    return Status::AlreadyExists(Mention(p.id) + " is already being created");
  }
  return Status::OK();
}

void ObjectStore::Create(ClientId client, const CreateParams& p, CreateDone done) {
  if (Status st = CheckNew(p); !st.ok()) return done(st);
  if (p.device == kHost) {
    Result<Location> made = CreateOnHost(client, p);
    // With a spill directory, room that is not there now may come once objects spill.
    if (made.ok() || made.status().code() != StatusCode::kOutOfMemory || tiers_.disk() == nullptr ||
        !eviction_) {
      return done(std::move(made));
    }
  }
  CreateAfterRoom(client, p, std::move(done));
}

Status ObjectStore::Put(ClientId client, const CreateParams& p) {
  if (p.device != kHost || p.checksum || p.data.size() != p.data_size) {
    return Status::InvalidArgument(
        "a put by the daemon is of all of a host object's bytes, "
        "with no checksum");
  }
  DEPOT_RETURN_NOT_OK(CheckNew(p));
  DEPOT_ASSIGN_OR_RETURN(const Location created, CreateOnHost(client, p));
  FinishSeal(created.slot, std::nullopt);
  // Answering the gets that waited for it may have ended the client's session (a reply it
  // would not read), which gave back everything it held, this reference too.
  if (Account* account = accounts_.Find(client)) DropRef(*account, created.slot, kHost);
  return Status::OK();
}

void ObjectStore::Publish(ClientId client, const CreateParams& p, uint32_t slot) {
  table_.Insert(slot, NewObject{.id = p.id,
                                .data_size = p.data_size,
                                .metadata_size = p.metadata.size(),
                                .name = p.name,
                                .pin = p.pin,
                                .checksum = p.checksum,
                                .spill = p.spill,
                                .creator = client,
                                .owner = accounts_.at(client).uid});
  ChargeObject(slot, CreateCost(p));
  counters_.objects_creating++;
  tiers_.usage(p.device).bytes_in += table_.BytesOn(slot, p.device);
}

Result<Location> ObjectStore::CreateOnHost(ClientId client, const CreateParams& p) {
  const uint64_t total = BytesOnTier(p);
  if (!arena_.CouldFit(total)) {
    return Status::InvalidArgument(Mention(p.id) + " of " + ipc::FormatExactSize(total) +
                                   " (data and metadata) is larger than the host arena's capacity "
                                   "of " +
                                   ipc::FormatExactSize(arena_.capacity()) +
                                   "; start depotd with more --memory");
  }
  Account& account = accounts_.at(client);
  if (Status st = accounts_.CheckHolding(client, account, arena_.BlockSize(total)); !st.ok()) {
    return st;
  }
  DEPOT_RETURN_NOT_OK(CheckMetadataRoom(client, account, CreateCost(p)));
  const uint32_t slot = AcquireSlot();
  if (slot == HeaderTable::kNoSlot) {
    return Status::LimitExceeded("the store holds " + std::to_string(table_.headers().slots()) +
                                 " objects, its limit; start depotd with a larger "
                                 "--max-objects");
  }
  auto block = tiers_.AllocateOrEvict(total, Arena::WritersOf(account.uid));
  if (!block) {
    table_.headers().Release(slot);
    return Status::OutOfMemory(tiers_.OutOfMemoryMessage(kHost, p.id, total));
  }
  std::byte* bytes = arena_.base(block->region) + block->offset;
  if (!p.data.empty()) std::memcpy(bytes, p.data.data(), p.data.size());
  if (!p.metadata.empty()) std::memcpy(bytes + p.data_size, p.metadata.data(), p.metadata.size());
  Publish(client, p, slot);
  // The creator writes into its host replica: it counts as there from the start.
  tiers_.PlaceReplica(slot, kHost, *block).ready = true;
  table_.PublishTiers(slot);
  AddRef(account, slot, kHost);
  return LocationOf(slot, kHost);
}

Status ObjectStore::CheckRoom(ClientId client, const CreateParams& p) {
  TierPool& pool = tiers_.pool(p.device);
  const uint64_t bytes = BytesOnTier(p);
  if (p.device != kHost) {
    if (!p.data.empty()) {
      return Status::InvalidArgument(
          "inline data is for host objects; write a GPU object through its device pointer");
    }
    if (p.checksum) {
      return Status::InvalidArgument("checksums are taken of host objects only; " + Mention(p.id) +
                                     " is created on " + pool.name());
    }
    if (!pool.CouldFit(bytes)) {
      return Status::InvalidArgument(Mention(p.id) + " of " + ipc::FormatSize(bytes) +
                                     " is larger than the pool of " + pool.name() + " (" +
                                     ipc::FormatSize(pool.capacity()) + ", --gpu-memory)");
    }
  }
  Account& account = accounts_.at(client);
  DEPOT_RETURN_NOT_OK(accounts_.CheckHolding(client, account, pool.BlockSize(bytes)));
  return CheckMetadataRoom(client, account, CreateCost(p));
}

void ObjectStore::CreateAfterRoom(ClientId client, const CreateParams& p, CreateDone done) {
  if (Status st = CheckRoom(client, p); !st.ok()) return done(st);
  // The parameters outlive the request: room may come only after spills.
  struct Owned {
    CreateParams params;
    std::vector<std::byte> metadata;
    std::vector<std::byte> data;  // a host object's bytes sent with the request
    std::string name;
  };
  auto owned = std::make_shared<Owned>();
  owned->params = p;
  owned->metadata.assign(p.metadata.begin(), p.metadata.end());
  owned->data.assign(p.data.begin(), p.data.end());
  owned->name = std::string(p.name);
  owned->params.metadata = owned->metadata;
  owned->params.data = owned->data;
  owned->params.name = owned->name;
  creating_.insert(p.id);
  // While it waits for room, the daemon keeps the name, metadata and bytes for it: counted.
  const uint64_t waiting_cost =
      CreateCost(p) + owned->data.size() + (p.device == kHost ? owned->metadata.size() : 0);
  // Counted by uid too: the wait may outlive the client's session.
  const uint32_t uid = accounts_.at(client).uid;
  accounts_.CountObjectMetadata(client, uid, static_cast<int64_t>(waiting_cost));
  const uint64_t bytes = BytesOnTier(p);
  tiers_.AllocateOn(
      p.device, bytes,
      p.device == kHost ? Arena::WritersOf(accounts_.at(client).uid) : Arena::kTrustedWriters,
      [this, client, uid, owned, waiting_cost, bytes,
       done = std::move(done)](std::optional<TierPool::Block> block) mutable {
        const CreateParams& p = owned->params;
        creating_.erase(p.id);
        accounts_.CountObjectMetadata(client, uid, -static_cast<int64_t>(waiting_cost));
        TierPool& pool = tiers_.pool(p.device);
        Account* account = accounts_.Find(client);
        if (account == nullptr) {  // gone while waiting for room
          if (block) pool.Free(block->region, block->handle);
          return;
        }
        if (!block) {
          return done(Status::OutOfMemory(tiers_.OutOfMemoryMessage(p.device, p.id, bytes)));
        }
        // Checked again: the client's other creates may have been given room meanwhile.
        if (Status st = accounts_.CheckHolding(client, *account, block->size); !st.ok()) {
          pool.Free(block->region, block->handle);
          return done(st);
        }
        const uint32_t slot = AcquireSlot();
        if (slot == HeaderTable::kNoSlot) {
          pool.Free(block->region, block->handle);
          return done(Status::LimitExceeded(
              "the store holds " + std::to_string(table_.headers().slots()) +
              " objects, its limit; start depotd with a larger --max-objects"));
        }
        Publish(client, p, slot);
        if (p.device == kHost) {
          std::byte* to = arena_.base(block->region) + block->offset;
          if (!p.data.empty()) std::memcpy(to, p.data.data(), p.data.size());
          if (!p.metadata.empty())
            std::memcpy(to + p.data_size, p.metadata.data(), p.metadata.size());
          // The creator writes into its host replica: it counts as there from the start.
          tiers_.PlaceReplica(slot, kHost, *block).ready = true;
          table_.PublishTiers(slot);
        } else {
          table_.at(slot).replicas.kept_metadata() = std::move(owned->metadata);
          tiers_.PlaceReplica(slot, p.device, *block);  // ready once sealed
        }
        AddRef(*account, slot, p.device);
        done(LocationOf(slot, p.device));
      });
}

void ObjectStore::Seal(ClientId client, const ObjectId& id, std::function<void(Status)> done) {
  const uint32_t slot = table_.Find(id);
  if (slot == HeaderTable::kNoSlot) return done(Status::NotFound(Mention(id) + " does not exist"));
  Object& o = table_.at(slot);
  if (table_.IsSealed(slot) || o.sealing) {
    return done(Status::AlreadySealed(Mention(id) + " is already sealed"));
  }
  if (o.creator != client) {
    return done(Status::NotHeld(Mention(id) + " is being created by another client"));
  }
  if (!o.want_checksum) {
    FinishSeal(slot, std::nullopt);
    return done(Status::OK());
  }
  // Checksums are of host objects only (Create refuses them elsewhere).
  const auto& h = table_.header(slot);
  const std::byte* bytes = arena_.base(h.segment) + h.offset;
  const uint64_t size = h.data_size + h.metadata_size;
  if (size < kInlineChecksumBytes) {
    FinishSeal(slot, XXH3_64bits(bytes, size));
    return done(Status::OK());
  }
  // The creator keeps its reference while the worker reads, so the bytes stay put; if it
  // disconnects meanwhile, FinishSeal sees no references and makes the object evictable.
  o.sealing = true;
  executor_.Offload([this, slot, bytes, size, done = std::move(done)] {
    const uint64_t sum = XXH3_64bits(bytes, size);
    return std::function<void()>([this, slot, sum, done] {
      FinishSeal(slot, sum);
      done(Status::OK());
    });
  });
}

void ObjectStore::FinishSeal(uint32_t slot, std::optional<uint64_t> checksum) {
  auto& h = table_.header(slot);
  Object& o = table_.at(slot);
  o.sealing = false;
  h.checksum = checksum.value_or(0);
  if (checksum) h.flags |= ipc::kFlagHasChecksum;
  // An object made on a GPU has its one replica there; it is complete now.
  for (size_t i = 0; i < o.replicas.size(); ++i) o.replicas[i].ready = true;
  table_.PublishTiers(slot);
  HeaderTable& headers = table_.headers();
  headers.SetStateRefs(slot, ipc::ObjectState::kSealed, headers.refs(slot));
  counters_.objects_creating--;
  counters_.objects_sealed++;
  policy_.Reconsider(slot);
  if (o.failed) {
    Notify([id = table_.IdAt(slot)](StoreListener& l) { l.OnSealedFailed(id); });
  } else {
    Notify([id = table_.IdAt(slot), tiers = table_.TiersOf(slot)](StoreListener& l) {
      l.OnSealed(id, tiers);
    });
  }
  CompleteWaiters(slot);
}

Status ObjectStore::Abort(ClientId client, const ObjectId& id) {
  const uint32_t slot = table_.Find(id);
  if (slot == HeaderTable::kNoSlot) return Status::NotFound(Mention(id) + " does not exist");
  const Object& o = table_.at(slot);
  if (table_.IsSealed(slot) || o.sealing) {
    return Status::AlreadySealed(Mention(id) + " is sealed; delete it instead");
  }
  if (o.creator != client) {
    return Status::NotHeld(Mention(id) + " is being created by another client");
  }
  // Only the creator can hold an unsealed object, on the one tier it creates it on; dropping
  // its references frees it.
  const int32_t tier = o.replicas[0].tier;
  Account& account = accounts_.at(client);
  const uint32_t count = accounts_.RefsOf(account, slot, tier);
  for (uint32_t i = 0; i < count; ++i) DropRef(account, slot, tier);
  return Status::OK();
}

Status ObjectStore::Wait(ClientId client, uint64_t request, std::vector<ObjectId> ids, size_t count,
                         int64_t timeout_ms, GetDone done) {
  if (count > ids.size()) {
    return Status::InvalidArgument("a wait for " + std::to_string(count) + " of " +
                                   std::to_string(ids.size()) + " objects can never end");
  }
  const size_t enough = count == 0 ? ids.size() : count;
  return Fetch({.client = client,
                .request = request,
                .hold = false,
                .wait = true,
                .enough = enough,
                .ids = std::move(ids)},
               timeout_ms, std::move(done));
}

Status ObjectStore::Fetch(WaitingGets::Get get, int64_t timeout_ms, GetDone done) {
  const int32_t device = get.tier;
  DEPOT_RETURN_NOT_OK(CheckTier(device));
  using Wait = WaitingGets::Wait;
  const ClientId client = get.client;
  const bool hold = get.hold;
  Account& account = accounts_.at(client);
  const size_t n = get.ids.size();
  get.results.resize(n);
  get.waits.assign(n, Wait::kNone);
  size_t seal_waits = 0;
  std::vector<uint32_t> copies;
  const uint64_t now = ipc::WallNanos();
  for (size_t i = 0; i < n; ++i) {
    const uint32_t slot = table_.Find(get.ids[i]);
    const bool usable = slot != HeaderTable::kNoSlot && table_.IsUsable(slot);
    if (usable && table_.IsFailed(slot)) {
      get.results[i] = FailureResult(slot);
    } else if (usable && get.wait) {
      get.results[i].code = StatusCode::kOk;  // sealed: all a wait asks
    } else if (usable && table_.IsReady(slot, device)) {
      get.results[i] = Grant(hold ? &account : nullptr, slot, device, now);
      counters_.get_hits++;
    } else if (usable) {
      get.waits[i] = Wait::kCopy;
      copies.push_back(slot);
      counters_.get_hits++;
    } else {
      get.results[i].code = StatusCode::kNotFound;
      if (timeout_ms != 0) {
        get.waits[i] = Wait::kSeal;
        ++seal_waits;
      }
    }
  }
  get.missing = seal_waits + copies.size();
  if (get.Answerable()) {
    // A wait answered with ids still missing leaves them kNotFound: none was waited for.
    done(std::move(get.results));
    return Status::OK();
  }
  get.cost = kWaitingIdMetadataBytes * n;
  const size_t waiting = waiting_.CountOf(client);
  const uint32_t max_waiting = accounts_.limits().max_pending_gets;
  Status refused = max_waiting != 0 && waiting >= max_waiting
                       ? Status::LimitExceeded("client " + std::to_string(client) +
                                               " already has " + std::to_string(waiting) +
                                               " gets waiting, its limit (--client-max-pending)")
                       : accounts_.CheckMetadata(client, account, get.cost);
  if (!refused.ok()) {
    // Give back what this call granted: the request fails as a whole.
    for (size_t i = 0; i < n; ++i) {
      if (hold && get.results[i].code == StatusCode::kOk && get.waits[i] == Wait::kNone) {
        DropRef(account, get.results[i].location.slot, device);
      }
    }
    return refused;
  }
  counters_.get_waits += seal_waits;
  get.done = std::move(done);
  const WaitingGets::Id waiter = waiting_.Add(std::move(get), timeout_ms);
  // Last: a copy that fails at once answers the get, which may then be gone.
  for (uint32_t slot : copies) tiers_.StartCopy(slot, device, waiter);
  return Status::OK();
}

void ObjectStore::CompleteWaiters(uint32_t slot) {
  const ObjectId id = table_.IdAt(slot);
  const uint64_t now = ipc::WallNanos();
  std::vector<std::pair<int32_t, WaitingGets::Id>> copies;  // (tier, get) to start
  const std::vector<WaitingGets::SealWaiter> waiters = waiting_.TakeSealWaiters(id);
  for (size_t k = 0; k < waiters.size();) {
    // The ids of one get come together: it is answered once they are all resolved.
    const WaitingGets::Id waiter = waiters[k].first;
    WaitingGets::Get* get = waiting_.Find(waiter);
    Account* holder = get != nullptr && get->hold ? &accounts_.at(get->client) : nullptr;
    bool copying = false;
    for (; k < waiters.size() && waiters[k].first == waiter; ++k) {
      const size_t i = waiters[k].second;
      if (get == nullptr || get->waits[i] != WaitingGets::Wait::kSeal) continue;
      if (table_.IsFailed(slot)) {
        get->Resolve(i, FailureResult(slot));
      } else if (get->wait) {
        get->Resolve(i, GetResult{});  // sealed: all a wait asks
      } else if (table_.IsReady(slot, get->tier)) {
        get->Resolve(i, Grant(holder, slot, get->tier, now));
      } else {
        get->waits[i] = WaitingGets::Wait::kCopy;
        copying = true;
      }
    }
    if (copying) copies.emplace_back(get->tier, waiter);
    if (get != nullptr) waiting_.FinishIfDone(waiter);
  }
  for (auto [tier, waiter] : copies) tiers_.StartCopy(slot, tier, waiter);
}

void ObjectStore::Answer(WaitingGets::Id waiter, uint32_t slot, const ObjectId& id,
                         const Status& failure) {
  WaitingGets::Get* get = waiting_.Find(waiter);
  if (get == nullptr) return;
  const bool usable = failure.ok() && table_.Find(id) == slot && table_.IsUsable(slot) &&
                      table_.IsReady(slot, get->tier);
  // Why the copy failed, for the client (one copy of the message, shared by its ids).
  std::shared_ptr<const std::string> why;
  if (!failure.ok() && !failure.message().empty()) {
    why = std::make_shared<const std::string>(failure.message());
  }
  const uint64_t now = ipc::WallNanos();
  Account* holder = get->hold ? &accounts_.at(get->client) : nullptr;
  for (size_t i = 0; i < get->ids.size(); ++i) {
    if (get->ids[i] != id || get->waits[i] != WaitingGets::Wait::kCopy) continue;
    if (usable) {
      get->Resolve(i, Grant(holder, slot, get->tier, now));
    } else {
      get->Resolve(i, failure.ok() ? GetResult{StatusCode::kNotFound, {}}
                                   : GetResult{failure.code(), {}, why});
    }
  }
  waiting_.FinishIfDone(waiter);
}

Status ObjectStore::Release(ClientId client, std::span<const ObjectId> ids, int32_t device) {
  // Checked first: a reference key keeps 8 bits of the tier, so an unchecked one could name
  // another.
  DEPOT_RETURN_NOT_OK(CheckTier(device));
  Account& account = accounts_.at(client);
  Status first_error;
  for (const ObjectId& id : ids) {
    const uint32_t slot = table_.Find(id);
    if (slot == HeaderTable::kNoSlot || accounts_.RefsOf(account, slot, device) == 0) {
      if (first_error.ok()) {
        first_error = Status::NotHeld(
            Mention(id) +
            (slot == HeaderTable::kNoSlot
                 ? " does not exist"
                 : " is not held by this client" +
                       (device == kHost ? std::string() : " on " + tiers_.pool(device).name())));
      }
      continue;
    }
    DropRef(account, slot, device);
  }
  return first_error;
}

void ObjectStore::MarkDeleted(uint32_t slot) {
  HeaderTable& headers = table_.headers();
  headers.at(slot).flags |= ipc::kFlagDeletePending;
  headers.Publish(slot);
  if (headers.refs(slot) == 0) {
    FreeDeleted(slot);
  } else {
    policy_.Reconsider(slot);  // no replica of it is a candidate any more
  }
}

std::vector<StatusCode> ObjectStore::Delete(std::span<const ObjectId> ids,
                                            std::optional<uint32_t> only_of_uid) {
  std::vector<StatusCode> out;
  out.reserve(ids.size());
  for (const ObjectId& id : ids) {
    const uint32_t slot = table_.Find(id);
    if (slot == HeaderTable::kNoSlot || table_.IsDeletePending(slot)) {
      out.push_back(StatusCode::kNotFound);
    } else if (only_of_uid && table_.at(slot).owner != *only_of_uid) {
      out.push_back(StatusCode::kPermissionDenied);
    } else if (!table_.IsSealed(slot)) {
      out.push_back(StatusCode::kNotSealed);
    } else {
      out.push_back(StatusCode::kOk);
      MarkDeleted(slot);
    }
  }
  return out;
}

Result<std::vector<StatusCode>> ObjectStore::Handoff(ClientId client, ClientId group,
                                                     std::span<const ObjectId> ids, int32_t tier,
                                                     uint32_t ttl_ms, uint32_t grace_ms,
                                                     std::optional<uint32_t> only_of_uid) {
  // Checked first: a reference key keeps 8 bits of the tier.
  DEPOT_RETURN_NOT_OK(CheckTier(tier));
  Account& sender = accounts_.at(client);
  Account& holder = accounts_.at(group);
  const uint64_t now = ipc::MonotonicNanos();
  const uint64_t deadline = ttl_ms != 0 ? now + ttl_ms * 1'000'000ull : HandoffDeadlines::kNever;
  const ClientId graced_by = grace_ms != 0 ? client : 0;
  const uint64_t cost = HandoffDeadlines::Cost(deadline, graced_by);
  std::vector<StatusCode> out;
  out.reserve(ids.size());
  for (const ObjectId& id : ids) {
    const uint32_t slot = table_.Find(id);
    const uint32_t held = slot == HeaderTable::kNoSlot ? 0 : accounts_.RefsOf(holder, slot, tier);
    if (slot == HeaderTable::kNoSlot) {
      out.push_back(StatusCode::kNotFound);
    } else if (only_of_uid && table_.at(slot).owner != *only_of_uid) {
      out.push_back(StatusCode::kPermissionDenied);
    } else if (!table_.IsSealed(slot)) {
      out.push_back(StatusCode::kNotSealed);
    } else if (held >= kMaxHandoffs) {
      out.push_back(StatusCode::kLimitExceeded);
    } else if (held == 0 && accounts_.RefsOf(sender, slot, tier) == 0) {
      // Neither the sender nor the group holds it there: not the sender's to hand over.
      out.push_back(StatusCode::kNotHeld);
    } else if (cost != 0 && !accounts_.CheckMetadata(group, holder, cost).ok()) {
      out.push_back(StatusCode::kLimitExceeded);  // a deadline or a grace is daemon memory
    } else {
      out.push_back(StatusCode::kOk);
      AddRef(holder, slot, tier);
      if (!table_.IsDeletePending(slot)) MarkDeleted(slot);
      if (cost != 0) {
        handoff_deadlines_.Add({group, slot, tier}, deadline, graced_by, grace_ms * 1'000'000ull);
        accounts_.CountMetadata(group, static_cast<int64_t>(cost));
      }
    }
  }
  if (ttl_ms != 0) ArmHandoffTimer();
  return out;
}

void ObjectStore::SenderEnded(ClientId sender, uint64_t ended_ns) {
  // In slices, as expiries go: a session may have handed off a million values with a grace.
  constexpr size_t kSlice = 4096;
  if (handoff_deadlines_.SenderEnded(sender, ended_ns, kSlice)) {
    executor_.Defer([this, sender, ended_ns] { SenderEnded(sender, ended_ns); });
  }
  ArmHandoffTimer();
}

void ObjectStore::ArmHandoffTimer() {
  const uint64_t next = handoff_deadlines_.next();
  if (next == 0 || (handoff_timer_at_ != 0 && handoff_timer_at_ <= next)) return;
  handoff_timer_at_ = next;
  const uint64_t now = ipc::MonotonicNanos();
  handoff_timer_.expires_after(std::chrono::nanoseconds(next > now ? next - now : 0));
  handoff_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (ec) return;  // cancelled: a sooner deadline set it again, or the store is going
    handoff_timer_at_ = 0;
    ExpireHandoffs();
  });
}

void ObjectStore::ExpireHandoffs() {
  // In slices: when more are due, the timer fires again at once, after what else is ready.
  constexpr size_t kSlice = 4096;
  std::map<ClientId, uint64_t> freed;
  for (const HandoffDeadlines::Key& key :
       handoff_deadlines_.Expire(ipc::MonotonicNanos(), &freed, kSlice)) {
    if (Account* group = accounts_.Find(key.group)) DropRef(*group, key.slot, key.tier);
  }
  for (const auto& [group, bytes] : freed) {
    accounts_.CountMetadata(group, -static_cast<int64_t>(bytes));
  }
  ArmHandoffTimer();
}

Result<std::vector<GetResult>> ObjectStore::Claim(ClientId client, ClientId group,
                                                  std::span<const ObjectId> ids, int32_t tier) {
  DEPOT_RETURN_NOT_OK(CheckTier(tier));
  Account& claimer = accounts_.at(client);
  Account& holder = accounts_.at(group);
  const uint64_t now = ipc::WallNanos();
  std::vector<GetResult> out;
  out.reserve(ids.size());
  for (const ObjectId& id : ids) {
    const uint32_t slot = table_.Find(id);
    if (slot == HeaderTable::kNoSlot || accounts_.RefsOf(holder, slot, tier) == 0) {
      out.push_back(
          GetResult{.code = StatusCode::kNotHeld,
                    .location = {},
                    .failure = std::make_shared<const std::string>(
                        "no handoff of it in this group waits to be claimed" +
                        (tier == kHost ? std::string() : " on " + tiers_.pool(tier).name()) +
                        " (claimed already, never handed off, or its group ended)")});
      continue;
    }
    // The group's reference keeps the replica ready there, so a get is granted at once,
    // unless the claimer is at its limits: then the group keeps it.
    out.push_back(Grant(&claimer, slot, tier, now));
    if (out.back().code != StatusCode::kOk) continue;
    if (const uint64_t freed = handoff_deadlines_.Claimed({group, slot, tier}); freed != 0) {
      accounts_.CountMetadata(group, -static_cast<int64_t>(freed));
    }
    DropRef(holder, slot, tier);
    counters_.get_hits++;
  }
  return out;
}

bool ObjectStore::Contains(const ObjectId& id) const {
  const uint32_t slot = table_.Find(id);
  return slot != HeaderTable::kNoSlot && table_.IsUsable(slot);
}

void ObjectStore::ProbeCopyRates(uint64_t bytes) {
  if (gpus_.empty()) return;
  gpu::DeviceBackend& backend = gpus_.front()->backend();
  executor_.Offload([this, &backend, bytes] {
    Result<CopyRates> probed = store::ProbeCopyRates(backend, bytes);
    return std::function<void()>([this, probed = std::move(probed)] {
      if (!probed.ok()) {
        spdlog::warn("could not time copies between host memory and GPUs: {}",
                     probed.status().message());
        return;
      }
      if (probed->host_to_gpu == 0) return;  // the devices are too small to time a copy
      tiers_.StartCopyRatesFrom(*probed);
      const auto rate = [](double r) { return ipc::FormatSize(static_cast<uint64_t>(r)) + "/s"; };
      spdlog::info("copies timed: {} host->GPU, {} GPU->host{}", rate(probed->host_to_gpu),
                   rate(probed->gpu_to_host),
                   probed->gpu_to_gpu == 0 ? "" : ", " + rate(probed->gpu_to_gpu) + " GPU->GPU");
    });
  });
}

std::vector<Placement> ObjectStore::Locate(std::span<const ObjectId> ids) const {
  std::vector<Placement> out(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const uint32_t slot = table_.Find(ids[i]);
    Placement& p = out[i];
    if (slot == HeaderTable::kNoSlot || !table_.IsUsable(slot)) {
      p.creating =
          slot != HeaderTable::kNoSlot ? !table_.IsSealed(slot) : creating_.contains(ids[i]);
      continue;
    }
    p.found = true;
    if (table_.IsFailed(slot)) {
      p.failed = true;
      continue;
    }
    p.data_size = table_.header(slot).data_size;
    p.metadata_size = table_.header(slot).metadata_size;
    const ReplicaSet& replicas = table_.at(slot).replicas;
    for (size_t r = 0; r < replicas.size(); ++r) {
      // A disk copy is no place to read from: a get restores it.
      if (replicas[r].tier == kDisk) continue;
      (replicas[r].ready ? p.tiers : p.arriving) |= ipc::TierBit(replicas[r].tier);
    }
  }
  return out;
}

GetResult ObjectStore::FailureResult(uint32_t slot) const {
  return GetResult{
      .code = StatusCode::kTaskFailed, .location = {}, .failure = table_.FailureOf(slot)};
}

size_t ObjectStore::SealFailed(ClientId client, std::span<const ObjectId> ids,
                               std::string_view message) {
  // One copy of the message, shared by the outputs of the task and the gets answered.
  const auto kept =
      std::make_shared<const std::string>(ipc::CutUtf8(message, scheduler::kMaxFailureMessage));
  const uint32_t owner = accounts_.at(client).uid;
  size_t made = 0;
  for (const ObjectId& id : ids) {
    if (id.IsNil() || table_.Find(id) != HeaderTable::kNoSlot || creating_.contains(id)) continue;
    const uint32_t slot = AcquireSlot();
    // An empty block: the object's place in host memory's eviction order, as any object's.
    std::optional<TierPool::Block> block;
    if (slot != HeaderTable::kNoSlot) block = tiers_.AllocateOrEvict(0);
    if (!block) {
      if (slot != HeaderTable::kNoSlot) table_.headers().Release(slot);
      if (uint64_t held_back = 0; failure_log_.Allow(&held_back)) {
        spdlog::warn("cannot seal {} as failed: no {} left ({} more since the last report)",
                     Mention(id), slot == HeaderTable::kNoSlot ? "header slot" : "host memory",
                     held_back);
      }
      continue;
    }
    table_.Insert(slot, NewObject{.id = id, .creator = client, .owner = owner});
    table_.SetFailed(slot, kept);
    ChargeObject(slot, kObjectMetadataBytes + kept->size());
    counters_.objects_creating++;
    tiers_.PlaceReplica(slot, kHost, *block);
    FinishSeal(slot, std::nullopt);
    ++made;
  }
  return made;
}

std::string ObjectStore::FailureOf(const ObjectId& id) const {
  const uint32_t slot = table_.Find(id);
  if (slot == HeaderTable::kNoSlot || !table_.IsFailed(slot)) return {};
  return *table_.FailureOf(slot);
}

int32_t ObjectStore::Hold(ClientId client, const ObjectId& id, int32_t tier) {
  const uint32_t slot = table_.Find(id);
  if (slot == HeaderTable::kNoSlot || !table_.IsUsable(slot)) return kAnyTier;
  if (tier == kAnyTier) {
    // Host memory first, then the GPUs in order, then the disk.
    for (int32_t t = kHost; tiers_.Has(t); ++t) {
      if (table_.IsReady(slot, t)) {
        tier = t;
        break;
      }
    }
    if (tier == kAnyTier && tiers_.disk() != nullptr && table_.IsReady(slot, kDisk)) tier = kDisk;
  }
  const bool known = tiers_.Has(tier) || (tier == kDisk && tiers_.disk() != nullptr);
  if (!known || !table_.IsReady(slot, tier)) return kAnyTier;
  AddRef(accounts_.at(client), slot, tier);
  return tier;
}

void ObjectStore::ReleaseGraphHold(const ObjectId& id) {
  const uint32_t slot = table_.Find(id);
  if (slot == HeaderTable::kNoSlot) return;
  int32_t tier = kAnyTier;
  table_.at(slot).replicas.ForEach([&](const Replica& r) {
    if (r.graph_held && tier == kAnyTier) tier = r.tier;
  });
  if (tier != kAnyTier) DropRef(accounts_.at(kSchedulerClient), slot, tier);
}

uint64_t ObjectStore::Room(int32_t tier) const {
  if (!tiers_.Has(tier)) return 0;
  const TierPool& pool = tiers_.pool(tier);
  uint64_t taken = tiers_.usage(tier).held_bytes;
  if (tier == kHost) {
    taken = eviction_ ? taken + tiers_.counters().pinned_bytes : pool.used_bytes();
  }
  return pool.capacity() > taken ? pool.capacity() - taken : 0;
}

ObjectView ObjectStore::Describe(uint32_t slot) const {
  const ipc::ObjectHeader& h = table_.header(slot);
  const uint32_t flags = h.flags.load(std::memory_order_relaxed);
  return ObjectView{.id = table_.IdAt(slot),
                    .name = std::string(table_.NameOf(slot)),
                    .sealed = table_.IsSealed(slot),
                    .failed = table_.IsFailed(slot),
                    .data_size = h.data_size,
                    .metadata_size = h.metadata_size,
                    .references = table_.headers().refs(slot) + leases_.Count(slot),
                    .pinned = (flags & ipc::kFlagPinned) != 0,
                    .delete_pending = (flags & ipc::kFlagDeletePending) != 0,
                    .has_checksum = (flags & ipc::kFlagHasChecksum) != 0,
                    .checksum = h.checksum,
                    .create_time_ns = h.create_time_ns,
                    .access_time_ns = h.access_time_ns,
                    .segment = h.segment,
                    .offset = h.offset,
                    .tiers = table_.TiersOf(slot),
                    .owner_uid = table_.at(slot).owner};
}

ClientUsage ObjectStore::UsageOf(ClientId client) const {
  ClientUsage usage = accounts_.UsageOf(client);
  const Account* account = accounts_.Find(client);
  if (account == nullptr) return usage;
  for (const auto& [slot, count] : leases_.LeasedBy(client)) {
    usage.references += count;
    bool counted = false;
    for (int32_t tier = kHost; tiers_.Has(tier) && !counted; ++tier) {
      counted = accounts_.RefsOf(*account, slot, tier) != 0;
    }
    if (counted || !table_.IsReady(slot, kHost)) continue;
    usage.objects++;
    usage.bytes += tiers_.ReplicaBytes(slot, kHost);
  }
  return usage;
}

std::vector<HolderInfo> ObjectStore::HoldersOf(uint32_t slot) const {
  std::vector<HolderInfo> holders = accounts_.HoldersOf(slot);
  for (const auto& [client, count] : leases_.HoldersOf(slot)) {
    auto it = std::find_if(holders.begin(), holders.end(),
                           [client](const HolderInfo& h) { return h.client == client; });
    if (it == holders.end()) {
      it = holders.insert(holders.end(), HolderInfo{.client = client});
    }
    it->references += count;
    if (!it->tiers.empty() && it->tiers.front().first == kHost) {
      it->tiers.front().second += count;
    } else {
      it->tiers.insert(it->tiers.begin(), {kHost, count});
    }
  }
  std::sort(holders.begin(), holders.end(),
            [](const HolderInfo& a, const HolderInfo& b) { return a.client < b.client; });
  return holders;
}

std::vector<ReplicaInfo> ObjectStore::ReplicasOf(uint32_t slot) const {
  std::vector<ReplicaInfo> out;
  const ReplicaSet& replicas = table_.at(slot).replicas;
  for (size_t i = 0; i < replicas.size(); ++i) {
    const Replica& r = replicas[i];
    out.push_back(
        {r.tier, r.region, tiers_.pool(r.tier).OffsetOf(r.region, r.handle), r.refs, r.ready});
  }
  std::sort(out.begin(), out.end(),
            [](const ReplicaInfo& a, const ReplicaInfo& b) { return a.device < b.device; });
  return out;
}

struct ObjectStore::VerifyRun {
  std::vector<VerifyOutcome> outcomes;
  std::vector<uint32_t> held;  // by outcome: the slot the store holds for it, or kNoSlot
  size_t jobs_left = 0;
  VerifyDone done;
};

void ObjectStore::Verify(std::vector<ObjectId> ids, VerifyDone done) {
  auto run = std::make_shared<VerifyRun>();
  run->outcomes.resize(ids.size());
  run->held.assign(ids.size(), HeaderTable::kNoSlot);
  run->done = std::move(done);
  Account& daemon = accounts_.at(kDaemonClient);
  // Objects are hashed in jobs of about kInlineChecksumBytes, so that many small objects
  // cost few hand-offs and one large object does not wait behind others.
  struct Piece {
    size_t index;  // into run->outcomes
    const std::byte* bytes;
    uint64_t size;
  };
  std::vector<std::vector<Piece>> jobs;
  uint64_t job_bytes = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    VerifyOutcome& outcome = run->outcomes[i];
    outcome.id = ids[i];
    const uint32_t slot = table_.Find(ids[i]);
    if (slot == HeaderTable::kNoSlot || table_.IsDeletePending(slot)) {
      outcome.state = VerifyState::kNotFound;
      continue;
    }
    const auto& h = table_.header(slot);
    if (!table_.IsSealed(slot)) {
      outcome.state = VerifyState::kNotSealed;
    } else if (!(h.flags & ipc::kFlagHasChecksum)) {
      outcome.state = VerifyState::kNoChecksum;
    } else if (!table_.IsReady(slot, kHost)) {
      outcome.state = VerifyState::kNotOnHost;
    } else {
      outcome.expected = h.checksum;
      AddRef(daemon, slot, kHost);
      run->held[i] = slot;
      if (jobs.empty() || job_bytes >= kInlineChecksumBytes) {
        jobs.emplace_back();
        job_bytes = 0;
      }
      const uint64_t size = h.data_size + h.metadata_size;
      jobs.back().push_back({i, arena_.base(h.segment) + h.offset, size});
      job_bytes += size;
    }
  }
  if (jobs.empty()) return FinishVerify(run);
  run->jobs_left = jobs.size();
  for (auto& job : jobs) {
    executor_.Offload([this, run, job = std::move(job)] {
      std::vector<uint64_t> sums;
      sums.reserve(job.size());
      for (const Piece& piece : job) sums.push_back(XXH3_64bits(piece.bytes, piece.size));
      return std::function<void()>([this, run, job, sums = std::move(sums)] {
        for (size_t k = 0; k < job.size(); ++k) run->outcomes[job[k].index].actual = sums[k];
        if (--run->jobs_left == 0) FinishVerify(run);
      });
    });
  }
}

void ObjectStore::FinishVerify(const std::shared_ptr<VerifyRun>& run) {
  Account& daemon = accounts_.at(kDaemonClient);
  for (size_t i = 0; i < run->outcomes.size(); ++i) {
    if (run->held[i] == HeaderTable::kNoSlot) continue;
    VerifyOutcome& outcome = run->outcomes[i];
    outcome.state = outcome.actual == outcome.expected ? VerifyState::kOk : VerifyState::kMismatch;
    DropRef(daemon, run->held[i], kHost);
  }
  run->done(std::move(run->outcomes));
}

EvictOutcome ObjectStore::EvictUnreferenced(uint64_t bytes, bool all) {
  EvictOutcome outcome;
  EvictionPlanner::Plan plan = tiers_.planner().Require({.tier = kHost});
  while (all || outcome.bytes < bytes) {
    const std::optional<EvictionPlanner::Victim> victim = plan.Next();
    if (!victim) break;
    const Tiers::Freed freed = tiers_.FreeHostBlock(victim->slot);  // a leased one leaves the list
    if (freed != Tiers::Freed::kNothing) outcome.bytes += victim->bytes;
    if (freed == Tiers::Freed::kObject) outcome.objects++;
  }
  return outcome;
}

}  // namespace depot::store
