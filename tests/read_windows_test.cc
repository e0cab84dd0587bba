// Read windows on their own: restores of small spilled objects from a real file, read back in
// windows and ahead of need, never serving bytes from before a write that invalidated them.
#include "store/read_windows.h"

#include <fcntl.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "store/disk_pool.h"
#include "store/spill_io.h"

namespace depot::store {
namespace {

constexpr uint64_t kKiB = 1 << 10;
constexpr uint64_t kObject = 64 * kKiB;  // each object's block
constexpr uint64_t kObjects = 96;        // three windows of 32
constexpr uint64_t kFileSize = kObject * kObjects;

std::vector<std::byte> Bytes(uint64_t bytes, uint8_t seed) {
  std::vector<std::byte> out(bytes);
  for (uint64_t i = 0; i < bytes; ++i) out[i] = std::byte(static_cast<uint8_t>(seed + i * 7));
  return out;
}

class ReadWindowsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TMPDIR");
    path_ = std::string(tmp != nullptr ? tmp : "/tmp") + "/depot-read-windows-XXXXXX";
    fd_ = mkstemp(path_.data());
    ASSERT_GE(fd_, 0) << path_ << ": " << std::strerror(errno);
    direct_ = open(path_.c_str(), O_RDWR | O_DIRECT | O_CLOEXEC);
    if (direct_ < 0) GTEST_SKIP() << "no direct I/O on the file system of " << path_;
    for (uint64_t i = 0; i < kObjects; ++i) Write(i, static_cast<uint8_t>(i));
  }
  void TearDown() override {
    if (direct_ >= 0) close(direct_);
    if (fd_ >= 0) close(fd_);
    unlink(path_.c_str());
  }
  // Object i's bytes, seeded by `seed`, written (buffered) at its block.
  void Write(uint64_t i, uint8_t seed) {
    const std::vector<std::byte> bytes = Bytes(kObject, seed);
    ASSERT_TRUE(WriteAll(fd_, bytes.data(), kObject, i * kObject).ok());
    ASSERT_EQ(fdatasync(fd_), 0);
  }
  // Restores object i through the windows; true if its bytes are those seeded by `seed`.
  bool Restores(uint64_t i, uint8_t seed) {
    std::vector<std::byte> got(kObject);
    const Status st =
        windows_.Read(kFile, fd_, direct_, got.data(), kObject, i * kObject, kFileSize);
    EXPECT_TRUE(st.ok()) << st.ToString();
    return got == Bytes(kObject, seed);
  }

  // Restores objects 0, 1 (a window of objects 1 to 32) and 2 (from it), checking their
  // bytes; the read ahead they asked for (of objects 33 to 64), taken.
  std::optional<ReadWindows::Ahead> ReadOnIntoTheFirstWindow() {
    for (uint64_t i = 0; i < 3; ++i) EXPECT_TRUE(Restores(i, static_cast<uint8_t>(i)));
    return windows_.TakeAhead();
  }

  static constexpr uint32_t kFile = 3;
  std::string path_;
  int fd_ = -1;
  int direct_ = -1;
  ReadWindows windows_;
};

TEST_F(ReadWindowsTest, RestoresThatReadOnComeFromOneWindowAndAreByteExact) {
  ASSERT_TRUE(Restores(0, 0));
  EXPECT_EQ(windows_.reads(), 1u) << "the first restore reads its own bytes";
  for (uint64_t i = 1; i < 32; ++i) ASSERT_TRUE(Restores(i, static_cast<uint8_t>(i)));
  // Object 1 read on from object 0: a window from it, which holds objects 1 to 32.
  EXPECT_EQ(windows_.reads(), 2u);
  EXPECT_EQ(windows_.hits(), 30u);
}

TEST_F(ReadWindowsTest, RestoresAtRandomReadTheirOwnBytesOnly) {
  for (uint64_t i : {40, 3, 77, 12, 60}) ASSERT_TRUE(Restores(i, static_cast<uint8_t>(i)));
  EXPECT_EQ(windows_.reads(), 5u);
  EXPECT_EQ(windows_.hits(), 0u);
  EXPECT_FALSE(windows_.TakeAhead().has_value());
}

TEST_F(ReadWindowsTest, TheNextWindowIsReadAheadOnceRestoresGoOnInOne) {
  ASSERT_TRUE(Restores(0, 0));
  ASSERT_TRUE(Restores(1, 1));  // reads the window of objects 1 to 32
  EXPECT_FALSE(windows_.TakeAhead().has_value()) << "nothing was read from the window yet";
  ASSERT_TRUE(Restores(2, 2));
  const std::optional<ReadWindows::Ahead> ahead = windows_.TakeAhead();
  ASSERT_TRUE(ahead.has_value());
  EXPECT_EQ(ahead->file, kFile);
  EXPECT_EQ(ahead->start, 33 * kObject);
  EXPECT_FALSE(windows_.TakeAhead().has_value()) << "asked for once";
  windows_.ReadAhead(*ahead, direct_, kFileSize);
  const uint64_t reads = windows_.reads();
  for (uint64_t i = 3; i < 65; ++i) ASSERT_TRUE(Restores(i, static_cast<uint8_t>(i)));
  EXPECT_EQ(windows_.reads(), reads) << "objects 33 to 64 came from the window read ahead";
}

TEST_F(ReadWindowsTest, AWriteThatInvalidatesAWindowIsSeenByTheNextRestore) {
  ASSERT_TRUE(Restores(0, 0));
  ASSERT_TRUE(Restores(1, 1));  // the window of objects 1 to 32
  // Object 5's block freed and written again, by another object's spill.
  Write(5, 200);
  windows_.Invalidate(kFile, 5 * kObject, kObject);
  for (uint64_t i = 2; i < 10; ++i) {
    ASSERT_TRUE(Restores(i, static_cast<uint8_t>(i == 5 ? 200 : i))) << "object " << i;
  }
}

