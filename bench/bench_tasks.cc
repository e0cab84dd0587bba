// The scheduler: task throughput and latency end to end, the cost of one placement, and
// what placement by locality saves against random placement (bench/README.md).
//
//   socket_rtt/64B            the baseline: a raw round trip over a socketpair to an echo thread
//   noop_throughput/N         batches of N no-op tasks submitted at once (SubmitMany), run by
//                             C++ workers (depot::Worker threads of this program, one
//                             connection each), each batch awaited with one Get
//   submit_to_start           one no-op task at a time: from before Submit to the start of the
//                             worker's function, median and p99
//   placement/64w8g10k        the scheduler alone (no daemon): with 64 workers on 8 GPUs busy
//                             and 10,000 ready tasks queued, one completion and the placement
//                             it triggers
//   locality/cost, /random    a pipeline of GPU stages on simulated GPUs: bytes copied between
//                             devices and wall time, depot's placement against random
#include <benchmark/benchmark.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "daemon.h"
#include "depot/client.h"
#include "depot/worker.h"
#include "latency.h"
#include "scheduler/scheduler.h"
#include "socket_echo.h"

namespace {

using depot::bench::Latencies;
using Clock = std::chrono::steady_clock;

constexpr char kBaseline[] = "socket_rtt/64B";
std::map<std::string, Latencies> g_latencies;

double BaselineMedianNs() {
  auto it = g_latencies.find(kBaseline);
  return it == g_latencies.end() ? 0 : it->second.Median();
}

void Check(const depot::Status& status, const char* what) {
  if (!status.ok()) {
    std::fprintf(stderr, "bench_tasks: %s: %s\n", what, status.ToString().c_str());
    std::exit(1);
  }
}

void SocketRoundTrip(benchmark::State& state) {
  Latencies run = depot::bench::MeasureRoundTrips(state, 64);
  g_latencies[kBaseline].AddRun(run);
  state.counters["median_us"] = run.Median() / 1e3;
  state.counters["p99_us"] = run.Quantile(0.99) / 1e3;
}

// Worker threads of this program, attached to `socket`, each with `cpus` slots, running
// "noop" (seals its outputs empty) and "stamp" (records when it starts, then as noop).
class Workers {
 public:
  Workers(const std::string& socket, int count, double cpus) {
    for (int i = 0; i < count; ++i) {
      auto worker = depot::Worker::Connect({.socket_path = socket, .name = "bench", .cpus = cpus});
      Check(worker.status(), "worker connect");
      auto noop = [](depot::TaskContext& task) -> depot::Status {
        for (size_t k = 0; k < task.outputs().size(); ++k) DEPOT_RETURN_NOT_OK(task.Put(k, {}));
        return depot::Status::OK();
      };
      (*worker)->Register("noop", noop);
      (*worker)->Register("stamp", [this, noop](depot::TaskContext& task) {
        started_ns_.store(Clock::now().time_since_epoch().count());
        return noop(task);
      });
      workers_.push_back(std::move(worker).value());
    }
    for (auto& w : workers_) {
      threads_.emplace_back([w = w.get()] { Check(w->Run(), "worker run"); });
    }
  }
  ~Workers() {
    for (auto& w : workers_) w->Stop();
    for (auto& t : threads_) t.join();
  }
  int64_t started_ns() const { return started_ns_.load(); }

