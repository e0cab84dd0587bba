// A tier's memory: the host arena, or one GPU's pool. The store places, frees and finds
// object bytes through this one interface, so that host memory is a tier like any GPU.
//
// A pool is made of regions (arena segments, GPU pool chunks) that are each carved by an
// OffsetAllocator; a block is named by its region and the allocator's handle, which is
// what a replica keeps (the offset is looked up, not stored: it keeps the per-object record
// small).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace depot::store {

// A tier: host memory (kHost), or GPU pool k (k >= 0), numbered as on the wire.
inline constexpr int32_t kHost = -1;
// The disk tier (--spill-dir, DiskPool): host objects the arena has no room for. Never named
// on the wire: no client creates, gets or holds a copy there; the daemon spills to it and
// restores from it.
inline constexpr int32_t kDisk = 100;

class TierPool {
 public:
  struct Block {
    uint32_t region = 0;  // arena segment, or GPU pool chunk
    uint32_t handle = 0;  // the allocator's, in the region
    uint64_t offset = 0;  // in the region
    uint64_t size = 0;    // bytes reserved (BlockSize)
  };

  virtual ~TierPool() = default;

  // Allocates `bytes` in the first region with room, adding a region if none has and the
  // pool's limit allows. nullopt when neither works: the caller may make room and retry.
  virtual std::optional<Block> Allocate(uint64_t bytes) = 0;
  // Allocates in one region only (used right after freeing in it).
  virtual std::optional<Block> AllocateIn(uint32_t region, uint64_t bytes) = 0;
  virtual void Free(uint32_t region, uint32_t handle) = 0;
  // Where the live block `handle` starts in `region`.
  virtual uint64_t OffsetOf(uint32_t region, uint32_t handle) const = 0;
  // The daemon's address of byte `offset` of `region` (a pointer in host memory, a device
  // address on a GPU), for copies between tiers.
  virtual uint64_t address(uint32_t region, uint64_t offset) const = 0;

  // Bytes a block for an object of `bytes` reserves (rounded up to the pool's alignment).
  virtual uint64_t BlockSize(uint64_t bytes) const = 0;
  // Whether an object of `bytes` could ever fit, were the pool empty.
  virtual bool CouldFit(uint64_t bytes) const = 0;
  virtual uint64_t free_bytes(uint32_t region) const = 0;
  virtual uint64_t used_bytes() const = 0;
  virtual uint64_t capacity() const = 0;
  virtual uint64_t largest_free_block() const = 0;
  // "host memory", or the GPU's name, for messages.
  virtual std::string name() const = 0;
};

}  // namespace depot::store
