// The shared header table: a memfd of ObjectHeader slots that the daemon writes and every
// client maps read-only (see depot/ipc/object_header.h), plus the daemon's slot bookkeeping.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "depot/ipc/framing.h"
#include "depot/ipc/object_header.h"
#include "depot/status.h"

namespace depot::store {

class HeaderTable {
 public:
  static constexpr uint32_t kNoSlot = UINT32_MAX;

  // A table of `slots` headers. Pages are touched only as slots come into use.
  static Result<std::unique_ptr<HeaderTable>> Create(uint32_t slots);
  HeaderTable(const HeaderTable&) = delete;
  HeaderTable& operator=(const HeaderTable&) = delete;
  ~HeaderTable();

  // A free slot, cleared, with its generation bumped; kNoSlot when the table is full.
  uint32_t Acquire();
  // Marks the slot free (state kFree) and makes it available again.
  void Release(uint32_t slot);

  ipc::ObjectHeader& at(uint32_t slot) { return headers_[slot]; }
  const ipc::ObjectHeader& at(uint32_t slot) const { return headers_[slot]; }
  uint32_t slots() const { return slots_; }
  // Slots ever used: every live slot is below this.
  uint32_t high_water() const { return high_water_; }
  uint32_t live() const { return high_water_ - static_cast<uint32_t>(free_.size()); }
  int fd() const { return fd_.get(); }

  // Publishes a state and total reference count (release order: fields written before are
  // visible to readers that see the new word).
  void SetStateRefs(uint32_t slot, ipc::ObjectState state, uint64_t refs) {
    headers_[slot].state_refs.store(ipc::PackStateRefs(state, refs), std::memory_order_release);
  }
  ipc::ObjectState state(uint32_t slot) const {
    return ipc::UnpackState(headers_[slot].state_refs.load(std::memory_order_relaxed));
  }
  uint64_t refs(uint32_t slot) const {
    return ipc::UnpackRefs(headers_[slot].state_refs.load(std::memory_order_relaxed));
  }

 private:
  HeaderTable() = default;
  ipc::UniqueFd fd_;
  ipc::ObjectHeader* headers_ = nullptr;
  uint32_t slots_ = 0;
  uint32_t high_water_ = 0;
  std::vector<uint32_t> free_;
};

}  // namespace depot::store
