#include "store/object_store.h"

#include <unistd.h>

#include <spdlog/spdlog.h>
#include <xxhash.h>

#include <algorithm>
#include <boost/asio/post.hpp>
#include <cstring>

#include "depot/ipc/units.h"

namespace depot::store {

namespace {
// Checksums of objects at least this large run on the worker pool, not on the loop.
constexpr uint64_t kInlineChecksumBytes = 1u << 20;

std::string Describe(const ObjectId& id) { return "object " + id.Hex(); }
}  // namespace

ObjectStore::ObjectStore(boost::asio::io_context& loop, boost::asio::thread_pool& workers,
                         Arena& arena, HeaderTable& headers, ClientLimits limits, bool eviction,
                         std::vector<gpu::DevicePool*> pools)
    : loop_(loop),
      workers_(workers),
      arena_(arena),
      headers_(headers),
      limits_(limits),
      eviction_(eviction),
      pools_(std::move(pools)),
      device_lru_(pools_.size()),
      device_usage_(pools_.size()),
      room_waits_(pools_.size()),
      spills_in_flight_(pools_.size(), 0) {
  clients_.try_emplace(kDaemonClient).first->second.uid = ::getuid();
}

ObjectStore::~ObjectStore() {
  for (auto& [id, get] : pending_) get.timer->cancel();
}

uint32_t ObjectStore::Find(const ObjectId& id) const {
  auto it = index_.find(id);
  return it == index_.end() ? HeaderTable::kNoSlot : it->second;
}

uint64_t ObjectStore::BlockBytes(uint32_t slot) const {
  const auto& h = headers_.at(slot);
  return arena_.ReservedSize(h.data_size + h.metadata_size);
}

uint64_t ObjectStore::TierBytes(uint32_t slot, int32_t device) const {
  if (device == kHost) return BlockBytes(slot);
  return gpu::DevicePool::ReservedSize(headers_.at(slot).data_size);
}

Location ObjectStore::LocationOf(uint32_t slot, int32_t device) const {
  const auto& h = headers_.at(slot);
  if (device == kHost) return Location{slot, h.segment, h.offset, h.data_size, h.metadata_size};
  const Replica* r = FindReplica(slot, device);
  return Location{slot,
                  r->chunk,
                  r->offset,
                  h.data_size,
                  h.metadata_size,
                  device,
                  objects_[slot].gpu->metadata};
}

ObjectStore::Replica* ObjectStore::FindReplica(uint32_t slot, int32_t device) {
  for (Replica& r : Replicas(objects_[slot])) {
    if (r.device == device) return &r;
  }
  return nullptr;
}

const ObjectStore::Replica* ObjectStore::FindReplica(uint32_t slot, int32_t device) const {
  return const_cast<ObjectStore*>(this)->FindReplica(slot, device);
}

bool ObjectStore::IsReady(uint32_t slot, int32_t device) const {
  if (device == kHost) return objects_[slot].on_host && objects_[slot].host_ready;
  const Replica* r = FindReplica(slot, device);
  return r != nullptr && r->ready;
}

bool ObjectStore::HasOtherCopy(uint32_t slot, int32_t device) const {
  if (device != kHost && IsReady(slot, kHost)) return true;
  for (const Replica& r : Replicas(objects_[slot])) {
    if (r.device != device && r.ready) return true;
  }
  return false;
}

uint32_t& ObjectStore::TierRefs(uint32_t slot, int32_t device) {
  if (device == kHost) return objects_[slot].host_refs;
  return FindReplica(slot, device)->refs;
}

uint64_t ObjectStore::TiersOf(uint32_t slot) const {
  uint64_t tiers = IsReady(slot, kHost) ? ipc::kTierHost : 0;
  for (const Replica& r : Replicas(objects_[slot])) {
    if (r.ready) tiers |= ipc::TierBit(r.device);
  }
  return tiers;
}

void ObjectStore::PublishTiers(uint32_t slot) {
  headers_.at(slot).tiers.store(TiersOf(slot), std::memory_order_relaxed);
  headers_.Publish(slot);
}

Status ObjectStore::CheckDevice(int32_t device) const {
  if (device == kHost || (device >= 0 && static_cast<size_t>(device) < pools_.size())) {
    return Status::OK();
  }
  return Status::InvalidArgument(
      "there is no GPU " + std::to_string(device) + ": this daemon serves " +
      std::to_string(pools_.size()) + " GPU" + (pools_.size() == 1 ? "" : "s") +
      (pools_.empty() ? " (start depotd on a host with GPUs, or with --simulate-gpus)" : ""));
}

void ObjectStore::AddClient(ClientId client, uint32_t uid) {
  clients_.try_emplace(client).first->second.uid = uid;
}

void ObjectStore::RemoveClient(ClientId client) {
  auto it = clients_.find(client);
  if (it == clients_.end()) return;
  ClientState& state = it->second;
  for (uint64_t pending_id : state.pending_gets) {
    auto p = pending_.find(pending_id);
    if (p == pending_.end()) continue;
    p->second.timer->cancel();
    ForgetWaits(pending_id, p->second);
    UncountWait(p->second);
    pending_.erase(p);
  }
  // Drop every reference; the last reference to an unsealed object aborts it.
  std::vector<std::pair<uint64_t, uint32_t>> refs(state.refs.begin(), state.refs.end());
  for (auto [key, count] : refs) {
    for (uint32_t i = 0; i < count; ++i) DropRef(state, SlotOfKey(key), DeviceOfKey(key));
  }
  clients_.erase(it);
}

Status ObjectStore::CheckLimits(ClientId client, const ClientState& state, uint64_t bytes) const {
  if (limits_.max_objects != 0 && state.objects >= limits_.max_objects) {
    return Status::LimitExceeded("client " + std::to_string(client) + " already holds " +
                                 std::to_string(state.objects) +
                                 " objects, its limit (--client-max-objects); release some first");
  }
  if (limits_.max_bytes != 0 && state.held_bytes + bytes > limits_.max_bytes) {
    return Status::LimitExceeded("client " + std::to_string(client) + " holds " +
                                 ipc::FormatSize(state.held_bytes) + "; another " +
                                 ipc::FormatSize(bytes) + " would pass its limit of " +
                                 ipc::FormatSize(limits_.max_bytes) + " (--client-max-bytes)");
  }
  return Status::OK();
}

Status ObjectStore::CheckMetadata(ClientId client, const ClientState& state, uint64_t bytes) const {
  if (limits_.max_metadata_bytes != 0 &&
      state.metadata_bytes + bytes > limits_.max_metadata_bytes) {
    return Status::LimitExceeded("client " + std::to_string(client) + " has the daemon keep " +
                                 ipc::FormatSize(state.metadata_bytes) +
                                 " for it (object entries, names, GPU metadata, "
                                 "waiting gets); another " +
                                 ipc::FormatSize(bytes) + " would pass its limit of " +
                                 ipc::FormatSize(limits_.max_metadata_bytes) +
                                 " (--client-max-metadata)");
  }
  if (limits_.metadata_budget != 0 && counters_.metadata_bytes + bytes > limits_.metadata_budget) {
    return Status::LimitExceeded(
        "the daemon keeps " + ipc::FormatSize(counters_.metadata_bytes) +
        " for its clients (object entries, names, GPU metadata, waiting gets); another " +
        ipc::FormatSize(bytes) + " would pass its budget of " +
        ipc::FormatSize(limits_.metadata_budget) +
        " (--metadata-budget); delete objects or start depotd with a larger budget");
  }
  return Status::OK();
}

void ObjectStore::CountMetadata(ClientId client, int64_t bytes) {
  counters_.metadata_bytes += static_cast<uint64_t>(bytes);
  if (auto it = clients_.find(client); it != clients_.end()) {
    it->second.metadata_bytes += static_cast<uint64_t>(bytes);
  }
}

Status ObjectStore::ChargeRequests(ClientId client, int64_t bytes) {
  auto it = clients_.find(client);
  if (it == clients_.end()) {
    return Status::Internal("client " + std::to_string(client) + " is not connected");
  }
  ClientState& state = it->second;
  const auto more = static_cast<uint64_t>(bytes);
  if (bytes > 0 && limits_.max_metadata_bytes != 0 &&
      state.request_bytes + more > limits_.max_metadata_bytes) {
    return Status::LimitExceeded(
        "client " + std::to_string(client) + " has the daemon keep " +
        ipc::FormatSize(state.request_bytes) + " for its requests in progress; another " +
        ipc::FormatSize(more) + " would pass its limit of " +
        ipc::FormatSize(limits_.max_metadata_bytes) + " (--client-max-metadata)");
  }
  if (bytes > 0 && limits_.metadata_budget != 0 &&
      counters_.request_bytes + more > limits_.metadata_budget) {
    return Status::LimitExceeded("the daemon keeps " + ipc::FormatSize(counters_.request_bytes) +
                                 " for its clients' requests in progress; another " +
                                 ipc::FormatSize(more) + " would pass its budget of " +
                                 ipc::FormatSize(limits_.metadata_budget) + " (--metadata-budget)");
  }
  state.request_bytes += more;  // modulo 2^64: a negative `bytes` subtracts
  counters_.request_bytes += more;
  return Status::OK();
}

void ObjectStore::ChargeObject(uint32_t slot, uint64_t bytes) {
  // At most the entry, a name and a frame's metadata: far below 4 GiB.
  objects_[slot].metadata_cost += static_cast<uint32_t>(bytes);
  CountMetadata(objects_[slot].creator, static_cast<int64_t>(bytes));
}

void ObjectStore::UncountWait(const PendingGet& get) {
  CountMetadata(get.client, -static_cast<int64_t>(get.metadata_cost));
}

uint64_t ObjectStore::CreateCost(const CreateParams& p) {
  return kObjectMetadataBytes + p.name.size() + (p.device == kHost ? 0 : p.metadata.size());
}

std::string ObjectStore::OutOfMemoryMessage(const ObjectId& id, uint64_t bytes) const {
  const uint64_t used = arena_.used_bytes();
  return "cannot fit " + Describe(id) + " of " + ipc::FormatSize(bytes) + ": " +
         ipc::FormatSize(arena_.capacity() - used) + " of " + ipc::FormatSize(arena_.capacity()) +
         " is free (largest free block " + ipc::FormatSize(arena_.largest_free_block()) + "), " +
         ipc::FormatSize(counters_.held_bytes) +
         " is held by references or objects being created, " +
         ipc::FormatSize(counters_.pinned_bytes) + " is pinned" +
         (eviction_ ? "" : ", and eviction is off (--no-evict)") +
         "; release or delete objects, or start depotd with more --memory";
}

void ObjectStore::MakeEvictable(uint32_t slot) {
  const uint32_t segment = headers_.at(slot).segment;
  if (segment >= evictable_bytes_.size()) evictable_bytes_.resize(segment + 1, 0);
  evictable_bytes_[segment] += BlockBytes(slot);
  lru_.PushBack(slot);
}

void ObjectStore::MakeUnevictable(uint32_t slot) {
  if (!lru_.contains(slot)) return;
  lru_.Remove(slot);
  evictable_bytes_[headers_.at(slot).segment] -= BlockBytes(slot);
}

std::optional<Arena::Block> ObjectStore::AllocateOrEvict(uint64_t bytes) {
  auto block = arena_.Allocate(bytes);
  if (block || !eviction_) return block;
  // Evict in LRU order, but only from segments where evicting everything evictable would
  // make enough room: a create that cannot fit anyway must not empty the cache on its way
  // to failing. (Fragmentation can still defeat a segment that has the bytes.)
  const uint64_t need = arena_.ReservedSize(bytes);
  uint32_t victim = lru_.front();
  while (!block && victim != LruList::kNil) {
    const uint32_t segment = headers_.at(victim).segment;
    const uint32_t next = lru_.next(victim);
    if (arena_.free_bytes(segment) + evictable_bytes_[segment] >= need) {
      FreeHostBlock(victim);
      // Only the victim's segment gained room.
      block = arena_.AllocateIn(segment, bytes);
    }
    victim = next;
  }
  return block;
}

uint32_t ObjectStore::AcquireSlot() {
  uint32_t slot = headers_.Acquire();
  if (slot != HeaderTable::kNoSlot || !eviction_) return slot;
  // Only evicting a whole object gives a slot back: skip host replicas that have copies.
  for (uint32_t victim = lru_.front(); victim != LruList::kNil; victim = lru_.next(victim)) {
    if (!HasOtherCopy(victim, kHost)) {
      FreeHostBlock(victim);
      return headers_.Acquire();
    }
  }
  return slot;
}

bool ObjectStore::FreeHostBlock(uint32_t slot) {
  const auto& h = headers_.at(slot);
  if (HasOtherCopy(slot, kHost)) {
    spdlog::debug("dropping the host copy of {}", ObjectId::FromWords(h.id_lo, h.id_hi).Hex());
    counters_.replicas_dropped++;
    DropHostReplica(slot);
    return false;
  }
  spdlog::debug("evicting {} ({})", ObjectId::FromWords(h.id_lo, h.id_hi).Hex(),
                ipc::FormatSize(h.data_size + h.metadata_size));
  counters_.evictions++;
  counters_.evicted_bytes += BlockBytes(slot);
  FreeObject(slot);
  return true;
}

void ObjectStore::DropHostReplica(uint32_t slot) {
  Object& o = objects_[slot];
  MakeUnevictable(slot);
  if (headers_.at(slot).flags & ipc::kFlagPinned) counters_.pinned_bytes -= BlockBytes(slot);
  arena_.Free(headers_.at(slot).segment, o.alloc);
  o.on_host = o.host_ready = false;
  counters_.objects_on_host--;
  PublishTiers(slot);
}

void ObjectStore::DropDeviceReplica(uint32_t slot, int32_t device) {
  Object& o = objects_[slot];
  device_lru_[device].Remove(slot);
  std::vector<Replica>& replicas = o.gpu->replicas;
  auto it = std::find_if(replicas.begin(), replicas.end(),
                         [device](const Replica& r) { return r.device == device; });
  pools_[device]->Free(it->chunk, it->alloc);
  replicas.erase(it);
  device_usage_[device].replicas--;
  PublishTiers(slot);
  Reconsider(slot);  // the host copy may be the only one now
}

void ObjectStore::Create(ClientId client, const CreateParams& p, CreateDone done) {
  if (p.id.IsNil())
    return done(Status::InvalidArgument("the nil object id (all zeros) is reserved"));
  if (!p.data.empty() && p.data.size() != p.data_size) {
    return done(Status::InvalidArgument("inline data of " + std::to_string(p.data.size()) +
                                        " bytes for " + Describe(p.id) + " of " +
                                        std::to_string(p.data_size) + " bytes"));
  }
  if (Status st = CheckDevice(p.device); !st.ok()) return done(st);
  if (uint32_t existing = Find(p.id); existing != HeaderTable::kNoSlot) {
    const auto state = headers_.state(existing);
    return done(Status::AlreadyExists(
        Describe(p.id) +
        (state == ipc::ObjectState::kSealed
             ? (IsDeletePending(existing) ? " was deleted but is still referenced; it cannot be "
                                            "created again until released"
                                          : " exists already")
             : " is already being created")));
  }
  if (creating_.contains(p.id)) {
    return done(Status::AlreadyExists(Describe(p.id) + " is already being created"));
  }
  if (p.device == kHost) return CreateOnHost(client, p, std::move(done));
  CreateOnDevice(client, p, std::move(done));
}

uint32_t ObjectStore::Publish(ClientId client, const CreateParams& p, uint32_t slot) {
  if (slot >= objects_.size()) objects_.resize(std::max<size_t>(slot + 1, objects_.size() * 2));
  objects_[slot] = Object{};
  objects_[slot].creator = client;
  objects_[slot].owner = clients_.at(client).uid;
  objects_[slot].want_checksum = p.checksum;
  ChargeObject(slot, CreateCost(p));
  auto& h = headers_.at(slot);
  h.id_lo = p.id.lo();
  h.id_hi = p.id.hi();
  h.data_size = p.data_size;
  h.metadata_size = p.metadata.size();
  h.flags.store(p.pin ? uint32_t{ipc::kFlagPinned} : 0u, std::memory_order_relaxed);
  h.checksum = 0;
  h.create_time_ns = h.access_time_ns = ipc::WallNanos();
  h.tiers.store(0, std::memory_order_relaxed);
  headers_.SetStateRefs(slot, ipc::ObjectState::kCreating, 0);
  index_.emplace(p.id, slot);
  if (!p.name.empty()) names_.emplace(slot, std::string(p.name));
  counters_.objects_creating++;
  if (p.device == kHost) {
    counters_.bytes_in += p.data_size + p.metadata.size();
  } else {
    device_usage_[p.device].bytes_in += p.data_size;
  }
  return slot;
}

void ObjectStore::CountBytesOut(int32_t device, const Location& location) {
  if (device == kHost) {
    counters_.bytes_out += location.data_size + location.metadata_size;
  } else {
    device_usage_[device].bytes_out += location.data_size;
  }
}

void ObjectStore::CreateOnHost(ClientId client, const CreateParams& p, CreateDone done) {
  const uint64_t total = p.data_size + p.metadata.size();
  if (p.data_size > arena_.max_object_size() || total > arena_.max_object_size()) {
    return done(Status::InvalidArgument(Describe(p.id) + " of " + ipc::FormatSize(total) +
                                        " is larger than the largest object (" +
                                        ipc::FormatSize(arena_.max_object_size()) +
                                        "); start depotd with a larger --segment-size"));
  }
  ClientState& state = clients_.at(client);
  if (Status st = CheckLimits(client, state, arena_.ReservedSize(total)); !st.ok()) return done(st);
  if (Status st = CheckMetadata(client, state, CreateCost(p)); !st.ok()) return done(st);
  const uint32_t slot = AcquireSlot();
  if (slot == HeaderTable::kNoSlot) {
    return done(
        Status::LimitExceeded("the store holds " + std::to_string(headers_.slots()) +
                              " objects, its limit; start depotd with a larger --max-objects"));
  }
  auto block = AllocateOrEvict(total);
  if (!block) {
    headers_.Release(slot);
    return done(Status::OutOfMemory(OutOfMemoryMessage(p.id, total)));
  }
  std::byte* bytes = arena_.base(block->segment) + block->offset;
  if (!p.data.empty()) std::memcpy(bytes, p.data.data(), p.data.size());
  if (!p.metadata.empty()) std::memcpy(bytes + p.data_size, p.metadata.data(), p.metadata.size());
  auto& h = headers_.at(slot);
  h.offset = block->offset;
  h.segment = block->segment;
  Publish(client, p, slot);
  objects_[slot].alloc = block->handle;
  counters_.objects_on_host++;
  h.tiers.store(ipc::kTierHost, std::memory_order_relaxed);
  if (p.pin) counters_.pinned_bytes += BlockBytes(slot);
  AddRef(client, state, slot, kHost);
  done(LocationOf(slot));
}

void ObjectStore::CreateOnDevice(ClientId client, const CreateParams& p, CreateDone done) {
  gpu::DevicePool& pool = *pools_[p.device];
  if (!p.data.empty()) {
    return done(Status::InvalidArgument(
        "inline data is for host objects; write a GPU object through its device pointer"));
  }
  if (p.checksum) {
    return done(Status::InvalidArgument("checksums are taken of host objects only; " +
                                        Describe(p.id) + " is created on " + pool.info().name));
  }
  if (!pool.CouldFit(p.data_size)) {
    return done(Status::InvalidArgument(Describe(p.id) + " of " + ipc::FormatSize(p.data_size) +
                                        " is larger than the pool of " + pool.info().name + " (" +
                                        ipc::FormatSize(pool.limit()) + ", --gpu-memory)"));
  }
  ClientState& state = clients_.at(client);
  if (Status st = CheckLimits(client, state, pool.ReservedSize(p.data_size)); !st.ok()) {
    return done(st);
  }
  if (Status st = CheckMetadata(client, state, CreateCost(p)); !st.ok()) return done(st);
  // The parameters outlive the request: room may come only after spills.
  struct Owned {
    CreateParams params;
    std::vector<std::byte> metadata;
    std::string name;
  };
  auto owned = std::make_shared<Owned>();
  owned->params = p;
  owned->metadata.assign(p.metadata.begin(), p.metadata.end());
  owned->name = std::string(p.name);
  owned->params.metadata = owned->metadata;
  owned->params.name = owned->name;
  creating_.insert(p.id);
  // While it waits for room, the daemon keeps the name and metadata for it: counted too.
  const uint64_t waiting_cost = CreateCost(p);
  CountMetadata(client, static_cast<int64_t>(waiting_cost));
  AllocateOnDevice(
      p.device, p.data_size,
      [this, client, owned, waiting_cost,
       done = std::move(done)](std::optional<gpu::DevicePool::Block> block) mutable {
        const CreateParams& p = owned->params;
        creating_.erase(p.id);
        CountMetadata(client, -static_cast<int64_t>(waiting_cost));
        gpu::DevicePool& pool = *pools_[p.device];
        auto it = clients_.find(client);
        if (it == clients_.end()) {  // gone while waiting for room
          if (block) pool.Free(block->chunk, block->handle);
          return;
        }
        if (!block) {
          return done(Status::OutOfMemory(DeviceOutOfMemoryMessage(p.device, p.id, p.data_size)));
        }
        const uint32_t slot = AcquireSlot();
        if (slot == HeaderTable::kNoSlot) {
          pool.Free(block->chunk, block->handle);
          return done(Status::LimitExceeded(
              "the store holds " + std::to_string(headers_.slots()) +
              " objects, its limit; start depotd with a larger --max-objects"));
        }
        Publish(client, p, slot);
        Object& o = objects_[slot];
        o.on_host = o.host_ready = false;
        Object::GpuCopies& copies = GpuCopiesOf(o);
        copies.metadata = std::move(owned->metadata);
        copies.replicas.push_back(Replica{p.device, block->chunk, block->handle, block->offset});
        device_usage_[p.device].replicas++;
        AddRef(client, it->second, slot, p.device);
        done(LocationOf(slot, p.device));
      });
}

std::string ObjectStore::DeviceOutOfMemoryMessage(int32_t device, const ObjectId& id,
                                                  uint64_t bytes) const {
  const gpu::DevicePool& pool = *pools_[device];
  return "cannot fit " + Describe(id) + " of " + ipc::FormatSize(bytes) + " on " +
         pool.info().name + ": its pool uses " + ipc::FormatSize(pool.used_bytes()) + " of " +
         ipc::FormatSize(pool.limit()) + " (largest free block " +
         ipc::FormatSize(pool.largest_free_block()) + "), " +
         ipc::FormatSize(device_usage_[device].held_bytes) +
         " is held by references or objects being created, and nothing more can spill to "
         "host memory; release or delete objects, or give the pool more --gpu-memory";
}

void ObjectStore::AddRef(ClientId, ClientState& state, uint32_t slot, int32_t device) {
  uint32_t& tier_refs = TierRefs(slot, device);
  if (tier_refs++ == 0) {
    if (device == kHost) {
      counters_.held_bytes += BlockBytes(slot);
    } else {
      device_usage_[device].held_bytes += TierBytes(slot, device);
    }
  }
  headers_.SetStateRefs(slot, headers_.state(slot), headers_.refs(slot) + 1);
  auto [it, inserted] = state.refs.try_emplace(RefKey(slot, device), 0);
  if (inserted) {
    state.held_bytes += TierBytes(slot, device);
    if (!HoldsOnAnotherTier(state, slot, device)) state.objects++;
  }
  it->second++;
  state.references++;
  Reconsider(slot);
}

void ObjectStore::DropRef(ClientState& state, uint32_t slot, int32_t device) {
  auto it = state.refs.find(RefKey(slot, device));
  state.references--;
  if (--it->second == 0) {
    state.held_bytes -= TierBytes(slot, device);
    state.refs.erase(it);
    if (!HoldsOnAnotherTier(state, slot, device)) state.objects--;
  }
  if (--TierRefs(slot, device) == 0) {
    if (device == kHost) {
      counters_.held_bytes -= BlockBytes(slot);
    } else {
      device_usage_[device].held_bytes -= TierBytes(slot, device);
    }
  }
  const uint64_t refs = headers_.refs(slot) - 1;
  const auto st = headers_.state(slot);
  headers_.SetStateRefs(slot, st, refs);
  if (refs == 0 && st == ipc::ObjectState::kCreating) {
    // The creator let go of an object it never sealed: abort it. An object whose seal is
    // running on the worker pool is finished by FinishSeal instead.
    if (!objects_[slot].sealing) FreeObject(slot);
    return;
  }
  if (refs == 0 && IsDeletePending(slot)) return FreeObject(slot);
  Reconsider(slot);
}

bool ObjectStore::HoldsOnAnotherTier(const ClientState& state, uint32_t slot,
                                     int32_t device) const {
  for (int32_t d = kHost; d < static_cast<int32_t>(pools_.size()); ++d) {
    if (d != device && state.refs.contains(RefKey(slot, d))) return true;
  }
  return false;
}

bool ObjectStore::HostEvictable(uint32_t slot) const {
  const Object& o = objects_[slot];
  if (headers_.state(slot) != ipc::ObjectState::kSealed || IsDeletePending(slot) || o.sealing ||
      !o.on_host || !o.host_ready || o.host_refs != 0) {
    return false;
  }
  return HasOtherCopy(slot, kHost) ||
         (headers_.refs(slot) == 0 && !(headers_.at(slot).flags & ipc::kFlagPinned));
}

void ObjectStore::Reconsider(uint32_t slot) {
  if (!HostEvictable(slot)) {
    MakeUnevictable(slot);
  } else if (!lru_.contains(slot)) {
    MakeEvictable(slot);
  }
  const bool usable = headers_.state(slot) == ipc::ObjectState::kSealed && !IsDeletePending(slot);
  for (const Replica& r : Replicas(objects_[slot])) {
    LruList& lru = device_lru_[r.device];
    if (!(usable && r.ready && !r.spilling && r.refs == 0)) {
      lru.Remove(slot);
    } else if (!lru.contains(slot)) {
      lru.PushBack(slot);
    }
  }
}

void ObjectStore::FreeObject(uint32_t slot) {
  auto& h = headers_.at(slot);
  Object& o = objects_[slot];
  const ObjectId id = ObjectId::FromWords(h.id_lo, h.id_hi);
  if (headers_.state(slot) == ipc::ObjectState::kCreating) {
    counters_.objects_creating--;
  } else {
    counters_.objects_sealed--;
  }
  MakeUnevictable(slot);
  if (o.on_host) {
    if (h.flags & ipc::kFlagPinned) counters_.pinned_bytes -= BlockBytes(slot);
    arena_.Free(h.segment, o.alloc);
    counters_.objects_on_host--;
  }
  for (const Replica& r : Replicas(o)) {
    device_lru_[r.device].Remove(slot);
    pools_[r.device]->Free(r.chunk, r.alloc);
    device_usage_[r.device].replicas--;
    ScheduleRoomWaits(r.device);
  }
  CountMetadata(o.creator, -static_cast<int64_t>(o.metadata_cost));
  o = Object{};
  index_.erase(id);
  names_.erase(slot);
  headers_.Release(slot);
}

void ObjectStore::Seal(ClientId client, const ObjectId& id, std::function<void(Status)> done) {
  const uint32_t slot = Find(id);
  if (slot == HeaderTable::kNoSlot) return done(Status::NotFound(Describe(id) + " does not exist"));
  if (headers_.state(slot) == ipc::ObjectState::kSealed || objects_[slot].sealing) {
    return done(Status::AlreadySealed(Describe(id) + " is already sealed"));
  }
  if (objects_[slot].creator != client) {
    return done(Status::NotHeld(Describe(id) + " is being created by another client"));
  }
  const auto& h = headers_.at(slot);
  if (!objects_[slot].want_checksum) {
    FinishSeal(slot, std::nullopt);
    return done(Status::OK());
  }
  const std::byte* bytes = arena_.base(h.segment) + h.offset;
  const uint64_t size = h.data_size + h.metadata_size;
  if (size < kInlineChecksumBytes) {
    FinishSeal(slot, XXH3_64bits(bytes, size));
    return done(Status::OK());
  }
  // The creator keeps its reference while the worker reads, so the bytes stay put; if it
  // disconnects meanwhile, FinishSeal sees no references and makes the object evictable.
  objects_[slot].sealing = true;
  boost::asio::post(workers_, [this, slot, bytes, size, done = std::move(done)]() mutable {
    const uint64_t sum = XXH3_64bits(bytes, size);
    boost::asio::post(loop_, [this, slot, sum, done = std::move(done)] {
      FinishSeal(slot, sum);
      done(Status::OK());
    });
  });
}

void ObjectStore::FinishSeal(uint32_t slot, std::optional<uint64_t> checksum) {
  auto& h = headers_.at(slot);
  Object& o = objects_[slot];
  o.sealing = false;
  h.checksum = checksum.value_or(0);
  if (checksum) h.flags |= ipc::kFlagHasChecksum;
  // An object made on a GPU has its one replica there; it is complete now.
  for (Replica& r : Replicas(o)) r.ready = true;
  PublishTiers(slot);
  headers_.SetStateRefs(slot, ipc::ObjectState::kSealed, headers_.refs(slot));
  counters_.objects_creating--;
  counters_.objects_sealed++;
  Reconsider(slot);
  CompleteWaiters(slot);
}

Status ObjectStore::Abort(ClientId client, const ObjectId& id) {
  const uint32_t slot = Find(id);
  if (slot == HeaderTable::kNoSlot) return Status::NotFound(Describe(id) + " does not exist");
  if (headers_.state(slot) == ipc::ObjectState::kSealed || objects_[slot].sealing) {
    return Status::AlreadySealed(Describe(id) + " is sealed; delete it instead");
  }
  if (objects_[slot].creator != client) {
    return Status::NotHeld(Describe(id) + " is being created by another client");
  }
  // Only the creator can hold an unsealed object, on the tier it creates it on; dropping its
  // references frees it.
  const int32_t tier = objects_[slot].on_host ? kHost : Replicas(objects_[slot]).front().device;
  ClientState& state = clients_.at(client);
  const uint32_t count = state.refs.at(RefKey(slot, tier));
  for (uint32_t i = 0; i < count; ++i) DropRef(state, slot, tier);
  return Status::OK();
}

Status ObjectStore::Get(ClientId client, std::vector<ObjectId> ids, int32_t device,
                        int64_t timeout_ms, GetDone done) {
  DEPOT_RETURN_NOT_OK(CheckDevice(device));
  ClientState& state = clients_.at(client);
  std::vector<GetResult> results(ids.size());
  std::vector<Wait> waits(ids.size(), Wait::kNone);
  size_t seal_waits = 0, copy_waits = 0;
  const uint64_t now = ipc::WallNanos();
  for (size_t i = 0; i < ids.size(); ++i) {
    const uint32_t slot = Find(ids[i]);
    const bool sealed = slot != HeaderTable::kNoSlot &&
                        headers_.state(slot) == ipc::ObjectState::kSealed && !IsDeletePending(slot);
    if (sealed && IsReady(slot, device)) {
      headers_.at(slot).access_time_ns = now;  // published by AddRef
      AddRef(client, state, slot, device);
      results[i].location = LocationOf(slot, device);
      counters_.get_hits++;
      CountBytesOut(device, results[i].location);
    } else if (sealed) {
      waits[i] = Wait::kCopy;
      ++copy_waits;
      counters_.get_hits++;
    } else {
      results[i].code = StatusCode::kNotFound;
      if (timeout_ms != 0) {
        waits[i] = Wait::kSeal;
        ++seal_waits;
      }
    }
  }
  if (seal_waits + copy_waits == 0) {
    done(std::move(results));
    return Status::OK();
  }
  const uint64_t wait_cost = kWaitingIdMetadataBytes * ids.size();
  Status refused =
      limits_.max_pending_gets != 0 && state.pending_gets.size() >= limits_.max_pending_gets
          ? Status::LimitExceeded("client " + std::to_string(client) + " already has " +
                                  std::to_string(state.pending_gets.size()) +
                                  " gets waiting, its limit (--client-max-pending)")
          : CheckMetadata(client, state, wait_cost);
  if (!refused.ok()) {
    // Give back what this call granted: the request fails as a whole.
    for (size_t i = 0; i < ids.size(); ++i) {
      if (results[i].code == StatusCode::kOk && waits[i] == Wait::kNone) {
        DropRef(state, results[i].location.slot, device);
      }
    }
    return refused;
  }
  const uint64_t pending_id = next_pending_++;
  PendingGet& get = pending_[pending_id];
  get.metadata_cost = wait_cost;
  CountMetadata(client, static_cast<int64_t>(wait_cost));
  get.client = client;
  get.device = device;
  get.missing = seal_waits + copy_waits;
  get.done = std::move(done);
  get.timer = std::make_unique<boost::asio::steady_timer>(loop_);
  std::vector<uint32_t> copies;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (waits[i] == Wait::kSeal) waiting_[ids[i]].push_back(pending_id);
    if (waits[i] == Wait::kCopy) copies.push_back(Find(ids[i]));
  }
  counters_.get_waits += seal_waits;
  get.ids = std::move(ids);
  get.results = std::move(results);
  get.waits.swap(waits);
  state.pending_gets.push_back(pending_id);
  if (timeout_ms > 0 && seal_waits > 0) {
    get.timer->expires_after(std::chrono::milliseconds(timeout_ms));
    get.timer->async_wait([this, pending_id](const boost::system::error_code& ec) {
      if (!ec) ExpireGet(pending_id);
    });
  }
  // Last: a copy that fails at once answers the get, which may then be gone.
  for (uint32_t slot : copies) StartTransfer(slot, device, /*spill=*/false, pending_id);
  return Status::OK();
}

