// The store as the scheduler sees it: scheduler::StoreAccess implemented over ObjectStore,
// and the store's events passed on as scheduler::ObjectEvents.
//
// The task graph is a client of the store of its own, kSchedulerClient: the references it
// holds (Hold) are that client's, so `depotctl show` names the graph as a holder, and the
// failed objects it seals are that client's creations, counted against its metadata
// account. Everything runs on the daemon's loop thread.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>

#include "depot/object_id.h"
#include "scheduler/store_access.h"
#include "store/object_store.h"
#include "store/store_events.h"

namespace depot::store {

class SchedulerStore final : public scheduler::StoreAccess, private StoreListener {
 public:
  // Opens kSchedulerClient's account in `store` (with the daemon's uid) and subscribes to
  // its events, which go to `events` from then on. Both must outlive this object. One
  // SchedulerStore per store: there is one kSchedulerClient.
  SchedulerStore(ObjectStore& store, scheduler::ObjectEvents& events);
  // Unsubscribes, and gives back every reference the graph still holds (closing the
  // account, as a session's end does). Failed objects it made stay.
  ~SchedulerStore() override;
  SchedulerStore(const SchedulerStore&) = delete;
  SchedulerStore& operator=(const SchedulerStore&) = delete;

  // scheduler::StoreAccess; the contracts are in scheduler/store_access.h.
  //
  // A kSealed object's InputView has bytes = data + metadata and the tiers with ready
  // bytes. A deleted object that is still referenced is kMissing, as a get would find it.
  void Locate(std::span<const ObjectId> ids, std::span<Object> out) const override;
  std::string FailureOf(const ObjectId& id) const override;
  // Ids that are missing, failed or unknown devices are ignored, and no answer is awaited:
  // an object that goes while its copy is under way simply gets no replica.
  void Prefetch(std::span<const ObjectId> ids, int32_t device) override;
  // One reference an object, however many Holds nest: to its host replica when ready there,
  // else to the lowest GPU's holding it ready, else the disk's. It pins no memory a spill
  // could free: a GPU's copy spills to host memory, and host memory's to disk where there is
  // a spill directory, the reference moving down with it (ObjectStore::MoveGraphHold), so
  // that tasks waiting their turn pin neither. The last Drop gives it back; Drop of an
  // object the graph does not hold does nothing.
  bool Hold(const ObjectId& id) override;
  void Drop(const ObjectId& id) override;
  void SealFailed(std::span<const ObjectId> ids, std::string_view message) override;
  void AbortCreating(uint64_t creator, std::span<const ObjectId> ids) override;
  void Delete(const ObjectId& id) override;
  // ObjectStore::ChargeRequests, the limits of the metadata (--client-max-metadata,
  // --metadata-budget).
  Status Charge(uint64_t session, int64_t bytes) override;
  // ObjectStore::Room: the tier's limit less what references, creates (and, in host memory,
  // pinned objects) take; 0 for a device the store does not have.
  uint64_t Room(int32_t device) const override;
  // Whether the daemon has a spill directory; ObjectStore::SpillToDisk.
  bool CanSpill() const override;
  bool Spill(const ObjectId& id) override;
  // ObjectStore::copy_rates, where measured.
  scheduler::Bandwidths CopyBandwidths(const scheduler::Bandwidths& assumed) const override;

 private:
  // StoreListener, passed on to `events_`.
  void OnSealed(const ObjectId& id, uint64_t tiers) override;
  void OnSealedFailed(const ObjectId& id) override;
  void OnFreed(const ObjectId& id) override;
  void OnReplicaReady(const ObjectId& id, int32_t tier) override;
  void OnLeftMemory(const ObjectId& id) override;

  ObjectStore& store_;
  scheduler::ObjectEvents& events_;
  std::unordered_map<ObjectId, uint32_t> held_;  // the objects held, by their Holds not dropped
};

}  // namespace depot::store
