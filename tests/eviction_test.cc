// Memory pressure: which objects the daemon evicts (least recently used, never pinned or
// referenced ones), what a create that cannot fit says, and the per-client quotas.
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "daemon.h"
#include "depot/client.h"
#include "depot/ipc/units.h"
#include "store_checks.h"
#include "test_support.h"

namespace depot::testing {
namespace {

constexpr uint64_t kMiB = 1 << 20;
// The store holds exactly four of these: one 8 MiB segment.
constexpr uint64_t kObjectBytes = 2 * kMiB;

// A daemon with room for four kObjectBytes objects, plus `extra` flags.
class StoreUnderPressure : public ::testing::Test {
 protected:
  explicit StoreUnderPressure(std::vector<std::string> extra = {}) : extra_(std::move(extra)) {}

  void SetUp() override {
    std::vector<std::string> flags = {"--memory", "8MiB", "--segment-size", "8MiB"};
    flags.insert(flags.end(), extra_.begin(), extra_.end());
    daemon_.emplace(flags);
    ASSERT_TRUE(daemon_->ok()) << daemon_->error();
    ASSERT_OK_AND_ASSIGN(client_, Client::Connect(daemon_->socket_path()));
  }

  static ObjectId Id(const std::string& name) { return ObjectId::FromName("eviction/" + name); }
  static std::vector<std::byte> Contents(const std::string& name) {
    return SeededBytes(kObjectBytes, Xxh3(AsBytes(name)));
  }

  Status PutObject(const std::string& name, bool pin = false) {
    CreateOptions options;
    options.pin = pin;
    options.name = name;
    return client_->Put(Id(name), Contents(name), options);
  }

  bool Contains(const std::string& name) {
    auto r = client_->Contains(Id(name));
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() && *r;
  }

  void TearDown() override {
    if (client_ && !HasFatalFailure()) ExpectObjectsOnHostMatchTheList(*client_);
  }

  StoreStatus Stats() {
    auto status = client_->GetStatus();
    EXPECT_TRUE(status.ok()) << status.status().ToString();
    return status.ok() ? *status : StoreStatus{};
  }