void ObjectStore::ForgetWaits(uint64_t pending_id, const PendingGet& get) {
  for (size_t i = 0; i < get.ids.size(); ++i) {
    if (get.waits[i] != Wait::kSeal) continue;
    auto w = waiting_.find(get.ids[i]);
    if (w == waiting_.end()) continue;
    std::erase(w->second, pending_id);
    if (w->second.empty()) waiting_.erase(w);
  }
}

void ObjectStore::ExpireGet(uint64_t pending_id) {
  auto it = pending_.find(pending_id);
  if (it == pending_.end()) return;
  PendingGet& get = it->second;
  ForgetWaits(pending_id, get);
  // Ids still waiting for a seal time out; copies under way are waited for (they end).
  for (size_t i = 0; i < get.ids.size(); ++i) {
    if (get.waits[i] != Wait::kSeal) continue;
    get.waits[i] = Wait::kNone;
    get.results[i].code = StatusCode::kTimeout;
    counters_.get_timeouts++;
    --get.missing;
  }
  FinishGetIfDone(pending_id);
}

void ObjectStore::FinishGetIfDone(uint64_t pending_id) {
  auto it = pending_.find(pending_id);
  if (it == pending_.end() || it->second.missing != 0) return;
  PendingGet finished = std::move(it->second);
  pending_.erase(it);
  UncountWait(finished);
  finished.timer->cancel();
  std::erase(clients_.at(finished.client).pending_gets, pending_id);
  finished.done(std::move(finished.results));
}

