// Sharing a file the daemon writes with clients that may only read it: arena segments and
// simulated GPU chunks (docs/architecture.md, Trust).
#pragma once

#include <string>

#include "depot/ipc/framing.h"
#include "depot/status.h"

namespace depot::store {

// Seals the memfd `fd` against shrinking and growing (a client holding a read-write
// descriptor could otherwise pull pages from under the daemon's mapping: SIGBUS), unless
// `resizable` (a file in --arena-dir, which cannot be sealed); then returns the same file
// opened read-only, which cannot be mapped writable, and drops the file's mode to 0400, so
// that nobody without root's permission bypass can open it read-write again through
// /proc/<pid>/fd (a memfd is created 0777). Descriptors opened before keep their access.
// `what` names the file in errors.
Result<ipc::UniqueFd> ShareReadOnly(int fd, const std::string& what, bool resizable = false);

}  // namespace depot::store
