// `list --largest`: the n largest objects, found a slice of the header table at a time.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "depot/object_id.h"
#include "store/object_store.h"

namespace depot::store {

// Finds the n largest objects by data size (ties: oldest first) a slice of the header table
// at a time, so that a walk of a big store never holds the loop for long (Session runs one
// slice per turn). An object created or deleted while the scan runs may be missed; what
// Finish returns exists when it is called.
class LargestScan {
 public:
  explicit LargestScan(uint32_t n) : n_(n) {}
  // Looks at up to `max_slots` more slots; true once the whole table has been seen.
  bool Step(const ObjectStore& store, uint32_t max_slots);
  // The largest objects found that still exist, largest first, with their ids.
  std::vector<std::pair<uint32_t, ObjectId>> Finish(const ObjectStore& store);

 private:
  struct Entry {
    uint64_t data_size;
    uint64_t create_time_ns;
    uint32_t slot;
    ObjectId id;
  };
  // Heap order: the smallest of the n kept so far on top.
  static bool Larger(const Entry& a, const Entry& b);

  uint32_t n_;
  uint32_t next_ = 0;
  std::vector<Entry> heap_;
};

}  // namespace depot::store
