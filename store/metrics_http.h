// GET /metrics over HTTP, for a Prometheus server to scrape (depotd --metrics-port).
//
// Runs on the daemon's loop like everything else: rendering the metrics takes microseconds,
// and a scrape every few seconds does not disturb clients. Bound to loopback by default;
// requests are small (at most 8 KiB) and each connection gets 5 seconds to send one.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>

#include <cstdint>
#include <functional>
#include <string>

#include "depot/status.h"
#include "store/accept_retry.h"

namespace depot::store {

class MetricsHttp {
 public:
  MetricsHttp(boost::asio::io_context& loop, std::function<std::string()> render);

  // Listens on `address`:`port` (port 0: any free port; see port()).
  Status Listen(const std::string& address, uint16_t port);
  uint16_t port() const;
  void Close();

 private:
  void Accept();

  boost::asio::ip::tcp::acceptor acceptor_;
  AcceptRetry accept_retry_;
  std::function<std::string()> render_;
};

}  // namespace depot::store
