// Gets and waits the daemon answers later (depot::Pending): one request however long, and
// in however many slices, its caller waits; cancelled at once; given back when dropped; and
// learnt of by an event loop that never blocks.
#include <poll.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "daemon.h"
#include "depot/client.h"
#include "test_support.h"

namespace depot::testing {
namespace {

using std::chrono::milliseconds;

class WaitsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(daemon_.ok()) << daemon_.error();
    ASSERT_OK_AND_ASSIGN(client_, Client::Connect(daemon_.socket_path()));
    ASSERT_OK_AND_ASSIGN(other_, Client::Connect(daemon_.socket_path()));
  }

  // This client's session as the daemon sees it: requests sent, references held.
  ClientInfo Mine() {
    auto clients = client_->Clients();
    EXPECT_TRUE(clients.ok()) << clients.status().ToString();
    for (const ClientInfo& c : *clients) {
      if (c.session_id == client_->session_id()) return c;
    }
    ADD_FAILURE() << "this session is not among the daemon's clients";
    return {};
  }

  TestDaemon daemon_;
  std::optional<Client> client_;
  std::optional<Client> other_;  // puts what client_ waits for
};

TEST_F(WaitsTest, AGetThatWaitsIsOneRequestHoweverItsCallerWaits) {
  const ObjectId id = ObjectId::FromName("waits/later");
  const uint64_t before = Mine().requests;
  ASSERT_OK_AND_ASSIGN(auto pending,
                       client_->StartGet(std::span(&id, 1), std::chrono::seconds(10)));
  EXPECT_NE(pending.id(), 0u);
  // The caller looks in slices (as Python does, to notice Ctrl-C): no slice asks again.
  for (int i = 0; i < 5; ++i) EXPECT_FALSE(pending.Ready(milliseconds(20)));
  const std::vector<std::byte> data = SeededBytes(4096, 3);
  ASSERT_OK(other_->Put(id, data));
  ASSERT_OK_AND_ASSIGN(auto buffers, pending.Take());
  ASSERT_EQ(buffers.size(), 1u);
  ASSERT_TRUE(buffers[0]);
  EXPECT_TRUE(SameBytes(buffers[0].data(), data));
  // The get, and the Clients request that counts them.
  EXPECT_EQ(Mine().requests - before, 2u);
  EXPECT_EQ(pending.Take().status().code(), StatusCode::kInvalidArgument);  // taken once
}

TEST_F(WaitsTest, AGetThatTimesOutIsAnsweredByTheDaemonWithNothing) {
  const ObjectId id = ObjectId::FromName("waits/never");
  ASSERT_OK_AND_ASSIGN(auto pending, client_->StartGet(std::span(&id, 1), milliseconds(30)));
  ASSERT_OK_AND_ASSIGN(auto buffers, pending.Take());
  ASSERT_EQ(buffers.size(), 1u);
  EXPECT_FALSE(buffers[0]);
}

TEST_F(WaitsTest, ACancelledGetIsAnsweredAtOnceWithWhatItWasGranted) {
  const ObjectId there = ObjectId::FromName("waits/there"), missing = ObjectId::FromName("waits/x");
  ASSERT_OK(other_->Put(there, SeededBytes(100, 1)));
  const std::vector<ObjectId> ids{there, missing};
  ASSERT_OK_AND_ASSIGN(auto pending, client_->StartGet(ids, kForever));
  EXPECT_FALSE(pending.Ready(milliseconds(20)));
  ASSERT_OK(pending.Cancel());
  ASSERT_OK_AND_ASSIGN(auto buffers, pending.Take());
  ASSERT_EQ(buffers.size(), 2u);
  EXPECT_TRUE(buffers[0]);
  EXPECT_FALSE(buffers[1]);
  buffers.clear();
  EXPECT_EQ(Mine().references, 0u);
}

TEST_F(WaitsTest, DroppingAnUnansweredGetCancelsItAndGivesBackWhatItWasGranted) {
  const ObjectId there = ObjectId::FromName("waits/held"), missing = ObjectId::FromName("waits/y");
  ASSERT_OK(other_->Put(there, SeededBytes(100, 1)));
  const std::vector<ObjectId> ids{there, missing};
  {
    ASSERT_OK_AND_ASSIGN(auto pending, client_->StartGet(ids, kForever));
    EXPECT_FALSE(pending.Ready());
  }
  EXPECT_EQ(Mine().references, 0u);
  // Nothing waits in the daemon any more: a seal now answers nobody, and the client's next
  // requests are answered in order.
  ASSERT_OK(other_->Put(missing, SeededBytes(10, 2)));
  ASSERT_OK_AND_ASSIGN(Buffer got, client_->Get(missing));
  EXPECT_EQ(got.size(), 10u);
}

