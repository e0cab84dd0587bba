// The I/O of the disk tier's copies, on a spill file's descriptors (DiskPool::fd, direct_fd).
#pragma once

#include <cstddef>
#include <cstdint>

#include "depot/status.h"

namespace depot::store {

// All of `bytes` at `offset` of `fd`, or why not (a read that ends early: the file was
// truncated).
Status WriteAll(int fd, const std::byte* from, uint64_t bytes, uint64_t offset);
Status ReadAll(int fd, std::byte* to, uint64_t bytes, uint64_t offset);

// Drops the pages of [offset, offset + bytes) of `fd`, rounded out to whole pages, from the
// page cache: after a buffered read of a block (blocks are whole pages), so that spilled
// bytes are not kept in memory twice once they are back.
void DropCached(int fd, uint64_t offset, uint64_t bytes);

}  // namespace depot::store
