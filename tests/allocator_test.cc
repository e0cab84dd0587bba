#include "store/allocator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <iterator>
#include <map>
#include <optional>
#include <random>
#include <stdexcept>
#include <vector>

namespace depot::store {
namespace {

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = 1024 * kKiB;
constexpr uint64_t kGiB = 1024 * kMiB;

using Allocation = OffsetAllocator::Allocation;

// Allocates and insists that it worked, so a test fails at the first allocation that did not.
Allocation MustAllocate(OffsetAllocator& a, uint64_t size) {
  std::optional<Allocation> r = a.Allocate(size);
  EXPECT_TRUE(r.has_value()) << "Allocate(" << size << ") failed";
  return r.value_or(Allocation{});
}

Allocation MustAllocate(OffsetAllocator& a, uint64_t size, uint64_t alignment) {
  std::optional<Allocation> r = a.Allocate(size, alignment);
  EXPECT_TRUE(r.has_value()) << "Allocate(" << size << ", " << alignment << ") failed";
  return r.value_or(Allocation{});
}

// Release builds ignore a bad Free and return false; debug builds abort on it.
void ExpectFreeRefused(OffsetAllocator& a, uint32_t handle) {
#ifdef NDEBUG
  EXPECT_FALSE(a.Free(handle));
#else
  EXPECT_DEATH(a.Free(handle), "not a live allocation");
#endif
}

TEST(OffsetAllocatorTest, NewAllocatorIsOneFreeBlockOfFullCapacity) {
  OffsetAllocator a(1 * kMiB);
  EXPECT_EQ(a.capacity(), 1 * kMiB);
  EXPECT_EQ(a.alignment(), 64u);
  EXPECT_EQ(a.free_bytes(), 1 * kMiB);
  EXPECT_EQ(a.used_bytes(), 0u);
  EXPECT_EQ(a.largest_free_block(), 1 * kMiB);
  EXPECT_EQ(a.live_allocations(), 0u);
  EXPECT_EQ(a.CheckInvariants(), "");
}

TEST(OffsetAllocatorTest, ExactFitTakesWholeCapacity) {
  // 1000 units is not the start of its size class, so only the exact-class scan finds it.
  OffsetAllocator a(1000 * 64);
  Allocation all = MustAllocate(a, 1000 * 64);
  EXPECT_EQ(all.offset, 0u);
  EXPECT_EQ(all.size, 1000u * 64);
  EXPECT_EQ(a.free_bytes(), 0u);
  EXPECT_EQ(a.largest_free_block(), 0u);
  EXPECT_FALSE(a.Allocate(1).has_value());
  EXPECT_EQ(a.CheckInvariants(), "");
}

TEST(OffsetAllocatorTest, ExactFitFillsHoleOfSameSize) {
  OffsetAllocator a(3 * 4 * kKiB);
  Allocation first = MustAllocate(a, 4 * kKiB);
  Allocation middle = MustAllocate(a, 4 * kKiB);
  MustAllocate(a, 4 * kKiB);
  ASSERT_TRUE(a.Free(middle.handle));
  Allocation refill = MustAllocate(a, 4 * kKiB);
  EXPECT_EQ(refill.offset, first.offset + first.size);
  EXPECT_EQ(a.free_bytes(), 0u);
  EXPECT_EQ(a.CheckInvariants(), "");
}

TEST(OffsetAllocatorTest, FitsRequestFromSameSizeClassWhenNoLargerClassHasBlock) {
  // A hole of 1030 units and a request of 1025: both are in the class [1024, 1056), so the
  // constant-time search (which starts one class up) misses it and the fallback must not.
  OffsetAllocator a(2000 * 64);
  MustAllocate(a, 100 * 64);
  Allocation hole = MustAllocate(a, 1030 * 64);
  MustAllocate(a, 870 * 64);
  ASSERT_EQ(a.free_bytes(), 0u);
  ASSERT_TRUE(a.Free(hole.handle));
  Allocation fit = MustAllocate(a, 1025 * 64);
  EXPECT_EQ(fit.offset, hole.offset);
  EXPECT_EQ(a.free_bytes(), 5u * 64);
  EXPECT_EQ(a.CheckInvariants(), "");
}

TEST(OffsetAllocatorTest, EveryOffsetIsAlignedToHostAlignment) {
  OffsetAllocator a(1 * kMiB, 64);
  for (uint64_t size : {1, 7, 63, 64, 65, 100, 129, 1000, 4095, 4097}) {
    Allocation r = MustAllocate(a, size);
    EXPECT_EQ(r.offset % 64, 0u) << "size " << size;
    EXPECT_EQ(r.size % 64, 0u) << "size " << size;
  }
  EXPECT_EQ(a.CheckInvariants(), "");
}

TEST(OffsetAllocatorTest, EveryOffsetIsAlignedToGpuAlignment) {
  OffsetAllocator a(1 * kMiB, 256);
  for (uint64_t size : {1, 7, 63, 64, 65, 255, 256, 257, 1000, 4097}) {
    Allocation r = MustAllocate(a, size);
    EXPECT_EQ(r.offset % 256, 0u) << "size " << size;
    EXPECT_EQ(r.size % 256, 0u) << "size " << size;
  }
  EXPECT_EQ(a.CheckInvariants(), "");
}

TEST(OffsetAllocatorTest, RequestsRoundUpToAlignment) {
  OffsetAllocator a(1 * kMiB, 64);
  EXPECT_EQ(MustAllocate(a, 1).size, 64u);
  EXPECT_EQ(MustAllocate(a, 64).size, 64u);
  EXPECT_EQ(MustAllocate(a, 65).size, 128u);
  EXPECT_EQ(MustAllocate(a, 1000).size, 1024u);
  EXPECT_EQ(a.used_bytes(), 64u + 64 + 128 + 1024);
}

TEST(OffsetAllocatorTest, ZeroSizeRequestTakesOneAlignmentUnit) {
  OffsetAllocator a(1 * kMiB, 256);
  Allocation first = MustAllocate(a, 0);
  Allocation second = MustAllocate(a, 0);
  EXPECT_EQ(first.size, 256u);
  EXPECT_EQ(second.size, 256u);
  EXPECT_NE(first.offset, second.offset);
  EXPECT_EQ(a.used_bytes(), 512u);
}

TEST(OffsetAllocatorTest, ExhaustionReturnsNullopt) {
  OffsetAllocator a(64 * kKiB);
  for (int i = 0; i < 16; ++i) MustAllocate(a, 4 * kKiB);
  EXPECT_EQ(a.free_bytes(), 0u);
  EXPECT_FALSE(a.Allocate(1).has_value());
  EXPECT_FALSE(a.Allocate(0).has_value());
  EXPECT_EQ(a.live_allocations(), 16u);
  EXPECT_EQ(a.CheckInvariants(), "");
}

TEST(OffsetAllocatorTest, RequestLargerThanCapacityReturnsNullopt) {
  OffsetAllocator a(64 * kKiB);
  EXPECT_FALSE(a.Allocate(64 * kKiB + 1).has_value());
  EXPECT_FALSE(a.Allocate(UINT64_MAX).has_value());  // must not overflow when rounding
  EXPECT_EQ(a.free_bytes(), 64 * kKiB);
  EXPECT_EQ(a.CheckInvariants(), "");
}

TEST(OffsetAllocatorTest, FragmentedFreeSpaceDoesNotSatisfyLargerRequest) {
  OffsetAllocator a(4 * kKiB);
  std::vector<Allocation> blocks;
  for (int i = 0; i < 4; ++i) blocks.push_back(MustAllocate(a, 1 * kKiB));
  ASSERT_TRUE(a.Free(blocks[0].handle));
  ASSERT_TRUE(a.Free(blocks[2].handle));
  EXPECT_EQ(a.free_bytes(), 2 * kKiB);
  EXPECT_EQ(a.largest_free_block(), 1 * kKiB);
  EXPECT_FALSE(a.Allocate(1 * kKiB + 1).has_value());
  EXPECT_EQ(a.CheckInvariants(), "");
}

// Four 1 KiB blocks fill a 4 KiB region: A B C D.
class CoalescingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (auto& b : blocks_) b = MustAllocate(a_, 1 * kKiB);
  }
  OffsetAllocator a_{4 * kKiB};
  Allocation blocks_[4];
};

