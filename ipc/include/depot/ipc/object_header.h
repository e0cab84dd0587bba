// The shared header table: one ObjectHeader per object slot, in a memfd the daemon writes
// and every client maps read-only. It lets any process see an object's state, reference
// count and location without asking the daemon.
//
// Only the daemon writes. It fills the other fields first, then the atomic ones, and
// publishes them by storing the state word with release order; readers load the state word
// with acquire order and check `id` afterwards, since a slot is reused once its object is
// gone. A lease (ipc/lease.h) reads `flags` first instead, then the other atomic fields.
#pragma once

#include <atomic>
#include <cstdint>

namespace depot::ipc {

enum class ObjectState : uint8_t {
  kFree = 0,      // the slot holds no object
  kCreating = 1,  // being written by its creator, invisible to others
  kSealed = 2,    // immutable, readable by all
};

enum ObjectFlags : uint32_t {
  kFlagPinned = 1u << 0,         // never evicted
  kFlagHasChecksum = 1u << 1,    // `checksum` is valid
  kFlagDeletePending = 1u << 2,  // deleted; freed when the last reference goes
  // The daemon is about to free the host copy, or has (ipc/lease.h): no new lease on it.
  kFlagReclaiming = 1u << 3,
  kFlagNoSpill = 1u << 4,  // evicted for good under pressure, never spilled to disk
};

// State (top 8 bits) and total reference count (low 56 bits) in one word, so a reader
// sees a consistent pair.
inline constexpr uint64_t PackStateRefs(ObjectState state, uint64_t refs) {
  return (static_cast<uint64_t>(state) << 56) | (refs & ((1ull << 56) - 1));
}
inline constexpr ObjectState UnpackState(uint64_t word) {
  return static_cast<ObjectState>(word >> 56);
}
inline constexpr uint64_t UnpackRefs(uint64_t word) { return word & ((1ull << 56) - 1); }

struct ObjectHeader {
  std::atomic<uint64_t> state_refs;
  uint64_t id_lo;
  uint64_t id_hi;
  uint64_t data_size;
  uint64_t metadata_size;
  uint64_t offset;                   // within the segment
  uint32_t segment;                  // arena segment index
  std::atomic<uint32_t> flags;       // ObjectFlags; changes while clients read (delete pending)
  uint64_t checksum;                 // XXH3-64 of data then metadata, when kFlagHasChecksum
  uint64_t create_time_ns;           // CLOCK_REALTIME
  uint64_t access_time_ns;           // CLOCK_REALTIME, updated on get
  std::atomic<uint32_t> generation;  // bumped each time the slot is reused
  uint32_t reserved0;
  // Where the bytes are: bit 0 = host memory (segment and offset are valid), bit k + 1 =
  // GPU k of the daemon's device list, bit 63 = the daemon's spill directory (kTierDisk).
  // Changes while clients read (replicas, spills).
  std::atomic<uint64_t> tiers;
};

inline constexpr uint64_t kTierHost = 1;
inline constexpr uint64_t TierBit(int32_t device) { return uint64_t{1} << (device + 1); }
// A copy in the daemon's spill directory: no client reads it there; a get restores it.
inline constexpr uint64_t kTierDisk = uint64_t{1} << 63;
// The GPUs' bits of a tiers word.
inline constexpr uint64_t kTierGpus = ~(kTierHost | kTierDisk);

static_assert(sizeof(ObjectHeader) == 96, "ObjectHeader is part of the protocol");
static_assert(std::atomic<uint64_t>::is_always_lock_free);
static_assert(std::atomic<uint32_t>::is_always_lock_free);

}  // namespace depot::ipc
