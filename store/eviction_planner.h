// The one place that decides which copies go to make room, on every tier and for every
// reason: a create or a copy that needs room (host memory evicts, a GPU and the disk drop),
// spills (a GPU's to host memory, host memory's to disk, and writes to disk ahead of need),
// a header slot or the metadata budget (whole objects), and an operator's evict. It answers
// "which candidates free N bytes on tier T, under these filters", as Ray plasma's
// EvictionPolicy::RequireSpace does; the caller (Tiers, ObjectStore) carries the answer out.
//
// Contract:
// - Pure: the planner changes nothing. It reads the EvictionPolicy's candidates (their order
//   and what going means for each, ActionFor), the object table (where each copy is) and the
//   pools (free bytes, block sizes; host memory's segments and their writer classes). So it
//   is tested on its own, with no daemon (eviction_planner_test).
// - Only candidates are ever planned, and only with an action (drop, evict or spill): a copy
//   referenced by a client on its tier, held through a lease, not ready (being created or
//   copied in), spilling, sealing or deleted, and the last copy of an object that is pinned or
//   referenced on any tier, never is (EvictionPolicy). A filter only narrows that set; no
//   filter, and nothing a client sends, widens it.
// - Order: least recently used first, the policy's list order.
// - A Plan is lazy: each Next() looks on from where the last stopped, at the store as it is
//   then, so a caller that carries out each victim before it asks for the next one sees what
//   one walk over the list would. Carrying out a victim may take it off its tier's list (it
//   goes, spills, or a lease found on it makes it no candidate): the plan has already stepped
//   past it. Should the candidate after it leave the list before the next Next(), the plan
//   ends there rather than guess where to go on.
// - Not enough: where room must come from one region or from whole regions, the planner says
//   when the candidates cannot make it (no victim in that region, nullopt, false), so that
//   nothing is evicted for a request that fails anyway.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>

#include "store/arena.h"
#include "store/eviction_policy.h"
#include "store/lru_list.h"
#include "store/object_table.h"

namespace depot::store {

namespace eviction_detail {
constexpr uint8_t Bit(EvictionPolicy::Action a) {
  return static_cast<uint8_t>(1u << static_cast<int>(a));
}
}  // namespace eviction_detail

class EvictionPlanner {
 public:
  using Action = EvictionPolicy::Action;
  // A set of actions, one bit each.
  using Actions = uint8_t;
  static constexpr Actions Of(Action a) { return eviction_detail::Bit(a); }
  // Victims that make room at once: extra copies dropped, last copies evicted.
  static constexpr Actions kAtOnce =
      eviction_detail::Bit(Action::kDrop) | eviction_detail::Bit(Action::kEvict);
  static constexpr Actions kAnyAction = kAtOnce | eviction_detail::Bit(Action::kSpill);
  static constexpr uint64_t kNoLimit = UINT64_MAX;

  // One candidate chosen: the replica of `slot` on `tier`, what making room with it does,
  // the region its block is in and the block's bytes.
  struct Victim {
    uint32_t slot = 0;
    int32_t tier = kHost;
    Action action = Action::kNone;
    uint32_t region = 0;
    uint64_t bytes = 0;
  };

  // Which candidates a plan may choose. Every field narrows; the defaults choose every
  // candidate of `tier`.
  struct Filter {
    int32_t tier = kHost;
    Actions actions = kAnyAction;
    // Only victims in this region (segment, chunk, spill file).
    std::optional<uint32_t> region;
    // Host memory: only victims in segments the class `writers` allocates in once they have
    // room: its own shared segments and dedicated ones (Arena, Writers).
    std::optional<uint32_t> writers;
    // Only victims in regions where freeing candidates can ever make room for a block of
    // these bytes: the region's free and candidate bytes together hold it
    // (EvictionPolicy::WorthFreeing).
    std::optional<uint64_t> room_for;
    // The plan ends once its victims' blocks add up to this many bytes.
    uint64_t bytes = kNoLimit;
    // Candidates looked at, chosen or not, at most: a slice of a long list per call.
    uint32_t most_looks = UINT32_MAX;
    // Victims the caller cannot use now (a copy of it already under way, no room for it on
    // the tier below): passed over.
    std::function<bool(const Victim&)> skip;
  };

