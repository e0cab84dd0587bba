#include "mapping.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <utility>

namespace depot::internal {

Mapping::Mapping(Mapping&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)),
      size_(std::exchange(o.size_, 0)),
      file_(std::move(o.file_)),
      file_page_(std::exchange(o.file_page_, 0)) {}

Mapping& Mapping::operator=(Mapping&& o) noexcept {
  if (this != &o) {
    Unmap();
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
    file_ = std::move(o.file_);
    file_page_ = std::exchange(o.file_page_, 0);
  }
  return *this;
}

Mapping::~Mapping() { Unmap(); }

void Mapping::Unmap() {
  if (data_ != nullptr) ::munmap(data_, size_);
  data_ = nullptr;
  size_ = 0;
  file_.reset();
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

void Mapping::KeepFile(ipc::UniqueFd file) {
  file_ = std::move(file);
  // The file's own page: a hugetlbfs file maps only at offsets of its huge pages.
  file_page_ = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  struct stat st {};
  if (::fstat(file_.get(), &st) == 0) {
    const auto block = static_cast<uint64_t>(st.st_blksize);
    if (block > file_page_ && (block & (block - 1)) == 0) file_page_ = block;
  }
}

Result<Mapping> Mapping::PrivateView(uint64_t offset, uint64_t size, const char* what,
                                     uint64_t* skip) const {
  if (!file_) return Status::Internal(std::string("no file is kept for a private view of ") + what);
  if (size == 0 || offset > size_ || size > size_ - offset) {
    return Status::Internal("a private view of [" + std::to_string(offset) + ", +" +
                            std::to_string(size) + ") of " + what + ", which has " +
                            std::to_string(size_) + " bytes");
  }
  const uint64_t page = file_page_;
  const uint64_t start = offset - offset % page;
  const uint64_t end = offset + size;
  const uint64_t length = (end - start + page - 1) / page * page;
  // No swap reserved for pages never written (they stay the file's).
  void* p = ::mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_NORESERVE,
                   file_.get(), static_cast<off_t>(start));
  if (p == MAP_FAILED) {
    return Status::FromErrno(std::string("mmap of a private view of ") + what + " (" +
                                 std::to_string(length) + " bytes)",
                             errno);
  }
  *skip = offset - start;
  return Mapping(static_cast<std::byte*>(p), length);
}

Result<Mapping> Mapping::Anonymous(uint64_t size, const char* what) {
  if (size == 0) return Status::Internal(std::string("empty anonymous memory for ") + what);
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    return Status::FromErrno(
        std::string("mmap of ") + std::to_string(size) + " bytes of memory for " + what, errno);
  }
  return Mapping(static_cast<std::byte*>(p), size);
}

void Mapping::Revoke() {
  if (data_ == nullptr) return;
  if (::mmap(data_, size_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1,
             0) == MAP_FAILED) {
    Unmap();
  }
}

}  // namespace depot::internal
