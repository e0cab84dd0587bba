// Mapping: an owned mmap of a file descriptor, unmapped on destruction.
#pragma once

#include <cstddef>
#include <cstdint>

#include "depot/ipc/framing.h"
#include "depot/status.h"

namespace depot::internal {

class Mapping {
 public:
  Mapping() = default;
  Mapping(Mapping&& o) noexcept;
  Mapping& operator=(Mapping&& o) noexcept;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping();

  // Maps `size` bytes of `fd` from offset 0, MAP_SHARED, with `prot` and `extra_flags`
  // (e.g. MAP_POPULATE). The descriptor is not kept: the caller may close it afterwards.
  // Fails with IoError naming `what` and the errno.
  static Result<Mapping> Map(int fd, size_t size, int prot, int extra_flags, const char* what);
  // Maps `fd` (of the same size) in place of what this maps, at the same address, so that
  // no pointer into it dangles. On failure the mapping is empty.
  Status Replace(int fd, int prot, const char* what);
  // Maps nothing accessible in place of what this maps: a pointer still into it faults,
  // instead of reaching whatever the address would be reused for. Unmapped on destruction.
  void Revoke();

  // Keeps `file`, the descriptor this maps, for PrivateView (closing the one kept before),
  // and the size of its pages.
  void KeepFile(ipc::UniqueFd file);
  // A private, writable view of bytes [offset, offset + size) of the file kept (MAP_PRIVATE:
  // copy-on-write): reads see the file's bytes until a page is first written, which copies
  // that page into this process's own memory, so writes never reach the file. The view
  // covers whole pages of the file (huge ones on hugetlbfs: st_blksize); `*skip` is where
  // `offset` lies in it. Fails with Internal when no file is kept or the range is empty or
  // outside this mapping, and with IoError naming `what` when mmap does.
  Result<Mapping> PrivateView(uint64_t offset, uint64_t size, const char* what,
                              uint64_t* skip) const;
  // `size` bytes of private anonymous memory, writable. Fails with IoError naming `what`.
  static Result<Mapping> Anonymous(uint64_t size, const char* what);

  std::byte* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  Mapping(std::byte* data, size_t size) : data_(data), size_(size) {}
  void Unmap();

  std::byte* data_ = nullptr;
  size_t size_ = 0;
  ipc::UniqueFd file_;      // kept for PrivateView; none unless KeepFile gave it
  uint64_t file_page_ = 0;  // its pages' size: huge ones on hugetlbfs (st_blksize)
};

}  // namespace depot::internal
