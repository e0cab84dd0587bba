// bench_scaling: aggregate get throughput of 1, 2, 4, 8 and 16 client processes at once.
//
// Each client is a forked process with its own Client (its own connection), doing get +
// read + release of pre-put 1 KiB objects for a fixed time. Reported: aggregate gets/s, its
// ratio to one client's (measured in the same run), and the CPU the daemon and the clients
// used (in cores), which shows what the throughput is bound by. Runs twice: with the client's
// default reply polling (20 us) and with none (blocking reads), since polling clients compete
// with the daemon for cores.
#include <benchmark/benchmark.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <new>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "daemon.h"
#include "depot/client.h"

namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kObjectBytes = 1024;
constexpr size_t kObjects = 1024;
constexpr int kMaxClients = 16;
constexpr auto kDuration = std::chrono::seconds(2);

// Shared by the parent and its client processes (a MAP_SHARED mapping made before fork).
struct Board {
  std::atomic<int> ready;
  std::atomic<int> failed;
  std::atomic<int64_t> start_ns;  // 0 until every client is ready
  std::atomic<uint64_t> gets[kMaxClients];
};

// Aggregate gets/s of one client, by polling setting, for scaling ratios.
std::map<int64_t, double> g_one_client;

int64_t Now() { return Clock::now().time_since_epoch().count(); }

// A client process: connects, warms up, waits for the start, gets until the deadline.
[[noreturn]] void RunClient(Board* board, int index, const std::string& socket,
                            const std::vector<depot::ObjectId>& ids,
                            std::chrono::microseconds spin) {
  auto client = depot::Client::Connect(socket, {.spin = spin});
  bool ok = client.ok();
  for (size_t i = 0; ok && i < ids.size(); ++i) ok = client->Get(ids[i]).ok();
  if (!ok) board->failed.fetch_add(1);
  board->ready.fetch_add(1);
  if (!ok) ::_exit(1);
  while (board->start_ns.load() == 0) std::this_thread::sleep_for(std::chrono::microseconds(100));
  const int64_t deadline = board->start_ns.load() + Clock::duration(kDuration).count();
  uint64_t count = 0;
  size_t k = static_cast<size_t>(index) * 61;
  while (Now() < deadline) {
    auto buffer = client->Get(ids[k++ % ids.size()]);
    if (!buffer.ok()) {
      board->failed.fetch_add(1);
      ::_exit(1);
    }
    benchmark::DoNotOptimize(buffer->ptr()[buffer->size() - 1]);
    ++count;
  }
  board->gets[index].store(count);
  ::_exit(0);
}

// CPU seconds (user + system) a process has used so far.
double CpuSeconds(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(stat, line);
  // Fields after the command, which is in parentheses and may hold spaces.
  std::istringstream in(line.substr(line.rfind(')') + 2));
  std::string field;
  double utime = 0, stime = 0;
  for (int i = 3; i <= 15 && in >> field; ++i) {
    if (i == 14) utime = std::stod(field);
    if (i == 15) stime = std::stod(field);
  }
  return (utime + stime) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

double ChildrenCpuSeconds() {
  rusage usage{};
  ::getrusage(RUSAGE_CHILDREN, &usage);
  auto seconds = [](const timeval& t) { return t.tv_sec + t.tv_usec / 1e6; };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

void Scaling(benchmark::State& state, const depot::bench::Daemon* daemon,
             const std::vector<depot::ObjectId>* ids) {
  const int clients = static_cast<int>(state.range(0));
  const auto spin = std::chrono::microseconds(state.range(1));
  void* mem =
      ::mmap(nullptr, sizeof(Board), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) {
    state.SkipWithError("mmap failed");
    return;
  }
  Board* board = new (mem) Board{};
  for (auto _ : state) {
    std::vector<pid_t> pids;
    for (int i = 0; i < clients; ++i) {
      const pid_t pid = ::fork();
      if (pid == 0) RunClient(board, i, daemon->socket_path(), *ids, spin);
      if (pid > 0) pids.push_back(pid);
    }
    while (board->ready.load() < static_cast<int>(pids.size())) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    const double daemon_cpu0 = CpuSeconds(daemon->pid());
    const double clients_cpu0 = ChildrenCpuSeconds();
    board->start_ns.store(Now());
    for (pid_t pid : pids) {
      int status = 0;
      ::waitpid(pid, &status, 0);
    }
    const double seconds = std::chrono::duration<double>(kDuration).count();
    const double daemon_cpu = (CpuSeconds(daemon->pid()) - daemon_cpu0) / seconds;
    // Includes each client's connect and warm-up, a small part of its run.
    const double clients_cpu = (ChildrenCpuSeconds() - clients_cpu0) / seconds;
    state.SetIterationTime(seconds);
    if (board->failed.load() > 0 || static_cast<int>(pids.size()) != clients) {
      state.SkipWithError("a client process failed to connect or get");
      break;
    }
    uint64_t total = 0;
    for (int i = 0; i < clients; ++i) total += board->gets[i].load();
    const double rate = static_cast<double>(total) / seconds;
    if (clients == 1) g_one_client[spin.count()] = rate;
    state.SetItemsProcessed(static_cast<int64_t>(total));
    state.counters["gets_per_s"] = rate;
    state.counters["per_client"] = rate / clients;
    if (g_one_client.count(spin.count())) {
      state.counters["scaling_vs_1"] = rate / g_one_client[spin.count()];
    }
    state.counters["daemon_cores"] = daemon_cpu;
    state.counters["client_cores"] = clients_cpu;
  }
  ::munmap(mem, sizeof(Board));
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;

  depot::bench::Daemon daemon({"--memory", "256MiB"});
  std::vector<depot::ObjectId> ids;
  {
    // Dropped before forking: the client processes open connections of their own.
    auto client = depot::Client::Connect(daemon.socket_path());
    if (!client.ok()) {
      std::fprintf(stderr, "bench_scaling: %s\n", client.status().ToString().c_str());
      return 1;
    }
    const std::vector<std::byte> payload(kObjectBytes, std::byte{0x42});
    for (size_t i = 0; i < kObjects; ++i) {
      ids.push_back(depot::ObjectId::FromName("bench_scaling/" + std::to_string(i)));
      if (depot::Status st = client->Put(ids.back(), payload); !st.ok()) {
        std::fprintf(stderr, "bench_scaling: put: %s\n", st.ToString().c_str());
        return 1;
      }
    }
  }
  std::printf("Machine: %u hardware threads. Clients are processes, one Client each.\n",
              std::thread::hardware_concurrency());
  for (int64_t spin : {20, 0}) {
    for (int64_t clients : {1, 2, 4, 8, 16}) {
      benchmark::RegisterBenchmark("get_release/1KiB", Scaling, &daemon, &ids)
          ->ArgNames({"clients", "spin_us"})
          ->Args({clients, spin})
          ->Iterations(1)
          ->UseManualTime()
          ->Unit(benchmark::kMillisecond);
    }
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
