// depotctl's commands. Each connects to the daemon at `socket` (empty: $DEPOT_SOCKET, then
// the default path), writes its result to stdout, and returns why it failed, if it did.
#pragma once

#include <string>
#include <vector>

#include "depot/status.h"

namespace depot::ctl {

// The daemon's capacity, usage and counters.
Status ShowStatus(const std::string& socket, bool json);

// Every object in the store, in slot order.
Status ListObjects(const std::string& socket, bool json);

struct PutOptions {
  std::string file;
  std::string name;  // empty: a random id
  bool pin = false;
  bool checksum = false;
};
// Stores a file's bytes as a new object and prints its id.
Status PutFile(const std::string& socket, const PutOptions& options);

// Writes an object's data to `output` ("-": stdout). `target` is a 32-hex-digit id or a name.
Status GetFile(const std::string& socket, const std::string& target, const std::string& output);

// Deletes objects (ids or names). Tries every one; reports each failure on stderr.
Status RemoveObjects(const std::string& socket, const std::vector<std::string>& targets);

}  // namespace depot::ctl
