#include "store/read_windows.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "store/disk_pool.h"
#include "store/spill_io.h"

namespace depot::store {

namespace {
constexpr size_t kSequences = 8;

// Where the block of `bytes` at `at` (page-aligned) ends.
uint64_t BlockEnd(uint64_t at, uint64_t bytes) { return at + DiskPool::RoundUp(bytes); }
}  // namespace

ReadWindows::Window* ReadWindows::Find(uint32_t file, uint64_t at, uint64_t bytes) {
  for (Window& w : windows_) {
    if (w.file == file && w.start <= at && at + bytes <= w.start + w.bytes) return &w;
  }
  return nullptr;
}

bool ReadWindows::ReadsOn(uint32_t file, uint64_t at, uint64_t end) {
  auto seq = std::ranges::find(sequences_, file, &Sequence::file);
  if (seq == sequences_.end()) {
    if (sequences_.size() == kSequences) sequences_.erase(sequences_.begin());
    seq = sequences_.insert(sequences_.end(), {.file = file, .end = end});
    return false;
  }
  const bool on = seq->end == at;
  seq->end = end;
  return on;
}

uint64_t ReadWindows::WindowBytes(uint64_t at, uint64_t file_size, uint64_t least) {
  const uint64_t bytes = at < file_size ? std::min(kWindow, file_size - at) : 0;
  return std::max(bytes / DiskPool::kAlignment * DiskPool::kAlignment, least);
}

std::shared_ptr<const std::byte[]> ReadWindows::ReadWindow(uint32_t file, int direct,
                                                           uint64_t start, uint64_t bytes,
                                                           uint64_t invalidations) {
  std::shared_ptr<std::byte[]> data(
      static_cast<std::byte*>(std::aligned_alloc(DiskPool::kAlignment, bytes)), &std::free);
  if (data == nullptr || !ReadAll(direct, data.get(), bytes, start).ok()) return nullptr;
  std::lock_guard lock(mu_);
  reads_++;
  // Kept only if no write to the spill files was invalidating windows meanwhile: the bytes of
  // blocks that were free may be from before it.
  if (!InvalidatedSince(invalidations, file, start, bytes)) {
    Window made{.file = file, .start = start, .bytes = bytes, .data = data, .used = ++uses_};
    if (windows_.size() < kWindows) {
      windows_.push_back(std::move(made));
    } else {
      *std::ranges::min_element(windows_, {}, &Window::used) = std::move(made);
    }
  }
  return data;
}

bool ReadWindows::Copy(uint32_t file, int direct, std::byte* to, uint64_t bytes, uint64_t at,
                       uint64_t file_size) {
  std::shared_ptr<const std::byte[]> data;
  uint64_t start = 0;
  {
    std::lock_guard lock(mu_);
    Window* w = Find(file, at, bytes);
    if (w == nullptr) return false;
    const uint64_t end = BlockEnd(at, bytes);
    const bool reads_on = ReadsOn(file, at, end);
    w->used = ++uses_;
    hits_++;
    data = w->data;
    start = w->start;
    // Reading on: the next window is read ahead, unless it is here or asked for already.
    const uint64_t next = w->start + w->bytes;
    const auto asked = [&](const std::optional<Ahead>& a) {
      return a && a->file == file && a->start == next;
    };
    if (reads_on && direct >= 0 && next < file_size && !asked(ahead_) && !asked(reading_ahead_) &&
        Find(file, next, 1) == nullptr) {
      ahead_ = Ahead{.file = file, .start = next, .invalidations = invalidations_};
    }
  }
  // The copy outside the lock: the window's bytes stay while `data` holds them.
  std::memcpy(to, data.get() + (at - start), bytes);
  return true;
}

bool ReadWindows::InvalidatedSince(uint64_t since, uint32_t file, uint64_t start,
                                   uint64_t bytes) const {
  if (since == invalidations_) return false;
  // Older than the log: whatever it was, assume it was here.
  if (log_.empty() || log_.front().seq > since + 1) return true;
  return std::ranges::any_of(log_, [&](const Invalidation& i) {
    return i.seq > since && i.file == file && i.start < start + bytes && start < i.end;
  });
}

bool ReadWindows::WaitForAhead(uint32_t file, uint64_t at) {
  std::unique_lock lock(mu_);
  const auto reading = [&] {
    return reading_ahead_ && reading_ahead_->file == file && reading_ahead_->start <= at &&
           at < reading_ahead_->start + kWindow;
  };
  if (!reading()) return false;
  ahead_read_.wait_for(lock, kAheadWait, [&] { return !reading(); });
  return true;
}

bool ReadWindows::Overlaps(uint32_t file, uint64_t at, uint64_t end) const {
  const auto overlaps = [&](uint64_t start, uint64_t bytes) {
    return start < end && at < start + bytes;
  };
  return std::ranges::any_of(
             windows_,
             [&](const Window& w) { return w.file == file && overlaps(w.start, w.bytes); }) ||
         (reading_ahead_ && reading_ahead_->file == file &&
          overlaps(reading_ahead_->start, kWindow));
}

Status ReadWindows::Read(uint32_t file, int fd, int direct, std::byte* to, uint64_t bytes,
                         uint64_t at, uint64_t file_size) {
  if (Copy(file, direct, to, bytes, at, file_size)) return Status::OK();
  if (WaitForAhead(file, at) && Copy(file, direct, to, bytes, at, file_size)) return Status::OK();
  bool reads_on = false;
  uint64_t invalidations = 0;
  {
    std::lock_guard lock(mu_);
    reads_on = ReadsOn(file, at, BlockEnd(at, bytes));
    invalidations = invalidations_;
    // Partly in a window, or in one being read ahead (which took too long): this object
    // alone, the next ones from that window.
    if (Overlaps(file, at, BlockEnd(at, bytes))) reads_on = false;
  }
  if (reads_on && direct >= 0) {
    // A window from `at` (if its direct read fails, the buffered read below: a real I/O
    // error fails that too).
    const uint64_t window = WindowBytes(at, file_size, BlockEnd(at, bytes) - at);
    if (at + window <= file_size) {
      if (auto data = ReadWindow(file, direct, at, window, invalidations)) {
        std::memcpy(to, data.get(), bytes);
        return Status::OK();
      }
    }
  }
  {
    std::lock_guard lock(mu_);
    reads_++;
  }
  DEPOT_RETURN_NOT_OK(ReadAll(fd, to, bytes, at));
  if (direct >= 0) DropCached(fd, at, bytes);
  return Status::OK();
}

std::optional<ReadWindows::Ahead> ReadWindows::TakeAhead() {
  std::lock_guard lock(mu_);
  if (!ahead_ || reading_ahead_) return std::nullopt;
  reading_ahead_ = std::exchange(ahead_, std::nullopt);
  return reading_ahead_;
}

void ReadWindows::ReadAhead(const Ahead& ahead, int direct, uint64_t file_size) {
  const uint64_t bytes = WindowBytes(ahead.start, file_size, 0);
  if (bytes != 0) ReadWindow(ahead.file, direct, ahead.start, bytes, ahead.invalidations);
  {
    std::lock_guard lock(mu_);
    reading_ahead_.reset();
  }
  ahead_read_.notify_all();
}

void ReadWindows::Invalidate(uint32_t file, uint64_t at, uint64_t bytes) {
  std::lock_guard lock(mu_);
  invalidations_++;
  if (log_.size() == kLog) log_.pop_front();
  log_.push_back({.file = file, .start = at, .end = at + bytes, .seq = invalidations_});
  std::erase_if(windows_, [&](const Window& w) {
    return w.file == file && w.start < at + bytes && at < w.start + w.bytes;
  });
}

uint64_t ReadWindows::hits() const {
  std::lock_guard lock(mu_);
  return hits_;
}

uint64_t ReadWindows::reads() const {
  std::lock_guard lock(mu_);
  return reads_;
}

}  // namespace depot::store
