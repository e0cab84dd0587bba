// bench_first_get: what a fresh process pays for its first get of a small object, as a
// function of how much of the arena is in use (issue 14). Each measurement is a new process
// (this program run again with --child), so nothing is mapped or warm in it.
//
//   first_get/arena_GiB:N   a daemon with N GiB of objects in shared segments of the
//                           default 1 GiB, and an 80-byte object in the last one. The child
//                           connects, then times its first Get of that object and reads it.
//                           Counters: get_us (median), get_ratio_to_socket_rtt, and for that
//                           process rss_growth_KiB (VmRSS after the get less before it),
//                           rss_KiB and pte_KiB (VmPTE: its page tables) after it.
//   socket_rtt/64B          the baseline: a round trip over a Unix socket to an echo thread.
//
// Flags besides Google Benchmark's: --arena_GiB=1,8,16 (the fill levels; each needs that much
// free memory).
#include <benchmark/benchmark.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "daemon.h"
#include "depot/client.h"
#include "socket_echo.h"

extern char** environ;

namespace {

using depot::bench::Latencies;

constexpr uint64_t kGiB = uint64_t{1} << 30;
const char kBaseline[] = "socket_rtt/64B";
const depot::ObjectId kSmall = depot::ObjectId::FromName("bench_first_get/small");

std::string g_self;  // this program, for the children
std::map<std::string, Latencies> g_latencies;

// A field of /proc/self/status in KiB ("VmRSS", "VmPTE").
uint64_t StatusKiB(const std::string& field) {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind(field + ":", 0) == 0) return std::stoull(line.substr(field.size() + 1));
  }
  return 0;
}

// The child: connect, then the first get, timed; prints "get_ns rss_before rss_after pte".
int Child(const std::string& socket) {
  auto client = depot::Client::Connect(socket);
  if (!client.ok()) {
    std::fprintf(stderr, "child: %s\n", client.status().ToString().c_str());
    return 1;
  }
  const uint64_t rss_before = StatusKiB("VmRSS");
  const auto start = std::chrono::steady_clock::now();
  auto buffer = client->Get(kSmall);
  if (!buffer.ok()) {
    std::fprintf(stderr, "child: get: %s\n", buffer.status().ToString().c_str());
    return 1;
  }
  volatile std::byte first = buffer->ptr()[0];  // read it, as a consumer would
  (void)first;
  const auto ns =
      std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start);
  std::printf("%.0f %lu %lu %lu\n", ns.count(), static_cast<unsigned long>(rss_before),
              static_cast<unsigned long>(StatusKiB("VmRSS")),
              static_cast<unsigned long>(StatusKiB("VmPTE")));
  return 0;
}

struct ChildResult {
  double get_ns = 0;
  uint64_t rss_before = 0, rss_after = 0, pte = 0;
};

// Runs a child against `socket` and reads what it measured.
bool RunChild(const std::string& socket, ChildResult& out) {
  int pipe_fds[2];
  if (::pipe(pipe_fds) != 0) return false;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&actions, pipe_fds[0]);
  std::string flag = "--child=" + socket;
  char* argv[] = {g_self.data(), flag.data(), nullptr};
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, g_self.c_str(), &actions, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(pipe_fds[1]);
  std::string text;
  char buf[256];
  for (ssize_t n; (n = ::read(pipe_fds[0], buf, sizeof buf)) > 0;) text.append(buf, n);
  ::close(pipe_fds[0]);
  int status = 0;
  if (rc != 0 || ::waitpid(pid, &status, 0) != pid || !WIFEXITED(status) ||
      WEXITSTATUS(status) != 0) {
    return false;
  }
  std::istringstream in(text);
  return static_cast<bool>(in >> out.get_ns >> out.rss_before >> out.rss_after >> out.pte);
}

double BaselineMedianNs() {
  auto it = g_latencies.find(kBaseline);
  return it == g_latencies.end() ? 0 : it->second.Median();
}

void SocketRoundTrip(benchmark::State& state) {
  Latencies run = depot::bench::MeasureRoundTrips(state, 64);
  state.counters["median_us"] = run.Median() / 1e3;
  g_latencies[kBaseline].AddRun(run);
}

