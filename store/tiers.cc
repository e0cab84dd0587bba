#include "store/tiers.h"

#include <spdlog/spdlog.h>

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <tuple>

#include "depot/ipc/units.h"
#include "store/spill_io.h"

namespace depot::store {

namespace {
std::string Mention(const ObjectId& id) { return "object " + id.Hex(); }

// Disk copies go through buffers of this size: a GPU's through a staging buffer, and large
// host ones in pieces, so a checksum runs as the bytes arrive.
constexpr uint64_t kDiskChunk = 8u << 20;

// The page-aligned bulk of a copy of kDirectFrom bytes or more between `memory` and a spill
// file goes through `direct` (O_DIRECT: the offset is aligned by DiskPool) when there is one
// and `memory` is page-aligned (objects of Arena::kPageAlignFrom bytes or more, staging
// buffers); the rest is buffered. Smaller objects are written packed instead (WritePacked),
// and read buffered.
constexpr uint64_t kDirectFrom = 1 << 20;
// Restores of fewer bytes that a read window holds are copied on the loop.
constexpr uint64_t kCopyOnLoop = 256 << 10;

uint64_t DirectBulk(int direct, const std::byte* memory, uint64_t bytes) {
  if (direct < 0 || bytes < kDirectFrom ||
      reinterpret_cast<uintptr_t>(memory) % DiskPool::kAlignment != 0) {
    return 0;
  }
  return bytes / DiskPool::kAlignment * DiskPool::kAlignment;
}

Status DiskWrite(int fd, int direct, const std::byte* from, uint64_t bytes, uint64_t offset) {
  const uint64_t bulk = DirectBulk(direct, from, bytes);
  if (bulk != 0) DEPOT_RETURN_NOT_OK(WriteAll(direct, from, bulk, offset));
  return WriteAll(fd, from + bulk, bytes - bulk, offset + bulk);
}

// Where the file has direct I/O, what is read buffered is dropped from the page cache after.
Status DiskRead(int fd, int direct, std::byte* to, uint64_t bytes, uint64_t offset) {
  const uint64_t bulk = DirectBulk(direct, to, bytes);
  if (bulk != 0) DEPOT_RETURN_NOT_OK(ReadAll(direct, to, bulk, offset));
  DEPOT_RETURN_NOT_OK(ReadAll(fd, to + bulk, bytes - bulk, offset + bulk));
  if (direct >= 0 && bulk < bytes) DropCached(fd, offset + bulk, bytes - bulk);
  return Status::OK();
}

// Each worker's staging buffer for small objects' runs (kDiskChunk bytes, page-aligned),
// made at its first and kept.
std::byte* Staging() {
  thread_local const std::unique_ptr<std::byte, decltype(&std::free)> staging(
      static_cast<std::byte*>(std::aligned_alloc(DiskPool::kAlignment, kDiskChunk)), &std::free);
  if (staging == nullptr) std::abort();
  return staging.get();
}

// Whether `bytes` read back from disk at `to` match the object's checksum, if it has one.
Status CheckRestored(const std::byte* to, uint64_t bytes, std::optional<uint64_t> checksum) {
  if (checksum && XXH3_64bits(to, bytes) != *checksum) {
    return Status::IoError("its bytes read back from disk do not match its checksum");
  }
  return Status::OK();
}

// Writes `writes` (small spills, sorted by file and offset) with one direct write for each
// run of them that lies end to end in a file, through `staging` (page-aligned, kDiskChunk
// bytes, and no run is longer), so that they reach the disk at its speed and their bytes do
// not stay in the page cache. A block's bytes past its object are written as zeros. Without
// direct I/O each is written on its own, from the arena: the page cache gathers them, and
// large buffered writes ran at a tenth of the speed of 64 KiB ones here.
struct Packed {
  std::vector<Status> done;  // one for each write
  uint32_t writes = 0;       // made
};
Packed WritePacked(std::span<const PackedWrite> writes, std::byte* staging) {
  Packed packed{.done = std::vector<Status>(writes.size())};
  for (size_t begin = 0; begin < writes.size(); ++packed.writes) {
    const PackedWrite& first = writes[begin];
    if (first.direct < 0) {
      packed.done[begin++] = WriteAll(first.fd, first.from, first.bytes, first.at);
      continue;
    }
    size_t end = begin;
    uint64_t run = 0;
    while (end < writes.size() && writes[end].fd == first.fd && writes[end].at == first.at + run) {
      const PackedWrite& w = writes[end];
      std::memcpy(staging + run, w.from, w.bytes);
      std::memset(staging + run + w.bytes, 0, w.block - w.bytes);
      run += w.block;
      ++end;
    }
    const Status st = WriteAll(first.direct, staging, run, first.at);
    if (st.ok()) {
      std::fill(packed.done.begin() + static_cast<ptrdiff_t>(begin),
                packed.done.begin() + static_cast<ptrdiff_t>(end), st);
      begin = end;
      continue;
    }
    // A file system may take O_DIRECT opens and refuse the writes: each object buffered
    // then (a real I/O error fails those too).
    for (; begin < end; ++begin, ++packed.writes) {
      const PackedWrite& w = writes[begin];
      packed.done[begin] = WriteAll(w.fd, w.from, w.bytes, w.at);
    }
  }
  return packed;
}

}  // namespace

std::vector<TierPool*> Tiers::Pools(Arena& arena, std::span<gpu::DevicePool* const> gpus,
                                    DiskPool* disk) {
  std::vector<TierPool*> pools{&arena};
  pools.insert(pools.end(), gpus.begin(), gpus.end());
  if (disk != nullptr) pools.push_back(disk);
  return pools;
}

Tiers::Tiers(ObjectTable& table, EvictionPolicy& policy, Executor& executor, Arena& arena,
             std::span<gpu::DevicePool* const> gpus, DiskPool* disk, bool eviction, Owner& owner)
    : table_(table),
      policy_(policy),
      executor_(executor),
      arena_(arena),
      planner_(table, policy, arena),
      gpus_(gpus.begin(), gpus.end()),
      disk_(disk),
      pools_(Pools(arena, gpus, disk)),
      eviction_(eviction),
      owner_(owner),
      usage_(pools_.size()),
      room_waits_(pools_.size()),
      spills_in_flight_(pools_.size(), 0),
      copies_in_(pools_.size(), 0) {}

std::string Tiers::OutOfMemoryMessage(int32_t tier, const ObjectId& id, uint64_t bytes) const {
  const TierPool& p = pool(tier);
  const std::string what = "cannot fit " + Mention(id) + " of " + ipc::FormatSize(bytes);
  const std::string held = ipc::FormatSize(usage_[Index(tier)].held_bytes) +
                           " is held by references or objects being created";
  if (tier == kHost) {
    std::string disk;
    if (disk_ != nullptr && !spill_failure_.ok()) {
      disk = ", and spilling to disk failed: " + spill_failure_.message();
    } else if (disk_ != nullptr) {
      disk = ", and nothing more can spill to " + disk_->name();
    }
    return what + ": " + ipc::FormatSize(p.capacity() - p.used_bytes()) + " of " +
           ipc::FormatSize(p.capacity()) + " is free (largest free block " +
           ipc::FormatSize(p.largest_free_block()) + "), " + held + ", " +
           ipc::FormatSize(counters_.pinned_bytes) + " is pinned" +
           (eviction_ ? "" : ", and eviction is off (--no-evict)") + disk +
           "; release or delete objects, or start depotd with more --memory";
  }
  if (tier == kDisk) {
    return what + " in " + p.name() + ": its files use " + ipc::FormatSize(p.used_bytes()) +
           " of " + ipc::FormatSize(p.capacity()) + " (--spill-limit; largest free block " +
           ipc::FormatSize(p.largest_free_block()) + ")";
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
  if (tier == kHost) ScheduleSpillAhead();
  return table_.AddReplica(slot, tier, block);
}

void Tiers::ScheduleSpillAhead() {
  if (disk_ == nullptr || !eviction_ || spill_ahead_scheduled_) return;
  const uint64_t headroom = std::min(arena_.capacity() / kHeadroomShare, kMaxHeadroom);
  if (arena_.used_bytes() + headroom <= arena_.capacity()) return;
  spill_ahead_scheduled_ = true;
  executor_.Defer([this] { SpillAhead(); });
}

void Tiers::SpillAhead() {
  spill_ahead_scheduled_ = false;
  if (!spill_failure_.ok() && std::chrono::steady_clock::now() - spill_failed_at_ < kSpillRetry) {
    return;
  }
  const uint64_t headroom = std::min(arena_.capacity() / kHeadroomShare, kMaxHeadroom);
  const uint64_t used = arena_.used_bytes();
  if (used + headroom <= arena_.capacity()) return;
  // Bytes that room can be made of at once: host copies that have a disk copy, and those
  // being written ahead. (Host copies that also have a GPU copy may go at once too: left out.)
  const uint64_t want = used + headroom - arena_.capacity();
  const uint64_t ready = host_bytes_on_disk_ + ahead_in_flight_;
  if (ready >= want) return;
  // Ahead of need, nothing on disk is dropped for room: only what fits now is written. In
  // steps of at least kAheadStep, so that small objects go to disk together.
  const uint64_t step = std::min(kAheadStep, headroom / 2);
  EvictionPlanner::Plan plan =
      planner_.Require({.tier = kHost,
                        .actions = EvictionPlanner::Of(EvictionPolicy::Action::kSpill),
                        .bytes = std::max(want - ready, step),
                        .most_looks = 4096,  // a slice of the list per turn of the loop
                        .skip = [this](const EvictionPlanner::Victim& v) {
                          return transfers_.contains({v.slot, kDisk}) ||
                                 !disk_->HasRoomFor(table_.BytesOn(v.slot, kDisk));
                        }});
  while (ahead_in_flight_ < kAheadInFlight) {
    const std::optional<EvictionPlanner::Victim> victim = plan.Next();
    if (!victim) break;
    StartTransfer(victim->slot, kDisk, /*spill=*/false, 0);
    if (auto it = transfers_.find({victim->slot, kDisk}); it != transfers_.end()) {
      it->second.ahead_bytes = victim->bytes;
      ahead_in_flight_ += victim->bytes;
    }
  }
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
  if ((tier == kHost || tier == kDisk) && r.ready && OnHostAndDisk(slot)) {
    host_bytes_on_disk_ -= ReplicaBytes(slot, kHost);
  }
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
  if (tier != kDisk && !InMemory(slot)) owner_.LeftMemory(slot);
}

bool Tiers::InMemory(uint32_t slot) const {
  // Ready copies only: one being made (a restore) tells of itself when ready (CopyDone), and
  // one that fails is freed with no word.
  bool in_memory = false;
  table_.at(slot).replicas.ForEach(
      [&](const Replica& r) { in_memory |= r.tier != kDisk && r.ready; });
  return in_memory;
}

bool Tiers::SpillToDisk(uint32_t slot) {
  const Replica* host = table_.FindReplica(slot, kHost);
  if (disk_ == nullptr || host == nullptr || !host->ready) return false;
  bool on_gpu = false;
  table_.at(slot).replicas.ForEach(
      [&](const Replica& r) { on_gpu |= r.tier != kHost && r.tier != kDisk; });
  if (on_gpu) return false;
  if (transfers_.contains({slot, kDisk})) return true;
  if (table_.IsReady(slot, kDisk)) {
    // Written ahead of need, or read back for a reader: the graph's reference is on disk
    // already (ObjectStore::MoveGraphHold), so a reference here is a client's.
    if (host->refs != 0 || host->spilling || !owner_.Reclaim(slot)) return false;
    counters_.replicas_dropped++;
    DropReplica(slot, kHost);
    return true;
  }
  if (policy_.ActionFor(slot, kHost) != EvictionPolicy::Action::kSpill || SpillsToDiskWait()) {
    return false;
  }
  // Only into free disk space: making room there would drop others' spilled objects for
  // good, which no memory needs.
  const uint64_t block = disk_->BlockSize(table_.BytesOn(slot, kDisk));
  if (disk_->used_bytes() > disk_->capacity() || disk_->capacity() - disk_->used_bytes() < block) {
    return false;
  }
  table_.FindReplica(slot, kHost)->spilling = true;
  spills_in_flight_[Index(kHost)]++;
  policy_.Reconsider(slot);  // no candidate while it spills
  StartTransfer(slot, kDisk, /*spill=*/true, 0);
  return transfers_.contains({slot, kDisk});  // else its disk block could not be had
}

bool Tiers::SpillsToDiskWait() {
  if (spill_failure_.ok()) return false;
  if (std::chrono::steady_clock::now() - spill_failed_at_ < kSpillRetry) return true;
  spill_failure_ = Status::OK();  // time to try again
  return false;
}

std::optional<TierPool::Block> Tiers::AllocateOrEvict(uint64_t bytes, uint32_t writers) {
  auto block = arena_.Allocate(bytes, writers);
  if (block || !eviction_) return block;
  if (arena_.BlockSize(bytes) > arena_.segment_size()) return EvictSegmentsFor(bytes, writers);
  // Evict in LRU order, but only from the class's own segments (and dedicated ones, whose
  // capacity any class may have next) where evicting everything evictable would make enough
  // room. (Fragmentation can still defeat a segment that has the bytes.) A copy that must
  // spill first cannot make room now (AllocateOn waits for spills).
  EvictionPlanner::Plan plan = planner_.Require(
      {.tier = kHost, .actions = EvictionPlanner::kAtOnce, .writers = writers, .room_for = bytes});
  while (!block) {
    const std::optional<EvictionPlanner::Victim> victim = plan.Next();
    if (!victim) break;
    FreeHostBlock(victim->slot);
    // Only the victim's segment gained room; an object's own segment is gone, and its
    // capacity is free.
    block = Arena::IsDedicated(victim->region) ? arena_.Allocate(bytes, writers)
                                               : arena_.AllocateIn(victim->region, bytes, writers);
  }
  return block ? block : EvictSegmentOfAnotherClass(bytes, writers);
}

std::optional<TierPool::Block> Tiers::EvictSegmentOfAnotherClass(uint64_t bytes, uint32_t writers) {
  const std::optional<uint32_t> segment = planner_.SegmentOfAnotherClass(bytes, writers);
  if (!segment) return std::nullopt;
  const EvictionPlanner::Filter in_segment{
      .tier = kHost, .actions = EvictionPlanner::kAtOnce, .region = *segment};
  // First whether a client's lease holds any of them: then none goes, and nothing more is
  // tried (a reclaimed object is no longer leased, and goes when it is next chosen).
  for (EvictionPlanner::Plan plan = planner_.Require(in_segment); auto victim = plan.Next();) {
    if (!table_.IsFailed(victim->slot) && !owner_.Reclaim(victim->slot)) return std::nullopt;
  }
  for (EvictionPlanner::Plan plan = planner_.Require(in_segment); auto victim = plan.Next();) {
    FreeHostBlock(victim->slot);
  }
  return arena_.AllocateIn(*segment, bytes, writers);
}

std::optional<TierPool::Block> Tiers::EvictSegmentsFor(uint64_t bytes, uint32_t writers) {
  // An object larger than a shared segment needs capacity, not room in a segment: segments
  // that eviction can empty whole (dedicated ones, and shared ones that are then retired).
  // First whether that could ever be enough, so that nothing is evicted for a create that
  // fails anyway.
  if (!planner_.SegmentsCouldHold(bytes)) return std::nullopt;
  // Then one segment at a time, the least recently used candidate's first, all of it. A copy
  // that must spill first cannot make room now (AllocateOn waits for spills).
  std::optional<TierPool::Block> block;
  while (!block) {
    const std::optional<uint32_t> target =
        planner_.SegmentToEmpty({.tier = kHost, .actions = EvictionPlanner::kAtOnce});
    if (!target) break;
    const EvictionPlanner::Filter in_target{
        .tier = kHost, .actions = EvictionPlanner::kAtOnce, .region = *target};
    // First whether a client's lease holds any of them, as for another class's segment: then
    // none goes (the leased one is no candidate now), and whether the segments left could
    // still hold the object is asked again.
    bool leased = false;
    for (EvictionPlanner::Plan plan = planner_.Require(in_target); auto victim = plan.Next();) {
      if (!table_.IsFailed(victim->slot) && !owner_.Reclaim(victim->slot)) leased = true;
    }
    if (leased) {
      if (!planner_.SegmentsCouldHold(bytes)) break;
      continue;
    }
    bool evicted = false;
    for (EvictionPlanner::Plan plan = planner_.Require(in_target); auto victim = plan.Next();) {
      if (FreeHostBlock(victim->slot) != Freed::kNothing) evicted = true;
    }
    if (!evicted) break;
    block = arena_.Allocate(bytes, writers);
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
  // copy is the fastest way onto a GPU), else the host's, else the disk's.
  const auto rank = [](int32_t t) { return t == kDisk ? 2 : t == kHost ? 1 : 0; };
  int32_t source = kNoTier;
  const ReplicaSet& replicas = table_.at(slot).replicas;
  for (size_t i = 0; i < replicas.size(); ++i) {
    const Replica& r = replicas[i];
    const bool usable = spill ? r.spilling : (r.ready && r.tier != tier);
    if (usable && (source == kNoTier || rank(r.tier) < rank(source))) source = r.tier;
  }
  const ObjectId id = table_.IdAt(slot);
  if (source == kNoTier) {
    spdlog::error("{} has no copy to make a replica from", Mention(id));
    if (waiter != 0) {
      owner_.CopyDone(slot, tier, Status::Internal(Mention(id) + " has no copy to copy from"),
                      std::span(&waiter, 1));
    }
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
  if (h.metadata_size != 0 && source == kHost && tier != kDisk && metadata.empty()) {
    // A GPU holds data only: the metadata stays in daemon memory from now on.
    const std::byte* meta = arena_.base(h.segment) + h.offset + h.data_size;
    metadata.assign(meta, meta + h.metadata_size);
    owner_.ChargeObject(slot, h.metadata_size);
  }
  AllocateOn(tier, table_.BytesOn(slot, tier),
             [this, slot, tier, id](std::optional<TierPool::Block> block) {
               if (!block) {
                 // On disk, the file system's refusal is the reason if there was one.
                 return FinishTransfer(slot, tier,
                                       tier == kDisk && !disk_->file_error().ok()
                                           ? disk_->file_error()
                                           : Status::OutOfMemory(OutOfMemoryMessage(
                                                 tier, id, table_.BytesOn(slot, tier))));
               }
               PlaceReplica(slot, tier, *block);
               transfers_.at({slot, tier}).placed = true;
               copies_in_[Index(tier)]++;
               RunCopy(slot, tier);
             });
}

void Tiers::RunCopy(uint32_t slot, int32_t tier) {
  Transfer& transfer = transfers_.at({slot, tier});
  const int32_t source = transfer.source;
  if (source == kDisk || tier == kDisk) {
    transfer.running = true;
    disk_copies_running_++;
    // The disk's busy time, for throughput: from the first copy in a direction to the last.
    (tier == kDisk ? disk_writes_ : disk_reads_).Start();
    return RunDiskCopy(slot, tier, source);
  }
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

void Tiers::RunDiskCopy(uint32_t slot, int32_t tier, int32_t source) {
  const auto& h = table_.header(slot);
  const Replica& on_disk = *table_.FindReplica(slot, kDisk);
  const int fd = disk_->fd(on_disk.region);
  const int direct = disk_->direct_fd(on_disk.region);
  const uint32_t file = on_disk.region;
  const uint64_t file_size = disk_->size(file);
  const uint64_t at = disk_->OffsetOf(on_disk.region, on_disk.handle);
  const uint64_t data = h.data_size, metadata = h.metadata_size;
  const std::optional<uint64_t> checksum =
      (h.flags.load(std::memory_order_relaxed) & ipc::kFlagHasChecksum) != 0
          ? std::optional<uint64_t>(h.checksum)
          : std::nullopt;
  // The other end: an address in host memory, or on a GPU. Valid until FinishTransfer (see
  // RunCopy).
  const int32_t other = source == kDisk ? tier : source;
  const Replica& r = *table_.FindReplica(slot, other);
  const uint64_t address = pool(other).address(r.region, pool(other).OffsetOf(r.region, r.handle));
  gpu::DeviceBackend* backend = other == kHost ? nullptr : &gpus_.front()->backend();
  if (source == kHost && data + metadata < kDirectFrom) {
    // A small object to disk: written together with the others spilled in this turn.
    packed_writes_.push_back({.slot = slot,
                              .fd = fd,
                              .direct = direct,
                              .at = at,
                              .bytes = data + metadata,
                              .block = disk_->BlockSize(data + metadata),
                              .from = reinterpret_cast<const std::byte*>(address)});
    if (!packed_writes_scheduled_ && packed_jobs_running_ < kPackedJobs) {
      packed_writes_scheduled_ = true;
      executor_.Defer([this] { WritePackedSpills(); });
    }
    return;
  }
  if (source == kDisk && other == kHost && data + metadata < kDirectFrom) {
    // A small object that a read window holds: copied (and checked) here, with no trip to a
    // worker, if it is small enough not to hold the loop.
    std::byte* to = reinterpret_cast<std::byte*>(address);
    if (data + metadata < kCopyOnLoop &&
        read_windows_.Copy(file, direct, to, data + metadata, at, file_size)) {
      executor_.Defer([this, slot, tier, st = CheckRestored(to, data + metadata, checksum)] {
        FinishDiskCopy(slot, tier, DiskCopy{.status = st});
      });
      return;
    }
    // Else read with the others restored in this turn.
    packed_reads_.push_back({.slot = slot,
                             .file = file,
                             .fd = fd,
                             .direct = direct,
                             .at = at,
                             .bytes = data + metadata,
                             .block = disk_->BlockSize(data + metadata),
                             .file_size = file_size,
                             .to = to,
                             .checksum = checksum});
    if (!packed_reads_scheduled_) {
      packed_reads_scheduled_ = true;
      executor_.Defer([this] { ReadPackedRestores(); });
    }
    return;
  }
  executor_.Offload([this, slot, tier, source, other, fd, direct, at, data, metadata, checksum,
                     address, backend] {
    DiskCopy done;
    if (source != kDisk) {
      // Host memory to disk: data and metadata as they lie.
      done.status =
          DiskWrite(fd, direct, reinterpret_cast<const std::byte*>(address), data + metadata, at);
      done.calls = 1;
    } else if (other == kHost) {
      // An object of kDirectFrom bytes or more (smaller ones went above).
      std::byte* to = reinterpret_cast<std::byte*>(address);
      done.status = DiskRead(fd, direct, to, data + metadata, at);
      done.calls = 1;
      if (done.status.ok()) done.status = CheckRestored(to, data + metadata, checksum);
    } else {
      // To a GPU through a staging buffer, and the metadata into daemon memory.
      // Page-aligned, so that the reads into it can be direct.
      void* raw = nullptr;
      if (posix_memalign(&raw, DiskPool::kAlignment, kDiskChunk) != 0) std::abort();
      const std::unique_ptr<std::byte, decltype(&std::free)> buffer(static_cast<std::byte*>(raw),
                                                                    &std::free);
      XXH3_state_t* state = XXH3_createState();
      XXH3_64bits_reset(state);
      for (uint64_t off = 0; done.status.ok() && off < data; off += kDiskChunk) {
        const uint64_t n = std::min(kDiskChunk, data - off);
        done.status = DiskRead(fd, direct, buffer.get(), n, at + off);
        done.calls++;
        if (!done.status.ok()) break;
        XXH3_64bits_update(state, buffer.get(), n);
        done.status = backend->CopyFromHost(other, buffer.get(), address + off, n);
        // The disk read was fine: a GPU copy that fails loses nothing.
        if (!done.status.ok()) done.lost = false;
      }
      if (done.status.ok() && metadata != 0) {
        done.metadata.resize(metadata);
        done.status = ReadAll(fd, done.metadata.data(), metadata, at + data);
        done.calls++;
        XXH3_64bits_update(state, done.metadata.data(), metadata);
      }
      if (done.status.ok() && checksum && XXH3_64bits_digest(state) != *checksum) {
        done.status = Status::IoError("its bytes read back from disk do not match its checksum");
      }
      XXH3_freeState(state);
    }
    return std::function<void()>(
        [this, slot, tier, done = std::make_shared<DiskCopy>(std::move(done))]() mutable {
          FinishDiskCopy(slot, tier, std::move(*done));
        });
  });
}

void Tiers::WritePackedSpills() {
  packed_writes_scheduled_ = false;
  std::vector<PackedWrite> writes = std::exchange(packed_writes_, {});
  std::ranges::sort(writes, [](const PackedWrite& a, const PackedWrite& b) {
    return std::tie(a.fd, a.at) < std::tie(b.fd, b.at);
  });
  // Jobs of at most kDiskChunk bytes, so that they run on several workers at once; what
  // does not fit in the jobs that may run waits for one of them to end.
  size_t begin = 0;
  for (; begin < writes.size() && packed_jobs_running_ < kPackedJobs; ++packed_jobs_running_) {
    size_t end = begin;
    for (uint64_t job = 0; end < writes.size() && job + writes[end].block <= kDiskChunk; ++end) {
      job += writes[end].block;
    }
    executor_.Offload(
        [this, job = std::vector<PackedWrite>(writes.begin() + begin, writes.begin() + end)] {
          Packed packed = WritePacked(job, Staging());
          return std::function<void()>([this, job = std::move(job), packed = std::move(packed)] {
            packed_jobs_running_--;
            counters_.disk_writes += packed.writes;
            for (size_t i = 0; i < job.size(); ++i) {
              FinishDiskCopy(job[i].slot, kDisk, DiskCopy{.status = packed.done[i]});
            }
            if (!packed_writes_.empty() && !packed_writes_scheduled_) WritePackedSpills();
          });
        });
    begin = end;
  }
  packed_writes_.assign(writes.begin() + static_cast<ptrdiff_t>(begin), writes.end());
}

void Tiers::ReadPackedRestores() {
  packed_reads_scheduled_ = false;
  std::vector<PackedRead> reads = std::exchange(packed_reads_, {});
  std::ranges::sort(reads, [](const PackedRead& a, const PackedRead& b) {
    return std::tie(a.fd, a.at) < std::tie(b.fd, b.at);
  });
  // A job for each run: objects in one file whose blocks are at most kReadOver apart, over at
  // most kDiskChunk bytes.
  for (size_t begin = 0; begin < reads.size();) {
    const PackedRead& first = reads[begin];
    size_t end = begin + 1;
    while (end < reads.size() && reads[end].fd == first.fd &&
           reads[end].at <= reads[end - 1].at + reads[end - 1].block + kReadOver &&
           reads[end].at + reads[end].block - first.at <= kDiskChunk) {
      ++end;
    }
    executor_.Offload([this,
                       job = std::vector<PackedRead>(reads.begin() + static_cast<ptrdiff_t>(begin),
                                                     reads.begin() + static_cast<ptrdiff_t>(end))] {
      std::vector<DiskCopy> done = ReadPacked(job);
      return std::function<void()>([this, job = std::move(job), done = std::move(done)]() mutable {
        for (size_t i = 0; i < job.size(); ++i) {
          FinishDiskCopy(job[i].slot, kHost, std::move(done[i]));
        }
      });
    });
    begin = end;
  }
}

std::vector<Tiers::DiskCopy> Tiers::ReadPacked(std::span<const PackedRead> run) {
  std::vector<DiskCopy> done(run.size());
  const PackedRead& first = run.front();
  const uint64_t span = run.back().at + run.back().block - first.at;
  std::byte* staging = Staging();
  if (run.size() > 1 && first.direct >= 0 && first.at + span <= first.file_size &&
      ReadAll(first.direct, staging, span, first.at).ok()) {
    done.front().calls = 1;
    for (size_t i = 0; i < run.size(); ++i) {
      std::memcpy(run[i].to, staging + (run[i].at - first.at), run[i].bytes);
      done[i].status = CheckRestored(run[i].to, run[i].bytes, run[i].checksum);
    }
    return done;
  }
  // One on its own (through the read windows: it may read on from the last), or without
  // direct I/O, or if the run's read failed (each read then says whose bytes are lost).
  for (size_t i = 0; i < run.size(); ++i) {
    const PackedRead& r = run[i];
    done[i].status = read_windows_.Read(r.file, r.fd, r.direct, r.to, r.bytes, r.at, r.file_size);
    if (done[i].status.ok()) done[i].status = CheckRestored(r.to, r.bytes, r.checksum);
  }
  return done;
}

void Tiers::ReadAheadIfAsked() {
  const std::optional<ReadWindows::Ahead> ahead = read_windows_.TakeAhead();
  if (!ahead) return;
  // A descriptor of its own: the file may close (its last object gone) while the read runs.
  ipc::UniqueFd direct(
      disk_->live(ahead->file) ? fcntl(disk_->direct_fd(ahead->file), F_DUPFD_CLOEXEC, 0) : -1);
  if (!direct) {
    read_windows_.ReadAhead(*ahead, -1, /*file_size=*/0);  // reads nothing: lets it go
    return;
  }
  const uint64_t file_size = disk_->size(ahead->file);
  // The disk reads for restores while it runs: its time counts in theirs.
  disk_reads_.Start();
  executor_.Offload([this, ahead = *ahead,
                     direct = std::make_shared<ipc::UniqueFd>(std::move(direct)), file_size] {
    read_windows_.ReadAhead(ahead, direct->get(), file_size);
    return std::function<void()>([this] { disk_reads_.End(counters_.disk_restore_seconds); });
  });
}

void Tiers::FinishDiskCopy(uint32_t slot, int32_t tier, DiskCopy done) {
  const uint64_t bytes = table_.BytesOn(slot, kDisk);
  const ObjectId id = table_.IdAt(slot);
  (tier == kDisk ? counters_.disk_writes : counters_.disk_reads) += done.calls;
  if (tier == kDisk) {
    // Whatever read windows hold of its block is from before this write.
    const Replica& r = *table_.FindReplica(slot, kDisk);
    read_windows_.Invalidate(r.region, disk_->OffsetOf(r.region, r.handle),
                             disk_->BlockSize(bytes));
    if (done.status.ok()) {
      counters_.disk_spills++;
      counters_.disk_spilled_bytes += bytes;
    }
    return FinishTransfer(slot, tier, std::move(done.status), 0);
  }
  if (!done.status.ok() && !done.lost) {
    return FinishTransfer(slot, tier, std::move(done.status), 0);
  }
  if (!done.status.ok()) {
    counters_.disk_restore_failures++;
    spdlog::error("{} is lost: reading it back from {} failed: {}", Mention(id), disk_->name(),
                  done.status.message());
    const uint32_t generation = table_.header(slot).generation.load(std::memory_order_relaxed);
    FinishTransfer(slot, tier,
                   Status::IoError(Mention(id) + " is lost: reading it back from disk failed: " +
                                   done.status.message()));
    // Lost: its disk copy goes, and the object with it unless it has another copy.
    const bool alive = table_.headers().state(slot) != ipc::ObjectState::kFree &&
                       table_.header(slot).generation.load(std::memory_order_relaxed) == generation;
    if (alive && table_.FindReplica(slot, kDisk) != nullptr) {
      const Replica& r = *table_.FindReplica(slot, kDisk);
      if (r.refs == 0 && table_.HasOtherCopy(slot, kDisk)) {
        DropReplica(slot, kDisk);
      } else if (r.refs == 0 && table_.headers().refs(slot) == 0) {
        owner_.Evict(slot);
      }
    }
    return;
  }
  counters_.disk_restores++;
  counters_.disk_restored_bytes += bytes;
  if (tier == kHost) ReadAheadIfAsked();
  if (tier != kHost && !done.metadata.empty()) {
    std::vector<std::byte>& kept = table_.at(slot).replicas.kept_metadata();
    if (kept.empty()) {
      kept = std::move(done.metadata);
      owner_.ChargeObject(slot, kept.size());
    }
  }
  FinishTransfer(slot, tier, Status::OK(), 0);
}

void Tiers::StartCopyRatesFrom(const CopyRates& probed) {
  for (auto rate : {&CopyRates::host_to_gpu, &CopyRates::gpu_to_host, &CopyRates::gpu_to_gpu}) {
    if (copy_rates_.*rate == 0) copy_rates_.*rate = probed.*rate;
  }
}

void Tiers::FinishTransfer(uint32_t slot, int32_t tier, Status status, double seconds) {
  Transfer t = std::move(transfers_.extract({slot, tier}).mapped());
  auto& h = table_.header(slot);
  if (status.ok() && h.data_size >= CopyRates::kMinBytes && seconds > 0 && t.source != kDisk &&
      tier != kDisk) {
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
    if ((tier == kHost || tier == kDisk) && OnHostAndDisk(slot)) {
      host_bytes_on_disk_ += ReplicaBytes(slot, kHost);
    }
    table_.PublishTiers(slot);
    if (t.spill && tier == kHost) {
      counters_.spills++;
      counters_.spilled_bytes += h.data_size;
    } else if (!t.spill && t.source != kDisk && tier != kDisk) {
      counters_.replicas_made++;
    }
  } else {
    if (tier == kDisk) {
      // The object stays in host memory; spills wait a while before they try again.
      counters_.disk_spill_failures++;
      spill_failure_ = status;
      spill_failed_at_ = std::chrono::steady_clock::now();
    }
    if (uint64_t held_back = 0; copy_failure_log_.Allow(&held_back)) {
      spdlog::warn("cannot copy {} to {}: {}{}", Mention(id), pool(tier).name(), status.message(),
                   held_back == 0 ? "" : fmt::format(" ({} more failed copies before)", held_back));
    }
    if (const Replica* r = table_.FindReplica(slot, tier); r != nullptr && !r->ready) {
      FreeReplica(slot, tier);
    }
  }
  // The waiting gets take their references before the store lets go of the source.
  owner_.CopyDone(slot, tier, status, t.waiters);
  if (t.spill) {
    if (Replica* r = table_.FindReplica(slot, t.source)) r->spilling = false;
  }
  owner_.LetGoOfSource(slot, t.source);
  const bool alive = table_.headers().state(slot) != ipc::ObjectState::kFree &&
                     h.generation.load(std::memory_order_relaxed) == generation;
  if (alive && t.spill && status.ok()) {
    // Spilled: the source copy goes unless someone took a reference to it meanwhile (or, in
    // host memory, a lease holds it).
    if (const Replica* r = table_.FindReplica(slot, t.source);
        r != nullptr && r->refs == 0 && (t.source != kHost || owner_.Reclaim(slot))) {
      DropReplica(slot, t.source);
    }
  }
  if (t.spill) {
    spills_in_flight_[Index(t.source)]--;
    ScheduleRoomWaits(t.source);
  }
  if (t.placed) {
    // The copy may be unreferenced now, with a copy elsewhere: room at once.
    copies_in_[Index(tier)]--;
    if (alive) policy_.Reconsider(slot);
    ScheduleRoomWaits(tier);
  }
  if (t.running) {
    disk_copies_running_--;
    if (tier == kDisk) {
      disk_writes_.End(counters_.disk_spill_seconds);
    } else {
      disk_reads_.End(counters_.disk_restore_seconds);
    }
    ScheduleRoomWaits(kDisk);
  }
  if (t.ahead_bytes != 0) {
    // Its host copy may go at once now: what waits for room may have it.
    ahead_in_flight_ -= t.ahead_bytes;
    ScheduleRoomWaits(kHost);
    ScheduleSpillAhead();
  }
}

std::optional<TierPool::Block> Tiers::AllocateDroppingReplicas(int32_t tier, uint64_t bytes) {
  TierPool& p = pool(tier);
  auto block = p.Allocate(bytes);
  // Dropping objects frees room under the spill limit; it does not mend a file system that
  // refuses files (full, a size limit, no descriptors left).
  const auto refused = [&] { return tier == kDisk && !disk_->file_error().ok(); };
  EvictionPlanner::Plan plan =
      planner_.Require({.tier = tier, .actions = EvictionPlanner::kAtOnce});
  while (!block && !refused()) {
    const std::optional<EvictionPlanner::Victim> victim = plan.Next();
    if (!victim) break;
    if (victim->action == EvictionPolicy::Action::kDrop) {
      DropReplica(victim->slot, tier);
      counters_.replicas_dropped++;
    } else {
      // The disk's last copies: the spill limit is reached, the object goes for good.
      CountDiskDrop(victim->slot);
      owner_.Evict(victim->slot);
    }
    block = p.AllocateIn(victim->region, bytes);
  }
  return block;
}

void Tiers::CountDiskDrop(uint32_t slot) {
  spdlog::debug("dropping {} from disk for good", Mention(table_.IdAt(slot)));
  counters_.disk_drops++;
  counters_.disk_dropped_bytes += table_.BytesOn(slot, kDisk);
}

int32_t Tiers::Below(int32_t tier) const {
  if (tier == kHost) return disk_ != nullptr && eviction_ ? kDisk : kNoTier;
  return tier == kDisk ? kNoTier : kHost;
}

std::optional<TierPool::Block> Tiers::TryAllocate(int32_t tier, uint64_t bytes, uint32_t writers) {
  return tier == kHost ? AllocateOrEvict(bytes, writers) : AllocateDroppingReplicas(tier, bytes);
}

bool Tiers::StartSpills(int32_t tier, uint64_t bytes) {
  const int32_t below = Below(tier);
  if (below == kNoTier || (below == kDisk && SpillsToDiskWait())) return SpillsInFlight(tier);
  EvictionPlanner::Plan plan =
      planner_.Require({.tier = tier,
                        .actions = EvictionPlanner::Of(EvictionPolicy::Action::kSpill),
                        .bytes = pool(tier).BlockSize(bytes),
                        .skip = [&](const EvictionPlanner::Victim& v) {
                          return transfers_.contains({v.slot, below});
                        }});
  while (const std::optional<EvictionPlanner::Victim> victim = plan.Next()) {
    table_.FindReplica(victim->slot, tier)->spilling = true;
    spills_in_flight_[Index(tier)]++;
    policy_.Reconsider(victim->slot);  // no candidate while it spills
    StartTransfer(victim->slot, below, /*spill=*/true, 0);
  }
  return SpillsInFlight(tier);
}

void Tiers::AllocateOn(int32_t tier, uint64_t bytes, uint32_t writers, RoomDone then) {
  if (auto block = TryAllocate(tier, bytes, writers)) return then(block);
  if (StartSpills(tier, bytes) || copies_in_[Index(tier)] > 0) {
    room_waits_[Index(tier)].push_back(RoomWait{bytes, writers, std::move(then)});
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
    std::optional<TierPool::Block> block =
        TryAllocate(tier, waits.front().bytes, waits.front().writers);
    if (!block && (SpillsInFlight(tier) || copies_in_[Index(tier)] > 0 ||
                   StartSpills(tier, waits.front().bytes))) {
      return;  // more room may be on its way
    }
    RoomWait wait = std::move(waits.front());
    waits.erase(waits.begin());
    wait.then(block);
  }
}

}  // namespace depot::store
