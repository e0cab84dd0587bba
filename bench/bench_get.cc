// bench_get: reading objects from depotd, against a raw Unix-socket round trip of the same
// size measured in the same run.
//
//   get_release   Get of a sealed 1 KiB object, read it, drop the Buffer (its release goes
//                 out ahead of the next get), against a daemon that gives no leases
//                 (--lease-entries 0): one real round trip per get, since a client answers
//                 re-gets of objects it still holds from its own table.
//   get_cached    the same while holding another Buffer of the object: no round trip.
//   get_batch     one Get of 1,000 ids, then drop the 1,000 Buffers.
//   get_release/1KiB/no_metrics
//                 get_release against a second daemon started with --no-metrics: the cost
//                 of the daemon's request counters and latency histograms.
//   get_release/1KiB/leased, get_batch/1000/leased
//                 the same against a daemon that gives leases (the default): after the first
//                 get, each is a lease taken and dropped in shared memory, with no round
//                 trip (docs/leases.md); the reads go to the daemon with later releases.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "daemon.h"
#include "depot/client.h"
#include "latency.h"
#include "socket_echo.h"

namespace {

using depot::bench::Latencies;

constexpr size_t kObjectBytes = 1024;
constexpr size_t kBatchIds = 1000;
constexpr int kRepetitions = 5;
const char kBaseline[] = "socket_rtt/1KiB";

// Every run's per-operation latencies, by benchmark name, for the summary.
std::map<std::string, Latencies> g_latencies;

// Reads every byte of the object, as a consumer would.
uint64_t Touch(const depot::Buffer& buffer) {
  uint64_t sum = 0;
  const std::byte* p = buffer.ptr();
  for (size_t i = 0; i + sizeof(uint64_t) <= buffer.size(); i += sizeof(uint64_t)) {
    uint64_t word;
    std::memcpy(&word, p + i, sizeof(word));
    sum += word;
  }
  return sum;
}

double BaselineMedianNs() {
  auto it = g_latencies.find(kBaseline);
  return it == g_latencies.end() ? 0 : it->second.Median();
}

// Sets the run's median and p99 counters and files its latencies under `name`; other runs
// than the baseline also get their ratio to the baseline's median so far.
void Report(benchmark::State& state, const std::string& name, const Latencies& run) {
  state.counters["median_us"] = run.Median() / 1e3;
  state.counters["p99_us"] = run.Quantile(0.99) / 1e3;
  g_latencies[name].AddRun(run);
  if (name != kBaseline && BaselineMedianNs() > 0) {
    state.counters["ratio_to_socket_rtt"] = run.Median() / BaselineMedianNs();
  }
}

void SocketRoundTrip(benchmark::State& state) {
  Report(state, kBaseline, depot::bench::MeasureRoundTrips(state, kObjectBytes));
}

void GetRelease(benchmark::State& state, depot::Client* client, depot::ObjectId id,
                const std::string& name) {
  Latencies run;
  run.Reserve(state.max_iterations);
  run.Start();
  for (auto _ : state) {
    {
      auto buffer = client->Get(id);
      if (!buffer.ok()) {
        state.SkipWithError(buffer.status().ToString().c_str());
        break;
      }
      benchmark::DoNotOptimize(Touch(*buffer));
    }  // the last handle goes: its release is queued for the next request
    run.Lap();
  }
  state.SetItemsProcessed(state.iterations());
  Report(state, name, run);
}

void GetCached(benchmark::State& state, depot::Client* client, depot::ObjectId id) {
  auto held = client->Get(id);
  if (!held.ok()) {
    state.SkipWithError(held.status().ToString().c_str());
    return;
  }
  Latencies run;
  run.Reserve(state.max_iterations);
  run.Start();
  for (auto _ : state) {
    {
      auto buffer = client->Get(id);
      if (!buffer.ok()) {
        state.SkipWithError(buffer.status().ToString().c_str());
        break;
      }
      benchmark::DoNotOptimize(Touch(*buffer));
    }
    run.Lap();
  }
  state.SetItemsProcessed(state.iterations());
  Report(state, "get_cached/1KiB", run);
}

void GetBatch(benchmark::State& state, depot::Client* client,
              const std::vector<depot::ObjectId>* ids, const std::string& name) {
  Latencies get_phase, drop_phase;
  get_phase.Reserve(state.max_iterations);
  drop_phase.Reserve(state.max_iterations);
  for (auto _ : state) {
    const auto t0 = Latencies::Clock::now();
    auto buffers = client->Get(*ids);
    if (!buffers.ok()) {
      state.SkipWithError(buffers.status().ToString().c_str());
      break;
    }
    uint64_t sum = 0;
    size_t found = 0;
    for (const auto& b : *buffers) {
      if (!b) continue;
      sum += static_cast<uint64_t>(b.ptr()[0]);
      ++found;
    }
    benchmark::DoNotOptimize(sum);
    if (found != ids->size()) {
      state.SkipWithError("an object of the batch was not found");
      break;
    }
    const auto t1 = Latencies::Clock::now();
    buffers = std::vector<depot::Buffer>{};  // one release per Buffer
    const auto t2 = Latencies::Clock::now();
    get_phase.Add(static_cast<double>((t1 - t0).count()));
    drop_phase.Add(static_cast<double>((t2 - t1).count()));
  }
  state.SetItemsProcessed(state.iterations() * static_cast<int64_t>(ids->size()));
  state.counters["get_ms"] = get_phase.Median() / 1e6;
  state.counters["drop_ms"] = drop_phase.Median() / 1e6;
  auto single =
      g_latencies.find(name == "get_batch/1000" ? "get_release/1KiB" : "get_release/1KiB/leased");
  if (single != g_latencies.end()) {
    state.counters["speedup_vs_single_gets"] = single->second.Median() *
                                               static_cast<double>(ids->size()) /
                                               (get_phase.Median() + drop_phase.Median());
  }
  g_latencies[name].AddRun(get_phase);
  g_latencies[name + "/drop"].AddRun(drop_phase);
}

void PrintSummary() {
  const double rtt = BaselineMedianNs();
  std::printf("\nSummary: medians over all %d repetitions, measured in this run.\n", kRepetitions);
  // per_second is 1 / median; throughput is 1 / mean, i.e. with the slow tail.
  std::printf("  %-26s %10s %12s %14s %12s\n", "benchmark", "median_us", "per_second",
              "ratio_to_rtt", "throughput");
  for (const char* name :
       {kBaseline, "get_release/1KiB", "get_release/1KiB/no_metrics", "get_release/1KiB/no_spin",
        "get_release/1KiB/leased", "get_cached/1KiB"}) {
    auto it = g_latencies.find(name);
    if (it == g_latencies.end()) continue;
    const double ns = it->second.Median();
    std::printf("  %-26s %10.2f %12.0f %14.2f %12.0f\n", name, ns / 1e3, 1e9 / ns,
                rtt > 0 ? ns / rtt : 0, 1e9 / it->second.Mean());
  }
  for (const std::string name : {"get_batch/1000", "get_batch/1000/leased"}) {
    auto get = g_latencies.find(name);
    auto drop = g_latencies.find(name + "/drop");
    if (get == g_latencies.end() || drop == g_latencies.end()) continue;
    const double ns = get->second.Median() + drop->second.Median();
    std::printf("  %-26s %10.2f %12.0f ids/s (get %.0f us + drop %.0f us per batch)\n",
                name.c_str(), ns / 1e3, kBatchIds * 1e9 / ns, get->second.Median() / 1e3,
                drop->second.Median() / 1e3);
  }
  auto with = g_latencies.find("get_release/1KiB");
  auto without = g_latencies.find("get_release/1KiB/no_metrics");
  if (with != g_latencies.end() && without != g_latencies.end()) {
    std::printf(
        "  metrics cost on get+release: %+.1f%% of the median (with %.2f us, without %.2f us)\n",
        100.0 * (with->second.Median() / without->second.Median() - 1), with->second.Median() / 1e3,
        without->second.Median() / 1e3);
  }
  std::printf(
      "Targets: get_release median <= 2x socket RTT and >= 40,000 gets/s; "
      "get_batch >= 1,000,000 ids/s; metrics cost < 3%%; get_release/leased <= 1 us.\n");
}

}  // namespace

