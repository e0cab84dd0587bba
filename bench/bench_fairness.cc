// bench_fairness: what one client's expensive admin requests cost every other client.
//
// A daemon holds 300,000 small checksummed objects. A victim client times single round
// trips (Contains of an existing object) while, on another connection, a flooder sends one
// kind of request back to back on each of 4 connections for the whole run:
//
//   quiet            no flood: the baseline, measured in the same run
//   flood/largest    ListLargest(1000), as `depotctl ls --largest 1000`
//   flood/verify_all Verify() of every object, as `depotctl verify --all`
//   flood/list       List() of every object, page after page, as `depotctl ls`
//   flood/pipelined  Contains requests pipelined 256 at a time (cheap requests, many)
//
// Reported: the victim's median and p99, and the median's ratio to the quiet one. The
// target is a ratio of at most 2 for every flood.
#include <benchmark/benchmark.h>

#include <atomic>
#include <cstdio>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "daemon.h"
#include "depot/client.h"
#include "latency.h"

namespace {

using depot::bench::Latencies;

constexpr size_t kObjects = 300'000;
constexpr size_t kObjectBytes = 64;
constexpr uint32_t kLargest = 1000;
// Connections (each with a thread) of the flooding process, so that it always has a request
// waiting in the daemon, as a hostile client would.
constexpr int kFlooders = 4;
const char kQuiet[] = "quiet";

depot::bench::Daemon* g_daemon = nullptr;
std::map<std::string, Latencies> g_latencies;
// What the flooders got done, by flood, for the summary.
std::map<std::string, uint64_t> g_flood_requests;

enum class Flood { kNone, kLargest, kVerifyAll, kList, kPipelined };

void Fail(const std::string& what, const depot::Status& st) {
  std::fprintf(stderr, "bench_fairness: %s: %s\n", what.c_str(), st.ToString().c_str());
  std::exit(1);
}

// Sends `flood` requests back to back on `client` until `stop`.
void RunFlooder(depot::Client* client, Flood flood, const std::atomic<bool>& stop,
                std::atomic<uint64_t>& done) {
  const auto probe = depot::ObjectId::FromName("bench_fairness/0");
  std::vector<depot::ObjectId> ids(256, probe);
  while (!stop.load(std::memory_order_relaxed)) {
    depot::Status st;
    switch (flood) {
      case Flood::kNone:
        return;
      case Flood::kLargest:
        st = client->ListLargest(kLargest).status();
        break;
      case Flood::kVerifyAll:
        st = client->Verify().status();
        break;
      case Flood::kList:
        st = client->List().status();
        break;
      case Flood::kPipelined:
        // Gets of one held object are answered locally; Contains always asks the daemon.
        for (int i = 0; i < 256 && st.ok(); ++i) st = client->Contains(probe).status();
        break;
    }
    if (!st.ok()) Fail("flood request", st);
    done.fetch_add(1, std::memory_order_relaxed);
  }
}

void BM_Victim(benchmark::State& state, const std::string& name, Flood flood) {
  auto client = depot::Client::Connect(g_daemon->socket_path());
  if (!client.ok()) Fail("victim connect", client.status());
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> flood_done{0};
  std::vector<depot::Client> flood_clients;
  std::vector<std::thread> flooders;
  for (int i = 0; flood != Flood::kNone && i < kFlooders; ++i) {
    auto c = depot::Client::Connect(g_daemon->socket_path());
    if (!c.ok()) Fail("flooder connect", c.status());
    flood_clients.push_back(std::move(*c));
  }
  for (depot::Client& c : flood_clients) {
    flooders.emplace_back(RunFlooder, &c, flood, std::cref(stop), std::ref(flood_done));
  }
  const auto id = depot::ObjectId::FromName("bench_fairness/12345");
  Latencies run;
  run.Reserve(state.max_iterations);
  run.Start();
  for (auto _ : state) {
    auto found = client->Contains(id);
    if (!found.ok() || !*found) Fail("victim contains", found.status());
    run.Lap();
  }
  stop = true;
  for (auto& flooder : flooders) flooder.join();
  state.counters["median_us"] = run.Median() / 1e3;
  state.counters["p99_us"] = run.Quantile(0.99) / 1e3;
  state.counters["flood_requests"] = static_cast<double>(flood_done.load());
  g_latencies[name].AddRun(run);
  g_flood_requests[name] = flood_done.load();
  if (auto quiet = g_latencies.find(kQuiet); quiet != g_latencies.end() && name != kQuiet) {
    state.counters["x_quiet"] = run.Median() / quiet->second.Median();
  }
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;

  depot::bench::Daemon daemon({"--memory", "1GiB"});
  g_daemon = &daemon;
  {
    auto client = depot::Client::Connect(daemon.socket_path());
    if (!client.ok()) Fail("connect", client.status());
    const std::vector<std::byte> payload(kObjectBytes, std::byte{0x5a});
    std::vector<depot::PutItem> items;
    std::vector<std::string> names;
    for (size_t i = 0; i < kObjects; i += items.size()) {
      items.clear();
      for (size_t k = i; k < std::min(kObjects, i + 10'000); ++k) {
        const std::string name = "bench_fairness/" + std::to_string(k);
        items.push_back({depot::ObjectId::FromName(name), payload, {.checksum = true}});
      }
      for (const depot::Status& st : client->PutMany(items)) {
        if (!st.ok()) Fail("put", st);
      }
    }
  }

  // The quiet baseline first: every flood's ratio is to it.
  const std::pair<const char*, Flood> cases[] = {
      {kQuiet, Flood::kNone},
      {"flood/largest", Flood::kLargest},
      {"flood/verify_all", Flood::kVerifyAll},
      {"flood/list", Flood::kList},
      {"flood/pipelined", Flood::kPipelined},
  };
  for (const auto& [name, flood] : cases) {
    benchmark::RegisterBenchmark(
        name, [name = std::string(name),
               flood = flood](benchmark::State& state) { BM_Victim(state, name, flood); })
        ->MinTime(2.0)
        ->UseRealTime();
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();

  const double quiet = g_latencies[kQuiet].Median();
  std::printf(
      "\nThe victim's median round trip (Contains) while another client floods, over %zu "
      "objects:\n",
      kObjects);
  for (const auto& [name, flood] : cases) {
    const Latencies& l = g_latencies[name];
    std::printf("  %-18s median %8.1f us  p99 %9.1f us  %6.2fx quiet  (%llu flood requests)\n",
                name, l.Median() / 1e3, l.Quantile(0.99) / 1e3, l.Median() / quiet,
                static_cast<unsigned long long>(g_flood_requests[name]));
  }
  std::printf("Target: every flood at most 2x the quiet median.\n");
  return 0;
}
