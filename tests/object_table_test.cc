// The object table on its own: ids, slots, headers, names and replicas, with no daemon.
#include "store/object_table.h"

#include <gtest/gtest.h>

#include "store_parts.h"

namespace depot::store {
namespace {

using testing::Tiers;

ObjectId Id(uint64_t n) { return ObjectId::FromWords(n, 0x5eed); }

TEST(ReplicaSetTest, KeepsOneCopyPerTierWhicheverIsRemoved) {
  ReplicaSet set;
  EXPECT_TRUE(set.empty());
  set.Add(Replica{.region = 1, .tier = kHost});
  set.Add(Replica{.region = 2, .tier = 0});
  set.Add(Replica{.region = 3, .tier = 1});
  ASSERT_EQ(set.size(), 3u);
  EXPECT_EQ(set.Find(0)->region, 2u);
  EXPECT_EQ(set.Find(2), nullptr);

  set.Remove(kHost);  // the inline one: a copy from the heap takes its place
  ASSERT_EQ(set.size(), 2u);
  EXPECT_EQ(set.Find(kHost), nullptr);
  EXPECT_EQ(set.Find(0)->region, 2u);
  EXPECT_EQ(set.Find(1)->region, 3u);
  set.Remove(1);
  set.Remove(0);
  EXPECT_TRUE(set.empty());
  set.Remove(0);  // nothing there: no harm
  EXPECT_TRUE(set.empty());
}

TEST(ReplicaSetTest, KeepsTheMetadataOfAnObjectOnADataOnlyTier) {
  ReplicaSet set;
  EXPECT_TRUE(std::as_const(set).kept_metadata().empty());
  set.kept_metadata().assign(3, std::byte{7});
  set.Add(Replica{.tier = 0});
  EXPECT_EQ(std::as_const(set).kept_metadata().size(), 3u);
}

class ObjectTableTest : public ::testing::Test {
 protected:
  uint32_t Insert(uint64_t n, std::string_view name = {}, uint64_t data = 100,
                  uint64_t metadata = 10) {
    const uint32_t slot = tiers_.headers->Acquire();
    table_.Insert(slot, NewObject{.id = Id(n),
                                  .data_size = data,
                                  .metadata_size = metadata,
                                  .name = name,
                                  .creator = 7,
                                  .owner = 1000});
    return slot;
  }

