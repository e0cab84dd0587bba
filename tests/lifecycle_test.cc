// An object's life through the client library against a real depotd: create, seal, get
// (waiting, timing out), release, delete, abort, and the errors of each step.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>
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

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

constexpr uint64_t kMiB = 1 << 20;

// The path (or pseudo-path, e.g. "/memfd:depot-segment-0 (deleted)") of the mapping in this
// process that contains `p`; empty if none does.
std::string MappingOf(const void* p) {
  const auto addr = reinterpret_cast<uintptr_t>(p);
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    std::istringstream in(line);
    std::string range, perms, offset, dev, inode;
    in >> range >> perms >> offset >> dev >> inode;
    const size_t dash = range.find('-');
    const uintptr_t begin = std::stoull(range.substr(0, dash), nullptr, 16);
    const uintptr_t end = std::stoull(range.substr(dash + 1), nullptr, 16);
    if (addr < begin || addr >= end) continue;
    std::string path;
    std::getline(in >> std::ws, path);
    return path;
  }
  return "";
}

class LifecycleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    daemon_.emplace();
    ASSERT_TRUE(daemon_->ok()) << daemon_->error();
    ASSERT_OK_AND_ASSIGN(client_, Connect());
  }

  void TearDown() override {
    if (client_ && !HasFatalFailure()) ExpectObjectsOnHostMatchTheList(*client_);
  }

  Result<Client> Connect() { return Client::Connect(daemon_->socket_path()); }

  StoreStatus Stats() {
    auto status = client_->GetStatus();
    EXPECT_TRUE(status.ok()) << status.status().ToString();
    return status.ok() ? *status : StoreStatus{};
  }

  std::optional<TestDaemon> daemon_;  // first: outlives the clients
  std::optional<Client> client_;
};

TEST_F(LifecycleTest, ReaderInAnotherProcessSeesTheObjectInSharedMemoryWithoutCopy) {
  const ObjectId id = ObjectId::FromName("lifecycle/zero-copy");
  const std::vector<std::byte> data = SeededBytes(3 * kMiB + 5, 1);
  const std::vector<std::byte> metadata = SeededBytes(100, 2);
  CreateOptions options;
  options.metadata = metadata;
  ASSERT_OK(client_->Put(id, data, options));

  const std::string socket = daemon_->socket_path();
  const int code = RunInChild([&]() -> int {
    auto client = Client::Connect(socket);
    if (!client.ok()) return ChildFailed(2, client.status().ToString());
    auto buffer = client->Get(id);
    if (!buffer.ok()) return ChildFailed(3, buffer.status().ToString());
    // The bytes are read where the daemon keeps them: in a mapping of its memfd segment.
    const std::string segment =
        "/memfd:depot-segment-" + std::to_string(buffer->location().segment);
    for (const std::byte* p :
         {buffer->ptr(), buffer->ptr() + buffer->size() - 1, buffer->metadata().data()}) {
      const std::string mapping = MappingOf(p);
      if (mapping != segment && !mapping.starts_with(segment + " ")) {
        return ChildFailed(4, "object byte at " + std::to_string(reinterpret_cast<uintptr_t>(p)) +
                                  " lies in mapping '" + mapping + "', not " + segment);
      }
    }
    if (!SameBytes(buffer->data(), data)) return ChildFailed(5, "data differs");
    if (!SameBytes(buffer->metadata(), metadata)) return ChildFailed(6, "metadata differs");
    return 0;
  });
  EXPECT_EQ(code, 0);
}

TEST_F(LifecycleTest, CreatedObjectIsInvisibleToOthersUntilSealed) {
  const ObjectId id = ObjectId::FromName("lifecycle/create-seal");
  const std::vector<std::byte> data = SeededBytes(4096, 3);
  ASSERT_OK_AND_ASSIGN(MutableBuffer writable, client_->Create(id, data.size()));
  ASSERT_EQ(writable.size(), data.size());
  std::memcpy(writable.ptr(), data.data(), data.size());
  ASSERT_OK_AND_ASSIGN(Client other, Connect());

  ASSERT_OK_AND_ASSIGN(bool before, other.Contains(id));
  EXPECT_FALSE(before);
  EXPECT_STATUS(other.Get(id), StatusCode::kNotFound);

  ASSERT_OK(client_->Seal(id));
  ASSERT_OK_AND_ASSIGN(bool after, other.Contains(id));
  EXPECT_TRUE(after);
  ASSERT_OK_AND_ASSIGN(Buffer read, other.Get(id));
  EXPECT_TRUE(SameBytes(read.data(), data));
}