void ObjectStore::CompleteWaiters(uint32_t slot) {
  const auto& h = headers_.at(slot);
  const ObjectId id = ObjectId::FromWords(h.id_lo, h.id_hi);
  auto w = waiting_.find(id);
  if (w == waiting_.end()) return;
  std::vector<uint64_t> waiters = std::move(w->second);
  waiting_.erase(w);
  std::vector<std::pair<int32_t, uint64_t>> copies;  // (tier, pending get) to start
  for (uint64_t pending_id : waiters) {
    auto it = pending_.find(pending_id);
    if (it == pending_.end()) continue;
    PendingGet& get = it->second;
    ClientState& state = clients_.at(get.client);
    for (size_t i = 0; i < get.ids.size(); ++i) {
      if (get.ids[i] != id || get.waits[i] != Wait::kSeal) continue;
      if (!IsReady(slot, get.device)) {
        get.waits[i] = Wait::kCopy;
        copies.emplace_back(get.device, pending_id);
        continue;
      }
      AddRef(get.client, state, slot, get.device);
      get.results[i] = GetResult{StatusCode::kOk, LocationOf(slot, get.device)};
      CountBytesOut(get.device, get.results[i].location);
      get.waits[i] = Wait::kNone;
      --get.missing;
    }
    FinishGetIfDone(pending_id);
  }
  for (auto [device, pending_id] : copies) {
    StartTransfer(slot, device, /*spill=*/false, pending_id);
  }
}

