// Gets through leases against a real daemon (docs/leases.md): a get of an object this client
// has seen takes no round trip; a leased object is neither evicted nor freed until its
// lease goes, however the lease goes (dropped, or the client killed); and the daemon still
// counts leased reads.
#include <signal.h>

#include <gtest/gtest.h>

#include <chrono>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "child_process.h"
#include "daemon.h"
#include "depot/client.h"
#include "store_checks.h"
#include "test_support.h"

namespace depot::testing {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr uint64_t kMiB = 1 << 20;
constexpr uint64_t kObjectBytes = 2 * kMiB;
// Far above the 20 ms between the daemon's looks at leased objects.
constexpr milliseconds kBound{10'000};

// A daemon with room for four kObjectBytes objects.
class LeasedGetsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    daemon_.emplace(std::vector<std::string>{"--memory", "8MiB", "--segment-size", "8MiB"});
    ASSERT_TRUE(daemon_->ok()) << daemon_->error();
    ASSERT_OK_AND_ASSIGN(client_, Client::Connect(daemon_->socket_path()));
  }
  void TearDown() override {
    if (client_ && !HasFatalFailure()) ExpectObjectsOnHostMatchTheList(*client_);
  }

  static ObjectId Id(const std::string& name) { return ObjectId::FromName("leased/" + name); }
  static std::vector<std::byte> Contents(const std::string& name) {
    return SeededBytes(kObjectBytes, Xxh3(AsBytes(name)));
  }
  Status PutObject(const std::string& name) { return client_->Put(Id(name), Contents(name)); }

  // A Buffer of `name` that holds a lease and nothing else: the first get (over the socket)
  // shows this client where it lies, the second takes the lease, and a request sends the
  // first one's release.
  Result<Buffer> Leased(Client& client, const std::string& name) {
    { DEPOT_RETURN_NOT_OK(client.Get(Id(name)).status()); }
    DEPOT_ASSIGN_OR_RETURN(Buffer leased, client.Get(Id(name)));
    DEPOT_RETURN_NOT_OK(client.Contains(Id(name)).status());
    return leased;
  }

  StoreStatus Stats() {
    auto status = client_->GetStatus();
    EXPECT_TRUE(status.ok()) << status.status().ToString();
    return status.ok() ? *status : StoreStatus{};
  }
  bool Contains(const std::string& name) {
    auto r = client_->Contains(Id(name));
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() && *r;
  }
  // Polls the daemon until `done(status)`, for at most kBound; returns whether it came.
  template <typename Done>
  bool Until(Done done) {
    const auto deadline = Clock::now() + kBound;
    while (!done(Stats())) {
      if (Clock::now() > deadline) return false;
      std::this_thread::sleep_for(milliseconds(1));
    }
    return true;
  }

  std::optional<TestDaemon> daemon_;
  std::optional<Client> client_;
};

TEST_F(LeasedGetsTest, AGetOfAnObjectSeenBeforeIsAnsweredWhileTheDaemonIsStopped) {
  ASSERT_OK(PutObject("a"));
  { ASSERT_OK_AND_ASSIGN(Buffer first, client_->Get(Id("a"))); }  // over the socket
  const auto access_time = [&]() -> uint64_t {
    auto listed = client_->List();
    EXPECT_TRUE(listed.ok() && listed->size() == 1);
    return listed.ok() && listed->size() == 1 ? (*listed)[0].access_time_ns : 0;
  };
  const uint64_t accessed = access_time();
  // A daemon that answers nothing: only a get that needs no answer can return.
  ASSERT_EQ(::kill(daemon_->pid(), SIGSTOP), 0);
  Result<Buffer> again = client_->Get(Id("a"), milliseconds(0));
  ASSERT_EQ(::kill(daemon_->pid(), SIGCONT), 0);
  ASSERT_OK(again.status());
  EXPECT_TRUE(SameBytes(again->data(), Contents("a")));
  again = Buffer();  // dropped: the read is reported with the next request
  // The daemon still learns of the read: the object's access time moves.
  EXPECT_TRUE(Until([&](const StoreStatus&) { return access_time() > accessed; }))
      << "the leased read was not reported";
}

