// The disk tier (depotd --spill-dir): host objects spill to disk when the arena needs room and
// come back on get, byte-exact; deletes free their disk space; the spill directory is the
// daemon's alone and nothing of it outlives the daemon; and I/O that fails is reported, never a
// silent loss.
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "child_process.h"
#include "daemon.h"
#include "depot/client.h"
#include "raw_session.h"
#include "test_support.h"

namespace depot::testing {
namespace {

using std::chrono::milliseconds;
constexpr uint64_t kKiB = 1 << 10;
constexpr uint64_t kMiB = 1 << 20;
// The arena: 64 MiB in segments of 16 MiB; the objects put below are four times that.
constexpr uint64_t kArena = 64 * kMiB;

// An object's data, and metadata that names it: both checked on the way back.
std::vector<std::byte> DataOf(int i, uint64_t bytes) { return SeededBytes(bytes, 7919 * i + 1); }
std::string MetadataOf(int i) { return "object " + std::to_string(i); }
ObjectId IdOf(int i) { return ObjectId::FromName("disk/" + std::to_string(i)); }

// Mixed sizes: many small objects packed into spill files, some of a few MiB, and some larger
// than a segment (a segment, and a spill file, of their own).
uint64_t SizeOf(int i) {
  switch (i % 8) {
    case 0:
      return 20 * kMiB;
    case 1:
    case 2:
      return 4 * kMiB + 123;
    case 3:
      return 1 * kMiB;
    default:
      return 64 * kKiB + 8 * (i % 5);
  }
}

// Files in `dir` other than the daemon's lock file.
std::vector<std::string> Leftovers(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().filename() != ".depotd.lock") out.push_back(e.path().filename());
  }
  return out;
}

class DiskTierTest : public ::testing::Test {
 protected:
  void Start(std::vector<std::string> extra = {}) {
    ASSERT_FALSE(spill_root_.path().empty()) << spill_root_.error();
    // Spill files of 8 MiB: the 20 MiB objects get files of their own.
    std::vector<std::string> flags = {"--memory",    "64MiB",     "--segment-size",    "16MiB",
                                      "--spill-dir", spill_dir(), "--spill-file-size", "8MiB"};
    flags.insert(flags.end(), extra.begin(), extra.end());
    daemon_.emplace(flags);
    ASSERT_TRUE(daemon_->ok()) << daemon_->error();
    ASSERT_OK_AND_ASSIGN(client_, Client::Connect(daemon_->socket_path()));
  }
  std::string spill_dir() const { return spill_root_.path() + "/spill"; }

  Status PutObject(int i, bool checksum = false) {
    CreateOptions options;
    const std::string metadata = MetadataOf(i);
    options.metadata = AsBytes(metadata);
    options.checksum = checksum;
    return client_->Put(IdOf(i), DataOf(i, SizeOf(i)), options);
  }
  // Gets object i and checks every byte of it.
  void ExpectIntact(int i) {
    auto got = client_->Get(IdOf(i));
    ASSERT_TRUE(got.ok()) << "object " << i << ": " << got.status().ToString();
    EXPECT_TRUE(SameBytes(got->data(), DataOf(i, SizeOf(i)))) << "object " << i;
    EXPECT_TRUE(SameBytes(got->metadata(), AsBytes(MetadataOf(i)))) << "object " << i;
  }
  DiskStatus Disk() {
    auto status = client_->GetStatus();
    EXPECT_TRUE(status.ok()) << status.status().ToString();
    return status.ok() ? status->disk : DiskStatus{};
  }
  // Waits until no copy to or from disk is under way (writes ahead of need included), on
  // three looks in a row: one ending may start the next.
  void Settle() {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    for (int idle = 0; idle < 3 && std::chrono::steady_clock::now() < deadline;) {
      idle = Disk().copies_in_flight == 0 ? idle + 1 : 0;
      if (idle == 0) std::this_thread::sleep_for(milliseconds(2));
    }
  }
  // The daemon's descriptors of its spill files, as /proc/<pid>/fd paths a test may open.
  std::vector<std::string> SpillFiles() const {
    std::vector<std::string> out;
    const std::string fds = "/proc/" + std::to_string(daemon_->pid()) + "/fd";
    for (const auto& e : std::filesystem::directory_iterator(fds)) {
      std::error_code ec;
      const std::string target = std::filesystem::read_symlink(e.path(), ec).string();
      if (!ec && target.starts_with(spill_dir())) out.push_back(e.path());
    }
    return out;
  }
  ObjectInfo Info(int i) {
    auto listed = client_->List();
    EXPECT_TRUE(listed.ok()) << listed.status().ToString();
    for (const ObjectInfo& o : listed.ok() ? *listed : std::vector<ObjectInfo>{}) {
      if (o.id == IdOf(i)) return o;
    }
    ADD_FAILURE() << "object " << i << " is not listed";
    return {};
  }

