// The host arena: tmpfs-backed segments of shared memory that hold object bytes.
//
// Segments are memfds by default (nothing is left behind if the daemon dies) or files in a
// directory (a tmpfs or hugetlbfs mount). There are two kinds:
// - Shared segments, of --segment-size bytes, hold every object that fits one, carved by an
//   OffsetAllocator. They are added on demand up to the capacity and keep their index, file
//   and size for the daemon's life, so a client maps each one once and keeps it. A new
//   segment is usable at once; its pages are allocated ("pre-faulted") by fallocate on a
//   worker thread, kPrefaultAhead bytes ahead of its objects, and the arena keeps one empty
//   segment ready ahead of demand, so a put does not pay for page allocation (about 2.4 µs
//   per 4 KiB page on tmpfs, several times memcpy). With CUDA GPUs, that worker then page-locks the
//   segment (ArenaOptions::lock_pages), so copies between the arena and GPUs run at full PCIe
//   speed, not through the driver's staging buffers. Without pre-faulting (ArenaOptions::prefault),
//   pages are allocated as writers first touch them, and none are page-locked.
// - A dedicated segment holds one object larger than a shared segment, sized to fit. Its
//   index (from kFirstDedicated up) names its file for the daemon's life, so a client mapping
//   can never show one file's bytes for another's. Its pages are allocated by its writer as
//   it writes, and, pre-faulting memfds, by a worker at the same time from the other end
//   (fallocate, kPrefaultAhead bytes a call, backwards): on two cores a first put of 1 GiB
//   takes 0.65x the time. It is not page-locked.
// - A kept segment is a dedicated one whose object went (deleted or evicted), with its file,
//   its pages and its index, for the next object of its class that it fits: a put of a large
//   object then writes into memory already allocated, at memcpy speed, instead of a new file
//   whose every page the kernel allocates and zeroes as it is written (about 1.4 GB/s).
//   Reusing the index for the same file keeps the rule that an index names one file: a
//   client that kept its mapping reaches the new object there, as it would in a shared
//   segment. Only an object of the same class of writers (below) reuses it, for the same
//   reason as a shared segment's. Kept segments count as free capacity (free_capacity(),
//   largest_free_block, status' kept_bytes), and are given back before any new file is made
//   that the capacity would not hold beside them, so they never cause an eviction or an
//   out-of-memory error: least recently kept first, synchronously (about 0.17 s per GiB).
//   At most kMaxKept are kept (ArenaOptions::keep_large: off, none).
// Both count against the capacity. When a dedicated segment needs capacity that empty shared
// segments hold, they are retired: their pages are given back (a hole punched in the file,
// which also empties every client's mapping of it) and their capacity goes to the dedicated
// segment. A retired segment keeps its index and file, and is revived (its pages allocated
// again) before any new shared segment is added, so clients' mappings of it stay valid.
//
// Writers. A client that creates an object gets its segment's file read-write, and with it
// every other object in that segment. So each segment belongs to one class of writers, and
// holds only what that class may write: the trusted class (kTrustedWriters: root, the
// daemon's uid, and every copy the daemon makes itself, such as restores from disk and
// copies from GPUs, whoever created the object), or the objects that one other uid, which
// --share-writable-with-* lets create, creates. A shared segment is claimed by the first
// class that allocates in it and keeps that class while it is empty, for its next objects.
// Another class takes it over only when nothing else has room, and not while a worker still
// prepares it: the segment is given a new file first, at the same index and the same address
// in the daemon, with its generation counted up; the old file's pages are given back (and,
// in a directory, its size), so a client of the previous class that keeps its mapping of
// the old file reaches nothing of anyone's. Sessions are sent the new file
// (Reply.newSegments, with the generation) before any reply that names an object in it.
#pragma once

#include <boost/asio/thread_pool.hpp>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "depot/ipc/framing.h"
#include "depot/ipc/protocol.h"
#include "depot/status.h"
#include "store/allocator.h"
#include "store/peer.h"
#include "store/tier_pool.h"

