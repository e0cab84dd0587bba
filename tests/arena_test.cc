// What a client maps, and objects larger than a segment (docs/architecture.md, "The host
// arena"): a client maps only the segments it reads from and populates nothing ahead; an
// object larger than --segment-size gets a segment of its own, mapped by a client only while
// it holds the object, and its capacity comes back when it goes.
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "daemon.h"
#include "depot/client.h"
#include "store_checks.h"
#include "test_support.h"

namespace depot::testing {
namespace {

constexpr uint64_t kMiB = 1 << 20;

ObjectId Id(const std::string& name) { return ObjectId::FromName("arena/" + name); }

// This process's mappings whose path contains `name` (memfds show as "/memfd:NAME (deleted)").
int MappingsNamed(const std::string& name) {
  std::ifstream maps("/proc/self/maps");
  int count = 0;
  for (std::string line; std::getline(maps, line);) {
    if (line.find(name) != std::string::npos) ++count;
  }
  return count;
}

// This process's resident memory, in bytes (/proc/self/statm).
uint64_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  uint64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
}

// The bytes allocated in a daemon's files named `kind`N (shared segments: depot-segment-;
// objects' own: depot-object-), each file once however many descriptors it has: what the
// arena holds of the machine's memory, whether any process maps those pages or not.
uint64_t SegmentBytesAllocated(pid_t pid, const std::string& kind = "depot-segment-") {
  std::set<std::pair<dev_t, ino_t>> seen;
  uint64_t bytes = 0;
  std::error_code error;
  for (const auto& entry :
       std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd", error)) {
    const auto target = std::filesystem::read_symlink(entry.path(), error);
    struct stat st {};
    if (error || target.string().find(kind) == std::string::npos ||
        ::stat(entry.path().c_str(), &st) != 0) {
      continue;
    }
    if (seen.emplace(st.st_dev, st.st_ino).second)
      bytes += static_cast<uint64_t>(st.st_blocks) * 512;
  }
  return bytes;
}

class ArenaTest : public ::testing::Test {
 protected:
  // 64 MiB in segments of 8 MiB.
  void Start(std::vector<std::string> flags = {"--memory", "64MiB", "--segment-size", "8MiB"}) {
    daemon_.emplace(std::move(flags));
    ASSERT_TRUE(daemon_->ok()) << daemon_->error();
    ASSERT_OK_AND_ASSIGN(client_, Client::Connect(daemon_->socket_path()));
  }
  void TearDown() override {
    if (client_ && !HasFatalFailure()) ExpectObjectsOnHostMatchTheList(*client_);
  }

  Status Put(const std::string& name, uint64_t bytes) {
    return client_->Put(Id(name), SeededBytes(bytes, Xxh3(AsBytes(name))));
  }
  // Whether `reader` reads `name` (of `bytes`) byte for byte.
  void ExpectReads(Client& reader, const std::string& name, uint64_t bytes) {
    ASSERT_OK_AND_ASSIGN(Buffer buffer, reader.Get(Id(name)));
    ASSERT_EQ(buffer.size(), bytes);
    EXPECT_EQ(Xxh3(buffer.data()), Xxh3(SeededBytes(bytes, Xxh3(AsBytes(name))))) << name;
  }
  StoreStatus Stats() {
    auto status = client_->GetStatus();
    EXPECT_TRUE(status.ok()) << status.status().ToString();
    return status.ok() ? *status : StoreStatus{};
  }

