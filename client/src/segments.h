// Segments: this connection's mappings of the daemon's arena segments.
//
// The daemon announces each segment once per session, with its descriptor (Reply.newSegments).
// The connection maps it read-only on arrival and keeps it mapped for as long as any Buffer may
// point into it, so a warm Get costs no system call. Every object a Get returns is read
// through that view, from a descriptor that cannot be mapped writable: a write through a
// Buffer faults in the writer and never reaches the store. The daemon sends a segment's
// read-write descriptor with the reply to this session's first create in it; only then is a
// writable view mapped, and only MutableBuffers point into it.
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
  // Maps segment `index` of `size` bytes read-only (`writable` false) or writable, populating
  // its page tables now so that reads and writes into a warm arena take no page faults.
  // Closes `fd`. A failure to map is kept and reported by every Resolve of that view; a view
  // announced twice keeps the first. A segment's read-only view is announced first.
  void Add(uint32_t index, uint64_t size, bool writable, ipc::UniqueFd fd);

  // The address of bytes [offset, offset + size) of segment `index` in its read-only view.
  // Fails with Internal if the daemon never announced the segment or the range lies outside
  // it, and with the mapping's error if mapping the segment failed. Thread-safe.
  Result<const std::byte*> Resolve(uint32_t index, uint64_t offset, uint64_t size) const;
  // The same bytes in the segment's writable view. Fails with Internal if the daemon sent
  // none. Thread-safe.
  Result<std::byte*> ResolveWritable(uint32_t index, uint64_t offset, uint64_t size) const;

 private:
  struct Entry {
    bool announced = false;
    Mapping readable;
    Mapping writable;  // empty until the daemon sends the segment writable
    Status error;      // why mapping the read-only view failed, if it did
    Status writable_error;
  };
  // The entry of `index` if the range is inside it; mu_ held.
  Result<const Entry*> Check(uint32_t index, uint64_t offset, uint64_t size) const;

  mutable std::mutex mu_;
  std::vector<Entry> table_;  // indexed by segment index
};

}  // namespace depot::internal
