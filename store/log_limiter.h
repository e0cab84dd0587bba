// LogLimiter: one message of a kind per interval, with a count of the ones held back, so a
// condition that repeats thousands of times a second (a client-driven failure, accept out of
// descriptors) costs the log one line per interval rather than a line each time.
//
// Used on the loop thread only: no locks.
#pragma once

#include <chrono>
#include <cstdint>

namespace depot::store {

class LogLimiter {
 public:
  explicit LogLimiter(std::chrono::steady_clock::duration interval = std::chrono::seconds(5))
      : interval_(interval) {}

  // Whether to log this occurrence. When it returns true, `*held_back` is the number of
  // occurrences not logged since the last one that was.
  bool Allow(uint64_t* held_back) {
    const auto now = std::chrono::steady_clock::now();
    if (logged_once_ && now - last_ < interval_) {
      ++held_back_;
      return false;
    }
    logged_once_ = true;
    last_ = now;
    *held_back = held_back_;
    held_back_ = 0;
    return true;
  }

 private:
  const std::chrono::steady_clock::duration interval_;
  std::chrono::steady_clock::time_point last_{};
  bool logged_once_ = false;
  uint64_t held_back_ = 0;
};

}  // namespace depot::store
