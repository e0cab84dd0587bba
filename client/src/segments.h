// Segments: this connection's mappings of the daemon's arena segments.
//
// The daemon announces each segment once per session, with its descriptor (Reply.newSegments).
// The connection maps it on arrival and keeps it mapped for as long as any Buffer may point
// into it, so a warm Get costs no system call.
#pragma once

#include <cstdint>
#include <mutex>
#include <vector>

#include "depot/ipc/framing.h"
#include "depot/status.h"
#include "mapping.h"

namespace depot::internal {

class Segments {
 public:
  // Maps segment `index` of `size` bytes read-write, populating its page tables now so that
  // writes into a warm arena take no page faults. Closes `fd`. A failure to map is kept and
  // reported by every Resolve of that segment; an index announced twice keeps the first.
  void Add(uint32_t index, uint64_t size, ipc::UniqueFd fd);

  // The address of bytes [offset, offset + size) of segment `index`. Fails with Internal if
  // the daemon never announced the segment or the range lies outside it, and with the
  // mapping's error if mapping the segment failed. Thread-safe.
  Result<std::byte*> Resolve(uint32_t index, uint64_t offset, uint64_t size) const;

 private:
  struct Entry {
    bool announced = false;
    Mapping mapping;
    Status error;  // why mapping failed, if it did
  };

  mutable std::mutex mu_;
  std::vector<Entry> table_;  // indexed by segment index
};

}  // namespace depot::internal