  // The victims of one request, least recently used first (see the contract above).
  class Plan {
   public:
    // The next victim, or nullopt when none is left, the plan has its bytes, or it has
    // looked at most_looks candidates.
    std::optional<Victim> Next();
    // Bytes of the victims chosen so far.
    uint64_t bytes() const { return bytes_; }

   private:
    friend class EvictionPlanner;
    Plan(const EvictionPlanner& planner, Filter filter);

    const EvictionPlanner& planner_;
    Filter filter_;
    const LruList& list_;
    uint32_t at_;  // the next candidate to look at
    uint32_t looks_ = 0;
    uint64_t bytes_ = 0;
  };

  // `arena` is host memory, the tier of kHost; the other tiers' pools are the policy's. All
  // must outlive the planner, which keeps references only.
  EvictionPlanner(const ObjectTable& table, const EvictionPolicy& policy, const Arena& arena);

  // The candidates that `filter` chooses, in order.
  Plan Require(Filter filter) const { return Plan(*this, std::move(filter)); }

  // Host memory, for an object of `bytes` larger than a shared segment, which needs capacity
  // rather than room in a segment: whether the capacity not mapped and the segments the
  // candidates could empty whole (dedicated ones, and shared ones that are then retired)
  // are enough for it. Spill candidates count, as the spills will empty their segments.
  bool SegmentsCouldHold(uint64_t bytes) const;
  // Host memory: the segment of the first victim `filter` chooses whose segment the
  // candidates could empty whole (free and candidate bytes together are its size); nullopt
  // if there is none.
  std::optional<uint32_t> SegmentToEmpty(const Filter& filter) const;
  // Host memory, for the class `writers` when it has no room of its own: the shared segment
  // of another class that can be emptied whole at once (its free bytes and the bytes of its
  // victims that go at once are its size), large enough for `bytes` and free to change hands
  // (Arena::can_change_hands); the one of the least recently used such victim first, and
  // only one. nullopt: there is none, and nothing is to go.
  std::optional<uint32_t> SegmentOfAnotherClass(uint64_t bytes, uint32_t writers) const;

 private:
  // The candidate `slot` on the filter's tier as a victim, if the filter chooses it.
  std::optional<Victim> Consider(uint32_t slot, const Filter& filter) const;
  uint64_t BlockBytes(uint32_t slot, int32_t tier) const;
  bool Emptiable(uint32_t segment) const;

  const ObjectTable& table_;
  const EvictionPolicy& policy_;
  const Arena& arena_;
};

// Inline: a create in a full arena walks the candidate list with these, once per candidate.

inline std::optional<EvictionPlanner::Victim> EvictionPlanner::Plan::Next() {
  // The candidate to look at next left the list meanwhile: where it was is lost, so the
  // plan ends (it chooses less, never a copy that is no candidate).
  if (at_ != LruList::kNil && !list_.contains(at_)) at_ = LruList::kNil;
  while (at_ != LruList::kNil && bytes_ < filter_.bytes && looks_ < filter_.most_looks) {
    const uint32_t slot = at_;
    // Stepped past first: carrying the victim out takes it off the list.
    at_ = list_.next(slot);
    ++looks_;
    if (auto victim = planner_.Consider(slot, filter_)) {
      bytes_ += victim->bytes;
      return victim;
    }
  }
  return std::nullopt;
}

inline uint64_t EvictionPlanner::BlockBytes(uint32_t slot, int32_t tier) const {
  return policy_.pool(tier).BlockSize(table_.BytesOn(slot, tier));
}

inline std::optional<EvictionPlanner::Victim> EvictionPlanner::Consider(
    uint32_t slot, const Filter& filter) const {
  const int32_t tier = filter.tier;
  const uint32_t region = table_.FindReplica(slot, tier)->region;
  if (filter.region && region != *filter.region) return std::nullopt;
  if (filter.writers && !Arena::IsDedicated(region) && arena_.writers(region) != *filter.writers) {
    return std::nullopt;
  }
  const Action action = policy_.ActionFor(slot, tier);
  if (action == Action::kNone || (filter.actions & Of(action)) == 0) return std::nullopt;
  if (filter.room_for && !policy_.WorthFreeing(slot, tier, *filter.room_for)) return std::nullopt;
  Victim victim{.slot = slot,
                .tier = tier,
                .action = action,
                .region = region,
                .bytes = BlockBytes(slot, tier)};
  if (filter.skip && filter.skip(victim)) return std::nullopt;
  return victim;
}

}  // namespace depot::store
