// TestDaemon: a real depotd process for one test, on a socket of its own.
//
// Integration tests start the daemon binary the build produced (DEPOT_DAEMON_PATH), talk to
// it through its socket exactly as users do, and check on the way out that it shuts down
// cleanly: SIGTERM makes it exit with status 0 and remove its socket file.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace depot::testing {

// A fresh directory under $TMPDIR (default /tmp), removed with its contents on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  // Empty if the directory could not be made; error() says why.
  const std::string& path() const { return path_; }
  const std::string& error() const { return error_; }

 private:
  std::string path_;
  std::string error_;
};

class TestDaemon {
 public:
  // Starts depotd with `flags` (e.g. {"--memory", "8MiB"}) in a fresh temporary directory,
  // and waits up to 5 s until it accepts connections. Flags the test does not give get
  // defaults: a socket in that directory, and small sizes (--memory 64MiB, --segment-size
  // 16MiB) so tests stay cheap, and --log-level debug; with --config, only the socket (the
  // file gives the rest). Check ok() (and print error()) before
  // using it.
  explicit TestDaemon(std::vector<std::string> flags = {});
  // Stops the daemon (see Stop) and removes the temporary directory.
  ~TestDaemon();
  TestDaemon(const TestDaemon&) = delete;
  TestDaemon& operator=(const TestDaemon&) = delete;

  // Whether the daemon started and accepts connections; error() says why not.
  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }

  const std::string& socket_path() const { return socket_path_; }
  // A temporary directory of this test's own, removed afterwards.
  const std::string& dir() const { return dir_.path(); }
  pid_t pid() const { return pid_; }
  // Everything the daemon wrote to stdout and stderr so far.
  std::string Log() const;

  // Sends SIGTERM and waits (up to 10 s, then SIGKILL); records a test failure unless the
  // daemon exited with status 0 and removed its socket file. Prints the daemon's log if the
  // current test has failed. Idempotent; the destructor calls it.
  void Stop();
  // Kills the daemon with SIGKILL, as a crash would, and reaps it: nothing is checked of how
  // it ended, and its socket file stays. Idempotent.
  void Kill();

 private:
  TempDir dir_;
  std::string socket_path_;
  std::string log_path_;
  std::string error_;
  pid_t pid_ = -1;
};

// A process's private resident memory (RssAnon in /proc/<pid>/status, KiB): for a daemon,
// its heap and stacks, not the arena it shares with clients. 0, with a test failure, if it
// cannot be read.
uint64_t PrivateResidentKiB(pid_t pid);

}  // namespace depot::testing
