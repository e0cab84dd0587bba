#include "store/scheduler_store.h"

#include <unistd.h>

#include <vector>

namespace depot::store {

SchedulerStore::SchedulerStore(ObjectStore& store, scheduler::ObjectEvents& events)
    : store_(store), events_(events) {
  store_.AddClient(kSchedulerClient, ::getuid());
  store_.Subscribe(this);
}

SchedulerStore::~SchedulerStore() {
  store_.Unsubscribe(this);
  store_.RemoveClient(kSchedulerClient);
}

void SchedulerStore::Locate(std::span<const ObjectId> ids, std::span<Object> out) const {
  const std::vector<Placement> placements = store_.Locate(ids);
  for (size_t i = 0; i < ids.size(); ++i) {
    const Placement& p = placements[i];
    Object& o = out[i];
    o.where = {};
    if (p.failed) {
      o.state = State::kFailed;
    } else if (p.found) {
      o.state = State::kSealed;
      o.where = {.bytes = p.data_size + p.metadata_size, .tiers = p.tiers};
    } else {
      o.state = p.creating ? State::kCreating : State::kMissing;
    }
  }
}

std::string SchedulerStore::FailureOf(const ObjectId& id) const { return store_.FailureOf(id); }

void SchedulerStore::Prefetch(std::span<const ObjectId> ids, int32_t device) {
  // The answer, whenever it comes, is not needed: the copies stay whatever it says.
  Status st = store_.Prefetch(kSchedulerClient, std::vector<ObjectId>(ids.begin(), ids.end()),
                              device, [](std::vector<GetResult>) {});
  static_cast<void>(st);  // an unknown device, or too much waiting: nothing to prefetch
}

bool SchedulerStore::Hold(const ObjectId& id) {
  if (auto it = held_.find(id); it != held_.end()) {
    // Held anew only while it is not deleted, as a first Hold would be.
    if (!store_.Locate(std::span(&id, 1))[0].found) return false;
    ++it->second;
    return true;
  }
  if (store_.Hold(kSchedulerClient, id) == ObjectStore::kAnyTier) return false;
  held_[id] = 1;
  return true;
}

void SchedulerStore::Drop(const ObjectId& id) {
  auto it = held_.find(id);
  if (it == held_.end() || --it->second > 0) return;
  held_.erase(it);
  // One reference, on whichever copy it is now (it moves down the tiers as the object spills).
  store_.ReleaseGraphHold(id);
}

void SchedulerStore::SealFailed(std::span<const ObjectId> ids, std::string_view message) {
  store_.SealFailed(kSchedulerClient, ids, message);
}

void SchedulerStore::Delete(const ObjectId& id) { (void)store_.Delete(std::span(&id, 1)); }

uint64_t SchedulerStore::Room(int32_t device) const { return store_.Room(device); }

bool SchedulerStore::CanSpill() const { return store_.disk() != nullptr; }

bool SchedulerStore::Spill(const ObjectId& id) { return store_.SpillToDisk(id); }

void SchedulerStore::OnSealed(const ObjectId& id, uint64_t /*tiers*/) {
  events_.OnSealed(id, /*failed=*/false);
}

void SchedulerStore::OnSealedFailed(const ObjectId& id) { events_.OnSealed(id, /*failed=*/true); }

void SchedulerStore::OnFreed(const ObjectId& id) { events_.OnFreed(id); }

void SchedulerStore::OnReplicaReady(const ObjectId& id, int32_t /*tier*/) {
  events_.OnMemory(id, /*in_memory=*/true);  // the store tells of no copy ready on disk
}

void SchedulerStore::OnLeftMemory(const ObjectId& id) { events_.OnMemory(id, false); }

scheduler::Bandwidths SchedulerStore::CopyBandwidths(const scheduler::Bandwidths& assumed) const {
  const CopyRates& measured = store_.copy_rates();
  const auto pick = [](double rate, double otherwise) { return rate > 0 ? rate : otherwise; };
  return {.host_to_gpu = pick(measured.host_to_gpu, assumed.host_to_gpu),
          .gpu_to_host = pick(measured.gpu_to_host, assumed.gpu_to_host),
          .gpu_to_gpu = pick(measured.gpu_to_gpu, assumed.gpu_to_gpu)};
}

void SchedulerStore::AbortCreating(uint64_t creator, std::span<const ObjectId> ids) {
  for (const ObjectId& id : ids) {
    // NotFound, AlreadySealed, NotHeld: not a partial output of that session's.
    (void)store_.Abort(creator, id);
  }
}

Status SchedulerStore::Charge(uint64_t session, int64_t bytes) {
  Status st = store_.ChargeRequests(session, bytes);
  return bytes < 0 ? Status::OK() : st;  // a session that has gone took its account along
}

}  // namespace depot::store
