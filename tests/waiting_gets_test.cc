// Waiting gets on their own: the index by object, time-outs, costs and clients that go.
#include "store/waiting_gets.h"

#include <gtest/gtest.h>

#include <chrono>
#include <optional>

namespace depot::store {
namespace {

using Wait = WaitingGets::Wait;

ObjectId Id(uint64_t n) { return ObjectId::FromWords(n, 0xfeed); }

class WaitingGetsTest : public ::testing::Test {
 protected:
  WaitingGetsTest() { accounts_.Open(1, 1000); }

  // A get of `ids` by client 1 on the host, each waiting as `waits` says.
  WaitingGets::Id Add(std::vector<ObjectId> ids, std::vector<Wait> waits, int64_t timeout_ms,
                      uint64_t cost = 0, uint64_t request = 0) {
    WaitingGets::Get get{.client = 1, .request = request, .tier = kHost, .ids = std::move(ids)};
    get.results.resize(get.ids.size());
    get.waits = std::move(waits);
    for (Wait w : get.waits) get.missing += w != Wait::kNone;
    get.cost = cost;
    get.done = [this](std::vector<GetResult> results) { answer_ = std::move(results); };
    return gets_.Add(std::move(get), timeout_ms);
  }

  // A wait of client 1 for `enough` of `ids`, all of them waiting for their seal.
  WaitingGets::Id AddWait(std::vector<ObjectId> ids, size_t enough, uint64_t request) {
    WaitingGets::Get get{.client = 1,
                         .request = request,
                         .hold = false,
                         .wait = true,
                         .enough = enough,
                         .ids = std::move(ids)};
    get.results.resize(get.ids.size());
    get.waits.assign(get.ids.size(), Wait::kSeal);
    get.missing = get.ids.size();
    get.done = [this](std::vector<GetResult> results) { answer_ = std::move(results); };
    return gets_.Add(std::move(get), -1);
  }

