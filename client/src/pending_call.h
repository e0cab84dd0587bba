// What a depot::Pending holds: the request sent, and the connection its answer comes on.
#pragma once

#include <memory>

#include "connection.h"

namespace depot::internal {

struct PendingCall {
  std::shared_ptr<Connection> conn;
  // The request, awaiting or holding its reply; null when nothing was asked of the daemon
  // (every id answered from what the client held).
  std::unique_ptr<Connection::Pending> request;
  bool taken = false;
};

}  // namespace depot::internal
