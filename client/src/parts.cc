#include "parts.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

namespace depot::internal {

void InSlices(uint64_t bytes, unsigned threads,
              const std::function<void(uint64_t from, uint64_t len)>& work) {
  // Slices of at least a quarter of the threshold, on 64 KiB boundaries.
  constexpr uint64_t kAlign = 64 << 10;
  const uint64_t most = bytes / (kParallelCopyBytes / 4);
  const unsigned n = static_cast<unsigned>(std::min<uint64_t>(threads, most));
  if (bytes < kParallelCopyBytes || n <= 1) {
    work(0, bytes);
    return;
  }
  const uint64_t slice = ((bytes + n - 1) / n + kAlign - 1) / kAlign * kAlign;  // n cover it
  std::vector<std::thread> helpers;
  helpers.reserve(n - 1);
  for (unsigned k = 1; k < n; ++k) {
    const uint64_t from = k * slice;
    if (from >= bytes) break;
    const uint64_t len = std::min(slice, bytes - from);
    try {
      helpers.emplace_back([&work, from, len] { work(from, len); });
    } catch (const std::system_error&) {
      work(from, len);  // no thread to be had: done here
    }
  }
  work(0, std::min(slice, bytes));  // the first slice: this thread's
  for (std::thread& t : helpers) t.join();
}

void CopyBytes(std::byte* dst, const std::byte* src, uint64_t bytes, unsigned threads) {
  InSlices(bytes, threads,
           [&](uint64_t from, uint64_t len) { std::memcpy(dst + from, src + from, len); });
}

Result<unsigned> ParseCopyThreads(std::string_view value) {
  unsigned n = 0;
  const auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), n);
  if (error != std::errc{} || end != value.data() + value.size() || n < 1 || n > kMaxCopyThreads) {
    return Status::InvalidArgument("DEPOT_COPY_THREADS is \"" + std::string(value.substr(0, 64)) +
                                   "\": it should be a count of threads from 1 to " +
                                   std::to_string(kMaxCopyThreads) +
                                   " (or unset, for the default)");
  }
  return n;
}

Result<unsigned> DefaultCopyThreads() {
  static const Result<unsigned> threads = []() -> Result<unsigned> {
    if (const char* env = std::getenv("DEPOT_COPY_THREADS")) return ParseCopyThreads(env);
    const unsigned hardware = std::thread::hardware_concurrency();
    return std::clamp(hardware, 1u, 4u);
  }();
  return threads;
}

Result<unsigned> CopyThreads(unsigned asked) {
  if (asked == 0) return DefaultCopyThreads();
  return std::min(asked, kMaxCopyThreads);
}

bool IsOnePart(std::span<const PutPart> parts, uint64_t size) {
  return parts.size() == 1 && parts[0].offset == 0 && parts[0].data.size() == size;
}

void FillParts(std::byte* dst, std::span<const PutPart> parts, uint64_t size, unsigned threads) {
  uint64_t pos = 0;
  for (const PutPart& part : parts) {
    if (part.offset > pos) std::memset(dst + pos, 0, part.offset - pos);
    if (!part.data.empty()) {
      CopyBytes(dst + part.offset, part.data.data(), part.data.size(), threads);
    }
    pos = part.offset + part.data.size();
  }
  if (size > pos) std::memset(dst + pos, 0, size - pos);
}

std::span<const std::byte> JoinParts(std::span<const PutPart> parts, uint64_t size,
                                     std::vector<std::byte>* scratch) {
  if (IsOnePart(parts, size)) return parts[0].data;
  scratch->resize(size);
  FillParts(scratch->data(), parts, size);
  return *scratch;
}

}  // namespace depot::internal
