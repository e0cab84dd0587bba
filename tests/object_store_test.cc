// The whole store in process, with no daemon: creates, gets, copies between tiers, spills
// and events, with the copies run when the test says (ManualExecutor).
#include "store/object_store.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <optional>

#include "store_parts.h"

namespace depot::store {
namespace {

using testing::ManualExecutor;
using testing::Tiers;

constexpr ClientId kClient = 1;
constexpr uint64_t kMiB = Tiers::kMiB;

ObjectId Id(uint64_t n) { return ObjectId::FromWords(n, 0xabc); }

// Records the events it hears, in order.
struct Recorder final : StoreListener {
  void OnSealed(const ObjectId& id, uint64_t tiers) override {
    events.push_back("sealed " + id.Hex().substr(0, 4) + " tiers " + std::to_string(tiers));
  }
  void OnReplicaReady(const ObjectId& id, int32_t tier) override {
    events.push_back("ready " + id.Hex().substr(0, 4) + " on " + std::to_string(tier));
  }
  void OnSealedFailed(const ObjectId& id) override {
    events.push_back("failed " + id.Hex().substr(0, 4));
  }
  void OnFreed(const ObjectId& id) override { events.push_back("freed " + id.Hex().substr(0, 4)); }
  std::vector<std::string> events;
};

class ObjectStoreTest : public ::testing::Test {
 protected:
  explicit ObjectStoreTest(Tiers* tiers = nullptr)
      : tiers_(tiers != nullptr ? tiers : new Tiers()),
        store_(loop_, executor_, *tiers_->arena, *tiers_->headers, ClientLimits{},
               /*eviction=*/true, tiers_->gpu_pools()) {
    // The daemon's own uid: its objects share segments with the daemon's copies.
    store_.AddClient(kClient, ::geteuid());
  }

  // Creates and seals `n` with `bytes` of data (filled with `fill`) on `tier`.
  Location Put(uint64_t n, uint64_t bytes, int32_t tier = kHost, std::byte fill = std::byte{1}) {
    std::optional<Result<Location>> created;
    store_.Create(kClient, CreateParams{.id = Id(n), .data_size = bytes, .device = tier},
                  [&](Result<Location> r) { created = std::move(r); });
    executor_.Drain();  // room on a GPU may come after spills
    EXPECT_TRUE(created.has_value() && created->ok())
        << (created ? created->status().ToString() : "no answer");
    if (!created || !created->ok()) return {};
    const Location at = **created;
    Fill(at, fill);
    std::optional<Status> sealed;
    store_.Seal(kClient, Id(n), [&](Status st) { sealed = st; });
    EXPECT_TRUE(sealed && sealed->ok());
    return at;
  }
  void Fill(const Location& at, std::byte fill) {
    std::memset(reinterpret_cast<void*>(Address(at)), static_cast<int>(fill), at.data_size);
  }
  uint64_t Address(const Location& at) const {
    if (at.device == kHost) {
      return reinterpret_cast<uint64_t>(tiers_->arena->base(at.segment) + at.offset);
    }
    return tiers_->pools[at.device]->address(at.segment, at.offset);
  }
  // Gets `ids` on `tier`; the answer, once there is one.
  std::optional<std::vector<GetResult>> Get(std::vector<ObjectId> ids, int32_t tier,
                                            bool drain = true) {
    answer_.reset();
    EXPECT_TRUE(store_
                    .Get(kClient, /*request=*/1, std::move(ids), tier, 0,
                         [this](std::vector<GetResult> r) { answer_ = std::move(r); })
                    .ok());
    if (drain) executor_.Drain();
    return answer_;
  }
  void Release(uint64_t n, int32_t tier) {
    const ObjectId id = Id(n);
    EXPECT_TRUE(store_.Release(kClient, std::span(&id, 1), tier).ok());
  }

