// The GPU chunks mapped in this process, shared by all its connections to one daemon.
//
// A chunk is imported once per process, not once per connection: a second Client to the
// same daemon gets the mapping the first made (no driver call, the same device pointers),
// and a legacy IPC handle, which the driver lets a process open only once, works from any
// number of connections. Entries are keyed by the daemon's epoch (random per start, so a
// restarted daemon's chunk 0 is not mistaken for the old one), its GPU index and the chunk's
// index, and live while some connection holds them. A forked child starts with none: CUDA
// mappings do not survive fork.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "depot/status.h"
#include "device_import.h"

namespace depot::internal {

struct ChunkKey {
  uint64_t epoch = 0;
  int32_t device = 0;  // the daemon's GPU index
  uint32_t chunk = 0;
  bool writable = false;  // the read-write mapping of the chunk (a writer's), or read-only
  auto operator<=>(const ChunkKey&) const = default;
};

// The mapping of `key`: the one some connection of this process holds, else the one
// `import` makes, which is then recorded for the others. Imports run one at a time, so two
// connections never import the same chunk at once. Thread-safe.
Result<std::shared_ptr<ImportedChunk>> ImportChunkOnce(
    const ChunkKey& key, const std::function<Result<std::unique_ptr<ImportedChunk>>()>& import);

}  // namespace depot::internal