TEST_F(CoalescingTest, FreedBlockMergesWithFreeLeftNeighbour) {
  ASSERT_TRUE(a_.Free(blocks_[0].handle));
  ASSERT_TRUE(a_.Free(blocks_[1].handle));
  EXPECT_EQ(a_.largest_free_block(), 2 * kKiB);
  EXPECT_EQ(a_.CheckInvariants(), "");
  EXPECT_EQ(MustAllocate(a_, 2 * kKiB).offset, 0u);
}

TEST_F(CoalescingTest, FreedBlockMergesWithFreeRightNeighbour) {
  ASSERT_TRUE(a_.Free(blocks_[2].handle));
  ASSERT_TRUE(a_.Free(blocks_[1].handle));
  EXPECT_EQ(a_.largest_free_block(), 2 * kKiB);
  EXPECT_EQ(a_.CheckInvariants(), "");
  EXPECT_EQ(MustAllocate(a_, 2 * kKiB).offset, 1 * kKiB);
}

TEST_F(CoalescingTest, FreedBlockMergesWithBothNeighbours) {
  ASSERT_TRUE(a_.Free(blocks_[0].handle));
  ASSERT_TRUE(a_.Free(blocks_[2].handle));
  ASSERT_EQ(a_.largest_free_block(), 1 * kKiB);
  ASSERT_TRUE(a_.Free(blocks_[1].handle));
  EXPECT_EQ(a_.largest_free_block(), 3 * kKiB);
  EXPECT_EQ(a_.CheckInvariants(), "");
  EXPECT_EQ(MustAllocate(a_, 3 * kKiB).offset, 0u);
}

