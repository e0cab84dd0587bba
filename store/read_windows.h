// Restores of small spilled objects read back in windows, as they were written: in runs.
//
// Small objects are spilled packed, many to one write (Tiers::WritePackedSpills), and objects
// spilled together are usually wanted together again (they were the least recently used
// ones, in order). A restore that continues where the last one in the same file ended reads
// the next kWindow bytes of the file with one direct read, keeps them, and the restores that
// follow copy from them (on the loop: no trip to a worker). A restore that does not read on from
// the last one reads its own bytes only. The page cache is not used for either: the bytes of
// spilled objects are not kept in memory outside the arena and these few windows.
//
// Restores that go on through a window have the next one read ahead of them, so that a
// client getting spilled objects one by one does not wait for the disk at each window.
//
// A window holds what the file held when it was read. Blocks in it that were free then may be
// written later, by spills; so every write to a spill file invalidates the windows over its
// range before its object counts as on disk, and a window whose read raced with an
// invalidation of its range is not kept. A restore's own block is live and unchanging while it is
// read, so its bytes in any window read after its spill was written are right.
//
// Reads run on the worker threads, invalidations on the loop: both under one mutex, held only
// to look up and replace windows, never during I/O or copies.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "depot/status.h"

namespace depot::store {

class ReadWindows {
 public:
  static constexpr uint64_t kWindow = uint64_t{2} << 20;
  static constexpr size_t kWindows = 4;  // 8 MiB of daemon memory, made as first needed
  static constexpr std::chrono::seconds kAheadWait{1};

  // Reads `bytes` at `at` (page-aligned, the start of its block) of spill file `file` into
  // `to`: from a window, or through `direct` (the file opened with O_DIRECT) into a new
  // window when it reads on from the last restore in that file, else through `fd` (buffered;
  // the pages it read are dropped from the page cache). `file_size`: the file's size, which
  // bounds a window.
  Status Read(uint32_t file, int fd, int direct, std::byte* to, uint64_t bytes, uint64_t at,
              uint64_t file_size);
  // The same from a window only, for a copy on the loop: false (nothing done) if no window
  // holds those bytes.
  bool Copy(uint32_t file, int direct, std::byte* to, uint64_t bytes, uint64_t at,
            uint64_t file_size);
  // Forgets what any window holds of [at, at + bytes) of `file`: those bytes are being (or
  // were) written. On the loop, before the write's object counts as on disk.
  void Invalidate(uint32_t file, uint64_t at, uint64_t bytes);

  // Reading ahead: once restores read on in a window, the window after it is read before
  // they reach it. A restore that reaches it while it is being read waits for that read
  // (kAheadWait at most: it was asked for, and so posted to the workers, before the restore
  // was, and runs first), rather than read its own bytes beside it. The window to read that reads
  // asked for, if any (on the loop, after a restore), and its read (on a worker, through the file's
  // descriptor with O_DIRECT: one that stays open while it reads).
  struct Ahead {
    uint32_t file = 0;
    uint64_t start = 0;
    uint64_t invalidations = 0;  // when it was asked for
  };
  std::optional<Ahead> TakeAhead();
  void ReadAhead(const Ahead& ahead, int direct, uint64_t file_size);

  // What the reads did: disk reads made (windows, ahead or not, and objects read on their
  // own), and restores served from a window.
  uint64_t reads() const;
  uint64_t hits() const;

 private:
  struct Window {
    uint32_t file = 0;
    uint64_t start = 0;
    uint64_t bytes = 0;
    std::shared_ptr<const std::byte[]> data;
    uint64_t used = 0;  // when last read from (uses_), for replacing the least recently used
  };
  struct Sequence {
    uint32_t file = 0;
    uint64_t end = 0;  // where the last restore from `file` ended (its block's end)
  };

  // A window of `file` holding [at, at + bytes), or null. Under mu_.
  Window* Find(uint32_t file, uint64_t at, uint64_t bytes);
  // Waits while the window holding `at` of `file` is read ahead; whether it did.
  bool WaitForAhead(uint32_t file, uint64_t at);
  // Whether a window, or the one being read ahead, holds any of [at, end) of `file`. Under mu_.
  bool Overlaps(uint32_t file, uint64_t at, uint64_t end) const;
  // Whether the restore of [at, end) from `file` reads on from the last one there; it is
  // then the last. Under mu_.
  bool ReadsOn(uint32_t file, uint64_t at, uint64_t end);
  // Reads [start, start + bytes) of a file into a new window through `direct`; kept unless
  // a write invalidated windows since `invalidations`. Null if the read failed.
  std::shared_ptr<const std::byte[]> ReadWindow(uint32_t file, int direct, uint64_t start,
                                                uint64_t bytes, uint64_t invalidations);
  // The bytes of a window from `at`: kWindow, as far as the file goes, in whole pages (as
  // direct I/O needs); at least `least`.
  static uint64_t WindowBytes(uint64_t at, uint64_t file_size, uint64_t least);

  mutable std::mutex mu_;
  std::vector<Window> windows_;
  std::vector<Sequence> sequences_;     // the last few files restored from, and where they ended
  std::optional<Ahead> ahead_;          // asked for, not taken yet
  std::optional<Ahead> reading_ahead_;  // taken, being read
  std::condition_variable ahead_read_;  // reading_ahead_ is done
  uint64_t uses_ = 0;
  // The invalidations: how many so far, and the last kLog of them. A window read across one
  // of its range is not kept.
  struct Invalidation {
    uint32_t file = 0;
    uint64_t start = 0;
    uint64_t end = 0;
    uint64_t seq = 0;
  };
  static constexpr size_t kLog = 1024;
  // Whether an invalidation after `since` may have touched [start, start + bytes) of `file`.
  // Under mu_.
  bool InvalidatedSince(uint64_t since, uint32_t file, uint64_t start, uint64_t bytes) const;
  uint64_t invalidations_ = 0;
  std::deque<Invalidation> log_;
  uint64_t reads_ = 0;
  uint64_t hits_ = 0;
};

}  // namespace depot::store
