// The shared header table: a memfd of ObjectHeader slots that the daemon publishes and every
// client maps read-only (see depot/ipc/object_header.h), plus the daemon's slot bookkeeping.
//
// The daemon never reads the shared table back. Every header lives first in daemon-private
// memory, where the store reads and changes it; Publish copies it out. The memfd is sealed
// with F_SEAL_FUTURE_WRITE once the daemon has its own mapping, so no descriptor a client
// receives can be mapped writable, written or resized, and nothing a client could do to its
// copy would reach the daemon's decisions anyway.
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
  // Marks the slot free (state kFree), publishes that, and makes the slot available again.
  void Release(uint32_t slot);

  // The daemon's own header of `slot`. Changes reach clients only through Publish.
  ipc::ObjectHeader& at(uint32_t slot) { return private_[slot]; }
  const ipc::ObjectHeader& at(uint32_t slot) const { return private_[slot]; }
  // Copies the header of `slot` to the shared table: the other fields first, then the state
  // word with release order, so a reader that sees the new word sees the fields before it.
  void Publish(uint32_t slot);
  // The header of `slot` as published, in the daemon's own mapping of the shared table (for
  // tests that play a client in the daemon's process: see Leases).
  const ipc::ObjectHeader& published(uint32_t slot) const { return shared_[slot]; }

  uint32_t slots() const { return slots_; }
  // Slots ever used: every live slot is below this.
  uint32_t high_water() const { return high_water_; }
  uint32_t live() const { return high_water_ - static_cast<uint32_t>(free_.size()); }
  // The descriptor clients receive: sealed against writes and resizing.
  int fd() const { return fd_.get(); }

  // Sets a state and total reference count and publishes the whole header.
  void SetStateRefs(uint32_t slot, ipc::ObjectState state, uint64_t refs) {
    private_[slot].state_refs.store(ipc::PackStateRefs(state, refs), std::memory_order_relaxed);
    Publish(slot);
  }
  ipc::ObjectState state(uint32_t slot) const {
    return ipc::UnpackState(private_[slot].state_refs.load(std::memory_order_relaxed));
  }
  uint64_t refs(uint32_t slot) const {
    return ipc::UnpackRefs(private_[slot].state_refs.load(std::memory_order_relaxed));
  }

 private:
  HeaderTable() = default;
  size_t bytes() const { return static_cast<size_t>(slots_) * sizeof(ipc::ObjectHeader); }

  ipc::UniqueFd fd_;
  ipc::ObjectHeader* shared_ = nullptr;   // the memfd, mapped writable by the daemon alone
  ipc::ObjectHeader* private_ = nullptr;  // anonymous private memory: what the daemon decides on
  uint32_t slots_ = 0;
  uint32_t high_water_ = 0;
  std::vector<uint32_t> free_;
};

}  // namespace depot::store