TEST_F(LeasedGetsTest, ADeletedObjectALeaseHoldsIsFreedWhenTheLeaseGoes) {
  ASSERT_OK(PutObject("a"));
  ASSERT_OK_AND_ASSIGN(Client reader, Client::Connect(daemon_->socket_path()));
  ASSERT_OK_AND_ASSIGN(Buffer leased, Leased(reader, "a"));
  const StoreStatus before = Stats();
  ASSERT_OK(client_->Delete(Id("a")));
  EXPECT_FALSE(Contains("a"));
  // The id is not free again while a lease holds the old object, as with a reference.
  EXPECT_STATUS(client_->Put(Id("a"), AsBytes("again")), StatusCode::kAlreadyExists);
  // Its memory stays, and so do its bytes, for as long as the lease.
  EXPECT_EQ(Stats().used_bytes, before.used_bytes);
  EXPECT_TRUE(SameBytes(leased.data(), Contents("a")));
  leased = Buffer();
  EXPECT_TRUE(Until([&](const StoreStatus& s) { return s.used_bytes < before.used_bytes; }))
      << "the deleted object outlived its lease";
  EXPECT_STATUS(reader.Get(Id("a"), milliseconds(0)), StatusCode::kNotFound);
  ASSERT_OK(client_->Put(Id("a"), AsBytes("again")));
}

TEST_F(LeasedGetsTest, EvictionPassesOverAnObjectALeaseHolds) {
  ASSERT_OK(PutObject("a"));
  ASSERT_OK_AND_ASSIGN(Client reader, Client::Connect(daemon_->socket_path()));
  std::optional<Buffer> leased;
  {
    ASSERT_OK_AND_ASSIGN(Buffer b, Leased(reader, "a"));
    leased = std::move(b);
  }
  for (const char* name : {"b", "c", "d"}) ASSERT_OK(PutObject(name));
  // "a" is the least recently used of the four: without its lease it would go first.
  const StoreStatus before = Stats();
  for (const char* name : {"e", "f"}) ASSERT_OK(PutObject(name));
  EXPECT_TRUE(Contains("a"));
  EXPECT_EQ(Stats().evictions, before.evictions + 2);
  EXPECT_TRUE(SameBytes(leased->data(), Contents("a")));
  // Once the daemon has found the lease, held memory counts it (as the message of a create
  // that does not fit says).
  EXPECT_EQ(Stats().held_bytes, kObjectBytes);

  leased.reset();
  // Once the daemon has seen the lease go, "a" may be evicted again.
  EXPECT_TRUE(Until([&](const StoreStatus&) {
    auto evicted = client_->Evict(0, /*all_unreferenced=*/true);
    return evicted.ok() && !Contains("a");
  })) << "an object whose lease was dropped stayed unevictable";
}

TEST_F(LeasedGetsTest, AKilledClientsLeasesAreForgotten) {
  ASSERT_OK(PutObject("a"));
  const std::string socket = daemon_->socket_path();
  ReadyPipe ready;
  ChildProcess reader = ChildProcess::Start([&]() -> int {
    auto client = Client::Connect(socket);
    if (!client.ok()) return ChildFailed(2, client.status().ToString());
    auto leased = Leased(*client, "a");
    if (!leased.ok()) return ChildFailed(3, leased.status().ToString());
    ready.Signal();
    for (;;) ::pause();
  });
  ASSERT_TRUE(ready.Wait(kBound)) << "the reader did not get ready";
  const StoreStatus before = Stats();
  ASSERT_OK(client_->Delete(Id("a")));
  EXPECT_EQ(Stats().used_bytes, before.used_bytes) << "freed under a live lease";
  ASSERT_TRUE(reader.Kill(SIGKILL));
  EXPECT_EQ(reader.Wait(), kSignalExitBase + SIGKILL);
  EXPECT_TRUE(Until([&](const StoreStatus& s) { return s.used_bytes < before.used_bytes; }))
      << "a dead client's lease kept a deleted object";
}

TEST_F(LeasedGetsTest, TheAdminViewsCountLeasesAsReferences) {
  ASSERT_OK(PutObject("a"));
  ASSERT_OK_AND_ASSIGN(Client reader, Client::Connect(daemon_->socket_path()));
  ASSERT_OK_AND_ASSIGN(Buffer leased, Leased(reader, "a"));
  ASSERT_OK_AND_ASSIGN(std::vector<ObjectInfo> listed, client_->List());
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].ref_count, 1u);
  ASSERT_OK_AND_ASSIGN(auto clients, client_->Clients());
  bool seen = false;
  for (const ClientInfo& c : clients) {
    if (c.session_id != reader.session_id()) continue;
    seen = true;
    EXPECT_EQ(c.objects_held, 1u);
    EXPECT_EQ(c.references, 1u);
    EXPECT_EQ(c.bytes_held, kObjectBytes);
  }
  EXPECT_TRUE(seen);
}

}  // namespace
}  // namespace depot::testing
