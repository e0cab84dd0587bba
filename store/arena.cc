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
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "depot/ipc/units.h"
#include "store/read_only.h"

namespace depot::store {

namespace {

constexpr uint64_t kHugetlbfsMagic = 0x958458f6;

// Punches out a file's pages: they go now, whoever maps it (a mapping reads zeros after).
// Logs a failure, and says whether it worked.
bool GiveBackPages(int fd, uint64_t size, uint32_t segment) {
  if (::fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, static_cast<off_t>(size)) !=
      0) {
    spdlog::warn("arena: cannot give back the pages of segment {}: {}", segment,
                 std::strerror(errno));
    return false;
  }
  return true;
}

std::string DescribeWriters(uint32_t writers) {
  if (writers == Arena::kTrustedWriters) return "the daemon's uid";
  if (writers == Arena::kNoWriters) return "nobody";
  return "uid " + std::to_string(writers);
}

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
  const bool hugetlbfs = static_cast<uint64_t>(fs.f_type) == kHugetlbfsMagic;
  const uint64_t page = hugetlbfs ? fs.f_bsize : 4096;
  if (hugetlbfs && fs.f_blocks == 0) {
    // A hugetlbfs mount without size=: what it can hold is the host's free pool of its
    // page size.
    std::ifstream pool("/sys/kernel/mm/hugepages/hugepages-" + std::to_string(page / 1024) +
                       "kB/free_hugepages");
    uint64_t free_pages = 0;
    pool >> free_pages;
    return std::pair<uint64_t, uint64_t>{free_pages * page, page};
  }
  return std::pair<uint64_t, uint64_t>{static_cast<uint64_t>(fs.f_bavail) * fs.f_bsize, page};
}

// The host's huge pages, from /proc/meminfo: their size in bytes (0 if the kernel has none)
// and how many are free and not reserved by some process's mappings.
struct HugePagePool {
  uint64_t page = 0;
  uint64_t free_pages = 0;
};
HugePagePool HugePages() {
  std::ifstream meminfo("/proc/meminfo");
  uint64_t free_pages = 0, reserved = 0, size_kib = 0;
  for (std::string name; meminfo >> name;) {
    uint64_t value = 0;
    meminfo >> value;
    if (name == "HugePages_Free:") free_pages = value;
    if (name == "HugePages_Rsvd:") reserved = value;
    if (name == "Hugepagesize:") size_kib = value;
    meminfo.ignore(256, '\n');
  }
  return {size_kib * 1024, free_pages - std::min(free_pages, reserved)};
}

// The kernel's policy for transparent huge pages in shared memory: the bracketed word of
// /sys/kernel/mm/transparent_hugepage/shmem_enabled, or "" where there is none.
std::string ShmemHugePolicy() {
  std::ifstream file("/sys/kernel/mm/transparent_hugepage/shmem_enabled");
  std::string line;
  std::getline(file, line);
  const size_t open = line.find('['), close = line.find(']');
  return open == std::string::npos || close == std::string::npos
             ? std::string()
             : line.substr(open + 1, close - open - 1);
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
  if (const uint64_t least = (o.capacity + kMaxSharedSegments - 1) / kMaxSharedSegments;
      o.segment_size < least) {
    const uint64_t raised = (least + page - 1) / page * page;
    spdlog::warn(
        "arena: segments of {} would make more than {} of them in {}; using segments of {}",
        ipc::FormatSize(o.segment_size), kMaxSharedSegments, ipc::FormatSize(o.capacity),
        ipc::FormatSize(raised));
    o.segment_size = raised;
  }
  std::unique_ptr<Arena> arena(new Arena(o, prefault_pool));
  arena->page_ = page;
  arena->page_note_ = page == kPage ? "4 KiB pages" : ipc::FormatSize(page) + " pages (hugetlbfs)";
  if (const std::string policy = ShmemHugePolicy();
      o.dir.empty() && (policy == "always" || policy == "force")) {
    arena->page_note_ +=
        ", and huge ones where the kernel gives them (shmem_enabled=" + policy + ")";
  }
  if (o.huge_pages) arena->ChooseHugePages();
  DEPOT_RETURN_NOT_OK(arena->AddSegment());
  return arena;
}

