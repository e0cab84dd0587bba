// Small things the integration tests share: assertions on Status and Result, and object
// contents that any process can regenerate from a seed and check by XXH3.
#pragma once

#include <gtest/gtest.h>
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "depot/status.h"

namespace depot::testing {

// Whether this build runs under a sanitizer, whose shadow memory and quarantine of freed
// blocks make a process's resident size no measure of what it holds.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif

inline Status StatusOf(const Status& s) { return s; }
template <typename T>
Status StatusOf(const Result<T>& r) {
  return r.status();
}

}  // namespace depot::testing

// Assert/expect that a Status or Result is OK; on failure print the expression and the error.
#define ASSERT_OK(expr)                                                             \
  do {                                                                              \
    const ::depot::Status _depot_test_st = ::depot::testing::StatusOf(expr);        \
    ASSERT_TRUE(_depot_test_st.ok()) << #expr << ": " << _depot_test_st.ToString(); \
  } while (false)
#define EXPECT_OK(expr)                                                             \
  do {                                                                              \
    const ::depot::Status _depot_test_st = ::depot::testing::StatusOf(expr);        \
    EXPECT_TRUE(_depot_test_st.ok()) << #expr << ": " << _depot_test_st.ToString(); \
  } while (false)
// Expects a Status or Result to have failed with `expected_code`.
#define EXPECT_STATUS(expr, expected_code)                                                         \
  do {                                                                                             \
    const ::depot::Status _depot_test_st = ::depot::testing::StatusOf(expr);                       \
    EXPECT_EQ(_depot_test_st.code(), expected_code) << #expr << ": " << _depot_test_st.ToString(); \
  } while (false)

#define DEPOT_TEST_ASSIGN_IMPL(tmp, lhs, rexpr)                       \
  auto tmp = (rexpr);                                                 \
  ASSERT_TRUE(tmp.ok()) << #rexpr << ": " << tmp.status().ToString(); \
  lhs = std::move(tmp).value()
// Evaluates a Result; asserts it is OK and assigns (or declares) `lhs` from its value.
#define ASSERT_OK_AND_ASSIGN(lhs, rexpr) \
  DEPOT_TEST_ASSIGN_IMPL(DEPOT_CONCAT(_depot_test_result_, __LINE__), lhs, rexpr)

namespace depot::testing {

// Looks at `done` every 2 ms until it holds or 30 s have passed (far above what any state a
// test waits for needs, 10x and more, so that a busy machine does not fail); whether it held.
// For states the daemon shows only when asked (its status, metrics, tasks).
inline bool Eventually(const std::function<bool()>& done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

// `size` bytes determined by `seed` (splitmix64), the same in every process.
inline std::vector<std::byte> SeededBytes(size_t size, uint64_t seed) {
  std::vector<std::byte> out(size);
  uint64_t x = seed;
  for (size_t i = 0; i < size; i += 8) {
    x += 0x9E3779B97F4A7C15ull;
    uint64_t z = x;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    std::memcpy(out.data() + i, &z, std::min<size_t>(8, size - i));
  }
  return out;
}

inline uint64_t Xxh3(std::span<const std::byte> bytes) {
  return XXH3_64bits(bytes.data(), bytes.size());
}

// XXH3-64 of data then metadata, as the daemon computes an object's checksum.
inline uint64_t Xxh3(std::span<const std::byte> data, std::span<const std::byte> metadata) {
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  XXH3_64bits_update(state, data.data(), data.size());
  XXH3_64bits_update(state, metadata.data(), metadata.size());
  const uint64_t sum = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return sum;
}

inline std::span<const std::byte> AsBytes(std::string_view s) {
  return std::as_bytes(std::span(s.data(), s.size()));
}

inline bool SameBytes(std::span<const std::byte> a, std::span<const std::byte> b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size()) == 0);
}

}  // namespace depot::testing