  std::vector<std::string> extra_;
  std::optional<TestDaemon> daemon_;
  std::optional<Client> client_;
};

class EvictionTest : public StoreUnderPressure {};

class NoEvictionTest : public StoreUnderPressure {
 protected:
  NoEvictionTest() : StoreUnderPressure({"--no-evict"}) {}
};

TEST_F(EvictionTest, EvictsTheLeastRecentlyUsedObjectFirst) {
  for (const char* name : {"a", "b", "c", "d"}) ASSERT_OK(PutObject(name));
  // Reading "a" makes "b" the least recently used.
  { ASSERT_OK_AND_ASSIGN(Buffer a, client_->Get(Id("a"))); }
  ASSERT_OK(PutObject("e"));

  EXPECT_FALSE(Contains("b"));
  for (const char* name : {"a", "c", "d", "e"}) EXPECT_TRUE(Contains(name)) << name;
  const StoreStatus status = Stats();
  EXPECT_EQ(status.evictions, 1u);
  EXPECT_EQ(status.evicted_bytes, kObjectBytes);
  ASSERT_OK_AND_ASSIGN(Buffer a, client_->Get(Id("a")));
  EXPECT_TRUE(SameBytes(a.data(), Contents("a")));
}

TEST_F(EvictionTest, EvictedObjectIsNotFound) {
  for (const char* name : {"a", "b", "c", "d", "e"}) ASSERT_OK(PutObject(name));
  EXPECT_STATUS(client_->Get(Id("a")), StatusCode::kNotFound);
  // Its id can be used again.
  EXPECT_OK(PutObject("a"));
}

TEST_F(EvictionTest, PinnedObjectsAreNeverEvicted) {
  ASSERT_OK(PutObject("pinned", /*pin=*/true));
  for (const char* name : {"b", "c", "d", "e", "f", "g", "h"}) ASSERT_OK(PutObject(name));

  EXPECT_TRUE(Contains("pinned"));
  const StoreStatus status = Stats();
  EXPECT_EQ(status.evictions, 4u);
  EXPECT_EQ(status.pinned_bytes, kObjectBytes);
  ASSERT_OK_AND_ASSIGN(Buffer pinned, client_->Get(Id("pinned")));
  EXPECT_TRUE(SameBytes(pinned.data(), Contents("pinned")));
}

TEST_F(EvictionTest, DeletingAPinnedObjectGivesBackItsPinnedBytes) {
  ASSERT_OK(PutObject("pinned", /*pin=*/true));
  ASSERT_EQ(Stats().pinned_bytes, kObjectBytes);
  ASSERT_OK(client_->Delete(Id("pinned")));
  const StoreStatus status = Stats();
  EXPECT_EQ(status.pinned_bytes, 0u);
  EXPECT_EQ(status.used_bytes, 0u);
}

TEST_F(EvictionTest, DeletingAPinnedEmptyObjectGivesBackItsPinnedBytes) {
  CreateOptions options;
  options.pin = true;
  ASSERT_OK(client_->Put(Id("pinned-empty"), {}, options));
  ASSERT_OK(client_->Delete(Id("pinned-empty")));
  const StoreStatus status = Stats();
  EXPECT_EQ(status.used_bytes, 0u);
  EXPECT_EQ(status.pinned_bytes, 0u)
      << "pinned bytes of a deleted empty object were never given back";
}

TEST_F(EvictionTest, ReferencedObjectsAreNeverEvicted) {
  ASSERT_OK(PutObject("held"));
  ASSERT_OK_AND_ASSIGN(Client reader, Client::Connect(daemon_->socket_path()));
  ASSERT_OK_AND_ASSIGN(Buffer held, reader.Get(Id("held")));
  for (const char* name : {"b", "c", "d", "e", "f", "g", "h"}) ASSERT_OK(PutObject(name));

  EXPECT_TRUE(Contains("held"));
  EXPECT_EQ(Stats().evictions, 4u);
  EXPECT_TRUE(SameBytes(held.data(), Contents("held")));
}

TEST_F(EvictionTest, CreateThatCannotFitIsOutOfMemoryNamingAskedFreeAndHeld) {
  // Three objects held: 6 MiB held, 2 MiB free, nothing evictable.
  std::vector<Buffer> held;
  for (const char* name : {"a", "b", "c"}) {
    ASSERT_OK(PutObject(name));
    ASSERT_OK_AND_ASSIGN(Buffer b, client_->Get(Id(name)));
    held.push_back(std::move(b));
  }
  const StoreStatus before = Stats();
  const ObjectId big = Id("too-big");
  Result<MutableBuffer> create = client_->Create(big, 3 * kMiB);
  ASSERT_EQ(create.status().code(), StatusCode::kOutOfMemory) << create.status().ToString();
  const Status failure = create.status();
  const std::string& message = failure.message();
  EXPECT_NE(message.find(big.Hex()), std::string::npos) << message;
  EXPECT_NE(message.find(ipc::FormatSize(3 * kMiB)), std::string::npos) << "asked: " << message;
  EXPECT_NE(
      message.find(ipc::FormatSize(2 * kMiB) + " of " + ipc::FormatSize(8 * kMiB) + " is free"),
      std::string::npos)
      << "free: " << message;
  EXPECT_NE(message.find(ipc::FormatSize(6 * kMiB) + " is held"), std::string::npos)
      << "held: " << message;

  const StoreStatus after = Stats();
  EXPECT_EQ(after.used_bytes, before.used_bytes);
  EXPECT_EQ(after.objects_creating, 0u);
  EXPECT_EQ(after.evictions, 0u);
  // What fits still fits.
  EXPECT_OK(PutObject("d"));
}

TEST_F(EvictionTest, CreateThatCannotFitEvenAfterEvictionEvictsNothing) {
  // 4 MiB held, 2 MiB evictable, 2 MiB free: 5 MiB cannot fit whatever is evicted.
  ASSERT_OK_AND_ASSIGN(MutableBuffer held, client_->Create(Id("held"), 2 * kObjectBytes));
  ASSERT_OK(PutObject("evictable"));
  EXPECT_STATUS(client_->Create(Id("hopeless"), 5 * kMiB), StatusCode::kOutOfMemory);
  EXPECT_TRUE(Contains("evictable")) << "evicted for a create that failed anyway";
  EXPECT_EQ(Stats().evictions, 0u);
}

TEST_F(EvictionTest, ObjectLargerThanTheArenaIsInvalidArgumentGivingBothSizesExactly) {
  Result<MutableBuffer> create = client_->Create(Id("huge"), 8 * kMiB + 64);
  ASSERT_EQ(create.status().code(), StatusCode::kInvalidArgument) << create.status().ToString();
  const std::string why = create.status().message();
  for (const char* part :
       {"8388672 bytes (8.00 MiB)", "capacity of 8388608 bytes (8.00 MiB)", "--memory"}) {
    EXPECT_NE(why.find(part), std::string::npos) << why;
  }
}

TEST_F(EvictionTest, ObjectAsLargeAsASegmentFits) {
  ASSERT_OK_AND_ASSIGN(MutableBuffer whole, client_->Create(Id("whole"), 8 * kMiB));
  EXPECT_EQ(whole.size(), 8 * kMiB);
  EXPECT_OK(client_->Seal(Id("whole")));
}

TEST_F(NoEvictionTest, CreateThatDoesNotFitIsOutOfMemoryInsteadOfEvicting) {
  for (const char* name : {"a", "b", "c", "d"}) ASSERT_OK(PutObject(name));
  Status put = PutObject("e");
  ASSERT_EQ(put.code(), StatusCode::kOutOfMemory) << put.ToString();
  EXPECT_NE(put.message().find("--no-evict"), std::string::npos) << put.message();

  for (const char* name : {"a", "b", "c", "d"}) EXPECT_TRUE(Contains(name)) << name;
  const StoreStatus status = Stats();
  EXPECT_EQ(status.evictions, 0u);
  EXPECT_FALSE(status.eviction_enabled);
  // Deleting makes room.
  ASSERT_OK(client_->Delete(Id("a")));
  EXPECT_OK(PutObject("e"));
}

class ClientBytesQuotaTest : public StoreUnderPressure {
 protected:
  ClientBytesQuotaTest() : StoreUnderPressure({"--client-max-bytes", "3MiB"}) {}
};

TEST_F(ClientBytesQuotaTest, HoldingMoreBytesThanTheQuotaIsLimitExceeded) {
  ASSERT_OK_AND_ASSIGN(MutableBuffer first, client_->Create(Id("first"), kObjectBytes));
  Result<MutableBuffer> second = client_->Create(Id("second"), kObjectBytes);
  ASSERT_EQ(second.status().code(), StatusCode::kLimitExceeded) << second.status().ToString();
  EXPECT_NE(second.status().message().find("--client-max-bytes"), std::string::npos)
      << second.status().message();
}

TEST_F(ClientBytesQuotaTest, QuotaIsPerClient) {
  ASSERT_OK_AND_ASSIGN(MutableBuffer first, client_->Create(Id("first"), kObjectBytes));
  ASSERT_OK_AND_ASSIGN(Client other, Client::Connect(daemon_->socket_path()));
  EXPECT_OK(other.Create(Id("second"), kObjectBytes));
}

TEST_F(ClientBytesQuotaTest, QuotaCountsOnlyWhatTheClientStillHolds) {
  ASSERT_OK(PutObject("first"));  // Put lets go of its reference
  EXPECT_OK(client_->Create(Id("second"), kObjectBytes));
}

class ClientObjectsQuotaTest : public StoreUnderPressure {
 protected:
  ClientObjectsQuotaTest() : StoreUnderPressure({"--client-max-objects", "2"}) {}
};

TEST_F(ClientObjectsQuotaTest, HoldingMoreObjectsThanTheQuotaIsLimitExceeded) {
  ASSERT_OK_AND_ASSIGN(MutableBuffer a, client_->Create(Id("a"), 64));
  ASSERT_OK_AND_ASSIGN(MutableBuffer b, client_->Create(Id("b"), 64));
  Result<MutableBuffer> c = client_->Create(Id("c"), 64);
  ASSERT_EQ(c.status().code(), StatusCode::kLimitExceeded) << c.status().ToString();
  EXPECT_NE(c.status().message().find("--client-max-objects"), std::string::npos)
      << c.status().message();
  // Letting one go makes room.
  ASSERT_OK(client_->Seal(Id("a")));
  a = MutableBuffer();
  EXPECT_OK(client_->Create(Id("c"), 64));
}

class ObjectCountLimitTest : public StoreUnderPressure {
 protected:
  ObjectCountLimitTest() : StoreUnderPressure({"--max-objects", "4"}) {}
};

TEST_F(ObjectCountLimitTest, FullObjectTableEvictsTheLeastRecentlyUsedObject) {
  // Memory is plentiful; the table of four objects is what is full.
  for (const char* name : {"a", "b", "c", "d"}) {
    ASSERT_OK(client_->Put(Id(name), AsBytes(name)));
  }
  Status put = client_->Put(Id("e"), AsBytes("e"));
  ASSERT_TRUE(put.ok()) << "an unreferenced object should have made room: " << put.ToString();
  EXPECT_FALSE(Contains("a"));
  EXPECT_TRUE(Contains("e"));
  EXPECT_EQ(Stats().evictions, 1u);
}

TEST_F(ObjectCountLimitTest, FullObjectTableOfHeldObjectsIsLimitExceeded) {
  std::vector<MutableBuffer> held;
  for (const char* name : {"a", "b", "c", "d"}) {
    ASSERT_OK_AND_ASSIGN(MutableBuffer b, client_->Create(Id(name), 64));
    held.push_back(std::move(b));
  }
  Result<MutableBuffer> fifth = client_->Create(Id("e"), 64);
  ASSERT_EQ(fifth.status().code(), StatusCode::kLimitExceeded) << fifth.status().ToString();
  EXPECT_NE(fifth.status().message().find("--max-objects"), std::string::npos)
      << fifth.status().message();
}

}  // namespace
}  // namespace depot::testing