TEST_F(CoalescingTest, FreedBlockMergesWithFreeTailOfRegion) {
  ASSERT_TRUE(a_.Free(blocks_[3].handle));
  ASSERT_TRUE(a_.Free(blocks_[2].handle));
  EXPECT_EQ(a_.largest_free_block(), 2 * kKiB);
  EXPECT_EQ(a_.CheckInvariants(), "");
  EXPECT_EQ(MustAllocate(a_, 2 * kKiB).offset, 2 * kKiB);
}

TEST_F(CoalescingTest, FreeingEverythingLeavesOneBlockOfFullCapacity) {
  for (int i : {1, 3, 0, 2}) ASSERT_TRUE(a_.Free(blocks_[i].handle));
  EXPECT_EQ(a_.largest_free_block(), 4 * kKiB);
  EXPECT_EQ(a_.free_bytes(), 4 * kKiB);
  EXPECT_EQ(a_.live_allocations(), 0u);
  EXPECT_EQ(a_.CheckInvariants(), "");
}

TEST(OffsetAllocatorTest, FreedRegionIsReused) {
  OffsetAllocator a(1 * kMiB);
  Allocation first = MustAllocate(a, 10 * kKiB);
  MustAllocate(a, 10 * kKiB);  // keeps the freed block from merging with the tail
  ASSERT_TRUE(a.Free(first.handle));
  Allocation again = MustAllocate(a, 10 * kKiB);
  EXPECT_EQ(again.offset, first.offset);
}

TEST(OffsetAllocatorTest, SmallRequestIsCarvedFromFreedRegion) {
  OffsetAllocator a(16 * kKiB);
  Allocation big = MustAllocate(a, 8 * kKiB);
  MustAllocate(a, 8 * kKiB);
  ASSERT_TRUE(a.Free(big.handle));
  Allocation small = MustAllocate(a, 100);
  EXPECT_EQ(small.offset, big.offset);
  EXPECT_EQ(a.largest_free_block(), 8 * kKiB - 128);
  EXPECT_EQ(a.CheckInvariants(), "");
}

TEST(OffsetAllocatorTest, LargeAndSmallAllocationsInterleave) {
  OffsetAllocator a(1 * kMiB);
  std::vector<Allocation> small;
  std::vector<Allocation> large;
  while (true) {
    std::optional<Allocation> s = a.Allocate(100);
    std::optional<Allocation> l = a.Allocate(60 * kKiB);
    if (s) small.push_back(*s);
    if (l) large.push_back(*l);
    if (!s && !l) break;
  }
  // 17 pairs of 128 B + 60 KiB fit in 1 MiB; small requests then fill the 1920 B left.
  EXPECT_EQ(large.size(), 17u);
  EXPECT_EQ(small.size(), 17u + 15);
  EXPECT_EQ(a.free_bytes(), 0u);
  EXPECT_EQ(a.CheckInvariants(), "");
  // The large blocks' holes are walled in by small ones: each stays a 60 KiB block of its own,
  // and small requests are carved out of them.
  for (const Allocation& l : large) ASSERT_TRUE(a.Free(l.handle));
  EXPECT_EQ(a.largest_free_block(), 60 * kKiB);
  for (int i = 0; i < 100; ++i) MustAllocate(a, 100);
  EXPECT_EQ(a.CheckInvariants(), "");
  for (const Allocation& s : small) ASSERT_TRUE(a.Free(s.handle));
  EXPECT_EQ(a.live_allocations(), 100u);
  EXPECT_EQ(a.CheckInvariants(), "");
}

