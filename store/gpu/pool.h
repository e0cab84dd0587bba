// A GPU's pool: large chunks of device memory from the backend, carved into objects with the
// same offset allocator as the host arena (256-byte aligned, the alignment cudaMalloc gives).
//
// Chunks are added on demand up to the pool's limit and kept until the daemon exits, so a
// client imports each one once. Nothing but the destructor frees a chunk, and that is what
// makes handing chunks out safe: a client keeps a chunk mapped (a legacy IPC handle open)
// for as long as it is connected, with no message to say it has let go, so a chunk freed
// while the daemon runs could be reused under a client still reading it. An object larger than the
// usual chunk gets a chunk of its own (rounded up to the device's granularity), which later objects
// reuse once it is free.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "store/allocator.h"
#include "store/gpu/device_backend.h"
#include "store/log_limiter.h"
#include "store/tier_pool.h"

namespace depot::store::gpu {

class DevicePool final : public TierPool {
 public:
  static constexpr uint64_t kAlignment = 256;

  // A pool on `device` that takes at most `limit` bytes of it, in chunks of `chunk_size`
  // (both rounded down to the device's granularity, and at least one granule).
  DevicePool(DeviceBackend& backend, uint32_t device, uint64_t limit, uint64_t chunk_size);
  ~DevicePool() override;
  DevicePool(const DevicePool&) = delete;
  DevicePool& operator=(const DevicePool&) = delete;

  // TierPool: regions are chunks. Allocate adds a chunk when none has room and the limit
  // allows; a chunk the backend failed to make is logged and counts as no room.
  std::optional<Block> Allocate(uint64_t bytes) override;
  std::optional<Block> AllocateIn(uint32_t chunk, uint64_t bytes) override;
  void Free(uint32_t chunk, uint32_t handle) override;
  uint64_t OffsetOf(uint32_t chunk, uint32_t handle) const override {
    return chunks_[chunk]->allocator.OffsetOf(handle);
  }
  uint64_t BlockSize(uint64_t bytes) const override { return ReservedSize(bytes); }
  // A chunk for it fits under the limit.
  bool CouldFit(uint64_t bytes) const override;
  uint64_t free_bytes(uint32_t chunk) const override {
    return chunks_[chunk]->allocator.free_bytes();
  }
  uint64_t used_bytes() const override;
  uint64_t capacity() const override { return limit_; }
  uint64_t largest_free_block() const override;
  std::string name() const override { return info().name; }
  static uint64_t ReservedSize(uint64_t bytes) {
    return bytes == 0 ? kAlignment : (bytes + kAlignment - 1) / kAlignment * kAlignment;
  }

  uint32_t device() const { return device_; }
  DeviceBackend& backend() const { return backend_; }
  const DeviceInfo& info() const { return backend_.devices()[device_]; }
  uint32_t chunk_count() const { return static_cast<uint32_t>(chunks_.size()); }
  const Chunk& chunk(uint32_t index) const { return chunks_[index]->chunk; }
  // The daemon's address of byte `offset` of chunk `index`.
  uint64_t address(uint32_t index, uint64_t offset) const override {
    return chunks_[index]->chunk.address + offset;
  }

  // Makes one chunk of `bytes` (rounded up to the device's granularity) now, at start-up,
  // unless chunks already hold that much: objects up to its size then go into a chunk that
  // exists and is exported. Fails with the backend's error.
  Status Reserve(uint64_t bytes);

  uint64_t limit() const { return limit_; }
  uint64_t reserved_bytes() const { return reserved_; }

 private:
  struct Entry {
    Chunk chunk;
    OffsetAllocator allocator;
    Entry(Chunk c) : allocator(c.size, kAlignment) { chunk = std::move(c); }
  };
  // Adds a chunk that can hold `bytes`; false when the limit or the device says no.
  bool AddChunk(uint64_t bytes);
  uint64_t RoundToGranule(uint64_t bytes) const;

  DeviceBackend& backend_;
  const uint32_t device_;
  uint64_t limit_;
  uint64_t chunk_size_;
  uint64_t reserved_ = 0;
  std::vector<std::unique_ptr<Entry>> chunks_;
  LogLimiter chunk_failure_log_;
};

}  // namespace depot::store::gpu
