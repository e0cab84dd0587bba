// Overflow-checked arithmetic on sizes, offsets and counts that come from the other side of
// the socket (or from shared memory it can write).
//
// The one rule (docs/architecture.md, "Trust"): a value from a client is checked before any
// arithmetic on it, and a sum that would wrap is refused as InvalidArgument naming what was
// being computed, never taken modulo 2^64. Every place that adds such values goes through
// these, so that the check cannot be forgotten at one of them.
#pragma once

#include <concepts>
#include <cstdint>
#include <string>
#include <string_view>

#include "depot/status.h"

namespace depot::ipc {

// a + b, or InvalidArgument "<what> overflows (a + b)" when the sum does not fit in T.
template <std::unsigned_integral T>
Result<T> CheckedAdd(T a, T b, std::string_view what) {
  T sum;
  if (__builtin_add_overflow(a, b, &sum)) {
    return Status::InvalidArgument(std::string(what) + " overflows (" + std::to_string(a) + " + " +
                                   std::to_string(b) + ")");
  }
  return sum;
}

// Whether offset + size <= limit, without wrapping: [offset, offset + size) lies inside
// [0, limit), or two sizes together are at most `limit`.
constexpr bool RangeWithin(uint64_t offset, uint64_t size, uint64_t limit) {
  return offset <= limit && size <= limit - offset;
}

}  // namespace depot::ipc
