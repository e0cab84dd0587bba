// Objects gathered from parts against a real depotd (Client::PutParts, PutManyParts,
// CheckParts): a value encoded as a header and the buffers it refers to, each written at its
// offset with the gaps zeroed, small ones in one request and large ones straight into shared
// memory; and parts that overlap, are out of order or run past the object, refused with
// InvalidArgument before anything is stored.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "daemon.h"
#include "depot/client.h"
#include "parts.h"
#include "store_checks.h"
#include "test_support.h"

namespace depot::testing {
namespace {

using std::chrono::milliseconds;

constexpr uint64_t kKiB = 1 << 10;
constexpr uint64_t kMiB = 1 << 20;

// The object `parts` make up, as the store must hold it: each part at its offset, zeros
// elsewhere.
std::vector<std::byte> Expected(std::span<const PutPart> parts, uint64_t size) {
  std::vector<std::byte> out(size);
  for (const PutPart& part : parts) {
    std::copy(part.data.begin(), part.data.end(),
              out.begin() + static_cast<ptrdiff_t>(part.offset));
  }
  return out;
}

class PutPartsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(daemon_.ok()) << daemon_.error();
    ASSERT_OK_AND_ASSIGN(client_, Client::Connect(daemon_.socket_path()));
  }

  void TearDown() override {
    if (client_ && !HasFatalFailure()) ExpectObjectsOnHostMatchTheList(*client_);
  }

  StoreStatus Stats() {
    auto status = client_->GetStatus();
    EXPECT_TRUE(status.ok()) << status.status().ToString();
    return status.ok() ? *status : StoreStatus{};
  }

  // Expects the object `id` to hold `expected`, and no reference to be left with its putter
  // once the read is dropped.
  void ExpectStored(const ObjectId& id, std::span<const std::byte> expected) {
    {
      auto read = client_->Get(id);
      ASSERT_TRUE(read.ok()) << read.status().ToString();
      EXPECT_TRUE(SameBytes(read->data(), expected));
    }
    const auto deadline = std::chrono::steady_clock::now() + milliseconds(2000);
    while (Stats().held_bytes != 0 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(milliseconds(1));
    }
    EXPECT_EQ(Stats().held_bytes, 0u) << "the putter kept a reference";
  }

  TestDaemon daemon_;  // first: outlives the client
  std::optional<Client> client_;
};

TEST_F(PutPartsTest, PartsLandAtTheirOffsetsWithTheGapsZeroed) {
  // A header, then two buffers at 64-byte aligned offsets with gaps before them and after
  // the last: small (one request) and large (created, copied into shared memory, sealed).
  for (const uint64_t scale : {uint64_t{1}, uint64_t{1000}}) {
    const std::vector<std::byte> header = SeededBytes(13 * scale, 1);
    const std::vector<std::byte> first = SeededBytes(100 * scale, 2);
    const std::vector<std::byte> second = SeededBytes(70 * scale, 3);
    const std::vector<PutPart> parts = {{0, header}, {64 * scale, first}, {192 * scale, second}};
    const uint64_t size = 320 * scale;
    ASSERT_EQ(size > Client::kInlinePutBytes, scale == 1000);
    const std::vector<std::byte> metadata = SeededBytes(24, 4);
    CreateOptions options;
    options.metadata = metadata;
    const ObjectId id = ObjectId::FromName("put-parts/gaps/" + std::to_string(scale));
    ASSERT_OK(client_->PutParts(id, size, parts, options));
    ExpectStored(id, Expected(parts, size));
    ASSERT_OK_AND_ASSIGN(Buffer read, client_->Get(id));
    EXPECT_TRUE(SameBytes(read.metadata(), metadata));
  }
}

TEST_F(PutPartsTest, OnePartThatIsTheWholeObjectIsStoredAsIs) {
  for (const uint64_t size : {uint64_t{0}, uint64_t{5}, 3 * kMiB + 1}) {
    const std::vector<std::byte> bytes = SeededBytes(size, size);
    const std::vector<PutPart> parts = {{0, bytes}};
    const ObjectId id = ObjectId::FromName("put-parts/one/" + std::to_string(size));
    ASSERT_OK(client_->PutParts(id, size, parts));
    ExpectStored(id, bytes);
  }
}