TEST_F(LifecycleTest, GetWaitsForALaterSealByAnotherProcess) {
  const ObjectId id = ObjectId::FromName("lifecycle/late-seal");
  const std::vector<std::byte> data = SeededBytes(64 * 1024, 4);
  const std::string socket = daemon_->socket_path();
  ReadyPipe connected;
  ChildProcess writer = ChildProcess::Start([&]() -> int {
    auto client = Client::Connect(socket);
    if (!client.ok()) return ChildFailed(2, client.status().ToString());
    connected.Signal();
    std::this_thread::sleep_for(milliseconds(250));
    Status st = client->Put(id, data);
    return st.ok() ? 0 : ChildFailed(3, st.ToString());
  });
  ASSERT_TRUE(connected.Wait(milliseconds(5000)));

  const auto start = Clock::now();
  ASSERT_OK_AND_ASSIGN(Buffer buffer, client_->Get(id, milliseconds(10'000)));
  const auto waited = Clock::now() - start;
  EXPECT_TRUE(SameBytes(buffer.data(), data));
  EXPECT_GE(waited, milliseconds(100)) << "the get returned before the writer could have sealed";
  EXPECT_EQ(writer.Wait(), 0);
}

TEST_F(LifecycleTest, PutManyStoresEveryItemInOrderAndReportsEachFailure) {
  // More small items than one window holds, a large one between them, a name, metadata, an
  // id put twice, one that already exists and the nil id: every outcome is the one
  // sequential Puts give, and a failing item spoils none of the others.
  ASSERT_OK(client_->Put(ObjectId::FromName("lifecycle/put-many/existing"), SeededBytes(8, 1)));
  std::vector<std::vector<std::byte>> data;
  std::vector<PutItem> items;
  const size_t small = Client::kPutManyWindow + 44;
  for (size_t i = 0; i < small; ++i) {
    data.push_back(SeededBytes(1 + i * 97 % 5000, i));
    items.push_back(
        {ObjectId::FromName("lifecycle/put-many/" + std::to_string(i)), data.back(), {}});
  }
  data.push_back(SeededBytes(Client::kInlinePutBytes + 1, 7));
  const size_t large = items.size();
  items.push_back({ObjectId::FromName("lifecycle/put-many/large"), data.back(), {}});
  const std::vector<std::byte> metadata = SeededBytes(40, 8);
  const size_t named = items.size();
  items.push_back({ObjectId::FromName("lifecycle/put-many/named"), data[3], {}});
  items.back().options.name = "lifecycle/put-many/named";
  items.back().options.metadata = metadata;
  const size_t again = items.size();
  items.push_back({items[5].id, data[6], {}});
  const size_t existing = items.size();
  items.push_back({ObjectId::FromName("lifecycle/put-many/existing"), data[0], {}});
  const size_t nil = items.size();
  items.push_back({ObjectId(), data[1], {}});

  const std::vector<Status> statuses = client_->PutMany(items);
  ASSERT_EQ(statuses.size(), items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    if (i == again || i == existing) {
      EXPECT_TRUE(statuses[i].Is(StatusCode::kAlreadyExists))
          << i << ": " << statuses[i].ToString();
      continue;
    }
    if (i == nil) {
      EXPECT_TRUE(statuses[i].Is(StatusCode::kInvalidArgument)) << statuses[i].ToString();
      continue;
    }
    ASSERT_TRUE(statuses[i].ok()) << i << ": " << statuses[i].ToString();
    ASSERT_OK_AND_ASSIGN(Buffer read, client_->Get(items[i].id));
    EXPECT_TRUE(SameBytes(read.data(), items[i].data)) << i;
  }
  {
    ASSERT_OK_AND_ASSIGN(Buffer first_put, client_->Get(items[5].id));
    EXPECT_TRUE(SameBytes(first_put.data(), data[5])) << "the first put of an id wins";
    ASSERT_OK_AND_ASSIGN(Buffer with_metadata, client_->Get(items[named].id));
    EXPECT_TRUE(SameBytes(with_metadata.metadata(), metadata));
    ASSERT_OK_AND_ASSIGN(Buffer large_put, client_->Get(items[large].id));
    EXPECT_EQ(large_put.size(), Client::kInlinePutBytes + 1);
  }
  // No reference is left behind once the reads are dropped: the small puts keep none, and
  // the large one's went back.
  const auto deadline = Clock::now() + milliseconds(2000);
  StoreStatus status = Stats();
  while (status.held_bytes != 0 && Clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(1));
    status = Stats();
  }
  EXPECT_EQ(status.held_bytes, 0u);
  EXPECT_EQ(status.objects_sealed, small + 3);

  EXPECT_TRUE(client_->PutMany({}).empty());
}

TEST_F(LifecycleTest, GetTimesOutCleanlyNamingTheObject) {
  const ObjectId id = ObjectId::FromName("lifecycle/never-sealed");
  const auto start = Clock::now();
  Result<Buffer> buffer = client_->Get(id, milliseconds(200));
  const auto waited = Clock::now() - start;
  ASSERT_EQ(buffer.status().code(), StatusCode::kTimeout) << buffer.status().ToString();
  EXPECT_NE(buffer.status().message().find(id.Hex()), std::string::npos)
      << buffer.status().message();
  EXPECT_GE(waited, milliseconds(190));
  EXPECT_LT(waited, milliseconds(5000));
  // The connection is still good afterwards.
  EXPECT_OK(client_->Put(id, AsBytes("late")));
}

TEST_F(LifecycleTest, GetOfUnknownIdWithoutWaitIsNotFound) {
  const ObjectId id = ObjectId::FromName("lifecycle/unknown");
  Result<Buffer> buffer = client_->Get(id);
  EXPECT_EQ(buffer.status().code(), StatusCode::kNotFound) << buffer.status().ToString();
  EXPECT_NE(buffer.status().message().find(id.Hex()), std::string::npos);
}

TEST_F(LifecycleTest, BatchGetReturnsEmptyBuffersForMissingObjects) {
  const ObjectId a = ObjectId::FromName("lifecycle/batch-a");
  const ObjectId missing = ObjectId::FromName("lifecycle/batch-missing");
  const ObjectId b = ObjectId::FromName("lifecycle/batch-b");
  ASSERT_OK(client_->Put(a, AsBytes("alpha")));
  ASSERT_OK(client_->Put(b, AsBytes("beta")));
  const std::vector<ObjectId> ids = {a, missing, b};
  ASSERT_OK_AND_ASSIGN(std::vector<Buffer> buffers, client_->Get(ids));
  ASSERT_EQ(buffers.size(), 3u);
  EXPECT_TRUE(SameBytes(buffers[0].data(), AsBytes("alpha")));
  EXPECT_FALSE(buffers[1]);
  EXPECT_TRUE(SameBytes(buffers[2].data(), AsBytes("beta")));
}

TEST_F(LifecycleTest, BatchGetOfObjectsInSeveralSegmentsMapsEachSegment) {
  // The test daemon has four segments of 16 MiB: four 10 MiB objects need all four.
  std::vector<ObjectId> ids;
  for (int i = 0; i < 4; ++i) {
    ids.push_back(ObjectId::FromName("lifecycle/segments/" + std::to_string(i)));
    ASSERT_OK(client_->Put(ids.back(), SeededBytes(10 * kMiB, 100 + i)));
  }
  ASSERT_OK_AND_ASSIGN(Client reader, Connect());
  ASSERT_OK_AND_ASSIGN(std::vector<Buffer> buffers, reader.Get(ids));
  std::set<uint32_t> segments;
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(buffers[i]) << i;
    segments.insert(buffers[i].location().segment);
    EXPECT_TRUE(SameBytes(buffers[i].data(), SeededBytes(10 * kMiB, 100 + i))) << i;
  }
  EXPECT_EQ(segments.size(), 4u);
}

TEST_F(LifecycleTest, DeleteWhileReferencedIsDeferredUntilTheLastRelease) {
  const ObjectId id = ObjectId::FromName("lifecycle/deferred-delete");
  const std::vector<std::byte> data = SeededBytes(kMiB, 5);
  const StoreStatus empty = Stats();
  ASSERT_OK(client_->Put(id, data));
  ASSERT_OK_AND_ASSIGN(Client reader, Connect());
  ASSERT_OK_AND_ASSIGN(Buffer held, reader.Get(id));
  const uint64_t used_with_object = Stats().used_bytes;
  ASSERT_GT(used_with_object, empty.used_bytes);

  ASSERT_OK(client_->Delete(id));
  ASSERT_OK_AND_ASSIGN(bool contains, client_->Contains(id));
  EXPECT_FALSE(contains) << "a deleted object must not be visible";
  EXPECT_STATUS(client_->Get(id), StatusCode::kNotFound);
  EXPECT_TRUE(SameBytes(held.data(), data)) << "the holder's bytes changed under it";
  EXPECT_EQ(Stats().used_bytes, used_with_object) << "freed while still referenced";
  ASSERT_OK_AND_ASSIGN(std::vector<ObjectInfo> listed, client_->List());
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_TRUE(listed[0].delete_pending);
  EXPECT_EQ(listed[0].ref_count, 1u);

  held = Buffer();  // the last reference: released without a reply
  // The release went on `reader`'s connection; poll from `client_`'s.
  const auto deadline = Clock::now() + milliseconds(2000);
  StoreStatus now = Stats();
  while (now.used_bytes != empty.used_bytes && Clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(1));
    now = Stats();
  }
  EXPECT_EQ(now.used_bytes, empty.used_bytes);
  EXPECT_EQ(now.objects_sealed, empty.objects_sealed);
}

