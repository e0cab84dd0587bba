#include "store/arena.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysinfo.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/post.hpp>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "depot/ipc/units.h"
#include "store/read_only.h"

namespace depot::store {

namespace {

constexpr uint64_t kHugetlbfsMagic = 0x958458f6;

// Bytes the backing store can still provide, and the granularity of its pages.
Result<std::pair<uint64_t, uint64_t>> BackingSpace(const std::string& dir) {
  if (dir.empty()) {
    struct sysinfo si {};
    if (::sysinfo(&si) != 0) return Status::FromErrno("sysinfo", errno);
    return std::pair<uint64_t, uint64_t>{static_cast<uint64_t>(si.totalram) * si.mem_unit, 4096};
  }
  struct statfs fs {};
  if (::statfs(dir.c_str(), &fs) != 0) {
    return Status::InvalidArgument("cannot use --arena-dir " + dir + ": " + std::strerror(errno));
  }
  const uint64_t page = static_cast<uint64_t>(fs.f_type) == kHugetlbfsMagic ? fs.f_bsize : 4096;
  return std::pair<uint64_t, uint64_t>{static_cast<uint64_t>(fs.f_bavail) * fs.f_bsize, page};
}

}  // namespace

Result<std::unique_ptr<Arena>> Arena::Create(const ArenaOptions& options,
                                             boost::asio::thread_pool& prefault_pool) {
  ArenaOptions o = options;
  DEPOT_ASSIGN_OR_RETURN(auto space, BackingSpace(o.dir));
  const auto [available, page] = space;
  if (o.capacity < page) {
    return Status::InvalidArgument("--memory " + ipc::FormatSize(o.capacity) +
                                   " is too small: the arena needs at least one page (" +
                                   ipc::FormatSize(page) + ")");
  }
  if (o.capacity > available) {
    return Status::InvalidArgument("--memory " + ipc::FormatSize(o.capacity) + " is more than " +
                                   (o.dir.empty() ? std::string("this machine's memory") : o.dir) +
                                   " can hold (" + ipc::FormatSize(available) +
                                   (o.dir.empty() ? " in all" : " free") + ")");
  }
  if (o.segment_size == 0 || o.segment_size > o.capacity) o.segment_size = o.capacity;
  // Segments are whole pages (huge pages on hugetlbfs), so the tail of the last one is too.
  o.segment_size = std::max(page, o.segment_size / page * page);
  o.capacity = o.capacity / page * page;
  std::unique_ptr<Arena> arena(new Arena(o, prefault_pool));
  DEPOT_RETURN_NOT_OK(arena->AddSegment());
  return arena;
}

Arena::~Arena() {
  // Prefault jobs use the segments: wait for them before unlocking and unmapping.
  prefault_pool_.wait();
  for (auto& s : segments_) {
    if (s->base == nullptr) continue;
    if (s->page_locked.load(std::memory_order_acquire)) options_.unlock_pages(s->base);
    ::munmap(s->base, s->size);
  }
}

Status Arena::AddSegment() {
  const uint64_t size = std::min(options_.segment_size, options_.capacity - mapped_);
  if (size == 0) return Status::OutOfMemory("the arena is at its capacity");
  auto seg = std::make_unique<Segment>(size);
  seg->index = static_cast<uint32_t>(segments_.size());
  const std::string name = "depot-segment-" + std::to_string(seg->index);
  if (options_.dir.empty()) {
    seg->fd.reset(::memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
    if (!seg->fd) return Status::FromErrno("memfd_create", errno);
  } else {
    // An unlinked file: the descriptors keep it alive, nothing is left if the daemon dies.
    seg->fd.reset(::open(options_.dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600));
    if (!seg->fd) return Status::FromErrno("open O_TMPFILE in " + options_.dir, errno);
  }
  if (::ftruncate(seg->fd.get(), static_cast<off_t>(size)) != 0) {
    return Status::FromErrno("ftruncate of " + name, errno);
  }
  // Files in --arena-dir cannot be sealed (docs/architecture.md, Trust).
  DEPOT_ASSIGN_OR_RETURN(seg->read_fd,
                         ShareReadOnly(seg->fd.get(), name, /*resizable=*/!options_.dir.empty()));
  if (!options_.dir.empty()) {
    // A directory can run out of space under us: reserve the pages now, so a client's write
    // can never meet a missing page (SIGBUS).
    if (::fallocate(seg->fd.get(), 0, 0, static_cast<off_t>(size)) != 0) {
      return Status::OutOfMemory("cannot reserve " + ipc::FormatSize(size) + " in " + options_.dir +
                                 ": " + std::strerror(errno));
    }
  }
  void* base = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, seg->fd.get(), 0);
  if (base == MAP_FAILED) return Status::FromErrno("mmap of " + name, errno);
  seg->base = static_cast<std::byte*>(base);
  if (options_.dir.empty() || options_.lock_pages) {
    // The segment stays where it is (segments_ holds unique_ptrs), and the destructor waits
    // for this job.
    boost::asio::post(prefault_pool_, [this, segment = seg.get()] { PrepareSegment(*segment); });
  }
  spdlog::info("arena: added segment {} ({}, {})", seg->index, ipc::FormatSize(size), backend());
  mapped_ += size;
  segments_.push_back(std::move(seg));
  return Status::OK();
}

void Arena::PrepareSegment(Segment& segment) {
  if (options_.dir.empty() &&
      ::fallocate(segment.fd.get(), 0, 0, static_cast<off_t>(segment.size)) != 0) {
    // Not fatal: pages are then allocated as they are first written.
    spdlog::warn("could not pre-allocate segment {}: {}", segment.index, std::strerror(errno));
  }
  if (!options_.lock_pages) return;
  const auto start = std::chrono::steady_clock::now();
  if (Status st = options_.lock_pages(segment.base, segment.size); !st.ok()) {
    // Not fatal either: copies to and from GPUs then go through the driver's staging buffers.
    spdlog::warn("arena: segment {} is not page-locked, so GPU copies from it are slower: {}",
                 segment.index, st.message());
    return;
  }
  segment.page_locked.store(true, std::memory_order_release);
  page_locked_.fetch_add(segment.size, std::memory_order_relaxed);
  spdlog::info(
      "arena: page-locked segment {} ({}) for GPU copies in {:.1f} ms", segment.index,
      ipc::FormatSize(segment.size),
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
}

void Arena::GrowAhead() {
  if (mapped_ >= options_.capacity) return;
  if (segments_.back()->allocator.live_allocations() == 0) return;
  Status st = AddSegment();
  if (!st.ok()) spdlog::warn("arena: could not add a segment ahead of demand: {}", st.ToString());
}

std::optional<Arena::Block> Arena::AllocateIn(uint32_t segment, uint64_t size) {
  auto a =
      segments_[segment]->allocator.Allocate(size, size >= kPageAlignFrom ? kPage : kAlignment);
  if (!a) return std::nullopt;
  return Block{segment, a->handle, a->offset, a->size};
}

std::optional<Arena::Block> Arena::Allocate(uint64_t size) {
  if (ReservedSize(size) > options_.segment_size) return std::nullopt;
  for (uint32_t i = 0; i < segments_.size(); ++i) {
    if (auto b = AllocateIn(i, size)) {
      if (i + 1 == segments_.size()) GrowAhead();
      return b;
    }
  }
  while (mapped_ < options_.capacity) {
    if (!AddSegment().ok()) return std::nullopt;
    if (auto b = AllocateIn(segment_count() - 1, size)) {
      GrowAhead();
      return b;
    }
  }
  return std::nullopt;
}

void Arena::Free(uint32_t segment, uint32_t handle) { segments_[segment]->allocator.Free(handle); }

uint64_t Arena::used_bytes() const {
  uint64_t used = 0;
  for (const auto& s : segments_) used += s->allocator.used_bytes();
  return used;
}

uint64_t Arena::largest_free_block() const {
  uint64_t largest = options_.capacity - mapped_ >= options_.segment_size
                         ? options_.segment_size
                         : options_.capacity - mapped_;
  for (const auto& s : segments_) largest = std::max(largest, s->allocator.largest_free_block());
  return largest;
}

}  // namespace depot::store
