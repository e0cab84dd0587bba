#include "store/accept_retry.h"

#include <spdlog/spdlog.h>

#include <cerrno>

namespace depot::store {

void AcceptRetry::Failed(const boost::system::error_code& ec, const std::string& context,
                         std::function<void()> accept_again) {
  const bool exhausted = ec == boost::asio::error::no_descriptors || ec.value() == ENFILE ||
                         ec == boost::asio::error::no_buffer_space ||
                         ec == boost::asio::error::no_memory;
  uint64_t held_back = 0;
  if (log_.Allow(&held_back)) {
    spdlog::warn("{}: accept failed: {}{} ({}{})", what_, ec.message(),
                 held_back == 0 ? "" : fmt::format(", and {} more times before", held_back),
                 context,
                 exhausted ? "; new connections wait until descriptors free up (ulimit -n)" : "");
  }
  if (!exhausted) return accept_again();
  timer_.expires_after(kPause);
  timer_.async_wait([again = std::move(accept_again)](const boost::system::error_code& waited) {
    if (!waited) again();
  });
}

}  // namespace depot::store