  std::optional<TestDaemon> daemon_;
  std::optional<Client> client_;
};

TEST_F(ArenaTest, AFreshClientMapsOnlyTheSegmentItReadsAndPopulatesNothingAhead) {
  Start({"--memory", "256MiB", "--segment-size", "16MiB"});
  {
    // 192 MiB of objects filling twelve segments, then the small one in the thirteenth,
    // from a client that is gone before the reader comes (its mappings with it).
    ASSERT_OK_AND_ASSIGN(Client writer, Client::Connect(daemon_->socket_path()));
    for (int i = 0; i < 12; ++i) {
      ASSERT_OK(writer.Put(Id("filler" + std::to_string(i)), SeededBytes(16 * kMiB, i)));
    }
    ASSERT_OK(writer.Put(Id("small"), AsBytes("eighty bytes, or about that: the object a fresh "
                                              "process wants from a full arena")));
  }
  client_.reset();
  ASSERT_EQ(MappingsNamed("depot-segment-"), 0) << "no client of this process is left";
  ASSERT_OK_AND_ASSIGN(Client reader, Client::Connect(daemon_->socket_path()));
  const uint64_t before = ResidentBytes();
  {
    ASSERT_OK_AND_ASSIGN(Buffer small, reader.Get(Id("small")));
    EXPECT_EQ(small.data()[0], std::byte{'e'});
    EXPECT_EQ(MappingsNamed("depot-segment-"), 1) << "only the segment that holds it";
  }
  const uint64_t grown = ResidentBytes() - std::min(before, ResidentBytes());
  EXPECT_LT(grown, 4 * kMiB) << "a get of one small object populated " << grown / kMiB
                             << " MiB (the arena holds 192 MiB)";
  client_.emplace(std::move(reader));
}

// Polls, for at most 10 s (far more than it takes), until the daemon's segment files hold
// at least `bytes`; returns what they hold then.
uint64_t WaitForSegmentBytes(pid_t daemon, uint64_t bytes) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (SegmentBytesAllocated(daemon) < bytes && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return SegmentBytesAllocated(daemon);
}

TEST_F(ArenaTest, SegmentsSmallerThanThePrefaultWindowArePreallocatedWhole) {
  Start({"--memory", "64MiB", "--segment-size", "16MiB"});
  ASSERT_OK(Put("small", kMiB));
  // The segment that holds it and the one kept ready, allocated on a worker.
  EXPECT_EQ(WaitForSegmentBytes(daemon_->pid(), 32 * kMiB), 32 * kMiB);
}

TEST_F(ArenaTest, LargeSegmentsArePreallocatedAWindowAheadOfTheirObjects) {
  Start({"--memory", "1GiB", "--segment-size", "512MiB"});
  ASSERT_OK(Put("first", kMiB));
  // 64 MiB (the window) of the segment that holds it and of the one kept ready, not the
  // 1 GiB of both.
  EXPECT_EQ(WaitForSegmentBytes(daemon_->pid(), 128 * kMiB), 128 * kMiB);
  // As objects fill the segment, the window moves ahead of them.
  for (int i = 0; i < 10; ++i) ASSERT_OK(Put("ten-" + std::to_string(i), 10 * kMiB));
  // The objects end at 101 MiB, which the writes alone would allocate; the one that ended
  // at 41 MiB found 23 MiB allocated ahead of it, under half a window, and asked for pages
  // up to 105 MiB. With the 64 MiB of the segment kept ready: 169 MiB at least.
  const uint64_t held = WaitForSegmentBytes(daemon_->pid(), 169 * kMiB);
  EXPECT_GE(held, 169 * kMiB);
  // At most a window past the objects, and the segment kept ready's.
  EXPECT_LE(held, (102 + 64 + 64) * kMiB);  // (each object carries a little metadata)
  ExpectReads(*client_, "ten-9", 10 * kMiB);
}

TEST_F(ArenaTest, WithoutPrefaultTheArenaHoldsOnlyThePagesObjectsUsed) {
  Start({"--memory", "64MiB", "--segment-size", "16MiB", "--no-prefault"});
  ASSERT_OK(Put("a", 3 * kMiB));
  ASSERT_OK(Put("b", 2 * kMiB));
  ExpectReads(*client_, "a", 3 * kMiB);
  ExpectReads(*client_, "b", 2 * kMiB);
  const uint64_t held = SegmentBytesAllocated(daemon_->pid());
  EXPECT_GE(held, 5 * kMiB);
  // Less than a segment (pages may be huge pages, with shmem_enabled): the segment and the
  // one kept ready would be 32 MiB.
  EXPECT_LT(held, 16 * kMiB);
  // Pages a freed object used stay with the arena, for the objects that take its place.
  ASSERT_OK(client_->Delete(Id("a")));
  EXPECT_EQ(SegmentBytesAllocated(daemon_->pid()), held);
}

TEST_F(ArenaTest, AnObjectLargerThanASegmentGetsOneOfItsOwn) {
  Start();
  ASSERT_OK(Put("large", 20 * kMiB));
  ASSERT_OK(Put("small", 1000));
  ASSERT_OK_AND_ASSIGN(Client other, Client::Connect(daemon_->socket_path()));
  ExpectReads(other, "large", 20 * kMiB);
  ExpectReads(other, "small", 1000);
  ASSERT_OK_AND_ASSIGN(std::vector<ObjectInfo> list, client_->List());
  EXPECT_EQ(list.size(), 2u);
}

// A client keeps the last few views of objects' own segments it mapped, when nothing holds
// them any more (client/src/segments.h, Segments::kRecentDedicated).
constexpr int kRecentViews = 4;

TEST_F(ArenaTest, ADedicatedSegmentIsMappedWhileHeldAndAmongTheLastFewViewsAfter) {
  Start({"--memory", "128MiB", "--segment-size", "8MiB"});
  {
    ASSERT_OK_AND_ASSIGN(MutableBuffer created, client_->Create(Id("large"), 20 * kMiB));
    EXPECT_EQ(MappingsNamed("depot-object-"), 2) << "the creator maps it read-only and writable";
    std::memset(created.ptr(), 7, created.size());
    ASSERT_OK(client_->Seal(Id("large")));
  }
  EXPECT_EQ(MappingsNamed("depot-object-"), 2) << "kept among the creator's last views";
  ASSERT_OK_AND_ASSIGN(Client other, Client::Connect(daemon_->socket_path()));
  for (int round = 0; round < 3; ++round) {
    ASSERT_OK_AND_ASSIGN(Buffer a, other.Get(Id("large")));
    ASSERT_OK_AND_ASSIGN(Buffer b, other.Get(Id("large")));
    EXPECT_EQ(a.ptr(), b.ptr());
    EXPECT_EQ(MappingsNamed("depot-object-"), 3) << "one view for the reader, round " << round;
    EXPECT_EQ(a.data()[20 * kMiB - 1], std::byte{7});
  }
  // Objects of other sizes (no kept segment fits them): each client keeps its last
  // kRecentViews views only. The creator's views of "large" go; the reader's stays.
  for (int i = 0; i < kRecentViews; ++i) {
    const std::string name = "other" + std::to_string(i);
    ASSERT_OK(Put(name, (9 + i) * kMiB));
    ASSERT_OK(client_->Delete(Id(name)));
  }
  EXPECT_EQ(MappingsNamed("depot-object-"), kRecentViews + 1);
  ASSERT_OK_AND_ASSIGN(Buffer again, other.Get(Id("large")));
  EXPECT_EQ(again.data()[20 * kMiB - 1], std::byte{7});
}

TEST_F(ArenaTest, ARepeatedLargePutWritesIntoTheMemoryTheLastOneLeft) {
  Start();  // 64 MiB in segments of 8 MiB
  // Ten puts of 40 MiB, each deleted: one file, kept and written again each time.
  for (int i = 0; i < 10; ++i) {
    const std::string name = "again" + std::to_string(i);
    ASSERT_OK(Put(name, 40 * kMiB));
    ExpectReads(*client_, name, 40 * kMiB);
    EXPECT_EQ(Stats().kept_bytes, 0u) << "the kept segment was not reused, put " << i;
    ASSERT_OK(client_->Delete(Id(name)));
    const StoreStatus status = Stats();
    EXPECT_EQ(status.kept_bytes, 40 * kMiB);
    EXPECT_EQ(status.used_bytes, 0u);
    EXPECT_GE(status.largest_free_block, 56 * kMiB) << "kept memory is free";
    EXPECT_LE(SegmentBytesAllocated(daemon_->pid(), "depot-object-"), 40 * kMiB) << "put " << i;
  }
  // Objects of other sizes: a 36 MiB one reuses it (it leaves unused at most a quarter of
  // the object's size); a 12 MiB one gets a file of its own, beside it (the 8 MiB shared
  // segment, the 40 kept and 12 fit in 64); a 20 MiB one too, and the kept 40 MiB go to
  // make room for it.
  ASSERT_OK(Put("close", 36 * kMiB));
  EXPECT_EQ(Stats().kept_bytes, 0u);
  ASSERT_OK(client_->Delete(Id("close")));
  ASSERT_OK(Put("smaller", 12 * kMiB));
  EXPECT_EQ(Stats().kept_bytes, 40 * kMiB);
  ASSERT_OK(Put("half", 20 * kMiB));
  EXPECT_EQ(Stats().kept_bytes, 0u);
  ExpectReads(*client_, "smaller", 12 * kMiB);
  ExpectReads(*client_, "half", 20 * kMiB);
  EXPECT_EQ(Stats().evictions, 0u);
}

TEST_F(ArenaTest, KeptMemoryIsGivenBackBeforeAnyEviction) {
  Start();  // 64 MiB in segments of 8 MiB
  ASSERT_OK(Put("large", 48 * kMiB));
  ASSERT_OK(client_->Delete(Id("large")));
  ASSERT_EQ(Stats().kept_bytes, 48 * kMiB);
  // Small objects fill every shared segment the capacity allows: the kept memory goes
  // first, and nothing is evicted while it can.
  for (int i = 0; i < 8; ++i) ASSERT_OK(Put("small" + std::to_string(i), 7 * kMiB));
  StoreStatus status = Stats();
  EXPECT_EQ(status.evictions, 0u);
  EXPECT_EQ(status.kept_bytes, 0u);
  for (int i = 0; i < 8; ++i) ExpectReads(*client_, "small" + std::to_string(i), 7 * kMiB);
  // The arena never held more than its capacity, kept memory included.
  EXPECT_LE(SegmentBytesAllocated(daemon_->pid()) +
                SegmentBytesAllocated(daemon_->pid(), "depot-object-"),
            64 * kMiB);
}

TEST_F(ArenaTest, ADaemonWithKeptMemoryAcceptsAnyObjectThatFits) {
  Start();  // 64 MiB in segments of 8 MiB
  // One shared segment in use, and one added ahead of demand: 56 MiB left for one object.
  ASSERT_OK(Put("small", kMiB));
  for (const uint64_t mib : {20, 24}) {
    ASSERT_OK(Put("kept" + std::to_string(mib), mib * kMiB));
    ASSERT_OK(client_->Delete(Id("kept" + std::to_string(mib))));
  }
  ASSERT_EQ(Stats().kept_bytes, 44 * kMiB);
  // The largest object that fits beside "small": neither kept segment holds it, both go.
  ASSERT_OK(Put("largest", 56 * kMiB));
  ExpectReads(*client_, "largest", 56 * kMiB);
  ExpectReads(*client_, "small", kMiB);
  const StoreStatus status = Stats();
  EXPECT_EQ(status.kept_bytes, 0u);
  EXPECT_EQ(status.evictions, 0u);
}

TEST_F(ArenaTest, WithoutKeepLargeAnObjectsMemoryGoesWithIt) {
  Start({"--memory", "64MiB", "--segment-size", "8MiB", "--no-keep-large"});
  ASSERT_OK(Put("large", 40 * kMiB));
  EXPECT_GE(SegmentBytesAllocated(daemon_->pid(), "depot-object-"), 40 * kMiB);
  ASSERT_OK(client_->Delete(Id("large")));
  EXPECT_EQ(Stats().kept_bytes, 0u);
  // Given back on a worker, at once.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (SegmentBytesAllocated(daemon_->pid(), "depot-object-") != 0 &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(SegmentBytesAllocated(daemon_->pid(), "depot-object-"), 0u);
}

// Minor page faults this process has taken so far.
uint64_t MinorFaults() {
  struct rusage usage {};
  ::getrusage(RUSAGE_SELF, &usage);
  return static_cast<uint64_t>(usage.ru_minflt);
}

TEST_F(ArenaTest, APopulatedBufferReadsItsBytesWithoutPageFaults) {
  Start();
  ASSERT_OK(Put("large", 20 * kMiB));
  ASSERT_OK(Put("shared", 4 * kMiB));
  ASSERT_OK_AND_ASSIGN(Client reader, Client::Connect(daemon_->socket_path()));
  for (const auto& [name, bytes] : {std::pair{"large", 20 * kMiB}, std::pair{"shared", 4 * kMiB}}) {
    ASSERT_OK_AND_ASSIGN(Buffer buffer, reader.Get(Id(name)));
    buffer.Populate();
    const uint64_t before = MinorFaults();
    const uint64_t hash = Xxh3(buffer.data());
    const uint64_t faults = MinorFaults() - before;
    EXPECT_EQ(hash, Xxh3(SeededBytes(bytes, Xxh3(AsBytes(name))))) << name;
    // Without Populate: one fault per 4 KiB page (5,120 for 20 MiB), or per huge page.
    EXPECT_LT(faults, 16u) << name << ": the read faulted its pages in after all";
    ASSERT_OK_AND_ASSIGN(PrivateBuffer copy, buffer.PrivateCopy());
    copy.Populate();
    EXPECT_EQ(Xxh3(copy.data()), hash) << name;
  }
  Buffer().Populate();  // an empty Buffer: nothing to do
}

TEST_F(ArenaTest, ADedicatedSegmentGivesItsCapacityBackWhenItsObjectGoes) {
  Start();
  // 40 MiB of a 64 MiB arena each time: without the capacity back, the second would fail.
  for (int i = 0; i < 5; ++i) {
    const std::string name = "large" + std::to_string(i);
    ASSERT_OK(Put(name, 40 * kMiB));
    ExpectReads(*client_, name, 40 * kMiB);
    ASSERT_OK(client_->Delete(Id(name)));
  }
  EXPECT_EQ(Stats().used_bytes, 0u);
  EXPECT_EQ(Stats().evictions, 0u);
}

TEST_F(ArenaTest, EmptySharedSegmentsAreRetiredForALargeObjectAndRevivedAfter) {
  Start({"--memory", "32MiB", "--segment-size", "8MiB"});
  // The arena grows to all four segments, then they are emptied.
  for (int i = 0; i < 4; ++i) ASSERT_OK(Put("fill" + std::to_string(i), 6 * kMiB));
  for (int i = 0; i < 4; ++i) ASSERT_OK(client_->Delete(Id("fill" + std::to_string(i))));
  EXPECT_EQ(Stats().mapped_bytes, 32 * kMiB);
  ASSERT_OK(Put("large", 24 * kMiB));
  EXPECT_EQ(Stats().evictions, 0u) << "empty segments were enough";
  ASSERT_OK(Put("small", 4 * kMiB));  // in the one shared segment left
  ExpectReads(*client_, "large", 24 * kMiB);
  ASSERT_OK(client_->Delete(Id("large")));
  // Shared segments come back as objects need them, at their old places.
  for (int i = 0; i < 3; ++i) ASSERT_OK(Put("again" + std::to_string(i), 6 * kMiB));
  ASSERT_OK_AND_ASSIGN(Client other, Client::Connect(daemon_->socket_path()));
  for (int i = 0; i < 3; ++i) ExpectReads(other, "again" + std::to_string(i), 6 * kMiB);
  ExpectReads(*client_, "small", 4 * kMiB);
}

TEST_F(ArenaTest, ALargeObjectEvictsWholeSegmentsOfUnheldObjects) {
  Start({"--memory", "32MiB", "--segment-size", "8MiB"});
  for (int i = 0; i < 4; ++i) ASSERT_OK(Put("old" + std::to_string(i), 6 * kMiB));
  ASSERT_OK(Put("large", 20 * kMiB));
  ExpectReads(*client_, "large", 20 * kMiB);
  const StoreStatus status = Stats();
  EXPECT_GE(status.evictions, 3u);
  EXPECT_LE(status.mapped_bytes, 32 * kMiB);
}

TEST_F(ArenaTest, ASmallObjectMayEvictALargeOneInItsOwnSegment) {
  Start({"--memory", "32MiB", "--segment-size", "8MiB"});
  ASSERT_OK(Put("large", 24 * kMiB));  // the least recently used, in a segment of its own
  ASSERT_OK(Put("a", 4 * kMiB));       // the one shared segment the capacity leaves
  ASSERT_OK(Put("b", 4 * kMiB));
  ASSERT_OK(Put("c", 4 * kMiB));  // evicts "large", then goes into a new shared segment
  EXPECT_FALSE(*client_->Contains(Id("large")));
  for (const char* name : {"a", "b", "c"}) ExpectReads(*client_, name, 4 * kMiB);
  EXPECT_EQ(Stats().evictions, 1u);
}

TEST_F(ArenaTest, ALargeObjectThatCannotFitEvenAfterEvictionEvictsNothing) {
  Start({"--memory", "32MiB", "--segment-size", "8MiB"});
  ASSERT_OK(Put("old", 6 * kMiB));
  ASSERT_OK_AND_ASSIGN(MutableBuffer held, client_->Create(Id("held"), 7 * kMiB));
  ASSERT_OK(Put("other", 6 * kMiB));
  // 32 MiB less the segment "held" is in leaves 24 MiB at most.
  EXPECT_EQ(Put("large", 25 * kMiB).code(), StatusCode::kOutOfMemory);
  EXPECT_EQ(Stats().evictions, 0u) << "evicted for a create that failed anyway";
  ExpectReads(*client_, "old", 6 * kMiB);
  ASSERT_OK(client_->Abort(Id("held")));
}

TEST_F(ArenaTest, ALargeObjectThatHeldObjectsLeaveNoRoomForIsOutOfMemory) {
  Start({"--memory", "32MiB", "--segment-size", "8MiB"});
  std::vector<Buffer> held;
  for (int i = 0; i < 3; ++i) {
    ASSERT_OK(Put("held" + std::to_string(i), 6 * kMiB));
    ASSERT_OK_AND_ASSIGN(Buffer b, client_->Get(Id("held" + std::to_string(i))));
    held.push_back(std::move(b));
  }
  Status put = Put("large", 20 * kMiB);
  EXPECT_EQ(put.code(), StatusCode::kOutOfMemory) << put.ToString();
  EXPECT_NE(put.message().find("cannot fit"), std::string::npos) << put.ToString();
  for (int i = 0; i < 3; ++i) ExpectReads(*client_, "held" + std::to_string(i), 6 * kMiB);
  held.clear();
  ASSERT_OK(Put("large", 20 * kMiB));  // fits once they are released
}

// A number from /proc/meminfo ("HugePages_Free:", "Hugepagesize:" in kB); 0 if absent.
uint64_t MemInfo(const std::string& key) {
  std::ifstream meminfo("/proc/meminfo");
  for (std::string name; meminfo >> name;) {
    uint64_t value = 0;
    meminfo >> value;
    if (name == key) return value;
    meminfo.ignore(256, '\n');
  }
  return 0;
}

uint64_t HugePageBytes() { return MemInfo("Hugepagesize:") * 1024; }
uint64_t FreeHugePageBytes() { return MemInfo("HugePages_Free:") * HugePageBytes(); }

// The page sizes (KernelPageSize, in bytes) of this process's mappings whose path contains
// `name`, from /proc/self/smaps.
std::set<uint64_t> PageSizesOfMappings(const std::string& name) {
  std::ifstream smaps("/proc/self/smaps");
  std::set<uint64_t> sizes;
  bool in = false;
  for (std::string line; std::getline(smaps, line);) {
    if (!line.empty() && std::isxdigit(static_cast<unsigned char>(line[0])) &&
        line.find('-') < line.find(' ')) {
      in = line.find(name) != std::string::npos;
    } else if (in && line.starts_with("KernelPageSize:")) {
      sizes.insert(std::stoull(line.substr(15)) * 1024);
    }
  }
  return sizes;
}

// What a daemon with 2 MiB pages must do: hold small and large objects, serve them to
// another client, private copies and populated reads of them, and a large object's segment
// kept and reused.
void ExpectObjectsOfAllKindsWork(Client& writer, const std::string& socket) {
  const auto put = [&](const std::string& name, uint64_t bytes) {
    return writer.Put(Id(name), SeededBytes(bytes, Xxh3(AsBytes(name))));
  };
  ASSERT_OK(put("small", 5000));
  ASSERT_OK(put("large", 20 * kMiB));
  ASSERT_OK_AND_ASSIGN(Client reader, Client::Connect(socket));
  for (const auto& [name, bytes] :
       {std::pair{"small", uint64_t{5000}}, std::pair{"large", 20 * kMiB}}) {
    ASSERT_OK_AND_ASSIGN(Buffer buffer, reader.Get(Id(name)));
    buffer.Populate();
    EXPECT_EQ(Xxh3(buffer.data()), Xxh3(SeededBytes(bytes, Xxh3(AsBytes(name))))) << name;
    ASSERT_OK_AND_ASSIGN(PrivateBuffer copy, buffer.PrivateCopy());
    copy.data()[0] = std::byte{1};
    EXPECT_EQ(Xxh3(buffer.data()), Xxh3(SeededBytes(bytes, Xxh3(AsBytes(name))))) << name;
  }
  ASSERT_OK(writer.Delete(Id("large")));
  ASSERT_OK(put("again", 20 * kMiB));
  ASSERT_OK_AND_ASSIGN(Buffer again, reader.Get(Id("again")));
  EXPECT_EQ(Xxh3(again.data()), Xxh3(SeededBytes(20 * kMiB, Xxh3(AsBytes("again")))));
}

TEST_F(ArenaTest, HugePagesAskedForWithoutEnoughReservedGiveSmallPagesAndSaySoWhy) {
  if (FreeHugePageBytes() >= 64 * kMiB) {
    GTEST_SKIP() << "this host has " << FreeHugePageBytes() / kMiB
                 << " MiB of huge pages free: a daemon of 64 MiB gets them (the next test)";
  }
  ASSERT_NO_FATAL_FAILURE(Start({"--memory", "64MiB", "--segment-size", "8MiB", "--huge-pages"}));
  const StoreStatus status = Stats();
  EXPECT_EQ(status.arena_page_bytes, 4096u);
  EXPECT_NE(status.arena_pages.find("4 KiB pages"), std::string::npos) << status.arena_pages;
  EXPECT_NE(status.arena_pages.find("vm.nr_hugepages"), std::string::npos) << status.arena_pages;
  ExpectObjectsOfAllKindsWork(*client_, daemon_->socket_path());
}

TEST_F(ArenaTest, ADaemonWithoutHugePagesSaysItsPagesAre4KiB) {
  Start();
  EXPECT_EQ(Stats().arena_page_bytes, 4096u);
  EXPECT_EQ(Stats().arena_pages.rfind("4 KiB pages", 0), 0u) << Stats().arena_pages;
}

TEST_F(ArenaTest, ReservedHugePagesMakeTheArena) {
  if (FreeHugePageBytes() < 64 * kMiB) {
    GTEST_SKIP() << "needs 64 MiB of reserved huge pages free (vm.nr_hugepages); this host has "
                 << FreeHugePageBytes() / kMiB << " MiB";
  }
  ASSERT_NO_FATAL_FAILURE(Start({"--memory", "64MiB", "--segment-size", "8MiB", "--huge-pages"}));
  const StoreStatus status = Stats();
  EXPECT_EQ(status.arena_page_bytes, HugePageBytes());
  EXPECT_NE(status.arena_pages.find("hugetlb"), std::string::npos) << status.arena_pages;
  ExpectObjectsOfAllKindsWork(*client_, daemon_->socket_path());
  // This process maps the arena in huge pages: one entry per 2 MiB.
  EXPECT_EQ(PageSizesOfMappings("depot-segment-"), std::set<uint64_t>{HugePageBytes()});
  EXPECT_EQ(PageSizesOfMappings("depot-object-"), std::set<uint64_t>{HugePageBytes()});
}

TEST_F(ArenaTest, AHugetlbfsArenaDirGivesHugePages) {
  if (::geteuid() != 0 || FreeHugePageBytes() < 64 * kMiB) {
    GTEST_SKIP() << "mounting hugetlbfs needs root and 64 MiB of reserved huge pages free "
                    "(vm.nr_hugepages); this host has "
                 << FreeHugePageBytes() / kMiB << " MiB" << (::geteuid() != 0 ? ", not root" : "");
  }
  TempDir dir;
  if (::mount("none", dir.path().c_str(), "hugetlbfs", 0, nullptr) != 0) {
    GTEST_SKIP() << "cannot mount hugetlbfs here: " << std::strerror(errno);
  }
  struct Unmount {
    std::string path;
    ~Unmount() { ::umount2(path.c_str(), MNT_DETACH); }  // even with files still open
  } unmount{dir.path()};
  {
    ASSERT_NO_FATAL_FAILURE(
        Start({"--memory", "64MiB", "--segment-size", "8MiB", "--arena-dir", dir.path()}));
    const StoreStatus status = Stats();
    EXPECT_EQ(status.arena_page_bytes, HugePageBytes());
    EXPECT_NE(status.arena_pages.find("hugetlbfs"), std::string::npos) << status.arena_pages;
    ExpectObjectsOfAllKindsWork(*client_, daemon_->socket_path());
    ExpectObjectsOnHostMatchTheList(*client_);
  }
  client_.reset();
  daemon_.reset();  // before the mount goes
}

TEST_F(ArenaTest, ManyLargeObjectsInOneGet) {
  Start({"--memory", "128MiB", "--segment-size", "4MiB"});
  std::vector<ObjectId> ids;
  for (int i = 0; i < 12; ++i) {
    ASSERT_OK(Put("big" + std::to_string(i), 5 * kMiB));
    ids.push_back(Id("big" + std::to_string(i)));
  }
  ASSERT_OK_AND_ASSIGN(Client other, Client::Connect(daemon_->socket_path()));
  ASSERT_OK_AND_ASSIGN(std::vector<Buffer> got, other.Get(ids));
  ASSERT_EQ(got.size(), ids.size());
  // The reader's twelve, and the writer's last views (of the last two objects, read-only
  // and writable).
  EXPECT_EQ(MappingsNamed("depot-object-"), 12 + kRecentViews);
  for (int i = 0; i < 12; ++i) {
    EXPECT_EQ(Xxh3(got[i].data()),
              Xxh3(SeededBytes(5 * kMiB, Xxh3(AsBytes("big" + std::to_string(i))))));
  }
  got.clear();
  EXPECT_EQ(MappingsNamed("depot-object-"), 2 * kRecentViews) << "each client's last views";
}

}  // namespace
}  // namespace depot::testing
