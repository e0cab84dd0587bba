#include "store/disk_pool.h"

#include <dirent.h>
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/post.hpp>
#include <cerrno>
#include <cstring>

#include "depot/ipc/units.h"

namespace depot::store {

namespace {
std::string Errno(int err) { return std::strerror(err); }

// Removes the files a daemon's fallback path left before it could unlink them.
void RemoveLeftovers(int dir_fd, const std::string& dir) {
  const int fd = dup(dir_fd);
  if (fd < 0) return;
  DIR* d = fdopendir(fd);
  if (d == nullptr) {
    close(fd);
    return;
  }
  const std::string prefix = DiskPool::kLeftoverPrefix;
  uint32_t removed = 0;
  while (const dirent* e = readdir(d)) {
    if (std::string_view(e->d_name).starts_with(prefix) && unlinkat(dir_fd, e->d_name, 0) == 0) {
      removed++;
    }
  }
  closedir(d);
  if (removed != 0) spdlog::info("removed {} spill files a dead daemon left in {}", removed, dir);
}
}  // namespace

Result<std::unique_ptr<DiskPool>> DiskPool::Open(const DiskOptions& options,
                                                 boost::asio::thread_pool& closer) {
  const std::string& dir = options.dir;
  if (dir.empty()) return Status::InvalidArgument("--spill-dir is empty");
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return Status::IoError("cannot create the spill directory " + dir + ": " + Errno(errno));
  }
  struct stat st {};
  if (lstat(dir.c_str(), &st) != 0) {
    return Status::IoError("cannot look at the spill directory " + dir + ": " + Errno(errno));
  }
  if (!S_ISDIR(st.st_mode)) {
    return Status::InvalidArgument("the spill directory " + dir + " is not a directory" +
                                   (S_ISLNK(st.st_mode) ? " (a symbolic link is refused)" : ""));
  }
  if (st.st_uid != geteuid()) {
    return Status::PermissionDenied("the spill directory " + dir + " is owned by uid " +
                                    std::to_string(st.st_uid) + ", not by depotd's user (uid " +
                                    std::to_string(geteuid()) +
                                    "); spilled objects must be readable by depotd alone");
  }
  if ((st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%04o", st.st_mode & 07777);
    return Status::PermissionDenied("the spill directory " + dir +
                                    " is open to other users (mode " + mode +
                                    "), who could read spilled objects; chmod 700 it, or give "
                                    "depotd a directory of its own");
  }
  ipc::UniqueFd dir_fd(open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!dir_fd) {
    return Status::IoError("cannot open the spill directory " + dir + ": " + Errno(errno));
  }
  ipc::UniqueFd lock(
      openat(dir_fd.get(), kLockName, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!lock) {
    return Status::IoError("cannot open the lock file of the spill directory " + dir + ": " +
                           Errno(errno));
  }
  if (flock(lock.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK) {
      return Status::IoError("cannot lock the spill directory " + dir + ": " + Errno(errno));
    }
    char pid[32] = {};
    const ssize_t n = pread(lock.get(), pid, sizeof(pid) - 1, 0);
    const std::string who = n > 0 ? "pid " + std::string(pid, static_cast<size_t>(n)) : "";
    return Status::AlreadyExists(
        "the spill directory " + dir + " is in use by another running depotd" +
        (who.empty() ? "" : " (" + who + ")") + "; give each daemon a spill directory of its own");
  }
  const std::string me = std::to_string(getpid());
  if (ftruncate(lock.get(), 0) != 0 ||
      pwrite(lock.get(), me.data(), me.size(), 0) != static_cast<ssize_t>(me.size())) {
    spdlog::warn("cannot write depotd's pid into {}/{}: {}", dir, kLockName, Errno(errno));
  }
  RemoveLeftovers(dir_fd.get(), dir);

  struct statvfs fs {};
  if (fstatvfs(dir_fd.get(), &fs) != 0) {
    return Status::IoError("cannot read the free space of " + dir + ": " + Errno(errno));
  }
  const uint64_t free_space = static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize;
  uint64_t limit = options.limit == 0 ? free_space : options.limit;
  limit = limit / kAlignment * kAlignment;
  if (limit == 0) {
    return Status::InvalidArgument("the spill directory " + dir + " has no free space (" +
                                   ipc::FormatSize(free_space) + ")");
  }
  if (limit > free_space) {
    spdlog::warn(
        "--spill-limit {} is more than the {} free in {} now: spills may fail for want "
        "of space (the objects then stay in memory)",
        ipc::FormatSize(limit), ipc::FormatSize(free_space), dir);
  }
  uint64_t file_size = options.file_size == 0 ? kDefaultFileSize : options.file_size;
  file_size = std::max(kAlignment, std::min(file_size, limit) / kAlignment * kAlignment);
  bool direct_io = options.direct_io;
  if (direct_io) {
    // Whether the file system takes O_DIRECT (tmpfs does not): tried on a file of its own.
    const ipc::UniqueFd probe = MakeFile(dir_fd.get());
    if (!probe || !OpenDirect(probe.get())) {
      spdlog::info("{} has no direct I/O ({}): spills go through the page cache", dir,
                   Errno(errno));
      direct_io = false;
    }
  }
  return std::unique_ptr<DiskPool>(
      new DiskPool(dir, std::move(dir_fd), std::move(lock), limit, file_size, direct_io, closer));
}

ipc::UniqueFd DiskPool::MakeFile(int dir_fd) {
  ipc::UniqueFd fd(openat(dir_fd, ".", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600));
  if (!fd && (errno == EOPNOTSUPP || errno == EISDIR || errno == EINVAL)) {
    // No O_TMPFILE on this file system: a named file, unlinked at once (a daemon killed in
    // between leaves it to RemoveLeftovers).
    static std::atomic<uint64_t> counter{0};
    const std::string name =
        kLeftoverPrefix + std::to_string(getpid()) + "-" + std::to_string(counter++);
    fd = ipc::UniqueFd(
        openat(dir_fd, name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (fd) unlinkat(dir_fd, name.c_str(), 0);
  }
  return fd;
}

ipc::UniqueFd DiskPool::OpenDirect(int fd) {
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  return ipc::UniqueFd(open(path.c_str(), O_RDWR | O_DIRECT | O_CLOEXEC));
}

DiskPool::~DiskPool() = default;

std::optional<uint32_t> DiskPool::AddFile(uint64_t bytes, bool dedicated) {
  if (file_bytes_ + bytes > limit_) return std::nullopt;
  ipc::UniqueFd fd = MakeFile(dir_fd_.get());
  if (!fd) {
    file_error_ = Status::IoError("cannot create a spill file in " + dir_ + ": " + Errno(errno));
    spdlog::warn("{}", file_error_.message());
    return std::nullopt;
  }
  if (ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) {
    file_error_ = Status::IoError("cannot size a spill file in " + dir_ + " to " +
                                  ipc::FormatSize(bytes) + ": " + Errno(errno));
    spdlog::warn("{}", file_error_.message());
    return std::nullopt;
  }
  ipc::UniqueFd direct;
  if (direct_io_) {
    direct = OpenDirect(fd.get());
    if (!direct) spdlog::warn("cannot open a spill file for direct I/O: {}", Errno(errno));
  }
  auto file = std::make_unique<File>(std::move(fd), bytes, dedicated);
  file->direct_fd = std::move(direct);
  file_bytes_ += bytes;
  open_files_++;
  for (uint32_t i = 0; i < files_.size(); ++i) {
    if (files_[i] == nullptr) {
      files_[i] = std::move(file);
      return i;
    }
  }
  files_.push_back(std::move(file));
  return static_cast<uint32_t>(files_.size() - 1);
}

std::optional<TierPool::Block> DiskPool::AllocateInFile(uint32_t file, uint64_t bytes) {
  File& f = *files_[file];
  auto a = f.allocator.Allocate(BlockSize(bytes));
  if (!a) return std::nullopt;
  used_ += a->size;
  return Block{.region = file, .handle = a->handle, .offset = a->offset, .size = a->size};
}

std::optional<TierPool::Block> DiskPool::AllocateIn(uint32_t file, uint64_t bytes) {
  if (file >= files_.size() || files_[file] == nullptr) return Allocate(bytes);
  if (auto block = AllocateInFile(file, bytes)) return block;
  return Allocate(bytes);
}

std::optional<TierPool::Block> DiskPool::Allocate(uint64_t bytes) {
  file_error_ = Status::OK();
  const uint64_t size = BlockSize(bytes);
  if (size > file_size_) {
    const auto file = AddFile(size, /*dedicated=*/true);
    if (!file) return std::nullopt;
    return AllocateInFile(*file, size);
  }
  for (uint32_t i = 0; i < files_.size(); ++i) {
    if (files_[i] == nullptr || files_[i]->dedicated) continue;
    if (auto block = AllocateInFile(i, size)) return block;
  }
  // A new shared file, smaller than usual if that is all the limit leaves.
  const uint64_t left = (limit_ - file_bytes_) / kAlignment * kAlignment;
  if (left < size) return std::nullopt;
  const auto file = AddFile(std::min(file_size_, left), /*dedicated=*/false);
  if (!file) return std::nullopt;
  return AllocateInFile(*file, size);
}

void DiskPool::Free(uint32_t file, uint32_t handle) {
  File& f = *files_[file];
  const uint64_t before = f.allocator.used_bytes();
  f.allocator.Free(handle);
  used_ -= before - f.allocator.used_bytes();
  if (f.allocator.live_allocations() != 0) return;
  // Empty: closing the file gives its space back, which may take the file system a while.
  file_bytes_ -= f.size;
  open_files_--;
  boost::asio::post(closer_, [fd = std::make_shared<ipc::UniqueFd>(std::move(f.fd)),
                              direct = std::make_shared<ipc::UniqueFd>(std::move(f.direct_fd))] {});
  files_[file].reset();
}

bool DiskPool::HasRoomFor(uint64_t bytes) const {
  const uint64_t size = BlockSize(bytes);
  const uint64_t left = (limit_ - file_bytes_) / kAlignment * kAlignment;
  if (size > file_size_ || left >= size) return left >= size;
  for (const auto& f : files_) {
    if (f != nullptr && !f->dedicated && f->allocator.largest_free_block() >= size) return true;
  }
  return false;
}

uint64_t DiskPool::largest_free_block() const {
  uint64_t largest = (limit_ - file_bytes_) / kAlignment * kAlignment;
  for (const auto& f : files_) {
    if (f != nullptr) largest = std::max(largest, f->allocator.largest_free_block());
  }
  return largest;
}

}  // namespace depot::store
