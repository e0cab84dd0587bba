// The tiers on their own: copies between tiers, spills, drops and evictions to make room,
// with a recording Owner in place of the store and copies run when the test says.
#include "store/tiers.h"

#include <gtest/gtest.h>

#include <optional>
#include <set>
#include <tuple>

#include "store_parts.h"

namespace depot::store {
namespace {

using testing::ManualExecutor;
using testing::Tiers;
constexpr uint64_t kMiB = Tiers::kMiB;

// Stands in for the store: holds sources as references do, and records what it is told.
struct RecordingOwner final : store::Tiers::Owner {
  void HoldSource(uint32_t slot, int32_t tier) override {
    table->FindReplica(slot, tier)->refs++;
    held.emplace_back(slot, tier);
  }
  void LetGoOfSource(uint32_t slot, int32_t tier) override {
    table->FindReplica(slot, tier)->refs--;
    let_go.emplace_back(slot, tier);
  }
  void CopyDone(uint32_t slot, int32_t tier, const Status& status,
                std::span<const WaitingGets::Id> waiters) override {
    done.emplace_back(slot, tier, status.code(),
                      std::vector<WaitingGets::Id>(waiters.begin(), waiters.end()));
  }
  void Evict(uint32_t slot) override {
    evicted.push_back(slot);
    while (!table->at(slot).replicas.empty())
      tiers->FreeReplica(slot, table->at(slot).replicas[0].tier);
    table->Remove(slot);
  }
  void ChargeObject(uint32_t, uint64_t bytes) override { charged += bytes; }
  void LeftMemory(uint32_t slot) override { left_memory.push_back(slot); }
  // No client leases anything here but the slots in `leased`.
  bool Reclaim(uint32_t slot) override {
    if (!leased.contains(slot)) return true;
    tiers->SetLeased(slot, true);
    return false;
  }

  ObjectTable* table = nullptr;
  std::set<uint32_t> leased;
  store::Tiers* tiers = nullptr;
  std::vector<std::pair<uint32_t, int32_t>> held, let_go;
  std::vector<std::tuple<uint32_t, int32_t, StatusCode, std::vector<WaitingGets::Id>>> done;
  std::vector<uint32_t> evicted, left_memory;
  uint64_t charged = 0;
};

class TiersTest : public ::testing::Test {
 protected:
  TiersTest() {
    owner_.table = &table_;
    owner_.tiers = &tiers_;
  }

  // A sealed object of `bytes` (and `metadata` bytes) with a ready copy on each of `on`,
  // nobody holding it.
  uint32_t Sealed(std::initializer_list<int32_t> on, uint64_t bytes = kMiB, bool pin = false,
                  uint64_t metadata = 0) {
    const uint32_t slot = parts_.headers->Acquire();
    table_.Insert(slot, NewObject{.id = ObjectId::FromWords(++next_, 2),
                                  .data_size = bytes,
                                  .metadata_size = metadata,
                                  .pin = pin});
    for (int32_t tier : on) {
      auto block = tiers_.pool(tier).Allocate(table_.BytesOn(slot, tier));
      EXPECT_TRUE(block.has_value());
      tiers_.PlaceReplica(slot, tier, *block).ready = true;
    }
    table_.PublishTiers(slot);
    parts_.headers->SetStateRefs(slot, ipc::ObjectState::kSealed, 0);
    policy_.Reconsider(slot);
    return slot;
  }

