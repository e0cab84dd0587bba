#include "store/eviction_policy.h"

namespace depot::store {

EvictionPolicy::EvictionPolicy(const ObjectTable& table, std::span<TierPool* const> pools,
                               bool host_spills)
    : table_(table),
      pools_(pools.begin(), pools.end()),
      host_spills_(host_spills),
      lists_(pools.size()),
      region_bytes_(pools.size()) {}

EvictionPolicy::Action EvictionPolicy::ActionFor(uint32_t slot, int32_t tier) const {
  const Object& o = table_.at(slot);
  const Replica* r = o.replicas.Find(tier);
  if (r == nullptr || !table_.IsUsable(slot) || o.sealing || !r->ready || r->spilling ||
      r->held_here(GraphHoldMoves(tier)) || (tier == kHost && o.leased)) {
    return Action::kNone;
  }
  // Referenced by the task graph alone, where its reference may move: a last copy spills,
  // the reference going with it; one with another copy stays, its reference with it.
  const bool graph_held = r->refs != 0;
  if (table_.HasOtherCopy(slot, tier)) return graph_held ? Action::kNone : Action::kDrop;
  if (tier != kHost && tier != kDisk) return Action::kSpill;
  const bool held = !graph_held && table_.headers().refs(slot) != 0;
  if (held || table_.IsPinned(slot)) return Action::kNone;
  // The disk is the last pool (Tiers::Pools): an object larger than the spill limit is
  // evicted, since no spill of it can ever succeed.
  const bool spills = host_spills_ && !o.failed && !table_.IsNoSpill(slot) &&
                      pools_.back()->CouldFit(table_.BytesOn(slot, kDisk));
  if (tier == kHost && spills) return Action::kSpill;
  return graph_held ? Action::kNone : Action::kEvict;
}

uint64_t EvictionPolicy::BlockBytes(uint32_t slot, int32_t tier) const {
  return pools_[Index(tier)]->BlockSize(table_.BytesOn(slot, tier));
}

void EvictionPolicy::Add(uint32_t slot, const Replica& replica) {
  region_bytes_[Index(replica.tier)][replica.region] += BlockBytes(slot, replica.tier);
  lists_[Index(replica.tier)].PushBack(slot);
}

void EvictionPolicy::Withdraw(uint32_t slot, int32_t tier) {
  LruList& list = lists_[Index(tier)];
  if (!list.contains(slot)) return;
  list.Remove(slot);
  // Regions with no candidates are forgotten: dedicated segments come and go.
  auto& bytes = region_bytes_[Index(tier)];
  auto it = bytes.find(table_.FindReplica(slot, tier)->region);
  it->second -= BlockBytes(slot, tier);
  if (it->second == 0) bytes.erase(it);
}

void EvictionPolicy::Reconsider(uint32_t slot) {
  table_.at(slot).replicas.ForEach([&](const Replica& r) {
    const bool candidate = ActionFor(slot, r.tier) != Action::kNone;
    const bool listed = lists_[Index(r.tier)].contains(slot);
    if (!candidate && listed) {
      Withdraw(slot, r.tier);
    } else if (candidate && !listed) {
      Add(slot, r);
    }
  });
}

void EvictionPolicy::Touch(uint32_t slot, int32_t tier) {
  if (!lists_[Index(tier)].contains(slot)) return;
  Withdraw(slot, tier);
  Add(slot, *table_.FindReplica(slot, tier));
}

uint64_t EvictionPolicy::candidate_bytes(int32_t tier, uint32_t region) const {
  const auto& bytes = region_bytes_[Index(tier)];
  auto it = bytes.find(region);
  return it == bytes.end() ? 0 : it->second;
}

bool EvictionPolicy::WorthFreeing(uint32_t slot, int32_t tier, uint64_t bytes) const {
  const uint32_t region = table_.FindReplica(slot, tier)->region;
  const TierPool& pool = *pools_[Index(tier)];
  return pool.free_bytes(region) + candidate_bytes(tier, region) >= pool.BlockSize(bytes);
}

}  // namespace depot::store
