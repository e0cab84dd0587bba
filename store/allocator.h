// OffsetAllocator: hands out aligned byte ranges of one region [0, capacity).
//
// The daemon carves objects out of shared-memory segments and GPU chunks with it. It manages
// offsets only: it never touches the region, and its metadata lives in daemon memory, so a
// client that scribbles over shared memory cannot corrupt it.
//
// The scheme is TLSF (two-level segregated fit): free blocks sit in size classes, a power of
// two split into kSecondLevelCount linear steps, with one bitmap bit per non-empty class, so
// finding a free block and freeing one are O(1) (a few bit scans). A freed block merges with
// free physical neighbours at once, so no two free blocks are ever adjacent. Before taking a
// block of a larger class, a request looks at the first few blocks of its own class for one
// that holds it: a hole left by an object of the same size (the chunks of an array) is
// filled again, rather than a fresh part of the region, whose pages have not been touched.
//
// Per-block cost is one 24-byte node in a vector (see sizeof(Block)); a node's size is not
// stored but implied by the next block's offset. The node pool grows by 1.5x, so metadata stays
// under 40 bytes per block. Growing copies the pool: one pause of a few milliseconds per
// million blocks, amortised O(1).
//
// Not thread-safe: the daemon's single loop thread owns each allocator.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace depot::store {

class OffsetAllocator {
 public:
  // Manages [0, capacity). capacity is rounded down to a multiple of alignment (so a capacity
  // below alignment holds nothing). alignment must be a power of two >= 8 (64 for host
  // memory, 256 for GPU pools); anything else throws std::invalid_argument, since it is a
  // constant of the caller, not an input.
  explicit OffsetAllocator(uint64_t capacity, uint64_t alignment = 64);

  // One reserved range. size is what was actually reserved (the request rounded up to
  // alignment(), whatever alignment was asked of the offset); handle identifies the range to
  // Free() and stays valid until then.
  struct Allocation {
    uint64_t offset = 0;
    uint64_t size = 0;
    uint32_t handle = 0;
  };

  // Reserves size bytes, rounded up to a multiple of alignment(); the offset is a multiple of
  // alignment() too. A request of 0 bytes reserves one alignment unit, so it still gets an
  // offset of its own (empty objects need distinct, valid locations).
  // Returns nullopt when no free block can hold the rounded size (never throws for that).
  // O(1), except when the constant-time search finds nothing: then it scans the one size
  // class that may still hold a fitting block before giving up.
  std::optional<Allocation> Allocate(uint64_t size);

  // As Allocate(size), but the offset is a multiple of `alignment` (the daemon asks for 4096
  // to put large objects on page boundaries). Only the rounded size is reserved and counted in
  // used_bytes(), as with Allocate(size): when the block found does not start at an aligned
  // offset, the bytes in front of the object stay a free block of their own, and later
  // requests can use them. Free() takes the handle back like any other.
  // alignment must be a power of two >= alignment(); anything else returns nullopt, in debug
  // builds too (it is refused, never rounded). Otherwise returns nullopt only when no free
  // block can hold the rounded size at an aligned offset.
  // alignment == alignment() is exactly Allocate(size). Otherwise O(1) while some free block
  // holds size + alignment - alignment() bytes; when none does, it scans the size classes
  // between size and that before giving up.
  std::optional<Allocation> Allocate(uint64_t size, uint64_t alignment);

  // Frees the live allocation `handle` and merges it with free neighbours. Returns true.
  // Freeing a handle that is not live (never handed out, or freed already) is a bug in the
  // caller: debug builds abort with a message; release builds ignore it and return false.
  // A handle freed and then handed out again by a later Allocate() is live again, so a stale
  // handle can free someone else's range: callers keep a handle in exactly one owner.
  bool Free(uint32_t handle);

  uint64_t capacity() const { return capacity_; }
  uint64_t alignment() const { return alignment_; }
  // Bytes not reserved by any live allocation (fragmented or not). O(1).
  uint64_t free_bytes() const { return free_bytes_; }
  // Bytes reserved by live allocations, rounding included. O(1).
  uint64_t used_bytes() const { return capacity_ - free_bytes_; }
  // Size of the largest free block: the largest request that Allocate() can satisfy now.
  // Scans the highest non-empty size class only.
  uint64_t largest_free_block() const;
  // Where the live allocation `handle` starts. O(1).
  uint64_t OffsetOf(uint32_t handle) const { return NodeOffset(handle); }
  // Number of allocations handed out and not yet freed.
  uint32_t live_allocations() const { return live_allocations_; }
  // Daemon memory this allocator holds (for metrics and budgets).
  uint64_t metadata_bytes() const;

