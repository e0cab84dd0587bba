#include "depot/ipc/units.h"

#include <time.h>

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>

namespace depot::ipc {

Result<uint64_t> ParseSize(std::string_view text) {
  auto bad = [&] {
    return Status::InvalidArgument("'" + std::string(text) +
                                   "' is not a size; write e.g. 4GiB, 512M, 1.5G or 1048576");
  };
  std::string_view s = text;
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  size_t num_end = 0;
  while (num_end < s.size() &&
         (std::isdigit(static_cast<unsigned char>(s[num_end])) || s[num_end] == '.')) {
    ++num_end;
  }
  if (num_end == 0) return bad();
  double number = 0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + num_end, number);
  if (ec != std::errc() || ptr != s.data() + num_end) return bad();
  std::string unit;
  for (char c : s.substr(num_end)) {
    if (!std::isspace(static_cast<unsigned char>(c))) unit += static_cast<char>(std::toupper(c));
  }
  double scale = 1;
  if (unit.empty() || unit == "B") {
    scale = 1;
  } else {
    static constexpr std::string_view kPrefixes = "KMGTP";
    size_t p = kPrefixes.find(unit[0]);
    std::string_view rest = std::string_view(unit).substr(1);
    if (p == std::string_view::npos ||
        !(rest.empty() || rest == "B" || rest == "I" || rest == "IB")) {
      return bad();
    }
    scale = std::pow(1024.0, static_cast<double>(p + 1));
  }
  double bytes = number * scale;
  if (!(bytes >= 0) || bytes >= 18446744073709551615.0) return bad();
  if (unit.empty() && number != std::floor(number)) return bad();  // "1.5" bytes
  return static_cast<uint64_t>(bytes);
}

std::string FormatSize(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  if (bytes < 1024) return std::to_string(bytes) + " B";
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 5) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), v < 10 ? "%.2f %s" : (v < 100 ? "%.1f %s" : "%.0f %s"), v,
                kUnits[u]);
  return buf;
}

std::string FormatExactSize(uint64_t bytes) {
  if (bytes < 1024) return FormatSize(bytes);
  return std::to_string(bytes) + " bytes (" + FormatSize(bytes) + ")";
}

std::string FormatSeconds(double seconds) {
  char buf[32];
  if (seconds < 1e-3) {
    std::snprintf(buf, sizeof(buf), "%.3gus", seconds * 1e6);
  } else if (seconds < 1) {
    std::snprintf(buf, sizeof(buf), "%.3gms", seconds * 1e3);
  } else {
    std::snprintf(buf, sizeof(buf), "%.3gs", seconds);
  }
  return buf;
}

static uint64_t ClockNanos(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<uint64_t>(ts.tv_nsec);
}

uint64_t WallNanos() { return ClockNanos(CLOCK_REALTIME); }
uint64_t MonotonicNanos() { return ClockNanos(CLOCK_MONOTONIC); }

Utf8Char NextUtf8(std::string_view text, size_t at) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[at + k]); };
  const unsigned char lead = byte(0);
  if (lead < 0x80) return {lead, 1};
  size_t length;
  char32_t code;
  char32_t least;  // the smallest code point of that length: shorter forms are overlong
  if ((lead & 0xE0) == 0xC0) {
    length = 2, code = lead & 0x1F, least = 0x80;
  } else if ((lead & 0xF0) == 0xE0) {
    length = 3, code = lead & 0x0F, least = 0x800;
  } else if ((lead & 0xF8) == 0xF0) {
    length = 4, code = lead & 0x07, least = 0x10000;
  } else {
    return {};  // a continuation byte, or 0xF8 and above
  }
  if (text.size() - at < length) return {};
  for (size_t k = 1; k < length; ++k) {
    if ((byte(k) & 0xC0) != 0x80) return {};
    code = (code << 6) | (byte(k) & 0x3F);
  }
  if (code < least || code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF)) return {};
  return {code, length};
}

bool IsDisplayText(std::string_view text) {
  for (size_t at = 0; at < text.size();) {
    const Utf8Char c = NextUtf8(text, at);
    if (c.length == 0 || IsControl(c.code)) return false;
    at += c.length;
  }
  return true;
}

std::string_view CutUtf8(std::string_view text, size_t bytes) {
  if (text.size() <= bytes) return text;
  size_t end = bytes;
  while (end > 0 && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) --end;
  return text.substr(0, end);
}

}  // namespace depot::ipc
