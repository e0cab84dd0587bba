// The eviction planner on its own: which candidates it chooses under each filter, in which
// order, and that it says so, choosing nothing, when the candidates cannot make the room.
// Nothing is evicted here: the planner only answers (the tests take a victim off the list
// themselves where a caller would carry it out).
#include "store/eviction_planner.h"

#include <gtest/gtest.h>

#include <vector>

#include "store_parts.h"

namespace depot::store {
namespace {

using Action = EvictionPolicy::Action;
using Filter = EvictionPlanner::Filter;
using testing::Tiers;
constexpr uint64_t kMiB = Tiers::kMiB;

class EvictionPlannerTest : public ::testing::Test {
 protected:
  // A sealed object of `bytes` with a ready replica on each of `on` (in host memory of the
  // class `writers`), nobody holding it.
  uint32_t Sealed(std::initializer_list<int32_t> on, uint64_t bytes = kMiB, bool pin = false,
                  uint32_t writers = Arena::kTrustedWriters) {
    const uint32_t slot = parts_.headers->Acquire();
    table_.Insert(slot,
                  NewObject{.id = ObjectId::FromWords(++next_, 3), .data_size = bytes, .pin = pin});
    for (int32_t tier : on) {
      auto block = tier == kHost ? parts_.arena->Allocate(table_.BytesOn(slot, tier), writers)
                                 : pools_[tier + 1]->Allocate(table_.BytesOn(slot, tier));
      EXPECT_TRUE(block.has_value());
      table_.AddReplica(slot, tier, *block).ready = true;
    }
    parts_.headers->SetStateRefs(slot, ipc::ObjectState::kSealed, 0);
    policy_.Reconsider(slot);
    return slot;
  }
  // Holds the replica on `tier`, as a client's reference does.
  void Hold(uint32_t slot, int32_t tier) {
    table_.FindReplica(slot, tier)->refs++;
    parts_.headers->SetStateRefs(slot, ipc::ObjectState::kSealed, parts_.headers->refs(slot) + 1);
    policy_.Reconsider(slot);
  }
  uint32_t RegionOf(uint32_t slot) const { return table_.FindReplica(slot, kHost)->region; }

  // Every victim of a plan, in order.
  std::vector<uint32_t> Victims(Filter filter) const {
    std::vector<uint32_t> out;
    EvictionPlanner::Plan plan = planner_.Require(std::move(filter));
    while (auto victim = plan.Next()) out.push_back(victim->slot);
    return out;
  }