TEST(OffsetAllocatorTest, CapacityIsRoundedDownToAlignment) {
  OffsetAllocator a(1000, 64);
  EXPECT_EQ(a.capacity(), 960u);
  EXPECT_EQ(a.free_bytes(), 960u);
  Allocation all = MustAllocate(a, 960);
  EXPECT_EQ(all.offset, 0u);
  EXPECT_FALSE(a.Allocate(1).has_value());
  EXPECT_EQ(a.CheckInvariants(), "");
}

TEST(OffsetAllocatorTest, CapacityBelowAlignmentHoldsNothing) {
  OffsetAllocator a(200, 256);
  EXPECT_EQ(a.capacity(), 0u);
  EXPECT_EQ(a.largest_free_block(), 0u);
  EXPECT_FALSE(a.Allocate(0).has_value());
  ExpectFreeRefused(a, 0);
  EXPECT_EQ(a.CheckInvariants(), "");
}

TEST(OffsetAllocatorTest, RejectsAlignmentThatIsNotAPowerOfTwoOfAtLeastEight) {
  EXPECT_THROW(OffsetAllocator(1 * kMiB, 0), std::invalid_argument);
  EXPECT_THROW(OffsetAllocator(1 * kMiB, 4), std::invalid_argument);
  EXPECT_THROW(OffsetAllocator(1 * kMiB, 96), std::invalid_argument);
  EXPECT_NO_THROW(OffsetAllocator(1 * kMiB, 8));
}

TEST(OffsetAllocatorTest, DoubleFreeIsRefused) {
  OffsetAllocator a(1 * kMiB);
  Allocation first = MustAllocate(a, 1 * kKiB);
  Allocation second = MustAllocate(a, 1 * kKiB);
  ASSERT_TRUE(a.Free(first.handle));   // stays a free block of its own
  ASSERT_TRUE(a.Free(second.handle));  // merges: its node becomes spare
  ExpectFreeRefused(a, first.handle);
  ExpectFreeRefused(a, second.handle);
  EXPECT_EQ(a.free_bytes(), 1 * kMiB);
  EXPECT_EQ(a.CheckInvariants(), "");
}

TEST(OffsetAllocatorTest, FreeOfUnknownHandleIsRefused) {
  OffsetAllocator a(1 * kMiB);
  Allocation live = MustAllocate(a, 1 * kKiB);
  ExpectFreeRefused(a, 12345);
  ExpectFreeRefused(a, live.handle + 1);  // the free remainder, not an allocation
  EXPECT_EQ(a.live_allocations(), 1u);
  EXPECT_EQ(a.CheckInvariants(), "");
}

TEST(OffsetAllocatorTest, ByteCountsTrackAllocateAndFree) {
  OffsetAllocator a(1 * kMiB);
  Allocation x = MustAllocate(a, 1000);
  Allocation y = MustAllocate(a, 3000);
  EXPECT_EQ(a.used_bytes(), 1024u + 3008);
  EXPECT_EQ(a.free_bytes(), 1 * kMiB - 1024 - 3008);
  EXPECT_EQ(a.live_allocations(), 2u);
  ASSERT_TRUE(a.Free(x.handle));
  EXPECT_EQ(a.used_bytes(), 3008u);
  EXPECT_EQ(a.live_allocations(), 1u);
  ASSERT_TRUE(a.Free(y.handle));
  EXPECT_EQ(a.used_bytes(), 0u);
}

TEST(OffsetAllocatorTest, MillionSmallObjectsCostUnderFortyBytesEach) {
  constexpr uint32_t kObjects = 1'000'000;
  OffsetAllocator a(kObjects * 64ull);
  for (uint32_t i = 0; i < kObjects; ++i) {
    ASSERT_TRUE(a.Allocate(64).has_value()) << "at object " << i;
  }
  EXPECT_EQ(a.free_bytes(), 0u);
  EXPECT_LE(a.metadata_bytes(), 40ull * kObjects);
}

