#include "store/spill_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <string>

#include "store/disk_pool.h"

namespace depot::store {

Status WriteAll(int fd, const std::byte* from, uint64_t bytes, uint64_t offset) {
  while (bytes > 0) {
    const ssize_t n =
        pwrite(fd, from, std::min(bytes, uint64_t{1} << 30), static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Status::FromErrno("writing to the spill file", n < 0 ? errno : EIO);
    from += n;
    bytes -= static_cast<uint64_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return Status::OK();
}

Status ReadAll(int fd, std::byte* to, uint64_t bytes, uint64_t offset) {
  while (bytes > 0) {
    const ssize_t n = pread(fd, to, std::min(bytes, uint64_t{1} << 30), static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::FromErrno("reading the spill file", errno);
    if (n == 0) {
      return Status::IoError("the spill file ends at byte " + std::to_string(offset) +
                             ", before the object's end: it was truncated");
    }
    to += n;
    bytes -= static_cast<uint64_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return Status::OK();
}

void DropCached(int fd, uint64_t offset, uint64_t bytes) {
  const uint64_t start = offset / DiskPool::kAlignment * DiskPool::kAlignment;
  const uint64_t end = DiskPool::RoundUp(offset + bytes);
  // Advice only: nothing to do if the kernel declines.
  (void)posix_fadvise(fd, static_cast<off_t>(start), static_cast<off_t>(end - start),
                      POSIX_FADV_DONTNEED);
}

}  // namespace depot::store