TEST_F(LifecycleTest, GetOfAnObjectAnotherClientDeletedIsNotFoundEvenWhileHeld) {
  const ObjectId id = ObjectId::FromName("lifecycle/deleted-elsewhere");
  ASSERT_OK(client_->Put(id, AsBytes("soon gone")));
  ASSERT_OK_AND_ASSIGN(Client reader, Connect());
  ASSERT_OK_AND_ASSIGN(Buffer held, reader.Get(id));
  ASSERT_OK(client_->Delete(id));
  // The reader holds the object, but a new get must not find a deleted object.
  EXPECT_STATUS(reader.Get(id), StatusCode::kNotFound);
  EXPECT_TRUE(SameBytes(held.data(), AsBytes("soon gone")));
}

TEST_F(LifecycleTest, DeleteOfUnreferencedObjectFreesItAtOnce) {
  const ObjectId id = ObjectId::FromName("lifecycle/delete-now");
  const StoreStatus empty = Stats();
  ASSERT_OK(client_->Put(id, SeededBytes(kMiB, 6)));
  ASSERT_OK(client_->Delete(id));
  EXPECT_EQ(Stats().used_bytes, empty.used_bytes);
  // The id is free to use again.
  EXPECT_OK(client_->Put(id, AsBytes("again")));
}

