// Byte sizes as people write them: "4GiB", "512M", "1.5 GiB", "1048576".
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "depot/status.h"

namespace depot::ipc {

// Parses a size. Suffixes K, M, G, T (with optional "i" and "B", any case) are powers of
// 1024; a bare number is bytes. Fails with InvalidArgument naming the bad text.
Result<uint64_t> ParseSize(std::string_view text);

// Formats a size for people: "0 B", "1023 B", "1.5 KiB", "4.0 GiB".
std::string FormatSize(uint64_t bytes);

// A size exactly and for people, for messages where rounding would hide the difference
// between two sizes: "1073741888 bytes (1.00 GiB)"; under 1 KiB just "1023 B".
std::string FormatExactSize(uint64_t bytes);

// Formats a duration for people, to 3 digits: "20us", "1.5ms", "2.1s".
std::string FormatSeconds(double seconds);

// `text` cut to at most `bytes` bytes, at a UTF-8 character boundary.
std::string_view CutUtf8(std::string_view text, size_t bytes);

// Nanoseconds since the epoch (CLOCK_REALTIME) and on the monotonic clock.
uint64_t WallNanos();
uint64_t MonotonicNanos();

}  // namespace depot::ipc
