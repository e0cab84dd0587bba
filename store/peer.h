// Who is on the other end of a connection, from SO_PEERCRED, and what its uid may do.
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <cstdint>
#include <string>

namespace depot::store {

// What a client's uid may do (docs/architecture.md, Trust).
enum class Access : uint8_t {
  kNone,   // another uid the daemon does not share with: refused at hello
  kRead,   // a uid or group of --share-with-*: gets, lists and status, nothing that changes objects
  kWrite,  // of --share-writable-with-*: kRead, and creates and deletes its own host objects
  kFull,   // root, or the daemon's own uid
};

// Whether `uid` may do everything: root, and the daemon's own uid.
inline bool IsTrustedUid(uid_t uid) { return uid == 0 || uid == ::geteuid(); }

struct Peer {
  pid_t pid = 0;
  uid_t uid = static_cast<uid_t>(-1);  // unknown until SO_PEERCRED says
  std::string command;                 // /proc/<pid>/comm
  Access access = Access::kNone;
};

}  // namespace depot::store