namespace depot::store {

struct ArenaOptions {
  uint64_t capacity = 0;      // bytes, over all segments
  uint64_t segment_size = 0;  // bytes per shared segment; larger objects get their own
  std::string dir;            // empty: memfd segments
  // Page-locks ("pins", as CUDA says) a segment for copies to and from GPUs: the CUDA
  // backend's RegisterHostMemory. It runs on a worker thread once the segment's pages are
  // allocated; until it returns, copies to and from that segment still work, through the
  // driver's staging buffers. `unlock_pages` undoes it before the segment is unmapped. Empty:
  // segments are not page-locked.
  std::function<Status(void* base, uint64_t bytes)> lock_pages;
  std::function<void(void* base)> unlock_pages;
  // Whether a shared memfd segment's pages are allocated ahead of use: kPrefaultAhead bytes
  // past its objects, or the whole segment to page-lock it (lock_pages). Off (depotd
  // --no-prefault), a page is allocated when a writer first touches it, so the arena holds
  // only the pages objects have used: puts into pages not used before pay the page faults,
  // and segments are not page-locked. Segments in `dir` are reserved whole, and page-locked
  // with lock_pages, either way.
  bool prefault = true;
  // Whether a dedicated segment whose object went is kept for the next large object of its
  // class (see kept segments above; depotd --no-keep-large: off).
  bool keep_large = true;
  // Whether to ask for huge pages (depotd --huge-pages): memfd segments of the host's
  // reserved huge pages (MFD_HUGETLB) when its free pool holds the whole capacity, else, where
  // the kernel's policy for shared memory allows transparent huge pages, segments advised to
  // use them (MADV_HUGEPAGE). A reader then maps a 1 GiB object with 512 page-table entries
  // instead of 262,144. Never fatal: without either, 4 KiB pages, and page_note() says why.
  // (In --arena-dir, the directory's file system decides: hugetlbfs gives huge pages.)
  bool huge_pages = false;
};

class Arena final : public TierPool {
 public:
  // The first index of a dedicated segment; shared segments are numbered from 0.
  static constexpr uint32_t kFirstDedicated = ipc::kFirstDedicatedSegment;
  // At most this many shared segments: a reply carries one descriptor per segment it names
  // that the client has not mapped, so this bounds a client's descriptors and mappings (and
  // keeps a reply within one write's 253 descriptors). Create raises the segment size to
  // keep the count under it.
  static constexpr uint64_t kMaxSharedSegments = 200;
  static bool IsDedicated(uint32_t segment) { return ipc::IsDedicatedSegment(segment); }
  // Classes of writers (see Writers above): a uid that --share-writable-with-* lets create
  // objects, or these.
  static constexpr uint32_t kTrustedWriters = 0;      // the daemon, root, the daemon's uid
  static constexpr uint32_t kNoWriters = UINT32_MAX;  // a segment no class has claimed
  // The class of the objects a client of `uid` creates.
  static uint32_t WritersOf(uid_t uid) { return IsTrustedUid(uid) ? kTrustedWriters : uid; }

  // Objects are placed at multiples of this (a cache line)...
  static constexpr uint64_t kAlignment = 64;
  // ...and objects of kPageAlignFrom bytes or more at page boundaries: memcpy into a
  // destination that is not page-aligned against a page-aligned source runs up to 4x slower
  // (4K aliasing), and pinning for host-device copies works in pages. The allocator keeps
  // any bytes in front of such an object as a free block, so nothing is wasted.
  static constexpr uint64_t kPage = 4096;
  static constexpr uint64_t kPageAlignFrom = 256 * 1024;
  // How far ahead of a memfd segment's objects its pages are allocated (ArenaOptions::
  // prefault, without page-locking): fallocate on a worker, about 15 ms per 64 MiB, keeps
  // ahead of puts that fill the segment in order, as a new arena's do, while the pages held
  // and unused stay within this much per segment in use, and the one kept ready.
  static constexpr uint64_t kPrefaultAhead = 64 << 20;
  // At most this many kept segments (each is a descriptor and a mapping in the daemon)...
  static constexpr size_t kMaxKept = 8;
  // ...and one is reused only for an object that leaves at most this share of it unused
  // (1/kKeptSlack): a 4 GiB file does not hold a 1 GiB object while the rest of it stays
  // allocated for nothing.
  static constexpr uint64_t kKeptSlack = 4;

  // Checks the options against what the backing store can hold (physical memory for memfd,
  // free space for a directory) and creates the first segment. `prefault_pool` runs the
  // page allocation of new segments; it must outlive the arena.
  static Result<std::unique_ptr<Arena>> Create(const ArenaOptions& options,
                                               boost::asio::thread_pool& prefault_pool);
  ~Arena() override;