TEST_F(PutPartsTest, LargeObjectsCopiedOnSeveralThreadsLandByteExact) {
  // 16 MiB or more is copied in slices on up to copy_threads threads: sizes at the
  // threshold, just past it (a short last slice) and of an odd length, as one buffer and as
  // parts, with 1, 3 and 64 threads (as many as the size allows).
  for (const unsigned threads : {1u, 3u, 64u}) {
    ConnectOptions options;
    options.copy_threads = threads;
    ASSERT_OK_AND_ASSIGN(Client client, Client::Connect(daemon_.socket_path(), options));
    for (const uint64_t size : {16 * kMiB, 16 * kMiB + 1, 40 * kMiB + 7}) {
      const std::vector<std::byte> bytes = SeededBytes(size, size + threads);
      const std::string name = std::to_string(threads) + "/" + std::to_string(size);
      SCOPED_TRACE(name);
      const ObjectId whole = ObjectId::FromName("put-parts/threads/" + name);
      ASSERT_OK(client.Put(whole, bytes));
      ExpectStored(whole, bytes);
      ASSERT_OK(client.Delete(whole));
      const std::span<const std::byte> all(bytes);
      const std::vector<PutPart> parts = {{0, all.first(4096)}, {8192, all.subspan(8192)}};
      const ObjectId gathered = ObjectId::FromName("put-parts/threads/parts/" + name);
      ASSERT_OK(client.PutParts(gathered, size, parts));
      ExpectStored(gathered, Expected(parts, size));
      ASSERT_OK(client.Delete(gathered));
    }
  }
}

TEST(CopyThreadsTest, DepotCopyThreadsIsACountFrom1To64OrAClearError) {
  // $DEPOT_COPY_THREADS is read once a process, at its first connection without
  // copy_threads; a value that is not a count fails that connection (and every later one)
  // with this error, and Python's depot.Client with it (tests/python/test_errors.py).
  EXPECT_EQ(internal::ParseCopyThreads("1").value(), 1u);
  EXPECT_EQ(internal::ParseCopyThreads("64").value(), 64u);
  for (const char* bad : {"", "0", "65", "-1", "4 ", " 4", "4x", "four", "99999999999999999999"}) {
    const Result<unsigned> parsed = internal::ParseCopyThreads(bad);
    ASSERT_FALSE(parsed.ok()) << "\"" << bad << "\"";
    EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(parsed.status().message().find("DEPOT_COPY_THREADS is \"" + std::string(bad) + "\""),
              std::string::npos)
        << parsed.status().message();
    EXPECT_NE(parsed.status().message().find("from 1 to 64"), std::string::npos);
  }
  // Asked for explicitly, the count needs no variable, and is at most 64.
  EXPECT_EQ(internal::CopyThreads(3).value(), 3u);
  EXPECT_EQ(internal::CopyThreads(1000).value(), internal::kMaxCopyThreads);
}

TEST_F(PutPartsTest, AnObjectOfNoPartsIsZeros) {
  for (const uint64_t size : {uint64_t{0}, 4 * kKiB, 2 * kMiB}) {
    const ObjectId id = ObjectId::FromName("put-parts/none/" + std::to_string(size));
    ASSERT_OK(client_->PutParts(id, size, {}));
    ExpectStored(id, std::vector<std::byte>(size));
  }
}

TEST_F(PutPartsTest, EmptyPartsMayShareAnOffsetWithTheirNeighbours) {
  const std::vector<std::byte> bytes = SeededBytes(10, 5);
  const std::vector<PutPart> parts = {{0, {}}, {0, bytes}, {10, {}}, {10, {}}, {16, bytes}};
  const ObjectId id = ObjectId::FromName("put-parts/empty-parts");
  ASSERT_OK(client_->PutParts(id, 26, parts));
  ExpectStored(id, Expected(parts, 26));
}

TEST_F(PutPartsTest, PartsThatOverlapAreOutOfOrderOrRunPastTheObjectAreInvalidArgument) {
  const std::vector<std::byte> ten = SeededBytes(10, 6);
  struct Case {
    const char* what;
    std::vector<PutPart> parts;
    uint64_t size;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"overlapping",
       {{0, ten}, {9, ten}},
       64,
       "parts overlap or are out of order: part 1 starts at byte 9, before the end of the one "
       "before it at byte 10"},
      {"out of order",
       {{20, ten}, {0, ten}},
       64,
       "parts overlap or are out of order: part 1 starts at byte 0"},
      {"past the end",
       {{0, ten}, {60, ten}},
       64,
       "parts run past the object's size: part 1, 10 bytes at byte 60, in 64 bytes"},
      {"larger than the object", {{0, ten}}, 4, "part 0, 10 bytes at byte 0, in 4 bytes"},
      {"ending past 2^64",
       {{UINT64_MAX - 3, ten}},
       UINT64_MAX,
       "part 0, 10 bytes at byte 18446744073709551612"},
      {"large and past the end",
       {{0, ten}, {2 * kMiB, ten}},
       2 * kMiB,
       "parts run past the object's size: part 1"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    EXPECT_STATUS(CheckParts(c.parts, c.size), StatusCode::kInvalidArgument);
    const ObjectId id = ObjectId::FromName(std::string("put-parts/bad/") + c.what);
    const Status st = client_->PutParts(id, c.size, c.parts);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
    EXPECT_NE(st.message().find(c.message), std::string::npos) << st.ToString();
    ASSERT_OK_AND_ASSIGN(bool stored, client_->Contains(id));
    EXPECT_FALSE(stored);
  }
  // Nothing was stored or begun, and the client and the daemon carry on.
  const StoreStatus status = Stats();
  EXPECT_EQ(status.objects_sealed, 0u);
  EXPECT_EQ(status.objects_creating, 0u);
  const ObjectId after = ObjectId::FromName("put-parts/bad/after");
  const std::vector<PutPart> good = {{8, ten}};
  ASSERT_OK(client_->PutParts(after, 18, good));
  ExpectStored(after, Expected(good, 18));
}

