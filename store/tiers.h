// The tiers and the copies between them: each tier's pool and use, placing and freeing
// replicas, making room (in host memory, evicting, or with a spill directory spilling to
// disk; on a GPU, dropping extra copies, then spilling to host memory; on disk, dropping the
// least recently used objects for good), and the copies themselves, for gets, prefetches,
// spills and restores.
//
// Which copies may go is the EvictionPolicy's to say, and which of them go for a given need
// the EvictionPlanner's to choose; the tiers carry that out. What a copy
// needs of the rest of the store (a reference to its source while it runs, its waiting gets
// answered, an object evicted) it asks of its Owner, the ObjectStore.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "depot/object_id.h"
#include "depot/status.h"
#include "store/arena.h"
#include "store/disk_pool.h"
#include "store/eviction_planner.h"
#include "store/eviction_policy.h"
#include "store/executor.h"
#include "store/gpu/pool.h"
#include "store/log_limiter.h"
#include "store/object_table.h"
#include "store/read_windows.h"
#include "store/waiting_gets.h"

namespace depot::store {

// One tier's use (status): host memory's goes into StoreCounters, each GPU's is its own.
struct TierUsage {
  uint64_t held_bytes = 0;  // of replicas referenced or being created
  uint64_t replicas = 0;    // objects with a replica there
  uint64_t bytes_in = 0;    // of objects created there (on a GPU, data only)
  uint64_t bytes_out = 0;   // of objects handed out there by gets
};

// What the tiers count, besides each tier's use.
struct TierCounters {
  uint64_t pinned_bytes = 0;      // host bytes of pinned objects
  uint64_t evictions = 0;         // objects evicted with their last (host) copy
  uint64_t evicted_bytes = 0;     // host bytes of the objects evicted
  uint64_t replicas_made = 0;     // copies made for gets and prefetches on another tier
  uint64_t replicas_dropped = 0;  // extra copies dropped to make room
  uint64_t spills = 0;            // objects moved from a full GPU to host memory
  uint64_t spilled_bytes = 0;
  // The disk tier (--spill-dir): objects written to disk (to make room in host memory, or
  // ahead of need), read back by gets, dropped from disk for good (the spill limit reached),
  // and the I/O that failed; the seconds during which writes (reads) were under way, for
  // throughput.
  uint64_t disk_spills = 0;
  uint64_t disk_spilled_bytes = 0;
  double disk_spill_seconds = 0;
  uint64_t disk_restores = 0;
  uint64_t disk_restored_bytes = 0;
  double disk_restore_seconds = 0;
  uint64_t disk_drops = 0;
  uint64_t disk_dropped_bytes = 0;
  uint64_t disk_spill_failures = 0;
  uint64_t disk_restore_failures = 0;  // objects lost: I/O error or checksum mismatch
  // Disk writes made by spills (one for each run of small objects written together, one for
  // each larger object), and reads made by restores of larger objects and of runs of small
  // ones (Tiers::disk_reads adds those of ReadWindows: windows, reads ahead, lone objects).
  uint64_t disk_writes = 0;
  uint64_t disk_reads = 0;
};

// Bytes per second of the copies between tiers: as the start-up probe timed them
// (copy_probe.h), then a running average per direction over the store's copies of at least
// CopyRates::kMinBytes; 0 until either has measured one.
struct CopyRates {
  static constexpr uint64_t kMinBytes = 1 << 20;
  double host_to_gpu = 0;
  double gpu_to_host = 0;
  double gpu_to_gpu = 0;
};

// A small object's spill, written with the others of its turn (Tiers::WritePackedSpills):
// `bytes` from `from` in host memory to its disk block of `block` bytes at `at`.
struct PackedWrite {
  uint32_t slot = 0;
  int fd = -1;
  int direct = -1;  // the file opened with O_DIRECT; -1 without
  uint64_t at = 0;
  uint64_t bytes = 0;
  uint64_t block = 0;
  const std::byte* from = nullptr;
};

// A small object's restore, read with the others of its turn (Tiers::ReadPackedRestores):
// `bytes` at `at` of spill file `file` (its block of `block` bytes) to `to` in host memory.
struct PackedRead {
  uint32_t slot = 0;
  uint32_t file = 0;
  int fd = -1;
  int direct = -1;
  uint64_t at = 0;
  uint64_t bytes = 0;
  uint64_t block = 0;
  uint64_t file_size = 0;
  std::byte* to = nullptr;
  std::optional<uint64_t> checksum;
};

class Tiers {
 public:
  // What a copy needs of the store around the tiers.
  class Owner {
   public:
    virtual ~Owner() = default;
    // Holds the copy's source on `tier` for as long as the copy runs, so that neither it nor
    // the object goes; and lets go of it after (which may free the object).
    virtual void HoldSource(uint32_t slot, int32_t tier) = 0;
    virtual void LetGoOfSource(uint32_t slot, int32_t tier) = 0;
    // The copy of the object in `slot` to `tier` ended (kOk: its replica there is ready);
    // `waiters` are the gets that wait for it.
    virtual void CopyDone(uint32_t slot, int32_t tier, const Status& status,
                          std::span<const WaitingGets::Id> waiters) = 0;
    // Evicts the object in `slot`, whose last copy is in host memory or on disk, to make
    // room (or because reading it back from disk failed).
    virtual void Evict(uint32_t slot) = 0;
    // Before the host copy of the object in `slot` goes: whether no client's lease holds it
    // (Leases::Reclaim). If one does, the copy stays and is no longer a candidate.
    virtual bool Reclaim(uint32_t slot) = 0;
    // Counts `bytes` more of daemon memory for the object in `slot` (its kept metadata).
    virtual void ChargeObject(uint32_t slot, uint64_t bytes) = 0;
    // The last copy in memory of the object in `slot` went; it stays on disk.
    virtual void LeftMemory(uint32_t slot) = 0;
  };

