#include "store/tiers.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <cstring>

#include "depot/ipc/units.h"

namespace depot::store {

namespace {
std::string Mention(const ObjectId& id) { return "object " + id.Hex(); }

std::vector<TierPool*> TierPools(Arena& arena, std::span<gpu::DevicePool* const> gpus) {
  std::vector<TierPool*> pools{&arena};
  pools.insert(pools.end(), gpus.begin(), gpus.end());
  return pools;
}
}  // namespace

Tiers::Tiers(ObjectTable& table, EvictionPolicy& policy, Executor& executor, Arena& arena,
             std::span<gpu::DevicePool* const> gpus, bool eviction, Owner& owner)
    : table_(table),
      policy_(policy),
      executor_(executor),
      arena_(arena),
      gpus_(gpus.begin(), gpus.end()),
      pools_(TierPools(arena, gpus)),
      eviction_(eviction),
      owner_(owner),
      usage_(pools_.size()),
      room_waits_(pools_.size()),
      spills_in_flight_(pools_.size(), 0) {}

std::string Tiers::OutOfMemoryMessage(int32_t tier, const ObjectId& id, uint64_t bytes) const {
  const TierPool& p = pool(tier);
  const std::string what = "cannot fit " + Mention(id) + " of " + ipc::FormatSize(bytes);
  const std::string held = ipc::FormatSize(usage_[Index(tier)].held_bytes) +
                           " is held by references or objects being created";
  if (tier == kHost) {
    return what + ": " + ipc::FormatSize(p.capacity() - p.used_bytes()) + " of " +
           ipc::FormatSize(p.capacity()) + " is free (largest free block " +
           ipc::FormatSize(p.largest_free_block()) + "), " + held + ", " +
           ipc::FormatSize(counters_.pinned_bytes) + " is pinned" +
           (eviction_ ? "" : ", and eviction is off (--no-evict)") +
           "; release or delete objects, or start depotd with more --memory";
  }
  return what + " on " + p.name() + ": its pool uses " + ipc::FormatSize(p.used_bytes()) + " of " +
         ipc::FormatSize(p.capacity()) + " (largest free block " +
         ipc::FormatSize(p.largest_free_block()) + "), " + held +
         ", and nothing more can spill to host memory; release or delete objects, or give the "
         "pool more --gpu-memory";
}

Replica& Tiers::PlaceReplica(uint32_t slot, int32_t tier, const TierPool::Block& block) {
  usage_[Index(tier)].replicas++;
  if (tier == kHost && table_.IsPinned(slot)) counters_.pinned_bytes += ReplicaBytes(slot, tier);
  return table_.AddReplica(slot, tier, block);
}

void Tiers::SetLeased(uint32_t slot, bool leased) {
  Object& o = table_.at(slot);
  if (o.leased == leased) return;
  o.leased = leased;
  const Replica* host = table_.FindReplica(slot, kHost);
  if (host != nullptr && host->refs == 0) {
    const uint64_t bytes = ReplicaBytes(slot, kHost);
    usage_[Index(kHost)].held_bytes += leased ? bytes : -bytes;
  }
  policy_.Reconsider(slot);
}

void Tiers::FreeReplica(uint32_t slot, int32_t tier) {
  const Replica& r = *table_.FindReplica(slot, tier);
  policy_.Withdraw(slot, tier);
  if (tier == kHost && table_.IsPinned(slot)) counters_.pinned_bytes -= ReplicaBytes(slot, tier);
  pool(tier).Free(r.region, r.handle);
  table_.at(slot).replicas.Remove(tier);
  usage_[Index(tier)].replicas--;
  ScheduleRoomWaits(tier);
}

void Tiers::DropReplica(uint32_t slot, int32_t tier) {
  FreeReplica(slot, tier);
  table_.PublishTiers(slot);
  policy_.Reconsider(slot);  // the copy left may be the only one now
}

std::optional<TierPool::Block> Tiers::AllocateOrEvict(uint64_t bytes) {
  auto block = arena_.Allocate(bytes);
  if (block || !eviction_) return block;
  if (arena_.BlockSize(bytes) > arena_.segment_size()) return EvictSegmentsFor(bytes);
  // Evict in LRU order, but only from segments where evicting everything evictable would
  // make enough room. (Fragmentation can still defeat a segment that has the bytes.)
  const LruList& candidates = policy_.candidates(kHost);
  for (uint32_t victim = candidates.front(); !block && victim != LruList::kNil;) {
    const uint32_t next = candidates.next(victim);
    if (policy_.WorthFreeing(victim, kHost, bytes)) {
      const uint32_t segment = table_.FindReplica(victim, kHost)->region;
      FreeHostBlock(victim);
      // Only the victim's segment gained room; an object's own segment is gone, and its
      // capacity is free.
      block =
          Arena::IsDedicated(segment) ? arena_.Allocate(bytes) : arena_.AllocateIn(segment, bytes);
    }
    victim = next;
  }
  return block;
}

std::optional<TierPool::Block> Tiers::EvictSegmentsFor(uint64_t bytes) {
  // An object larger than a shared segment needs capacity, not room in a segment: segments
  // that eviction can empty whole (dedicated ones, and shared ones that are then retired).
  // First whether that could ever be enough, so that nothing is evicted for a create that
  // fails anyway.
  const auto emptiable = [&](uint32_t segment) {
    return arena_.free_bytes(segment) + policy_.candidate_bytes(kHost, segment) >=
           arena_.segment_bytes(segment);
  };
  uint64_t could = arena_.capacity() - arena_.mapped_bytes();
  for (const uint32_t segment : arena_.segments_in_use()) {
    if (emptiable(segment)) could += arena_.segment_bytes(segment);
  }
  if (could < arena_.BlockSize(bytes)) return std::nullopt;
  // Then one segment at a time, the least recently used candidate's first, all of it.
  const LruList& candidates = policy_.candidates(kHost);
  std::optional<TierPool::Block> block;
  while (!block) {
    uint32_t target = 0;
    bool found = false;
    for (uint32_t victim = candidates.front(); !found && victim != LruList::kNil;
         victim = candidates.next(victim)) {
      target = table_.FindReplica(victim, kHost)->region;
      found = emptiable(target);
    }
    if (!found) break;
    bool evicted = false;
    for (uint32_t victim = candidates.front(); victim != LruList::kNil;) {
      const uint32_t next = candidates.next(victim);
      if (table_.FindReplica(victim, kHost)->region == target &&
          FreeHostBlock(victim) != Freed::kNothing) {
        evicted = true;
      }
      victim = next;
    }
    if (!evicted) break;
    block = arena_.Allocate(bytes);
  }
  return block;
}

Tiers::Freed Tiers::FreeHostBlock(uint32_t slot) {
  const ObjectId id = table_.IdAt(slot);
  if (!table_.IsFailed(slot) && !owner_.Reclaim(slot)) {
    spdlog::debug("not freeing {}: a client's lease holds it", id.Hex());
    return Freed::kNothing;
  }
  if (table_.HasOtherCopy(slot, kHost)) {
    spdlog::debug("dropping the host copy of {}", id.Hex());
    counters_.replicas_dropped++;
    DropReplica(slot, kHost);
    return Freed::kReplica;
  }
  spdlog::debug("evicting {} ({})", id.Hex(), ipc::FormatSize(table_.BytesOn(slot, kHost)));
  counters_.evictions++;
  counters_.evicted_bytes += ReplicaBytes(slot, kHost);
  owner_.Evict(slot);
  return Freed::kObject;
}

void Tiers::StartTransfer(uint32_t slot, int32_t tier, bool spill, WaitingGets::Id waiter) {
  const auto key = std::make_pair(slot, tier);
  if (auto it = transfers_.find(key); it != transfers_.end()) {
    if (waiter != 0) it->second.waiters.push_back(waiter);
    return;
  }
  // The source: for a spill, the copy that leaves; else a GPU's copy if there is one (a peer
  // copy is the fastest way onto a GPU), else the host's.
  constexpr int32_t kNoSource = kHost - 1;
  int32_t source = kNoSource;
  const ReplicaSet& replicas = table_.at(slot).replicas;
  for (size_t i = 0; i < replicas.size(); ++i) {
    const Replica& r = replicas[i];
    const bool usable = spill ? r.spilling : (r.ready && r.tier != tier);
    if (usable && (source == kNoSource || source == kHost)) source = r.tier;
  }
  const ObjectId id = table_.IdAt(slot);
  if (source == kNoSource) {
    spdlog::error("{} has no copy to make a replica from", Mention(id));
    if (waiter != 0) owner_.CopyDone(slot, tier, StatusCode::kInternal, std::span(&waiter, 1));
    return;
  }
  Transfer& t = transfers_[key];
  t.source = source;
  t.spill = spill;
  if (waiter != 0) t.waiters.push_back(waiter);
  // The store holds the source for the copy: neither it nor the object goes meanwhile.
  owner_.HoldSource(slot, source);
  const auto& h = table_.header(slot);
  std::vector<std::byte>& metadata = table_.at(slot).replicas.kept_metadata();
  if (h.metadata_size != 0 && source == kHost && metadata.empty()) {
    // The destination holds data only: the metadata stays in daemon memory from now on.
    const std::byte* meta = arena_.base(h.segment) + h.offset + h.data_size;
    metadata.assign(meta, meta + h.metadata_size);
    owner_.ChargeObject(slot, h.metadata_size);
  }
  AllocateOn(tier, table_.BytesOn(slot, tier),
             [this, slot, tier, id](std::optional<TierPool::Block> block) {
               if (!block) {
                 return FinishTransfer(
                     slot, tier,
                     Status::OutOfMemory(OutOfMemoryMessage(tier, id, table_.BytesOn(slot, tier))));
               }
               PlaceReplica(slot, tier, *block);
               RunCopy(slot, tier);
             });
}

void Tiers::RunCopy(uint32_t slot, int32_t tier) {
  const int32_t source = transfers_.at({slot, tier}).source;
  gpu::DeviceBackend& backend = gpus_.front()->backend();
  const uint64_t bytes = table_.header(slot).data_size;
  // Addresses stay valid until FinishTransfer: the store holds the source, and the
  // destination is no eviction candidate before it is ready.
  auto address = [&](int32_t t) {
    const Replica& r = *table_.FindReplica(slot, t);
    return pool(t).address(r.region, pool(t).OffsetOf(r.region, r.handle));
  };
  const uint64_t from = address(source), to = address(tier);
  executor_.Offload([this, &backend, slot, tier, source, from, to, bytes] {
    const auto start = std::chrono::steady_clock::now();
    Status st;
    if (bytes == 0) {
      st = Status::OK();
    } else if (source == kHost) {
      st = backend.CopyFromHost(tier, reinterpret_cast<const void*>(from), to, bytes);
    } else if (tier == kHost) {
      st = backend.CopyToHost(source, from, reinterpret_cast<void*>(to), bytes);
    } else {
      st = backend.CopyBetweenDevices(source, from, tier, to, bytes);
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return std::function<void()>([this, slot, tier, st = std::move(st), seconds] {
      FinishTransfer(slot, tier, st, seconds);
    });
  });
}

void Tiers::StartCopyRatesFrom(const CopyRates& probed) {
  for (auto rate : {&CopyRates::host_to_gpu, &CopyRates::gpu_to_host, &CopyRates::gpu_to_gpu}) {
    if (copy_rates_.*rate == 0) copy_rates_.*rate = probed.*rate;
  }
}

void Tiers::FinishTransfer(uint32_t slot, int32_t tier, Status status, double seconds) {
  Transfer t = std::move(transfers_.extract({slot, tier}).mapped());
  auto& h = table_.header(slot);
  if (status.ok() && h.data_size >= CopyRates::kMinBytes && seconds > 0) {
    double& rate = t.source == kHost ? copy_rates_.host_to_gpu
                   : tier == kHost   ? copy_rates_.gpu_to_host
                                     : copy_rates_.gpu_to_gpu;
    const double measured = static_cast<double>(h.data_size) / seconds;
    rate = rate == 0 ? measured : rate + 0.2 * (measured - rate);
  }
  const ObjectId id = table_.IdAt(slot);
  const uint32_t generation = h.generation.load(std::memory_order_relaxed);
  if (status.ok()) {
    if (tier == kHost) {
      // Host replicas carry the metadata after the data.
      std::span<const std::byte> metadata = table_.at(slot).replicas.kept_metadata();
      if (!metadata.empty()) {
        std::memcpy(arena_.base(h.segment) + h.offset + h.data_size, metadata.data(),
                    metadata.size());
      }
    }
    table_.FindReplica(slot, tier)->ready = true;
    table_.PublishTiers(slot);
    if (t.spill) {
      counters_.spills++;
      counters_.spilled_bytes += h.data_size;
    } else {
      counters_.replicas_made++;
    }
  } else {
    if (uint64_t held_back = 0; copy_failure_log_.Allow(&held_back)) {
      spdlog::warn("cannot copy {} to {}: {}{}", Mention(id), pool(tier).name(), status.message(),
                   held_back == 0 ? "" : fmt::format(" ({} more failed copies before)", held_back));
    }
    if (const Replica* r = table_.FindReplica(slot, tier); r != nullptr && !r->ready) {
      FreeReplica(slot, tier);
    }
  }
  // The waiting gets take their references before the store lets go of the source.
  owner_.CopyDone(slot, tier, status.code(), t.waiters);
  if (t.spill) {
    if (Replica* r = table_.FindReplica(slot, t.source)) r->spilling = false;
  }
  owner_.LetGoOfSource(slot, t.source);
  const bool alive = table_.headers().state(slot) != ipc::ObjectState::kFree &&
                     h.generation.load(std::memory_order_relaxed) == generation;
  if (alive && t.spill && status.ok()) {
    // Spilled: the GPU copy goes unless someone took a reference to it meanwhile.
    if (const Replica* r = table_.FindReplica(slot, t.source); r != nullptr && r->refs == 0) {
      DropReplica(slot, t.source);
    }
  }
  if (t.spill) {
    spills_in_flight_[Index(t.source)]--;
    ScheduleRoomWaits(t.source);
  }
}

std::optional<TierPool::Block> Tiers::AllocateDroppingReplicas(int32_t tier, uint64_t bytes) {
  TierPool& p = pool(tier);
  auto block = p.Allocate(bytes);
  const LruList& candidates = policy_.candidates(tier);
  for (uint32_t victim = candidates.front(); !block && victim != LruList::kNil;) {
    const uint32_t next = candidates.next(victim);
    if (policy_.ActionFor(victim, tier) == EvictionPolicy::Action::kDrop) {
      const uint32_t region = table_.FindReplica(victim, tier)->region;
      DropReplica(victim, tier);
      counters_.replicas_dropped++;
      block = p.AllocateIn(region, bytes);
    }
    victim = next;
  }
  return block;
}

bool Tiers::StartSpills(int32_t tier, uint64_t bytes) {
  const uint64_t need = pool(tier).BlockSize(bytes);
  uint64_t started = 0;
  const LruList& candidates = policy_.candidates(tier);
  for (uint32_t victim = candidates.front(); victim != LruList::kNil && started < need;) {
    const uint32_t next = candidates.next(victim);
    if (policy_.ActionFor(victim, tier) == EvictionPolicy::Action::kSpill &&
        !transfers_.contains({victim, kHost})) {
      table_.FindReplica(victim, tier)->spilling = true;
      spills_in_flight_[Index(tier)]++;
      policy_.Reconsider(victim);  // no candidate while it spills
      started += ReplicaBytes(victim, tier);
      StartTransfer(victim, kHost, /*spill=*/true, 0);
    }
    victim = next;
  }
  return spills_in_flight_[Index(tier)] > 0;
}

void Tiers::AllocateOn(int32_t tier, uint64_t bytes, RoomDone then) {
  if (tier == kHost) return then(AllocateOrEvict(bytes));
  if (auto block = AllocateDroppingReplicas(tier, bytes)) return then(block);
  if (StartSpills(tier, bytes)) {
    room_waits_[Index(tier)].push_back(RoomWait{bytes, std::move(then)});
    return;
  }
  then(std::nullopt);
}

void Tiers::ScheduleRoomWaits(int32_t tier) {
  if (room_waits_[Index(tier)].empty()) return;
  // Deferred, not called: the caller may be in the middle of changing the tables.
  executor_.Defer([this, tier] { ServeRoomWaits(tier); });
}

void Tiers::ServeRoomWaits(int32_t tier) {
  auto& waits = room_waits_[Index(tier)];
  while (!waits.empty()) {
    std::optional<TierPool::Block> block = AllocateDroppingReplicas(tier, waits.front().bytes);
    if (!block && (spills_in_flight_[Index(tier)] > 0 || StartSpills(tier, waits.front().bytes))) {
      return;  // more room is on its way
    }
    RoomWait wait = std::move(waits.front());
    waits.erase(waits.begin());
    wait.then(block);
  }
}

}  // namespace depot::store
