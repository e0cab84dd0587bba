#include "store/object_table.h"

#include <algorithm>

#include "depot/ipc/units.h"

namespace depot::store {

Replica* ReplicaSet::FindMore(int32_t tier) {
  if (more_) {
    for (Replica& r : more_->copies) {
      if (r.tier == tier) return &r;
    }
  }
  return nullptr;
}

Replica& ReplicaSet::Add(const Replica& replica) {
  if (empty()) return first_ = replica;
  return More().copies.emplace_back(replica);
}

void ReplicaSet::Remove(int32_t tier) {
  if (first_.tier == tier) {
    if (more_ && !more_->copies.empty()) {
      first_ = more_->copies.back();
      more_->copies.pop_back();
    } else {
      first_.tier = kNone;
    }
    return;
  }
  if (more_) {
    std::erase_if(more_->copies, [tier](const Replica& r) { return r.tier == tier; });
  }
}

uint32_t ObjectTable::Find(const ObjectId& id) const {
  auto it = index_.find(id);
  return it == index_.end() ? HeaderTable::kNoSlot : it->second;
}

void ObjectTable::Insert(uint32_t slot, const NewObject& n) {
  if (slot >= objects_.size()) objects_.resize(std::max<size_t>(slot + 1, objects_.size() * 2));
  Object& o = objects_[slot];
  o = Object{};
  o.creator = n.creator;
  o.owner = n.owner;
  o.want_checksum = n.checksum;
  auto& h = headers_.at(slot);
  h.id_lo = n.id.lo();
  h.id_hi = n.id.hi();
  h.data_size = n.data_size;
  h.metadata_size = n.metadata_size;
  h.flags.store(
      (n.pin ? uint32_t{ipc::kFlagPinned} : 0u) | (n.spill ? 0u : uint32_t{ipc::kFlagNoSpill}),
      std::memory_order_relaxed);
  h.checksum = 0;
  h.create_time_ns = h.access_time_ns = ipc::WallNanos();
  h.tiers.store(0, std::memory_order_relaxed);
  headers_.SetStateRefs(slot, ipc::ObjectState::kCreating, 0);
  index_.emplace(n.id, slot);
  if (!n.name.empty()) names_.emplace(slot, std::string(n.name));
}

void ObjectTable::Remove(uint32_t slot) {
  index_.erase(IdAt(slot));
  names_.erase(slot);
  if (objects_[slot].failed) failures_.erase(slot);
  objects_[slot] = Object{};
  headers_.Release(slot);
}

void ObjectTable::SetFailed(uint32_t slot, std::shared_ptr<const std::string> message) {
  objects_[slot].failed = true;
  failures_[slot] = std::move(message);
}

const std::shared_ptr<const std::string>& ObjectTable::FailureOf(uint32_t slot) const {
  static const std::shared_ptr<const std::string> kNone;
  if (!objects_[slot].failed) return kNone;
  return failures_.at(slot);
}

ObjectId ObjectTable::IdAt(uint32_t slot) const {
  const ipc::ObjectHeader& h = headers_.at(slot);
  return ObjectId::FromWords(h.id_lo, h.id_hi);
}

bool ObjectTable::Holds(uint32_t slot, const ObjectId& id) const {
  return slot < headers_.high_water() && headers_.state(slot) != ipc::ObjectState::kFree &&
         IdAt(slot) == id;
}

std::string_view ObjectTable::NameOf(uint32_t slot) const {
  auto it = names_.find(slot);
  return it == names_.end() ? std::string_view() : std::string_view(it->second);
}

Replica& ObjectTable::AddReplica(uint32_t slot, int32_t tier, const TierPool::Block& block) {
  if (tier == kHost) {
    auto& h = headers_.at(slot);
    h.segment = block.region;
    h.offset = block.offset;
  }
  return objects_[slot].replicas.Add(
      Replica{.region = block.region, .handle = block.handle, .tier = static_cast<int8_t>(tier)});
}

bool ObjectTable::HasOtherCopy(uint32_t slot, int32_t tier) const {
  bool other = false;
  objects_[slot].replicas.ForEach(
      [&](const Replica& r) { other = other || (r.tier != tier && r.ready); });
  return other;
}

uint64_t ObjectTable::TiersOf(uint32_t slot) const {
  uint64_t tiers = 0;
  objects_[slot].replicas.ForEach([&](const Replica& r) {
    if (r.ready) tiers |= BitOf(r.tier);
  });
  return tiers;
}

void ObjectTable::PublishTiers(uint32_t slot) {
  headers_.at(slot).tiers.store(TiersOf(slot), std::memory_order_relaxed);
  headers_.Publish(slot);
}

ObjectTable::Page ObjectTable::List(uint32_t start, uint32_t limit, uint32_t max_scan,
                                    Filter filter) const {
  Page page;
  uint32_t slot = start;
  const uint32_t end = headers_.high_water();
  const uint32_t stop = end - std::min(start, end) > max_scan ? start + max_scan : end;
  for (; slot < stop && page.slots.size() < limit; ++slot) {
    const ipc::ObjectState state = headers_.state(slot);
    if (state == ipc::ObjectState::kFree) continue;
    if (filter == Filter::kVerifiable &&
        (state != ipc::ObjectState::kSealed || IsDeletePending(slot) ||
         !(headers_.at(slot).flags & ipc::kFlagHasChecksum))) {
      continue;
    }
    page.slots.push_back(slot);
  }
  page.next = slot;
  page.done = slot >= end;
  return page;
}

}  // namespace depot::store