  Tiers tiers_;
  ObjectTable table_{*tiers_.headers};
};

TEST_F(ObjectTableTest, AnInsertedObjectIsFoundBeingCreatedWithItsNameAndCreator) {
  const uint32_t slot = Insert(1, "weights");
  EXPECT_EQ(table_.Find(Id(1)), slot);
  EXPECT_EQ(table_.Find(Id(2)), HeaderTable::kNoSlot);
  EXPECT_EQ(table_.IdAt(slot), Id(1));
  EXPECT_TRUE(table_.Holds(slot, Id(1)));
  EXPECT_FALSE(table_.Holds(slot, Id(2)));
  EXPECT_EQ(table_.NameOf(slot), "weights");
  EXPECT_FALSE(table_.IsSealed(slot));
  EXPECT_FALSE(table_.IsUsable(slot));
  EXPECT_EQ(table_.at(slot).creator, 7u);
  EXPECT_EQ(table_.at(slot).owner, 1000u);
  EXPECT_EQ(table_.header(slot).data_size, 100u);
  EXPECT_EQ(tiers_.headers->state(slot), ipc::ObjectState::kCreating);
}

TEST_F(ObjectTableTest, RemoveForgetsTheIdAndNameAndFreesTheSlot) {
  const uint32_t slot = Insert(1, "weights");
  const uint32_t live = tiers_.headers->live();
  table_.Remove(slot);
  EXPECT_EQ(table_.Find(Id(1)), HeaderTable::kNoSlot);
  EXPECT_EQ(table_.NameOf(slot), "");
  EXPECT_FALSE(table_.Holds(slot, Id(1)));
  EXPECT_EQ(tiers_.headers->live(), live - 1);
  // The slot comes back with a new generation, and nothing of the old object.
  const uint32_t again = Insert(2);
  EXPECT_EQ(again, slot);
  EXPECT_EQ(table_.NameOf(again), "");
  EXPECT_TRUE(table_.at(again).replicas.empty());
}

TEST_F(ObjectTableTest, AHostReplicaPutsItsPlaceInTheHeader) {
  const uint32_t slot = Insert(1);
  TierPool::Block block{.region = 0, .handle = 5, .offset = 4096, .size = 128};
  Replica& r = table_.AddReplica(slot, kHost, block);
  EXPECT_EQ(r.tier, kHost);
  EXPECT_EQ(r.handle, 5u);
  EXPECT_FALSE(r.ready);
  EXPECT_EQ(table_.header(slot).offset, 4096u);
  EXPECT_EQ(table_.header(slot).segment, 0u);
  // A GPU replica's place is its own, not the header's.
  table_.AddReplica(slot, 0, TierPool::Block{.region = 3, .handle = 1, .offset = 256});
  EXPECT_EQ(table_.header(slot).offset, 4096u);
  EXPECT_EQ(table_.FindReplica(slot, 0)->region, 3u);
}

TEST_F(ObjectTableTest, TiersAreThoseWithReadyBytes) {
  const uint32_t slot = Insert(1);
  table_.AddReplica(slot, kHost, {});
  table_.AddReplica(slot, 1, {});
  EXPECT_EQ(table_.TiersOf(slot), 0u);
  EXPECT_FALSE(table_.HasOtherCopy(slot, 1));
  table_.FindReplica(slot, kHost)->ready = true;
  EXPECT_EQ(table_.TiersOf(slot), ipc::kTierHost);
  EXPECT_TRUE(table_.HasOtherCopy(slot, 1));
  EXPECT_FALSE(table_.HasOtherCopy(slot, kHost));
  table_.FindReplica(slot, 1)->ready = true;
  table_.PublishTiers(slot);
  EXPECT_EQ(table_.header(slot).tiers.load(), ipc::kTierHost | ipc::TierBit(1));
  EXPECT_TRUE(table_.IsReady(slot, 1));
  EXPECT_FALSE(table_.IsReady(slot, 0));
}

TEST_F(ObjectTableTest, BytesOnTheHostIncludeTheMetadataAndOnAGpuDoNot) {
  const uint32_t slot = Insert(1, {}, 1000, 24);
  EXPECT_EQ(table_.BytesOn(slot, kHost), 1024u);
  EXPECT_EQ(table_.BytesOn(slot, 0), 1000u);
}

TEST_F(ObjectTableTest, ListPagesThroughLiveSlotsWithinTheScanLimit) {
  std::vector<uint32_t> slots;
  for (uint64_t n = 1; n <= 6; ++n) slots.push_back(Insert(n));
  table_.Remove(slots[1]);
  table_.Remove(slots[2]);
  // Sealed, with a checksum: only this one is verifiable.
  tiers_.headers->at(slots[4]).flags |= ipc::kFlagHasChecksum;
  tiers_.headers->SetStateRefs(slots[4], ipc::ObjectState::kSealed, 0);

  ObjectTable::Page page = table_.List(0, 100, 3, ObjectTable::Filter::kAll);
  EXPECT_EQ(page.slots, std::vector<uint32_t>{slots[0]});
  EXPECT_FALSE(page.done);
  page = table_.List(page.next, 2, 100, ObjectTable::Filter::kAll);
  EXPECT_EQ(page.slots, (std::vector<uint32_t>{slots[3], slots[4]}));
  page = table_.List(page.next, 100, 100, ObjectTable::Filter::kAll);
  EXPECT_EQ(page.slots, std::vector<uint32_t>{slots[5]});
  EXPECT_TRUE(page.done);

  page = table_.List(0, 100, 100, ObjectTable::Filter::kVerifiable);
  EXPECT_EQ(page.slots, std::vector<uint32_t>{slots[4]});
}

}  // namespace
}  // namespace depot::store