TEST_F(PutPartsTest, AnObjectLargerThanTheStoreIsRefusedByTheDaemon) {
  // Sizes no part checks can refuse (there are no parts): the daemon's Create does.
  for (const uint64_t size : {uint64_t{1} << 40, UINT64_MAX}) {
    const Status st = client_->PutParts(ObjectId::Random(), size, {});
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  }
  EXPECT_EQ(Stats().objects_creating, 0u);
}

TEST_F(PutPartsTest, PutManyPartsStoresEveryItemInOrderAndReportsEachFailure) {
  // More small items than one window holds, large ones among them, metadata, an id put
  // twice, malformed parts, the nil id: every outcome is the one PutParts one after another
  // gives, and a failing item spoils none of the others.
  const std::vector<std::byte> header = SeededBytes(40, 7);
  const std::vector<std::byte> body = SeededBytes(Client::kInlinePutBytes, 8);
  const std::vector<PutPart> small = {{0, header}, {64, std::span(body).first(100)}};
  const std::vector<PutPart> large = {{0, header}, {64, body}};
  const std::vector<PutPart> overlapping = {{0, header}, {8, header}};
  std::vector<PutPartsItem> items;
  for (size_t i = 0; i < Client::kPutManyWindow + 10; ++i) {
    items.push_back(
        {ObjectId::FromName("put-parts/many/" + std::to_string(i)), 64 + 100 + i, small, {}});
  }
  const size_t large_at = 7;
  items[large_at] = {ObjectId::FromName("put-parts/many/large"), 64 + body.size(), large, {}};
  const std::vector<std::byte> metadata = SeededBytes(30, 9);
  items[8].options.metadata = metadata;
  const size_t again = items.size();
  items.push_back({items[3].id, 500, small, {}});
  const size_t malformed = items.size();
  items.push_back({ObjectId::FromName("put-parts/many/malformed"), 100, overlapping, {}});
  const size_t nil = items.size();
  items.push_back({ObjectId(), 200, small, {}});
  items.push_back({ObjectId::FromName("put-parts/many/last"), 200, small, {}});

  const std::vector<Status> statuses = client_->PutManyParts(items);
  ASSERT_EQ(statuses.size(), items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    SCOPED_TRACE(i);
    if (i == again) {
      EXPECT_EQ(statuses[i].code(), StatusCode::kAlreadyExists) << statuses[i].ToString();
    } else if (i == malformed) {
      EXPECT_EQ(statuses[i].code(), StatusCode::kInvalidArgument) << statuses[i].ToString();
      EXPECT_NE(statuses[i].message().find("parts overlap"), std::string::npos);
      ASSERT_OK_AND_ASSIGN(bool stored, client_->Contains(items[i].id));
      EXPECT_FALSE(stored);
    } else if (i == nil) {
      EXPECT_EQ(statuses[i].code(), StatusCode::kInvalidArgument) << statuses[i].ToString();
    } else {
      ASSERT_OK(statuses[i]);
      ASSERT_OK_AND_ASSIGN(Buffer read, client_->Get(items[i].id));
      EXPECT_TRUE(SameBytes(read.data(), Expected(items[i].parts, items[i].data_size)));
    }
  }
  ASSERT_OK_AND_ASSIGN(Buffer first_put, client_->Get(items[3].id));
  EXPECT_EQ(first_put.size(), items[3].data_size) << "the first put of an id wins";
  ASSERT_OK_AND_ASSIGN(Buffer with_metadata, client_->Get(items[8].id));
  EXPECT_TRUE(SameBytes(with_metadata.metadata(), metadata));
  EXPECT_EQ(Stats().objects_sealed, items.size() - 3);
  EXPECT_TRUE(client_->PutManyParts({}).empty());
}

}  // namespace
}  // namespace depot::testing