  TempDir spill_root_;
  std::optional<TestDaemon> daemon_;
  std::optional<Client> client_;
};

TEST_F(DiskTierTest, FourTimesTheArenaAllComesBackByteExact) {
  Start();
  uint64_t total = 0;
  int n = 0;
  for (; total < 4 * kArena; ++n) {
    ASSERT_OK(PutObject(n, /*checksum=*/n % 3 == 0));
    total += SizeOf(n);
  }
  DiskStatus disk = Disk();
  EXPECT_TRUE(disk.enabled);
  EXPECT_EQ(disk.dir, spill_dir());
  EXPECT_GT(disk.spills, 0u);
  EXPECT_GE(disk.spilled_bytes, 2 * kArena);
  EXPECT_GT(disk.objects, 0u);
  EXPECT_EQ(disk.drops, 0u);
  // The first objects are on disk only, and say so.
  const ObjectInfo first = Info(0);
  EXPECT_TRUE(first.on_disk);
  EXPECT_FALSE(first.on_host);
  // Every object comes back, oldest first (each restore spills others), then newest first.
  for (int i = 0; i < n; ++i) ExpectIntact(i);
  for (int i = n - 1; i >= 0; --i) ExpectIntact(i);
  disk = Disk();
  EXPECT_GT(disk.restores, 0u);
  EXPECT_GT(disk.restored_bytes, 0u);
  EXPECT_GT(disk.restore_seconds, 0.0);
  EXPECT_EQ(disk.restore_failures, 0u);
  EXPECT_EQ(disk.drops, 0u);
  ASSERT_OK_AND_ASSIGN(StoreStatus status, client_->GetStatus());
  EXPECT_EQ(status.evictions, 0u) << "an object left the store instead of spilling";
  EXPECT_EQ(status.objects_sealed, static_cast<uint64_t>(n));
}