TEST_F(LifecycleTest, DeleteOfUnknownIdIsNotFound) {
  EXPECT_STATUS(client_->Delete(ObjectId::FromName("lifecycle/nothing")), StatusCode::kNotFound);
}

TEST_F(LifecycleTest, DeleteOfObjectBeingCreatedIsNotSealed) {
  const ObjectId id = ObjectId::FromName("lifecycle/delete-unsealed");
  ASSERT_OK_AND_ASSIGN(MutableBuffer writable, client_->Create(id, 16));
  EXPECT_STATUS(client_->Delete(id), StatusCode::kNotSealed);
}

TEST_F(LifecycleTest, AbortDropsTheObjectAndItsMemory) {
  const ObjectId id = ObjectId::FromName("lifecycle/abort");
  const StoreStatus empty = Stats();
  ASSERT_OK_AND_ASSIGN(MutableBuffer writable, client_->Create(id, kMiB));
  EXPECT_EQ(Stats().objects_creating, empty.objects_creating + 1);
  ASSERT_OK(client_->Abort(id));

  const StoreStatus after = Stats();
  EXPECT_EQ(after.objects_creating, empty.objects_creating);
  EXPECT_EQ(after.used_bytes, empty.used_bytes);
  EXPECT_EQ(after.held_bytes, empty.held_bytes);
  EXPECT_STATUS(client_->Get(id), StatusCode::kNotFound);
  EXPECT_STATUS(client_->Seal(id), StatusCode::kNotFound);
  // The id can be created again.
  EXPECT_OK(client_->Put(id, AsBytes("second try")));
}