 private:
  std::vector<std::unique_ptr<depot::Worker>> workers_;
  std::vector<std::thread> threads_;
  std::atomic<int64_t> started_ns_{0};
};

// Waits until the daemon has `count` workers attached.
void AwaitWorkers(depot::Client& client, size_t count) {
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  for (;;) {
    auto workers = client.Workers();
    Check(workers.status(), "workers");
    if (workers->size() >= count) return;
    if (Clock::now() > deadline) Check(depot::Status::Timeout("workers"), "attach");
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void NoopThroughput(benchmark::State& state) {
  const size_t batch = static_cast<size_t>(state.range(0));
  const double cpus = static_cast<double>(state.range(1));
  depot::bench::Daemon daemon(
      {"--memory", "1GiB", "--pipeline", state.range(2) != 0 ? "on" : "off"});
  auto client = depot::Client::Connect(daemon.socket_path());
  Check(client.status(), "connect");
  Workers workers(daemon.socket_path(), 1, cpus);
  AwaitWorkers(*client, 1);
  std::vector<depot::TaskRequest> tasks(batch, depot::TaskRequest{.function = "noop"});
  const auto run_batch = [&] {
    auto outputs = client->Submit(tasks);
    Check(outputs.status(), "submit");
    std::vector<depot::ObjectId> ids;
    ids.reserve(batch);
    for (auto& o : *outputs) ids.push_back(o[0]);
    Check(client->Get(ids, depot::kForever).status(), "get");
  };
  // Untimed: the arena's first segments, the worker's threads and connections warm up.
  for (int i = 0; i < 3; ++i) run_batch();
  uint64_t done = 0;
  const auto start = Clock::now();
  for (auto _ : state) {
    run_batch();
    done += batch;
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  state.SetItemsProcessed(static_cast<int64_t>(done));
  state.counters["tasks_per_s"] = static_cast<double>(done) / seconds;
  // Tasks done in the time of one raw round trip of the baseline.
  if (BaselineMedianNs() > 0) {
    state.counters["tasks_per_rtt"] =
        static_cast<double>(done) / seconds * BaselineMedianNs() / 1e9;
  }
}

void SubmitToStart(benchmark::State& state) {
  depot::bench::Daemon daemon({"--memory", "256MiB"});
  auto client = depot::Client::Connect(daemon.socket_path());
  Check(client.status(), "connect");
  Workers workers(daemon.socket_path(), 1, 1);
  AwaitWorkers(*client, 1);
  const depot::TaskRequest stamp{.function = "stamp"};
  for (int i = 0; i < 100; ++i) {  // untimed warm-up
    auto outputs = client->Submit(stamp);
    Check(outputs.status(), "submit");
    Check(client->Get((*outputs)[0], depot::kForever).status(), "get");
  }
  Latencies run;
  for (auto _ : state) {
    const int64_t submitted = Clock::now().time_since_epoch().count();
    auto outputs = client->Submit(stamp);
    Check(outputs.status(), "submit");
    auto got = client->Get((*outputs)[0], depot::kForever);
    Check(got.status(), "get");
    run.Add(static_cast<double>(workers.started_ns() - submitted));
  }
  g_latencies["submit_to_start"].AddRun(run);
  state.counters["median_us"] = run.Median() / 1e3;
  state.counters["p99_us"] = run.Quantile(0.99) / 1e3;
  if (BaselineMedianNs() > 0)
    state.counters["ratio_to_socket_rtt"] = run.Median() / BaselineMedianNs();
}

// The scheduler alone, against a store that answers from a table and workers that take what
// they are sent.
class TableStore final : public depot::scheduler::StoreAccess {
 public:
  void Locate(std::span<const depot::ObjectId> ids, std::span<Object> out) const override {
    for (size_t i = 0; i < ids.size(); ++i) {
      auto it = where.find(ids[i]);
      out[i] = it == where.end() ? Object{} : Object{State::kSealed, it->second};
    }
  }
  std::string FailureOf(const depot::ObjectId&) const override { return {}; }
  void Prefetch(std::span<const depot::ObjectId>, int32_t) override {}
  bool Hold(const depot::ObjectId&) override { return true; }
  void Drop(const depot::ObjectId&) override {}
  void SealFailed(std::span<const depot::ObjectId>, std::string_view) override {}
  uint64_t Room(int32_t) const override { return UINT64_MAX; }
  bool CanSpill() const override { return false; }
  bool Spill(const depot::ObjectId&) override { return false; }
  void AbortCreating(uint64_t, std::span<const depot::ObjectId>) override {}
  void Delete(const depot::ObjectId&) override {}
  depot::Status Charge(uint64_t, int64_t) override { return depot::Status::OK(); }
  depot::scheduler::Bandwidths CopyBandwidths(
      const depot::scheduler::Bandwidths& assumed) const override {
    return assumed;
  }

  // A hash table, as the store's own object table is.
  std::unordered_map<depot::ObjectId, depot::scheduler::InputView> where;
};

class CountingLink final : public depot::scheduler::WorkerLink {
 public:
  void Assign(depot::scheduler::SessionId worker,
              std::span<const depot::scheduler::Assignment> tasks) override {
    for (const auto& a : tasks) running.push_back({worker, a.task, a.outputs[0]});
  }
  void Drained(depot::scheduler::SessionId) override {}
  struct Running {
    depot::scheduler::SessionId worker;
    depot::scheduler::TaskId task;
    depot::ObjectId output;
  };
  std::vector<Running> running;
};

void OnePlacement(benchmark::State& state) {
  using namespace depot::scheduler;
  TableStore store;
  CountingLink link;
  SchedulerOptions options;
  double now = 0;
  options.clock = [&now] { return now; };
  Scheduler scheduler(store, link, options);
  // 64 workers, 8 on each of 8 GPUs, each with a GPU and 1 CPU slot.
  for (SessionId w = 1; w <= 64; ++w) {
    WorkerSpec spec{.name = "w",
                    .capacity = {.cpu = 1, .gpus = {static_cast<int32_t>((w - 1) % 8)}},
                    .functions = {"f"}};
    Check(scheduler.AddWorker(w, spec), "add worker");
  }
  // Inputs spread over the GPUs and host memory.
  std::mt19937 rng(7);
  std::vector<depot::ObjectId> inputs;
  for (int i = 0; i < 256; ++i) {
    inputs.push_back(depot::ObjectId::Random());
    store.where[inputs.back()] = {uint64_t{1} << (20 + rng() % 6), uint64_t{1} << (rng() % 9)};
  }
  std::vector<TaskSpec> tasks;
  for (int i = 0; i < 10'000 + 64 * 3; ++i) {
    TaskSpec t{.function = "f",
               .inputs = {inputs[rng() % inputs.size()], inputs[rng() % inputs.size()]},
               .resources = {.cpu = 0, .gpu = 1}};
    t.affinity = i % 2 == 0 ? Affinity::kSoft : Affinity::kNone;
    tasks.push_back(std::move(t));
  }
  Check(scheduler.Submit(1000, tasks).status(), "submit");
  const uint64_t placed_before = scheduler.counters().placements;
  size_t next = 0;
  for (auto _ : state) {
    // One task done: its worker takes the next of its window and the daemon places one more.
    if (link.running.size() <= next) {
      state.SkipWithError("ran out of tasks");
      break;
    }
    const auto r = link.running[next++];
    store.where[r.output] = {1 << 20, uint64_t{1} << 1};
    now += 1e-3;
    Completion c{.task = r.task};
    Check(scheduler.Complete(r.worker, std::span(&c, 1)), "complete");
    if (scheduler.counters().tasks_pending < 10'000) {
      state.PauseTiming();
      std::vector<TaskSpec> more(tasks.begin(), tasks.begin() + 1000);
      Check(scheduler.Submit(1000, more).status(), "submit more");
      state.ResumeTiming();
    }
  }
  state.counters["placements"] =
      static_cast<double>(scheduler.counters().placements - placed_before);
  state.counters["queued"] = static_cast<double>(scheduler.counters().tasks_pending);
}

// The cost model alone: one Place over 64 workers on 8 GPUs, every one free, for a GPU task
// with two inputs.
void PlaceAlone(benchmark::State& state) {
  using namespace depot::scheduler;
  std::vector<WorkerView> workers;
  for (int w = 0; w < 64; ++w) {
    WorkerView v;
    v.free_cpu = 1;
    v.gpus.push_back({w % 8, 1.0});
    v.queue_wait_s = 1e-3 * (w % 5);
    workers.push_back(v);
  }
  const std::vector<InputView> inputs{{1 << 24, uint64_t{1} << 3}, {1 << 22, 1}};
  const ResourceRequest request{.cpu = 0, .gpu = 1};
  for (auto _ : state) {
    auto choice = Place(request, Affinity::kSoft, inputs, workers, {.cpu = 1e-3, .gpu = 1e-3}, {});
    benchmark::DoNotOptimize(choice);
  }
}

// A pipeline of GPU stages: `chains` sources of `bytes` on random GPUs of 4, each copied
// through `stages` tasks that may run on any GPU (a worker per GPU). Copies between GPUs
// are what placement should avoid.
void Locality(benchmark::State& state, const char* placement) {
  constexpr int kGpus = 4, kChains = 16, kStages = 6;
  constexpr uint64_t kBytes = 8 << 20;
  // No start-up probe beside the runs: placement times the copies as they come.
  depot::bench::Daemon daemon({"--simulate-gpus", "4:512MiB", "--memory", "512MiB", "--placement",
                               placement, "--bandwidth-probe", "0"});
  auto client = depot::Client::Connect(daemon.socket_path());
  Check(client.status(), "connect");
  std::vector<std::unique_ptr<depot::Worker>> workers;
  std::vector<std::thread> threads;
  for (int g = 0; g < kGpus; ++g) {
    auto w = depot::Worker::Connect(
        {.socket_path = daemon.socket_path(), .name = "gpu", .cpus = 0, .gpus = {g}});
    Check(w.status(), "worker");
    (*w)->Register("copy", [](depot::TaskContext& task) -> depot::Status {
      DEPOT_ASSIGN_OR_RETURN(auto in, task.DeviceInputs());
      DEPOT_ASSIGN_OR_RETURN(
          auto out, task.client().CreateOnDevice(task.outputs()[0], in[0].size(), task.device()));
      std::memcpy(reinterpret_cast<void*>(out.device_ptr()),
                  reinterpret_cast<const void*>(in[0].device_ptr()), in[0].size());
      return task.client().Seal(task.outputs()[0], 0);
    });
    workers.push_back(std::move(w).value());
  }
  for (auto& w : workers) threads.emplace_back([w = w.get()] { Check(w->Run(), "run"); });
  AwaitWorkers(*client, kGpus);
  std::mt19937 rng(11);
  uint64_t moved = 0, local = 0, replicas = 0;
  for (auto _ : state) {
    state.PauseTiming();
    auto before = client->GetStatus();
    Check(before.status(), "status");
    std::vector<depot::TaskRequest> tasks;
    std::vector<depot::ObjectId> last;
    for (int c = 0; c < kChains; ++c) {
      const depot::ObjectId source = depot::ObjectId::Random();
      auto buf = client->CreateOnDevice(source, kBytes, static_cast<int>(rng() % kGpus));
      Check(buf.status(), "create");
      std::memset(reinterpret_cast<void*>(buf->device_ptr()), c, kBytes);
      Check(client->Seal(source), "seal");
      depot::ObjectId previous = source;
      for (int s = 0; s < kStages; ++s) {
        const depot::ObjectId next = depot::ObjectId::Random();
        tasks.push_back(
            {.function = "copy", .inputs = {previous}, .outputs = {next}, .cpu = 0, .gpu = 1});
        previous = next;
      }
      last.push_back(previous);
    }
    state.ResumeTiming();
    Check(client->Submit(tasks).status(), "submit");
    for (const auto& id : last) Check(client->Get(id, depot::kForever).status(), "get");
    state.PauseTiming();
    auto after = client->GetStatus();
    Check(after.status(), "status");
    moved += after->scheduler.moved_bytes - before->scheduler.moved_bytes;
    local += after->scheduler.local_bytes - before->scheduler.local_bytes;
    replicas += after->replicas_made - before->replicas_made;
    Check(client->Evict(0, true).status(), "evict");
    state.ResumeTiming();
  }
  const double runs = static_cast<double>(state.iterations());
  state.counters["moved_MiB_per_run"] = static_cast<double>(moved) / runs / (1 << 20);
  state.counters["local_MiB_per_run"] = static_cast<double>(local) / runs / (1 << 20);
  state.counters["replicas_per_run"] = static_cast<double>(replicas) / runs;
  for (auto& w : workers) w->Stop();
  for (auto& t : threads) t.join();
}

}  // namespace

BENCHMARK(SocketRoundTrip)->Name(kBaseline)->UseRealTime();
BENCHMARK(NoopThroughput)
    ->Name("noop_throughput")
    ->ArgNames({"batch", "cpus", "pipeline"})
    ->Args({1000, 1, 1})
    ->Args({1000, 1, 0})
    ->Args({1000, 4, 1})
    ->Args({1000, 4, 0})
    ->Args({1000, 16, 1})
    ->Args({1000, 16, 0})
    ->Args({10000, 4, 1})
    ->UseRealTime()
    ->MinTime(2)
    ->Unit(benchmark::kMillisecond);
BENCHMARK(SubmitToStart)->Name("submit_to_start")->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(OnePlacement)->Name("placement/64w8g10k")->Unit(benchmark::kMicrosecond);
BENCHMARK(PlaceAlone)->Name("place/64w8g");
BENCHMARK_CAPTURE(Locality, cost, "cost")
    ->Name("locality/cost")
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond)
    ->Iterations(5);
BENCHMARK_CAPTURE(Locality, random, "random")
    ->Name("locality/random")
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond)
    ->Iterations(5);

BENCHMARK_MAIN();
