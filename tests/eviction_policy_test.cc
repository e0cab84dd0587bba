// The eviction policy on its own: which copies may go, what going means, and in which order.
#include "store/eviction_policy.h"

#include <gtest/gtest.h>

#include "store_parts.h"

namespace depot::store {
namespace {

using Action = EvictionPolicy::Action;
using testing::Tiers;

std::vector<uint32_t> Order(const LruList& list) {
  std::vector<uint32_t> out;
  for (uint32_t s = list.front(); s != LruList::kNil; s = list.next(s)) out.push_back(s);
  return out;
}

class EvictionPolicyTest : public ::testing::Test {
 protected:
  // A sealed object of `bytes` with a ready replica on each of `on`, nobody holding it.
  uint32_t Sealed(std::initializer_list<int32_t> on, uint64_t bytes = 4096, bool pin = false) {
    const uint32_t slot = tiers_.headers->Acquire();
    table_.Insert(slot,
                  NewObject{.id = ObjectId::FromWords(++next_, 1), .data_size = bytes, .pin = pin});
    for (int32_t tier : on) {
      auto block = pools_[tier + 1]->Allocate(table_.BytesOn(slot, tier));
      EXPECT_TRUE(block.has_value());
      table_.AddReplica(slot, tier, *block).ready = true;
    }
    tiers_.headers->SetStateRefs(slot, ipc::ObjectState::kSealed, 0);
    policy_.Reconsider(slot);
    return slot;
  }
  // Holds the replica on `tier` (as a reference does).
  void Hold(uint32_t slot, int32_t tier) {
    table_.FindReplica(slot, tier)->refs++;
    tiers_.headers->SetStateRefs(slot, ipc::ObjectState::kSealed, tiers_.headers->refs(slot) + 1);
    policy_.Reconsider(slot);
  }