void FirstGet(benchmark::State& state, const std::string* socket, uint64_t gib) {
  Latencies run;
  std::vector<double> growth, rss, pte;
  for (auto _ : state) {
    ChildResult r;
    if (!RunChild(*socket, r)) {
      state.SkipWithError("the child process failed");
      return;
    }
    state.SetIterationTime(r.get_ns / 1e9);
    run.Add(r.get_ns);
    growth.push_back(static_cast<double>(r.rss_after - std::min(r.rss_after, r.rss_before)));
    rss.push_back(static_cast<double>(r.rss_after));
    pte.push_back(static_cast<double>(r.pte));
  }
  const auto median = [](std::vector<double> v) {
    std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
    return v[v.size() / 2];
  };
  state.counters["arena_GiB"] = static_cast<double>(gib);
  state.counters["get_us"] = run.Median() / 1e3;
  state.counters["rss_growth_KiB"] = median(growth);
  state.counters["rss_KiB"] = median(rss);
  state.counters["pte_KiB"] = median(pte);
  if (BaselineMedianNs() > 0) {
    state.counters["get_ratio_to_socket_rtt"] = run.Median() / BaselineMedianNs();
  }
}

// Fills `gib` GiB of the daemon's arena with objects of a whole shared segment each (not
// written: the daemon allocates their pages), then puts the small object after them.
bool Fill(const std::string& socket, uint64_t gib) {
  auto client = depot::Client::Connect(socket);
  if (!client.ok()) return false;
  for (uint64_t i = 0; i < gib; ++i) {
    const auto id = depot::ObjectId::FromName("bench_first_get/fill/" + std::to_string(i));
    auto buffer = client->Create(id, kGiB);
    if (!buffer.ok() || !client->Seal(id).ok()) {
      std::fprintf(stderr, "bench_first_get: fill: %s\n", buffer.status().ToString().c_str());
      return false;
    }
  }
  const std::string text(80, 'x');
  return client->Put(kSmall, std::as_bytes(std::span(text))).ok();
}

}  // namespace

int main(int argc, char** argv) {
  g_self = "/proc/self/exe";
  std::vector<uint64_t> sizes = {1, 8, 16};
  std::vector<char*> rest;
  for (int i = 0; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--child=", 0) == 0) return Child(arg.substr(8));
    if (arg.rfind("--arena_GiB=", 0) == 0) {
      sizes.clear();
      std::stringstream list(arg.substr(12));
      for (std::string item; std::getline(list, item, ',');) sizes.push_back(std::stoull(item));
      continue;
    }
    rest.push_back(argv[i]);
  }
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  if (n > 0) g_self.assign(self, static_cast<size_t>(n));
  int rest_argc = static_cast<int>(rest.size());
  benchmark::Initialize(&rest_argc, rest.data());
  if (benchmark::ReportUnrecognizedArguments(rest_argc, rest.data())) return 1;

  benchmark::RegisterBenchmark(kBaseline, SocketRoundTrip)->UseRealTime();
  std::vector<std::unique_ptr<depot::bench::Daemon>> daemons;
  std::vector<std::unique_ptr<std::string>> sockets;
  for (uint64_t gib : sizes) {
    const std::string memory = std::to_string(gib + 1) + "GiB";
    daemons.push_back(std::make_unique<depot::bench::Daemon>(
        std::vector<std::string>{"--memory", memory, "--client-max-bytes", "0"}));
    sockets.push_back(std::make_unique<std::string>(daemons.back()->socket_path()));
    if (!Fill(*sockets.back(), gib)) return 1;
    const std::string name = "first_get/arena_GiB:" + std::to_string(gib);
    benchmark::RegisterBenchmark(name.c_str(), FirstGet, sockets.back().get(), gib)
        ->UseManualTime()
        ->Iterations(20)
        ->Unit(benchmark::kMicrosecond);
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  std::printf(
      "Targets: a fresh process's first get <= 1 ms and <= 2 MB (2048 KiB) RSS growth, "
      "whatever the arena holds.\n");
  return 0;
}