  // `gpus`: one pool per GPU, in device order; `disk`: the spill directory's, or null. All of
  // it must outlive the tiers.
  Tiers(ObjectTable& table, EvictionPolicy& policy, Executor& executor, Arena& arena,
        std::span<gpu::DevicePool* const> gpus, DiskPool* disk, bool eviction, Owner& owner);

  // The pools, by tier: host memory (kHost), then the GPUs, then the disk if there is one.
  static std::vector<TierPool*> Pools(Arena& arena, std::span<gpu::DevicePool* const> gpus,
                                      DiskPool* disk);
  std::span<TierPool* const> pools() const { return pools_; }
  TierPool& pool(int32_t tier) const { return *pools_[Index(tier)]; }
  // Whether `tier` is host memory or one of the GPUs: a tier clients may name.
  bool Has(int32_t tier) const {
    return tier >= kHost && tier < static_cast<int32_t>(gpus_.size());
  }
  DiskPool* disk() const { return disk_; }
  // Which candidates go to make room: every eviction and spill, here and in the store.
  const EvictionPlanner& planner() const { return planner_; }
  // Counts the object in `slot`, whose last copy is on disk, as dropped for good.
  void CountDiskDrop(uint32_t slot);
  // Disk reads made by restores: of larger objects, and of small ones (ReadWindows).
  uint64_t disk_reads() const { return counters_.disk_reads + read_windows_.reads(); }
  // Copies from or to disk running on the executor.
  uint32_t disk_copies_running() const { return disk_copies_running_; }
  TierUsage& usage(int32_t tier) { return usage_[Index(tier)]; }
  const TierUsage& usage(int32_t tier) const { return usage_[Index(tier)]; }
  const TierCounters& counters() const { return counters_; }
  const CopyRates& copy_rates() const { return copy_rates_; }
  // The start-up probe's rates start the running averages of the directions no copy has
  // measured yet.
  void StartCopyRatesFrom(const CopyRates& probed);
  // Bytes the block of the replica of `slot` on `tier` reserves.
  uint64_t ReplicaBytes(uint32_t slot, int32_t tier) const {
    return pool(tier).BlockSize(table_.BytesOn(slot, tier));
  }

