// AcceptRetry: what a listening socket does when accept fails.
//
// Out of descriptors (or kernel memory), the connection stays queued and the next accept
// fails again at once: retrying straight away is a busy loop that serves no one and floods
// the log. So after such a failure the listener waits a moment before accepting again (the
// sessions it has go on being served meanwhile), and failures are logged once per interval
// with a count. Other failures (a peer that gave up while queued) are retried at once.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>

#include <chrono>
#include <functional>
#include <string>

#include "store/log_limiter.h"

namespace depot::store {

class AcceptRetry {
 public:
  static constexpr std::chrono::milliseconds kPause{100};

  // `what` names the listener in the log ("accept failed" follows it).
  AcceptRetry(boost::asio::io_context& loop, std::string what) : timer_(loop), what_(what) {}

  // After a failed accept: logs it (limited), then runs `accept_again` at once or after
  // kPause. `context` is appended to the log line (e.g. the number of sessions).
  void Failed(const boost::system::error_code& ec, const std::string& context,
              std::function<void()> accept_again);
  // Drops a pending retry (the listener is closing).
  void Cancel() { timer_.cancel(); }

 private:
  boost::asio::steady_timer timer_;
  const std::string what_;
  LogLimiter log_;
};

}  // namespace depot::store
