#include "store/largest_scan.h"

#include <algorithm>

namespace depot::store {

bool LargestScan::Larger(const Entry& a, const Entry& b) {
  if (a.data_size != b.data_size) return a.data_size > b.data_size;
  if (a.create_time_ns != b.create_time_ns) return a.create_time_ns < b.create_time_ns;
  return a.slot < b.slot;
}

bool LargestScan::Step(const ObjectStore& store, uint32_t max_slots) {
  // A min-heap of the n largest seen so far: O(objects log n), n entries of memory.
  const HeaderTable& headers = store.headers();
  const uint32_t end = headers.high_water();
  const uint32_t stop = end - std::min(next_, end) > max_slots ? next_ + max_slots : end;
  for (; next_ < stop; ++next_) {
    if (n_ == 0 || headers.state(next_) == ipc::ObjectState::kFree) continue;
    const ipc::ObjectHeader& h = headers.at(next_);
    Entry entry{h.data_size, h.create_time_ns, next_, ObjectId::FromWords(h.id_lo, h.id_hi)};
    if (heap_.size() < n_) {
      heap_.push_back(entry);
      std::push_heap(heap_.begin(), heap_.end(), Larger);
    } else if (Larger(entry, heap_.front())) {
      std::pop_heap(heap_.begin(), heap_.end(), Larger);
      heap_.back() = entry;
      std::push_heap(heap_.begin(), heap_.end(), Larger);
    }
  }
  return next_ >= end;
}

std::vector<std::pair<uint32_t, ObjectId>> LargestScan::Finish(const ObjectStore& store) {
  std::sort_heap(heap_.begin(), heap_.end(), Larger);
  std::vector<std::pair<uint32_t, ObjectId>> found;
  found.reserve(heap_.size());
  for (const Entry& e : heap_) {
    if (store.Holds(e.slot, e.id)) found.emplace_back(e.slot, e.id);
  }
  heap_.clear();
  return found;
}

}  // namespace depot::store
