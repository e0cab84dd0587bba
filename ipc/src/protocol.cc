#include "depot/ipc/protocol.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>

namespace depot::ipc {

StatusCode FromWire(wire::ErrorCode code) {
  auto v = static_cast<uint16_t>(code);
  if (v > static_cast<uint16_t>(kLastStatusCode)) return StatusCode::kInternal;
  return static_cast<StatusCode>(v);
}

Status StatusFromReply(wire::Reply::Reader reply) {
  if (reply.getError() == wire::ErrorCode::OK) return Status::OK();
  return Status(FromWire(reply.getError()), reply.getMessage().cStr());
}

std::string DefaultSocketPath() {
  if (const char* env = std::getenv("DEPOT_SOCKET"); env != nullptr && *env != '\0') return env;
  if (const char* run = std::getenv("XDG_RUNTIME_DIR"); run != nullptr && *run != '\0') {
    struct stat st {};
    if (::stat(run, &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == ::getuid()) {
      return std::string(run) + "/depot.sock";
    }
  }
  return "/tmp/depot-" + std::to_string(::getuid()) + ".sock";
}

}  // namespace depot::ipc
