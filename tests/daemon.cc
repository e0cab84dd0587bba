#include "daemon.h"

#include <fcntl.h>
#include <signal.h>
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

#include "daemon_process.h"

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
  // A configuration file gives the daemon its settings: the defaults would override it.
  for (const auto& [name, value] : kDefaultFlags) {
    if (!HasFlag(flags, name) && !HasFlag(flags, "--config")) {
      argv.push_back(name);
      argv.push_back(value);
    }
  }
  argv.insert(argv.end(), flags.begin(), flags.end());

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
  pid_ = launch::Spawn(argv, {.output_fd = log_fd}, &error_);
  ::close(log_fd);
  if (pid_ < 0) return;
  error_ = launch::AwaitAccepting(&pid_, socket_path_, kStartDeadline);
  if (!error_.empty()) error_ += "; its log:\n" + Log();
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
    if (std::optional<int> code = launch::Terminate(pid_, kStopDeadline); !code) {
      ADD_FAILURE() << "depotd (pid " << pid_ << ") did not exit within 10 s of SIGTERM";
    } else {
      EXPECT_EQ(*code, 0) << "depotd " << launch::DescribeExit(*code) << " after SIGTERM";
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

void TestDaemon::Kill() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  int status = 0;
  while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  pid_ = -1;
}

uint64_t PrivateResidentKiB(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.starts_with("RssAnon:")) return std::stoull(line.substr(8));
  }
  ADD_FAILURE() << "no RssAnon in /proc/" << pid << "/status";
  return 0;
}

}  // namespace depot::testing