TEST_F(DiskTierTest, SmallObjectsGoToDiskTogetherAndComeBackByteExactAsTheirSpaceIsReused) {
  Start();
  // Objects of about 64 KiB (not whole pages, some with checksums), three times the arena in
  // all: most spill, written together, and come back through read windows.
  const auto size = [](int i) { return 64 * kKiB - 512 + (i % 9) * 64; };
  const auto put = [&](int i) {
    CreateOptions options;
    const std::string metadata = MetadataOf(i);
    options.metadata = AsBytes(metadata);
    options.checksum = i % 4 == 0;
    return client_->Put(IdOf(i), DataOf(i, size(i)), options);
  };
  const auto intact = [&](int i) {
    auto got = client_->Get(IdOf(i));
    if (!got.ok()) return ::testing::AssertionFailure() << i << ": " << got.status().ToString();
    if (!SameBytes(got->data(), DataOf(i, size(i))) ||
        !SameBytes(got->metadata(), AsBytes(MetadataOf(i)))) {
      return ::testing::AssertionFailure() << "object " << i << " came back changed";
    }
    return ::testing::AssertionSuccess();
  };
  constexpr int kFirst = 2048;
  for (int i = 0; i < kFirst; ++i) ASSERT_OK(put(i));
  Settle();
  const DiskStatus spilled = Disk();
  ASSERT_GT(spilled.spills, 1000u);
  if (spilled.direct_io) {
    EXPECT_LT(spilled.writes * 8, spilled.spills) << "small objects are written one by one";
  } else {
    EXPECT_EQ(spilled.writes, spilled.spills) << "buffered: each on its own";
  }
  // The oldest half, oldest first: restores that read on share windows.
  for (int i = 0; i < kFirst / 2; ++i) ASSERT_TRUE(intact(i));
  const DiskStatus restored = Disk();
  ASSERT_GT(restored.restores, 500u);
  if (restored.direct_io) {
    EXPECT_LT((restored.reads - spilled.reads) * 4, restored.restores - spilled.restores)
        << "small objects are read one by one";
  }
  // The next quarter in gets of 64 ids: restores of one turn are read in runs.
  for (int i = kFirst / 2; i < kFirst * 3 / 4; i += 64) {
    std::vector<ObjectId> ids;
    for (int k = i; k < i + 64; ++k) ids.push_back(IdOf(k));
    ASSERT_OK_AND_ASSIGN(std::vector<Buffer> got, client_->Get(ids));
    for (int k = i; k < i + 64; ++k) {
      ASSERT_TRUE(SameBytes(got[k - i].data(), DataOf(k, size(k)))) << "object " << k;
      ASSERT_TRUE(SameBytes(got[k - i].metadata(), AsBytes(MetadataOf(k)))) << "object " << k;
    }
  }
  const DiskStatus batched = Disk();
  ASSERT_GT(batched.restores - restored.restores, 200u);
  if (batched.direct_io) {
    EXPECT_LT((batched.reads - restored.reads) * 4, batched.restores - restored.restores)
        << "restores asked for together are read one by one";
  }
  // Every other one of the oldest half deleted: their disk blocks are free for the spills the
  // next objects cause, within the ranges windows were read from.
  for (int i = 0; i < kFirst / 2; i += 2) ASSERT_OK(client_->Delete(IdOf(i)));
  for (int i = kFirst; i < kFirst + kFirst / 2; ++i) ASSERT_OK(put(i));
  for (int i = 1; i < kFirst / 2; i += 2) ASSERT_TRUE(intact(i));
  for (int i = kFirst / 2; i < kFirst + kFirst / 2; ++i) ASSERT_TRUE(intact(i));
  const DiskStatus after = Disk();
  EXPECT_EQ(after.restore_failures, 0u);
  EXPECT_EQ(after.spill_failures, 0u);
  ASSERT_OK_AND_ASSIGN(StoreStatus status, client_->GetStatus());
  EXPECT_EQ(status.evictions, 0u) << "an object left the store instead of spilling";
}

TEST_F(DiskTierTest, ABatchedGetRestoresSpilledObjectsTogether) {
  Start();
  for (int i = 0; i < 24; ++i) ASSERT_OK(PutObject(i));
  ASSERT_TRUE(Info(1).on_disk && !Info(1).on_host);
  // Objects 1, 2, 3 and 4 (4 MiB and 1 MiB, all spilled) and 23 (in memory) in one get.
  const std::vector<ObjectId> ids = {IdOf(1), IdOf(2), IdOf(3), IdOf(4), IdOf(23)};
  ASSERT_OK_AND_ASSIGN(std::vector<Buffer> got, client_->Get(ids));
  ASSERT_EQ(got.size(), ids.size());
  for (size_t k = 0; k < ids.size(); ++k) {
    const int i = k < 4 ? static_cast<int>(k) + 1 : 23;
    EXPECT_TRUE(SameBytes(got[k].data(), DataOf(i, SizeOf(i)))) << "object " << i;
  }
}

