#include "daemon_process.h"

#include <sched.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <thread>

namespace depot::launch {

pid_t Spawn(const std::vector<std::string>& argv, const SpawnOptions& options, std::string* error) {
  // Everything the child uses is made here: between fork and exec it makes only
  // async-signal-safe calls.
  if (argv.empty()) {
    *error = "no program to run (empty argv)";
    return -1;
  }
  std::vector<std::string> args = argv;
  std::vector<char*> arg_ptrs;
  for (std::string& a : args) arg_ptrs.push_back(a.data());
  arg_ptrs.push_back(nullptr);
  const std::string exec_failed = "exec of " + args[0] + " failed: errno ";
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  if (options.cpu >= 0) CPU_SET(options.cpu, &cpus);
  static const char kNotPinned[] = "cannot pin the daemon to its CPU; it runs unpinned\n";

  std::fflush(nullptr);  // nothing buffered here is written twice
  const pid_t pid = ::fork();
  if (pid < 0) {
    *error = std::string("fork: ") + std::strerror(errno);
    return -1;
  }
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, options.death_signal);
    if (options.output_fd >= 0) {
      ::dup2(options.output_fd, STDOUT_FILENO);
      ::dup2(options.output_fd, STDERR_FILENO);
    }
    if (options.cpu >= 0 && ::sched_setaffinity(0, sizeof(cpus), &cpus) != 0) {
      (void)!::write(STDERR_FILENO, kNotPinned, sizeof(kNotPinned) - 1);
    }
    ::execv(arg_ptrs[0], arg_ptrs.data());
    // errno in decimal, without the C library's formatting (not async-signal-safe).
    char digits[16];
    size_t n = sizeof(digits);
    digits[--n] = '\n';
    for (int e = errno; n > 0 && (e != 0 || n == sizeof(digits) - 1); e /= 10) {
      digits[--n] = static_cast<char>('0' + e % 10);
    }
    (void)!::write(STDERR_FILENO, exec_failed.data(), exec_failed.size());
    (void)!::write(STDERR_FILENO, digits + n, sizeof(digits) - n);
    ::_exit(127);
  }
  return pid;
}

bool Accepts(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  ::close(fd);
  return ok;
}

int ExitCodeOf(int wait_status) {
  return WIFEXITED(wait_status) ? WEXITSTATUS(wait_status) : 128 + WTERMSIG(wait_status);
}

std::optional<int> TryReap(pid_t pid) {
  int status = 0;
  if (::waitpid(pid, &status, WNOHANG) != pid) return std::nullopt;
  return ExitCodeOf(status);
}

std::string DescribeExit(int code) {
  return code >= 128 ? "was killed by signal " + std::to_string(code - 128) + " (" +
                           strsignal(code - 128) + ")"
                     : "exited with status " + std::to_string(code);
}

std::string AwaitAccepting(pid_t* pid, const std::string& socket,
                           std::chrono::milliseconds deadline) {
  const auto end = std::chrono::steady_clock::now() + deadline;
  for (;;) {
    if (Accepts(socket)) return "";
    if (std::optional<int> code = TryReap(*pid)) {
      *pid = -1;
      return "depotd " + DescribeExit(*code) + " before accepting connections";
    }
    if (std::chrono::steady_clock::now() >= end) {
      return "depotd did not accept connections at " + socket + " within " +
             std::to_string(deadline.count()) + " ms";
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

std::optional<int> Terminate(pid_t pid, std::chrono::milliseconds deadline) {
  ::kill(pid, SIGTERM);
  const auto end = std::chrono::steady_clock::now() + deadline;
  for (;;) {
    if (std::optional<int> code = TryReap(pid)) return code;
    if (std::chrono::steady_clock::now() >= end) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return std::nullopt;
}

}  // namespace depot::launch
