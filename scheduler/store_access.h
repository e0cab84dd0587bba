// What the scheduler needs of the store, declared here and implemented by store/
// (store/scheduler_store.h); the scheduler's unit tests implement it with a fake.
//
// The scheduler never includes store/ headers: it sees objects as ids with a state, a size
// and the tiers holding them, asks for replicas and references, seals failed outputs, and is
// told of seals and frees through ObjectEvents. Everything runs on the daemon's loop thread.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "depot/object_id.h"
#include "depot/status.h"
#include "scheduler/placement.h"

namespace depot::scheduler {

// The longest failure message the scheduler keeps for a task (a worker's text is cut to it).
inline constexpr size_t kMaxFailureMessage = 4096;

class StoreAccess {
 public:
  virtual ~StoreAccess() = default;

  enum class State : uint8_t {
    kMissing,   // no such object (never created, or gone)
    kCreating,  // created, not sealed yet
    kSealed,    // sealed with its bytes
    kFailed,    // sealed as failed (SealFailed): a get answers TaskFailed with its message
  };
  struct Object {
    State state = State::kMissing;
    InputView where;  // for kSealed: bytes (data and metadata) and the tiers holding them
  };
  // The state of each of `ids`, in order (`out` has as many entries as `ids`).
  virtual void Locate(std::span<const ObjectId> ids, std::span<Object> out) const = 0;
  // The message a kFailed object was sealed with; empty for any other.
  virtual std::string FailureOf(const ObjectId& id) const = 0;

  // Starts making a replica on `device` (kHostMemory or a GPU) of each of `ids` that has none
  // there and is sealed. Holds nothing and reports nothing: a copy that fails or does not fit
  // is made, or refused, again by the worker's own get.
  virtual void Prefetch(std::span<const ObjectId> ids, int32_t device) = 0;

  // One reference on behalf of the task graph to the sealed (or failed) object `id`, so it is
  // neither evicted nor freed until Drop; false, holding nothing, if it is not sealed. Holds
  // nest: each Hold needs its Drop.
  virtual bool Hold(const ObjectId& id) = 0;
  virtual void Drop(const ObjectId& id) = 0;

  // Aborts those of `ids` that the session `creator` is creating (a worker's partial outputs
  // of a task that failed), as its own abort would.
  virtual void AbortCreating(uint64_t creator, std::span<const ObjectId> ids) = 0;

  // Counts `bytes` more (negative: fewer) of daemon memory against the client `session`'s
  // account for requests in progress; LimitExceeded, counting nothing, past its limit or the
  // daemon's budget. Giving back for a session that has gone does nothing.
  virtual Status Charge(uint64_t session, int64_t bytes) = 0;

  // Seals each of `ids` that does not exist as a failed object carrying `message` (at most
  // kMaxFailureMessage bytes). Ids that exist (sealed by a worker before it failed, or being
  // created by some client) are left as they are.
  virtual void SealFailed(std::span<const ObjectId> ids, std::string_view message) = 0;

  // Deletes `id` as a client's delete would (it goes once nobody holds it); nothing for an
  // object that does not exist or is not sealed.
  virtual void Delete(const ObjectId& id) = 0;

  // The bandwidths of the store's own copies between tiers as measured so far; `assumed`'s
  // for those not measured yet.
  virtual Bandwidths CopyBandwidths(const Bandwidths& assumed) const = 0;

  // Bytes an object could be given on `device` now without evicting anything a client or
  // the graph holds: free memory of the tier's limit plus what unreferenced objects use.
  virtual uint64_t Room(int32_t device) const = 0;

  // Whether the store has a disk tier that objects can leave memory for (Spill).
  virtual bool CanSpill() const = 0;
  // Starts moving the sealed object `id` out of memory to disk, the graph's reference going
  // with it: a graph's memory bound makes room so (Bounds). True when its bytes are leaving
  // memory (a copy to disk under way, or its memory copy dropped now beside a ready disk
  // copy: ObjectEvents::OnMemory follows); false when they cannot now (no disk tier, a
  // client holds it, a GPU's copy, the disk failing, already out of memory).
  virtual bool Spill(const ObjectId& id) = 0;
};

// What the store tells the scheduler, after the change (StoreAccess calls are allowed).
class ObjectEvents {
 public:
  virtual ~ObjectEvents() = default;
  // `id` is sealed, with its bytes (`failed`: false) or as a failed object (true).
  virtual void OnSealed(const ObjectId& id, bool failed) = 0;
  // `id` is gone: deleted, evicted or aborted.
  virtual void OnFreed(const ObjectId& id) = 0;
  // A copy of `id` came into memory (host or a GPU: `in_memory` true, perhaps when it had
  // one already), or its last copy in memory went while it stays on disk (false).
  virtual void OnMemory(const ObjectId& id, bool in_memory) = 0;
};

}  // namespace depot::scheduler
