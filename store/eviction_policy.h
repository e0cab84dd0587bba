// Which copies may go to make room, and in which order: per tier, a least-recently-used list
// of the replicas that nobody holds.
//
// A replica is a candidate on its tier when its object is sealed and not deleted, its bytes
// are ready and nobody holds a reference to it there (nor, in host memory, a lease), except
// the task graph where its reference can move (GraphHoldMoves): the last copy of an object
// that tasks wait to read may spill, from a GPU to host memory and from there to disk, the
// graph's reference going with it; it never goes for good. What going
// means depends on the rest of the object: a replica with a ready copy elsewhere is dropped (the
// object stays); the last copy of an object in host memory spills to disk when there is a spill
// directory, else is evicted with the object, unless the object is pinned or held on some tier;
// the last copy on a GPU spills to host memory; the last copy on disk is dropped for good (the
// spill limit is reached). A failed object (no bytes), one created with spill=false, and one
// larger than the spill limit are never spilled: they are evicted. The policy keeps the
// candidates and says what each would do; which of them go for a given need is the
// EvictionPlanner's to choose (eviction_planner.h), and the store carries that out and tells
// the policy of every change (Reconsider).
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "store/lru_list.h"
#include "store/object_table.h"
#include "store/tier_pool.h"

namespace depot::store {

class EvictionPolicy {
 public:
  // `pools`: by tier, host first (tier t at index t + 1), the disk last if there is one
  // (Tiers::Pools); they size the candidates' blocks. `host_spills`: the last copy in host
  // memory spills to disk rather than going.
  EvictionPolicy(const ObjectTable& table, std::span<TierPool* const> pools, bool host_spills);

  enum class Action : uint8_t {
    kNone,   // not a candidate
    kDrop,   // drop this copy: the object has another
    kEvict,  // the object goes with its last copy (host memory, or disk)
    kSpill,  // copy it to the tier below first (a GPU's to host memory, host memory's to disk)
  };
  // What making room with the replica of `slot` on `tier` would do, as the table is now.
  Action ActionFor(uint32_t slot, int32_t tier) const;
  // Whether a copy on `tier` that the task graph alone holds may spill, the graph's
  // reference moving with it: a GPU's, and host memory's where it spills to disk.
  bool GraphHoldMoves(int32_t tier) const {
    return tier != kDisk && (tier != kHost || host_spills_);
  }

  // Puts each replica of the object in `slot` in, or takes it out of, its tier's candidates,
  // as ActionFor says now. A replica that stays a candidate keeps its place in the order.
  void Reconsider(uint32_t slot);
  // Takes the replica on `tier` out of the candidates (before it goes, while the table still
  // has it).
  void Withdraw(uint32_t slot, int32_t tier);
  // Makes the replica on `tier`, if a candidate, the most recently used one.
  void Touch(uint32_t slot, int32_t tier);

  // The candidates on `tier`, least recently used first.
  const LruList& candidates(int32_t tier) const { return lists_[Index(tier)]; }
  // Bytes of the candidates' blocks in one region of a tier.
  uint64_t candidate_bytes(int32_t tier, uint32_t region) const;
  // Whether freeing candidates in the region of the replica of `slot` on `tier` can ever make
  // room for a block of `bytes` there: its free bytes and its candidates' together are
  // enough. A create that cannot fit anyway must not empty the cache on its way to failing.
  bool WorthFreeing(uint32_t slot, int32_t tier, uint64_t bytes) const;
  // The pool of `tier`, which sizes its candidates' blocks.
  const TierPool& pool(int32_t tier) const { return *pools_[Index(tier)]; }

 private:
  size_t Index(int32_t tier) const {
    return tier == kDisk ? pools_.size() - 1 : static_cast<size_t>(tier + 1);
  }
  uint64_t BlockBytes(uint32_t slot, int32_t tier) const;
  void Add(uint32_t slot, const Replica& replica);

  const ObjectTable& table_;
  std::vector<TierPool*> pools_;
  const bool host_spills_;
  std::vector<LruList> lists_;  // by tier
  // By tier, by region: bytes of candidates, for regions that have any.
  std::vector<std::unordered_map<uint32_t, uint64_t>> region_bytes_;
};

}  // namespace depot::store
