// Starting and stopping a depotd child process: what the tests' TestDaemon (tests/daemon.h)
// and the benchmarks' Daemon (bench/daemon.h) share. Each wraps it in its own error
// handling: a test records a failure, a benchmark exits.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace depot::launch {

struct SpawnOptions {
  // Where the daemon's stdout and stderr go; -1: wherever this process's go.
  int output_fd = -1;
  // >= 0: the daemon (all its threads) runs on that CPU only.
  int cpu = -1;
  // What the daemon receives when this process dies, so that none is left behind.
  int death_signal = SIGTERM;
};

// Forks and executes argv (argv[0]: the daemon binary's path; not empty). Returns the
// child's pid, or -1 with *error saying why. A failing exec makes the child exit with
// status 127, after saying so (with errno) on its output.
pid_t Spawn(const std::vector<std::string>& argv, const SpawnOptions& options, std::string* error);

// Whether something accepts connections on the Unix socket at `path`.
bool Accepts(const std::string& path);

// The exit code a waitpid() status stands for: the process's exit status, or 128 + N if
// signal N killed it.
int ExitCodeOf(int wait_status);

// The exit code of child `pid` if it has exited (ExitCodeOf), reaping it; nullopt while it
// runs.
std::optional<int> TryReap(pid_t pid);

// "exited with status N" or "was killed by signal N (name)", for an exit code of TryReap.
std::string DescribeExit(int code);

// Waits until the daemon `*pid` accepts connections at `socket`. Returns the empty string
// once it does; otherwise why not: it exited (then *pid becomes -1), or `deadline` passed.
std::string AwaitAccepting(pid_t* pid, const std::string& socket,
                           std::chrono::milliseconds deadline);

// Sends SIGTERM to `pid` and waits up to `deadline` for it to exit. Returns its exit code;
// nullopt if it did not exit in time, in which case it was killed with SIGKILL and reaped.
std::optional<int> Terminate(pid_t pid, std::chrono::milliseconds deadline);

}  // namespace depot::launch