void ObjectStore::Answer(uint64_t pending_id, uint32_t slot, const ObjectId& id,
                         StatusCode failure) {
  auto it = pending_.find(pending_id);
  if (it == pending_.end()) return;
  PendingGet& get = it->second;
  const bool usable = failure == StatusCode::kOk && Find(id) == slot &&
                      headers_.state(slot) == ipc::ObjectState::kSealed && !IsDeletePending(slot) &&
                      IsReady(slot, get.device);
  for (size_t i = 0; i < get.ids.size(); ++i) {
    if (get.ids[i] != id || get.waits[i] != Wait::kCopy) continue;
    if (usable) {
      AddRef(get.client, clients_.at(get.client), slot, get.device);
      get.results[i] = GetResult{StatusCode::kOk, LocationOf(slot, get.device)};
      CountBytesOut(get.device, get.results[i].location);
    } else {
      get.results[i].code = failure == StatusCode::kOk ? StatusCode::kNotFound : failure;
    }
    get.waits[i] = Wait::kNone;
    --get.missing;
  }
  FinishGetIfDone(pending_id);
}

void ObjectStore::StartTransfer(uint32_t slot, int32_t device, bool spill, uint64_t pending_id) {
  const auto key = std::make_pair(slot, device);
  if (auto it = transfers_.find(key); it != transfers_.end()) {
    if (pending_id != 0) it->second.waiters.push_back(pending_id);
    return;
  }
  // The source: for a spill, the GPU it leaves; else another GPU's copy (a peer copy is the
  // fastest way onto a GPU), else the host copy.
  Object& o = objects_[slot];
  constexpr int32_t kNoSource = kHost - 1;
  int32_t source = kNoSource;
  for (const Replica& r : Replicas(o)) {
    if (spill ? r.spilling : (r.ready && r.device != device)) source = r.device;
  }
  if (source == kNoSource && !spill && device != kHost && IsReady(slot, kHost)) source = kHost;
  auto& h = headers_.at(slot);
  const ObjectId id = ObjectId::FromWords(h.id_lo, h.id_hi);
  if (source == kNoSource || !IsReady(slot, source)) {
    spdlog::error("{} has no copy to make a replica from", Describe(id));
    if (pending_id != 0) Answer(pending_id, slot, id, StatusCode::kInternal);
    return;
  }
  Transfer& t = transfers_[key];
  t.source = source;
  t.spill = spill;
  if (pending_id != 0) t.waiters.push_back(pending_id);
  // The store holds the source for the copy: neither it nor the object goes meanwhile.
  AddRef(kDaemonClient, clients_.at(kDaemonClient), slot, source);
  if (h.metadata_size != 0 && source == kHost && GpuCopiesOf(o).metadata.empty()) {
    const std::byte* meta = arena_.base(h.segment) + h.offset + h.data_size;
    o.gpu->metadata.assign(meta, meta + h.metadata_size);
    ChargeObject(slot, h.metadata_size);
  }
  if (device == kHost) {
    auto block = AllocateOrEvict(h.data_size + h.metadata_size);
    if (!block) {
      return FinishTransfer(
          slot, kHost, Status::OutOfMemory(OutOfMemoryMessage(id, h.data_size + h.metadata_size)));
    }
    o.alloc = block->handle;
    o.on_host = true;
    o.host_ready = false;
    counters_.objects_on_host++;
    h.segment = block->segment;
    h.offset = block->offset;
    if (h.flags & ipc::kFlagPinned) counters_.pinned_bytes += BlockBytes(slot);
    return RunCopy(slot, kHost);
  }
  AllocateOnDevice(
      device, h.data_size, [this, slot, device, id](std::optional<gpu::DevicePool::Block> block) {
        if (!block) {
          return FinishTransfer(slot, device,
                                Status::OutOfMemory(DeviceOutOfMemoryMessage(
                                    device, id, headers_.at(slot).data_size)));
        }
        GpuCopiesOf(objects_[slot])
            .replicas.push_back(Replica{device, block->chunk, block->handle, block->offset});
        device_usage_[device].replicas++;
        RunCopy(slot, device);
      });
}

