#include "daemon.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "daemon_process.h"

namespace depot::bench {

namespace {

[[noreturn]] void Die(const std::string& why) {
  std::fprintf(stderr, "bench: %s\n", why.c_str());
  std::exit(1);
}

}  // namespace

Daemon::Daemon(const std::vector<std::string>& flags, int cpu) : owner_(::getpid()) {
  char dir[] = "/tmp/depot-bench-XXXXXX";
  if (::mkdtemp(dir) == nullptr) Die(std::string("mkdtemp: ") + std::strerror(errno));
  dir_ = dir;
  socket_path_ = dir_ + "/depot.sock";

  // DEPOT_BENCH_DAEMON runs another build's depotd instead, for before/after figures.
  const char* other = std::getenv("DEPOT_BENCH_DAEMON");
  std::vector<std::string> argv{other != nullptr && *other != '\0' ? other : DEPOT_DAEMON_PATH,
                                "--socket", socket_path_, "--log-level", "warn"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  std::string error;
  // A benchmark that crashes must not leave its daemon behind (SpawnOptions::death_signal).
  pid_ = launch::Spawn(argv, {.cpu = cpu}, &error);
  if (pid_ < 0) Die(error);
  error = launch::AwaitAccepting(&pid_, socket_path_, std::chrono::seconds(10));
  if (!error.empty()) Die(error + " (its messages, if any, are above)");
}

Daemon::~Daemon() {
  if (::getpid() != owner_) return;
  if (pid_ > 0) launch::Terminate(pid_, std::chrono::seconds(10));
  ::unlink(socket_path_.c_str());
  ::rmdir(dir_.c_str());
}

}  // namespace depot::bench