TEST_F(LifecycleTest, DroppingTheLastHandleOfAnUnsealedObjectAbortsIt) {
  const ObjectId id = ObjectId::FromName("lifecycle/dropped-unsealed");
  const StoreStatus empty = Stats();
  { ASSERT_OK_AND_ASSIGN(MutableBuffer writable, client_->Create(id, kMiB)); }
  const StoreStatus after = Stats();
  EXPECT_EQ(after.objects_creating, empty.objects_creating);
  EXPECT_EQ(after.used_bytes, empty.used_bytes);
  EXPECT_OK(client_->Put(id, AsBytes("recreated")));
}

TEST_F(LifecycleTest, AbortOfSealedObjectIsAlreadySealed) {
  const ObjectId id = ObjectId::FromName("lifecycle/abort-sealed");
  ASSERT_OK(client_->Put(id, AsBytes("sealed")));
  EXPECT_STATUS(client_->Abort(id), StatusCode::kAlreadySealed);
  ASSERT_OK_AND_ASSIGN(bool contains, client_->Contains(id));
  EXPECT_TRUE(contains);
}

TEST_F(LifecycleTest, SealingTwiceIsAlreadySealed) {
  const ObjectId id = ObjectId::FromName("lifecycle/double-seal");
  ASSERT_OK_AND_ASSIGN(MutableBuffer writable, client_->Create(id, 8));
  ASSERT_OK(client_->Seal(id));
  Status again = client_->Seal(id);
  EXPECT_EQ(again.code(), StatusCode::kAlreadySealed) << again.ToString();
  EXPECT_NE(again.message().find(id.Hex()), std::string::npos) << again.message();
}

TEST_F(LifecycleTest, SealOfUnknownIdIsNotFound) {
  EXPECT_STATUS(client_->Seal(ObjectId::FromName("lifecycle/no-such")), StatusCode::kNotFound);
}

TEST_F(LifecycleTest, SealByAnotherClientIsNotHeld) {
  const ObjectId id = ObjectId::FromName("lifecycle/foreign-seal");
  ASSERT_OK_AND_ASSIGN(MutableBuffer writable, client_->Create(id, 8));
  ASSERT_OK_AND_ASSIGN(Client other, Connect());
  EXPECT_STATUS(other.Seal(id), StatusCode::kNotHeld);
  // The creator still owns it.
  EXPECT_OK(client_->Seal(id));
}

TEST_F(LifecycleTest, AbortByAnotherClientIsNotHeld) {
  const ObjectId id = ObjectId::FromName("lifecycle/foreign-abort");
  ASSERT_OK_AND_ASSIGN(MutableBuffer writable, client_->Create(id, 8));
  ASSERT_OK_AND_ASSIGN(Client other, Connect());
  EXPECT_STATUS(other.Abort(id), StatusCode::kNotHeld);
  EXPECT_EQ(Stats().objects_creating, 1u);
  EXPECT_OK(client_->Seal(id));
}

TEST_F(LifecycleTest, CreateOfSealedIdIsAlreadyExists) {
  const ObjectId id = ObjectId::FromName("lifecycle/exists");
  ASSERT_OK(client_->Put(id, AsBytes("first")));
  Result<MutableBuffer> second = client_->Create(id, 8);
  EXPECT_EQ(second.status().code(), StatusCode::kAlreadyExists) << second.status().ToString();
  EXPECT_NE(second.status().message().find(id.Hex()), std::string::npos);
}

TEST_F(LifecycleTest, CreateOfIdAnotherClientIsCreatingIsAlreadyExists) {
  const ObjectId id = ObjectId::FromName("lifecycle/exists-creating");
  ASSERT_OK_AND_ASSIGN(MutableBuffer writable, client_->Create(id, 8));
  ASSERT_OK_AND_ASSIGN(Client other, Connect());
  EXPECT_STATUS(other.Create(id, 8), StatusCode::kAlreadyExists);
}

TEST_F(LifecycleTest, CreateOfNilIdIsInvalidArgument) {
  EXPECT_STATUS(client_->Create(ObjectId(), 8), StatusCode::kInvalidArgument);
}

TEST_F(LifecycleTest, GetOfNilIdIsInvalidArgument) {
  EXPECT_STATUS(client_->Get(ObjectId()), StatusCode::kInvalidArgument);
}