void Arena::ChooseHugePages() {
  if (!options_.dir.empty()) {
    if (page_ == kPage) {
      page_note_ = "4 KiB pages: --huge-pages, but " + options_.dir +
                   " is not a hugetlbfs mount (its file system decides)";
    }
    return;
  }
  const auto [huge, free_pages] = HugePages();
  const uint64_t needed = huge == 0 ? 0 : (options_.capacity + huge - 1) / huge;
  if (huge > kPage && options_.capacity >= huge && free_pages >= needed) {
    // Whole huge pages: segments, and the capacity, are multiples of them.
    page_ = huge;
    options_.capacity = options_.capacity / huge * huge;
    options_.segment_size = std::max(huge, (options_.segment_size + huge - 1) / huge * huge);
    hugetlb_ = true;
    page_note_ = ipc::FormatSize(huge) + " pages (hugetlb: " + std::to_string(needed) + " of " +
                 std::to_string(free_pages) + " reserved pages free)";
    spdlog::info("arena: segments of {}", page_note_);
    return;
  }
  const std::string reserved = huge == 0 ? "the kernel has no huge pages"
                                         : std::to_string(free_pages) + " reserved huge pages of " +
                                               ipc::FormatSize(huge) + " free, " +
                                               std::to_string(needed) + " needed (vm.nr_hugepages)";
  const std::string policy = ShmemHugePolicy();
  if (policy == "always" || policy == "within_size" || policy == "advise" || policy == "force") {
    advise_huge_ = true;
    page_note_ =
        "4 KiB pages, and huge ones where the kernel gives them (transparent huge pages, "
        "shmem_enabled=" +
        policy + "; " + reserved + ")";
  } else {
    page_note_ = "4 KiB pages: --huge-pages, but " + reserved +
                 ", and transparent huge pages in shared memory are off (shmem_enabled=" +
                 (policy.empty() ? std::string("absent") : policy) + ")";
  }
  spdlog::warn("arena: {}", page_note_);
}

Arena::~Arena() {
  // Prefault jobs use the segments: wait for them before unlocking and unmapping, with the
  // backfills (which post their next steps) told to stop.
  for (auto& [index, s] : dedicated_) {
    if (s->backfill) s->backfill->stop.store(true, std::memory_order_relaxed);
  }
  for (auto& s : kept_) {
    if (s->backfill) s->backfill->stop.store(true, std::memory_order_relaxed);
  }
  prefault_pool_.wait();
  for (auto& s : shared_) {
    if (s->base == nullptr) continue;
    if (s->page_locked.load(std::memory_order_acquire)) options_.unlock_pages(s->base);
    ::munmap(s->base, s->size);
  }
  for (auto& [index, s] : dedicated_) ::munmap(s->base, s->size);
  for (auto& s : kept_) ::munmap(s->base, s->size);
}

Result<Arena::Files> Arena::OpenFile(uint64_t size, const std::string& name) {
  Files files;
  if (options_.dir.empty()) {
    files.fd.reset(::memfd_create(name.c_str(),
                                  MFD_CLOEXEC | MFD_ALLOW_SEALING | (hugetlb_ ? MFD_HUGETLB : 0)));
    if (!files.fd) return Status::FromErrno("memfd_create", errno);
  } else {
    // An unlinked file: the descriptors keep it alive, nothing is left if the daemon dies.
    files.fd.reset(::open(options_.dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600));
    if (!files.fd) return Status::FromErrno("open O_TMPFILE in " + options_.dir, errno);
  }
  if (::ftruncate(files.fd.get(), static_cast<off_t>(size)) != 0) {
    return Status::FromErrno("ftruncate of " + name, errno);
  }
  // Files in --arena-dir cannot be sealed (docs/architecture.md, Trust).
  DEPOT_ASSIGN_OR_RETURN(files.read_fd,
                         ShareReadOnly(files.fd.get(), name, /*resizable=*/!options_.dir.empty()));
  DEPOT_RETURN_NOT_OK(Reserve(files.fd.get(), size));
  return files;
}