  // 8 MiB of host memory in 4 MiB segments, one GPU with a 4 MiB pool.
  Tiers parts_{8 * kMiB, 4 * kMiB, 1, 4 * kMiB};
  std::vector<TierPool*> pools_ = parts_.tier_pools();
  ObjectTable table_{*parts_.headers};
  EvictionPolicy policy_{table_, pools_, /*host_spills=*/false};
  EvictionPlanner planner_{table_, policy_, *parts_.arena};
  uint64_t next_ = 0;
};

TEST_F(EvictionPlannerTest, VictimsComeLeastRecentlyUsedFirst) {
  const uint32_t a = Sealed({kHost}), b = Sealed({kHost}), c = Sealed({kHost});
  EXPECT_EQ(Victims({}), (std::vector<uint32_t>{a, b, c}));
  policy_.Touch(a, kHost);  // used again: now the most recently used
  EXPECT_EQ(Victims({}), (std::vector<uint32_t>{b, c, a}));
}

TEST_F(EvictionPlannerTest, APlanEndsOnceItsVictimsFreeTheBytesAsked) {
  const uint32_t a = Sealed({kHost}), b = Sealed({kHost}), c = Sealed({kHost});
  Sealed({kHost});
  EvictionPlanner::Plan plan = planner_.Require({.bytes = 2 * kMiB + 1});
  std::vector<uint32_t> chosen;
  while (auto victim = plan.Next()) {
    EXPECT_EQ(victim->tier, kHost);
    EXPECT_EQ(victim->action, Action::kEvict);
    EXPECT_EQ(victim->bytes, kMiB);
    chosen.push_back(victim->slot);
  }
  EXPECT_EQ(chosen, (std::vector<uint32_t>{a, b, c}));
  EXPECT_EQ(plan.bytes(), 3 * kMiB);
  EXPECT_EQ(Victims({.bytes = 2 * kMiB}), (std::vector<uint32_t>{a, b}));
}

TEST_F(EvictionPlannerTest, EachTierHasItsOwnVictims) {
  const uint32_t host_only = Sealed({kHost});
  const uint32_t gpu_only = Sealed({0});
  const uint32_t both = Sealed({kHost, 0});
  EXPECT_EQ(Victims({.tier = kHost}), (std::vector<uint32_t>{host_only, both}));
  EXPECT_EQ(Victims({.tier = 0}), (std::vector<uint32_t>{gpu_only, both}));
  EvictionPlanner::Plan plan = planner_.Require({.tier = 0});
  EXPECT_EQ(plan.Next()->action, Action::kSpill);  // the GPU's only copy
  EXPECT_EQ(plan.Next()->action, Action::kDrop);   // an extra copy
}

TEST_F(EvictionPlannerTest, TheActionsFilterChoosesWhatMayMakeRoomNow) {
  const uint32_t gpu_only = Sealed({0});
  const uint32_t both = Sealed({kHost, 0});
  EXPECT_EQ(Victims({.tier = 0, .actions = EvictionPlanner::kAtOnce}), std::vector<uint32_t>{both});
  EXPECT_EQ(Victims({.tier = 0, .actions = EvictionPlanner::Of(Action::kSpill)}),
            std::vector<uint32_t>{gpu_only});
  // In host memory, the copy that has another is dropped, not evicted.
  EXPECT_TRUE(Victims({.tier = kHost, .actions = EvictionPlanner::Of(Action::kEvict)}).empty());
  EXPECT_EQ(Victims({.tier = kHost, .actions = EvictionPlanner::Of(Action::kDrop)}),
            std::vector<uint32_t>{both});
}

TEST_F(EvictionPlannerTest, HeldPinnedLeasedOrUnsealedObjectsAreNeverVictims) {
  const uint32_t pinned = Sealed({kHost}, kMiB, /*pin=*/true);
  const uint32_t held = Sealed({kHost});
  Hold(held, kHost);  // a client's reference
  const uint32_t held_on_gpu = Sealed({kHost, 0});
  Hold(held_on_gpu, 0);  // referenced on the GPU: only its host copy may go
  const uint32_t leased = Sealed({kHost});
  table_.at(leased).leased = true;  // a client's lease holds it
  policy_.Reconsider(leased);
  const uint32_t creating = Sealed({kHost});
  parts_.headers->SetStateRefs(creating, ipc::ObjectState::kCreating, 0);
  policy_.Reconsider(creating);
  const uint32_t deleted = Sealed({kHost});
  parts_.headers->at(deleted).flags |= ipc::kFlagDeletePending;
  policy_.Reconsider(deleted);
  const uint32_t spilling = Sealed({0});
  table_.FindReplica(spilling, 0)->spilling = true;
  policy_.Reconsider(spilling);
  const uint32_t free = Sealed({kHost});
  // No filter and no limit: still only the two that may go.
  EXPECT_EQ(Victims({.tier = kHost}), (std::vector<uint32_t>{held_on_gpu, free}));
  EXPECT_TRUE(Victims({.tier = 0}).empty());
  EXPECT_EQ(planner_.Require({.tier = kHost}).Next()->action, Action::kDrop);
  (void)pinned;
  (void)held;
  (void)creating;
}

TEST_F(EvictionPlannerTest, APlanSeesTheStoreAsItIsWhenItGetsThere) {
  const uint32_t a = Sealed({kHost}), b = Sealed({kHost}), c = Sealed({kHost});
  const uint32_t d = Sealed({kHost});
  EvictionPlanner::Plan plan = planner_.Require({});
  EXPECT_EQ(plan.Next()->slot, a);
  policy_.Withdraw(a, kHost);  // the caller carries it out: it leaves the list
  Hold(c, kHost);              // and meanwhile a client takes c
  EXPECT_EQ(plan.Next()->slot, b);
  EXPECT_EQ(plan.Next()->slot, d);
  EXPECT_FALSE(plan.Next().has_value());
}

TEST_F(EvictionPlannerTest, APlanWhoseNextCandidateLeftTheListEnds) {
  const uint32_t a = Sealed({kHost}), b = Sealed({kHost});
  Sealed({kHost});
  EvictionPlanner::Plan plan = planner_.Require({});
  EXPECT_EQ(plan.Next()->slot, a);
  Hold(b, kHost);  // the one it would look at next: where it stood is lost
  EXPECT_FALSE(plan.Next().has_value());
}

TEST_F(EvictionPlannerTest, TheRegionFilterChoosesOneSegment) {
  std::vector<uint32_t> slots;
  for (int i = 0; i < 8; ++i) slots.push_back(Sealed({kHost}));  // two full segments
  ASSERT_EQ(RegionOf(slots[0]), 0u);
  ASSERT_EQ(RegionOf(slots[4]), 1u);
  EXPECT_EQ(Victims({.region = 1u}),
            (std::vector<uint32_t>{slots[4], slots[5], slots[6], slots[7]}));
}

TEST_F(EvictionPlannerTest, RoomForChoosesOnlySegmentsWhereFreeingCanMakeThatRoom) {
  // Segment 0: 3 MiB that may go and a held 1 MiB; segment 1: 4 MiB that may go.
  std::vector<uint32_t> slots;
  for (int i = 0; i < 8; ++i) slots.push_back(Sealed({kHost}));
  Hold(slots[3], kHost);
  ASSERT_EQ(RegionOf(slots[3]), 0u);
  // 3 MiB fit in either: LRU order across both.
  EXPECT_EQ(Victims({.room_for = 3 * kMiB}),
            (std::vector<uint32_t>{slots[0], slots[1], slots[2], slots[4], slots[5], slots[6],
                                   slots[7]}));
  // 4 MiB only in segment 1.
  EXPECT_EQ(Victims({.room_for = 4 * kMiB}),
            (std::vector<uint32_t>{slots[4], slots[5], slots[6], slots[7]}));
  // Not enough anywhere: nothing is chosen.
  Hold(slots[7], kHost);
  EXPECT_TRUE(Victims({.room_for = 4 * kMiB}).empty());
}

TEST_F(EvictionPlannerTest, TheWriterClassFilterKeepsToTheClassAndDedicatedSegments) {
  const uint32_t trusted = Sealed({kHost});
  const uint32_t other = Sealed({kHost}, kMiB, false, /*writers=*/4242);
  ASSERT_NE(RegionOf(trusted), RegionOf(other));
  EXPECT_EQ(Victims({.writers = 4242u}), std::vector<uint32_t>{other});
  EXPECT_EQ(Victims({.writers = Arena::kTrustedWriters}), std::vector<uint32_t>{trusted});
}

TEST(EvictionPlannerDedicatedTest, ADedicatedSegmentsObjectIsAVictimForEveryClass) {
  // 16 MiB in 4 MiB segments: room for an object of a segment of its own.
  Tiers parts{16 * kMiB, 4 * kMiB, 0};
  std::vector<TierPool*> pools = parts.tier_pools();
  ObjectTable table{*parts.headers};
  EvictionPolicy policy{table, pools, /*host_spills=*/false};
  EvictionPlanner planner{table, policy, *parts.arena};
  const uint32_t slot = parts.headers->Acquire();
  table.Insert(slot, NewObject{.id = ObjectId::FromWords(1, 4), .data_size = 5 * kMiB});
  auto block = parts.arena->Allocate(table.BytesOn(slot, kHost));
  ASSERT_TRUE(block.has_value());
  ASSERT_TRUE(Arena::IsDedicated(block->region));
  table.AddReplica(slot, kHost, *block).ready = true;
  parts.headers->SetStateRefs(slot, ipc::ObjectState::kSealed, 0);
  policy.Reconsider(slot);
  // Once freed, its capacity is any class's.
  EvictionPlanner::Plan plan = planner.Require({.writers = 4242u});
  const std::optional<EvictionPlanner::Victim> victim = plan.Next();
  ASSERT_TRUE(victim.has_value());
  EXPECT_EQ(victim->slot, slot);
  EXPECT_EQ(victim->region, block->region);
  EXPECT_EQ(victim->bytes, parts.arena->BlockSize(5 * kMiB));
}

TEST_F(EvictionPlannerTest, SkippedVictimsAndLooksBeyondTheSliceAreNotChosen) {
  const uint32_t a = Sealed({kHost}), b = Sealed({kHost}), c = Sealed({kHost});
  EXPECT_EQ(Victims({.skip = [&](const EvictionPlanner::Victim& v) { return v.slot == b; }}),
            (std::vector<uint32_t>{a, c}));
  EXPECT_EQ(Victims({.most_looks = 2}), (std::vector<uint32_t>{a, b}));
  // Looks count candidates passed over too.
  EXPECT_EQ(Victims({.most_looks = 2,
                     .skip = [&](const EvictionPlanner::Victim& v) { return v.slot == a; }}),
            std::vector<uint32_t>{b});
}

TEST_F(EvictionPlannerTest, AnotherClassGetsOneSegmentThatCanEmptyWholeOrNone) {
  std::vector<uint32_t> slots;
  for (int i = 0; i < 8; ++i) slots.push_back(Sealed({kHost}, kMiB, /*pin=*/i == 0));
  parts_.WaitPrepared();
  // Segment 0 holds a pinned object: only segment 1 can empty.
  EXPECT_EQ(planner_.SegmentOfAnotherClass(kMiB, 4242), std::optional<uint32_t>(1u));
  // The class's own segments are not another class's.
  EXPECT_EQ(planner_.SegmentOfAnotherClass(kMiB, Arena::kTrustedWriters), std::nullopt);
  // With a client holding one of segment 1's objects, none can: nothing is to go.
  Hold(slots[6], kHost);
  EXPECT_EQ(planner_.SegmentOfAnotherClass(kMiB, 4242), std::nullopt);
}

TEST_F(EvictionPlannerTest, ALargeObjectIsPlannedOnlyIfWholeSegmentsCanHoldIt) {
  std::vector<uint32_t> slots;
  for (int i = 0; i < 8; ++i) slots.push_back(Sealed({kHost}));
  // Both segments can empty: 8 MiB of capacity.
  EXPECT_TRUE(planner_.SegmentsCouldHold(6 * kMiB));
  EXPECT_EQ(planner_.SegmentToEmpty({.actions = EvictionPlanner::kAtOnce}),
            std::optional<uint32_t>(0u));
  // One held object in segment 0: only segment 1 can empty, 4 MiB, too little for 6.
  Hold(slots[2], kHost);
  EXPECT_FALSE(planner_.SegmentsCouldHold(6 * kMiB));
  EXPECT_EQ(planner_.SegmentToEmpty({.actions = EvictionPlanner::kAtOnce}),
            std::optional<uint32_t>(1u));
  Hold(slots[5], kHost);
  EXPECT_EQ(planner_.SegmentToEmpty({.actions = EvictionPlanner::kAtOnce}), std::nullopt);
}

}  // namespace
}  // namespace depot::store