TEST_F(DiskTierTest, AWaitingGetIsAnsweredWithTheObjectRestored) {
  Start();
  // A get waits for an id not put yet; meanwhile it is put, then pushed out to disk.
  Status waited = Status::Internal("not answered");
  std::thread waiter([&] {
    auto other = Client::Connect(daemon_->socket_path());
    if (!other.ok()) {
      waited = other.status();
      return;
    }
    auto got = other->Get(IdOf(3), milliseconds(60'000));
    if (!got.ok()) {
      waited = got.status();
    } else {
      // The bytes are checked while the handle lives.
      waited = SameBytes(got->data(), DataOf(3, SizeOf(3))) ? Status::OK()
                                                            : Status::Internal("wrong bytes");
    }
  });
  ASSERT_OK(PutObject(3));
  waiter.join();
  EXPECT_TRUE(waited.ok()) << waited.ToString();
  // Then the same id from disk, once twice the arena was put after it (its reader's release
  // made it recently used when the daemon saw it).
  for (int i = 10; i < 50; ++i) ASSERT_OK(PutObject(i));
  ASSERT_TRUE(Info(3).on_disk);
  ExpectIntact(3);
}

TEST_F(DiskTierTest, ReadersRacingSpillsAlwaysSeeWholeObjects) {
  Start();
  // A writer keeps the arena under pressure; readers get objects that are being spilled,
  // restored and spilled again, and check every byte. Objects of at most 4 MiB (not those of
  // 20 MiB, ids 8k): two readers holding one each leave room for any create.
  constexpr int kObjects = 56;
  const auto object = [](int k) { return k / 7 * 8 + k % 7 + 1; };
  std::atomic<int> written{0};
  std::atomic<bool> stop{false};
  std::atomic<int> wrong{0}, failed{0}, reads{0};
  std::vector<std::thread> readers;
  for (int r = 0; r < 2; ++r) {
    readers.emplace_back([&, r] {
      auto reader = Client::Connect(daemon_->socket_path());
      if (!reader.ok()) {
        failed++;
        return;
      }
      for (int k = r; !stop; k += 7) {
        const int have = written.load();
        if (have == 0) continue;
        const int i = object(k % have);
        auto got = reader->Get(IdOf(i));
        if (!got.ok()) {
          failed++;
          continue;
        }
        if (!SameBytes(got->data(), DataOf(i, SizeOf(i)))) wrong++;
        reads++;
      }
    });
  }
  for (int k = 0; k < kObjects; ++k) {
    ASSERT_OK(PutObject(object(k)));
    written = k + 1;
  }
  // Some more reads once everything is written.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  const int before = reads.load();
  while (reads.load() < before + 50 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::yield();
  }
  stop = true;
  for (auto& t : readers) t.join();
  EXPECT_EQ(wrong.load(), 0);
  // A reader holds at most one object: every get finds room.
  EXPECT_EQ(failed.load(), 0);
  EXPECT_GT(reads.load(), 50);
  EXPECT_GT(Disk().restores, 0u);
}

TEST_F(DiskTierTest, DeletingASpilledObjectFreesItsDiskSpace) {
  Start();
  for (int i = 0; i < 20; ++i) ASSERT_OK(PutObject(i));
  ASSERT_TRUE(Info(0).on_disk);  // 20 MiB: a spill file of its own
  Settle();
  const DiskStatus before = Disk();
  ASSERT_GE(before.used_bytes, SizeOf(0));
  ASSERT_OK(client_->Delete(IdOf(0)));
  const DiskStatus after = Disk();
  EXPECT_EQ(before.used_bytes - after.used_bytes,
            (SizeOf(0) + MetadataOf(0).size() + 4095) / 4096 * 4096);
  EXPECT_EQ(after.files, before.files - 1);
  EXPECT_LT(after.file_bytes, before.file_bytes);
  EXPECT_EQ(client_->Get(IdOf(0)).status().code(), StatusCode::kNotFound);
  // Deleting every object empties the spill directory's files.
  for (int i = 1; i < 20; ++i) ASSERT_OK(client_->Delete(IdOf(i)));
  // An object being written to disk ahead of need goes when that write ends.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (Disk().objects != 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(5));
  }
  const DiskStatus empty = Disk();
  EXPECT_EQ(empty.used_bytes, 0u);
  EXPECT_EQ(empty.files, 0u);
  EXPECT_EQ(empty.objects, 0u);
}

TEST_F(DiskTierTest, AFullSpillLimitDropsTheLeastRecentlyUsedSpilledObjects) {
  // Room on disk for about 40 MiB: older spilled objects go for good, counted as drops.
  Start({"--spill-limit", "40MiB"});
  for (int i = 0; i < 40; ++i) ASSERT_OK(PutObject(i));
  const DiskStatus disk = Disk();
  EXPECT_GT(disk.drops, 0u);
  EXPECT_LE(disk.file_bytes, 40 * kMiB);
  EXPECT_EQ(client_->Get(IdOf(1)).status().code(), StatusCode::kNotFound);
  ExpectIntact(39);
}

TEST_F(DiskTierTest, AnObjectLargerThanTheSpillLimitIsEvictedAndDropsNothingFromDisk) {
  // 20 MiB objects can never fit a 16 MiB spill limit: they are evicted as without a spill
  // directory (first, since that makes room at once), and nothing on disk is dropped for them.
  Start({"--spill-limit", "16MiB"});
  for (int i = 1; i < 8; ++i) ASSERT_OK(PutObject(i));  // 9 MiB that may spill
  for (int i : {0, 8, 16, 24}) ASSERT_OK(PutObject(i));
  const DiskStatus disk = Disk();
  EXPECT_EQ(disk.drops, 0u);
  EXPECT_EQ(disk.spill_failures, 0u);
  ASSERT_OK_AND_ASSIGN(StoreStatus status, client_->GetStatus());
  EXPECT_GE(status.evictions, 1u);
  EXPECT_EQ(client_->Get(IdOf(0)).status().code(), StatusCode::kNotFound);
  for (int i = 1; i < 8; ++i) ExpectIntact(i);
  ExpectIntact(24);
}

TEST(DiskTierFullTest, AFileSystemThatRefusesSpillFilesKeepsObjectsInMemoryAndSaysWhy) {
  // A file size limit of 6 MiB on the daemon: its arena segments (4 MiB) and header table
  // (1,000 slots) fit, but it cannot
  // size a spill file (8 MiB), as on a full disk. Nothing is dropped or lost: the objects stay
  // in memory, and the create that needed their room fails with the file system's reason.
  TempDir root;
  ASSERT_FALSE(root.path().empty()) << root.error();
  rlimit before{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &before), 0);
  rlimit small = before;
  small.rlim_cur = 6 << 20;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  std::optional<TestDaemon> daemon;
  daemon.emplace(std::vector<std::string>{"--memory", "16MiB", "--segment-size", "4MiB",
                                          "--max-objects", "1000", "--spill-dir",
                                          root.path() + "/spill", "--spill-file-size", "8MiB"});
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &before), 0);
  ASSERT_TRUE(daemon->ok()) << daemon->error();
  ASSERT_OK_AND_ASSIGN(Client client, Client::Connect(daemon->socket_path()));
  // 1 MiB objects: the arena holds 16.
  const auto put = [&](int i) { return client.Put(IdOf(i), DataOf(i, kMiB)); };
  for (int i = 0; i < 16; ++i) ASSERT_OK(put(i));
  const Status st = put(16);
  EXPECT_EQ(st.code(), StatusCode::kOutOfMemory) << st.ToString();
  EXPECT_NE(st.message().find("cannot size a spill file"), std::string::npos) << st.ToString();
  EXPECT_NE(st.message().find("File too large"), std::string::npos) << st.ToString();
  ASSERT_OK_AND_ASSIGN(StoreStatus status, client.GetStatus());
  EXPECT_GT(status.disk.spill_failures, 0u);
  EXPECT_EQ(status.evictions, 0u);
  EXPECT_EQ(status.disk.drops, 0u);
  for (int i = 0; i < 16; ++i) {
    ASSERT_OK_AND_ASSIGN(Buffer got, client.Get(IdOf(i)));
    EXPECT_TRUE(SameBytes(got.data(), DataOf(i, kMiB)));
  }
}

