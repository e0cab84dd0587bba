// Buffer::PrivateCopy: a writable, copy-on-write view of a sealed object, against a real
// daemon. Writes stay in the writing process; the store, the creator and other readers keep
// the object's bytes.
#include <gtest/gtest.h>

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "child_process.h"
#include "daemon.h"
#include "depot/client.h"
#include "store_checks.h"
#include "test_support.h"

namespace depot::testing {
namespace {

constexpr uint64_t kMiB = 1 << 20;

// The Private_Dirty of the mapping of this process that contains `p`, in KiB (smaps); -1
// if no mapping contains it.
int64_t PrivateDirtyKiB(const void* p) {
  const auto addr = reinterpret_cast<uintptr_t>(p);
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    const size_t dash = line.find('-');
    const size_t space = line.find(' ');
    if (dash != std::string::npos && space != std::string::npos && dash < space &&
        line.find(':') > space) {
      const uintptr_t begin = std::stoull(line.substr(0, dash), nullptr, 16);
      const uintptr_t end = std::stoull(line.substr(dash + 1, space - dash - 1), nullptr, 16);
      inside = addr >= begin && addr < end;
      continue;
    }
    if (inside && line.starts_with("Private_Dirty:")) {
      std::istringstream in(line.substr(14));
      int64_t kib = 0;
      in >> kib;
      return kib;
    }
  }
  return -1;
}

class PrivateCopyTest : public ::testing::Test {
 protected:
  // Shared segments of 32 MiB: a 40 MiB object gets a dedicated one.
  void SetUp() override {
    daemon_.emplace(std::vector<std::string>{"--segment-size", "32MiB"});
    ASSERT_TRUE(daemon_->ok()) << daemon_->error();
    ASSERT_OK_AND_ASSIGN(client_, Connect());
  }

  void TearDown() override {
    if (client_ && !HasFatalFailure()) ExpectObjectsOnHostMatchTheList(*client_);
  }

  Result<Client> Connect() { return Client::Connect(daemon_->socket_path()); }

