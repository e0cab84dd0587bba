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

// The character of well-formed UTF-8 (RFC 3629: shortest form, no surrogates, at most
// U+10FFFF) that starts at `text[at]`, and its length in bytes; length 0 where the bytes
// there are not one.
struct Utf8Char {
  char32_t code = 0;
  size_t length = 0;
};
Utf8Char NextUtf8(std::string_view text, size_t at);

// A control character: C0 (below U+0020), DEL, or C1 (U+0080 to U+009F), which a terminal
// may act on.
constexpr bool IsControl(char32_t c) { return c < 0x20 || (c >= 0x7f && c <= 0x9f); }

// Whether `text` is well-formed UTF-8 without control characters: what the daemon takes
// as text to show people (a task's label).
bool IsDisplayText(std::string_view text);

// Nanoseconds since the epoch (CLOCK_REALTIME) and on the monotonic clock.
uint64_t WallNanos();
uint64_t MonotonicNanos();

}  // namespace depot::ipc
