// The disk tier: spill files in --spill-dir that hold host objects the arena had no room for.
//
// The directory is the daemon's: it is created 0700, and one owned by another user, open to
// others, or locked by a running daemon (flock on its lock file) is refused. Spill files are
// anonymous (O_TMPFILE, or created and unlinked at once where the file system lacks it), so
// whatever way the daemon ends, the kernel gives their space back: nothing is left behind, and
// spilled objects do not survive a restart. Files a daemon left half-made by the fallback path
// are removed at start.
//
// Regions are files. Objects up to --spill-file-size are packed into shared files of that
// size, each carved by an OffsetAllocator at 4 KiB (a million 4 KiB objects are 4,000 files of
// 1 GiB, not a million); a larger object gets a file of its own. Files are sparse: a file takes
// disk space only where objects were written. A file whose objects are all gone is closed
// (which gives its space back); a freed range of a shared file is reused by later spills. The
// bytes of all open files are bounded by the limit (--spill-limit), so the spill directory
// never holds more than that.
//
// The pool only places bytes; the I/O runs on the worker pool (Tiers::RunCopy), on the
// descriptor fd(region). A file is closed only when no block in it is live, and a block stays
// live while a copy reads or writes it.
#pragma once

#include <boost/asio/thread_pool.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "depot/ipc/framing.h"
#include "depot/status.h"
#include "store/allocator.h"
#include "store/tier_pool.h"

namespace depot::store {

struct DiskOptions {
  std::string dir;
  uint64_t limit = 0;      // bytes of spill files; 0: the file system's free space at start
  uint64_t file_size = 0;  // of a shared spill file; 0: kDefaultFileSize (or the limit)
  // Copies move the page-aligned bulk of an object with O_DIRECT where the file system has
  // it, so spilled bytes do not stay in the page cache (spilling is for freeing memory).
  bool direct_io = true;
};

class DiskPool final : public TierPool {
 public:
  static constexpr uint64_t kAlignment = 4096;
  static constexpr uint64_t kDefaultFileSize = uint64_t{1} << 30;
  static constexpr const char* kLockName = ".depotd.lock";
  static constexpr const char* kLeftoverPrefix = ".depotd-spill-";

  // Opens (creating it 0700 if missing) and locks the spill directory, removes what a dead
  // daemon left in it, and sizes the pool. Fails with a message that names the directory and
  // what is wrong with it. Files are closed (their space given back) on `closer`, off the
  // loop; it must outlive the pool.
  static Result<std::unique_ptr<DiskPool>> Open(const DiskOptions& options,
                                                boost::asio::thread_pool& closer);
  ~DiskPool() override;
  DiskPool(const DiskPool&) = delete;
  DiskPool& operator=(const DiskPool&) = delete;

  // TierPool: regions are files.
  std::optional<Block> Allocate(uint64_t bytes) override;
  std::optional<Block> AllocateIn(uint32_t file, uint64_t bytes) override;
  void Free(uint32_t file, uint32_t handle) override;
  uint64_t OffsetOf(uint32_t file, uint32_t handle) const override {
    return files_[file]->allocator.OffsetOf(handle);
  }
  // A file holds bytes, not addresses: the offset itself (copies use fd()).
  uint64_t address(uint32_t /*file*/, uint64_t offset) const override { return offset; }
  uint64_t BlockSize(uint64_t bytes) const override {
    return bytes == 0 ? kAlignment : RoundUp(bytes);
  }
  // `bytes` rounded up to whole pages (kAlignment).
  static constexpr uint64_t RoundUp(uint64_t bytes) {
    return (bytes + kAlignment - 1) / kAlignment * kAlignment;
  }
  // Checked before rounding, which would wrap for sizes near 2^64.
  bool CouldFit(uint64_t bytes) const override {
    return bytes <= limit_ && BlockSize(bytes) <= limit_;
  }
  uint64_t free_bytes(uint32_t file) const override { return files_[file]->allocator.free_bytes(); }
  uint64_t used_bytes() const override { return used_; }
  uint64_t capacity() const override { return limit_; }
  uint64_t largest_free_block() const override;
  // Whether Allocate(bytes) would succeed now, with nothing dropped first.
  bool HasRoomFor(uint64_t bytes) const;
  // Why the last Allocate failed when the file system refused a new file (cannot create or
  // size it: full, a file size limit, out of descriptors); OK when it failed for want of room
  // under the limit, which dropping objects can make.
  const Status& file_error() const { return file_error_; }
  std::string name() const override { return "the spill directory " + dir_; }

  // The descriptors of a live file, for the copies' pread and pwrite: buffered, and opened
  // with O_DIRECT (-1 without direct I/O).
  int fd(uint32_t file) const { return files_[file]->fd.get(); }
  int direct_fd(uint32_t file) const { return files_[file]->direct_fd.get(); }
  // Whether copies use direct I/O: asked for, and the file system has it.
  bool direct_io() const { return direct_io_; }
  const std::string& dir() const { return dir_; }
  // Bytes of the spill files open now (what the directory may take on disk), and how many.
  uint64_t file_bytes() const { return file_bytes_; }
  uint32_t file_count() const { return open_files_; }
  uint64_t file_size() const { return file_size_; }
  // Whether region `file` is a live file (its index may be free, or reused by a later file).
  bool live(uint32_t file) const { return file < files_.size() && files_[file] != nullptr; }
  // The size of one live file.
  uint64_t size(uint32_t file) const { return files_[file]->size; }

 private:
  struct File {
    ipc::UniqueFd fd;
    ipc::UniqueFd direct_fd;  // the same file, opened with O_DIRECT; -1 without
    uint64_t size = 0;
    bool dedicated = false;  // one object's, larger than a shared file
    OffsetAllocator allocator;
    File(ipc::UniqueFd f, uint64_t bytes, bool own)
        : fd(std::move(f)), size(bytes), dedicated(own), allocator(bytes, kAlignment) {}
  };

  DiskPool(std::string dir, ipc::UniqueFd dir_fd, ipc::UniqueFd lock, uint64_t limit,
           uint64_t file_size, bool direct_io, boost::asio::thread_pool& closer)
      : direct_io_(direct_io),
        closer_(closer),
        dir_(std::move(dir)),
        dir_fd_(std::move(dir_fd)),
        lock_(std::move(lock)),
        limit_(limit),
        file_size_(file_size) {}
  // A new anonymous file in the directory, unsized; -1 (errno set) if the file system refuses.
  static ipc::UniqueFd MakeFile(int dir_fd);
  // The same file opened again with O_DIRECT, or -1 (errno set).
  static ipc::UniqueFd OpenDirect(int fd);
  // A new anonymous file of `bytes` in the directory, as region `file` (reusing a closed
  // one's index); nullopt if the limit or the file system refuses.
  std::optional<uint32_t> AddFile(uint64_t bytes, bool dedicated);
  std::optional<Block> AllocateInFile(uint32_t file, uint64_t bytes);

  bool direct_io_;
  boost::asio::thread_pool& closer_;
  std::string dir_;
  ipc::UniqueFd dir_fd_;
  ipc::UniqueFd lock_;  // flocked while the daemon lives
  uint64_t limit_;
  uint64_t file_size_;
  std::vector<std::unique_ptr<File>> files_;  // by region; null: closed, index free
  uint32_t open_files_ = 0;
  uint64_t file_bytes_ = 0;
  uint64_t used_ = 0;
  Status file_error_;
};

}  // namespace depot::store
