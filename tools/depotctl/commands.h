// depotctl's commands. Each connects to the daemon at `socket` (empty: $DEPOT_SOCKET, then
// the default path), writes its result to stdout, and returns why it failed, if it did.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "depot/status.h"

namespace depot::ctl {

// The daemon's capacity, usage and counters: host memory, each GPU's pool, the copies
// between tiers, and how many objects are on each tier (counted from the object list).
Status ShowStatus(const std::string& socket, bool json);

// The daemon's metrics in the Prometheus text format, as served at /metrics.
Status PrintMetrics(const std::string& socket);

// Which objects `ls` shows, and how. Every option is checked before the daemon is asked.
struct ListOptions {
  bool json = false;
  std::string name_glob;   // fnmatch pattern the name must match; empty: any
  std::string state;       // creating or sealed; empty: either
  std::string min_size;    // a size (ipc::ParseSize): data of at least this many bytes
  std::string older_than;  // a duration (ParseDuration): created at least this long ago
  bool held = false;       // referenced by some client
  std::string sort;        // size (largest first), age (oldest first), refs (most first),
                           // name; empty: slot order
  size_t limit = 0;        // at most this many, after sorting; 0: all
  // host (objects with a copy in host memory), gpu (with a copy on any GPU), or gpuK (on
  // the daemon's GPU K); empty: all. There is no disk tier yet.
  std::string tier;
  std::string device;  // a GPU index K, as status lists them: objects on that GPU
};
// The objects in the store that pass the filters.
Status ListObjects(const std::string& socket, const ListOptions& options);

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

// One object in full: every header field, each replica (host memory, GPUs), its checksum
// and the clients holding it, with their references by tier. With `hexdump` (a size, e.g.
// 256 or 4KiB), also the first bytes of its data as `hexdump -C` shows them, read through a
// Get from host memory. Fails with NotFound naming the object, and with InvalidArgument
// for a hexdump of an object that has no copy in host memory (it is not copied there).
Status ShowObject(const std::string& socket, const std::string& target, bool json,
                  const std::string& hexdump);

// The clients connected to the daemon, and what each holds.
Status ListClients(const std::string& socket, bool json);

// Recomputes the checksums of `targets` (ids or names), or with `all` of every object that
// has one, and reports each. Fails (after the report, with a summary) if any object does
// not match its checksum or a named object does not exist.
Status VerifyObjects(const std::string& socket, const std::vector<std::string>& targets, bool all,
                     bool json);

// Evicts unreferenced, unpinned objects, least recently used first, until `bytes` (a size)
// are freed, or with `all_unreferenced` all of them; exactly one of the two must be given.
Status EvictObjects(const std::string& socket, const std::string& bytes, bool all_unreferenced,
                    bool json);

// Tasks (task_commands.cc).
struct SubmitOptions {
  std::string function;
  std::vector<std::string> inputs;  // ids or names
  std::string args;                 // inline argument bytes
  uint32_t outputs = 1;
  std::string resources;  // "GPU=1,CPU=0,ssd=1"; empty: CPU=1
  std::string affinity;   // none, soft or hard
  std::string variant;    // auto, cpu or gpu
  int32_t priority = 0;
  uint32_t retries = 1;
  std::string label;  // what `tasks` shows of it
  // What its outputs take (a size, ipc::ParseSize), if known: it starts only where they fit.
  std::string output_bytes;
  std::string kind;   // outputs expected as large as the most its kind made so far
  bool wait = false;  // wait for the outputs; fail with the task's message if it failed
};
// Submits one task and prints its output ids, one per line.
Status SubmitTask(const std::string& socket, const SubmitOptions& options);
// The workers attached: resources in use of each's total, tasks running, queued, done and
// failed, and the rate of those done since it attached.
Status ListWorkers(const std::string& socket, bool json);
// The pending tasks, then the last finished ones: state, worker and device, and why there
// (input bytes local and moved, the estimate's queue wait, transfer and duration terms).
Status ListTasks(const std::string& socket, bool json);

struct TopOptions {
  double interval = 1.0;  // seconds between frames, from 0.1 to 86400
  bool once = false;      // one frame as plain text, even on a terminal
  size_t iterations = 0;  // stop after this many frames; 0: when the user quits (q)
};
// A live view of the daemon (top.cc), redrawn every `interval`: memory per tier, object
// counts, request and byte rates, the largest objects, the clients. On a terminal (stdin
// and stdout both) it takes the whole screen until q, Ctrl-C or SIGTERM, and always gives
// the terminal back as it was. Otherwise, or with `once`, it prints plain frames: one, or
// `iterations`. Fails, with the terminal given back, if the daemon goes away.
Status ShowTop(const std::string& socket, const TopOptions& options);

}  // namespace depot::ctl
