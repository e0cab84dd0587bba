#include "store/gpu/pool.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "depot/ipc/units.h"

namespace depot::store::gpu {

DevicePool::DevicePool(DeviceBackend& backend, uint32_t device, uint64_t limit, uint64_t chunk_size)
    : backend_(backend), device_(device) {
  limit_ = std::max(info().granularity, limit / info().granularity * info().granularity);
  chunk_size_ = std::clamp(RoundToGranule(chunk_size), info().granularity, limit_);
}

DevicePool::~DevicePool() {
  for (auto& entry : chunks_) backend_.FreeChunk(device_, entry->chunk);
}

uint64_t DevicePool::RoundToGranule(uint64_t bytes) const {
  const uint64_t g = info().granularity;
  return (bytes + g - 1) / g * g;
}

bool DevicePool::CouldFit(uint64_t bytes) const {
  // Checked before rounding, which would wrap for sizes near 2^64.
  return bytes <= limit_ && RoundToGranule(ReservedSize(bytes)) <= limit_;
}

bool DevicePool::AddChunk(uint64_t bytes) {
  const uint64_t size = std::max(chunk_size_, RoundToGranule(ReservedSize(bytes)));
  if (reserved_ + size > limit_) return false;
  auto chunk = backend_.AllocateChunk(device_, size);
  if (!chunk.ok()) {
    if (uint64_t held_back = 0; chunk_failure_log_.Allow(&held_back)) {
      spdlog::warn("{}: cannot add a chunk of {}: {}{}", info().name, ipc::FormatSize(size),
                   chunk.status().message(),
                   held_back == 0 ? "" : fmt::format(" ({} more failures before)", held_back));
    }
    return false;
  }
  spdlog::info("{}: added chunk {} ({})", info().name, chunks_.size(), ipc::FormatSize(size));
  reserved_ += size;
  chunks_.push_back(std::make_unique<Entry>(std::move(chunk).value()));
  return true;
}

Status DevicePool::Reserve(uint64_t bytes) {
  if (reserved_ >= bytes) return Status::OK();
  const uint64_t size = std::min(RoundToGranule(bytes - reserved_), limit_ - reserved_);
  auto chunk = backend_.AllocateChunk(device_, size);
  if (!chunk.ok()) {
    return Status(chunk.status().code(), info().name + ": cannot reserve " + ipc::FormatSize(size) +
                                             ": " + chunk.status().message());
  }
  spdlog::info("{}: reserved chunk {} ({})", info().name, chunks_.size(), ipc::FormatSize(size));
  reserved_ += size;
  chunks_.push_back(std::make_unique<Entry>(std::move(chunk).value()));
  return Status::OK();
}

std::optional<DevicePool::Block> DevicePool::AllocateIn(uint32_t index, uint64_t bytes) {
  auto a = chunks_[index]->allocator.Allocate(bytes);
  if (!a) return std::nullopt;
  return Block{index, a->handle, a->offset, a->size};
}

std::optional<DevicePool::Block> DevicePool::Allocate(uint64_t bytes) {
  for (uint32_t i = 0; i < chunks_.size(); ++i) {
    if (auto block = AllocateIn(i, bytes)) return block;
  }
  if (!AddChunk(bytes)) return std::nullopt;
  return AllocateIn(chunk_count() - 1, bytes);
}

void DevicePool::Free(uint32_t index, uint32_t handle) { chunks_[index]->allocator.Free(handle); }

uint64_t DevicePool::used_bytes() const {
  uint64_t used = 0;
  for (const auto& entry : chunks_) used += entry->allocator.used_bytes();
  return used;
}

uint64_t DevicePool::largest_free_block() const {
  uint64_t largest = 0;
  for (const auto& entry : chunks_) {
    largest = std::max(largest, entry->allocator.largest_free_block());
  }
  // Room for a new chunk counts too.
  if (reserved_ < limit_) largest = std::max(largest, (limit_ - reserved_));
  return largest;
}

}  // namespace depot::store::gpu
