// The GPU chunks mapped in this process, shared by all its connections to one daemon.
//
// A chunk is imported once per process, not once per connection: a second Client to the
// same daemon gets the mapping the first made (no driver call, the same device pointers),
// and a legacy IPC handle, which the driver lets a process open only once, works from any
// number of connections. Entries are keyed by the daemon's epoch (random per start, so a
// restarted daemon's chunk 0 is not mistaken for the old one), its GPU index and the chunk's
// index, and live while some connection holds them.
#pragma once

#include <cstdint>
#include <memory>

#include "device_import.h"

namespace depot::internal {

struct ChunkKey {
  uint64_t epoch = 0;
  int32_t device = 0;  // the daemon's GPU index
  uint32_t chunk = 0;
  auto operator<=>(const ChunkKey&) const = default;
};

// The chunk if some connection of this process holds it mapped; null otherwise.
std::shared_ptr<ImportedChunk> FindImportedChunk(const ChunkKey& key);

// Records `chunk` as the mapping of `key` and returns it, or, if another connection
// recorded one first, returns that one (and `chunk` is unmapped). Thread-safe.
std::shared_ptr<ImportedChunk> ShareImportedChunk(const ChunkKey& key,
                                                  std::shared_ptr<ImportedChunk> chunk);

}  // namespace depot::internal