  // Whether a client's lease holds the replica on `tier` (only ever a host one). Such a
  // replica counts as held, as one referenced does, and is not a candidate.
  bool IsLeased(uint32_t slot, int32_t tier) const {
    return tier == kHost && table_.at(slot).leased;
  }
  void SetLeased(uint32_t slot, bool leased);

  // A new replica of the object in `slot` in `block` of `tier`, not ready yet.
  Replica& PlaceReplica(uint32_t slot, int32_t tier, const TierPool::Block& block);
  // Frees the replica on `tier` and forgets it; the header's tiers are not published.
  void FreeReplica(uint32_t slot, int32_t tier);
  // Frees an extra replica of a live object, and publishes where its bytes are now.
  void DropReplica(uint32_t slot, int32_t tier);

  // Host room for an object of the class `writers` (Arena, Writers): allocates, evicting in
  // LRU order from segments where that can make room for it.
  std::optional<TierPool::Block> AllocateOrEvict(uint64_t bytes,
                                                 uint32_t writers = Arena::kTrustedWriters);
  // When the class `writers` has no room of its own: evicts every object of one shared
  // segment of another class, if all of them may go now, and allocates there.
  std::optional<TierPool::Block> EvictSegmentOfAnotherClass(uint64_t bytes, uint32_t writers);
  // For an object larger than a shared segment: evicts whole segments, the least recently
  // used first, when that could free the capacity it needs (else evicts nothing).
  std::optional<TierPool::Block> EvictSegmentsFor(uint64_t bytes, uint32_t writers);
  // Makes room in host memory by taking the object in `slot` out of it: drops its host
  // replica if it has another (a replica dropped, not an eviction), else evicts it; unless a
  // client's lease holds it, when nothing goes. Says which.
  enum class Freed : uint8_t { kNothing, kReplica, kObject };
  Freed FreeHostBlock(uint32_t slot);
  // Takes the object in `slot` out of memory for a reason other than room there (a graph's
  // memory bound: the scheduler asks): drops its host copy where a ready disk copy stands
  // beside it and no client holds it, else spills it to disk as making room would, if its
  // host copy is a spill candidate (the task graph's reference going with it). Whether its
  // bytes are leaving memory: dropped now, or a copy to disk under way (one ahead of need
  // leaves its host copy, which a later call drops). False with a copy on a GPU, with no
  // spill directory, or while spills wait after a failed one.
  bool SpillToDisk(uint32_t slot);
  // Room on `tier` for `bytes` (of the class `writers` in host memory): at once if it can
  // (evicting or dropping what may go at once: TryAllocate), else after spills to the tier
  // below or copies into it under way (whose copies may then go), or nullopt when nothing
  // can make room.
  using RoomDone = std::function<void(std::optional<TierPool::Block>)>;
  void AllocateOn(int32_t tier, uint64_t bytes, RoomDone then) {
    AllocateOn(tier, bytes, Arena::kTrustedWriters, std::move(then));
  }
  void AllocateOn(int32_t tier, uint64_t bytes, uint32_t writers, RoomDone then);

  // Copies the object in `slot` to `tier` unless a copy is under way; `waiter` (0: none)
  // waits for it (Owner::CopyDone).
  void StartCopy(uint32_t slot, int32_t tier, WaitingGets::Id waiter) {
    StartTransfer(slot, tier, /*spill=*/false, waiter);
  }

  // Why `bytes` of `id` do not fit on `tier`, for a person.
  std::string OutOfMemoryMessage(int32_t tier, const ObjectId& id, uint64_t bytes) const;

