// The eviction order: a doubly linked list of header slots, least recently used first.
// Links live in two arrays indexed by slot, so membership costs 8 bytes per slot and
// every operation is O(1).
#pragma once

#include <cstdint>
#include <vector>

namespace depot::store {

class LruList {
 public:
  static constexpr uint32_t kNil = UINT32_MAX;

  bool empty() const { return head_ == kNil; }
  uint32_t front() const { return head_; }
  // The slot after `slot` (towards the most recently used), kNil at the end.
  uint32_t next(uint32_t slot) const { return next_[slot]; }
  bool contains(uint32_t slot) const { return slot < prev_.size() && prev_[slot] != kAbsent; }
  uint32_t size() const { return size_; }

  // Appends `slot` as the most recently used. It must not be in the list.
  void PushBack(uint32_t slot) {
    if (slot >= prev_.size()) {
      prev_.resize(slot + 1, kAbsent);
      next_.resize(slot + 1, kAbsent);
    }
    prev_[slot] = tail_;
    next_[slot] = kNil;
    if (tail_ != kNil)
      next_[tail_] = slot;
    else
      head_ = slot;
    tail_ = slot;
    ++size_;
  }

  // Removes `slot` if it is in the list.
  void Remove(uint32_t slot) {
    if (!contains(slot)) return;
    const uint32_t p = prev_[slot], n = next_[slot];
    if (p != kNil)
      next_[p] = n;
    else
      head_ = n;
    if (n != kNil)
      prev_[n] = p;
    else
      tail_ = p;
    prev_[slot] = next_[slot] = kAbsent;
    --size_;
  }

 private:
  static constexpr uint32_t kAbsent = UINT32_MAX - 1;  // marks a slot not in the list
  std::vector<uint32_t> prev_, next_;
  uint32_t head_ = kNil, tail_ = kNil, size_ = 0;
};

}  // namespace depot::store