TEST_F(DiskTierTest, TheLeastRecentlyUsedObjectsAreWrittenAheadWhileTheyStayInMemory) {
  Start();
  // 58 MiB of 64: past the watermark (a quarter of the arena kept ready to free at once), so
  // the least recently used object is written to disk ahead of need and stays in memory.
  for (int i = 0; i < 12; ++i) ASSERT_OK(PutObject(i));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!Info(0).on_disk && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(5));
  }
  const ObjectInfo first = Info(0);
  EXPECT_TRUE(first.on_disk && first.on_host);
  EXPECT_FALSE(Info(11).on_disk);
  // Room for the next object is made at once by dropping that host copy: nothing is lost.
  ASSERT_OK(PutObject(12));
  ASSERT_OK(PutObject(16));
  ASSERT_OK_AND_ASSIGN(StoreStatus status, client_->GetStatus());
  EXPECT_EQ(status.evictions, 0u);
  for (int i : {0, 1, 11, 12, 16}) ExpectIntact(i);
}

TEST_F(DiskTierTest, AnObjectCreatedWithSpillFalseIsEvictedForGoodInstead) {
  Start();
  CreateOptions no_spill;
  no_spill.spill = false;
  no_spill.name = "cache";
  const ObjectId cache = ObjectId::FromName("disk/cache");
  ASSERT_OK(client_->Put(cache, DataOf(99, 4 * kMiB), no_spill));
  for (int i = 0; i < 24; ++i) ASSERT_OK(PutObject(i));
  EXPECT_EQ(client_->Get(cache).status().code(), StatusCode::kNotFound);
  ASSERT_OK_AND_ASSIGN(StoreStatus status, client_->GetStatus());
  EXPECT_EQ(status.evictions, 1u);
  EXPECT_EQ(status.disk.drops, 0u);
  EXPECT_GT(status.disk.spills, 0u);
  ExpectIntact(0);  // spilled, not evicted
}

