// The arena's classes of writers (store/arena.h, Writers): each shared segment holds the
// objects of one class, so that the read-write descriptor a creator gets reaches no other
// class's objects; an empty segment changes class only with a new file.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <optional>
#include <set>
#include <vector>

#include "store/arena.h"
#include "store_parts.h"

namespace depot::store {
namespace {

using testing::Tiers;

constexpr uint64_t kMiB = Tiers::kMiB;
constexpr uint32_t kAlice = 4001;
constexpr uint32_t kBob = 4002;

class ArenaWritersTest : public ::testing::Test {
 protected:
  // 16 MiB in four segments of 4 MiB.
  Tiers tiers_{16 * kMiB, 4 * kMiB};
  Arena& arena_ = *tiers_.arena;
};

TEST_F(ArenaWritersTest, EachClassGetsSegmentsOfItsOwn) {
  std::set<uint32_t> segments[3];
  const uint32_t classes[3] = {Arena::kTrustedWriters, kAlice, kBob};
  for (int round = 0; round < 4; ++round) {
    for (int c = 0; c < 3; ++c) {
      auto block = arena_.Allocate(64 * 1024, classes[c]);
      ASSERT_TRUE(block.has_value()) << "class " << classes[c] << ", round " << round;
      EXPECT_EQ(arena_.writers(block->region), classes[c]);
      segments[c].insert(block->region);
    }
  }
  for (int c = 0; c < 3; ++c) {
    EXPECT_EQ(segments[c].size(), 1u) << "a class's small objects share its one segment";
    for (int other = c + 1; other < 3; ++other) {
      EXPECT_NE(*segments[c].begin(), *segments[other].begin());
    }
  }
}

TEST_F(ArenaWritersTest, AClassFullOfItsOwnTakesAnotherSegmentNotAnotherClasses) {
  auto alice = arena_.Allocate(kMiB, kAlice);
  ASSERT_TRUE(alice.has_value());
  // Bob fills the rest: three segments, none of them Alice's, which has room left.
  std::vector<Arena::Block> bobs;
  while (auto block = arena_.Allocate(kMiB, kBob)) bobs.push_back(*block);
  EXPECT_EQ(bobs.size(), 12u);
  for (const auto& b : bobs) EXPECT_NE(b.region, alice->region);
  // Alice still has her segment's room.
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(arena_.Allocate(kMiB, kAlice).has_value());
  EXPECT_FALSE(arena_.Allocate(kMiB, kAlice).has_value());
}

TEST_F(ArenaWritersTest, AnEmptySegmentChangesClassOnlyWithANewFile) {
  // Alice holds segment 0 and keeps a writable mapping of its file, as her client would.
  auto alice = arena_.Allocate(4 * kMiB, kAlice);
  ASSERT_TRUE(alice.has_value());
  const uint32_t segment = alice->region;
  auto* hers = static_cast<std::byte*>(
      ::mmap(nullptr, 4 * kMiB, PROT_READ | PROT_WRITE, MAP_SHARED, arena_.fd(segment), 0));
  ASSERT_NE(hers, MAP_FAILED);
  std::memset(hers, 0x11, 4 * kMiB);
  struct stat old_file {};
  ASSERT_EQ(::fstat(arena_.fd(segment), &old_file), 0);
  std::byte* const base = arena_.base(segment);
  // Everyone else fills the other three segments, then Alice's object goes.
  std::vector<Arena::Block> trusted;
  while (auto block = arena_.Allocate(4 * kMiB, Arena::kTrustedWriters)) trusted.push_back(*block);
  EXPECT_EQ(trusted.size(), 3u);
  arena_.Free(alice->region, alice->handle);
  EXPECT_EQ(arena_.writers(segment), kAlice) << "an empty segment keeps its class";
  EXPECT_EQ(arena_.generation(segment), 0u);

  // The trusted class needs room: the empty segment is its now, with a new file, at the same
  // address in the daemon.
  tiers_.WaitPrepared();
  auto mine = arena_.Allocate(kMiB, Arena::kTrustedWriters);
  ASSERT_TRUE(mine.has_value());
  EXPECT_EQ(mine->region, segment);
  EXPECT_EQ(arena_.writers(segment), Arena::kTrustedWriters);
  EXPECT_EQ(arena_.generation(segment), 1u);
  EXPECT_EQ(arena_.base(segment), base);
  struct stat new_file {};
  ASSERT_EQ(::fstat(arena_.fd(segment), &new_file), 0);
  EXPECT_NE(new_file.st_ino, old_file.st_ino);
  // The old file's pages were given back, by the worker (before it prepared the new file):
  // Alice's mapping reads zeros.
  tiers_.WaitPrepared();
  for (uint64_t i = 0; i < 4 * kMiB; i += 4096) ASSERT_EQ(hers[i], std::byte{0}) << i;

  // Alice scribbles over all of her old mapping: the new file does not change.
  std::byte* const object = base + mine->offset;
  std::memset(object, 0x5a, kMiB);
  std::memset(hers, 0xee, 4 * kMiB);
  for (uint64_t i = 0; i < kMiB; i += 4096) ASSERT_EQ(object[i], std::byte{0x5a}) << i;
  ASSERT_EQ(::munmap(hers, 4 * kMiB), 0);
}

TEST_F(ArenaWritersTest, ASegmentWithObjectsNeverChangesClass) {
  std::vector<Arena::Block> alices;
  while (auto block = arena_.Allocate(4 * kMiB, kAlice)) alices.push_back(*block);
  ASSERT_EQ(alices.size(), 4u);
  EXPECT_FALSE(arena_.Allocate(64, kBob).has_value()) << "no segment is empty";
  for (const auto& a : alices) {
    EXPECT_FALSE(arena_.AllocateIn(a.region, 64, kBob).has_value());
    EXPECT_EQ(arena_.generation(a.region), 0u);
  }
  // One goes: Bob may have that segment, and only that one.
  arena_.Free(alices[2].region, alices[2].handle);
  tiers_.WaitPrepared();
  auto bob = arena_.Allocate(64, kBob);
  ASSERT_TRUE(bob.has_value());
  EXPECT_EQ(bob->region, alices[2].region);
  EXPECT_EQ(arena_.generation(bob->region), 1u);
}

TEST_F(ArenaWritersTest, ASegmentStillPreparedOrTooSmallIsNotGivenAway) {
  // 10 MiB: two segments of 4 MiB and a last one of 2.
  Tiers small{10 * kMiB, 4 * kMiB};
  Arena& arena = *small.arena;
  std::vector<Arena::Block> alices;
  while (auto block = arena.Allocate(2 * kMiB, kAlice)) alices.push_back(*block);
  ASSERT_EQ(alices.size(), 5u);
  small.WaitPrepared();
  // The 2 MiB segment, emptied, cannot hold 3 MiB: it stays Alice's.
  const Arena::Block& last = alices.back();
  ASSERT_EQ(arena.segment_bytes(last.region), 2 * kMiB);
  arena.Free(last.region, last.handle);
  EXPECT_FALSE(arena.Allocate(3 * kMiB, kBob).has_value());
  EXPECT_EQ(arena.writers(last.region), kAlice);
  EXPECT_EQ(arena.generation(last.region), 0u);
  // It holds 1 MiB for Bob, and is his.
  auto bob = arena.Allocate(kMiB, kBob);
  ASSERT_TRUE(bob.has_value());
  EXPECT_EQ(bob->region, last.region);
  EXPECT_EQ(arena.generation(last.region), 1u);
  // Emptied again at once, while a worker prepares its new file: not Alice's again yet.
  arena.Free(bob->region, bob->handle);
  if (arena.preparing(last.region)) {
    EXPECT_FALSE(arena.AllocateIn(last.region, kMiB, kAlice).has_value());
  }
  small.WaitPrepared();
  EXPECT_TRUE(arena.AllocateIn(last.region, kMiB, kAlice).has_value());
  EXPECT_EQ(arena.generation(last.region), 2u);
}

TEST_F(ArenaWritersTest, ADedicatedSegmentIsItsObjectsClass) {
  auto big = arena_.Allocate(5 * kMiB, kBob);
  ASSERT_TRUE(big.has_value());
  ASSERT_TRUE(Arena::IsDedicated(big->region));
  EXPECT_EQ(arena_.writers(big->region), kBob);
  arena_.Free(big->region, big->handle);
}

TEST_F(ArenaWritersTest, AKeptSegmentIsReusedForItsOwnClassOnly) {
  // Bob's large object goes; its segment is kept, with its file and index.
  auto first = arena_.Allocate(5 * kMiB, kBob);
  ASSERT_TRUE(first.has_value());
  arena_.Free(first->region, first->handle);
  ASSERT_EQ(arena_.kept_bytes(), 5 * kMiB);
  // Alice's object of the same size gets a file of its own: Bob's read-write descriptor of
  // the kept file must reach nothing of hers.
  auto alices = arena_.Allocate(5 * kMiB, kAlice);
  ASSERT_TRUE(alices.has_value());
  EXPECT_NE(alices->region, first->region);
  EXPECT_EQ(arena_.writers(alices->region), kAlice);
  EXPECT_EQ(arena_.kept_bytes(), 5 * kMiB) << "it fit beside the kept segment";
  // Bob's next one reuses it.
  auto second = arena_.Allocate(5 * kMiB, kBob);
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(second->region, first->region);
  EXPECT_EQ(arena_.writers(second->region), kBob);
  EXPECT_EQ(arena_.kept_bytes(), 0u);
  arena_.Free(second->region, second->handle);
  arena_.Free(alices->region, alices->handle);
  EXPECT_EQ(arena_.kept_bytes(), 10 * kMiB);
  EXPECT_EQ(arena_.used_bytes(), 0u);
}

TEST(ArenaWritersClass, RootAndTheDaemonsUidAreTrusted) {
  EXPECT_EQ(Arena::WritersOf(0), Arena::kTrustedWriters);
  EXPECT_EQ(Arena::WritersOf(::geteuid()), Arena::kTrustedWriters);
  if (::geteuid() != kAlice) {
    EXPECT_EQ(Arena::WritersOf(kAlice), kAlice);
  }
}

}  // namespace
}  // namespace depot::store