  Tiers tiers_{8 * Tiers::kMiB, 4 * Tiers::kMiB, 1, 4 * Tiers::kMiB};
  std::vector<TierPool*> pools_ = tiers_.tier_pools();
  ObjectTable table_{*tiers_.headers};
  EvictionPolicy policy_{table_, pools_, /*host_spills=*/false};
  uint64_t next_ = 0;
};

TEST_F(EvictionPolicyTest, TheLastCopyOfAnObjectNobodyHoldsIsEvictedFromTheHost) {
  const uint32_t slot = Sealed({kHost});
  EXPECT_EQ(policy_.ActionFor(slot, kHost), Action::kEvict);
  EXPECT_EQ(Order(policy_.candidates(kHost)), std::vector<uint32_t>{slot});
  EXPECT_EQ(policy_.candidate_bytes(kHost, 0), 4096u);
}

TEST_F(EvictionPolicyTest, HeldOrPinnedObjectsStayInHostMemory) {
  const uint32_t pinned = Sealed({kHost}, 4096, /*pin=*/true);
  const uint32_t held = Sealed({kHost});
  Hold(held, kHost);
  EXPECT_EQ(policy_.ActionFor(pinned, kHost), Action::kNone);
  EXPECT_EQ(policy_.ActionFor(held, kHost), Action::kNone);
  EXPECT_TRUE(policy_.candidates(kHost).empty());
  EXPECT_EQ(policy_.candidate_bytes(kHost, 0), 0u);
}

TEST_F(EvictionPolicyTest, AHostCopyWithAGpuCopyIsDroppedEvenIfTheObjectIsPinnedOrHeld) {
  const uint32_t slot = Sealed({kHost, 0}, 4096, /*pin=*/true);
  Hold(slot, 0);  // a reference on the GPU keeps the GPU copy, not the host one
  EXPECT_EQ(policy_.ActionFor(slot, kHost), Action::kDrop);
  EXPECT_EQ(policy_.ActionFor(slot, 0), Action::kNone);
  EXPECT_EQ(Order(policy_.candidates(kHost)), std::vector<uint32_t>{slot});
  EXPECT_TRUE(policy_.candidates(0).empty());
}

TEST_F(EvictionPolicyTest, TheLastCopyOnAGpuSpillsAndAnExtraOneIsDropped) {
  const uint32_t only = Sealed({0});
  const uint32_t extra = Sealed({kHost, 0});
  EXPECT_EQ(policy_.ActionFor(only, 0), Action::kSpill);
  EXPECT_EQ(policy_.ActionFor(extra, 0), Action::kDrop);
  EXPECT_EQ(Order(policy_.candidates(0)), (std::vector<uint32_t>{only, extra}));
}

TEST_F(EvictionPolicyTest, ACopyOnlyTheTaskGraphHoldsSpillsWhereItsHoldCanMoveAndNeverGoes) {
  // The graph's reference to an object its waiting tasks read moves down the tiers with a
  // spill (ObjectStore::MoveGraphHold): a GPU's last copy spills to host memory.
  const uint32_t gpu = Sealed({0});
  Hold(gpu, 0);
  table_.FindReplica(gpu, 0)->graph_held = true;
  policy_.Reconsider(gpu);
  EXPECT_EQ(policy_.ActionFor(gpu, 0), Action::kSpill);
  EXPECT_EQ(Order(policy_.candidates(0)), std::vector<uint32_t>{gpu});
  // A client's reference beside it pins it there.
  Hold(gpu, 0);
  EXPECT_EQ(policy_.ActionFor(gpu, 0), Action::kNone);
  EXPECT_TRUE(policy_.candidates(0).empty());
  // With another copy, the held one stays (its reference with it); the other may go.
  const uint32_t both = Sealed({kHost, 0});
  Hold(both, 0);
  table_.FindReplica(both, 0)->graph_held = true;
  policy_.Reconsider(both);
  EXPECT_EQ(policy_.ActionFor(both, 0), Action::kNone);
  EXPECT_EQ(policy_.ActionFor(both, kHost), Action::kDrop);
  // In host memory it spills to disk where there is a spill directory, and else stays: it
  // is never evicted.
  const uint32_t host = Sealed({kHost});
  Hold(host, kHost);
  table_.FindReplica(host, kHost)->graph_held = true;
  policy_.Reconsider(host);
  EXPECT_EQ(policy_.ActionFor(host, kHost), Action::kNone);
  const EvictionPolicy spilling(table_, pools_, /*host_spills=*/true);
  EXPECT_EQ(spilling.ActionFor(host, kHost), Action::kSpill);
  EXPECT_TRUE(spilling.GraphHoldMoves(kHost) && spilling.GraphHoldMoves(0));
  EXPECT_FALSE(policy_.GraphHoldMoves(kHost) || policy_.GraphHoldMoves(kDisk));
}

TEST_F(EvictionPolicyTest, CopiesBeingMadeSpilledSealedOrDeletedAreNoCandidates) {
  const uint32_t copying = Sealed({kHost});
  auto block = pools_[1]->Allocate(4096);
  table_.AddReplica(copying, 0, *block);  // not ready: being copied in
  policy_.Reconsider(copying);
  EXPECT_EQ(policy_.ActionFor(copying, 0), Action::kNone);
  EXPECT_EQ(policy_.ActionFor(copying, kHost), Action::kEvict);  // the GPU copy is not there yet

  const uint32_t spilling = Sealed({0});
  table_.FindReplica(spilling, 0)->spilling = true;
  policy_.Reconsider(spilling);
  EXPECT_EQ(policy_.ActionFor(spilling, 0), Action::kNone);

  const uint32_t deleted = Sealed({kHost});
  tiers_.headers->at(deleted).flags |= ipc::kFlagDeletePending;
  policy_.Reconsider(deleted);
  EXPECT_EQ(policy_.ActionFor(deleted, kHost), Action::kNone);

  const uint32_t sealing = Sealed({kHost});
  tiers_.headers->SetStateRefs(sealing, ipc::ObjectState::kCreating, 0);
  policy_.Reconsider(sealing);
  EXPECT_EQ(policy_.ActionFor(sealing, kHost), Action::kNone);

  EXPECT_EQ(Order(policy_.candidates(kHost)), std::vector<uint32_t>{copying});
  EXPECT_TRUE(policy_.candidates(0).empty());
}

TEST_F(EvictionPolicyTest, ACandidateThatStaysOneKeepsItsPlace) {
  const uint32_t a = Sealed({kHost}), b = Sealed({kHost}), c = Sealed({kHost});
  policy_.Reconsider(a);
  EXPECT_EQ(Order(policy_.candidates(kHost)), (std::vector<uint32_t>{a, b, c}));
  Hold(a, kHost);  // used: out of the list...
  table_.FindReplica(a, kHost)->refs--;
  tiers_.headers->SetStateRefs(a, ipc::ObjectState::kSealed, 0);
  policy_.Reconsider(a);  // ...and back at the most recently used end
  EXPECT_EQ(Order(policy_.candidates(kHost)), (std::vector<uint32_t>{b, c, a}));
}

TEST_F(EvictionPolicyTest, FreeingIsWorthItOnlyWhereFreeAndCandidateBytesMakeRoom) {
  // Segment 0 (4 MiB) holds a 3 MiB candidate and a held 512 KiB object.
  const uint32_t big = Sealed({kHost}, 3 * Tiers::kMiB);
  const uint32_t held = Sealed({kHost}, 512 * 1024);
  Hold(held, kHost);
  ASSERT_EQ(table_.FindReplica(big, kHost)->region, 0u);
  EXPECT_TRUE(policy_.WorthFreeing(big, kHost, 3 * Tiers::kMiB));
  EXPECT_TRUE(policy_.WorthFreeing(big, kHost, 3 * Tiers::kMiB + 512 * 1024));
  // More than the segment's free and candidate bytes together: evicting cannot help.
  EXPECT_FALSE(policy_.WorthFreeing(big, kHost, 3 * Tiers::kMiB + 512 * 1024 + 4096));
}

TEST_F(EvictionPolicyTest, AWithdrawnReplicaLeavesTheListAndItsBytes) {
  const uint32_t slot = Sealed({kHost, 0});
  policy_.Withdraw(slot, kHost);
  EXPECT_TRUE(policy_.candidates(kHost).empty());
  EXPECT_EQ(policy_.candidate_bytes(kHost, 0), 0u);
  EXPECT_EQ(Order(policy_.candidates(0)), std::vector<uint32_t>{slot});
}

}  // namespace
}  // namespace depot::store