void ObjectStore::RunCopy(uint32_t slot, int32_t device) {
  const auto& h = headers_.at(slot);
  const int32_t source = transfers_.at({slot, device}).source;
  gpu::DeviceBackend& backend = pools_.front()->backend();
  const uint64_t bytes = h.data_size;
  // Addresses stay valid until FinishTransfer: the store holds the source, and the
  // destination is no eviction candidate before it is ready.
  auto address = [&](int32_t tier) -> uint64_t {
    if (tier == kHost) return reinterpret_cast<uint64_t>(arena_.base(h.segment) + h.offset);
    const Replica* r = FindReplica(slot, tier);
    return pools_[tier]->address(r->chunk, r->offset);
  };
  const uint64_t from = address(source), to = address(device);
  boost::asio::post(workers_, [this, &backend, slot, device, source, from, to, bytes] {
    Status st;
    if (bytes == 0) {
      st = Status::OK();
    } else if (source == kHost) {
      st = backend.CopyFromHost(device, reinterpret_cast<const void*>(from), to, bytes);
    } else if (device == kHost) {
      st = backend.CopyToHost(source, from, reinterpret_cast<void*>(to), bytes);
    } else {
      st = backend.CopyBetweenDevices(source, from, device, to, bytes);
    }
    boost::asio::post(
        loop_, [this, slot, device, st = std::move(st)] { FinishTransfer(slot, device, st); });
  });
}

