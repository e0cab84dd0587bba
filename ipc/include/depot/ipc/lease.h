// The lease table: one per session, in a memfd the daemon makes and seals against resizing,
// which the client maps writable and the daemon read-only. A client that knows where a
// sealed host object lies (its slot, generation and place, from an earlier get) takes and
// drops a reference to it here, with no message; the daemon reads the table before it frees
// a host copy, and forgets the whole table when the session ends. docs/leases.md gives the
// protocol and why it can never hand out memory that is being freed.
//
// Layout: a 64-byte head whose first word counts the leases the client holds (a hint that
// lets the daemon skip idle tables; a lie costs only the liar), then `entries` words, a
// power of two. The object in header slot s leases entry s & (entries - 1), whose word packs
// the slot's generation, the rest of the slot number (the tag) and a count. Two objects that
// share an entry cannot both be leased at once: the second goes through the socket. Tags
// are 16 bits, so with more than entries << 16 slots two slots may share entry and tag too;
// the daemon then sees either as leased while the other is: a delay, never a hazard.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "depot/ipc/object_header.h"

namespace depot::ipc {

inline constexpr size_t kLeaseHeadBytes = 64;
inline constexpr uint32_t kMaxLeaseCount = 0xffff;

inline constexpr uint64_t PackLease(uint32_t generation, uint32_t tag, uint32_t count) {
  return (uint64_t{generation} << 32) | (uint64_t{tag & 0xffff} << 16) | (count & 0xffff);
}
inline constexpr uint32_t LeaseGeneration(uint64_t word) {
  return static_cast<uint32_t>(word >> 32);
}
inline constexpr uint32_t LeaseTag(uint64_t word) {
  return static_cast<uint32_t>(word >> 16) & 0xffff;
}
inline constexpr uint32_t LeaseCount(uint64_t word) { return static_cast<uint32_t>(word & 0xffff); }

// Bytes of a table of `entries` entries.
inline constexpr size_t LeaseTableBytes(uint32_t entries) {
  return kLeaseHeadBytes + size_t{entries} * sizeof(uint64_t);
}

// A view of a mapped lease table; `base` must stay mapped while it is used.
class LeaseTableView {
 public:
  LeaseTableView() = default;
  LeaseTableView(void* base, uint32_t entries)
      : held_(static_cast<std::atomic<uint64_t>*>(base)),
        entries_(reinterpret_cast<std::atomic<uint64_t>*>(static_cast<std::byte*>(base) +
                                                          kLeaseHeadBytes)),
        mask_(entries - 1),
        shift_(static_cast<uint32_t>(__builtin_ctz(entries))) {}

  bool valid() const { return held_ != nullptr; }
  std::atomic<uint64_t>& held() const { return *held_; }
  std::atomic<uint64_t>& entry(uint32_t slot) const { return entries_[slot & mask_]; }
  uint32_t tag(uint32_t slot) const { return slot >> shift_; }

  // The daemon's side: whether this table holds a lease on the object in `slot` of
  // `generation`. Reads only, in the order docs/leases.md needs: after the caller's store of
  // kFlagReclaiming.
  bool Holds(uint32_t slot, uint32_t generation) const {
    if (held_->load(std::memory_order_seq_cst) == 0) return false;
    const uint64_t word = entry(slot).load(std::memory_order_seq_cst);
    return LeaseCount(word) != 0 && LeaseGeneration(word) == generation &&
           LeaseTag(word) == (tag(slot) & 0xffff);
  }

  // The client's side. Takes a lease on the object in `slot` of `generation`, then checks in
  // its header that the object is that one, sealed, in host memory and neither deleted nor
  // being reclaimed. kTaken: the lease is held. Otherwise nothing is: kBusy, the entry is
  // another object's; kGone, the object is not (or no longer) there to lease.
  enum class Taken : uint8_t { kTaken, kBusy, kGone };
  Taken Take(uint32_t slot, uint32_t generation, const ObjectHeader& header) const {
    held_->fetch_add(1, std::memory_order_seq_cst);
    std::atomic<uint64_t>& e = entry(slot);
    const uint32_t t = tag(slot);
    uint64_t word = e.load(std::memory_order_relaxed);
    for (;;) {
      uint64_t next;
      if (LeaseCount(word) == 0) {
        next = PackLease(generation, t, 1);
      } else if (LeaseGeneration(word) == generation && LeaseTag(word) == (t & 0xffff) &&
                 LeaseCount(word) < kMaxLeaseCount) {
        next = word + 1;
      } else {
        held_->fetch_sub(1, std::memory_order_release);  // taken by another object
        return Taken::kBusy;
      }
      if (e.compare_exchange_weak(word, next, std::memory_order_seq_cst,
                                  std::memory_order_relaxed)) {
        break;
      }
    }
    // The flags first: a reader that sees them as they were before the daemon marked the
    // object reclaiming is seen by the daemon's scan (docs/leases.md).
    const uint32_t flags = header.flags.load(std::memory_order_seq_cst);
    const bool usable =
        (flags & (kFlagDeletePending | kFlagReclaiming)) == 0 &&
        UnpackState(header.state_refs.load(std::memory_order_acquire)) == ObjectState::kSealed &&
        header.generation.load(std::memory_order_acquire) == generation &&
        (header.tiers.load(std::memory_order_acquire) & kTierHost) != 0;
    if (!usable) Drop(slot);
    return usable ? Taken::kTaken : Taken::kGone;
  }

  // Drops a lease Take gave. Every read of the object's bytes comes before it.
  void Drop(uint32_t slot) const {
    entry(slot).fetch_sub(1, std::memory_order_release);
    held_->fetch_sub(1, std::memory_order_release);
  }

 private:
  std::atomic<uint64_t>* held_ = nullptr;
  std::atomic<uint64_t>* entries_ = nullptr;
  uint32_t mask_ = 0;
  uint32_t shift_ = 0;
};

}  // namespace depot::ipc