 private:
  // A copy of an object to another tier, in flight or waiting for room there.
  struct Transfer {
    int32_t source = kHost;
    bool spill = false;        // drop the source replica after, if nobody holds it
    uint64_t ahead_bytes = 0;  // a copy to disk ahead of need (SpillAhead): its bytes
    bool running = false;      // placed, its copy on the executor
    bool placed = false;       // its destination allocated (counted in copies_in_)
    std::vector<WaitingGets::Id> waiters;
  };
  // What a copy from or to disk did, for FinishTransfer.
  struct DiskCopy {
    Status status;
    bool lost = true;  // a failure is the disk's (read, short read, checksum): the object is lost
    std::vector<std::byte> metadata;  // read from disk for a GPU copy, which holds data only
    uint32_t calls = 0;               // disk writes or reads it made (TierCounters)
  };
  // Copies to (or from) disk under way, and since when there have been some.
  struct DiskBusy {
    uint32_t running = 0;
    std::chrono::steady_clock::time_point since{};
    void Start() {
      if (running++ == 0) since = std::chrono::steady_clock::now();
    }
    // Adds the time since the first started to `seconds` once the last ends.
    void End(double& seconds) {
      if (--running == 0) {
        seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
      }
    }
  };
  struct RoomWait {
    uint64_t bytes = 0;
    uint32_t writers = Arena::kTrustedWriters;
    RoomDone then;
  };

  static size_t Index(int32_t tier, size_t tiers) {
    return tier == kDisk ? tiers - 1 : static_cast<size_t>(tier + 1);
  }
  size_t Index(int32_t tier) const { return Index(tier, pools_.size()); }
  // Where the last copy of an object on `tier` spills to make room: a GPU's to host memory,
  // host memory's to disk (with a spill directory); kNoTier for none.
  static constexpr int32_t kNoTier = kHost - 1;
  int32_t Below(int32_t tier) const;
  // Whether the object in `slot` has a ready copy in memory (host or a GPU).
  bool InMemory(uint32_t slot) const;
  // Whether spills to disk wait now, after one that failed (kSpillRetry).
  bool SpillsToDiskWait();
  // Room on `tier` at once: host memory evicts (or drops copies that have another), a GPU
  // and the disk drop copies that have another, and the disk drops objects for good.
  std::optional<TierPool::Block> TryAllocate(int32_t tier, uint64_t bytes, uint32_t writers);

  void StartTransfer(uint32_t slot, int32_t tier, bool spill, WaitingGets::Id waiter);
  // Runs the copy of a transfer whose destination is placed, on the executor.
  void RunCopy(uint32_t slot, int32_t tier);
  // The same for a copy from or to disk: pread and pwrite on the spill file, through a
  // staging buffer for a GPU.
  void RunDiskCopy(uint32_t slot, int32_t tier, int32_t source);
  // Small objects (under a MiB) are not written one by one: RunDiskCopy queues them, and
  // once per turn of the loop this writes them all, sorted by place on disk, with one write
  // for each run of blocks that lie end to end (a fresh spill file fills from its start, so
  // objects spilled together are one run), in jobs of up to 8 MiB.
  void WritePackedSpills();
  // Restores of small objects that no read window holds are read the same way as they were
  // written: once per turn of the loop, sorted by place on disk, one direct read for each run
  // of them in a file (blocks at most kReadOver apart, at most 8 MiB in all), a job each; a
  // run of one goes through the read windows.
  static constexpr uint64_t kReadOver = 256 << 10;
  void ReadPackedRestores();
  // A run's job, on a worker.
  std::vector<DiskCopy> ReadPacked(std::span<const PackedRead> run);
  // Starts the read ahead that restores asked for (ReadWindows), if any, on the executor.
  void ReadAheadIfAsked();
  // After a disk copy, on the loop.
  void FinishDiskCopy(uint32_t slot, int32_t tier, DiskCopy done);
  // `seconds`: how long the copy itself took (0 when none ran).
  void FinishTransfer(uint32_t slot, int32_t tier, Status status, double seconds = 0);
  // Drops copies that have another (and, on disk, whole objects) in LRU order until `bytes`
  // fit.
  std::optional<TierPool::Block> AllocateDroppingReplicas(int32_t tier, uint64_t bytes);
  // Starts spilling LRU objects off `tier` until enough bytes are on their way out;
  // returns whether any spill is in flight.
  bool StartSpills(int32_t tier, uint64_t bytes);
  void ServeRoomWaits(int32_t tier);
  // Whether copies that will make room on `tier` are under way: spills from it, and in host
  // memory copies to disk ahead of need.
  // On disk, copies that hold disk blocks (spills being written, restores being read): room
  // comes when they end, as their source copies go or their disk blocks may be dropped.
  bool SpillsInFlight(int32_t tier) const {
    if (tier == kDisk) return disk_copies_running_ > 0;
    return spills_in_flight_[Index(tier)] > 0 || (tier == kHost && ahead_in_flight_ > 0);
  }
  // Writes ahead: once host memory is fuller than its capacity less kHeadroomShare of it,
  // copies the least recently used objects to disk while they stay in memory, so that room
  // is then made at once by dropping their host copies, with no create waiting for a write.
  // At most kAheadInFlight bytes are being written ahead at a time, and at least kAheadStep
  // (or half the headroom, if less) once writing ahead starts: small objects are then written
  // together, in one write for each run of them on disk (WritePackedSpills), rather than one
  // by one as each new object pushes the arena past the watermark.
  static constexpr uint64_t kHeadroomShare = 4;                // a quarter of the arena...
  static constexpr uint64_t kMaxHeadroom = uint64_t{1} << 30;  // ...up to 1 GiB
  static constexpr uint64_t kAheadInFlight = uint64_t{256} << 20;
  static constexpr uint64_t kAheadStep = uint64_t{8} << 20;
  void SpillAhead();
  // SpillAhead soon, from the loop, once however often it is asked for meanwhile.
  void ScheduleSpillAhead();
  // ServeRoomWaits soon, from the loop, if anything waits for room on `tier`.
  void ScheduleRoomWaits(int32_t tier);