TEST_F(WaitsTest, AWaitSaysWhichAreSealedOnceEnoughAreAndHoldsNothing) {
  const ObjectId a = ObjectId::FromName("waits/a"), b = ObjectId::FromName("waits/b");
  const std::vector<ObjectId> ids{a, b};
  ASSERT_OK_AND_ASSIGN(auto first, client_->StartWait(ids, /*count=*/1, std::chrono::seconds(10)));
  ASSERT_OK_AND_ASSIGN(auto all, client_->StartWait(ids, /*count=*/0, std::chrono::seconds(10)));
  EXPECT_FALSE(first.Ready(milliseconds(20)));
  ASSERT_OK(other_->Put(b, SeededBytes(10, 1)));
  ASSERT_OK_AND_ASSIGN(auto sealed, first.Take());
  EXPECT_EQ(sealed, (std::vector<bool>{false, true}));
  EXPECT_FALSE(all.Ready());
  ASSERT_OK(other_->Put(a, SeededBytes(10, 2)));
  ASSERT_OK_AND_ASSIGN(sealed, all.Take());
  EXPECT_EQ(sealed, (std::vector<bool>{true, true}));
  EXPECT_EQ(Mine().references, 0u);

  const ObjectId missing = ObjectId::FromName("waits/z");
  ASSERT_OK_AND_ASSIGN(sealed, client_->Wait(std::span(&missing, 1), 1, milliseconds(20)));
  EXPECT_EQ(sealed, std::vector<bool>{false});
  EXPECT_EQ(client_->Wait(std::span(&missing, 1), 2).status().code(), StatusCode::kInvalidArgument);
}

// An event loop starts many gets and learns of their answers through the two descriptors,
// never blocking; another thread's calls on the same client meanwhile read some of those
// answers, which are announced all the same.
TEST_F(WaitsTest, AnEventLoopLearnsOfEveryAnswerWithoutBlocking) {
  constexpr int kGets = 200;
  std::map<uint64_t, Pending<std::vector<Buffer>>> pending;
  std::vector<ObjectId> ids;
  for (int i = 0; i < kGets; ++i) {
    ids.push_back(ObjectId::FromName("waits/loop/" + std::to_string(i)));
    ASSERT_OK_AND_ASSIGN(auto p, client_->StartGet(std::span(&ids.back(), 1), kForever,
                                                   /*announce=*/true));
    const uint64_t id = p.id();
    pending.emplace(id, std::move(p));
  }
  ASSERT_OK_AND_ASSIGN(const int completions, client_->CompletionFd());
  std::atomic<bool> stop{false};
  std::thread sync_calls([&] {
    while (!stop.load()) (void)client_->Contains(ids[0]);  // becomes the reader now and then
  });
  std::thread putter([&] {
    for (int i = 0; i < kGets; ++i) EXPECT_OK(other_->Put(ids[i], SeededBytes(64, i)));
  });
  std::set<uint64_t> answered;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (answered.size() < kGets && std::chrono::steady_clock::now() < deadline) {
    pollfd fds[2] = {{client_->fd(), POLLIN, 0}, {completions, POLLIN, 0}};
    ASSERT_GE(::poll(fds, 2, 100), 0);
    if (fds[0].revents & POLLIN) client_->Pump();
    for (uint64_t id : client_->TakeCompleted()) {
      EXPECT_TRUE(answered.insert(id).second) << "announced twice: " << id;
      auto it = pending.find(id);
      ASSERT_NE(it, pending.end());
      EXPECT_TRUE(it->second.Ready());  // so Take does not block
    }
  }
  stop = true;
  sync_calls.join();
  putter.join();
  ASSERT_EQ(answered.size(), static_cast<size_t>(kGets));
  for (auto& [id, p] : pending) {
    ASSERT_OK_AND_ASSIGN(auto buffers, p.Take());
    ASSERT_TRUE(buffers[0]);
    EXPECT_EQ(buffers[0].size(), 64u);
  }
}

}  // namespace
}  // namespace depot::testing
