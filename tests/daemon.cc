#include "daemon.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <thread>

#ifndef DEPOT_DAEMON_PATH
#error "DEPOT_DAEMON_PATH must name the depotd binary (set by tests/CMakeLists.txt)"
#endif

namespace depot::testing {

namespace {

constexpr auto kStartDeadline = std::chrono::seconds(5);
constexpr auto kStopDeadline = std::chrono::seconds(10);

// Flags every test daemon gets unless the test sets them itself.
const std::vector<std::pair<std::string, std::string>> kDefaultFlags = {
    {"--memory", "64MiB"},
    {"--segment-size", "16MiB"},
    {"--log-level", "debug"},
};

bool HasFlag(const std::vector<std::string>& flags, const std::string& name) {
  return std::any_of(flags.begin(), flags.end(),
                     [&](const std::string& f) { return f == name || f.starts_with(name + "="); });
}

// Whether something accepts connections at `path`.
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

std::optional<int> TryReap(pid_t pid) {
  int status = 0;
  if (::waitpid(pid, &status, WNOHANG) != pid) return std::nullopt;
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + WTERMSIG(status);
}

std::string Describe(int code) {
  return code >= 128 ? "was killed by signal " + std::to_string(code - 128) + " (" +
                           strsignal(code - 128) + ")"
                     : "exited with status " + std::to_string(code);
}

}  // namespace

TempDir::TempDir() {
  const char* tmp = std::getenv("TMPDIR");
  std::string templ =
      std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/depot-test-XXXXXX";
  if (::mkdtemp(templ.data()) == nullptr) {
    error_ = "mkdtemp " + templ + ": " + std::strerror(errno);
    return;
  }
  path_ = templ;
}

TempDir::~TempDir() {
  if (path_.empty()) return;
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

TestDaemon::TestDaemon(std::vector<std::string> flags) {
  if (dir_.path().empty()) {
    error_ = dir_.error();
    return;
  }
  socket_path_ = dir() + "/depot.sock";
  for (size_t i = 0; i + 1 < flags.size(); ++i) {
    if (flags[i] == "--socket") socket_path_ = flags[i + 1];
  }
  log_path_ = dir() + "/depotd.log";
  if (socket_path_.size() >= sizeof(sockaddr_un::sun_path)) {
    error_ = "socket path " + socket_path_ + " is too long for a Unix socket; set a shorter TMPDIR";
    return;
  }

  std::vector<std::string> argv = {DEPOT_DAEMON_PATH};
  if (!HasFlag(flags, "--socket")) {
    argv.push_back("--socket");
    argv.push_back(socket_path_);
  }
  for (const auto& [name, value] : kDefaultFlags) {
    if (!HasFlag(flags, name)) {
      argv.push_back(name);
      argv.push_back(value);
    }
  }
  argv.insert(argv.end(), flags.begin(), flags.end());
  std::vector<char*> args;
  for (std::string& a : argv) args.push_back(a.data());
  args.push_back(nullptr);

  const int log_fd = ::open(log_path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (log_fd < 0) {
    error_ = "open " + log_path_ + ": " + std::strerror(errno);
    return;
  }
  {
    std::ostringstream line;
    line << "$";
    for (const std::string& a : argv) line << " " << a;
    line << "\n";
    const std::string s = line.str();
    (void)!::write(log_fd, s.data(), s.size());
  }
  std::fflush(nullptr);
  pid_ = ::fork();
  if (pid_ == 0) {
    // Only async-signal-safe calls between fork and exec.
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    ::dup2(log_fd, STDOUT_FILENO);
    ::dup2(log_fd, STDERR_FILENO);
    ::execv(args[0], args.data());
    static const char kMsg[] = "exec of depotd failed\n";
    (void)!::write(STDERR_FILENO, kMsg, sizeof(kMsg) - 1);
    ::_exit(127);
  }
  ::close(log_fd);
  if (pid_ < 0) {
    error_ = std::string("fork: ") + std::strerror(errno);
    return;
  }

  const auto deadline = std::chrono::steady_clock::now() + kStartDeadline;
  for (;;) {
    if (Accepts(socket_path_)) return;
    if (std::optional<int> code = TryReap(pid_)) {
      pid_ = -1;
      error_ = "depotd " + Describe(*code) + " before accepting connections; its log:\n" + Log();
      return;
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      error_ = "depotd did not accept connections at " + socket_path_ + " within 5 s; its log:\n" +
               Log();
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

TestDaemon::~TestDaemon() { Stop(); }

std::string TestDaemon::Log() const {
  std::ifstream in(log_path_);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

void TestDaemon::Stop() {
  if (pid_ > 0) {
    ::kill(pid_, SIGTERM);
    const auto deadline = std::chrono::steady_clock::now() + kStopDeadline;
    std::optional<int> code;
    while (!(code = TryReap(pid_)) && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (!code) {
      ADD_FAILURE() << "depotd (pid " << pid_ << ") did not exit within 10 s of SIGTERM";
      ::kill(pid_, SIGKILL);
      int status = 0;
      ::waitpid(pid_, &status, 0);
    } else {
      EXPECT_EQ(*code, 0) << "depotd " << Describe(*code) << " after SIGTERM";
      struct stat st {};
      EXPECT_NE(::lstat(socket_path_.c_str(), &st), 0)
          << "depotd left its socket file " << socket_path_ << " behind";
    }
    pid_ = -1;
    if (::testing::Test::HasFailure()) {
      std::fprintf(stderr, "---- depotd log (%s) ----\n%s---- end of depotd log ----\n",
                   log_path_.c_str(), Log().c_str());
    }
  }
}

}  // namespace depot::testing