TEST_F(LifecycleTest, EmptyObjectCanBePutAndRead) {
  const ObjectId id = ObjectId::FromName("lifecycle/empty");
  const std::string metadata = "only metadata";
  CreateOptions options;
  options.metadata = AsBytes(metadata);
  ASSERT_OK(client_->Put(id, {}, options));
  ASSERT_OK_AND_ASSIGN(Client reader, Connect());
  ASSERT_OK_AND_ASSIGN(Buffer buffer, reader.Get(id));
  EXPECT_TRUE(buffer);
  EXPECT_EQ(buffer.size(), 0u);
  EXPECT_TRUE(SameBytes(buffer.metadata(), AsBytes(metadata)));
}

TEST_F(LifecycleTest, LargeObjectsStartOnAPageBoundary) {
  // A small object first, so the next free byte is not page-aligned.
  ASSERT_OK(client_->Put(ObjectId::FromName("lifecycle/small"), AsBytes(std::string(100, 's'))));
  const std::vector<std::byte> large = SeededBytes(kMiB, 7);
  const ObjectId id = ObjectId::FromName("lifecycle/large");
  ASSERT_OK(client_->Put(id, large));
  ASSERT_OK_AND_ASSIGN(Buffer buffer, client_->Get(id));
  EXPECT_EQ(buffer.location().offset % 4096, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(buffer.ptr()) % 4096, 0u);
  EXPECT_TRUE(SameBytes(buffer.data(), large));
  // The bytes skipped to reach the boundary are not counted as used.
  EXPECT_EQ(Stats().used_bytes, 128u + kMiB);
}

TEST_F(LifecycleTest, OverlongNameIsInvalidArgument) {
  CreateOptions options;
  options.name = std::string(5000, 'x');
  EXPECT_STATUS(client_->Create(ObjectId::FromName("lifecycle/long-name"), 8, options),
                StatusCode::kInvalidArgument);
}

TEST_F(LifecycleTest, GetUpdatesTheAccessTime) {
  const ObjectId id = ObjectId::FromName("lifecycle/access-time");
  ASSERT_OK(client_->Put(id, AsBytes("touch")));
  ASSERT_OK_AND_ASSIGN(std::vector<ObjectInfo> before, client_->List());
  ASSERT_EQ(before.size(), 1u);
  std::this_thread::sleep_for(milliseconds(5));
  ASSERT_OK_AND_ASSIGN(Client reader, Connect());
  ASSERT_OK_AND_ASSIGN(Buffer buffer, reader.Get(id));
  ASSERT_OK_AND_ASSIGN(std::vector<ObjectInfo> after, client_->List());
  ASSERT_EQ(after.size(), 1u);
  EXPECT_GT(after[0].access_time_ns, before[0].access_time_ns);
  EXPECT_EQ(after[0].create_time_ns, before[0].create_time_ns);
}

TEST_F(LifecycleTest, BatchGetNamingAnIdTwiceHoldsOneReference) {
  const ObjectId id = ObjectId::FromName("lifecycle/twice");
  ASSERT_OK(client_->Put(id, AsBytes("twice")));
  ASSERT_OK_AND_ASSIGN(Client reader, Connect());
  {
    const std::vector<ObjectId> ids = {id, id};
    ASSERT_OK_AND_ASSIGN(std::vector<Buffer> buffers, reader.Get(ids));
    ASSERT_EQ(buffers.size(), 2u);
    ASSERT_TRUE(buffers[0] && buffers[1]);
    EXPECT_EQ(buffers[0].ptr(), buffers[1].ptr());
    ASSERT_OK_AND_ASSIGN(std::vector<ObjectInfo> listed, reader.List());
    ASSERT_EQ(listed.size(), 1u);
    EXPECT_EQ(listed[0].ref_count, 1u);
  }
  ASSERT_OK_AND_ASSIGN(std::vector<ObjectInfo> listed, reader.List());
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].ref_count, 0u) << "a reference leaked";
}

