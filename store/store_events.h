// What the store tells a listener inside the daemon (the scheduler): an object was sealed
// (with its bytes, or as failed), a copy of one became ready on a tier, its last copy in
// memory went (it stays on disk), an object was freed.
//
// Events are delivered on the loop thread after the change that caused them is complete
// (through Executor::Defer), so a listener may call into the store. They cost nothing while
// nobody listens.
#pragma once

#include <cstdint>

#include "depot/object_id.h"

namespace depot::store {

class StoreListener {
 public:
  virtual ~StoreListener() = default;
  // `id` is sealed; its bytes are on `tiers` (ObjectHeader::tiers bits).
  virtual void OnSealed(const ObjectId& /*id*/, uint64_t /*tiers*/) {}
  // `id` is sealed as failed (ObjectStore::SealFailed): it has no bytes, and a get of it
  // answers TaskFailed with its message.
  virtual void OnSealedFailed(const ObjectId& /*id*/) {}
  // A copy of `id` is ready on `tier` (a copy for a get or a prefetch, or a spill).
  virtual void OnReplicaReady(const ObjectId& /*id*/, int32_t /*tier*/) {}
  // The last copy of `id` in memory (host or a GPU) went; its bytes stay on disk.
  virtual void OnLeftMemory(const ObjectId& /*id*/) {}
  // `id` is gone: deleted, evicted or aborted.
  virtual void OnFreed(const ObjectId& /*id*/) {}
};

}  // namespace depot::store