TEST(OffsetAllocatorTest, AlignedAllocationOffsetIsMultipleOfRequestedAlignment) {
  OffsetAllocator a(16 * kMiB, 64);
  for (uint64_t alignment : {128, 4096, 65536, 1048576}) {
    for (uint64_t size : {uint64_t{1}, uint64_t{100}, uint64_t{4096}, uint64_t{5000}, 256 * kKiB}) {
      MustAllocate(a, 100);  // leaves the free space starting off any page boundary
      Allocation r = MustAllocate(a, size, alignment);
      EXPECT_EQ(r.offset % alignment, 0u) << "size " << size << ", alignment " << alignment;
    }
  }
  EXPECT_EQ(a.CheckInvariants(), "");
}

TEST(OffsetAllocatorTest, AlignedAllocationReservesOnlyTheRoundedSize) {
  OffsetAllocator a(1 * kMiB, 64);
  MustAllocate(a, 100);
  Allocation r = MustAllocate(a, 5000, 4096);
  EXPECT_EQ(r.offset, 4096u);
  EXPECT_EQ(r.size, 5056u);
  EXPECT_EQ(a.used_bytes(), 128u + 5056);
  EXPECT_EQ(a.free_bytes(), 1 * kMiB - 128 - 5056);
  EXPECT_EQ(a.live_allocations(), 2u);
  EXPECT_EQ(a.CheckInvariants(), "");
}

TEST(OffsetAllocatorTest, FrontPaddingOfAlignedAllocationIsReusedBySmallAllocation) {
  OffsetAllocator a(1 * kMiB, 64);
  MustAllocate(a, 64);
  ASSERT_EQ(MustAllocate(a, 8 * kKiB, 4096).offset, 4096u);
  // [64, 4096) is a free block of its own, the best fit for anything up to 4032 bytes.
  EXPECT_EQ(MustAllocate(a, 3000).offset, 64u);
  EXPECT_EQ(MustAllocate(a, 1000).offset, 64u + 3008);
  EXPECT_EQ(a.CheckInvariants(), "");
}

TEST(OffsetAllocatorTest, FreedAlignedAllocationMergesWithPaddingAndTail) {
  OffsetAllocator a(1 * kMiB, 64);
  Allocation small = MustAllocate(a, 100);
  Allocation aligned = MustAllocate(a, 10000, 4096);
  ASSERT_EQ(aligned.offset, 4096u);
  ASSERT_TRUE(a.Free(aligned.handle));  // both neighbours free: front padding and tail
  EXPECT_EQ(a.largest_free_block(), 1 * kMiB - 128);
  EXPECT_EQ(a.CheckInvariants(), "");
  ASSERT_TRUE(a.Free(small.handle));
  EXPECT_EQ(a.largest_free_block(), 1 * kMiB);
  EXPECT_EQ(a.free_bytes(), 1 * kMiB);
  EXPECT_EQ(a.CheckInvariants(), "");
  EXPECT_EQ(MustAllocate(a, 1 * kMiB).offset, 0u);
}

TEST(OffsetAllocatorTest, FreeingNeighboursOfAlignedAllocationMergesThemWithItsPadding) {
  OffsetAllocator a(1 * kMiB, 64);
  Allocation small = MustAllocate(a, 100);
  Allocation aligned = MustAllocate(a, 10000, 4096);
  ASSERT_TRUE(a.Free(small.handle));  // merges with the front padding: [0, 4096) is free
  EXPECT_EQ(MustAllocate(a, 4096).offset, 0u);
  ASSERT_TRUE(a.Free(aligned.handle));
  EXPECT_EQ(a.largest_free_block(), 1 * kMiB - 4096);
  EXPECT_EQ(a.live_allocations(), 1u);
  EXPECT_EQ(a.CheckInvariants(), "");
}

TEST(OffsetAllocatorTest, AlignmentEqualToAllocatorAlignmentBehavesLikePlainAllocate) {
  OffsetAllocator plain(1 * kMiB, 256);
  OffsetAllocator aligned(1 * kMiB, 256);
  std::mt19937_64 rng(3);
  std::vector<uint32_t> live;
  for (int step = 0; step < 2000; ++step) {
    if (live.empty() || rng() % 2 == 0) {
      const uint64_t size = rng() % (64 * kKiB);
      std::optional<Allocation> p = plain.Allocate(size);
      std::optional<Allocation> q = aligned.Allocate(size, 256);
      ASSERT_EQ(p.has_value(), q.has_value()) << "step " << step;
      if (!p) continue;
      ASSERT_EQ(p->offset, q->offset) << "step " << step;
      ASSERT_EQ(p->size, q->size) << "step " << step;
      ASSERT_EQ(p->handle, q->handle) << "step " << step;
      live.push_back(p->handle);
    } else {
      const size_t i = rng() % live.size();
      ASSERT_TRUE(plain.Free(live[i]));
      ASSERT_TRUE(aligned.Free(live[i]));
      live[i] = live.back();
      live.pop_back();
    }
  }
  EXPECT_EQ(aligned.CheckInvariants(), "");
}