void ObjectStore::FinishTransfer(uint32_t slot, int32_t device, Status status) {
  Transfer t = std::move(transfers_.extract({slot, device}).mapped());
  auto& h = headers_.at(slot);
  Object& o = objects_[slot];
  const ObjectId id = ObjectId::FromWords(h.id_lo, h.id_hi);
  const uint32_t generation = h.generation;
  if (status.ok()) {
    if (device == kHost) {
      if (o.gpu && !o.gpu->metadata.empty()) {
        std::memcpy(arena_.base(h.segment) + h.offset + h.data_size, o.gpu->metadata.data(),
                    o.gpu->metadata.size());
      }
      o.host_ready = true;
    } else {
      FindReplica(slot, device)->ready = true;
    }
    PublishTiers(slot);
    if (t.spill) {
      counters_.spills++;
      counters_.spilled_bytes += h.data_size;
    } else {
      counters_.replicas_made++;
    }
  } else {
    if (uint64_t held_back = 0; copy_failure_log_.Allow(&held_back)) {
      spdlog::warn("cannot copy {} to {}: {}{}", Describe(id), TierName(device), status.message(),
                   held_back == 0 ? "" : fmt::format(" ({} more failed copies before)", held_back));
    }
    if (device == kHost && o.on_host && !o.host_ready) {
      if (h.flags & ipc::kFlagPinned) counters_.pinned_bytes -= BlockBytes(slot);
      arena_.Free(h.segment, o.alloc);
      o.on_host = false;
      counters_.objects_on_host--;
    } else if (Replica* r = FindReplica(slot, device); r != nullptr && !r->ready) {
      pools_[device]->Free(r->chunk, r->alloc);
      std::erase_if(o.gpu->replicas, [device](const Replica& x) { return x.device == device; });
      device_usage_[device].replicas--;
    }
  }
  // The waiting gets take their references before the store lets go of the source.
  for (uint64_t pending_id : t.waiters) Answer(pending_id, slot, id, status.code());
  if (t.spill) {
    if (Replica* r = FindReplica(slot, t.source)) r->spilling = false;
  }
  DropRef(clients_.at(kDaemonClient), slot, t.source);
  const bool alive = headers_.state(slot) != ipc::ObjectState::kFree && h.generation == generation;
  if (alive && t.spill && status.ok()) {
    // Spilled: the GPU copy goes unless someone took a reference to it meanwhile.
    if (const Replica* r = FindReplica(slot, t.source); r != nullptr && r->refs == 0) {
      DropDeviceReplica(slot, t.source);
    }
  }
  if (t.spill) {
    spills_in_flight_[t.source]--;
    ScheduleRoomWaits(t.source);
  }
}