  ObjectTable& table_;
  EvictionPolicy& policy_;
  Executor& executor_;
  Arena& arena_;
  const EvictionPlanner planner_;
  std::vector<gpu::DevicePool*> gpus_;
  DiskPool* disk_;
  std::vector<TierPool*> pools_;  // by tier
  const bool eviction_;
  Owner& owner_;

  std::vector<TierUsage> usage_;                   // by tier
  std::vector<std::vector<RoomWait>> room_waits_;  // by tier, oldest first
  std::vector<uint32_t> spills_in_flight_;         // by tier (of their source)
  // By tier, copies into it whose destination is allocated: each may leave a copy nobody
  // holds, which another copy elsewhere lets go at once, so room waits wait for them too.
  std::vector<uint32_t> copies_in_;
  uint64_t ahead_in_flight_ = 0;  // bytes being written to disk ahead (SpillAhead)
  // Bytes of ready host copies of objects with a ready disk copy: room made at once.
  uint64_t host_bytes_on_disk_ = 0;
  bool OnHostAndDisk(uint32_t slot) const {
    return table_.IsReady(slot, kHost) && table_.IsReady(slot, kDisk);
  }
  DiskBusy disk_writes_, disk_reads_;
  uint32_t disk_copies_running_ = 0;  // copies from or to disk on the executor
  bool spill_ahead_scheduled_ = false;
  // Small spills waiting for WritePackedSpills; its jobs on the executor, at most
  // kPackedJobs at a time: what is spilled while they run waits and is written together after.
  static constexpr uint32_t kPackedJobs = 2;
  std::vector<PackedWrite> packed_writes_;
  ReadWindows read_windows_;              // restores of small objects (RunDiskCopy)
  std::vector<PackedRead> packed_reads_;  // waiting for ReadPackedRestores
  bool packed_reads_scheduled_ = false;
  bool packed_writes_scheduled_ = false;
  uint32_t packed_jobs_running_ = 0;
  std::map<std::pair<uint32_t, int32_t>, Transfer> transfers_;  // (slot, destination tier)
  TierCounters counters_;
  CopyRates copy_rates_;
  // The last spill to disk that failed, and when (steady clock): spills to disk wait
  // kSpillRetry after one, so a full disk is not tried again and again.
  static constexpr std::chrono::seconds kSpillRetry{1};
  Status spill_failure_;
  std::chrono::steady_clock::time_point spill_failed_at_{};
  LogLimiter copy_failure_log_;
};

}  // namespace depot::store
