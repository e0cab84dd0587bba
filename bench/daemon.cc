#include "daemon.h"

#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace depot::bench {

namespace {

[[noreturn]] void Die(const std::string& why) {
  std::fprintf(stderr, "bench: %s\n", why.c_str());
  std::exit(1);
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

}  // namespace

Daemon::Daemon(const std::vector<std::string>& flags, int cpu) : owner_(::getpid()) {
  char dir[] = "/tmp/depot-bench-XXXXXX";
  if (::mkdtemp(dir) == nullptr) Die(std::string("mkdtemp: ") + std::strerror(errno));
  dir_ = dir;
  socket_path_ = dir_ + "/depot.sock";

  std::vector<std::string> args{DEPOT_DAEMON_PATH, "--socket", socket_path_, "--log-level", "warn"};
  args.insert(args.end(), flags.begin(), flags.end());
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  pid_ = ::fork();
  if (pid_ < 0) Die(std::string("fork: ") + std::strerror(errno));
  if (pid_ == 0) {
    // A benchmark that crashes must not leave its daemon behind.
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (cpu >= 0) {
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(cpu, &set);
      if (::sched_setaffinity(0, sizeof(set), &set) != 0) {
        std::fprintf(stderr, "bench: cannot pin depotd to CPU %d: %s\n", cpu, std::strerror(errno));
      }
    }
    ::execv(argv[0], argv.data());
    std::fprintf(stderr, "bench: cannot run %s: %s\n", argv[0], std::strerror(errno));
    ::_exit(127);
  }

  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!Accepts(socket_path_)) {
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      Die("depotd exited before accepting connections (see its message above)");
    }
    if (std::chrono::steady_clock::now() > deadline) {
      Die("depotd did not accept connections on " + socket_path_ + " within 10 s");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

Daemon::~Daemon() {
  if (::getpid() != owner_) return;
  if (pid_ > 0) {
    ::kill(pid_, SIGTERM);
    int status = 0;
    ::waitpid(pid_, &status, 0);
  }
  ::unlink(socket_path_.c_str());
  ::rmdir(dir_.c_str());
}

}  // namespace depot::bench