std::string ObjectStore::TierName(int32_t device) const {
  return device == kHost ? std::string("host memory") : pools_[device]->info().name;
}

std::optional<gpu::DevicePool::Block> ObjectStore::AllocateDroppingReplicas(int32_t device,
                                                                            uint64_t bytes) {
  gpu::DevicePool& pool = *pools_[device];
  auto block = pool.Allocate(bytes);
  LruList& lru = device_lru_[device];
  for (uint32_t victim = lru.front(); !block && victim != LruList::kNil;) {
    const uint32_t next = lru.next(victim);
    if (HasOtherCopy(victim, device)) {
      const uint32_t chunk = FindReplica(victim, device)->chunk;
      DropDeviceReplica(victim, device);
      counters_.replicas_dropped++;
      block = pool.AllocateIn(chunk, bytes);
    }
    victim = next;
  }
  return block;
}

bool ObjectStore::StartSpills(int32_t device, uint64_t bytes) {
  const uint64_t need = gpu::DevicePool::ReservedSize(bytes);
  uint64_t started = 0;
  LruList& lru = device_lru_[device];
  for (uint32_t victim = lru.front(); victim != LruList::kNil && started < need;) {
    const uint32_t next = lru.next(victim);
    if (!HasOtherCopy(victim, device) && !transfers_.contains({victim, kHost})) {
      FindReplica(victim, device)->spilling = true;
      spills_in_flight_[device]++;
      Reconsider(victim);  // out of the LRU list while it spills
      started += TierBytes(victim, device);
      StartTransfer(victim, kHost, /*spill=*/true, 0);
    }
    victim = next;
  }
  return spills_in_flight_[device] > 0;
}

void ObjectStore::AllocateOnDevice(int32_t device, uint64_t bytes, RoomDone then) {
  if (auto block = AllocateDroppingReplicas(device, bytes)) return then(block);
  if (StartSpills(device, bytes)) {
    room_waits_[device].push_back(RoomWait{bytes, std::move(then)});
    return;
  }
  then(std::nullopt);
}

void ObjectStore::ScheduleRoomWaits(int32_t device) {
  if (room_waits_[device].empty()) return;
  // Posted, not called: the caller may be in the middle of changing the tables.
  boost::asio::post(loop_, [this, device] { ServeRoomWaits(device); });
}

void ObjectStore::ServeRoomWaits(int32_t device) {
  auto& waits = room_waits_[device];
  while (!waits.empty()) {
    std::optional<gpu::DevicePool::Block> block =
        AllocateDroppingReplicas(device, waits.front().bytes);
    if (!block && (spills_in_flight_[device] > 0 || StartSpills(device, waits.front().bytes))) {
      return;  // more room is on its way
    }
    RoomWait wait = std::move(waits.front());
    waits.erase(waits.begin());
    wait.then(block);
  }
}

Status ObjectStore::Release(ClientId client, std::span<const ObjectId> ids, int32_t device) {
  // Checked first: RefKey keeps 8 bits of the tier, so an unchecked one could name another.
  DEPOT_RETURN_NOT_OK(CheckDevice(device));
  ClientState& state = clients_.at(client);
  Status first_error;
  for (const ObjectId& id : ids) {
    const uint32_t slot = Find(id);
    if (slot == HeaderTable::kNoSlot || !state.refs.contains(RefKey(slot, device))) {
      if (first_error.ok()) {
        first_error = Status::NotHeld(
            Describe(id) +
            (slot == HeaderTable::kNoSlot
                 ? " does not exist"
                 : " is not held by this client" +
                       (device == kHost ? std::string() : " on " + TierName(device))));
      }
      continue;
    }
    DropRef(state, slot, device);
  }
  return first_error;
}

std::vector<StatusCode> ObjectStore::Delete(std::span<const ObjectId> ids) {
  std::vector<StatusCode> out;
  out.reserve(ids.size());
  for (const ObjectId& id : ids) {
    const uint32_t slot = Find(id);
    if (slot == HeaderTable::kNoSlot || IsDeletePending(slot)) {
      out.push_back(StatusCode::kNotFound);
    } else if (headers_.state(slot) != ipc::ObjectState::kSealed) {
      out.push_back(StatusCode::kNotSealed);
    } else {
      out.push_back(StatusCode::kOk);
      if (headers_.refs(slot) == 0) {
        FreeObject(slot);
      } else {
        headers_.at(slot).flags |= ipc::kFlagDeletePending;
        headers_.Publish(slot);
        Reconsider(slot);  // no replica of it is a candidate any more
      }
    }
  }
  return out;
}

bool ObjectStore::Contains(const ObjectId& id) const {
  const uint32_t slot = Find(id);
  return slot != HeaderTable::kNoSlot && headers_.state(slot) == ipc::ObjectState::kSealed &&
         !IsDeletePending(slot);
}

bool ObjectStore::IsDeletePending(uint32_t slot) const {
  return (headers_.at(slot).flags & ipc::kFlagDeletePending) != 0;
}

