#include "store/read_only.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <cerrno>

namespace depot::store {

Result<ipc::UniqueFd> ShareReadOnly(int fd, const std::string& what, bool resizable) {
  if (!resizable && ::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return Status::FromErrno("sealing " + what + " against resizing", errno);
  }
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  ipc::UniqueFd read_fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!read_fd) return Status::FromErrno("re-opening " + what + " read-only via " + path, errno);
  if (::fchmod(fd, 0400) != 0) return Status::FromErrno("fchmod of " + what, errno);
  return read_fd;
}

}  // namespace depot::store
