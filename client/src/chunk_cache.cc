#include "chunk_cache.h"

#include <pthread.h>

#include <map>
#include <mutex>

namespace depot::internal {

namespace {

struct Cache {
  // Held across a whole import, and by fork (below), so a child never inherits it locked.
  std::mutex mu;
  std::map<ChunkKey, std::weak_ptr<ImportedChunk>> chunks;  // guarded by mu
};

// Never destroyed: connections may outlive static destruction order at exit.
Cache& TheCache() {
  static Cache* cache = new Cache;
  return *cache;
}

// fork() takes the lock first, so no other thread holds it in the child, where the entries
// are forgotten: the parent's CUDA mappings are not valid there.
[[maybe_unused]] const int kForkHandlers =
    pthread_atfork([] { TheCache().mu.lock(); }, [] { TheCache().mu.unlock(); },
                   [] {
                     Cache& cache = TheCache();
                     cache.chunks.clear();
                     cache.mu.unlock();
                   });

}  // namespace

Result<std::shared_ptr<ImportedChunk>> ImportChunkOnce(
    const ChunkKey& key, const std::function<Result<std::unique_ptr<ImportedChunk>>()>& import) {
  Cache& cache = TheCache();
  std::lock_guard lock(cache.mu);
  std::weak_ptr<ImportedChunk>& entry = cache.chunks[key];
  if (auto mapped = entry.lock()) return mapped;
  DEPOT_ASSIGN_OR_RETURN(std::unique_ptr<ImportedChunk> imported, import());
  std::shared_ptr<ImportedChunk> chunk = std::move(imported);
  entry = chunk;
  // Drop entries whose chunks are gone, so the map does not grow with daemon restarts.
  std::erase_if(cache.chunks, [](const auto& e) { return e.second.expired(); });
  return chunk;
}

}  // namespace depot::internal