  // 8 MiB of host memory in 4 MiB segments, one GPU with a 2 MiB pool.
  Tiers parts_{8 * kMiB, 4 * kMiB, 1, 2 * kMiB};
  std::vector<gpu::DevicePool*> gpus_ = parts_.gpu_pools();
  ManualExecutor executor_;
  ObjectTable table_{*parts_.headers};
  RecordingOwner owner_;
  store::Tiers tiers_{table_, policy_, executor_, *parts_.arena, gpus_, nullptr, true, owner_};
  EvictionPolicy policy_{table_, tiers_.pools(), /*host_spills=*/false};
  uint64_t next_ = 0;
};

TEST_F(TiersTest, ACopyHoldsItsSourceUntilItEndsAndTellsTheOwner) {
  const uint32_t slot = Sealed({kHost}, 1000, false, 24);
  tiers_.StartCopy(slot, 0, /*waiter=*/7);
  tiers_.StartCopy(slot, 0, /*waiter=*/8);  // the same copy: one more waiter
  EXPECT_EQ(owner_.held, (std::vector<std::pair<uint32_t, int32_t>>{{slot, kHost}}));
  EXPECT_EQ(owner_.charged, 24u) << "the metadata stays in daemon memory, counted";
  EXPECT_FALSE(table_.IsReady(slot, 0));
  executor_.Drain();
  ASSERT_EQ(owner_.done.size(), 1u);
  EXPECT_EQ(std::get<2>(owner_.done[0]), StatusCode::kOk);
  EXPECT_EQ(std::get<3>(owner_.done[0]), (std::vector<WaitingGets::Id>{7, 8}));
  EXPECT_EQ(owner_.let_go, owner_.held);
  EXPECT_TRUE(table_.IsReady(slot, 0));
  EXPECT_EQ(table_.header(slot).tiers.load(), ipc::kTierHost | ipc::TierBit(0));
  EXPECT_EQ(table_.at(slot).replicas.kept_metadata().size(), 24u);
  EXPECT_EQ(tiers_.counters().replicas_made, 1u);
  EXPECT_EQ(tiers_.usage(0).replicas, 1u);
}

TEST_F(TiersTest, AFullGpuSpillsItsLeastRecentlyUsedObjectToMakeRoom) {
  const uint32_t older = Sealed({0});
  const uint32_t newer = Sealed({0});
  std::optional<std::optional<TierPool::Block>> room;
  tiers_.AllocateOn(0, kMiB, [&](std::optional<TierPool::Block> b) { room = b; });
  EXPECT_FALSE(room.has_value()) << "room comes once the spill is done";
  EXPECT_TRUE(table_.FindReplica(older, 0)->spilling);
  executor_.Drain();
  ASSERT_TRUE(room.has_value());
  EXPECT_TRUE(room->has_value());
  EXPECT_EQ(table_.TiersOf(older), ipc::kTierHost) << "spilled: its GPU copy went";
  EXPECT_EQ(table_.TiersOf(newer), ipc::TierBit(0));
  EXPECT_EQ(tiers_.counters().spills, 1u);
  EXPECT_EQ(tiers_.counters().spilled_bytes, kMiB);
  EXPECT_EQ(owner_.let_go, (std::vector<std::pair<uint32_t, int32_t>>{{older, 0}}));
}

TEST_F(TiersTest, RoomThatACopyUnderWayWillLetGoIsWaitedForNotRefused) {
  // A prefetch fills half the GPU's 2 MiB; a request for the whole pool finds nothing it can
  // free now, but the copy, once made, is an extra copy nobody holds: it waits for that.
  const uint32_t prefetched = Sealed({kHost});
  tiers_.StartCopy(prefetched, 0, /*waiter=*/0);
  std::optional<std::optional<TierPool::Block>> room;
  tiers_.AllocateOn(0, 2 * kMiB, [&](std::optional<TierPool::Block> b) { room = b; });
  EXPECT_FALSE(room.has_value()) << "the copy under way may make room";
  executor_.Drain();
  ASSERT_TRUE(room.has_value());
  EXPECT_TRUE(room->has_value());
  EXPECT_EQ(table_.TiersOf(prefetched), ipc::kTierHost) << "its GPU copy made room";
  // With nothing under way, a request nothing can make room for is refused at once.
  std::optional<std::optional<TierPool::Block>> none;
  tiers_.AllocateOn(0, 4 * kMiB, [&](std::optional<TierPool::Block> b) { none = b; });
  ASSERT_TRUE(none.has_value());
  EXPECT_FALSE(none->has_value());
}

TEST_F(TiersTest, AnExtraCopyIsDroppedBeforeAnythingSpills) {
  const uint32_t only_there = Sealed({0});
  const uint32_t also_on_host = Sealed({kHost, 0});
  std::optional<std::optional<TierPool::Block>> room;
  tiers_.AllocateOn(0, kMiB, [&](std::optional<TierPool::Block> b) { room = b; });
  ASSERT_TRUE(room.has_value()) << "a drop makes room at once";
  EXPECT_TRUE(room->has_value());
  EXPECT_EQ(table_.TiersOf(also_on_host), ipc::kTierHost);
  EXPECT_EQ(table_.TiersOf(only_there), ipc::TierBit(0));
  EXPECT_EQ(tiers_.counters().replicas_dropped, 1u);
  EXPECT_EQ(tiers_.counters().spills, 0u);
  EXPECT_EQ(executor_.queued(), 0u);
}

TEST_F(TiersTest, AGpuOfHeldObjectsHasNoRoomAndSaysWhy) {
  const uint32_t a = Sealed({0}), b = Sealed({0});
  table_.FindReplica(a, 0)->refs = table_.FindReplica(b, 0)->refs = 1;
  parts_.headers->SetStateRefs(a, ipc::ObjectState::kSealed, 1);
  parts_.headers->SetStateRefs(b, ipc::ObjectState::kSealed, 1);
  policy_.Reconsider(a);
  policy_.Reconsider(b);
  std::optional<std::optional<TierPool::Block>> room;
  tiers_.AllocateOn(0, kMiB, [&](std::optional<TierPool::Block> r) { room = r; });
  ASSERT_TRUE(room.has_value());
  EXPECT_FALSE(room->has_value());
  const std::string why = tiers_.OutOfMemoryMessage(0, ObjectId::FromWords(9, 9), kMiB);
  EXPECT_NE(why.find("nothing more can spill"), std::string::npos) << why;
}

TEST_F(TiersTest, HostPressureEvictsThroughTheOwnerLeastRecentlyUsedFirst) {
  std::vector<uint32_t> slots;
  for (int i = 0; i < 8; ++i) slots.push_back(Sealed({kHost}));  // fills 8 MiB
  const uint32_t pinned = slots[0];
  parts_.headers->at(pinned).flags |= ipc::kFlagPinned;  // no candidate
  policy_.Reconsider(pinned);
  auto block = tiers_.AllocateOrEvict(kMiB);
  ASSERT_TRUE(block.has_value());
  EXPECT_EQ(owner_.evicted, std::vector<uint32_t>{slots[1]});
  EXPECT_EQ(tiers_.counters().evictions, 1u);
  tiers_.pool(kHost).Free(block->region, block->handle);
}

TEST_F(TiersTest, AnotherUidsCreateEvictsOneWholeSegmentThatCanEmpty) {
  // Two segments full of the trusted class's objects; the first holds a pinned one.
  std::vector<uint32_t> slots;
  for (int i = 0; i < 8; ++i) slots.push_back(Sealed({kHost}, kMiB, /*pin=*/i == 0));
  ASSERT_EQ(table_.FindReplica(slots[0], kHost)->region, 0u);
  ASSERT_EQ(table_.FindReplica(slots[4], kHost)->region, 1u);
  parts_.WaitPrepared();
  // Uid 4242 has no segment: the first cannot empty, so the second goes, all of it, and
  // nothing of the first.
  auto block = tiers_.AllocateOrEvict(kMiB, /*writers=*/4242);
  ASSERT_TRUE(block.has_value());
  EXPECT_EQ(block->region, 1u);
  EXPECT_EQ(owner_.evicted, (std::vector<uint32_t>{slots[4], slots[5], slots[6], slots[7]}));
  EXPECT_EQ(parts_.arena->writers(1), 4242u);
  EXPECT_EQ(parts_.arena->generation(1), 1u);
  // Its next create fits beside it, evicting nothing.
  auto next = tiers_.AllocateOrEvict(kMiB, 4242);
  ASSERT_TRUE(next.has_value());
  EXPECT_EQ(next->region, 1u);
  EXPECT_EQ(owner_.evicted.size(), 4u);
  // The trusted class, full, evicts its own, never uid 4242's.
  auto trusted = tiers_.AllocateOrEvict(kMiB);
  ASSERT_TRUE(trusted.has_value());
  EXPECT_EQ(trusted->region, 0u);
  EXPECT_EQ(owner_.evicted.back(), slots[1]);
  for (const auto& b : {*block, *next, *trusted}) tiers_.pool(kHost).Free(b.region, b.handle);
}

TEST_F(TiersTest, ALargeObjectEvictsNothingWhenALeaseKeepsTheSegmentsFromHoldingIt) {
  // Two full segments; a client's lease holds one object of the first, which the store
  // learns only when it tries to free it. Without it, both segments would hold 5 MiB.
  std::vector<uint32_t> slots;
  for (int i = 0; i < 8; ++i) slots.push_back(Sealed({kHost}));
  owner_.leased.insert(slots[1]);
  EXPECT_FALSE(tiers_.AllocateOrEvict(5 * kMiB).has_value());
  // Found before anything went: one segment's 4 MiB cannot hold it, so nothing was evicted.
  EXPECT_TRUE(owner_.evicted.empty());
  EXPECT_EQ(tiers_.counters().evictions, 0u);
}

TEST_F(TiersTest, ACopyThatFindsNoRoomFreesNothingItDidNotMakeAndSaysWhy) {
  // Host memory full of pinned objects; the object to copy lives on the GPU only.
  for (int i = 0; i < 8; ++i) Sealed({kHost}, kMiB, /*pin=*/true);
  const uint32_t slot = Sealed({0});
  tiers_.StartCopy(slot, kHost, /*waiter=*/3);
  ASSERT_EQ(owner_.done.size(), 1u);
  EXPECT_EQ(std::get<2>(owner_.done[0]), StatusCode::kOutOfMemory);
  EXPECT_EQ(owner_.let_go, owner_.held);
  EXPECT_EQ(table_.TiersOf(slot), ipc::TierBit(0));
  EXPECT_EQ(table_.at(slot).replicas.size(), 1u);
  EXPECT_TRUE(owner_.evicted.empty());
}

}  // namespace
}  // namespace depot::store