Result<std::unique_ptr<Arena::Segment>> Arena::MakeSegment(uint64_t size, const std::string& name) {
  auto seg = std::make_unique<Segment>(size);
  DEPOT_ASSIGN_OR_RETURN(Files files, OpenFile(size, name));
  seg->fd = std::make_shared<const ipc::UniqueFd>(std::move(files.fd));
  seg->read_fd = std::make_shared<const ipc::UniqueFd>(std::move(files.read_fd));
  void* base = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, seg->fd->get(), 0);
  if (base == MAP_FAILED) {
    // Of a hugetlb memfd: mmap reserves its huge pages, which other processes may have taken
    // since start-up.
    return hugetlb_ && errno == ENOMEM
               ? Status::OutOfMemory("no free huge pages for " + ipc::FormatSize(size) + " (" +
                                     name + "; vm.nr_hugepages)")
               : Status::FromErrno("mmap of " + name, errno);
  }
  if (advise_huge_) (void)::madvise(base, size, MADV_HUGEPAGE);
  seg->base = static_cast<std::byte*>(base);
  return seg;
}

Status Arena::Reserve(int fd, uint64_t size) {
  if (!ReservedWhole()) return Status::OK();
  // A directory, or the pool of huge pages, can run out under us: reserve the pages now, so
  // a client's write can never meet a missing page (SIGBUS).
  if (::fallocate(fd, 0, 0, static_cast<off_t>(size)) != 0) {
    return Status::OutOfMemory(
        "cannot reserve " + ipc::FormatSize(size) + " in " +
        (options_.dir.empty() ? std::string("huge pages (vm.nr_hugepages)") : options_.dir) + ": " +
        std::strerror(errno));
  }
  return Status::OK();
}

bool Arena::Reassign(Segment& s, uint32_t writers) {
  // A job still preparing the segment uses its file and mapping. One that allocates pages
  // ahead of the segment's objects (PrefaultAhead) is waited for, on the loop: at most a
  // window's fallocate, as a segment in use often has one running. One preparing a new file
  // (the whole segment's, to page-lock it, which a writer emptying segments could repeat) is
  // not: the segment is not given away this time.
  if (!can_change_hands(s.index)) return false;
  s.preparing.wait(true, std::memory_order_acquire);
  UnlockPages(s);
  // In a directory the old file's pages go first (it holds no object), so that the new
  // file's reservation finds room.
  const bool in_dir = !options_.dir.empty(), reserved = ReservedWhole();
  if (reserved) GiveBackPages(s.fd->get(), s.size, s.index);
  // If the new file cannot be had, the segment stays as it was.
  const auto keep = [&](const std::string& why) {
    spdlog::warn("arena: cannot give segment {} a new file: {}", s.index, why);
    if (reserved && !Reserve(s.fd->get(), s.size).ok()) {
      // Its pages could not be reserved again: retired, so that Revive reserves them first.
      s.retired = true;
      retired_++;
      mapped_ -= s.size;
      return false;
    }
    SchedulePrepare(s);
    return false;
  };
  auto files = OpenFile(s.size, "depot-segment-" + std::to_string(s.index));
  if (!files.ok()) return keep(files.status().ToString());
  // The new file replaces the old one at the same address, so no pointer the daemon keeps
  // into the segment (there are none into an empty one) could dangle.
  if (::mmap(s.base, s.size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, files->fd.get(), 0) ==
      MAP_FAILED) {
    const int error = errno;
    if (::mmap(s.base, s.size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, s.fd->get(), 0) ==
        MAP_FAILED) {
      spdlog::critical("arena: segment {} is no longer mapped (mmap: {}, then {})", s.index,
                       std::strerror(error), std::strerror(errno));
      std::abort();
    }
    // The new file goes first, and its reservation with it.
    files->fd = ipc::UniqueFd();
    files->read_fd = ipc::UniqueFd();
    return keep(std::string("mmap: ") + std::strerror(error));
  }
  if (advise_huge_) (void)::madvise(s.base, s.size, MADV_HUGEPAGE);
  std::shared_ptr<const ipc::UniqueFd> old = std::move(s.fd);
  s.fd = std::make_shared<const ipc::UniqueFd>(std::move(files->fd));
  s.read_fd = std::make_shared<const ipc::UniqueFd>(std::move(files->read_fd));
  spdlog::info("arena: segment {} ({}) has a new file, for objects of {} instead of {}", s.index,
               ipc::FormatSize(s.size), DescribeWriters(writers), DescribeWriters(s.writers));
  s.writers = writers;
  s.generation++;
  // The old file goes on a worker: its pages given back, whoever still maps it (a client of
  // the previous class may, writable), and in a directory its size too, so that such a
  // mapping cannot fill the directory again.
  boost::asio::post(prefault_pool_, [old = std::move(old), size = s.size, index = s.index, in_dir,
                                     reserved] {
    if (!reserved) GiveBackPages(old->get(), size, index);
    if (in_dir && ::ftruncate(old->get(), 0) != 0) {
      spdlog::warn("arena: cannot truncate segment {}'s old file: {}", index, std::strerror(errno));
    }
  });
  SchedulePrepare(s);
  return true;
}