TEST(OffsetAllocatorTest, AlignedAllocateRefusesAlignmentNotPowerOfTwoOrBelowAllocatorAlignment) {
  OffsetAllocator a(1 * kMiB, 256);
  for (uint64_t alignment : {0, 1, 8, 128, 255, 257, 768, 4097, 3 * 4096}) {
    EXPECT_FALSE(a.Allocate(100, alignment).has_value()) << "alignment " << alignment;
  }
  EXPECT_EQ(a.free_bytes(), 1 * kMiB);
  EXPECT_EQ(a.live_allocations(), 0u);
  EXPECT_EQ(a.CheckInvariants(), "");
}

TEST(OffsetAllocatorTest, AlignedRequestTakesBlockThatHoldsItOnlyFromItsAlignedStart) {
  // The one free block, [64, 64 KiB), holds 60 KiB at 4096 and not a byte more.
  OffsetAllocator a(64 * kKiB, 64);
  MustAllocate(a, 64);
  Allocation r = MustAllocate(a, 60 * kKiB, 4096);
  EXPECT_EQ(r.offset, 4096u);
  EXPECT_EQ(a.free_bytes(), 4096u - 64);
  EXPECT_EQ(a.CheckInvariants(), "");
}

TEST(OffsetAllocatorTest, AlignedRequestFindsFittingHoleBehindOneThatDoesNotFit) {
  // Two holes in the size class of 60 KiB: [0, 60 KiB), page-aligned, and 60 KiB + 64 bytes
  // at 60 KiB + 64, which holds 60 KiB from no page boundary. The constant-time search finds
  // the second (it heads the class's list), no block holds 60 KiB plus a page, and only the
  // scan of the class finds the first.
  OffsetAllocator a(2 * 60 * kKiB + 192, 64);
  Allocation aligned_hole = MustAllocate(a, 60 * kKiB);
  MustAllocate(a, 64);
  Allocation misaligned_hole = MustAllocate(a, 60 * kKiB + 64);
  MustAllocate(a, 64);
  ASSERT_EQ(a.free_bytes(), 0u);
  ASSERT_TRUE(a.Free(aligned_hole.handle));
  ASSERT_TRUE(a.Free(misaligned_hole.handle));
  EXPECT_EQ(MustAllocate(a, 60 * kKiB, 4096).offset, 0u);
  EXPECT_EQ(a.CheckInvariants(), "");
}

TEST(OffsetAllocatorTest, AlignedRequestReusesPageAlignedHoleOfItsSize) {
  // The hole is smaller than size + alignment, yet taken before the larger free tail is split.
  OffsetAllocator a(4 * kMiB, 64);
  MustAllocate(a, 4096);
  Allocation first = MustAllocate(a, 256 * kKiB, 4096);
  MustAllocate(a, 100);  // walls the hole off from the free tail
  ASSERT_TRUE(a.Free(first.handle));
  EXPECT_EQ(MustAllocate(a, 256 * kKiB, 4096).offset, first.offset);
  EXPECT_EQ(a.CheckInvariants(), "");
}

// Objects of one size off a class boundary (an array's chunks, each with its header): a hole
// one left is filled by the next, not passed over for the untouched free tail (TLSF alone
// searches from the class above the request's). Else a store whose live objects never exceed
// a few chunks touches the pages of its whole segment.
TEST(OffsetAllocatorTest, AHoleLeftByAnObjectIsFilledByTheNextOfItsSizeBeforeTheFreeTail) {
  constexpr uint64_t kChunk = 128 * kMiB + 4096;
  OffsetAllocator a(kGiB, 64);
  Allocation first = MustAllocate(a, kChunk, 4096);
  MustAllocate(a, kChunk, 4096);  // walls the hole off from the free tail
  ASSERT_TRUE(a.Free(first.handle));
  for (int i = 0; i < 4; ++i) {
    Allocation again = MustAllocate(a, kChunk, 4096);
    EXPECT_EQ(again.offset, first.offset) << "round " << i;
    ASSERT_TRUE(a.Free(again.handle));
  }
  // The same with the allocator's own alignment.
  OffsetAllocator b(2000 * 64);
  Allocation hole = MustAllocate(b, 1030 * 64);
  MustAllocate(b, 10 * 64);
  ASSERT_TRUE(b.Free(hole.handle));
  EXPECT_EQ(MustAllocate(b, 1030 * 64).offset, hole.offset);
  EXPECT_EQ(a.CheckInvariants(), "");
  EXPECT_EQ(b.CheckInvariants(), "");
}

