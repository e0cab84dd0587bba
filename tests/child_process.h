// Other processes for integration tests: forked clients and command-line tools.
//
// A forked child must not touch GoogleTest's state (its assertions would be reported by the
// child, then lost): it runs a plain function that returns an exit code, and reports
// problems on stderr. ChildFailed() makes that one line.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace depot::testing {

// Exit codes of a child killed by signal S are reported as 128 + S, as shells do.
inline constexpr int kSignalExitBase = 128;
// What a child whose body threw returns.
inline constexpr int kChildThrew = 125;

// A forked process running a function. Killed (SIGKILL) and reaped on destruction if still
// running.
class ChildProcess {
 public:
  // Forks; the child runs `body` and leaves with _exit(body()), without running destructors
  // or atexit handlers of the parent's objects.
  static ChildProcess Start(std::function<int()> body);

  ChildProcess() = default;
  ChildProcess(ChildProcess&& other) noexcept;
  ChildProcess& operator=(ChildProcess&& other) noexcept;
  ~ChildProcess();

  pid_t pid() const { return pid_; }
  bool running() const { return pid_ > 0; }

  // Waits for the child to end and returns its exit code (128 + signal if a signal killed
  // it). If it has not ended after `timeout`, kills it and returns -1.
  int Wait(std::chrono::milliseconds timeout = std::chrono::seconds(30));
  // Sends `signo`; returns whether the signal was sent.
  bool Kill(int signo);

 private:
  explicit ChildProcess(pid_t pid) : pid_(pid) {}
  pid_t pid_ = -1;
};

// Forks a child that runs `body` and returns its exit code (see ChildProcess::Wait).
int RunInChild(std::function<int()> body,
               std::chrono::milliseconds timeout = std::chrono::seconds(30));

// For use in a child: prints "child <pid>: <what>" to stderr and returns `code`, so a failed
// check reads `if (bad) return ChildFailed(3, "...");`.
int ChildFailed(int code, const std::string& what);

// A one-way pipe for a child to tell its parent it has reached a point (e.g. holds its
// references). Create it before forking.
class ReadyPipe {
 public:
  ReadyPipe();
  ~ReadyPipe();
  ReadyPipe(const ReadyPipe&) = delete;
  ReadyPipe& operator=(const ReadyPipe&) = delete;

  // Child side: writes one byte.
  void Signal();
  // Child side, before exec: makes the write end descriptor `fd` of the program the child
  // execs, which signals by writing one byte to it. Returns false (errno set) on failure.
  bool PassOnExec(int fd);
  // Parent side: waits for that byte; false if it did not come within `timeout` (or the
  // child ended first).
  bool Wait(std::chrono::milliseconds timeout);

 private:
  int fds_[2] = {-1, -1};
};

// A command-line program run to completion.
struct ProgramRun {
  int exit_code = -1;  // 128 + signal if killed by one; -1 if it could not run or timed out
  std::string out;     // its stdout
  std::string err;     // its stderr

  // Its exit status, stdout and stderr: what a failed expectation about it should show.
  std::string Explain() const {
    return "exit " + std::to_string(exit_code) + "\nstdout: " + out + "\nstderr: " + err;
  }
};

// Runs `argv` (argv[0] is the path of the program) with `env` added to this process's
// environment, and waits up to `timeout` for it to finish.
ProgramRun RunProgram(const std::vector<std::string>& argv,
                      const std::map<std::string, std::string>& env = {},
                      std::chrono::milliseconds timeout = std::chrono::seconds(30));

}  // namespace depot::testing