int main(int argc, char** argv) {
  // Repetitions of the benchmarks run in random order, so that the metrics comparison
  // (get_release with and without) is not skewed by which of the two runs first, while the
  // machine is still settling after setup. A flag given on the command line wins.
  std::vector<char*> args(argv, argv + argc);
  std::string interleave = "--benchmark_enable_random_interleaving=true";
  args.insert(args.begin() + 1, interleave.data());
  argc = static_cast<int>(args.size());
  argv = args.data();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;

  // The two daemons whose gets are compared (with and without metrics) run on the same CPU,
  // so that where the scheduler puts each does not decide the comparison (on a 16-core VM
  // it moved the difference between 3% and 17% from run to run).
  const int daemon_cpu = std::thread::hardware_concurrency() >= 2 ? 1 : -1;
  depot::bench::Daemon daemon({"--memory", "256MiB", "--lease-entries", "0"}, daemon_cpu);
  depot::bench::Daemon quiet_daemon({"--memory", "64MiB", "--no-metrics", "--lease-entries", "0"},
                                    daemon_cpu);
  depot::bench::Daemon lease_daemon({"--memory", "64MiB"}, daemon_cpu);
  auto client = depot::Client::Connect(daemon.socket_path());
  auto quiet = depot::Client::Connect(quiet_daemon.socket_path());
  auto no_spin =
      depot::Client::Connect(daemon.socket_path(), {.spin = std::chrono::microseconds(0)});
  auto leasing = depot::Client::Connect(lease_daemon.socket_path());
  for (const auto* c : {&client, &no_spin, &quiet, &leasing}) {
    if (!c->ok()) {
      std::fprintf(stderr, "bench_get: %s\n", c->status().ToString().c_str());
      return 1;
    }
  }
  const std::vector<std::byte> payload(kObjectBytes, std::byte{0x42});
  const auto single = depot::ObjectId::FromName("bench_get/single");
  std::vector<depot::ObjectId> batch;
  for (size_t i = 0; i < kBatchIds; ++i) {
    batch.push_back(depot::ObjectId::FromName("bench_get/batch/" + std::to_string(i)));
  }
  for (depot::Client* c : {&*client, &*leasing}) {
    for (const auto& id : batch) {
      if (depot::Status st = c->Put(id, payload); !st.ok()) {
        std::fprintf(stderr, "bench_get: put: %s\n", st.ToString().c_str());
        return 1;
      }
    }
  }
  for (depot::Client* c : {&*client, &*quiet, &*leasing}) {
    if (depot::Status st = c->Put(single, payload); !st.ok()) {
      std::fprintf(stderr, "bench_get: put: %s\n", st.ToString().c_str());
      return 1;
    }
  }

  depot::Client* c = &*client;
  depot::Client* ns = &*no_spin;
  benchmark::RegisterBenchmark(kBaseline, SocketRoundTrip)
      ->Repetitions(kRepetitions)
      ->UseRealTime()
      ->DisplayAggregatesOnly(true);
  benchmark::RegisterBenchmark("get_release/1KiB", GetRelease, c, single,
                               std::string("get_release/1KiB"))
      ->Repetitions(kRepetitions)
      ->UseRealTime()
      ->DisplayAggregatesOnly(true);
  benchmark::RegisterBenchmark("get_release/1KiB/no_metrics", GetRelease, &*quiet, single,
                               std::string("get_release/1KiB/no_metrics"))
      ->Repetitions(kRepetitions)
      ->UseRealTime()
      ->DisplayAggregatesOnly(true);
  benchmark::RegisterBenchmark("get_release/1KiB/no_spin", GetRelease, ns, single,
                               std::string("get_release/1KiB/no_spin"))
      ->Repetitions(kRepetitions)
      ->UseRealTime()
      ->DisplayAggregatesOnly(true);
  benchmark::RegisterBenchmark("get_cached/1KiB", GetCached, c, single)
      ->Repetitions(kRepetitions)
      ->UseRealTime()
      ->DisplayAggregatesOnly(true);
  benchmark::RegisterBenchmark("get_batch/1000", GetBatch, c, &batch, std::string("get_batch/1000"))
      ->Repetitions(kRepetitions)
      ->UseRealTime()
      ->DisplayAggregatesOnly(true);
  benchmark::RegisterBenchmark("get_release/1KiB/leased", GetRelease, &*leasing, single,
                               std::string("get_release/1KiB/leased"))
      ->Repetitions(kRepetitions)
      ->UseRealTime()
      ->DisplayAggregatesOnly(true);
  benchmark::RegisterBenchmark("get_batch/1000/leased", GetBatch, &*leasing, &batch,
                               std::string("get_batch/1000/leased"))
      ->Repetitions(kRepetitions)
      ->UseRealTime()
      ->DisplayAggregatesOnly(true);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  PrintSummary();
  return 0;
}
