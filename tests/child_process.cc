#include "child_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <optional>
#include <thread>
#include <utility>

#include "daemon_process.h"

extern char** environ;

namespace depot::testing {

namespace {

static_assert(kSignalExitBase == 128, "the exit codes of launch::ExitCodeOf");

// Waits for `pid` up to `timeout`; returns its exit code, or nullopt if it is still running.
std::optional<int> WaitFor(pid_t pid, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    int status = 0;
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) return launch::ExitCodeOf(status);
    if (r < 0 && errno != EINTR) return -1;
    if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

}  // namespace

ChildProcess ChildProcess::Start(std::function<int()> body) {
  std::fflush(nullptr);  // nothing buffered in the parent is written twice
  const pid_t pid = ::fork();
  if (pid < 0) {
    std::perror("fork");
    return ChildProcess();
  }
  if (pid == 0) {
    // A child left behind by a crashed test run must not live on.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    int code = kChildThrew;
    try {
      code = body();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child %d: exception: %s\n", ::getpid(), e.what());
    } catch (...) {
      std::fprintf(stderr, "child %d: unknown exception\n", ::getpid());
    }
    std::fflush(nullptr);
    ::_exit(code);
  }
  return ChildProcess(pid);
}

ChildProcess::ChildProcess(ChildProcess&& other) noexcept : pid_(std::exchange(other.pid_, -1)) {}

ChildProcess& ChildProcess::operator=(ChildProcess&& other) noexcept {
  if (this != &other) {
    if (running()) {
      Kill(SIGKILL);
      Wait();
    }
    pid_ = std::exchange(other.pid_, -1);
  }
  return *this;
}

ChildProcess::~ChildProcess() {
  if (running()) {
    Kill(SIGKILL);
    Wait();
  }
}

int ChildProcess::Wait(std::chrono::milliseconds timeout) {
  if (!running()) return -1;
  std::optional<int> code = WaitFor(pid_, timeout);
  if (!code) {
    std::fprintf(stderr, "child %d did not finish within %lld ms; killing it\n", pid_,
                 static_cast<long long>(timeout.count()));
    ::kill(pid_, SIGKILL);
    WaitFor(pid_, std::chrono::seconds(10));
    code = -1;
  }
  pid_ = -1;
  return *code;
}

bool ChildProcess::Kill(int signo) { return running() && ::kill(pid_, signo) == 0; }

int RunInChild(std::function<int()> body, std::chrono::milliseconds timeout) {
  ChildProcess child = ChildProcess::Start(std::move(body));
  return child.Wait(timeout);
}

int ChildFailed(int code, const std::string& what) {
  std::fprintf(stderr, "child %d: %s\n", ::getpid(), what.c_str());
  return code;
}

ReadyPipe::ReadyPipe() {
  if (::pipe2(fds_, O_CLOEXEC) != 0) std::perror("pipe2");
}

ReadyPipe::~ReadyPipe() {
  for (int fd : fds_) {
    if (fd >= 0) ::close(fd);
  }
}

void ReadyPipe::Signal() {
  const char byte = 1;
  while (::write(fds_[1], &byte, 1) < 0 && errno == EINTR) {
  }
}

bool ReadyPipe::PassOnExec(int fd) {
  // dup2 onto another number gives a descriptor without O_CLOEXEC; onto the same one it
  // changes nothing, so clear the flag by hand.
  if (fds_[1] == fd) return ::fcntl(fd, F_SETFD, 0) == 0;
  return ::dup2(fds_[1], fd) == fd;
}

bool ReadyPipe::Wait(std::chrono::milliseconds timeout) {
  pollfd p{fds_[0], POLLIN, 0};
  int r;
  do {
    r = ::poll(&p, 1, static_cast<int>(timeout.count()));
  } while (r < 0 && errno == EINTR);
  if (r <= 0) return false;
  char byte = 0;
  return ::read(fds_[0], &byte, 1) == 1;
}

ProgramRun RunProgram(const std::vector<std::string>& argv,
                      const std::map<std::string, std::string>& env,
                      std::chrono::milliseconds timeout) {
  ProgramRun run;
  if (argv.empty()) return run;
  // Everything the child needs is prepared before fork: between fork and exec only
  // async-signal-safe calls are allowed.
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string entry = *e;
    const std::string key = entry.substr(0, entry.find('='));
    if (!env.contains(key)) env_strings.push_back(std::move(entry));
  }
  for (const auto& [key, value] : env) env_strings.push_back(key + "=" + value);
  std::vector<char*> envp;
  for (std::string& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);

  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0) return run;
  if (::pipe2(err, O_CLOEXEC) != 0) {
    ::close(out[0]);
    ::close(out[1]);
    return run;
  }
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    ::dup2(out[1], STDOUT_FILENO);
    ::dup2(err[1], STDERR_FILENO);
    const int devnull = ::open("/dev/null", O_RDONLY);
    if (devnull >= 0) ::dup2(devnull, STDIN_FILENO);
    ::execve(args[0], args.data(), envp.data());
    static const char kMsg[] = "exec failed\n";
    (void)!::write(STDERR_FILENO, kMsg, sizeof(kMsg) - 1);
    ::_exit(127);
  }
  ::close(out[1]);
  ::close(err[1]);
  if (pid < 0) {
    ::close(out[0]);
    ::close(err[0]);
    return run;
  }

  const auto deadline = std::chrono::steady_clock::now() + timeout;
  pollfd fds[2] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}};
  std::string* sinks[2] = {&run.out, &run.err};
  int open_fds = 2;
  bool timed_out = false;
  while (open_fds > 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      break;
    }
    const int r = ::poll(fds, 2, static_cast<int>(left.count()));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) continue;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      char buf[65536];
      const ssize_t n = ::read(fds[i].fd, buf, sizeof(buf));
      if (n > 0) {
        sinks[i]->append(buf, static_cast<size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        ::close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      }
    }
  }
  for (pollfd& p : fds) {
    if (p.fd >= 0) ::close(p.fd);
  }
  if (timed_out) {
    std::fprintf(stderr, "%s did not finish within %lld ms; killing it\n", argv[0].c_str(),
                 static_cast<long long>(timeout.count()));
    ::kill(pid, SIGKILL);
    WaitFor(pid, std::chrono::seconds(10));
    return run;
  }
  run.exit_code = WaitFor(pid, std::chrono::seconds(10)).value_or(-1);
  return run;
}

}  // namespace depot::testing