TEST(OffsetAllocatorTest, AlignedRequestIsRefusedWhenNoBlockHoldsItAtAnAlignedOffset) {
  // 60 KiB + 64 fits the free block's size, not what is left of it from 4096 on.
  OffsetAllocator a(64 * kKiB, 64);
  MustAllocate(a, 64);
  EXPECT_FALSE(a.Allocate(60 * kKiB + 64, 4096).has_value());
  EXPECT_TRUE(a.Allocate(60 * kKiB + 64).has_value());
  EXPECT_EQ(a.CheckInvariants(), "");
}

TEST(OffsetAllocatorTest, AlignmentBeyondCapacityLeavesOnlyOffsetZero) {
  OffsetAllocator a(1 * kMiB, 64);
  EXPECT_EQ(MustAllocate(a, 100, uint64_t{1} << 63).offset, 0u);
  EXPECT_FALSE(a.Allocate(100, uint64_t{1} << 63).has_value());
  EXPECT_FALSE(a.Allocate(UINT64_MAX, 4096).has_value());  // must not overflow when rounding
  EXPECT_EQ(a.used_bytes(), 128u);
  EXPECT_EQ(a.CheckInvariants(), "");
}

// Drives the allocator with a seeded random mix of Allocate and Free and checks every step
// against a model of the live ranges: results aligned, inside the region and disjoint;
// counters exact; a failed Allocate only when no gap between live ranges fits the request.
struct Workload {
  uint64_t capacity;
  uint64_t alignment;
  int steps;
  uint64_t seed;
  int small_percent;  // share of requests drawn from 1 byte..8 KiB instead of the full range
  // Share of requests made with Allocate(size, aligned_to); half of those are for a multiple
  // of aligned_to, as large objects mostly are.
  int aligned_percent = 0;
  uint64_t aligned_to = 4096;
};