Status Arena::AddSegment() {
  for (auto& s : shared_) {
    if (s->retired && s->size <= options_.capacity - mapped_) return Revive(*s);
  }
  const uint64_t size = std::min(options_.segment_size, options_.capacity - mapped_);
  // A new segment beside retired ones too large for the capacity left, up to the bound on
  // shared segments (each may go with a reply as a descriptor).
  if (size == 0 || shared_.size() >= kMaxSharedSegments) {
    return Status::OutOfMemory("the arena is at its capacity");
  }
  GiveBackKept(size);
  const auto index = static_cast<uint32_t>(shared_.size());
  DEPOT_ASSIGN_OR_RETURN(auto seg, MakeSegment(size, "depot-segment-" + std::to_string(index)));
  seg->index = index;
  SchedulePrepare(*seg);
  spdlog::info("arena: added segment {} ({}, {})", seg->index, ipc::FormatSize(size), backend());
  mapped_ += size;
  shared_.push_back(std::move(seg));
  return Status::OK();
}

Status Arena::Revive(Segment& segment) {
  if (segment.size > options_.capacity - mapped_) {
    return Status::OutOfMemory("the arena is at its capacity");
  }
  GiveBackKept(segment.size);
  DEPOT_RETURN_NOT_OK(Reserve(segment.fd->get(), segment.size));
  segment.retired = false;
  retired_--;
  mapped_ += segment.size;
  SchedulePrepare(segment);
  spdlog::info("arena: revived segment {} ({})", segment.index, ipc::FormatSize(segment.size));
  return Status::OK();
}

bool Arena::GiveBackKept(uint64_t bytes) {
  while (unclaimed() < bytes && !kept_.empty()) DropKept(0, /*now=*/true);
  return unclaimed() >= bytes;
}

void Arena::DropKept(size_t i, bool now) {
  std::unique_ptr<Segment> gone = std::move(kept_[i]);
  kept_.erase(kept_.begin() + static_cast<std::ptrdiff_t>(i));
  kept_bytes_ -= gone->size;
  spdlog::debug("arena: gave back kept segment {} ({})", gone->index, ipc::FormatSize(gone->size));
  GiveBack(std::move(gone), now);
}

void Arena::GiveBack(std::unique_ptr<Segment> gone, bool now) {
  // The hole punched first frees the pages whoever maps them: a client that kept its
  // mapping cannot keep them alive outside the capacity (the mapping reads zeros after). In
  // a directory the file is truncated too, so that such a writable mapping cannot fill the
  // directory again.
  auto give_back = [gone = std::move(gone), in_dir = !options_.dir.empty()] {
    StopBackfill(*gone);
    GiveBackPages(gone->fd->get(), gone->size, gone->index);
    if (in_dir && ::ftruncate(gone->fd->get(), 0) != 0) {
      spdlog::warn("arena: cannot truncate the file of segment {}: {}", gone->index,
                   std::strerror(errno));
    }
    ::munmap(gone->base, gone->size);
  };
  if (now) {
    give_back();
  } else {
    // About 0.13 s per GiB: on a worker, off the loop.
    boost::asio::post(prefault_pool_, std::move(give_back));
  }
}