TEST_F(DiskTierTest, ATruncatedSpillFileFailsThatGetAndTheOthersStillWork) {
  Start();
  for (int i = 0; i < 24; ++i) ASSERT_OK(PutObject(i, /*checksum=*/true));
  ASSERT_TRUE(Info(0).on_disk && Info(1).on_disk);
  ASSERT_FALSE(Info(0).on_host);
  // Object 0 has a spill file of its own (20 MiB), which starts with its bytes: truncate it
  // through the daemon's descriptor, as a failing disk or another process with the daemon's
  // rights might.
  std::vector<std::byte> head = DataOf(0, SizeOf(0));
  head.resize(4096);
  bool truncated = false;
  for (const std::string& path : SpillFiles()) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0 || static_cast<uint64_t>(st.st_size) != 20 * kMiB + 4096) {
      continue;
    }
    const int fd = ::open(path.c_str(), O_RDWR);
    ASSERT_GE(fd, 0) << std::strerror(errno);
    std::vector<std::byte> first(4096);
    if (::pread(fd, first.data(), first.size(), 0) == 4096 && first == head) {
      ASSERT_EQ(::ftruncate(fd, 4096), 0) << std::strerror(errno);
      truncated = true;
    }
    ::close(fd);
  }
  ASSERT_TRUE(truncated) << "no spill file of 20 MiB among the daemon's descriptors";
  const auto lost = client_->Get(IdOf(0));
  EXPECT_EQ(lost.status().code(), StatusCode::kIoError) << lost.status().ToString();
  EXPECT_NE(lost.status().message().find("truncated"), std::string::npos)
      << lost.status().ToString();
  EXPECT_EQ(Disk().restore_failures, 1u);
  // Lost for good, and said so no more than once: the id is gone.
  EXPECT_EQ(client_->Get(IdOf(0)).status().code(), StatusCode::kNotFound);
  for (int i = 1; i < 24; ++i) ExpectIntact(i);
}

