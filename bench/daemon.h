// Daemon: a depotd of the benchmark's own, on a fresh socket, so that a benchmark never
// measures (or disturbs) a daemon someone else is using.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace depot::bench {

class Daemon {
 public:
  // Starts the depotd built with the benchmarks, with `flags` besides --socket, and waits
  // until its socket accepts connections. A benchmark without its daemon has nothing to
  // measure, so on failure this prints why and exits the program.
  // `cpu` >= 0 runs the daemon (all its threads) on that CPU only, so that two daemons
  // compared in one benchmark sit at the same distance from the client.
  explicit Daemon(const std::vector<std::string>& flags, int cpu = -1);
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;
  // Stops the daemon with SIGTERM and waits for it. Does nothing in a forked child: only the
  // process that started the daemon stops it.
  ~Daemon();

  const std::string& socket_path() const { return socket_path_; }
  pid_t pid() const { return pid_; }

 private:
  std::string dir_;
  std::string socket_path_;
  pid_t pid_ = -1;
  pid_t owner_ = -1;
};

}  // namespace depot::bench
