// SchedulerStore: the scheduler's view of the store (scheduler::StoreAccess) and the events
// it is told, over a real ObjectStore in process (store_parts.h), with simulated GPU pools.
#include "store/scheduler_store.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "store_parts.h"

namespace depot::store {
namespace {

using scheduler::StoreAccess;
using testing::ManualExecutor;
using testing::Tiers;

constexpr ClientId kClient = 1;
constexpr uint64_t kMiB = Tiers::kMiB;

ObjectId Id(uint64_t n) { return ObjectId::FromWords(n, 0x5c4ed); }

// Records the events it hears, in order.
struct Events final : scheduler::ObjectEvents {
  void OnSealed(const ObjectId& id, bool failed) override {
    heard.push_back((failed ? "failed " : "sealed ") + std::to_string(id.lo()));
  }
  void OnFreed(const ObjectId& id) override { heard.push_back("freed " + std::to_string(id.lo())); }
  void OnMemory(const ObjectId& id, bool in_memory) override {
    moved.push_back((in_memory ? "in memory " : "on disk ") + std::to_string(id.lo()));
  }
  std::vector<std::string> heard;
  std::vector<std::string> moved;  // OnMemory's
};

class SchedulerStoreTest : public ::testing::Test {
 protected:
  // With `disk`, a spill directory in a fresh temporary directory.
  explicit SchedulerStoreTest(bool disk = false)
      : tiers_(/*host_bytes=*/8 * kMiB, /*segment_bytes=*/4 * kMiB, /*gpus=*/2,
               /*gpu_bytes=*/2 * kMiB),
        disk_(disk ? OpenDisk() : nullptr),
        store_(loop_, executor_, *tiers_.arena, *tiers_.headers, ClientLimits{},
               /*eviction=*/true, tiers_.gpu_pools(), Leases::kDefaultEntries, disk_.get()),
        graph_(std::in_place, store_, events_) {
    store_.AddClient(kClient, 1000);
  }
  ~SchedulerStoreTest() override {
    graph_.reset();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  std::unique_ptr<DiskPool> OpenDisk() {
    char name[] = "/tmp/depot-scheduler-store-XXXXXX";
    EXPECT_NE(mkdtemp(name), nullptr);
    dir_ = name;
    auto pool = DiskPool::Open(DiskOptions{.dir = dir_ + "/spill", .limit = 64 * kMiB}, closer_);
    EXPECT_TRUE(pool.ok()) << pool.status().ToString();
    return pool.ok() ? std::move(pool).value() : nullptr;
  }

  // Creates `n` of `bytes` (and `metadata` bytes of metadata) on `tier`, sealed unless not
  // `seal`; the client's reference is released unless `keep`.
  void Put(uint64_t n, uint64_t bytes, int32_t tier = kHost, uint64_t metadata = 0,
           bool seal = true, bool keep = false) {
    const std::vector<std::byte> meta(metadata, std::byte{7});
    std::optional<Result<Location>> created;
    store_.Create(kClient,
                  CreateParams{.id = Id(n), .data_size = bytes, .metadata = meta, .device = tier},
                  [&](Result<Location> r) { created = std::move(r); });
    executor_.Drain();
    ASSERT_TRUE(created && created->ok()) << (created ? created->status().ToString() : "none");
    if (!seal) return;
    store_.Seal(kClient, Id(n), [](Status st) { EXPECT_TRUE(st.ok()) << st.ToString(); });
    if (keep) return;
    const ObjectId id = Id(n);
    EXPECT_TRUE(store_.Release(kClient, std::span(&id, 1), tier).ok());
  }
  StoreAccess::Object Locate(uint64_t n) const {
    const ObjectId id = Id(n);
    StoreAccess::Object out;
    graph_->Locate(std::span(&id, 1), std::span(&out, 1));
    return out;
  }
  // The graph's references to `n`, by tier (empty if it holds none).
  std::vector<std::pair<int32_t, uint32_t>> GraphHolds(uint64_t n) const {
    const uint32_t slot = store_.SlotOf(Id(n));
    if (slot == HeaderTable::kNoSlot) return {};
    for (const HolderInfo& h : store_.HoldersOf(slot)) {
      if (h.client == kSchedulerClient) return h.tiers;
    }
    return {};
  }
  void Delete(uint64_t n) {
    const ObjectId id = Id(n);
    EXPECT_EQ(store_.Delete(std::span(&id, 1))[0], StatusCode::kOk);
  }

  boost::asio::io_context loop_;
  ManualExecutor executor_;
  Tiers tiers_;
  std::string dir_;
  boost::asio::thread_pool closer_{1};
  std::unique_ptr<DiskPool> disk_;
  ObjectStore store_;
  Events events_;
  std::optional<SchedulerStore> graph_;
};

TEST_F(SchedulerStoreTest, LocateSaysEachObjectsStateAndWhereASealedOnesBytesAre) {
  Put(1, 1000, kHost, /*metadata=*/24);
  Put(2, 4096, /*tier=*/1);
  Put(3, 10, kHost, 0, /*seal=*/false);
  const ObjectId failed = Id(4);
  graph_->SealFailed(std::span(&failed, 1), "no");
  const std::vector<ObjectId> ids{Id(1), Id(2), Id(3), Id(4), Id(5)};
  std::vector<StoreAccess::Object> out(ids.size());
  graph_->Locate(ids, out);
  EXPECT_EQ(out[0].state, StoreAccess::State::kSealed);
  EXPECT_EQ(out[0].where.bytes, 1024u);  // data and metadata
  EXPECT_EQ(out[0].where.tiers, ipc::kTierHost);
  EXPECT_EQ(out[1].state, StoreAccess::State::kSealed);
  EXPECT_EQ(out[1].where.bytes, 4096u);
  EXPECT_EQ(out[1].where.tiers, ipc::TierBit(1));
  EXPECT_EQ(out[2].state, StoreAccess::State::kCreating);
  EXPECT_EQ(out[3].state, StoreAccess::State::kFailed);
  EXPECT_EQ(out[3].where.bytes, 0u);
  EXPECT_EQ(out[4].state, StoreAccess::State::kMissing);
}

TEST_F(SchedulerStoreTest, ADeletedObjectIsMissingEvenWhileSomeoneStillHoldsIt) {
  Put(1, 100, kHost, 0, true, /*keep=*/true);
  Delete(1);
  EXPECT_EQ(Locate(1).state, StoreAccess::State::kMissing);
}

TEST_F(SchedulerStoreTest, FailureOfIsTheMessageOfAFailedObjectAndEmptyForAnyOther) {
  Put(1, 100);
  const ObjectId failed = Id(2);
  graph_->SealFailed(std::span(&failed, 1), "sum: not an array of float64");
  EXPECT_EQ(graph_->FailureOf(Id(2)), "sum: not an array of float64");
  EXPECT_EQ(graph_->FailureOf(Id(1)), "");
  EXPECT_EQ(graph_->FailureOf(Id(3)), "");
}

TEST_F(SchedulerStoreTest, SealFailedMakesOnlyIdsThatDoNotExistAndTheGraphIsTheirCreator) {
  Put(1, 100);
  Put(2, 100, kHost, 0, /*seal=*/false);
  const std::vector<ObjectId> ids{Id(1), Id(2), Id(3)};
  graph_->SealFailed(ids, "worker lost");
  EXPECT_EQ(Locate(1).state, StoreAccess::State::kSealed);
  EXPECT_EQ(Locate(2).state, StoreAccess::State::kCreating);
  EXPECT_EQ(Locate(3).state, StoreAccess::State::kFailed);
  EXPECT_EQ(store_.Describe(store_.SlotOf(Id(3))).owner_uid, ::getuid());
  // Its entry and message are counted in daemon memory, as any object's are.
  EXPECT_EQ(store_.counters().metadata_bytes,
            3 * kObjectMetadataBytes + std::string("worker lost").size());
}

TEST_F(SchedulerStoreTest, PrefetchMakesAReplicaOnTheDeviceAndHoldsNothing) {
  Put(1, 1000);
  const std::vector<ObjectId> ids{Id(1), Id(2)};
  graph_->Prefetch(ids, 0);
  executor_.Drain();
  EXPECT_EQ(Locate(1).where.tiers, ipc::kTierHost | ipc::TierBit(0));
  EXPECT_EQ(store_.UsageOf(kSchedulerClient).references, 0u);
  EXPECT_EQ(store_.counters().replicas_made, 1u);
}

TEST_F(SchedulerStoreTest, APrefetchWhoseObjectGoesMeanwhileOrThatCannotBeMadeIsIgnored) {
  Put(1, 1000);
  const ObjectId failed = Id(2);
  graph_->SealFailed(std::span(&failed, 1), "no");
  const std::vector<ObjectId> ids{Id(1), Id(2), Id(3)};
  graph_->Prefetch(ids, 0);
  Delete(1);                 // while its copy to GPU 0 is under way
  graph_->Prefetch(ids, 7);  // no such GPU
  executor_.Drain();
  EXPECT_EQ(Locate(1).state, StoreAccess::State::kMissing);
  EXPECT_EQ(store_.UsageOf(kSchedulerClient).references, 0u);
  EXPECT_EQ(store_.UsageOf(kDaemonClient).references, 0u);
  EXPECT_EQ(store_.device_usage(0).replicas, 0u);
}

TEST_F(SchedulerStoreTest, HoldKeepsAnObjectFromEvictionUntilDrop) {
  Put(1, 1000);
  EXPECT_TRUE(graph_->Hold(Id(1)));
  EXPECT_EQ(store_.EvictUnreferenced(0, /*all=*/true).objects, 0u);
  EXPECT_EQ(GraphHolds(1), (std::vector<std::pair<int32_t, uint32_t>>{{kHost, 1}}));
  graph_->Drop(Id(1));
  EXPECT_TRUE(GraphHolds(1).empty());
  EXPECT_EQ(store_.EvictUnreferenced(0, /*all=*/true).objects, 1u);
  executor_.Drain();
  EXPECT_EQ(events_.heard, (std::vector<std::string>{"sealed 1", "freed 1"}));
}

TEST_F(SchedulerStoreTest, AClientsReferenceBesideTheGraphsPinsAGpuCopy) {
  Put(1, kMiB, /*tier=*/0, 0, /*seal=*/true, /*keep=*/true);  // the client keeps its reference
  ASSERT_TRUE(graph_->Hold(Id(1)));
  EXPECT_EQ(graph_->Room(0), kMiB);
  Put(2, kMiB, /*tier=*/0);
  std::optional<Result<Location>> created;
  store_.Create(kClient, CreateParams{.id = Id(3), .data_size = kMiB, .device = 0},
                [&](Result<Location> r) { created = std::move(r); });
  executor_.Drain();
  ASSERT_TRUE(created && created->ok()) << (created ? created->status().ToString() : "none");
  EXPECT_EQ(Locate(1).where.tiers, ipc::TierBit(0)) << "referenced: it stays on the GPU";
  EXPECT_EQ(Locate(2).where.tiers, ipc::kTierHost) << "the unreferenced one spilled";
  graph_->Drop(Id(1));
  const ObjectId id = Id(1);
  EXPECT_TRUE(store_.Release(kClient, std::span(&id, 1), 0).ok());
}

TEST_F(SchedulerStoreTest, AHeldObjectThatIsDeletedGoesWithTheLastDrop) {
  Put(1, 1000);
  ASSERT_TRUE(graph_->Hold(Id(1)));
  Delete(1);
  EXPECT_FALSE(graph_->Hold(Id(1)));  // a deleted object is not held anew
  EXPECT_NE(store_.SlotOf(Id(1)), HeaderTable::kNoSlot);
  graph_->Drop(Id(1));
  EXPECT_EQ(store_.SlotOf(Id(1)), HeaderTable::kNoSlot);
}

TEST_F(SchedulerStoreTest, HoldsNestOnOneReferenceThatTheLastDropGivesBack) {
  Put(1, 1000);
  ASSERT_TRUE(graph_->Hold(Id(1)));
  ASSERT_TRUE(graph_->Hold(Id(1)));
  EXPECT_EQ(GraphHolds(1), (std::vector<std::pair<int32_t, uint32_t>>{{kHost, 1}}));
  graph_->Drop(Id(1));
  EXPECT_EQ(GraphHolds(1), (std::vector<std::pair<int32_t, uint32_t>>{{kHost, 1}}));
  graph_->Drop(Id(1));
  graph_->Drop(Id(1));  // not held: nothing happens
  EXPECT_TRUE(GraphHolds(1).empty());
  EXPECT_EQ(store_.UsageOf(kSchedulerClient).references, 0u);
}

TEST_F(SchedulerStoreTest, HoldTakesTheHostReplicaElseTheLowestGpuAndMovesToAHostCopy) {
  Put(1, 4096, /*tier=*/1);
  ASSERT_TRUE(graph_->Hold(Id(1)));
  EXPECT_EQ(GraphHolds(1), (std::vector<std::pair<int32_t, uint32_t>>{{1, 1}}));
  // A host copy arrives: the graph's reference moves there, and the GPU copy is free to go.
  const ObjectId id = Id(1);
  graph_->Prefetch(std::span(&id, 1), kHost);
  executor_.Drain();
  ASSERT_EQ(Locate(1).where.tiers, ipc::kTierHost | ipc::TierBit(1));
  EXPECT_EQ(GraphHolds(1), (std::vector<std::pair<int32_t, uint32_t>>{{kHost, 1}}));
  ASSERT_TRUE(graph_->Hold(Id(1)));
  EXPECT_EQ(GraphHolds(1), (std::vector<std::pair<int32_t, uint32_t>>{{kHost, 1}}));
  graph_->Drop(Id(1));
  graph_->Drop(Id(1));
  EXPECT_TRUE(GraphHolds(1).empty());
  EXPECT_EQ(store_.UsageOf(kSchedulerClient).references, 0u);
}

TEST_F(SchedulerStoreTest, AGpuObjectTasksWaitForSpillsToHostMemoryWhenItsPoolNeedsRoom) {
  // GPU 0's pool takes 2 MiB: an object only there that the graph holds for its waiting
  // readers does not pin it. A new object there spills it, the graph's reference moves to
  // the host copy, and the object stays until the last Drop.
  Put(1, kMiB, /*tier=*/0);
  ASSERT_TRUE(graph_->Hold(Id(1)));
  EXPECT_EQ(graph_->Room(0), 2 * kMiB) << "held by the graph alone, it can spill: room";
  Put(2, kMiB, /*tier=*/0);
  ASSERT_TRUE(graph_->Hold(Id(2)));
  std::optional<Result<Location>> created;
  store_.Create(kClient, CreateParams{.id = Id(3), .data_size = kMiB, .device = 0},
                [&](Result<Location> r) { created = std::move(r); });
  executor_.Drain();
  ASSERT_TRUE(created && created->ok()) << (created ? created->status().ToString() : "none");
  EXPECT_EQ(Locate(1).where.tiers, ipc::kTierHost) << "spilled, the GPU copy gone";
  EXPECT_EQ(GraphHolds(1), (std::vector<std::pair<int32_t, uint32_t>>{{kHost, 1}}));
  EXPECT_EQ(GraphHolds(2), (std::vector<std::pair<int32_t, uint32_t>>{{0, 1}}));
  // In host memory the graph's reference holds it as any other: nothing evicts it.
  EXPECT_EQ(store_.EvictUnreferenced(0, /*all=*/true).objects, 0u);
  graph_->Drop(Id(1));
  EXPECT_EQ(store_.EvictUnreferenced(0, /*all=*/true).objects, 1u);
  // A client's reference on the GPU still pins it there.
  graph_->Drop(Id(2));
}

class SchedulerStoreDiskTest : public SchedulerStoreTest {
 protected:
  SchedulerStoreDiskTest() : SchedulerStoreTest(/*disk=*/true) {}
};

// A graph's memory bound moves its outputs out of memory (Spill): an object the graph alone
// holds is copied to disk and its host copy dropped, the graph's reference going with it,
// and the scheduler hears that it left memory. One a client holds stays.
TEST_F(SchedulerStoreDiskTest, SpillMovesWhatTheGraphAloneHoldsToDiskAndSaysItLeftMemory) {
  ASSERT_NE(disk_, nullptr);
  EXPECT_TRUE(graph_->CanSpill());
  Put(1, kMiB);
  ASSERT_TRUE(graph_->Hold(Id(1)));
  Put(2, kMiB, kHost, 0, /*seal=*/true, /*keep=*/true);  // the client keeps its reference
  ASSERT_TRUE(graph_->Hold(Id(2)));
  Put(4, kMiB, /*tier=*/0);
  ASSERT_TRUE(graph_->Hold(Id(4)));
  executor_.Drain();
  events_.moved.clear();

  EXPECT_TRUE(graph_->Spill(Id(1)));
  EXPECT_FALSE(graph_->Spill(Id(2))) << "a client holds it";
  EXPECT_FALSE(graph_->Spill(Id(3))) << "no such object";
  EXPECT_FALSE(graph_->Spill(Id(4))) << "on a GPU: a spill of its pool's moves it to host memory";
  EXPECT_TRUE(graph_->Spill(Id(1))) << "asked again while it leaves: still leaving";
  executor_.Drain();
  EXPECT_EQ(events_.moved, std::vector<std::string>{"on disk 1"});
  EXPECT_EQ(Locate(1).where.tiers, 0u) << "no copy to read from without a restore";
  const std::vector<ReplicaInfo> replicas = store_.ReplicasOf(store_.SlotOf(Id(1)));
  ASSERT_EQ(replicas.size(), 1u);
  EXPECT_EQ(replicas[0].device, kDisk);
  EXPECT_EQ(replicas[0].references, 1u) << "the graph's reference went with it";
  EXPECT_EQ(Locate(2).where.tiers, ipc::kTierHost);
  EXPECT_FALSE(graph_->Spill(Id(1))) << "out of memory already";
  EXPECT_EQ(store_.tier_counters().disk_spills, 1u);
  graph_->Drop(Id(1));
  graph_->Drop(Id(2));
  graph_->Drop(Id(4));
}

// An object read back from disk (a restore for a reader) has its disk copy still: a spill
// drops the host copy at once, with no second write, and a reference the graph took on the
// host copy (Hold prefers it) goes down to the disk copy first.
TEST_F(SchedulerStoreDiskTest, ASpillOfAnObjectReadBackDropsItsHostCopyWithNoNewWrite) {
  Put(1, kMiB);
  ASSERT_TRUE(graph_->Hold(Id(1)));
  ASSERT_TRUE(graph_->Spill(Id(1)));
  executor_.Drain();
  ASSERT_EQ(store_.tier_counters().disk_spills, 1u);
  EXPECT_EQ(GraphHolds(1), (std::vector<std::pair<int32_t, uint32_t>>{{kDisk, 1}}));
  graph_->Drop(Id(1));
  const ObjectId id = Id(1);
  graph_->Prefetch(std::span(&id, 1), kHost);
  executor_.Drain();
  ASSERT_EQ(Locate(1).where.tiers, ipc::kTierHost) << "read back";
  ASSERT_TRUE(graph_->Hold(Id(1)));
  EXPECT_EQ(GraphHolds(1), (std::vector<std::pair<int32_t, uint32_t>>{{kHost, 1}}));
  events_.moved.clear();

  EXPECT_TRUE(graph_->Spill(Id(1)));
  executor_.Drain();
  EXPECT_EQ(events_.moved, std::vector<std::string>{"on disk 1"});
  EXPECT_EQ(Locate(1).where.tiers, 0u) << "the host copy dropped";
  EXPECT_EQ(GraphHolds(1), (std::vector<std::pair<int32_t, uint32_t>>{{kDisk, 1}}));
  EXPECT_EQ(store_.tier_counters().disk_spills, 1u) << "no second write";
  graph_->Drop(Id(1));
}

// A bound's spill takes free disk space only: it never drops others' spilled objects from
// disk (for good) to make room, which no memory needs.
TEST_F(SchedulerStoreDiskTest, ASpillTakesOnlyFreeDiskSpace) {
  constexpr uint64_t kObject = 4 * kMiB;
  constexpr uint64_t kFull = 64 * kMiB / kObject;  // the disk pool's limit
  for (uint64_t n = 1; n <= kFull; ++n) {
    Put(n, kObject);
    ASSERT_TRUE(graph_->Hold(Id(n)));
    ASSERT_TRUE(graph_->Spill(Id(n))) << n;
    executor_.Drain();
    ASSERT_EQ(Locate(n).where.tiers, 0u) << n;
  }
  Put(kFull + 1, kObject);
  ASSERT_TRUE(graph_->Hold(Id(kFull + 1)));
  EXPECT_FALSE(graph_->Spill(Id(kFull + 1))) << "the disk is full";
  executor_.Drain();
  EXPECT_EQ(Locate(kFull + 1).where.tiers, ipc::kTierHost);
  EXPECT_EQ(store_.tier_counters().disk_spills, kFull);
  for (uint64_t n = 1; n <= kFull; ++n) {
    EXPECT_NE(store_.SlotOf(Id(n)), HeaderTable::kNoSlot) << n << " still on disk";
  }
  Delete(1);
  graph_->Drop(Id(1));  // freed: its disk space is free again
  EXPECT_TRUE(graph_->Spill(Id(kFull + 1)));
  executor_.Drain();
  EXPECT_EQ(Locate(kFull + 1).where.tiers, 0u);
  for (uint64_t n = 2; n <= kFull + 1; ++n) graph_->Drop(Id(n));
}

TEST_F(SchedulerStoreTest, HoldIsFalseForAnObjectThatIsNotSealed) {
  Put(1, 100, kHost, 0, /*seal=*/false);
  EXPECT_FALSE(graph_->Hold(Id(1)));
  EXPECT_FALSE(graph_->Hold(Id(2)));
  EXPECT_EQ(store_.UsageOf(kSchedulerClient).references, 0u);
}

TEST_F(SchedulerStoreTest, AFailedObjectCanBeHeldAndIsEvictedOnlyAfterItsDrop) {
  const ObjectId id = Id(1);
  graph_->SealFailed(std::span(&id, 1), "no");
  ASSERT_TRUE(graph_->Hold(id));
  EXPECT_EQ(store_.EvictUnreferenced(0, /*all=*/true).objects, 0u);
  graph_->Drop(id);
  EXPECT_EQ(store_.EvictUnreferenced(0, /*all=*/true).objects, 1u);
}

TEST_F(SchedulerStoreTest, RoomIsTheTiersLimitLessWhatIsHeldOrBeingCreated) {
  const uint64_t host = tiers_.arena->capacity();
  EXPECT_EQ(graph_->Room(kHost), host);
  EXPECT_EQ(graph_->Room(0), 2 * kMiB);
  Put(1, kMiB);  // unreferenced: evictable, so still room
  EXPECT_EQ(graph_->Room(kHost), host);
  ASSERT_TRUE(graph_->Hold(Id(1)));
  EXPECT_EQ(graph_->Room(kHost), host - kMiB);
  Put(2, kMiB, /*tier=*/0, 0, /*seal=*/false);  // being created
  EXPECT_EQ(graph_->Room(0), kMiB);
  EXPECT_EQ(graph_->Room(1), 2 * kMiB);
  EXPECT_EQ(graph_->Room(2), 0u);  // no such GPU
  graph_->Drop(Id(1));
  EXPECT_EQ(graph_->Room(kHost), host);
}

TEST_F(SchedulerStoreTest, EventsSaySealedWithBytesOrAsFailedAndFreedOnDeleteEvictAndAbort) {
  Put(1, 100);
  const ObjectId failed = Id(2);
  graph_->SealFailed(std::span(&failed, 1), "no");
  EXPECT_TRUE(events_.heard.empty());  // delivered from the loop, after the change
  Put(3, 100, kHost, 0, /*seal=*/false);
  Delete(1);
  EXPECT_EQ(store_.EvictUnreferenced(0, /*all=*/true).objects, 1u);
  EXPECT_TRUE(store_.Abort(kClient, Id(3)).ok());
  executor_.Drain();
  EXPECT_EQ(events_.heard,
            (std::vector<std::string>{"sealed 1", "failed 2", "freed 1", "freed 2", "freed 3"}));
}

TEST_F(SchedulerStoreTest, WhenItGoesItsHoldsAreGivenBackAndNothingMoreIsHeard) {
  Put(1, 100);
  ASSERT_TRUE(graph_->Hold(Id(1)));
  executor_.Drain();
  events_.heard.clear();
  graph_.reset();
  EXPECT_EQ(store_.UsageOf(kSchedulerClient).references, 0u);
  EXPECT_EQ(store_.EvictUnreferenced(0, /*all=*/true).objects, 1u);
  Put(2, 100);
  executor_.Drain();
  EXPECT_TRUE(events_.heard.empty());
}

}  // namespace
}  // namespace depot::store
