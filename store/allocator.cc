#include "store/allocator.h"

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>

namespace depot::store {
namespace {

// A bad handle is a bug in the caller. Debug builds stop right there, where the bug is
// visible; release builds must not take the daemon (and every client's data) down for it.
bool RefuseBadHandle([[maybe_unused]] uint32_t handle) {
#ifndef NDEBUG
  std::fprintf(stderr, "depot: OffsetAllocator::Free: handle %u is not a live allocation\n",
               handle);
  std::abort();
#else
  return false;
#endif
}

// Bytes from offset up to the next multiple of alignment, a power of two (0 if it is one).
uint64_t PaddingTo(uint64_t offset, uint64_t alignment) { return -offset & (alignment - 1); }

std::string BlockProblem(uint32_t b, const char* what) {
  return "block " + std::to_string(b) + ": " + what;
}

}  // namespace

OffsetAllocator::OffsetAllocator(uint64_t capacity, uint64_t alignment)
    : capacity_(capacity & ~(alignment - 1)),
      alignment_(alignment),
      alignment_log2_(std::countr_zero(alignment)),
      free_bytes_(capacity_),
      heads_(kFirstLevelCount * kSecondLevelCount, kNone) {
  // The state bits in Block::offset_and_state and kFirstLevelCount both rely on alignment >= 8.
  if (alignment < 8 || !std::has_single_bit(alignment)) {
    throw std::invalid_argument("OffsetAllocator: alignment must be a power of two >= 8, got " +
                                std::to_string(alignment));
  }
  if (capacity_ > 0) {
    nodes_.push_back(Block{0, kNone, kNone, kNone, kNone});
    InsertFree(0);
  }
}

OffsetAllocator::SizeClass OffsetAllocator::ClassOf(uint64_t units) {
  if (units < kSecondLevelCount) return {0, static_cast<int>(units)};
  const int shift = std::bit_width(units) - 1 - kSecondLevelLog2;
  return {shift + 1, static_cast<int>((units >> shift) - kSecondLevelCount)};
}

OffsetAllocator::SizeClass OffsetAllocator::FitClassOf(uint64_t units) {
  // Rounding up to the next class boundary: a class's blocks are at least its lower bound.
  if (units < kSecondLevelCount) return ClassOf(units);
  return ClassOf(units + (uint64_t{1} << (std::bit_width(units) - 1 - kSecondLevelLog2)) - 1);
}

// What a request of size bytes reserves (see Allocate); size <= capacity_, so no overflow.
uint64_t OffsetAllocator::Reserved(uint64_t size) const {
  return size == 0 ? alignment_ : (size + alignment_ - 1) & ~(alignment_ - 1);
}

uint64_t OffsetAllocator::SizeOf(uint32_t b) const {
  const uint32_t next = nodes_[b].next_phys;
  return (next == kNone ? capacity_ : NodeOffset(next)) - NodeOffset(b);
}

std::optional<OffsetAllocator::Allocation> OffsetAllocator::Allocate(uint64_t size) {
  // Checked first so that rounding up cannot overflow.
  if (size > capacity_) return std::nullopt;
  const uint64_t bytes = Reserved(size);

  const uint32_t b = FindFreeBlock(bytes);
  if (b == kNone) return std::nullopt;
  return TakeFront(b, bytes);
}

std::optional<OffsetAllocator::Allocation> OffsetAllocator::Allocate(uint64_t size,
                                                                     uint64_t alignment) {
  if (alignment == alignment_) return Allocate(size);
  // A power of two, tested without std::has_single_bit: that is a library call (popcount)
  // unless the build targets CPUs with the instruction.
  if (alignment < alignment_ || (alignment & (alignment - 1)) != 0) return std::nullopt;
  if (size > capacity_) return std::nullopt;
  const uint64_t bytes = Reserved(size);

  const uint32_t b = FindAlignedFreeBlock(bytes, alignment);
  if (b == kNone) return std::nullopt;
  const uint64_t start = NodeOffset(b) + PaddingTo(NodeOffset(b), alignment);
  if (start == NodeOffset(b)) return TakeFront(b, bytes);

  // The object goes in the middle of b: b keeps the front padding and stays free (its left
  // neighbour is not free, as b was), a new node holds the object, and another any tail.
  // Both nodes are taken before anything changes: growing the pool may throw, and must leave
  // us intact.
  const bool has_tail = start + bytes < NodeOffset(b) + SizeOf(b);
  const uint32_t object = TakeNode();
  if (object == kNone) return std::nullopt;
  uint32_t tail = kNone;
  if (has_tail) {
    try {
      tail = TakeNode();
    } catch (...) {
      ReturnNode(object);
      throw;
    }
    if (tail == kNone) {
      ReturnNode(object);
      return std::nullopt;
    }
  }
  RemoveFree(b);  // while b still has its old size, which files it
  LinkAfter(b, object, start);
  InsertFree(b);
  if (has_tail) {
    LinkAfter(object, tail, start + bytes);
    InsertFree(tail);
  }
  SetState(object, kAllocated);
  free_bytes_ -= bytes;
  ++live_allocations_;
  return Allocation{start, bytes, object};
}

// Allocates the first `bytes` of free block b, which holds them; any rest stays free.
std::optional<OffsetAllocator::Allocation> OffsetAllocator::TakeFront(uint32_t b, uint64_t bytes) {
  if (SizeOf(b) > bytes) {
    // Taken before anything changes: growing the pool may throw, and must leave us intact.
    const uint32_t rest = TakeNode();
    if (rest == kNone) return std::nullopt;
    RemoveFree(b);  // while b still has its old size, which files it
    LinkAfter(b, rest, NodeOffset(b) + bytes);
    InsertFree(rest);
  } else {
    RemoveFree(b);
  }
  SetState(b, kAllocated);
  free_bytes_ -= bytes;
  ++live_allocations_;
  return Allocation{NodeOffset(b), bytes, b};
}

// Puts spare node n into the physical chain right after block b, starting at offset (inside
// b, which so ends there). n's state and free links are the caller's to set.
void OffsetAllocator::LinkAfter(uint32_t b, uint32_t n, uint64_t offset) {
  Block& node = nodes_[n];
  node.offset_and_state = offset;
  node.prev_phys = b;
  node.next_phys = nodes_[b].next_phys;
  if (node.next_phys != kNone) nodes_[node.next_phys].prev_phys = n;
  nodes_[b].next_phys = n;
}

// A block of the request's own class that holds it, among the first kTightFitLooks there
// (kNone if none), found in O(1). TLSF alone searches from the class above the request's, so
// a hole exactly as large as the request is passed over for a larger block while one exists;
// a workload of same-sized objects would then spread over the whole region, touching pages
// the holes it leaves could have served.
uint32_t OffsetAllocator::TightFit(uint64_t units, uint64_t bytes, uint64_t alignment) const {
  constexpr int kTightFitLooks = 8;
  const SizeClass own = ClassOf(units);
  if (own.first >= kFirstLevelCount) return kNone;
  int looks = 0;
  for (uint32_t b = heads_[FlatIndex(own)]; b != kNone && looks < kTightFitLooks;
       b = nodes_[b].next_free, ++looks) {
    if (Fits(b, bytes, alignment)) return b;
  }
  return kNone;
}

uint32_t OffsetAllocator::FindFreeBlock(uint64_t bytes) const {
  const uint64_t units = bytes >> alignment_log2_;
  if (const uint32_t tight = TightFit(units, bytes, alignment_); tight != kNone) return tight;
  // Searching from the class above the request's (unless the request starts its class)
  // makes every block found big enough: no list walking.
  const SizeClass from = FitClassOf(units);
  const uint32_t b = FirstFreeFrom(from);
  if (b != kNone) return b;
  // Nothing in larger classes, but the request's own class may still hold a block that fits
  // (e.g. the whole free region when asked for exactly that): Allocate() promises nullopt
  // only when no block fits, so look. Reached only when memory is nearly exhausted.
  return ScanClassesForFit(FlatIndex(ClassOf(units)), FlatIndex(from), bytes, alignment_);
}

uint32_t OffsetAllocator::FindAlignedFreeBlock(uint64_t bytes, uint64_t alignment) const {
  // The block Allocate(size) would take, if it happens to hold the object at an aligned
  // offset: large objects are mostly page multiples, so their holes mostly start on pages,
  // and this keeps the fit as tight as unaligned requests get.
  const uint64_t units = bytes >> alignment_log2_;
  uint32_t b = TightFit(units, bytes, alignment);
  if (b != kNone) return b;
  b = FirstFreeFrom(FitClassOf(units));
  if (b != kNone && Fits(b, bytes, alignment)) return b;
  // Any block of bytes + alignment - alignment() holds it, wherever the block starts.
  const uint64_t slack = alignment - alignment_;
  int scan_to = kClassCount;
  if (bytes <= capacity_ && slack <= capacity_ - bytes) {
    const SizeClass from = FitClassOf((bytes + slack) >> alignment_log2_);
    b = FirstFreeFrom(from);
    if (b != kNone) return b;
    scan_to = FlatIndex(from);
  }
  // Smaller blocks may still hold it, depending on where they start. Reached only when memory
  // is nearly exhausted or badly fragmented.
  return ScanClassesForFit(FlatIndex(ClassOf(units)), scan_to, bytes, alignment);
}

// The head of the first non-empty class at or above c (kNone if none): O(1), two bit scans.
uint32_t OffsetAllocator::FirstFreeFrom(SizeClass c) const {
  if (c.first >= kFirstLevelCount) return kNone;
  int first = c.first;
  uint32_t seconds = second_level_bitmaps_[first] & (~0u << c.second);
  if (seconds == 0) {
    const uint64_t firsts = first_level_bitmap_ & (~uint64_t{0} << (first + 1));
    if (firsts == 0) return kNone;
    first = std::countr_zero(firsts);
    seconds = second_level_bitmaps_[first];
  }
  return heads_[first * kSecondLevelCount + std::countr_zero(seconds)];
}

// The first free block in the classes numbered [from, to) (see FlatIndex) that holds bytes at
// a multiple of alignment, or kNone. Walks the lists: O(free blocks in those classes).
uint32_t OffsetAllocator::ScanClassesForFit(int from, int to, uint64_t bytes,
                                            uint64_t alignment) const {
  to = std::min(to, kClassCount);
  for (int c = from; c < to;) {
    const int first = c >> kSecondLevelLog2;
    const uint32_t seconds = second_level_bitmaps_[first] & (~0u << (c & (kSecondLevelCount - 1)));
    if (seconds == 0) {
      c = (first + 1) << kSecondLevelLog2;
      continue;
    }
    c = (first << kSecondLevelLog2) + std::countr_zero(seconds);
    if (c >= to) break;
    for (uint32_t b = heads_[c]; b != kNone; b = nodes_[b].next_free) {
      if (Fits(b, bytes, alignment)) return b;
    }
    ++c;
  }
  return kNone;
}

// Whether free block b holds bytes starting at its first multiple of alignment.
bool OffsetAllocator::Fits(uint32_t b, uint64_t bytes, uint64_t alignment) const {
  const uint64_t size = SizeOf(b);
  return size >= bytes && PaddingTo(NodeOffset(b), alignment) <= size - bytes;
}

bool OffsetAllocator::Free(uint32_t handle) {
  if (handle >= nodes_.size() || StateOf(handle) != kAllocated) return RefuseBadHandle(handle);
  free_bytes_ += SizeOf(handle);
  --live_allocations_;

  uint32_t b = handle;
  const uint32_t next = nodes_[b].next_phys;
  if (next != kNone && StateOf(next) == kFree) {
    RemoveFree(next);
    AbsorbNext(b);
  }
  const uint32_t prev = nodes_[b].prev_phys;
  if (prev != kNone && StateOf(prev) == kFree) {
    RemoveFree(prev);  // before it grows: it is filed under its old size
    AbsorbNext(prev);
    b = prev;
  }
  InsertFree(b);
  return true;
}

void OffsetAllocator::InsertFree(uint32_t b) {
  SetState(b, kFree);
  const SizeClass c = ClassOf(SizeOf(b) >> alignment_log2_);
  uint32_t& head = Head(c);
  nodes_[b].prev_free = kNone;
  nodes_[b].next_free = head;
  if (head != kNone) nodes_[head].prev_free = b;
  head = b;
  first_level_bitmap_ |= uint64_t{1} << c.first;
  second_level_bitmaps_[c.first] |= 1u << c.second;
}

void OffsetAllocator::RemoveFree(uint32_t b) {
  const Block& n = nodes_[b];
  if (n.next_free != kNone) nodes_[n.next_free].prev_free = n.prev_free;
  if (n.prev_free != kNone) {
    nodes_[n.prev_free].next_free = n.next_free;
    return;
  }
  // b heads its list: only then is its class (one more load, of the next block) needed.
  const SizeClass c = ClassOf(SizeOf(b) >> alignment_log2_);
  Head(c) = n.next_free;
  if (n.next_free == kNone) {
    second_level_bitmaps_[c.first] &= ~(1u << c.second);
    if (second_level_bitmaps_[c.first] == 0) first_level_bitmap_ &= ~(uint64_t{1} << c.first);
  }
}

void OffsetAllocator::AbsorbNext(uint32_t b) {
  const uint32_t next = nodes_[b].next_phys;
  nodes_[b].next_phys = nodes_[next].next_phys;
  if (nodes_[b].next_phys != kNone) nodes_[nodes_[b].next_phys].prev_phys = b;
  ReturnNode(next);
}

uint32_t OffsetAllocator::TakeNode() {
  if (spare_nodes_ != kNone) {
    const uint32_t b = spare_nodes_;
    spare_nodes_ = nodes_[b].next_free;
    return b;
  }
  // kNone is not an index, so at most kNone nodes.
  if (nodes_.size() >= kNone) return kNone;
  // 1.5x rather than the vector's usual 2x keeps the slack, and so the worst-case metadata
  // per block, at 36 bytes instead of 48.
  if (nodes_.size() == nodes_.capacity()) {
    nodes_.reserve(std::min<uint64_t>(nodes_.size() + nodes_.size() / 2 + 64, kNone));
  }
  nodes_.push_back(Block{0, kNone, kNone, kNone, kNone});
  return static_cast<uint32_t>(nodes_.size() - 1);
}

void OffsetAllocator::ReturnNode(uint32_t b) {
  nodes_[b] = Block{kUnused, kNone, kNone, kNone, spare_nodes_};
  spare_nodes_ = b;
}

uint64_t OffsetAllocator::largest_free_block() const {
  if (first_level_bitmap_ == 0) return 0;
  const int first = 63 - std::countl_zero(first_level_bitmap_);
  const int second = 31 - std::countl_zero(second_level_bitmaps_[first]);
  uint64_t largest = 0;
  for (uint32_t b = heads_[first * kSecondLevelCount + second]; b != kNone;
       b = nodes_[b].next_free) {
    largest = std::max(largest, SizeOf(b));
  }
  return largest;
}

uint64_t OffsetAllocator::metadata_bytes() const {
  return sizeof(*this) + heads_.capacity() * sizeof(uint32_t) + nodes_.capacity() * sizeof(Block);
}

std::string OffsetAllocator::CheckInvariants() const {
  const auto in_range = [&](uint32_t b) { return b < nodes_.size(); };

  // Physical chain: node 0 starts it at offset 0, each block ends where the next begins and
  // the last at capacity (so the blocks tile the region), and no two free blocks touch.
  if (capacity_ == 0) {
    if (!nodes_.empty()) return "an empty region has blocks";
  } else if (nodes_.empty() || NodeOffset(0) != 0 || StateOf(0) == kUnused ||
             nodes_[0].prev_phys != kNone) {
    return "node 0 is not the first block at offset 0";
  }
  uint64_t free_sum = 0;
  uint64_t chain_blocks = 0;
  uint64_t free_blocks = 0;
  uint64_t allocated_blocks = 0;
  uint32_t prev = kNone;
  for (uint32_t b = capacity_ == 0 ? kNone : 0; b != kNone; prev = b, b = nodes_[b].next_phys) {
    if (!in_range(b)) return "physical chain links to node " + std::to_string(b) + ", out of range";
    if (++chain_blocks > nodes_.size()) return "physical chain has a cycle";
    if (nodes_[b].prev_phys != prev) return BlockProblem(b, "prev_phys does not match the chain");
    if (NodeOffset(b) % alignment_ != 0) return BlockProblem(b, "offset is not aligned");
    const uint32_t next = nodes_[b].next_phys;
    if (next != kNone && !in_range(next)) return BlockProblem(b, "next_phys out of range");
    const uint64_t end = next == kNone ? capacity_ : NodeOffset(next);
    if (end <= NodeOffset(b)) return BlockProblem(b, "is empty or out of order");
    switch (StateOf(b)) {
      case kFree:
        if (prev != kNone && StateOf(prev) == kFree) {
          return BlockProblem(b, "is free next to a free block (missed coalescing)");
        }
        free_sum += end - NodeOffset(b);
        ++free_blocks;
        break;
      case kAllocated:
        ++allocated_blocks;
        break;
      default:
        return BlockProblem(b, "is a spare node but sits in the physical chain");
    }
  }

  // Free lists: each bitmap bit says whether its list is empty, and every free block of the
  // chain is in the list of its own class, exactly once.
  if (first_level_bitmap_ >> kFirstLevelCount != 0) return "first-level bitmap has stray bits";
  uint64_t listed = 0;
  for (int first = 0; first < kFirstLevelCount; ++first) {
    const uint32_t seconds = second_level_bitmaps_[first];
    if (((first_level_bitmap_ >> first) & 1) != (seconds != 0 ? 1u : 0u)) {
      return "first-level bit " + std::to_string(first) + " disagrees with its second level";
    }
    for (int second = 0; second < static_cast<int>(kSecondLevelCount); ++second) {
      const uint32_t head = heads_[first * kSecondLevelCount + second];
      if (((seconds >> second) & 1) != (head != kNone ? 1u : 0u)) {
        return "bitmap bit of class (" + std::to_string(first) + ", " + std::to_string(second) +
               ") disagrees with its list";
      }
      uint32_t prev_free = kNone;
      for (uint32_t b = head; b != kNone; prev_free = b, b = nodes_[b].next_free) {
        if (!in_range(b)) return "free list links to node " + std::to_string(b) + ", out of range";
        if (++listed > free_blocks) return "free lists hold more blocks than the chain has free";
        if (StateOf(b) != kFree) return BlockProblem(b, "is in a free list but not free");
        if (nodes_[b].prev_free != prev_free) return BlockProblem(b, "prev_free is wrong");
        const SizeClass c = ClassOf(SizeOf(b) >> alignment_log2_);
        if (c.first != first || c.second != second) {
          return BlockProblem(b, "is in the free list of another size class");
        }
      }
    }
  }
  if (listed != free_blocks) return "a free block is in no free list";

  uint64_t spares = 0;
  for (uint32_t b = spare_nodes_; b != kNone; b = nodes_[b].next_free) {
    if (!in_range(b)) return "spare chain links to node " + std::to_string(b) + ", out of range";
    if (++spares > nodes_.size()) return "spare chain has a cycle";
    if (StateOf(b) != kUnused) return BlockProblem(b, "is in the spare chain but in use");
  }
  if (chain_blocks + spares != nodes_.size()) return "some node is neither a block nor spare";

  if (free_sum != free_bytes_) {
    return "free_bytes() is " + std::to_string(free_bytes_) + " but free blocks sum to " +
           std::to_string(free_sum);
  }
  if (allocated_blocks != live_allocations_) {
    return "live_allocations() is " + std::to_string(live_allocations_) + " but " +
           std::to_string(allocated_blocks) + " blocks are allocated";
  }
  return "";
}

}  // namespace depot::store
