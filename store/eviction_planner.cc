#include "store/eviction_planner.h"

#include <unordered_map>
#include <utility>
#include <vector>

namespace depot::store {

EvictionPlanner::EvictionPlanner(const ObjectTable& table, const EvictionPolicy& policy,
                                 const Arena& arena)
    : table_(table), policy_(policy), arena_(arena) {}

EvictionPlanner::Plan::Plan(const EvictionPlanner& planner, Filter filter)
    : planner_(planner),
      filter_(std::move(filter)),
      list_(planner.policy_.candidates(filter_.tier)),
      at_(list_.front()) {}

bool EvictionPlanner::Emptiable(uint32_t segment) const {
  return arena_.free_bytes(segment) + policy_.candidate_bytes(kHost, segment) >=
         arena_.segment_bytes(segment);
}

bool EvictionPlanner::SegmentsCouldHold(uint64_t bytes) const {
  uint64_t could = arena_.capacity() - arena_.mapped_bytes();
  for (const uint32_t segment : arena_.segments_in_use()) {
    if (Emptiable(segment)) could += arena_.segment_bytes(segment);
  }
  return could >= arena_.BlockSize(bytes);
}

std::optional<uint32_t> EvictionPlanner::SegmentToEmpty(const Filter& filter) const {
  Plan plan = Require(filter);
  while (auto victim = plan.Next()) {
    if (Emptiable(victim->region)) return victim->region;
  }
  return std::nullopt;
}

std::optional<uint32_t> EvictionPlanner::SegmentOfAnotherClass(uint64_t bytes,
                                                               uint32_t writers) const {
  if (!arena_.HasOtherClass(writers)) return std::nullopt;
  // Another class's segment is of use only empty (it then gets a new file), so only one
  // whose every object may go now counts, and only one goes, so that one create does not
  // thin out the cache of several. Not one whose new file a worker still prepares, which
  // cannot change hands yet.
  std::unordered_map<uint32_t, uint64_t> can_go;  // bytes of each such segment that may go now
  std::vector<uint32_t> order;                    // in LRU order of their first victim
  const uint64_t block = arena_.BlockSize(bytes);
  Plan plan = Require({.tier = kHost, .actions = kAtOnce});
  while (auto victim = plan.Next()) {
    const uint32_t segment = victim->region;
    if (Arena::IsDedicated(segment) || arena_.writers(segment) == writers ||
        block > arena_.segment_bytes(segment) || !arena_.can_change_hands(segment)) {
      continue;
    }
    auto [it, first] = can_go.try_emplace(segment, 0);
    if (first) order.push_back(segment);
    it->second += victim->bytes;
  }
  for (const uint32_t segment : order) {
    if (arena_.free_bytes(segment) + can_go[segment] >= arena_.segment_bytes(segment)) {
      return segment;
    }
  }
  return std::nullopt;
}

}  // namespace depot::store