  boost::asio::io_context loop_;
  ManualExecutor executor_;
  std::unique_ptr<Tiers> tiers_;
  ObjectStore store_;
  std::optional<std::vector<GetResult>> answer_;
};

TEST_F(ObjectStoreTest, AGetOnTheHostFindsWhatWasPutWhereTheCreateSaidItWas) {
  const Location put = Put(1, 1000);
  auto got = Get({Id(1), Id(2)}, kHost);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ((*got)[0].code, StatusCode::kOk);
  EXPECT_EQ((*got)[0].location.segment, put.segment);
  EXPECT_EQ((*got)[0].location.offset, put.offset);
  EXPECT_EQ((*got)[1].code, StatusCode::kNotFound);
  EXPECT_EQ(store_.UsageOf(kClient).references, 2u);  // its creator's and the get's
  EXPECT_EQ(store_.counters().get_hits, 1u);
}

TEST_F(ObjectStoreTest, AGetOnAGpuWaitsForTheCopyAndGetsTheSameBytes) {
  Put(1, 1000, kHost, std::byte{42});
  auto got = Get({Id(1)}, 0, /*drain=*/false);
  EXPECT_FALSE(got.has_value());  // the copy has not run
  EXPECT_EQ(store_.TiersOf(store_.SlotOf(Id(1))), ipc::kTierHost);
  executor_.Drain();
  ASSERT_TRUE(answer_.has_value());
  const GetResult& r = (*answer_)[0];
  ASSERT_EQ(r.code, StatusCode::kOk);
  EXPECT_EQ(r.location.device, 0);
  const auto* bytes = reinterpret_cast<const std::byte*>(Address(r.location));
  EXPECT_EQ(bytes[0], std::byte{42});
  EXPECT_EQ(bytes[999], std::byte{42});
  EXPECT_EQ(store_.TiersOf(r.location.slot), ipc::kTierHost | ipc::TierBit(0));
  EXPECT_EQ(store_.counters().replicas_made, 1u);
  // The daemon's reference to the source is gone with the copy.
  EXPECT_EQ(store_.UsageOf(kDaemonClient).references, 0u);
}

TEST_F(ObjectStoreTest, LocateSaysWhereTheBytesAreAndWhereACopyIsGoing) {
  Put(1, 1000);
  Put(2, 64, 0);
  Get({Id(1)}, 0, /*drain=*/false);  // a copy of object 1 to GPU 0 is under way
  const std::vector<ObjectId> ids{Id(1), Id(2), Id(3)};
  std::vector<Placement> where = store_.Locate(ids);
  ASSERT_EQ(where.size(), 3u);
  EXPECT_TRUE(where[0].found);
  EXPECT_EQ(where[0].tiers, ipc::kTierHost);
  EXPECT_EQ(where[0].arriving, ipc::TierBit(0));
  EXPECT_EQ(where[0].data_size, 1000u);
  EXPECT_EQ(where[1].tiers, ipc::TierBit(0));
  EXPECT_FALSE(where[2].found);
  executor_.Drain();
  where = store_.Locate(ids);
  EXPECT_EQ(where[0].tiers, ipc::kTierHost | ipc::TierBit(0));
  EXPECT_EQ(where[0].arriving, 0u);
  EXPECT_EQ(store_.UsageOf(kClient).references, 3u);  // Locate held nothing
}

TEST_F(ObjectStoreTest, APrefetchMakesTheCopyAndHoldsNothingSoTheGetMakesNone) {
  Put(1, 1000);
  Release(1, kHost);
  std::optional<std::vector<GetResult>> prefetched;
  const std::vector<ObjectId> ids{Id(1), Id(2)};
  ASSERT_TRUE(
      store_.Prefetch(kClient, ids, 0, [&](std::vector<GetResult> r) { prefetched = std::move(r); })
          .ok());
  EXPECT_FALSE(prefetched.has_value());  // answered when the copy is there
  executor_.Drain();
  ASSERT_TRUE(prefetched.has_value());
  EXPECT_EQ((*prefetched)[0].code, StatusCode::kOk);
  EXPECT_EQ((*prefetched)[1].code, StatusCode::kNotFound);
  EXPECT_EQ(store_.UsageOf(kClient).references, 0u);
  EXPECT_EQ(store_.counters().replicas_made, 1u);
  auto got = Get({Id(1)}, 0, /*drain=*/false);  // answered at once: no copy to wait for
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ((*got)[0].code, StatusCode::kOk);
  EXPECT_EQ(store_.counters().replicas_made, 1u);
}

TEST_F(ObjectStoreTest, AFullGpuSpillsItsLeastRecentlyUsedObjectToHostMemory) {
  // The pool holds 2 MiB: two objects of 1 MiB fill it.
  Put(1, kMiB, 0, std::byte{1});
  Put(2, kMiB, 0, std::byte{2});
  Release(1, 0);
  Release(2, 0);
  const Location third = Put(3, kMiB, 0);  // room comes from spilling object 1
  EXPECT_EQ(third.device, 0);
  EXPECT_EQ(store_.TiersOf(store_.SlotOf(Id(1))), ipc::kTierHost);
  EXPECT_EQ(store_.TiersOf(store_.SlotOf(Id(2))), ipc::TierBit(0));
  EXPECT_EQ(store_.counters().spills, 1u);
  EXPECT_EQ(store_.counters().spilled_bytes, kMiB);
  // The spilled bytes are object 1's.
  auto got = Get({Id(1)}, kHost);
  ASSERT_TRUE(got.has_value());
  ASSERT_EQ((*got)[0].code, StatusCode::kOk);
  EXPECT_EQ(*reinterpret_cast<const std::byte*>(Address((*got)[0].location)), std::byte{1});
}

TEST_F(ObjectStoreTest, AnExtraGpuCopyIsDroppedBeforeAnythingSpills) {
  Put(1, kMiB, kHost);
  Release(1, kHost);
  ASSERT_TRUE(Get({Id(1)}, 0).has_value());  // a replica on GPU 0 besides the host copy
  Release(1, 0);
  Put(2, kMiB, 0);
  Release(2, 0);
  Put(3, kMiB, 0);  // the pool is full: object 1's extra copy goes, nothing spills
  EXPECT_EQ(store_.TiersOf(store_.SlotOf(Id(1))), ipc::kTierHost);
  EXPECT_EQ(store_.counters().replicas_dropped, 1u);
  EXPECT_EQ(store_.counters().spills, 0u);
}

TEST_F(ObjectStoreTest, APoolFullOfHeldObjectsIsAClearOutOfMemory) {
  Put(1, kMiB, 0);
  Put(2, kMiB, 0);  // both still held by their creator
  std::optional<Result<Location>> created;
  store_.Create(kClient, CreateParams{.id = Id(3), .data_size = kMiB, .device = 0},
                [&](Result<Location> r) { created = std::move(r); });
  executor_.Drain();
  ASSERT_TRUE(created.has_value());
  EXPECT_EQ(created->status().code(), StatusCode::kOutOfMemory);
  EXPECT_NE(created->status().message().find("held by references"), std::string::npos)
      << created->status().message();
}

TEST_F(ObjectStoreTest, UnderHostPressureAHostCopyOfAGpuObjectGoesBeforeAnyEviction) {
  // 8 MiB of host memory in 4 MiB segments.
  Put(1, kMiB, 0);
  Release(1, 0);
  ASSERT_TRUE(Get({Id(1)}, kHost).has_value());  // a host copy besides the GPU one
  Release(1, kHost);
  for (uint64_t n = 2; n <= 8; ++n) {
    Put(n, kMiB);
    Release(n, kHost);
  }
  Put(9, kMiB);  // the arena is full: object 1's host copy is the first to go
  EXPECT_EQ(store_.TiersOf(store_.SlotOf(Id(1))), ipc::TierBit(0));
  EXPECT_EQ(store_.counters().evictions, 0u);
  EXPECT_EQ(store_.counters().replicas_dropped, 1u);
  Put(10, kMiB);  // now an object goes: the least recently used, object 2
  EXPECT_EQ(store_.counters().evictions, 1u);
  EXPECT_FALSE(store_.Contains(Id(2)));
  EXPECT_TRUE(store_.Contains(Id(3)));
}

TEST_F(ObjectStoreTest, AFailedCopyToHostReportsWhyForThatIdOnly) {
  // Host memory full of held objects; object 1 lives on the GPU only.
  Put(1, kMiB, 0);
  for (uint64_t n = 2; n <= 9; ++n) Put(n, kMiB);
  auto got = Get({Id(2), Id(1)}, kHost);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ((*got)[0].code, StatusCode::kOk);
  EXPECT_EQ((*got)[1].code, StatusCode::kOutOfMemory);
  // Nothing is left of the failed copy.
  EXPECT_EQ(store_.TiersOf(store_.SlotOf(Id(1))), ipc::TierBit(0));
  EXPECT_EQ(store_.UsageOf(kDaemonClient).references, 0u);
}

TEST_F(ObjectStoreTest, AClientThatGoesWhileACopyRunsLeavesNothingHeld) {
  Put(1, 1000);
  Release(1, kHost);
  Get({Id(1)}, 0, /*drain=*/false);
  store_.RemoveClient(kClient);
  executor_.Drain();  // the copy finishes for nobody
  EXPECT_FALSE(answer_.has_value());
  EXPECT_EQ(store_.UsageOf(kDaemonClient).references, 0u);
  EXPECT_EQ(store_.counters().held_bytes, 0u);
  EXPECT_EQ(store_.device_usage(0).held_bytes, 0u);
  EXPECT_EQ(store_.counters().metadata_bytes, kObjectMetadataBytes);  // the object stays
}

TEST_F(ObjectStoreTest, ListenersHearSealsCopiesAndFreesAfterTheChange) {
  Recorder recorder;
  store_.Subscribe(&recorder);
  Put(1, 1000);
  EXPECT_TRUE(recorder.events.empty());  // the seal's event waits for the loop
  Get({Id(1)}, 0);
  Release(1, kHost);
  Release(1, 0);
  const ObjectId id = Id(1);
  store_.Delete(std::span(&id, 1));
  executor_.Drain();
  const std::string hex = Id(1).Hex().substr(0, 4);
  EXPECT_EQ(recorder.events, (std::vector<std::string>{"sealed " + hex + " tiers 1",
                                                       "ready " + hex + " on 0", "freed " + hex}));
  store_.Unsubscribe(&recorder);
  Put(2, 10);
  executor_.Drain();
  EXPECT_EQ(recorder.events.size(), 3u);
}

TEST_F(ObjectStoreTest, AnEventIsNotDeliveredInsideTheCallThatCausedIt) {
  Recorder recorder;
  store_.Subscribe(&recorder);
  std::optional<Result<Location>> created;
  store_.Create(kClient, CreateParams{.id = Id(1), .data_size = 10},
                [&](Result<Location> r) { created = std::move(r); });
  store_.Seal(kClient, Id(1), [](Status) {});
  EXPECT_TRUE(recorder.events.empty());
  executor_.Drain();
  EXPECT_EQ(recorder.events.size(), 1u);
  store_.Unsubscribe(&recorder);
}

// Failed objects (SealFailed): made only by the daemon, for the scheduler.

TEST_F(ObjectStoreTest, AGetOfAFailedObjectAnswersTaskFailedWithItsMessageAndHoldsNothing) {
  const ObjectId id = Id(1);
  EXPECT_EQ(store_.SealFailed(kClient, std::span(&id, 1), "worker 3 died"), 1u);
  for (int32_t tier : {kHost, 0}) {
    auto got = Get({Id(1)}, tier);
    ASSERT_TRUE(got.has_value());
    EXPECT_EQ((*got)[0].code, StatusCode::kTaskFailed);
    ASSERT_NE((*got)[0].failure, nullptr);
    EXPECT_EQ(*(*got)[0].failure, "worker 3 died");
  }
  EXPECT_EQ(store_.UsageOf(kClient).references, 0u);
  EXPECT_EQ(store_.FailureOf(Id(1)), "worker 3 died");
  EXPECT_TRUE(store_.Contains(Id(1)));
  EXPECT_EQ(store_.counters().objects_sealed, 1u);
  EXPECT_EQ(store_.counters().replicas_made, 0u);  // no copy to the GPU was tried
  const ObjectView view = store_.Describe(store_.SlotOf(Id(1)));
  EXPECT_TRUE(view.sealed && view.failed);
  EXPECT_EQ(view.data_size, 0u);
}

TEST_F(ObjectStoreTest, LocateSaysAnObjectIsFailedAndHasNoBytes) {
  const ObjectId id = Id(1);
  store_.SealFailed(kClient, std::span(&id, 1), "bad input");
  const std::vector<Placement> where = store_.Locate(std::span(&id, 1));
  EXPECT_TRUE(where[0].found);
  EXPECT_TRUE(where[0].failed);
  EXPECT_EQ(where[0].tiers, 0u);
  EXPECT_EQ(where[0].data_size + where[0].metadata_size, 0u);
}

TEST_F(ObjectStoreTest, AGetWaitingForAnIdIsAnsweredTaskFailedWhenItIsSealedAsFailed) {
  std::optional<std::vector<GetResult>> answer;
  ASSERT_TRUE(store_
                  .Get(kClient, /*request=*/1, {Id(1), Id(2)}, kHost, /*timeout_ms=*/-1,
                       [&](std::vector<GetResult> r) { answer = std::move(r); })
                  .ok());
  const std::vector<ObjectId> ids{Id(1), Id(2)};
  store_.SealFailed(kClient, ids, "out of patience");
  ASSERT_TRUE(answer.has_value());
  for (const GetResult& r : *answer) {
    EXPECT_EQ(r.code, StatusCode::kTaskFailed);
    ASSERT_NE(r.failure, nullptr);
    EXPECT_EQ(*r.failure, "out of patience");
  }
}

TEST_F(ObjectStoreTest, AWaitTakesNothingAndCountsObjectsSealedOnAnyTierOrAsFailed) {
  Put(1, 1000, /*tier=*/0);  // on a GPU only
  const ObjectId failed = Id(2);
  store_.SealFailed(kClient, std::span(&failed, 1), "bad input");
  std::optional<std::vector<GetResult>> answer;
  ASSERT_TRUE(store_
                  .Wait(kClient, /*request=*/3, {Id(1), Id(2), Id(3)}, /*count=*/2,
                        /*timeout_ms=*/-1, [&](std::vector<GetResult> r) { answer = std::move(r); })
                  .ok());
  executor_.Drain();
  ASSERT_TRUE(answer.has_value());  // at once: two of three are sealed
  EXPECT_EQ((*answer)[0].code, StatusCode::kOk);
  EXPECT_EQ((*answer)[1].code, StatusCode::kTaskFailed);
  EXPECT_EQ((*answer)[2].code, StatusCode::kNotFound);
  const ObjectId first = Id(1);
  EXPECT_EQ(store_.Locate(std::span(&first, 1))[0].tiers, ipc::TierBit(0)) << "no copy made";
  EXPECT_EQ(store_.UsageOf(kClient).references, 1u) << "only the creator's own";
}

TEST_F(ObjectStoreTest, AWaitForAllIsAnsweredByTheLastSealAndCanBeCancelled) {
  std::optional<std::vector<GetResult>> all;
  ASSERT_TRUE(store_
                  .Wait(kClient, /*request=*/5, {Id(1), Id(2)}, /*count=*/0, /*timeout_ms=*/-1,
                        [&](std::vector<GetResult> r) { all = std::move(r); })
                  .ok());
  Put(1, 100);
  EXPECT_FALSE(all.has_value());
  Put(2, 100);
  ASSERT_TRUE(all.has_value());
  EXPECT_EQ((*all)[0].code, StatusCode::kOk);
  EXPECT_EQ((*all)[1].code, StatusCode::kOk);

  std::optional<std::vector<GetResult>> cancelled;
  ASSERT_TRUE(store_
                  .Get(kClient, /*request=*/6, {Id(1), Id(9)}, kHost, /*timeout_ms=*/-1,
                       [&](std::vector<GetResult> r) { cancelled = std::move(r); })
                  .ok());
  EXPECT_FALSE(store_.CancelWait(kClient + 1, 6));
  EXPECT_TRUE(store_.CancelWait(kClient, 6));
  ASSERT_TRUE(cancelled.has_value());
  EXPECT_EQ((*cancelled)[0].code, StatusCode::kOk);  // granted: the client gives it back
  EXPECT_EQ((*cancelled)[1].code, StatusCode::kTimeout);
  EXPECT_FALSE(store_.CancelWait(kClient, 6));
}

TEST_F(ObjectStoreTest, AWaitForMoreObjectsThanItNamesIsRefused) {
  bool answered = false;
  const Status st = store_.Wait(kClient, 1, {Id(1)}, /*count=*/2, -1,
                                [&](std::vector<GetResult>) { answered = true; });
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("can never end"), std::string::npos) << st.message();
  EXPECT_FALSE(answered);
}

TEST_F(ObjectStoreTest, APutByTheDaemonSealsTheBytesAndLeavesThemUnreferenced) {
  const std::string data = "value";
  const std::string metadata = "meta";
  ASSERT_TRUE(store_
                  .Put(kClient, CreateParams{.id = Id(1),
                                             .data_size = data.size(),
                                             .metadata = std::as_bytes(std::span(metadata)),
                                             .data = std::as_bytes(std::span(data))})
                  .ok());
  EXPECT_EQ(store_.UsageOf(kClient).references, 0u);
  EXPECT_EQ(store_.counters().objects_sealed, 1u);
  auto got = Get({Id(1)}, kHost);
  ASSERT_TRUE(got.has_value());
  ASSERT_EQ((*got)[0].code, StatusCode::kOk);
  const std::byte* bytes = reinterpret_cast<const std::byte*>(Address((*got)[0].location));
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(bytes), data.size()), data);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(bytes) + data.size(), metadata.size()),
            metadata);
  // As a create: an id taken, bytes that are not all of the object, a GPU, a checksum.
  EXPECT_EQ(store_.Put(kClient, CreateParams{.id = Id(1)}).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(store_.Put(kClient, CreateParams{.id = Id(2), .data_size = 3}).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(store_.Put(kClient, CreateParams{.id = Id(3), .device = 0}).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(store_.Put(kClient, CreateParams{.id = Id(4), .checksum = true}).code(),
            StatusCode::kInvalidArgument);
  EXPECT_FALSE(store_.Contains(Id(2)));
}

TEST_F(ObjectStoreTest, SealFailedLeavesIdsThatExistAsTheyAre) {
  Put(1, 100);
  store_.Create(kClient, CreateParams{.id = Id(2), .data_size = 10}, [](Result<Location>) {});
  const std::vector<ObjectId> ids{Id(1), Id(2), Id(3)};
  EXPECT_EQ(store_.SealFailed(kClient, ids, "failed"), 1u);
  auto got = Get({Id(1), Id(3)}, kHost);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ((*got)[0].code, StatusCode::kOk);
  EXPECT_EQ((*got)[1].code, StatusCode::kTaskFailed);
  const std::vector<Placement> where = store_.Locate(ids);
  EXPECT_FALSE(where[1].found);
  EXPECT_TRUE(where[1].creating);  // still its creator's to seal
  std::optional<Status> sealed;
  store_.Seal(kClient, Id(2), [&](Status st) { sealed = st; });
  EXPECT_TRUE(sealed && sealed->ok());
}

TEST_F(ObjectStoreTest, AFailedObjectCannotBeCreatedSealedOrAbortedByAClient) {
  const ObjectId id = Id(1);
  store_.SealFailed(kClient, std::span(&id, 1), "no");
  std::optional<Result<Location>> created;
  store_.Create(kClient, CreateParams{.id = id, .data_size = 10},
                [&](Result<Location> r) { created = std::move(r); });
  ASSERT_TRUE(created.has_value());
  EXPECT_EQ(created->status().code(), StatusCode::kAlreadyExists);
  std::optional<Status> sealed;
  store_.Seal(kClient, id, [&](Status st) { sealed = st; });
  EXPECT_EQ(sealed->code(), StatusCode::kAlreadySealed);
  EXPECT_EQ(store_.Abort(kClient, id).code(), StatusCode::kAlreadySealed);
  EXPECT_EQ(store_.FailureOf(id), "no");
}

TEST_F(ObjectStoreTest, ALongFailureMessageIsCutAtACharacterBoundary) {
  // 4,095 bytes of 'a', then a two-byte character across the 4,096-byte bound.
  const std::string message = std::string(4095, 'a') + "\xc3\xa9" + "tail";
  const ObjectId id = Id(1);
  store_.SealFailed(kClient, std::span(&id, 1), message);
  EXPECT_EQ(store_.FailureOf(id), std::string(4095, 'a'));
}

TEST_F(ObjectStoreTest, AFailedObjectIsCountedDeletedAndEvictedLikeAnyOther) {
  Recorder recorder;
  store_.Subscribe(&recorder);
  const uint64_t before = store_.counters().metadata_bytes;
  const std::vector<ObjectId> ids{Id(1), Id(2)};
  store_.SealFailed(kClient, ids, "why");
  EXPECT_EQ(store_.counters().metadata_bytes, before + 2 * (kObjectMetadataBytes + 3));
  EXPECT_EQ(store_.UsageOf(kClient).references, 0u);
  EXPECT_EQ(store_.Delete(std::span(&ids[0], 1))[0], StatusCode::kOk);
  EXPECT_EQ(store_.EvictUnreferenced(0, /*all=*/true).objects, 1u);
  EXPECT_FALSE(store_.Contains(Id(2)));
  EXPECT_EQ(store_.counters().metadata_bytes, before);
  EXPECT_EQ(store_.counters().objects_sealed, 0u);
  executor_.Drain();
  const std::string one = Id(1).Hex().substr(0, 4), two = Id(2).Hex().substr(0, 4);
  EXPECT_EQ(recorder.events, (std::vector<std::string>{"failed " + one, "failed " + two,
                                                       "freed " + one, "freed " + two}));
  store_.Unsubscribe(&recorder);
}

}  // namespace
}  // namespace depot::store