void RunAgainstReferenceModel(const Workload& w) {
  const uint64_t capacity = w.capacity;
  const uint64_t alignment = w.alignment;
  OffsetAllocator a(capacity, alignment);
  std::mt19937_64 rng(w.seed);
  std::map<uint64_t, uint64_t> model;  // offset -> size of each live allocation
  std::vector<Allocation> live;
  uint64_t used = 0;
  const auto largest_gap = [&] {
    uint64_t gap = 0;
    uint64_t end = 0;
    for (const auto& [offset, size] : model) {
      gap = std::max(gap, offset - end);
      end = offset + size;
    }
    return std::max(gap, a.capacity() - end);
  };
  // Whether some gap holds bytes from a multiple of align on.
  const auto gap_holds = [&](uint64_t bytes, uint64_t align) {
    uint64_t end = 0;
    const auto holds = [&](uint64_t from, uint64_t to) {
      const uint64_t start = (from + align - 1) / align * align;
      return start <= to && to - start >= bytes;
    };
    for (const auto& [offset, size] : model) {
      if (holds(end, offset)) return true;
      end = offset + size;
    }
    return holds(end, a.capacity());
  };
  // Log-uniform sizes from 1 byte to capacity / 8 (as many tiny requests as huge ones), or
  // to 8 KiB for the small share. Raw engine bits (not std:: distributions) keep the sequence
  // the same with every standard library.
  const int max_log2 = std::bit_width(capacity / 8) - 1;
  const auto random_size = [&] {
    const int top = static_cast<int>(rng() % 100) < w.small_percent ? 12 : max_log2;
    const int log2 = static_cast<int>(rng() % (top + 1));
    return (uint64_t{1} << log2) + rng() % (uint64_t{1} << log2);
  };

  for (int step = 0; step < w.steps; ++step) {
    if (live.empty() || rng() % 100 < 55) {
      uint64_t size = random_size();
      // Drawn only when asked for, so that the other workloads keep their sequences.
      const bool aligned =
          w.aligned_percent > 0 && static_cast<int>(rng() % 100) < w.aligned_percent;
      if (aligned && rng() % 2 == 0) size = (size + w.aligned_to - 1) / w.aligned_to * w.aligned_to;
      const uint64_t align = aligned ? w.aligned_to : alignment;
      const uint64_t rounded = std::max((size + alignment - 1) / alignment * alignment, alignment);
      std::optional<Allocation> r = aligned ? a.Allocate(size, align) : a.Allocate(size);
      if (!r) {
        ASSERT_FALSE(gap_holds(rounded, align))
            << "step " << step << ": refused a request that fits";
      } else {
        ASSERT_EQ(r->size, rounded) << "step " << step;
        ASSERT_EQ(r->offset % align, 0u) << "step " << step;
        ASSERT_LE(r->offset + r->size, a.capacity()) << "step " << step;
        auto next = model.lower_bound(r->offset);
        ASSERT_TRUE(next == model.end() || r->offset + r->size <= next->first)
            << "step " << step << ": overlaps the following allocation";
        ASSERT_TRUE(next == model.begin() ||
                    std::prev(next)->first + std::prev(next)->second <= r->offset)
            << "step " << step << ": overlaps the preceding allocation";
        model.emplace(r->offset, r->size);
        live.push_back(*r);
        used += r->size;
      }
    } else {
      const size_t i = rng() % live.size();
      ASSERT_TRUE(a.Free(live[i].handle)) << "step " << step;
      model.erase(live[i].offset);
      used -= live[i].size;
      live[i] = live.back();
      live.pop_back();
    }
    ASSERT_EQ(a.used_bytes(), used) << "step " << step;
    ASSERT_EQ(a.free_bytes(), a.capacity() - used) << "step " << step;
    ASSERT_EQ(a.live_allocations(), live.size()) << "step " << step;
    if (step % 2000 == 0) {
      ASSERT_EQ(a.CheckInvariants(), "") << "step " << step;
      ASSERT_EQ(a.largest_free_block(), largest_gap()) << "step " << step;
    }
  }
  ASSERT_EQ(a.CheckInvariants(), "");

  // Free what is left in a random order (Fisher-Yates on raw bits, for the same reason).
  for (size_t i = live.size(); i > 1; --i) std::swap(live[i - 1], live[rng() % i]);
  for (const Allocation& r : live) ASSERT_TRUE(a.Free(r.handle));
  EXPECT_EQ(a.live_allocations(), 0u);
  EXPECT_EQ(a.free_bytes(), a.capacity());
  EXPECT_EQ(a.largest_free_block(), a.capacity());
  EXPECT_EQ(a.CheckInvariants(), "");
  EXPECT_EQ(MustAllocate(a, a.capacity()).offset, 0u);
}

// About 700 live allocations on average, 78% of the region in use, one Allocate in six refused.
TEST(OffsetAllocatorTest, RandomizedRunMatchesReferenceModel) {
  RunAgainstReferenceModel(
      {.capacity = 64 * kMiB, .alignment = 64, .steps = 200'000, .seed = 42, .small_percent = 0});
}

// Mostly small objects: about 10,000 live allocations (90% of the region) around large ones.
TEST(OffsetAllocatorTest, RandomizedRunOfMostlySmallObjectsWithGpuAlignmentMatchesReferenceModel) {
  RunAgainstReferenceModel({.capacity = 48 * kMiB + 12345,
                            .alignment = 256,
                            .steps = 200'000,
                            .seed = 7,
                            .small_percent = 90});
}

// Page-aligned and plain requests interleaved, so front paddings are cut, reused and merged
// back all the time.
TEST(OffsetAllocatorTest, RandomizedRunMixingPageAlignedAndPlainRequestsMatchesReferenceModel) {
  RunAgainstReferenceModel({.capacity = 64 * kMiB,
                            .alignment = 64,
                            .steps = 100'000,
                            .seed = 4096,
                            .small_percent = 50,
                            .aligned_percent = 50,
                            .aligned_to = 4096});
}

// Alignment far above the allocator's: paddings are large, and the free blocks that hold a
// request only from an aligned start (found by the fallback scan) are common.
TEST(OffsetAllocatorTest, RandomizedRunWithLargeAlignmentAndGpuAlignmentMatchesReferenceModel) {
  RunAgainstReferenceModel({.capacity = 48 * kMiB + 12345,
                            .alignment = 256,
                            .steps = 50'000,
                            .seed = 11,
                            .small_percent = 80,
                            .aligned_percent = 30,
                            .aligned_to = 64 * kKiB});
}

}  // namespace
}  // namespace depot::store