  // Self-check for tests: walks every block and verifies that they tile [0, capacity)
  // exactly, that no two free blocks are adjacent, that every free block sits in the list of
  // its size class and the bitmaps match the lists, and that the totals match.
  // Returns "" when all holds, else a description of the first problem. O(blocks).
  std::string CheckInvariants() const;

 private:
  // One physical block: allocated, free, or (kUnused) a spare node waiting for reuse.
  // Links are node indices (kNone for none); the block's size is the next block's offset
  // minus its own (capacity for the last one), so sizes cannot drift out of sync.
  struct Block {
    uint64_t offset_and_state;  // offset | State; offsets are multiples of 8, so bits 0-1 are free
    uint32_t prev_phys;
    uint32_t next_phys;
    uint32_t prev_free;  // free: links within its size class; unused: next_free chains spares
    uint32_t next_free;
  };
  enum State : uint64_t { kUnused = 0, kFree = 1, kAllocated = 2 };
  static constexpr uint64_t kStateMask = 3;
  static constexpr uint32_t kNone = UINT32_MAX;

  // Size classes, in alignment units u: u < kSecondLevelCount map one class per unit (first
  // level 0); above, first level f >= 1 covers [2^(f+4), 2^(f+5)) in 32 equal steps. With
  // alignment >= 8 a unit count is below 2^61, hence 57 first levels.
  static constexpr int kSecondLevelLog2 = 5;
  static constexpr uint32_t kSecondLevelCount = 1u << kSecondLevelLog2;
  static constexpr int kFirstLevelCount = 64 - 3 - kSecondLevelLog2 + 1;
  struct SizeClass {
    int first;
    int second;
  };
  static SizeClass ClassOf(uint64_t units);
  // The lowest class whose blocks all hold `units`: the class above units' own, unless units
  // starts its class. May be one past the last class.
  static SizeClass FitClassOf(uint64_t units);
  // Classes numbered in size order (first * kSecondLevelCount + second), for ranges of them.
  static constexpr int kClassCount = kFirstLevelCount << kSecondLevelLog2;
  static int FlatIndex(SizeClass c) { return (c.first << kSecondLevelLog2) + c.second; }

  uint64_t NodeOffset(uint32_t b) const { return nodes_[b].offset_and_state & ~kStateMask; }
  State StateOf(uint32_t b) const { return State(nodes_[b].offset_and_state & kStateMask); }
  void SetState(uint32_t b, State s) {
    nodes_[b].offset_and_state = (nodes_[b].offset_and_state & ~kStateMask) | s;
  }
  uint64_t SizeOf(uint32_t b) const;
  uint64_t Reserved(uint64_t size) const;
  uint32_t& Head(SizeClass c) { return heads_[c.first * kSecondLevelCount + c.second]; }

  uint32_t FindFreeBlock(uint64_t bytes) const;
  uint32_t FindAlignedFreeBlock(uint64_t bytes, uint64_t alignment) const;
  uint32_t FirstFreeFrom(SizeClass c) const;
  uint32_t TightFit(uint64_t units, uint64_t bytes, uint64_t alignment) const;
  uint32_t ScanClassesForFit(int from, int to, uint64_t bytes, uint64_t alignment) const;
  bool Fits(uint32_t b, uint64_t bytes, uint64_t alignment) const;
  std::optional<Allocation> TakeFront(uint32_t b, uint64_t bytes);
  void LinkAfter(uint32_t b, uint32_t n, uint64_t offset);
  void InsertFree(uint32_t b);
  void RemoveFree(uint32_t b);
  void AbsorbNext(uint32_t b);
  uint32_t TakeNode();
  void ReturnNode(uint32_t b);

  uint64_t capacity_;
  uint64_t alignment_;
  int alignment_log2_;
  uint64_t free_bytes_;
  uint32_t live_allocations_ = 0;
  uint32_t spare_nodes_ = kNone;  // head of the chain of kUnused nodes
  uint64_t first_level_bitmap_ = 0;
  uint32_t second_level_bitmaps_[kFirstLevelCount] = {};
  std::vector<uint32_t> heads_;  // kFirstLevelCount * kSecondLevelCount free-list heads
  std::vector<Block> nodes_;     // node 0, when present, is always the block at offset 0
};

}  // namespace depot::store