ObjectStore::Page ObjectStore::List(uint32_t start, uint32_t limit, uint32_t max_scan,
                                    Filter filter) const {
  Page page;
  uint32_t slot = start;
  const uint32_t end = headers_.high_water();
  const uint32_t stop = end - std::min(start, end) > max_scan ? start + max_scan : end;
  for (; slot < stop && page.slots.size() < limit; ++slot) {
    const ipc::ObjectState state = headers_.state(slot);
    if (state == ipc::ObjectState::kFree) continue;
    if (filter == Filter::kVerifiable &&
        (state != ipc::ObjectState::kSealed || IsDeletePending(slot) ||
         !(headers_.at(slot).flags & ipc::kFlagHasChecksum))) {
      continue;
    }
    page.slots.push_back(slot);
  }
  page.next = slot;
  page.done = slot >= end;
  return page;
}

ObjectId ObjectStore::IdAt(uint32_t slot) const {
  const ipc::ObjectHeader& h = headers_.at(slot);
  return ObjectId::FromWords(h.id_lo, h.id_hi);
}

bool ObjectStore::Holds(uint32_t slot, const ObjectId& id) const {
  return slot < headers_.high_water() && headers_.state(slot) != ipc::ObjectState::kFree &&
         IdAt(slot) == id;
}

bool LargestScan::Larger(const Entry& a, const Entry& b) {
  if (a.data_size != b.data_size) return a.data_size > b.data_size;
  if (a.create_time_ns != b.create_time_ns) return a.create_time_ns < b.create_time_ns;
  return a.slot < b.slot;
}

bool LargestScan::Step(const ObjectStore& store, uint32_t max_slots) {
  // A min-heap of the n largest seen so far: O(objects log n), n entries of memory.
  const HeaderTable& headers = store.headers();
  const uint32_t end = headers.high_water();
  const uint32_t stop = end - std::min(next_, end) > max_slots ? next_ + max_slots : end;
  for (; next_ < stop; ++next_) {
    if (n_ == 0 || headers.state(next_) == ipc::ObjectState::kFree) continue;
    const ipc::ObjectHeader& h = headers.at(next_);
    Entry entry{h.data_size, h.create_time_ns, next_, ObjectId::FromWords(h.id_lo, h.id_hi)};
    if (heap_.size() < n_) {
      heap_.push_back(entry);
      std::push_heap(heap_.begin(), heap_.end(), Larger);
    } else if (Larger(entry, heap_.front())) {
      std::pop_heap(heap_.begin(), heap_.end(), Larger);
      heap_.back() = entry;
      std::push_heap(heap_.begin(), heap_.end(), Larger);
    }
  }
  return next_ >= end;
}

std::vector<std::pair<uint32_t, ObjectId>> LargestScan::Finish(const ObjectStore& store) {
  std::sort_heap(heap_.begin(), heap_.end(), Larger);
  std::vector<std::pair<uint32_t, ObjectId>> found;
  found.reserve(heap_.size());
  for (const Entry& e : heap_) {
    if (store.Holds(e.slot, e.id)) found.emplace_back(e.slot, e.id);
  }
  heap_.clear();
  return found;
}

std::string_view ObjectStore::NameOf(uint32_t slot) const {
  auto it = names_.find(slot);
  return it == names_.end() ? std::string_view() : std::string_view(it->second);
}

ClientUsage ObjectStore::UsageOf(ClientId client) const {
  ClientUsage usage;
  auto it = clients_.find(client);
  if (it == clients_.end()) return usage;
  usage.objects = it->second.objects;
  usage.references = it->second.references;
  usage.bytes = it->second.held_bytes;
  return usage;
}

std::vector<HolderInfo> ObjectStore::HoldersOf(uint32_t slot) const {
  std::vector<HolderInfo> holders;
  for (const auto& [client, state] : clients_) {
    HolderInfo holder;
    holder.client = client;
    for (int32_t device = kHost; device < static_cast<int32_t>(pools_.size()); ++device) {
      if (auto it = state.refs.find(RefKey(slot, device)); it != state.refs.end()) {
        holder.references += it->second;
        holder.tiers.emplace_back(device, it->second);
      }
    }
    if (holder.references != 0) holders.push_back(std::move(holder));
  }
  std::sort(holders.begin(), holders.end(),
            [](const HolderInfo& a, const HolderInfo& b) { return a.client < b.client; });
  return holders;
}

std::vector<ReplicaInfo> ObjectStore::ReplicasOf(uint32_t slot) const {
  std::vector<ReplicaInfo> replicas;
  const Object& o = objects_[slot];
  const auto& h = headers_.at(slot);
  if (o.on_host) replicas.push_back({kHost, h.segment, h.offset, o.host_refs, o.host_ready});
  for (const Replica& r : Replicas(o)) {
    replicas.push_back({r.device, r.chunk, r.offset, r.refs, r.ready});
  }
  std::sort(replicas.begin(), replicas.end(),
            [](const ReplicaInfo& a, const ReplicaInfo& b) { return a.device < b.device; });
  return replicas;
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
  ClientState& store_refs = clients_.at(kDaemonClient);
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
    const uint32_t slot = Find(ids[i]);
    if (slot == HeaderTable::kNoSlot || IsDeletePending(slot)) {
      outcome.state = VerifyState::kNotFound;
      continue;
    }
    const auto& h = headers_.at(slot);
    if (headers_.state(slot) != ipc::ObjectState::kSealed) {
      outcome.state = VerifyState::kNotSealed;
    } else if (!(h.flags & ipc::kFlagHasChecksum)) {
      outcome.state = VerifyState::kNoChecksum;
    } else if (!IsReady(slot, kHost)) {
      outcome.state = VerifyState::kNotOnHost;
    } else {
      outcome.expected = h.checksum;
      AddRef(kDaemonClient, store_refs, slot);
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
    boost::asio::post(workers_, [this, run, job = std::move(job)]() mutable {
      std::vector<uint64_t> sums;
      sums.reserve(job.size());
      for (const Piece& piece : job) sums.push_back(XXH3_64bits(piece.bytes, piece.size));
      boost::asio::post(loop_,
                        [this, run = std::move(run), job = std::move(job), sums = std::move(sums)] {
                          for (size_t k = 0; k < job.size(); ++k)
                            run->outcomes[job[k].index].actual = sums[k];
                          if (--run->jobs_left == 0) FinishVerify(run);
                        });
    });
  }
}

void ObjectStore::FinishVerify(const std::shared_ptr<VerifyRun>& run) {
  ClientState& store_refs = clients_.at(kDaemonClient);
  for (size_t i = 0; i < run->outcomes.size(); ++i) {
    if (run->held[i] == HeaderTable::kNoSlot) continue;
    VerifyOutcome& outcome = run->outcomes[i];
    outcome.state = outcome.actual == outcome.expected ? VerifyState::kOk : VerifyState::kMismatch;
    DropRef(store_refs, run->held[i]);
  }
  run->done(std::move(run->outcomes));
}

EvictOutcome ObjectStore::EvictUnreferenced(uint64_t bytes, bool all) {
  EvictOutcome outcome;
  while (!lru_.empty() && (all || outcome.bytes < bytes)) {
    const uint32_t slot = lru_.front();
    outcome.bytes += BlockBytes(slot);
    if (FreeHostBlock(slot)) outcome.objects++;
  }
  return outcome;
}

}  // namespace depot::store