  // TierPool: regions are segments, and the bytes are the trusted class's (the daemon's
  // own copies, and trusted clients' objects).
  std::optional<Block> Allocate(uint64_t size) override { return Allocate(size, kTrustedWriters); }
  std::optional<Block> AllocateIn(uint32_t segment, uint64_t size) override {
    return AllocateIn(segment, size, kTrustedWriters);
  }
  // Room for an object of class `writers`: in one of its segments, else in one no class has
  // claimed, else in a shared segment added when the capacity allows, else in an empty
  // segment of another class, which is given a new file first. An object larger than a
  // shared segment gets a dedicated one (retiring empty shared segments for its capacity if
  // it must).
  std::optional<Block> Allocate(uint64_t size, uint32_t writers);
  // Room in one segment only (used right after freeing in it): one of the class's, one not
  // claimed, or an empty one of another class, given a new file first.
  std::optional<Block> AllocateIn(uint32_t segment, uint64_t size, uint32_t writers);
  // Freeing a dedicated segment's object removes the segment; its pages are given back on a
  // worker thread.
  void Free(uint32_t segment, uint32_t handle) override;
  uint64_t OffsetOf(uint32_t segment, uint32_t handle) const override {
    return at(segment).allocator.OffsetOf(handle);
  }
  uint64_t address(uint32_t segment, uint64_t offset) const override {
    return reinterpret_cast<uint64_t>(base(segment) + offset);
  }
  uint64_t BlockSize(uint64_t bytes) const override { return ReservedSize(bytes); }
  // Checked before rounding, which would wrap for sizes near 2^64.
  bool CouldFit(uint64_t bytes) const override {
    return bytes <= options_.capacity && ReservedSize(bytes) <= options_.capacity;
  }
  uint64_t free_bytes(uint32_t segment) const override {
    return at(segment).allocator.free_bytes();
  }
  uint64_t used_bytes() const override;
  uint64_t capacity() const override { return options_.capacity; }
  uint64_t largest_free_block() const override;
  std::string name() const override { return "host memory"; }

  // Where the daemon sees a segment's bytes.
  std::byte* base(uint32_t segment) const { return at(segment).base; }
  // The descriptors clients receive: read-write for the clients that create objects in the
  // segment, read-only (and impossible to re-open read-write, but for root) for the others.
  int fd(uint32_t segment) const { return at(segment).fd->get(); }
  int read_fd(uint32_t segment) const { return at(segment).read_fd->get(); }
  // The same descriptors, for a reply that carries one and may wait to be sent: it keeps the
  // file open however long that is, whatever the arena does with the segment meanwhile.
  std::shared_ptr<const ipc::UniqueFd> file(uint32_t segment, bool writable) const {
    return writable ? at(segment).fd : at(segment).read_fd;
  }
  uint64_t segment_bytes(uint32_t segment) const { return at(segment).size; }
  // The class whose objects a segment holds (kNoWriters if none claimed it yet), and how
  // many times it was given a new file for another class: a session holding an older
  // generation's descriptor must be sent the new one.
  uint32_t writers(uint32_t segment) const { return at(segment).writers; }
  uint32_t generation(uint32_t segment) const { return at(segment).generation; }
  // Whether a worker is still allocating (or page-locking) a segment's pages.
  bool preparing(uint32_t segment) const {
    return at(segment).preparing.load(std::memory_order_acquire);
  }
  // Whether the segment, if empty, could be given to another class now: not while a worker
  // prepares a new file of it (allocating pages ahead of its objects is waited for).
  bool can_change_hands(uint32_t segment) const {
    const Segment& s = at(segment);
    return !s.preparing.load(std::memory_order_acquire) || s.window_job;
  }
  // Whether a shared segment in use belongs to a class other than `writers`.
  bool HasOtherClass(uint32_t writers) const {
    return std::ranges::any_of(shared_, [&](const auto& s) {
      return !s->retired && s->writers != writers && s->writers != kNoWriters;
    });
  }
  // Segments in use: shared ones not retired, and dedicated ones.
  uint32_t segment_count() const {
    return static_cast<uint32_t>(shared_.size() - retired_ + dedicated_.size());
  }
  uint32_t dedicated_count() const { return static_cast<uint32_t>(dedicated_.size()); }
  // The indices of the segments in use, shared then dedicated.
  std::vector<uint32_t> segments_in_use() const;