bool Arena::FreeCapacity(uint64_t bytes) {
  // Nothing is given back unless kept and empty segments are enough.
  uint64_t could = options_.capacity - mapped_;
  for (const auto& s : shared_) {
    if (!s->retired && s->allocator.live_allocations() == 0) could += s->size;
  }
  if (could < bytes) return false;
  if (GiveBackKept(bytes)) return true;
  for (auto& s : shared_) {
    if (unclaimed() >= bytes) break;
    if (s->retired || s->allocator.live_allocations() != 0) continue;
    // Synchronous, on the loop, as the capacity must be free before the dedicated segment
    // takes it: about 0.13 s per GiB on tmpfs, paid only when a dedicated segment needs
    // capacity that shared segments hold. A segment still being prepared (the one added
    // ahead of demand, typically) is waited for first, or its job would allocate the pages
    // again: at most its fallocate, of a window (kPrefaultAhead) or, to page-lock it, of the
    // whole segment (about 0.23 s per GiB). Prefault jobs never wait for the loop, so this
    // cannot deadlock.
    s->preparing.wait(true, std::memory_order_acquire);
    UnlockPages(*s);
    if (!GiveBackPages(s->fd->get(), s->size, s->index)) continue;
    s->retired = true;
    retired_++;
    mapped_ -= s->size;
    spdlog::info("arena: retired empty segment {} ({}) for a larger object", s->index,
                 ipc::FormatSize(s->size));
  }
  return unclaimed() >= bytes;
}

bool Arena::DedicatedIndexTaken(uint32_t index) const {
  return dedicated_.contains(index) ||
         std::ranges::any_of(kept_, [index](const auto& s) { return s->index == index; });
}

std::optional<Arena::Block> Arena::Reuse(uint64_t size, uint64_t bytes, uint32_t writers) {
  std::optional<size_t> best;
  for (size_t i = 0; i < kept_.size(); ++i) {
    const Segment& s = *kept_[i];
    if (s.writers != writers || s.size < bytes || s.size - bytes > bytes / kKeptSlack) continue;
    if (!best || s.size < kept_[*best]->size) best = i;
  }
  if (!best) return std::nullopt;
  auto a = kept_[*best]->allocator.Allocate(size, kPage);
  if (!a) return std::nullopt;  // cannot happen: the segment is empty and large enough
  std::unique_ptr<Segment> seg = std::move(kept_[*best]);
  kept_.erase(kept_.begin() + static_cast<std::ptrdiff_t>(*best));
  kept_bytes_ -= seg->size;
  mapped_ += seg->size;
  const uint32_t index = seg->index;
  spdlog::debug("arena: reused kept segment {} ({}) for one object", index,
                ipc::FormatSize(seg->size));
  dedicated_.emplace(index, std::move(seg));
  return Block{index, a->handle, a->offset, a->size};
}

std::optional<Arena::Block> Arena::AllocateDedicated(uint64_t size, uint32_t writers) {
  // Whole pages of the backing store (huge pages on hugetlbfs, which refuses other sizes).
  const uint64_t bytes = (ReservedSize(size) + page_ - 1) / page_ * page_;
  if (bytes > options_.capacity) return std::nullopt;
  if (auto reused = Reuse(size, bytes, writers)) return reused;
  if (!FreeCapacity(bytes)) return std::nullopt;
  uint32_t index = next_dedicated_;
  while (DedicatedIndexTaken(index)) index = index == UINT32_MAX ? kFirstDedicated : index + 1;
  auto made = MakeSegment(bytes, "depot-object-" + std::to_string(index - kFirstDedicated));
  if (!made.ok()) {
    spdlog::warn("arena: cannot make a segment of {} for one object: {}", ipc::FormatSize(bytes),
                 made.status().ToString());
    return std::nullopt;
  }
  next_dedicated_ = index == UINT32_MAX ? kFirstDedicated : index + 1;
  std::unique_ptr<Segment> seg = std::move(made).value();
  seg->index = index;
  seg->writers = writers;
  auto a = seg->allocator.Allocate(size, kPage);
  if (!a) {  // cannot happen: the segment is the object's size
    ::munmap(seg->base, seg->size);
    return std::nullopt;
  }
  mapped_ += bytes;
  spdlog::debug("arena: added segment {} ({}) for one object", index, ipc::FormatSize(bytes));
  Backfill(*seg);
  dedicated_.emplace(index, std::move(seg));
  return Block{index, a->handle, a->offset, a->size};
}

void Arena::Backfill(Segment& segment) {
  if (ReservedWhole() || !options_.prefault) return;
  segment.backfill = std::make_shared<Segment::Backfill>();
  BackfillStep(segment.fd, segment.backfill, segment.size, segment.index);
}