  boost::asio::io_context loop_;
  ClientAccounts accounts_{{}, 1};
  WaitingGets gets_{loop_, accounts_};
  std::optional<std::vector<GetResult>> answer_;
};

TEST_F(WaitingGetsTest, ASealFindsEachIdWaitingForItByGet) {
  using Waiter = WaitingGets::SealWaiter;
  const auto first = Add({Id(1), Id(2), Id(1)}, {Wait::kSeal, Wait::kSeal, Wait::kSeal}, -1);
  const auto second = Add({Id(1)}, {Wait::kSeal}, -1);
  EXPECT_EQ(gets_.TakeSealWaiters(Id(1)),
            (std::vector<Waiter>{{first, 0}, {first, 2}, {second, 0}}));
  EXPECT_TRUE(gets_.TakeSealWaiters(Id(1)).empty());  // taken
  EXPECT_EQ(gets_.TakeSealWaiters(Id(2)), (std::vector<Waiter>{{first, 1}}));
}

TEST_F(WaitingGetsTest, AGetIsAnsweredWhenItsLastIdIsResolved) {
  const auto id = Add({Id(1), Id(2)}, {Wait::kSeal, Wait::kCopy}, -1);
  WaitingGets::Get* get = gets_.Find(id);
  ASSERT_NE(get, nullptr);
  get->Resolve(0, GetResult{StatusCode::kOk, Location{.slot = 4}});
  gets_.FinishIfDone(id);
  EXPECT_FALSE(answer_.has_value());
  gets_.Find(id)->Resolve(1, GetResult{StatusCode::kOutOfMemory, {}});
  gets_.FinishIfDone(id);
  ASSERT_TRUE(answer_.has_value());
  EXPECT_EQ((*answer_)[0].location.slot, 4u);
  EXPECT_EQ((*answer_)[1].code, StatusCode::kOutOfMemory);
  EXPECT_EQ(gets_.Find(id), nullptr);
  EXPECT_EQ(gets_.CountOf(1), 0u);
}

TEST_F(WaitingGetsTest, ATimeOutAnswersTheSealsStillMissingButWaitsForCopies) {
  const auto id = Add({Id(1), Id(2)}, {Wait::kSeal, Wait::kCopy}, 1);
  // The timer fires within the bound (1 ms asked, 10 s allowed).
  EXPECT_EQ(loop_.run_one_for(std::chrono::seconds(10)), 1u);
  EXPECT_FALSE(answer_.has_value());  // the copy is still under way
  EXPECT_EQ(gets_.timeouts(), 1u);
  EXPECT_TRUE(gets_.TakeSealWaiters(Id(1)).empty());  // no longer waits for the seal
  gets_.Find(id)->Resolve(1, GetResult{StatusCode::kOk, {}});
  gets_.FinishIfDone(id);
  ASSERT_TRUE(answer_.has_value());
  EXPECT_EQ((*answer_)[0].code, StatusCode::kTimeout);
  EXPECT_EQ((*answer_)[1].code, StatusCode::kOk);
}

TEST_F(WaitingGetsTest, AGetWaitingOnlyForCopiesHasNoTimer) {
  Add({Id(1)}, {Wait::kCopy}, 1);
  EXPECT_EQ(loop_.poll(), 0u);
  EXPECT_FALSE(answer_.has_value());
}

TEST_F(WaitingGetsTest, ItsCostCountsAgainstItsClientUntilAnswered) {
  const auto id = Add({Id(1)}, {Wait::kSeal}, -1, 200);
  EXPECT_EQ(accounts_.at(1).metadata_bytes, 200u);
  EXPECT_EQ(accounts_.metadata_bytes(), 200u);
  gets_.TakeSealWaiters(Id(1));
  gets_.Find(id)->Resolve(0, GetResult{});
  gets_.FinishIfDone(id);
  EXPECT_EQ(accounts_.at(1).metadata_bytes, 0u);
  EXPECT_EQ(accounts_.metadata_bytes(), 0u);
}

TEST_F(WaitingGetsTest, AClientThatGoesTakesItsGetsUnanswered) {
  Add({Id(1)}, {Wait::kSeal}, 1, 200);
  Add({Id(2)}, {Wait::kCopy}, -1, 200);
  EXPECT_EQ(gets_.CountOf(1), 2u);
  gets_.DropClient(1);
  EXPECT_EQ(gets_.CountOf(1), 0u);
  EXPECT_EQ(accounts_.metadata_bytes(), 0u);
  EXPECT_TRUE(gets_.TakeSealWaiters(Id(1)).empty());
  loop_.run();  // the cancelled timer runs, and answers nothing
  EXPECT_FALSE(answer_.has_value());
  EXPECT_EQ(gets_.timeouts(), 0u);
}

// Gets that stop waiting (here: time out) leave the index to the ones still waiting, whether
// they named the id once or a thousand times (their entries go in passes, not one by one).
TEST_F(WaitingGetsTest, GetsThatStopWaitingLeaveOnlyTheLiveOnesIndexed) {
  using Waiter = WaitingGets::SealWaiter;
  const auto before = Add({Id(1), Id(2)}, {Wait::kSeal, Wait::kSeal}, -1);
  size_t expiring = 0;
  for (int i = 0; i < 50; ++i, ++expiring) Add({Id(1)}, {Wait::kSeal}, 1);
  Add(std::vector<ObjectId>(1000, Id(1)), std::vector<Wait>(1000, Wait::kSeal), 1);
  expiring += 1000;
  const auto after = Add({Id(3), Id(1)}, {Wait::kSeal, Wait::kSeal}, -1);
  // Each timer fires within the bound (1 ms asked, 10 s allowed).
  while (gets_.timeouts() < expiring) ASSERT_EQ(loop_.run_one_for(std::chrono::seconds(10)), 1u);
  EXPECT_EQ(gets_.CountOf(1), 2u);
  EXPECT_EQ(gets_.TakeSealWaiters(Id(1)), (std::vector<Waiter>{{before, 0}, {after, 1}}));
  EXPECT_EQ(gets_.TakeSealWaiters(Id(2)), (std::vector<Waiter>{{before, 1}}));
  gets_.DropClient(1);
  EXPECT_TRUE(gets_.TakeSealWaiters(Id(3)).empty());
}

TEST_F(WaitingGetsTest, AWaitIsAnsweredOnceEnoughIdsAreResolvedAndTheRestTimeOut) {
  const auto id = AddWait({Id(1), Id(2), Id(3)}, 2, /*request=*/7);
  for (auto [object, index] : gets_.TakeSealWaiters(Id(2))) {
    gets_.Find(object)->Resolve(index, GetResult{});
    gets_.FinishIfDone(object);
  }
  EXPECT_FALSE(answer_.has_value());  // one of two
  gets_.TakeSealWaiters(Id(3));
  gets_.Find(id)->Resolve(2, GetResult{StatusCode::kTaskFailed, {}});
  gets_.FinishIfDone(id);
  ASSERT_TRUE(answer_.has_value());
  EXPECT_EQ((*answer_)[0].code, StatusCode::kTimeout);
  EXPECT_EQ((*answer_)[1].code, StatusCode::kOk);
  EXPECT_EQ((*answer_)[2].code, StatusCode::kTaskFailed);
  EXPECT_EQ(gets_.Find(id), nullptr);
  EXPECT_TRUE(gets_.TakeSealWaiters(Id(1)).empty());  // no longer indexed
  EXPECT_EQ(gets_.timeouts(), 0u);                    // answered, not timed out
}

TEST_F(WaitingGetsTest, CancellingAGetAnswersItAtOnceWithWhatItStillWaitedForTimedOut) {
  const auto id = Add({Id(1), Id(2), Id(3)}, {Wait::kSeal, Wait::kCopy, Wait::kNone}, -1, 200,
                      /*request=*/42);
  gets_.Find(id)->results[2] = GetResult{StatusCode::kOk, Location{.slot = 9}};
  EXPECT_FALSE(gets_.Cancel(1, /*request=*/41));  // not that request
  EXPECT_FALSE(gets_.Cancel(2, /*request=*/42));  // nor another client's
  EXPECT_FALSE(answer_.has_value());
  EXPECT_TRUE(gets_.Cancel(1, 42));
  ASSERT_TRUE(answer_.has_value());
  EXPECT_EQ((*answer_)[0].code, StatusCode::kTimeout);
  EXPECT_EQ((*answer_)[1].code, StatusCode::kTimeout);  // the copy is not waited for
  EXPECT_EQ((*answer_)[2].location.slot, 9u);           // what it was granted stays
  EXPECT_EQ(gets_.Find(id), nullptr);
  EXPECT_EQ(accounts_.metadata_bytes(), 0u);
  EXPECT_TRUE(gets_.TakeSealWaiters(Id(1)).empty());
  EXPECT_EQ(gets_.cancelled(), 1u);
  EXPECT_EQ(gets_.timeouts(), 0u);
  EXPECT_FALSE(gets_.Cancel(1, 42));  // answered already
}

TEST_F(WaitingGetsTest, AGetWithNoRequestIdCannotBeCancelled) {
  Add({Id(1)}, {Wait::kSeal}, -1);
  EXPECT_FALSE(gets_.Cancel(1, 0));
  EXPECT_EQ(gets_.CountOf(1), 1u);
}

}  // namespace
}  // namespace depot::store
