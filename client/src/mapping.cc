#include "mapping.h"

#include <sys/mman.h>

#include <cerrno>
#include <string>
#include <utility>

namespace depot::internal {

Mapping::Mapping(Mapping&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}

Mapping& Mapping::operator=(Mapping&& o) noexcept {
  if (this != &o) {
    Unmap();
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

Mapping::~Mapping() { Unmap(); }

void Mapping::Unmap() {
  if (data_ != nullptr) ::munmap(data_, size_);
  data_ = nullptr;
  size_ = 0;
}

Result<Mapping> Mapping::Map(int fd, size_t size, int prot, int extra_flags, const char* what) {
  if (size == 0) return Status::Internal(std::string("the daemon sent an empty ") + what);
  void* p = ::mmap(nullptr, size, prot, MAP_SHARED | extra_flags, fd, 0);
  if (p == MAP_FAILED) {
    return Status::FromErrno(
        std::string("mmap of ") + what + " (" + std::to_string(size) + " bytes)", errno);
  }
  return Mapping(static_cast<std::byte*>(p), size);
}

Status Mapping::Replace(int fd, int prot, const char* what) {
  if (data_ == nullptr) return Status::Internal(std::string("no mapping to replace for ") + what);
  if (::mmap(data_, size_, prot, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED) {
    const int error = errno;
    Unmap();
    return Status::FromErrno(std::string("mmap of a new file for ") + what, error);
  }
  return Status::OK();
}

void Mapping::Revoke() {
  if (data_ == nullptr) return;
  if (::mmap(data_, size_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1,
             0) == MAP_FAILED) {
    Unmap();
  }
}

}  // namespace depot::internal