void Arena::BackfillStep(std::shared_ptr<const ipc::UniqueFd> fd,
                         std::shared_ptr<Segment::Backfill> state, uint64_t end, uint32_t index) {
  // One window a job, each posting the next: the pool's threads (few, and shared with
  // pre-faulting, spills and checksums) are never held for a whole large object.
  boost::asio::post(
      prefault_pool_, [this, fd = std::move(fd), state = std::move(state), end, index]() mutable {
        std::lock_guard lock(state->mu);
        if (state->stop.load(std::memory_order_relaxed)) return;
        const uint64_t begin = end > kPrefaultAhead ? end - kPrefaultAhead : 0;
        // Pages the writer allocated already are skipped; a failure is not fatal either: the
        // writer then allocates what is left.
        if (::fallocate(fd->get(), 0, static_cast<off_t>(begin), static_cast<off_t>(end - begin)) !=
            0) {
          spdlog::debug("arena: cannot allocate segment {}'s pages ahead: {}", index,
                        std::strerror(errno));
          return;
        }
        if (begin > 0) BackfillStep(std::move(fd), std::move(state), begin, index);
      });
}

void Arena::StopBackfill(Segment& segment) {
  if (!segment.backfill) return;
  segment.backfill->stop.store(true, std::memory_order_relaxed);
  std::lock_guard wait(segment.backfill->mu);
}

void Arena::SchedulePrepare(Segment& segment) {
  segment.prefaulted = 0;  // a new, revived or reassigned file: no page allocated yet
  // memfd segments are allocated here (unless !prefault), those reserved whole at creation.
  if (ReservedWhole() ? !options_.lock_pages : !options_.prefault) return;
  // Page-locking needs every page; else the first kPrefaultAhead bytes are enough for now.
  segment.window_job = false;
  Prepare(segment, Windowed() ? std::min(segment.size, kPrefaultAhead) : segment.size);
}

void Arena::PrefaultAhead(Segment& segment, uint64_t offset, uint64_t end) {
  // Only for shared memfd segments allocated a window at a time (SchedulePrepare allocated
  // the others whole, or not at all), when the window left is half gone, and not while a
  // job still allocates: the next allocation asks again. The window is kPrefaultAhead, or
  // the size of the object just placed if larger, so that the next one like it finds its
  // pages allocated.
  const uint64_t window = std::max(kPrefaultAhead, end - offset);
  if (IsDedicated(segment.index) || !Windowed() || segment.prefaulted >= segment.size ||
      end + window / 2 <= segment.prefaulted || segment.preparing.load(std::memory_order_acquire)) {
    return;
  }
  segment.window_job = true;
  Prepare(segment, std::min(segment.size, end + window));
}

void Arena::Prepare(Segment& segment, uint64_t upto) {
  const uint64_t from = std::min(segment.prefaulted, upto);
  segment.prefaulted = upto;
  // The segment stays where it is (held by a unique_ptr), and the destructor waits for this
  // job.
  segment.preparing.store(true, std::memory_order_relaxed);
  boost::asio::post(prefault_pool_,
                    [this, s = &segment, from, upto] { PrepareSegment(*s, from, upto); });
}

void Arena::UnlockPages(Segment& segment) {
  if (segment.page_locked.exchange(false, std::memory_order_acq_rel)) {
    options_.unlock_pages(segment.base);
    page_locked_.fetch_sub(segment.size, std::memory_order_relaxed);
  }
}

