#include "chunk_cache.h"

#include <map>
#include <mutex>

namespace depot::internal {

namespace {

struct Cache {
  std::mutex mu;
  std::map<ChunkKey, std::weak_ptr<ImportedChunk>> chunks;  // guarded by mu
};

// Never destroyed: connections may outlive static destruction order at exit.
Cache& TheCache() {
  static Cache* cache = new Cache;
  return *cache;
}

}  // namespace

std::shared_ptr<ImportedChunk> FindImportedChunk(const ChunkKey& key) {
  Cache& cache = TheCache();
  std::lock_guard lock(cache.mu);
  auto it = cache.chunks.find(key);
  if (it == cache.chunks.end()) return nullptr;
  if (auto chunk = it->second.lock()) return chunk;
  cache.chunks.erase(it);
  return nullptr;
}

std::shared_ptr<ImportedChunk> ShareImportedChunk(const ChunkKey& key,
                                                  std::shared_ptr<ImportedChunk> chunk) {
  Cache& cache = TheCache();
  std::lock_guard lock(cache.mu);
  std::weak_ptr<ImportedChunk>& entry = cache.chunks[key];
  if (auto first = entry.lock()) return first;
  // Drop entries whose chunks are gone, so the map does not grow with daemon restarts.
  std::erase_if(cache.chunks, [](const auto& e) { return e.second.expired(); });
  cache.chunks[key] = chunk;
  return chunk;
}

}  // namespace depot::internal