  // The largest object a shared segment holds; larger ones get a segment of their own.
  uint64_t segment_size() const { return options_.segment_size; }
  // Bytes of segments in use (not retired, not kept), against the capacity.
  uint64_t mapped_bytes() const { return mapped_; }
  // Bytes of kept segments: allocated, but free for any object (given back on demand).
  uint64_t kept_bytes() const { return kept_bytes_; }
  uint32_t kept_count() const { return static_cast<uint32_t>(kept_.size()); }
  // Bytes of segments page-locked for GPU copies so far (see ArenaOptions::lock_pages).
  uint64_t page_locked_bytes() const { return page_locked_.load(std::memory_order_relaxed); }
  // "memfd" or the directory.
  std::string backend() const { return options_.dir.empty() ? "memfd" : options_.dir; }
  // The size of the pages segments are made of (of hugetlb memfds or a hugetlbfs directory:
  // the huge page size), and how the arena got them, or why not huge ones when asked.
  uint64_t page_bytes() const { return page_; }
  const std::string& page_note() const { return page_note_; }
  // Bytes reserved for an object of `size` bytes: rounded up to kAlignment. A zero-byte
  // object still takes one unit (the allocator gives every block a place of its own).
  static uint64_t ReservedSize(uint64_t size) {
    return std::max(kAlignment, (size + kAlignment - 1) / kAlignment * kAlignment);
  }

 private:
  struct Segment {
    uint32_t index = 0;
    bool retired = false;  // a shared segment whose pages were given back
    uint32_t writers = kNoWriters;
    uint32_t generation = 0;
    // Shared with replies that carry them (file()).
    std::shared_ptr<const ipc::UniqueFd> fd;
    std::shared_ptr<const ipc::UniqueFd> read_fd;  // the same file, opened read-only
    uint64_t size = 0;
    std::byte* base = nullptr;
    std::atomic<bool> page_locked{false};  // set by the worker that locked it
    std::atomic<bool> preparing{false};    // while PrepareSegment runs or is queued
    // On the loop: the bytes from the start whose pages a PrepareSegment was asked for, and
    // whether the job preparing it, if any, only allocates pages ahead of its objects
    // (PrefaultAhead), which Reassign may wait for.
    uint64_t prefaulted = 0;
    bool window_job = false;
    // A dedicated segment's pages allocated from its end by a worker (AllocateDedicated),
    // which stops when told, before the segment's pages are given back.
    struct Backfill {
      std::atomic<bool> stop{false};
      std::mutex mu;  // held by the worker around each fallocate
    };
    std::shared_ptr<Backfill> backfill;
    OffsetAllocator allocator;
    Segment(uint64_t bytes) : size(bytes), allocator(bytes, kAlignment) {}
  };