  std::optional<TestDaemon> daemon_;  // first: outlives the clients
  std::optional<Client> client_;
};

TEST_F(PrivateCopyTest, WritesStayInTheCopyWhateverTheObjectsSegment) {
  for (const uint64_t size : {uint64_t{100}, 3 * kMiB + 5, 40 * kMiB + 7}) {
    SCOPED_TRACE("size " + std::to_string(size));
    const ObjectId id = ObjectId::FromName("private/" + std::to_string(size));
    const std::vector<std::byte> data = SeededBytes(size, size);
    ASSERT_OK(client_->Put(id, data));
    ASSERT_OK_AND_ASSIGN(auto reader, Connect());
    ASSERT_OK_AND_ASSIGN(Buffer buffer, reader.Get(id));
    ASSERT_OK_AND_ASSIGN(PrivateBuffer copy, buffer.PrivateCopy());
    ASSERT_EQ(copy.size(), size);
    EXPECT_EQ(copy.id(), id);
    EXPECT_TRUE(SameBytes(copy.data(), data));
    EXPECT_TRUE(SameBytes(copy.metadata(), buffer.metadata()));
    for (std::byte& b : copy.data()) b = ~b;

    // The copy changed; the reader's own view, another client's and a second copy did not.
    EXPECT_EQ(copy.data()[0], ~data[0]);
    EXPECT_EQ(copy.data()[size - 1], ~data[size - 1]);
    EXPECT_TRUE(SameBytes(buffer.data(), data));
    ASSERT_OK_AND_ASSIGN(Buffer again, client_->Get(id));
    EXPECT_TRUE(SameBytes(again.data(), data));
    ASSERT_OK_AND_ASSIGN(PrivateBuffer second, again.PrivateCopy());
    EXPECT_TRUE(SameBytes(second.data(), data));
  }
}

TEST_F(PrivateCopyTest, OnlyThePagesWrittenAreCopied) {
  const ObjectId id = ObjectId::FromName("private/pages");
  const std::vector<std::byte> data = SeededBytes(16 * kMiB, 3);
  ASSERT_OK(client_->Put(id, data));
  ASSERT_OK_AND_ASSIGN(Buffer buffer, client_->Get(id));
  ASSERT_OK_AND_ASSIGN(PrivateBuffer copy, buffer.PrivateCopy());
  uint64_t sum = 0;
  for (size_t i = 0; i < copy.size(); i += 4096) sum += static_cast<uint8_t>(copy.data()[i]);
  EXPECT_GT(sum, 0u);
  EXPECT_LE(PrivateDirtyKiB(copy.ptr()), 8) << "reading copied pages";
  copy.data()[5 * kMiB] = std::byte{1};
  copy.data()[9 * kMiB] = std::byte{2};
  const int64_t dirty = PrivateDirtyKiB(copy.ptr());
  EXPECT_GE(dirty, 8);
  EXPECT_LE(dirty, 16) << "two bytes written copied more than their pages";
}

TEST_F(PrivateCopyTest, TheCopyOutlivesItsBufferTheClientAndADeleteOfTheObject) {
  const ObjectId id = ObjectId::FromName("private/outlives");
  const std::vector<std::byte> data = SeededBytes(2 * kMiB, 4);
  ASSERT_OK(client_->Put(id, data));
  PrivateBuffer copy;
  {
    ASSERT_OK_AND_ASSIGN(auto reader, Connect());
    ASSERT_OK_AND_ASSIGN(Buffer buffer, reader.Get(id));
    ASSERT_OK_AND_ASSIGN(copy, buffer.PrivateCopy());
  }
  ASSERT_OK(client_->Delete(id));
  // The copy holds the object: its memory is not reused by the objects put after.
  for (int i = 0; i < 4; ++i) {
    ASSERT_OK(client_->Put(ObjectId::FromName("private/after/" + std::to_string(i)),
                           SeededBytes(2 * kMiB, 10 + i)));
  }
  EXPECT_TRUE(SameBytes(copy.data(), data));
  EXPECT_EQ(copy.metadata().size(), 0u);
  copy = PrivateBuffer();
  for (int i = 0; i < 4; ++i) {
    ASSERT_OK(client_->Delete(ObjectId::FromName("private/after/" + std::to_string(i))));
  }
  ASSERT_OK_AND_ASSIGN(auto status, client_->GetStatus());
  EXPECT_EQ(status.objects_sealed, 0u);
}

TEST_F(PrivateCopyTest, WritesInAChildProcessAreItsOwn) {
  const ObjectId id = ObjectId::FromName("private/child");
  const std::vector<std::byte> data = SeededBytes(5 * kMiB, 5);
  ASSERT_OK(client_->Put(id, data));
  const std::string socket = daemon_->socket_path();
  const int code = RunInChild([&]() -> int {
    auto client = Client::Connect(socket);
    if (!client.ok()) return ChildFailed(2, client.status().ToString());
    auto buffer = client->Get(id);
    if (!buffer.ok()) return ChildFailed(3, buffer.status().ToString());
    auto copy = buffer->PrivateCopy();
    if (!copy.ok()) return ChildFailed(4, copy.status().ToString());
    std::fill(copy->data().begin(), copy->data().end(), std::byte{0x5a});
    return copy->data()[12345] == std::byte{0x5a} ? 0 : ChildFailed(5, "write lost");
  });
  EXPECT_EQ(code, 0);
  ASSERT_OK_AND_ASSIGN(Buffer buffer, client_->Get(id));
  EXPECT_TRUE(SameBytes(buffer.data(), data));
}

TEST_F(PrivateCopyTest, AnEmptyObjectHasAnEmptyCopyAndAnEmptyBufferNone) {
  const ObjectId id = ObjectId::FromName("private/empty");
  ASSERT_OK(client_->Put(id, std::span<const std::byte>()));
  ASSERT_OK_AND_ASSIGN(Buffer buffer, client_->Get(id));
  ASSERT_OK_AND_ASSIGN(PrivateBuffer copy, buffer.PrivateCopy());
  EXPECT_TRUE(copy);
  EXPECT_EQ(copy.size(), 0u);
  auto none = Buffer().PrivateCopy();
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(none.status().message().find("empty Buffer"), std::string::npos);
}

// Segments that are files in a directory (--arena-dir on a tmpfs) rather than memfds.
TEST(PrivateCopyArenaDirTest, WritesStayInTheCopyOfAnObjectInAFileSegment) {
  char dir[] = "/dev/shm/depot-private-copy-XXXXXX";
  if (::mkdtemp(dir) == nullptr) GTEST_SKIP() << "no /dev/shm to make a tmpfs directory in";
  {
    TestDaemon daemon({"--arena-dir", dir, "--segment-size", "32MiB", "--memory", "128MiB"});
    ASSERT_TRUE(daemon.ok()) << daemon.error();
    ASSERT_OK_AND_ASSIGN(Client client, Client::Connect(daemon.socket_path()));
    for (const uint64_t size : {3 * kMiB + 1, 40 * kMiB}) {
      const ObjectId id = ObjectId::FromName("private/dir/" + std::to_string(size));
      const std::vector<std::byte> data = SeededBytes(size, 7);
      ASSERT_OK(client.Put(id, data));
      ASSERT_OK_AND_ASSIGN(Buffer buffer, client.Get(id));
      ASSERT_OK_AND_ASSIGN(PrivateBuffer copy, buffer.PrivateCopy());
      std::fill(copy.data().begin(), copy.data().end(), std::byte{3});
      EXPECT_TRUE(SameBytes(buffer.data(), data));
      EXPECT_EQ(copy.data()[size / 2], std::byte{3});
      ASSERT_OK(client.Delete(id));
    }
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace depot::testing