TEST_F(ReadWindowsTest, AWindowReadAcrossAnInvalidationOfItsRangeIsNotKept) {
  const std::optional<ReadWindows::Ahead> ahead = ReadOnIntoTheFirstWindow();
  ASSERT_TRUE(ahead.has_value());
  // Asked for before object 40 was rewritten; read after. (A read under way while the
  // write lands may see either: so such a window is never kept.)
  Write(40, 123);
  windows_.Invalidate(kFile, 40 * kObject, kObject);
  windows_.ReadAhead(*ahead, direct_, kFileSize);
  const uint64_t hits = windows_.hits();
  std::vector<std::byte> got(kObject);
  EXPECT_FALSE(windows_.Copy(kFile, direct_, got.data(), kObject, 40 * kObject, kFileSize))
      << "the window read ahead was kept";
  EXPECT_EQ(windows_.hits(), hits);
  ASSERT_TRUE(Restores(40, 123));
}

TEST_F(ReadWindowsTest, AnInvalidationElsewhereKeepsAWindowReadAcrossIt) {
  const std::optional<ReadWindows::Ahead> ahead = ReadOnIntoTheFirstWindow();
  ASSERT_TRUE(ahead.has_value());
  windows_.Invalidate(kFile + 1, 40 * kObject, kObject);  // another file
  windows_.Invalidate(kFile, 10 * kObject, kObject);      // before the window
  windows_.ReadAhead(*ahead, direct_, kFileSize);
  std::vector<std::byte> got(kObject);
  EXPECT_TRUE(windows_.Copy(kFile, direct_, got.data(), kObject, 40 * kObject, kFileSize));
  EXPECT_EQ(got, Bytes(kObject, 40));
}

TEST_F(ReadWindowsTest, ManyInvalidationsElsewhereKeepNoWindowReadAcrossThem) {
  const std::optional<ReadWindows::Ahead> ahead = ReadOnIntoTheFirstWindow();
  ASSERT_TRUE(ahead.has_value());
  // More than the log keeps: whether one of them was in its range cannot be told.
  for (int i = 0; i < 1100; ++i) windows_.Invalidate(kFile + 1, 0, kObject);
  windows_.ReadAhead(*ahead, direct_, kFileSize);
  std::vector<std::byte> got(kObject);
  EXPECT_FALSE(windows_.Copy(kFile, direct_, got.data(), kObject, 40 * kObject, kFileSize));
}

TEST_F(ReadWindowsTest, ARestoreThatReachesAWindowBeingReadAheadWaitsForIt) {
  const std::optional<ReadWindows::Ahead> ahead = ReadOnIntoTheFirstWindow();
  ASSERT_TRUE(ahead.has_value());
  const uint64_t reads = windows_.reads();
  // Object 40 is in the window taken: its restore, before or after that read lands, reads
  // nothing of its own.
  bool intact = false;
  std::thread restore([&] { intact = Restores(40, 40); });
  windows_.ReadAhead(*ahead, direct_, kFileSize);
  restore.join();
  EXPECT_TRUE(intact);
  EXPECT_EQ(windows_.reads(), reads + 1) << "only the window read ahead";
}

TEST_F(ReadWindowsTest, AnObjectPartlyInAWindowIsReadAloneAndByteExact) {
  for (uint64_t i = 0; i < 32; ++i) ASSERT_TRUE(Restores(i, static_cast<uint8_t>(i)));
  const uint64_t reads = windows_.reads();
  // Reads on from object 31, across the end of the window of objects 1 to 32.
  std::vector<std::byte> got(2 * kObject);
  ASSERT_TRUE(
      windows_.Read(kFile, fd_, direct_, got.data(), 2 * kObject, 32 * kObject, kFileSize).ok());
  std::vector<std::byte> expected = Bytes(kObject, 32);
  const std::vector<std::byte> next = Bytes(kObject, 33);
  expected.insert(expected.end(), next.begin(), next.end());
  EXPECT_EQ(got, expected);
  EXPECT_EQ(windows_.reads(), reads + 1) << "its own bytes, not a window over the one held";
}

TEST_F(ReadWindowsTest, WithoutDirectIoEveryRestoreReadsItsOwnBytes) {
  for (uint64_t i = 0; i < 8; ++i) {
    std::vector<std::byte> got(kObject);
    ASSERT_TRUE(windows_.Read(kFile, fd_, -1, got.data(), kObject, i * kObject, kFileSize).ok());
    EXPECT_EQ(got, Bytes(kObject, static_cast<uint8_t>(i)));
  }
  EXPECT_EQ(windows_.reads(), 8u);
  EXPECT_EQ(windows_.hits(), 0u);
}

TEST_F(ReadWindowsTest, AWindowStopsAtTheEndOfTheFile) {
  ASSERT_TRUE(Restores(kObjects - 3, kObjects - 3));
  ASSERT_TRUE(Restores(kObjects - 2, kObjects - 2));  // a window of the last two objects
  ASSERT_TRUE(Restores(kObjects - 1, kObjects - 1));
  EXPECT_EQ(windows_.hits(), 1u);
  EXPECT_FALSE(windows_.TakeAhead().has_value()) << "nothing after the file's end";
}

TEST_F(ReadWindowsTest, AFailedRestoreSaysWhy) {
  std::vector<std::byte> got(kObject);
  // Past the file's end: the file was truncated under it.
  const Status st = windows_.Read(kFile, fd_, direct_, got.data(), kObject, kFileSize, kFileSize);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("truncated"), std::string::npos) << st.ToString();
}

}  // namespace
}  // namespace depot::store