void Arena::PrepareSegment(Segment& segment, uint64_t from, uint64_t upto) {
  struct Done {
    std::atomic<bool>& preparing;
    ~Done() {
      preparing.store(false, std::memory_order_release);
      preparing.notify_all();
    }
  } done{segment.preparing};
  if (!ReservedWhole() && upto > from &&
      ::fallocate(segment.fd->get(), 0, static_cast<off_t>(from),
                  static_cast<off_t>(upto - from)) != 0) {
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

bool Arena::LastInUse(uint32_t segment) const {
  for (uint32_t i = segment + 1; i < shared_.size(); ++i) {
    if (!shared_[i]->retired) return false;
  }
  return true;
}

void Arena::GrowAhead() {
  // Not at the expense of kept segments: this segment is only ahead of demand.
  if (unclaimed() < std::min(options_.segment_size, options_.capacity - mapped_) ||
      mapped_ >= options_.capacity) {
    return;
  }
  Status st = AddSegment();
  // Out of capacity is no news: a retired segment may not fit beside a dedicated one.
  if (!st.ok() && st.code() != StatusCode::kOutOfMemory)
    spdlog::warn("arena: could not add a segment ahead of demand: {}", st.ToString());
}

std::optional<Arena::Block> Arena::Carve(Segment& s, uint64_t size, uint32_t writers) {
  if (s.retired || (s.writers != writers && s.writers != kNoWriters)) return std::nullopt;
  auto a = s.allocator.Allocate(size, size >= kPageAlignFrom ? kPage : kAlignment);
  if (!a) return std::nullopt;
  s.writers = writers;
  PrefaultAhead(s, a->offset, a->offset + a->size);
  return Block{s.index, a->handle, a->offset, a->size};
}

std::optional<Arena::Block> Arena::AllocateIn(uint32_t segment, uint64_t size, uint32_t writers) {
  Segment& s = at(segment);
  if (auto b = Carve(s, size, writers)) return b;
  // An empty segment of another class, if it could hold the object.
  if (IsDedicated(segment) || s.retired || s.writers == writers || s.writers == kNoWriters ||
      s.allocator.live_allocations() != 0 || ReservedSize(size) > s.size || !Reassign(s, writers)) {
    return std::nullopt;
  }
  return Carve(s, size, writers);
}

std::optional<Arena::Block> Arena::AllocateShared(uint64_t size, uint32_t writers) {
  for (const uint32_t wanted : {writers, kNoWriters}) {
    for (auto& s : shared_) {
      if (s->writers != wanted) continue;
      if (auto b = Carve(*s, size, writers)) {
        if (LastInUse(s->index)) GrowAhead();
        return b;
      }
    }
  }
  return std::nullopt;
}

std::optional<Arena::Block> Arena::Allocate(uint64_t size, uint32_t writers) {
  if (ReservedSize(size) > options_.segment_size) return AllocateDedicated(size, writers);
  if (auto b = AllocateShared(size, writers)) return b;
  while (mapped_ < options_.capacity) {
    const uint64_t before = mapped_;
    if (!AddSegment().ok() || mapped_ == before) break;
    if (auto b = AllocateShared(size, writers)) return b;
  }
  // Last, an empty segment of another class (AllocateIn checks which can change hands).
  for (auto& s : shared_) {
    if (s->writers == writers || s->writers == kNoWriters) continue;
    if (auto b = AllocateIn(s->index, size, writers)) return b;
  }
  return std::nullopt;
}

void Arena::Free(uint32_t segment, uint32_t handle) {
  if (!IsDedicated(segment)) {
    shared_[segment]->allocator.Free(handle);
    return;
  }
  auto it = dedicated_.find(segment);
  std::unique_ptr<Segment> gone = std::move(it->second);
  dedicated_.erase(it);
  mapped_ -= gone->size;
  if (options_.keep_large) {
    gone->allocator.Free(handle);
    kept_bytes_ += gone->size;
    kept_.push_back(std::move(gone));
    if (kept_.size() > kMaxKept) DropKept(0, /*now=*/hugetlb_);
    return;
  }
  // Huge pages go back now: the pool is a fixed size, and the next file must find them.
  GiveBack(std::move(gone), /*now=*/hugetlb_);
}

std::vector<uint32_t> Arena::segments_in_use() const {
  std::vector<uint32_t> in_use;
  for (const auto& s : shared_) {
    if (!s->retired) in_use.push_back(s->index);
  }
  for (const auto& [index, s] : dedicated_) in_use.push_back(index);
  return in_use;
}

uint64_t Arena::used_bytes() const {
  uint64_t used = 0;
  for (const auto& s : shared_) used += s->allocator.used_bytes();
  for (const auto& [index, s] : dedicated_) used += s->size;
  return used;
}

uint64_t Arena::largest_free_block() const {
  uint64_t largest = options_.capacity - mapped_;
  for (const auto& s : shared_) {
    largest = std::max(largest, s->retired ? s->size : s->allocator.largest_free_block());
  }
  return largest;
}

}  // namespace depot::store
