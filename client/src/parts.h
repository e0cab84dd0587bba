// An object's data given as parts (PutPart): copying them into the object's memory, or
// joining them into one buffer. Client::PutParts and TaskContext::PutParts share these;
// CheckParts has passed the parts first.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string_view>
#include <vector>

#include "depot/client.h"

namespace depot::internal {

// Whether `parts` are one buffer of the whole object.
bool IsOnePart(std::span<const PutPart> parts, uint64_t size);

// Writes `parts` at their offsets into `dst`, `size` bytes, zeroing the gaps between them
// and after the last; each large part with up to `threads` threads (CopyBytes).
void FillParts(std::byte* dst, std::span<const PutPart> parts, uint64_t size, unsigned threads = 1);

// Copies of kParallelCopyBytes or more go on up to `threads` threads, this one among them,
// each a contiguous slice: one core's copy bandwidth is a fraction of the memory's, and the
// first touch of a fresh object's pages (the kernel's fault and zeroing) spreads over cores
// too, as Ray's client copies large objects. Smaller ones are one memcpy.
inline constexpr uint64_t kParallelCopyBytes = uint64_t{16} << 20;
inline constexpr unsigned kMaxCopyThreads = 64;
void CopyBytes(std::byte* dst, const std::byte* src, uint64_t bytes, unsigned threads);
// Runs `work` over [0, bytes) as CopyBytes copies: slices on 64 KiB boundaries, one for each
// of up to `threads` threads (this one among them) for kParallelCopyBytes or more, else one.
void InSlices(uint64_t bytes, unsigned threads,
              const std::function<void(uint64_t from, uint64_t len)>& work);

// The copy threads of a client that asks none (ConnectOptions::copy_threads 0):
// $DEPOT_COPY_THREADS if it is set (ParseCopyThreads), else 4, or the hardware's threads if
// fewer. Read once a process; a value that is not a count is InvalidArgument, every time.
Result<unsigned> DefaultCopyThreads();
// The value of $DEPOT_COPY_THREADS: a decimal count from 1 to kMaxCopyThreads, else
// InvalidArgument naming the variable, the value and what it should be.
Result<unsigned> ParseCopyThreads(std::string_view value);
// `asked` if it is 1 or more (at most kMaxCopyThreads), else DefaultCopyThreads().
Result<unsigned> CopyThreads(unsigned asked);

// The object's bytes in one span: the one part's own, or the parts joined in `*scratch`.
std::span<const std::byte> JoinParts(std::span<const PutPart> parts, uint64_t size,
                                     std::vector<std::byte>* scratch);

}  // namespace depot::internal