TEST_F(DiskTierTest, ASpilledObjectWhoseBytesChangedOnDiskFailsItsChecksumAndIsLost) {
  Start();
  for (int i = 0; i < 24; ++i) ASSERT_OK(PutObject(i, /*checksum=*/true));
  Settle();
  ASSERT_TRUE(Info(1).on_disk && !Info(1).on_host);
  // Object 1 (4 MiB) shares a spill file with others: find its first page among the daemon's
  // spill files and change one byte of it.
  std::vector<std::byte> head = DataOf(1, SizeOf(1));
  head.resize(4096);
  bool changed = false;
  for (const std::string& path : SpillFiles()) {
    if (changed) break;
    const int fd = ::open(path.c_str(), O_RDWR);
    if (fd < 0) continue;
    std::vector<std::byte> page(4096);
    for (off_t at = 0; !changed && ::pread(fd, page.data(), page.size(), at) == 4096; at += 4096) {
      if (page != head) continue;
      const std::byte flipped = page[100] ^ std::byte{1};
      ASSERT_EQ(::pwrite(fd, &flipped, 1, at + 100), 1) << std::strerror(errno);
      changed = true;
    }
    ::close(fd);
  }
  ASSERT_TRUE(changed) << "object 1's bytes are in none of the daemon's spill files";
  const auto lost = client_->Get(IdOf(1));
  EXPECT_EQ(lost.status().code(), StatusCode::kIoError) << lost.status().ToString();
  EXPECT_NE(lost.status().message().find("checksum"), std::string::npos)
      << lost.status().ToString();
  EXPECT_EQ(client_->Get(IdOf(1)).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(Disk().restore_failures, 1u);
  for (int i : {0, 2, 3, 23}) ExpectIntact(i);
}

TEST_F(DiskTierTest, BufferedIoWorksAsWell) {
  Start({"--spill-io", "buffered"});
  for (int i = 0; i < 40; ++i) ASSERT_OK(PutObject(i, /*checksum=*/i % 2 == 0));
  EXPECT_FALSE(Disk().direct_io);
  for (int i = 0; i < 40; ++i) ExpectIntact(i);
  EXPECT_GT(Disk().restores, 0u);
}

TEST_F(DiskTierTest, AClientNamingTheDiskTierIsRefusedAndHarmsNothing) {
  Start();
  for (int i = 0; i < 24; ++i) ASSERT_OK(PutObject(i));
  ASSERT_TRUE(Info(0).on_disk);
  // The disk is the daemon's own tier: no request may create, get, prefetch or release a
  // copy there, whatever number a client tries for it.
  RawSession raw(daemon_->socket_path());
  ASSERT_TRUE(raw.Call(1, [](auto r) { FillHello(r); }));
  uint64_t rid = 2;
  const auto refused = [&](const std::function<void(wire::Request::Builder)>& fill) {
    auto reply = raw.Call(rid++, fill);
    ASSERT_TRUE(reply);
    EXPECT_EQ(reply->get().getError(), wire::ErrorCode::INVALID_ARGUMENT)
        << reply->get().getMessage().cStr();
  };
  for (const int32_t device : {100, -3, 99, 1 << 30}) {
    SCOPED_TRACE("device " + std::to_string(device));
    refused([&](wire::Request::Builder r) {
      GetOf({IdOf(0)})(r);
      r.getGet().setDevice(device);
    });
    refused([&](wire::Request::Builder r) {
      auto prefetch = r.initPrefetch();
      ipc::ToWire(IdOf(0), prefetch.initIds(1)[0]);
      prefetch.setDevice(device);
    });
    refused([&](wire::Request::Builder r) {
      CreateOf(ObjectId::FromName("disk/raw"), 4096)(r);
      r.getCreate().setDevice(device);
    });
    refused(ReleaseOf({{device, {IdOf(0)}}}));
  }
  EXPECT_FALSE(raw.closed());
  ExpectIntact(0);
  EXPECT_EQ(Disk().restore_failures, 0u);
}

TEST(DiskTierDirTest, TheSpillDirectoryIsMadePrivateAndOneOpenToOthersIsRefused) {
  TempDir root;
  ASSERT_FALSE(root.path().empty()) << root.error();
  {
    TestDaemon daemon({"--spill-dir", root.path() + "/made"});
    ASSERT_TRUE(daemon.ok()) << daemon.error();
    struct stat st {};
    ASSERT_EQ(::stat((root.path() + "/made").c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0700u);
  }
  const std::string open_dir = root.path() + "/open";
  ASSERT_EQ(::mkdir(open_dir.c_str(), 0755), 0);
  ASSERT_EQ(::chmod(open_dir.c_str(), 0755), 0);
  ProgramRun run = RunProgram({DEPOT_DAEMON_PATH, "--socket", root.path() + "/d.sock", "--memory",
                               "16MiB", "--spill-dir", open_dir},
                              {}, milliseconds(10'000));
  EXPECT_NE(run.exit_code, 0) << run.Explain();
  EXPECT_NE(run.err.find(open_dir), std::string::npos) << run.Explain();
  EXPECT_NE(run.err.find("0755"), std::string::npos) << run.Explain();
  const std::string file = root.path() + "/file";
  ASSERT_EQ(::close(::open(file.c_str(), O_CREAT | O_WRONLY, 0600)), 0);
  run = RunProgram({DEPOT_DAEMON_PATH, "--socket", root.path() + "/d.sock", "--memory", "16MiB",
                    "--spill-dir", file},
                   {}, milliseconds(10'000));
  EXPECT_NE(run.exit_code, 0) << run.Explain();
  EXPECT_NE(run.err.find("not a directory"), std::string::npos) << run.Explain();
  run = RunProgram({DEPOT_DAEMON_PATH, "--socket", root.path() + "/d.sock", "--memory", "16MiB",
                    "--spill-dir", root.path() + "/x", "--no-evict"},
                   {}, milliseconds(10'000));
  EXPECT_NE(run.exit_code, 0) << run.Explain();
  EXPECT_NE(run.err.find("--no-evict"), std::string::npos) << run.Explain();
}

TEST(DiskTierDirTest, ASpillDirectoryInUseByARunningDaemonIsRefused) {
  TempDir root;
  ASSERT_FALSE(root.path().empty()) << root.error();
  const std::string dir = root.path() + "/spill";
  TestDaemon first({"--spill-dir", dir});
  ASSERT_TRUE(first.ok()) << first.error();
  ProgramRun second = RunProgram({DEPOT_DAEMON_PATH, "--socket", root.path() + "/second.sock",
                                  "--memory", "16MiB", "--spill-dir", dir},
                                 {}, milliseconds(10'000));
  EXPECT_NE(second.exit_code, 0) << second.Explain();
  EXPECT_NE(second.err.find("in use by another running depotd (pid " + std::to_string(first.pid())),
            std::string::npos)
      << second.Explain();
}

TEST_F(DiskTierTest, ADaemonKilledWithSpilledObjectsLeavesNothingBehind) {
  Start();
  for (int i = 0; i < 24; ++i) ASSERT_OK(PutObject(i));
  ASSERT_GT(Disk().objects, 0u);
  client_.reset();
  daemon_->Kill();
  EXPECT_EQ(Leftovers(spill_dir()), std::vector<std::string>{});
  // A fresh daemon takes the directory over, and starts with nothing spilled.
  daemon_.reset();
  Start();
  const DiskStatus disk = Disk();
  EXPECT_EQ(disk.objects, 0u);
  EXPECT_EQ(disk.files, 0u);
  EXPECT_EQ(client_->Get(IdOf(0)).status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace depot::testing