TEST_F(LifecycleTest, MetadataOverTheFrameLimitIsLimitExceeded) {
  TestDaemon small({"--max-frame", "64KiB"});
  ASSERT_TRUE(small.ok()) << small.error();
  ASSERT_OK_AND_ASSIGN(Client client, Client::Connect(small.socket_path()));
  const std::vector<std::byte> metadata = SeededBytes(100 * 1024, 12);
  CreateOptions options;
  options.metadata = metadata;
  EXPECT_STATUS(client.Create(ObjectId::FromName("lifecycle/fat-metadata"), 8, options),
                StatusCode::kLimitExceeded);
  // The connection is still good.
  EXPECT_OK(client.Put(ObjectId::FromName("lifecycle/thin"), AsBytes("fine")));
}

TEST_F(LifecycleTest, GetOfMoreIdsThanTheDaemonsBatchLimitIsLimitExceeded) {
  TestDaemon small({"--max-batch", "8"});
  ASSERT_TRUE(small.ok()) << small.error();
  ASSERT_OK_AND_ASSIGN(Client client, Client::Connect(small.socket_path()));
  std::vector<ObjectId> ids;
  for (int i = 0; i < 9; ++i)
    ids.push_back(ObjectId::FromName("lifecycle/many/" + std::to_string(i)));
  EXPECT_STATUS(client.Get(ids), StatusCode::kLimitExceeded);
  ids.pop_back();
  ASSERT_OK_AND_ASSIGN(std::vector<Buffer> eight, client.Get(ids));
  EXPECT_EQ(eight.size(), 8u);
}

TEST_F(LifecycleTest, GetOfAnObjectAlreadyHeldMakesNoRoundTrip) {
  const ObjectId id = ObjectId::FromName("lifecycle/held");
  ASSERT_OK(client_->Put(id, SeededBytes(1000, 7)));
  ASSERT_OK_AND_ASSIGN(Buffer first, client_->Get(id));
  const uint64_t before = Stats().requests;
  std::vector<Buffer> again;
  for (int i = 0; i < 10; ++i) {
    ASSERT_OK_AND_ASSIGN(Buffer b, client_->Get(id));
    EXPECT_EQ(b.ptr(), first.ptr());
    again.push_back(std::move(b));
  }
  // Only the status request itself reached the daemon.
  EXPECT_EQ(Stats().requests, before + 1);
}

TEST_F(LifecycleTest, RepeatedGetsOfOneObjectHoldOneReference) {
  const ObjectId id = ObjectId::FromName("lifecycle/one-ref");
  ASSERT_OK(client_->Put(id, AsBytes("shared")));
  ASSERT_OK_AND_ASSIGN(Buffer a, client_->Get(id));
  ASSERT_OK_AND_ASSIGN(Buffer b, client_->Get(id));
  ASSERT_OK_AND_ASSIGN(std::vector<ObjectInfo> listed, client_->List());
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].ref_count, 1u);
  a = Buffer();
  b = Buffer();
  ASSERT_OK_AND_ASSIGN(listed, client_->List());
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].ref_count, 0u);
}

TEST_F(LifecycleTest, ChecksumOptionStoresTheChecksumOfDataAndMetadata) {
  const ObjectId id = ObjectId::FromName("lifecycle/checksum");
  const std::vector<std::byte> data = SeededBytes(10'000, 8);
  const std::vector<std::byte> metadata = SeededBytes(33, 9);
  CreateOptions options;
  options.checksum = true;
  options.metadata = metadata;
  options.name = "lifecycle/checksum";
  ASSERT_OK(client_->Put(id, data, options));
  ASSERT_OK_AND_ASSIGN(std::vector<ObjectInfo> listed, client_->List());
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].id, id);
  EXPECT_EQ(listed[0].name, "lifecycle/checksum");
  EXPECT_TRUE(listed[0].has_checksum);
  EXPECT_EQ(listed[0].checksum, Xxh3(data, metadata));
}

TEST_F(LifecycleTest, ChecksumOfLargeObjectIsStoredToo) {
  // Large objects are checksummed on the daemon's worker pool rather than its loop.
  const ObjectId id = ObjectId::FromName("lifecycle/checksum-large");
  const std::vector<std::byte> data = SeededBytes(4 * kMiB, 10);
  CreateOptions options;
  options.checksum = true;
  ASSERT_OK(client_->Put(id, data, options));
  // Sealed once Put returns: visible, with its checksum.
  ASSERT_OK_AND_ASSIGN(Buffer read, client_->Get(id));
  ASSERT_OK_AND_ASSIGN(std::vector<ObjectInfo> listed, client_->List());
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].state, ObjectState::kSealed);
  EXPECT_TRUE(listed[0].has_checksum);
  EXPECT_EQ(listed[0].checksum, Xxh3(data));
}

