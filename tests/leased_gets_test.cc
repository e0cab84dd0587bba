// Gets through leases against a real daemon (docs/leases.md): a get of an object this client
// has seen takes no round trip; a leased object is neither evicted nor freed until its
// lease goes, however the lease goes (dropped, or the client killed); and the daemon still
// counts leased reads.
#include <signal.h>
#include <sys/mman.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "child_process.h"
#include "daemon.h"
#include "depot/client.h"
#include "depot/ipc/lease.h"
#include "depot/ipc/object_header.h"
#include "raw_session.h"
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
  // A put of 2 MiB creates, writes and seals: the client has seen where the object lies.
  ASSERT_OK(PutObject("a"));
  { ASSERT_OK_AND_ASSIGN(Buffer first, client_->Get(Id("a"))); }
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
  ASSERT_OK_AND_ASSIGN(std::string metrics, client_->Metrics());
  EXPECT_NE(metrics.find("\ndepot_leased_reads_total 2\n"), std::string::npos) << metrics;
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

// Readers get objects they have seen (so through leases, mostly) while a writer deletes and
// puts so that objects are freed and evicted under them and ids come back with new bytes:
// every get that succeeds reads exactly the bytes of the object it named, in full.
TEST_F(LeasedGetsTest, ReadersRacingDeletesAndEvictionsReadOnlyWholeObjects) {
  constexpr int kReaders = 3;
  constexpr int kRounds = 300;
  constexpr int kNames = 6;  // 6 objects of 2 MiB against room for 4: puts evict
  // Round r writes name r % kNames with bytes seeded by r; a reader knows which round it
  // read from the object's first word.
  const auto bytes_of = [](int round) {
    auto bytes = SeededBytes(kObjectBytes, static_cast<uint64_t>(round) + 1);
    const uint64_t tag = static_cast<uint64_t>(round);
    std::memcpy(bytes.data(), &tag, sizeof(tag));
    return bytes;
  };
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> reads{0}, wrong{0};
  std::vector<std::thread> readers;
  for (int r = 0; r < kReaders; ++r) {
    readers.emplace_back([&, r] {
      auto client = Client::Connect(daemon_->socket_path());
      if (!client.ok()) return wrong.fetch_add(1);
      for (uint64_t i = r; !stop.load(std::memory_order_relaxed); ++i) {
        auto got = client->Get(Id("race/" + std::to_string(i % kNames)), milliseconds(0));
        if (!got.ok()) continue;  // deleted or evicted meanwhile, or not put yet
        uint64_t round;
        std::memcpy(&round, got->data().data(), sizeof(round));
        if (round % kNames != i % kNames ||
            !SameBytes(got->data(), bytes_of(static_cast<int>(round)))) {
          wrong.fetch_add(1);
        }
        reads.fetch_add(1);
      }
      return uint64_t{0};
    });
  }
  for (int round = 0; round < kRounds; ++round) {
    const ObjectId id = Id("race/" + std::to_string(round % kNames));
    (void)client_->Delete(id);  // may be gone already (evicted), or still leased
    Status put = client_->Put(id, bytes_of(round));
    // A leased object's id is taken until the lease goes, as with a reference, and the
    // readers may hold all the room there is.
    if (!put.ok() && !put.Is(StatusCode::kAlreadyExists) && !put.Is(StatusCode::kOutOfMemory)) {
      ADD_FAILURE() << put.ToString();
    }
  }
  stop = true;
  for (auto& t : readers) t.join();
  EXPECT_EQ(wrong.load(), 0u) << "a get read bytes that were not its object's";
  EXPECT_GT(reads.load(), 0u);
  // Most of those gets were leased (the rest went through the socket).
  ASSERT_OK_AND_ASSIGN(std::string metrics, client_->Metrics());
  const std::string counter = "\ndepot_leased_reads_total ";
  const size_t at = metrics.find(counter);
  ASSERT_NE(at, std::string::npos);
  EXPECT_GT(std::stoull(metrics.substr(at + counter.size())), 0u) << metrics;
  std::printf("%llu reads, %s leased\n", static_cast<unsigned long long>(reads.load()),
              metrics.substr(at + counter.size(), metrics.find('\n', at + 1) - at - counter.size())
                  .c_str());
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

// With per-client limits the library leases only objects within its table's allowance
// (256 KiB here): a larger one goes through the socket every time, counted against the
// limits, and what the client holds both ways stays within them.
TEST(LimitedLeasesTest, OnlyObjectsWithinTheAllowanceAreLeasedAndGetsPastTheLimitsAreRefused) {
  TestDaemon daemon(
      {"--memory", "64MiB", "--client-max-bytes", "8MiB", "--client-max-objects", "50"});
  ASSERT_TRUE(daemon.ok()) << daemon.error();
  ASSERT_OK_AND_ASSIGN(Client writer, Client::Connect(daemon.socket_path()));
  ASSERT_OK_AND_ASSIGN(Client reader, Client::Connect(daemon.socket_path()));
  const ObjectId small = ObjectId::FromName("limited/small"),
                 large = ObjectId::FromName("limited/large");
  ASSERT_OK(writer.Put(small, SeededBytes(256 << 10, 1)));
  ASSERT_OK(writer.Put(large, SeededBytes((256 << 10) + 1, 2)));
  const auto leased_reads = [&]() -> std::string {
    auto metrics = writer.Metrics();
    EXPECT_TRUE(metrics.ok());
    const size_t at =
        metrics.ok() ? metrics->find("\ndepot_leased_reads_total ") : std::string::npos;
    return at == std::string::npos ? ""
                                   : metrics->substr(at + 1, metrics->find('\n', at + 1) - at - 1);
  };
  for (int i = 0; i < 3; ++i) {
    for (const ObjectId& id : {small, large}) {
      ASSERT_OK_AND_ASSIGN(Buffer got, reader.Get(id));
    }
    ASSERT_OK(reader.Contains(small).status());  // sends releases and leased reads
  }
  // The first get of each went through the socket; only the small one's next two were leased.
  EXPECT_EQ(leased_reads(), "depot_leased_reads_total 2");
  // References past 6 MiB (8 MiB less what leases may keep) are refused, naming the limit.
  std::vector<Buffer> held;
  Status refused;
  for (int i = 0; i < 8 && refused.ok(); ++i) {
    const ObjectId id = ObjectId::FromName("limited/mib/" + std::to_string(i));
    ASSERT_OK(writer.Put(id, SeededBytes(1 << 20, 3)));
    auto got = reader.Get(id);
    if (got.ok()) {
      held.push_back(std::move(*got));
    } else {
      refused = got.status();
    }
  }
  EXPECT_EQ(held.size(), 6u);
  EXPECT_EQ(refused.code(), StatusCode::kLimitExceeded) << refused.ToString();
  EXPECT_NE(refused.message().find("--client-max-bytes"), std::string::npos) << refused.ToString();
}

// A client that remembers where an object lay must never lease that place again once the
// host copy there was freed, even after the object comes back to host memory elsewhere and
// a lying lease table keeps the new copy from being dropped.
TEST(StaleLeaseTest, AnObjectsOldPlaceIsNeverLeasedAfterItsHostCopyWasFreed) {
  TestDaemon daemon({"--memory", "8MiB", "--segment-size", "8MiB", "--simulate-gpus", "1:64MiB"});
  ASSERT_TRUE(daemon.ok()) << daemon.error();
  ASSERT_OK_AND_ASSIGN(Client writer, Client::Connect(daemon.socket_path()));
  ASSERT_OK_AND_ASSIGN(Client reader, Client::Connect(daemon.socket_path()));
  const auto id = [](const std::string& name) { return ObjectId::FromName("stale/" + name); };
  const auto contents = [](const std::string& name) {
    return SeededBytes(kObjectBytes, Xxh3(AsBytes(name)));
  };
  ASSERT_OK(writer.Put(id("x"), contents("x")));
  // The reader learns where "x" lies, at place A.
  { ASSERT_OK_AND_ASSIGN(Buffer x, reader.Get(id("x"))); }
  ASSERT_OK(reader.Contains(id("x")).status());  // sends the release
  // "x" gets a GPU copy; then host pressure drops its host copy, and "d" takes place A.
  { ASSERT_OK_AND_ASSIGN(DeviceBuffer x, writer.GetOnDevice(id("x"), 0)); }
  for (const char* name : {"a", "b", "c", "d"}) ASSERT_OK(writer.Put(id(name), contents(name)));
  // "x" comes back to host memory, somewhere else.
  { ASSERT_OK_AND_ASSIGN(Buffer x, writer.Get(id("x"))); }
  ASSERT_OK(writer.Contains(id("x")).status());
  // A lying table names "x" as it is (its slot and generation are in the header table).
  RawSession liar(daemon.socket_path());
  auto hello = liar.Call(1, [](auto r) { FillHello(r); });
  ASSERT_TRUE(hello && hello->fds.size() == 2);
  const uint32_t entries = hello->get().getHello().getLeaseEntries();
  const uint32_t slots = hello->get().getHello().getHeaderSlots();
  void* table = ::mmap(nullptr, ipc::LeaseTableBytes(entries), PROT_READ | PROT_WRITE, MAP_SHARED,
                       hello->fds[1].get(), 0);
  void* headers = ::mmap(nullptr, size_t{slots} * sizeof(ipc::ObjectHeader), PROT_READ, MAP_SHARED,
                         hello->fds[0].get(), 0);
  ASSERT_NE(table, MAP_FAILED);
  ASSERT_NE(headers, MAP_FAILED);
  const auto* header = static_cast<const ipc::ObjectHeader*>(headers);
  uint32_t slot = 0;
  while (slot < slots &&
         !(header[slot].id_lo == id("x").lo() && header[slot].id_hi == id("x").hi()))
    ++slot;
  ASSERT_LT(slot, slots);
  const ipc::LeaseTableView view(table, entries);
  view.held().store(1);
  view.entry(slot).store(ipc::PackLease(header[slot].generation.load(), view.tag(slot), 1));
  // Evicting now may keep or drop the new host copy, but the reader's get must read "x".
  ASSERT_OK(writer.Evict(0, /*all_unreferenced=*/true).status());
  ASSERT_OK_AND_ASSIGN(Buffer again, reader.Get(id("x")));
  EXPECT_TRUE(SameBytes(again.data(), contents("x"))) << "a stale place was leased";
  ::munmap(table, ipc::LeaseTableBytes(entries));
  ::munmap(headers, size_t{slots} * sizeof(ipc::ObjectHeader));
}

}  // namespace
}  // namespace depot::testing
