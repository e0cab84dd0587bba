// A client that dies holding references and unsealed objects: the daemon gives everything
// back at once, and leaves alone what the client only read or had sealed.
#include <signal.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "child_process.h"
#include "daemon.h"
#include "depot/client.h"
#include "test_support.h"

namespace depot::testing {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

constexpr uint64_t kMiB = 1 << 20;

class CrashTest : public ::testing::Test {
 protected:
  void SetUp() override {
    daemon_.emplace();
    ASSERT_TRUE(daemon_->ok()) << daemon_->error();
    ASSERT_OK_AND_ASSIGN(client_, Client::Connect(daemon_->socket_path()));
    ASSERT_OK(client_->Put(read_id_, read_data_));
    baseline_ = Stats();
  }

  StoreStatus Stats() {
    auto status = client_->GetStatus();
    EXPECT_TRUE(status.ok()) << status.status().ToString();
    return status.ok() ? *status : StoreStatus{};
  }

  // Starts a client process that reads read_id_ (and keeps the Buffer), puts and seals
  // sealed_id_, creates creating_ids_ without sealing them, then waits to be killed.
  // Returns once the child holds all of it.
  void StartDoomedClient() {
    const std::string socket = daemon_->socket_path();
    ReadyPipe ready;
    doomed_ = ChildProcess::Start([&]() -> int {
      auto client = Client::Connect(socket);
      if (!client.ok()) return ChildFailed(2, client.status().ToString());
      auto read = client->Get(read_id_);
      if (!read.ok()) return ChildFailed(3, read.status().ToString());
      Status put = client->Put(sealed_id_, sealed_data_);
      if (!put.ok()) return ChildFailed(4, put.ToString());
      std::vector<MutableBuffer> creating;
      for (const ObjectId& id : creating_ids_) {
        auto buffer = client->Create(id, 2 * kMiB);
        if (!buffer.ok()) return ChildFailed(5, buffer.status().ToString());
        std::memset(buffer->ptr(), 0x5a, buffer->size());
        creating.push_back(std::move(*buffer));
      }
      ready.Signal();
      for (;;) ::pause();
    });
    ASSERT_TRUE(ready.Wait(milliseconds(10'000))) << "the client process did not get ready";
    const StoreStatus holding = Stats();
    ASSERT_EQ(holding.objects_creating, baseline_.objects_creating + creating_ids_.size());
    ASSERT_GT(holding.held_bytes, baseline_.held_bytes);
  }

  // Kills the client process with SIGKILL and reaps it.
  void KillDoomedClient() {
    ASSERT_TRUE(doomed_.Kill(SIGKILL));
    EXPECT_EQ(doomed_.Wait(), kSignalExitBase + SIGKILL);
  }

  const ObjectId read_id_ = ObjectId::FromName("crash/read-by-victim");
  const std::vector<std::byte> read_data_ = SeededBytes(kMiB, 1);
  const ObjectId sealed_id_ = ObjectId::FromName("crash/sealed-by-victim");
  const std::vector<std::byte> sealed_data_ = SeededBytes(kMiB / 2, 2);
  const std::vector<ObjectId> creating_ids_ = {ObjectId::FromName("crash/creating-1"),
                                               ObjectId::FromName("crash/creating-2")};

  std::optional<TestDaemon> daemon_;
  std::optional<Client> client_;
  StoreStatus baseline_;
  ChildProcess doomed_;
};

TEST_F(CrashTest, KilledClientsReferencesAndReservationsReturnWithin100ms) {
  StartDoomedClient();
  const uint64_t sealed_bytes = sealed_data_.size();  // 64-byte multiple: no rounding
  ASSERT_TRUE(doomed_.Kill(SIGKILL));
  const auto killed = Clock::now();
  // Poll without reaping first: the socket closes when the kernel tears the process down.
  StoreStatus now = Stats();
  while ((now.held_bytes != baseline_.held_bytes || now.objects_creating != 0 ||
          now.used_bytes != baseline_.used_bytes + sealed_bytes) &&
         Clock::now() - killed < milliseconds(2000)) {
    now = Stats();
  }
  const auto took = std::chrono::duration_cast<milliseconds>(Clock::now() - killed);
  EXPECT_EQ(now.held_bytes, baseline_.held_bytes);
  EXPECT_EQ(now.objects_creating, 0u);
  EXPECT_EQ(now.used_bytes, baseline_.used_bytes + sealed_bytes);
  EXPECT_LT(took, milliseconds(100))
      << "the store took " << took.count() << " ms to take back a dead client's holdings";
  EXPECT_EQ(doomed_.Wait(), kSignalExitBase + SIGKILL);
}

TEST_F(CrashTest, KilledClientsUnsealedObjectsAreGone) {
  StartDoomedClient();
  KillDoomedClient();
  const auto deadline = Clock::now() + milliseconds(2000);
  while (Stats().objects_creating != 0 && Clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(1));
  }
  ASSERT_OK_AND_ASSIGN(std::vector<ObjectInfo> listed, client_->List());
  for (const ObjectInfo& info : listed) {
    for (const ObjectId& id : creating_ids_) EXPECT_NE(info.id, id) << "left behind: " << id.Hex();
  }
  for (const ObjectId& id : creating_ids_) {
    EXPECT_STATUS(client_->Get(id), StatusCode::kNotFound);
    // The id is free again.
    EXPECT_OK(client_->Put(id, AsBytes("reborn")));
  }
}

TEST_F(CrashTest, ObjectsAKilledClientOnlyReadSurviveIntact) {
  StartDoomedClient();
  KillDoomedClient();
  const auto deadline = Clock::now() + milliseconds(2000);
  while (Stats().held_bytes != baseline_.held_bytes && Clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(1));
  }
  ASSERT_OK_AND_ASSIGN(Buffer read, client_->Get(read_id_));
  EXPECT_TRUE(SameBytes(read.data(), read_data_));
  ASSERT_OK_AND_ASSIGN(std::vector<ObjectInfo> listed, client_->List());
  for (const ObjectInfo& info : listed) {
    if (info.id == read_id_) {
      EXPECT_EQ(info.ref_count, 1u) << "only our own reference remains";
    }
  }
}

TEST_F(CrashTest, ObjectsAKilledClientSealedSurviveIntact) {
  StartDoomedClient();
  KillDoomedClient();
  ASSERT_OK_AND_ASSIGN(Buffer sealed, client_->Get(sealed_id_));
  EXPECT_TRUE(SameBytes(sealed.data(), sealed_data_));
}

TEST_F(CrashTest, KilledClientsWaitingGetLeavesNoReferenceBehind) {
  const ObjectId id = ObjectId::FromName("crash/awaited");
  const std::string socket = daemon_->socket_path();
  ReadyPipe ready;
  ChildProcess waiter = ChildProcess::Start([&]() -> int {
    auto client = Client::Connect(socket);
    if (!client.ok()) return ChildFailed(2, client.status().ToString());
    ready.Signal();
    auto never = client->Get(id, kForever);
    return ChildFailed(3, "the wait ended: " + never.status().ToString());
  });
  ASSERT_TRUE(ready.Wait(milliseconds(10'000)));
  std::this_thread::sleep_for(milliseconds(50));  // let the get reach the daemon
  ASSERT_TRUE(waiter.Kill(SIGKILL));
  EXPECT_EQ(waiter.Wait(), kSignalExitBase + SIGKILL);
  // Wait until the daemon has seen the session go.
  const auto deadline = Clock::now() + milliseconds(2000);
  while (Stats().clients != 1 && Clock::now() < deadline)
    std::this_thread::sleep_for(milliseconds(1));
  ASSERT_EQ(Stats().clients, 1u);

  ASSERT_OK(client_->Put(id, AsBytes("too late for the dead")));
  ASSERT_OK_AND_ASSIGN(std::vector<ObjectInfo> listed, client_->List());
  for (const ObjectInfo& info : listed) {
    if (info.id == id) {
      EXPECT_EQ(info.ref_count, 0u) << "a reference was granted to a dead client";
    }
  }
  EXPECT_EQ(Stats().held_bytes, baseline_.held_bytes);
}

TEST_F(CrashTest, WaiterGetsTheObjectFromANewCreatorAfterTheFirstDied) {
  StartDoomedClient();
  const ObjectId id = creating_ids_[0];
  ASSERT_OK_AND_ASSIGN(Client reader, Client::Connect(daemon_->socket_path()));
  Result<Buffer> waited = Status::Internal("not run");
  std::thread waiter([&] { waited = reader.Get(id, milliseconds(10'000)); });
  std::this_thread::sleep_for(milliseconds(50));
  KillDoomedClient();
  // The id becomes free once the daemon has seen the creator go.
  const std::vector<std::byte> data = SeededBytes(4096, 3);
  Status put = client_->Put(id, data);
  const auto deadline = Clock::now() + milliseconds(2000);
  while (put.Is(StatusCode::kAlreadyExists) && Clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(1));
    put = client_->Put(id, data);
  }
  ASSERT_OK(put);
  waiter.join();
  ASSERT_OK(waited);
  EXPECT_TRUE(SameBytes(waited->data(), data));
}

}  // namespace
}  // namespace depot::testing