TEST_F(LifecycleTest, ObjectWithoutChecksumOptionHasNone) {
  const ObjectId id = ObjectId::FromName("lifecycle/no-checksum");
  ASSERT_OK(client_->Put(id, AsBytes("plain")));
  ASSERT_OK_AND_ASSIGN(std::vector<ObjectInfo> listed, client_->List());
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_FALSE(listed[0].has_checksum);
}

TEST_F(LifecycleTest, BuffersOutliveTheirClient) {
  const ObjectId id = ObjectId::FromName("lifecycle/outlive");
  const std::vector<std::byte> data = SeededBytes(50'000, 11);
  ASSERT_OK(client_->Put(id, data));
  Buffer kept;
  {
    ASSERT_OK_AND_ASSIGN(Client reader, Connect());
    ASSERT_OK_AND_ASSIGN(kept, reader.Get(id));
  }
  EXPECT_TRUE(SameBytes(kept.data(), data));
  EXPECT_GT(Stats().held_bytes, 0u) << "the Buffer's reference was dropped with its Client";
  kept = Buffer();
  const auto deadline = Clock::now() + milliseconds(2000);
  uint64_t held = Stats().held_bytes;
  while (held != 0 && Clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(1));
    held = Stats().held_bytes;
  }
  EXPECT_EQ(held, 0u);
}

TEST_F(LifecycleTest, UnsealedObjectOutlivingItsClientIsAbortedWithItsLastHandle) {
  const ObjectId id = ObjectId::FromName("lifecycle/orphan");
  MutableBuffer orphan;
  {
    ASSERT_OK_AND_ASSIGN(Client creator, Connect());
    ASSERT_OK_AND_ASSIGN(orphan, creator.Create(id, kMiB));
  }
  std::memset(orphan.ptr(), 1, orphan.size());  // still mapped and writable
  EXPECT_EQ(Stats().objects_creating, 1u) << "the handle keeps the creator's connection";
  orphan = MutableBuffer();
  const auto deadline = Clock::now() + milliseconds(2000);
  StoreStatus now = Stats();
  while ((now.objects_creating != 0 || now.used_bytes != 0) && Clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(1));
    now = Stats();
  }
  EXPECT_EQ(now.objects_creating, 0u);
  EXPECT_EQ(now.used_bytes, 0u);
  EXPECT_OK(client_->Put(id, AsBytes("adopted")));
}

TEST_F(LifecycleTest, WaitingGetDoesNotHoldUpOtherCallsOnTheSameClient) {
  const ObjectId id = ObjectId::FromName("lifecycle/pipelined");
  Result<Buffer> waited = Status::Internal("not run");
  std::thread getter([&] { waited = client_->Get(id, milliseconds(10'000)); });
  std::this_thread::sleep_for(milliseconds(50));
  const auto start = Clock::now();
  Result<StoreStatus> status = client_->GetStatus();
  const auto took = Clock::now() - start;
  EXPECT_OK(status);
  // Held up, it would wait the get's 10 s; far less leaves room for a loaded machine.
  EXPECT_LT(took, milliseconds(5000)) << "a status call waited behind a waiting get";
  EXPECT_OK(client_->Put(id, AsBytes("now")));
  getter.join();
  ASSERT_OK(waited);
  EXPECT_TRUE(SameBytes(waited->data(), AsBytes("now")));
}

TEST_F(LifecycleTest, GetWaitsForAnObjectTheSameClientIsCreating) {
  const ObjectId id = ObjectId::FromName("lifecycle/own-create");
  ASSERT_OK_AND_ASSIGN(MutableBuffer writable, client_->Create(id, 4));
  std::memcpy(writable.ptr(), "mine", 4);
  Result<Buffer> waited = Status::Internal("not run");
  std::thread getter([&] { waited = client_->Get(id, milliseconds(10'000)); });
  std::this_thread::sleep_for(milliseconds(50));
  ASSERT_OK(client_->Seal(id));
  getter.join();
  ASSERT_OK(waited);
  EXPECT_TRUE(SameBytes(waited->data(), AsBytes("mine")));
}

}  // namespace
}  // namespace depot::testing