  Arena(const ArenaOptions& options, boost::asio::thread_pool& pool)
      : options_(options), prefault_pool_(pool) {}
  const Segment& at(uint32_t segment) const {
    return IsDedicated(segment) ? *dedicated_.at(segment) : *shared_[segment];
  }
  Segment& at(uint32_t segment) {
    return IsDedicated(segment) ? *dedicated_.at(segment) : *shared_[segment];
  }
  // A new file of `size` bytes named `name`, shared read-only, and the daemon's mapping of it.
  Result<std::unique_ptr<Segment>> MakeSegment(uint64_t size, const std::string& name);
  // A new file of `size` bytes named `name`, reserved, and its read-only twin.
  struct Files {
    ipc::UniqueFd fd;
    ipc::UniqueFd read_fd;
  };
  Result<Files> OpenFile(uint64_t size, const std::string& name);
  // Gives the empty shared `segment` of another class a new file for `writers`, mapped where
  // the old one was (see Writers above); false if it cannot.
  bool Reassign(Segment& segment, uint32_t writers);
  // Allocates in `segment` if it is the class's or unclaimed, claiming it.
  std::optional<Block> Carve(Segment& segment, uint64_t size, uint32_t writers);
  // Carve in the class's own shared segments, then in an unclaimed one.
  std::optional<Block> AllocateShared(uint64_t size, uint32_t writers);
  // Decides, at creation, how ArenaOptions::huge_pages is met (see there).
  void ChooseHugePages();
  // Adds a shared segment, reviving a retired one if there is one.
  Status AddSegment();
  Status Revive(Segment& segment);
  // Reserves a file's pages in --arena-dir or of huge pages, so a write never meets a missing
  // page (SIGBUS).
  Status Reserve(int fd, uint64_t size);
  // Whether no shared segment after `segment` is in use (not retired).
  bool LastInUse(uint32_t segment) const;
  // Adds a shared segment when the last one has started to fill, so the next one is warm in
  // time.
  void GrowAhead();
  // On a worker: allocates the pages of a memfd segment in [from, upto), then page-locks
  // the segment if asked to.
  void PrepareSegment(Segment& segment, uint64_t from, uint64_t upto);
  // Queues PrepareSegment for a segment just added, revived or given a new file, if there is
  // anything to prepare (a memfd's pages: the first kPrefaultAhead bytes, or all of them to
  // page-lock it; or page-locking); marks it preparing meanwhile.
  void SchedulePrepare(Segment& segment);
  // After an allocation of [offset, end) in a shared segment: queues the allocation of the
  // next kPrefaultAhead bytes (or end - offset, if more) past it, if the pages allocated
  // ahead of it run short.
  void PrefaultAhead(Segment& segment, uint64_t offset, uint64_t end);
  // Queues PrepareSegment up to `upto` from where the last one stopped.
  void Prepare(Segment& segment, uint64_t upto);
  // Whether shared segments' pages are allocated a window at a time (memfd segments,
  // pre-faulted, not page-locked), not whole or not at all.
  bool Windowed() const { return options_.prefault && !ReservedWhole() && !options_.lock_pages; }
  // Whether segments' files have their pages reserved whole when made (Reserve): in a
  // directory, which can run out of space, and of huge pages, whose pool can run out (a
  // mapping's reservation of huge pages is not given back by punching its pages out, so the
  // pages themselves are allocated, and punched out when a segment goes).
  bool ReservedWhole() const { return !options_.dir.empty() || hugetlb_; }
  // Undoes the page-locking of a segment about to lose its pages or its file, if it has any.
  void UnlockPages(Segment& segment);
  std::optional<Block> AllocateDedicated(uint64_t size, uint32_t writers);
  // Queues the allocation of a new dedicated segment's pages from its end (see above).
  void Backfill(Segment& segment);
  // Queues the allocation of the window of pages that ends at `end`, then of the next.
  void BackfillStep(std::shared_ptr<const ipc::UniqueFd> fd,
                    std::shared_ptr<Segment::Backfill> state, uint64_t end, uint32_t index);
  // Stops a segment's backfill, waiting for a fallocate under way (at most kPrefaultAhead
  // bytes' worth), so that pages given back after stay given back.
  static void StopBackfill(Segment& segment);
  // The kept segment of class `writers` that fits `bytes` best (see kKeptSlack), placed in
  // use with an object of `size` bytes; nullopt if none fits.
  std::optional<Block> Reuse(uint64_t size, uint64_t bytes, uint32_t writers);
  // Capacity that no segment holds, kept ones included: what a new file may take.
  uint64_t unclaimed() const { return options_.capacity - mapped_ - kept_bytes_; }
  // Gives back kept segments, least recently kept first, until `bytes` are unclaimed or none
  // is left; synchronously, so that a new file never takes memory beside them past the
  // capacity. Whether `bytes` are unclaimed.
  bool GiveBackKept(uint64_t bytes);
  // Gives back kept segment kept_[i]: its pages now (`now`), or on a worker.
  void DropKept(size_t i, bool now);
  // Gives back a segment no longer counted in the arena: its pages, mapping and files, now
  // (`now`) or on a worker.
  void GiveBack(std::unique_ptr<Segment> gone, bool now);
  // Whether `index` names a dedicated segment, in use or kept.
  bool DedicatedIndexTaken(uint32_t index) const;
  // Gives back kept segments, then retires empty shared segments, until `bytes` of capacity
  // are unclaimed; false if it cannot.
  bool FreeCapacity(uint64_t bytes);

  ArenaOptions options_;
  boost::asio::thread_pool& prefault_pool_;
  std::vector<std::unique_ptr<Segment>> shared_;
  uint32_t retired_ = 0;
  std::unordered_map<uint32_t, std::unique_ptr<Segment>> dedicated_;
  uint32_t next_dedicated_ = kFirstDedicated;
  std::vector<std::unique_ptr<Segment>> kept_;  // least recently kept first
  uint64_t kept_bytes_ = 0;
  uint64_t mapped_ = 0;
  uint64_t page_ = kPage;     // of the backing store: segments are whole pages
  bool hugetlb_ = false;      // memfds made with MFD_HUGETLB (ArenaOptions::huge_pages)
  bool advise_huge_ = false;  // segments' mappings advised MADV_HUGEPAGE (shmem THP)
  std::string page_note_;
  std::atomic<uint64_t> page_locked_{0};
};

}  // namespace depot::store
