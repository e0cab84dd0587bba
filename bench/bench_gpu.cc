// bench_gpu: GPU objects through the store, against the driver's own copies and a raw socket
// round trip measured in the same run.
//
// With --gpus=cuda (the default when the CUDA driver loads and sees a GPU) the daemon serves
// the host's GPUs and the baselines are cuMemcpy calls of this process, from and to pinned
// memory (cuMemHostAlloc) and device memory (cuMemAlloc). With --gpus=simulated (the default
// elsewhere) the daemon serves simulated GPUs, whose copies are memcpy: there the figures
// measure depot's protocol and bookkeeping, not a GPU, and the baselines are memcpy.
//
//   first_import/1KiB  GetOnDevice of a 1 KiB GPU object on a connection that has not
//                      mapped its chunk yet: the chunk's import (cuMemImportFromShareableHandle,
//                      address reserve, map, set access) plus one round trip. The device's
//                      primary context exists already (this process made it): its creation,
//                      which every CUDA program pays once, is not counted. Goal: < 10 ms.
//   warm_get/1KiB      GetOnDevice of the same object on a connection that has its chunk
//                      mapped, and the release: no driver call. Baseline: socket_rtt/1KiB;
//                      host_get/1KiB (Get of a host object) for comparison.
//   h2d/256MiB         Get on GPU 0 of a host object that has no GPU copy yet: the daemon
//                      copies it from its arena (page-locked) on a worker. Baseline: a copy
//                      from pinned memory to device memory. Goal: >= 80% of its bandwidth.
//   d2h/256MiB         Get on host of an object that is on GPU 0 only. Baseline: a copy from
//                      device memory to pinned memory. Goal: >= 80%.
//   d2d/256MiB         Get on GPU 1 of an object that is on GPU 0 only (needs two GPUs).
//                      Baseline: a peer copy between the two devices.
//   first_put/1GiB/growing   CreateOnDevice + Seal of a 1 GiB object on GPU 0, the first
//                      object of a fresh daemon (one per iteration): the pool makes and
//                      exports a chunk for it, and the client imports it.
//   first_put/1GiB/reserved  the same into a daemon started with --gpu-reserve 0:1GiB+64MiB:
//                      the chunk exists at start-up; the client still imports it. Baseline:
//                      the growing case.
#include <benchmark/benchmark.h>
#include <sys/mman.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "daemon.h"
#include "depot/client.h"
#include "latency.h"
#include "socket_echo.h"

#ifdef DEPOT_HAVE_CUDA
#include "depot/ipc/cuda_driver.h"
#endif

namespace {

using depot::Status;
using depot::bench::Latencies;
using Clock = std::chrono::steady_clock;

constexpr uint64_t kSmall = 1024;
constexpr uint64_t kBig = 256ull << 20;
constexpr int kRepetitions = 5;

// Every run's per-operation latencies, by benchmark name, for the summary.
std::map<std::string, Latencies> g_latencies;

void Fail(benchmark::State& state, const Status& st) { state.SkipWithError(st.ToString().c_str()); }

// --- Baselines: the same copies without the store. ----------------------------------------

// Copies kBig bytes between this process's memory and one or two devices.
class Copier {
 public:
  virtual ~Copier() = default;
  // What the baseline is, for the summary.
  virtual std::string what() const = 0;
  virtual Status HostToDevice() = 0;
  virtual Status DeviceToHost() = 0;
  // Needs two devices.
  virtual Status DeviceToDevice() = 0;
};

// For simulated GPUs: memcpy between page-aligned, faulted-in buffers.
class MemcpyCopier : public Copier {
 public:
  MemcpyCopier() {
    for (auto*& b : buffers_) {
      b = static_cast<std::byte*>(::mmap(nullptr, kBig, PROT_READ | PROT_WRITE,
                                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0));
      if (b == MAP_FAILED) {
        std::perror("bench_gpu: mmap");
        std::exit(1);
      }
      std::memset(b, 1, kBig);
    }
  }
  ~MemcpyCopier() override {
    for (auto* b : buffers_) ::munmap(b, kBig);
  }
  std::string what() const override { return "memcpy"; }
  Status HostToDevice() override { return Copy(); }
  Status DeviceToHost() override { return Copy(); }
  Status DeviceToDevice() override { return Copy(); }

 private:
  Status Copy() {
    std::memcpy(buffers_[1], buffers_[0], kBig);
    benchmark::ClobberMemory();
    return Status::OK();
  }
  std::byte* buffers_[2] = {};
};

#ifdef DEPOT_HAVE_CUDA
// cuMemcpy*Async on a stream of this process's own, then cuStreamSynchronize.
class CudaCopier : public Copier {
 public:
  static depot::Result<std::unique_ptr<CudaCopier>> Create(int devices) {
    DEPOT_ASSIGN_OR_RETURN(const depot::ipc::CudaDriver* driver, depot::ipc::CudaDriver::Load());
    std::unique_ptr<CudaCopier> c(new CudaCopier(*driver));
    for (int d = 0; d < std::min(devices, 2); ++d) {
      CUdevice device = 0;
      DEPOT_RETURN_NOT_OK(driver->Check(driver->DeviceGet(&device, d), "cuDeviceGet"));
      CUcontext context = nullptr;
      DEPOT_RETURN_NOT_OK(driver->Check(driver->DevicePrimaryCtxRetain(&context, device),
                                        "cuDevicePrimaryCtxRetain"));
      c->devices_.push_back({device, context, 0});
      DEPOT_RETURN_NOT_OK(c->Enter(d));
      DEPOT_RETURN_NOT_OK(
          driver->Check(driver->MemAlloc(&c->devices_.back().memory, kBig), "cuMemAlloc"));
    }
    DEPOT_RETURN_NOT_OK(c->Enter(0));
    DEPOT_RETURN_NOT_OK(driver->Check(
        driver->MemHostAlloc(&c->pinned_, kBig, CU_MEMHOSTALLOC_PORTABLE), "cuMemHostAlloc"));
    std::memset(c->pinned_, 1, kBig);
    DEPOT_RETURN_NOT_OK(
        driver->Check(driver->StreamCreate(&c->stream_, CU_STREAM_NON_BLOCKING), "cuStreamCreate"));
    return c;
  }

  ~CudaCopier() override {
    if (Enter(0).ok()) {
      if (stream_ != nullptr) driver_.StreamDestroy(stream_);
      if (pinned_ != nullptr) driver_.MemFreeHost(pinned_);
    }
    for (size_t d = 0; d < devices_.size(); ++d) {
      if (Enter(static_cast<int>(d)).ok() && devices_[d].memory != 0) {
        driver_.MemFree(devices_[d].memory);
      }
      driver_.DevicePrimaryCtxRelease(devices_[d].device);
    }
  }

  std::string what() const override { return "cuMemcpy, pinned host memory"; }
  Status HostToDevice() override {
    return Run(driver_.MemcpyHtoDAsync(devices_[0].memory, pinned_, kBig, stream_),
               "cuMemcpyHtoDAsync");
  }
  Status DeviceToHost() override {
    return Run(driver_.MemcpyDtoHAsync(pinned_, devices_[0].memory, kBig, stream_),
               "cuMemcpyDtoHAsync");
  }
  Status DeviceToDevice() override {
    if (devices_.size() < 2) return Status::InvalidArgument("needs two GPUs");
    return Run(driver_.MemcpyPeerAsync(devices_[1].memory, devices_[1].context, devices_[0].memory,
                                       devices_[0].context, kBig, stream_),
               "cuMemcpyPeerAsync");
  }

 private:
  struct Device {
    CUdevice device;
    CUcontext context;
    CUdeviceptr memory;
  };

  explicit CudaCopier(const depot::ipc::CudaDriver& driver) : driver_(driver) {}

  Status Enter(int d) {
    return driver_.Check(driver_.CtxSetCurrent(devices_[d].context), "cuCtxSetCurrent");
  }
  Status Run(CUresult queued, const char* call) {
    DEPOT_RETURN_NOT_OK(driver_.Check(queued, call));
    return driver_.Check(driver_.StreamSynchronize(stream_), "cuStreamSynchronize");
  }

  const depot::ipc::CudaDriver& driver_;
  std::vector<Device> devices_;
  void* pinned_ = nullptr;
  CUstream stream_ = nullptr;
};
#endif

// --- The benchmarks. ------------------------------------------------------------------------

struct Setup {
  std::string socket;
  depot::Client* client = nullptr;
  Copier* copier = nullptr;
  int gpus = 0;
  depot::ObjectId small_gpu;   // kSmall bytes on GPU 0
  depot::ObjectId small_host;  // kSmall bytes on host
};

double MedianOf(const std::string& name) {
  auto it = g_latencies.find(name);
  return it == g_latencies.end() ? 0 : it->second.Median();
}

void Record(benchmark::State& state, const std::string& name, const Latencies& run) {
  state.counters["median_us"] = run.Median() / 1e3;
  g_latencies[name].AddRun(run);
}

void SocketRoundTrip(benchmark::State& state) {
  Record(state, "socket_rtt/1KiB", depot::bench::MeasureRoundTrips(state, kSmall));
}

void FirstImport(benchmark::State& state, const Setup* s) {
  Latencies run;
  for (auto _ : state) {
    auto client = depot::Client::Connect(s->socket);
    if (!client.ok()) return Fail(state, client.status());
    const auto start = Clock::now();
    auto buffer = client->GetOnDevice(s->small_gpu, 0);
    const double ns = static_cast<double>((Clock::now() - start).count());
    if (!buffer.ok()) return Fail(state, buffer.status());
    state.SetIterationTime(ns / 1e9);
    run.Add(ns);
  }
  Record(state, "first_import/1KiB", run);
}

// The first put of 1 GiB on GPU 0 of a fresh daemon started with `flags` (and `reserve`).
void FirstPut(benchmark::State& state, const std::vector<std::string>* flags, bool reserve) {
  const std::string name = reserve ? "first_put/1GiB/reserved" : "first_put/1GiB/growing";
  Latencies run;
  for (auto _ : state) {
    std::vector<std::string> argv = *flags;
    if (reserve) argv.insert(argv.end(), {"--gpu-reserve", "0:1088MiB"});
    depot::bench::Daemon daemon(argv);
    auto client = depot::Client::Connect(daemon.socket_path());
    if (!client.ok()) return Fail(state, client.status());
    const auto id = depot::ObjectId::FromName("bench_gpu/first_put");
    const auto start = Clock::now();
    auto created = client->CreateOnDevice(id, size_t{1} << 30, 0);
    if (!created.ok()) return Fail(state, created.status());
    if (Status st = client->Seal(id); !st.ok()) return Fail(state, st);
    const double ns = static_cast<double>((Clock::now() - start).count());
    state.SetIterationTime(ns / 1e9);
    run.Add(ns);
  }
  Record(state, name, run);
  if (reserve && MedianOf("first_put/1GiB/growing") > 0) {
    state.counters["ratio_to_growing"] = run.Median() / MedianOf("first_put/1GiB/growing");
  }
}

void WarmGet(benchmark::State& state, const Setup* s, bool on_gpu) {
  const std::string name = on_gpu ? "warm_get/1KiB" : "host_get/1KiB";
  // Maps the chunk (or segment) first: what is measured is the warm path.
  if (on_gpu) {
    if (auto first = s->client->GetOnDevice(s->small_gpu, 0); !first.ok()) {
      return Fail(state, first.status());
    }
  }
  Latencies run;
  run.Reserve(state.max_iterations);
  run.Start();
  for (auto _ : state) {
    if (on_gpu) {
      auto buffer = s->client->GetOnDevice(s->small_gpu, 0);
      if (!buffer.ok()) return Fail(state, buffer.status());
      benchmark::DoNotOptimize(buffer->device_ptr());
    } else {
      auto buffer = s->client->Get(s->small_host);
      if (!buffer.ok()) return Fail(state, buffer.status());
      benchmark::DoNotOptimize(buffer->ptr()[0]);
    }
    run.Lap();
  }
  Record(state, name, run);
  if (const double rtt = MedianOf("socket_rtt/1KiB"); rtt > 0) {
    state.counters["ratio_to_socket_rtt"] = run.Median() / rtt;
  }
}

enum class Direction { kHostToDevice, kDeviceToHost, kDeviceToDevice };

const char* NameOf(Direction d) {
  switch (d) {
    case Direction::kHostToDevice:
      return "h2d/256MiB";
    case Direction::kDeviceToHost:
      return "d2h/256MiB";
    case Direction::kDeviceToDevice:
      return "d2d/256MiB";
  }
  return "";
}

// The baseline copy of `direction`, timed alone.
void BaselineCopy(benchmark::State& state, const Setup* s, Direction direction) {
  Latencies run;
  for (auto _ : state) {
    const auto start = Clock::now();
    Status st = direction == Direction::kHostToDevice   ? s->copier->HostToDevice()
                : direction == Direction::kDeviceToHost ? s->copier->DeviceToHost()
                                                        : s->copier->DeviceToDevice();
    const double ns = static_cast<double>((Clock::now() - start).count());
    if (!st.ok()) return Fail(state, st);
    state.SetIterationTime(ns / 1e9);
    run.Add(ns);
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(kBig));
  Record(state, std::string("baseline/") + NameOf(direction), run);
}

// Places a fresh kBig object where `direction` copies from, then times the get that makes
// the copy: the request, the daemon's copy on a worker, and the reply.
void StoreCopy(benchmark::State& state, const Setup* s, Direction direction) {
  depot::Client& client = *s->client;
  Latencies run;
  uint64_t n = 0;
  const std::vector<std::byte> bytes(kBig, std::byte{7});
  for (auto _ : state) {
    const auto id = depot::ObjectId::FromName("bench_gpu/" + std::string(NameOf(direction)) + "/" +
                                              std::to_string(n++));
    if (direction == Direction::kHostToDevice) {
      if (Status st = client.Put(id, bytes); !st.ok()) return Fail(state, st);
    } else {
      // The bytes the GPU holds do not matter to a copy: no need to write them.
      auto created = client.CreateOnDevice(id, kBig, 0);
      if (!created.ok()) return Fail(state, created.status());
      if (Status st = client.Seal(id); !st.ok()) return Fail(state, st);
    }
    const auto start = Clock::now();
    double ns = 0;
    if (direction == Direction::kDeviceToHost) {
      auto buffer = client.Get(id);
      ns = static_cast<double>((Clock::now() - start).count());
      if (!buffer.ok()) return Fail(state, buffer.status());
    } else {
      auto buffer = client.GetOnDevice(id, direction == Direction::kHostToDevice ? 0 : 1);
      ns = static_cast<double>((Clock::now() - start).count());
      if (!buffer.ok()) return Fail(state, buffer.status());
    }
    if (Status st = client.Delete(id); !st.ok()) return Fail(state, st);
    state.SetIterationTime(ns / 1e9);
    run.Add(ns);
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(kBig));
  Record(state, NameOf(direction), run);
  if (const double base = MedianOf(std::string("baseline/") + NameOf(direction)); base > 0) {
    state.counters["share_of_baseline"] = base / run.Median();
  }
}

void PrintSummary(const Setup& s, const std::string& kind) {
  std::printf("\nSummary (%s GPUs; medians over all %d repetitions, measured in this run):\n",
              kind.c_str(), kRepetitions);
  if (kind == "simulated") {
    std::printf(
        "  Simulated GPUs copy with memcpy: these figures are depot's protocol and bookkeeping\n"
        "  cost, not a GPU's.\n");
  }
  const double rtt = MedianOf("socket_rtt/1KiB");
  for (const char* name : {"socket_rtt/1KiB", "host_get/1KiB", "warm_get/1KiB"}) {
    if (const double ns = MedianOf(name); ns > 0) {
      std::printf("  %-22s %10.2f us   %5.2fx socket RTT\n", name, ns / 1e3, ns / rtt);
    }
  }
  if (const double ns = MedianOf("first_import/1KiB"); ns > 0) {
    std::printf("  %-22s %10.3f ms   (goal < 10 ms)\n", "first_import/1KiB", ns / 1e6);
  }
  for (Direction d :
       {Direction::kHostToDevice, Direction::kDeviceToHost, Direction::kDeviceToDevice}) {
    const double store = MedianOf(NameOf(d));
    const double base = MedianOf(std::string("baseline/") + NameOf(d));
    if (store <= 0 || base <= 0) continue;
    std::printf("  %-22s %8.2f GB/s through the store, %8.2f GB/s %s: %5.1f%%\n", NameOf(d),
                kBig / store, kBig / base, s.copier->what().c_str(), 100 * base / store);
  }
  if (s.gpus < 2) std::printf("  d2d/256MiB: skipped, needs two GPUs (this host has one)\n");
  const double growing = MedianOf("first_put/1GiB/growing");
  const double reserved = MedianOf("first_put/1GiB/reserved");
  if (growing > 0 && reserved > 0) {
    std::printf("  %-22s %10.3f ms   into a fresh pool\n", "first_put/1GiB/growing", growing / 1e6);
    std::printf("  %-22s %10.3f ms   %5.2fx the growing pool's\n", "first_put/1GiB/reserved",
                reserved / 1e6, reserved / growing);
  }
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  std::string kind = "auto";
  std::vector<char*> rest = {argv[0]};
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--gpus=", 7) == 0) {
      kind = argv[i] + 7;
    } else {
      rest.push_back(argv[i]);
    }
  }
  int rest_count = static_cast<int>(rest.size());
  if (benchmark::ReportUnrecognizedArguments(rest_count, rest.data())) return 1;
  if (kind != "auto" && kind != "cuda" && kind != "simulated") {
    std::fprintf(stderr, "bench_gpu: --gpus=%s: expected auto, cuda or simulated\n", kind.c_str());
    return 1;
  }

  Setup setup;
  std::unique_ptr<Copier> copier;
#ifdef DEPOT_HAVE_CUDA
  if (kind != "simulated") {
    auto driver = depot::ipc::CudaDriver::Load();
    int count = 0;
    if (driver.ok()) (*driver)->DeviceGetCount(&count);
    if (count > 0) {
      auto cuda = CudaCopier::Create(count);
      if (!cuda.ok()) {
        std::fprintf(stderr, "bench_gpu: %s\n", cuda.status().ToString().c_str());
        return 1;
      }
      copier = std::move(*cuda);
      setup.gpus = count;
      kind = "cuda";
    } else if (kind == "cuda") {
      std::fprintf(stderr, "bench_gpu: --gpus=cuda, but %s\n",
                   driver.ok() ? "the driver sees no GPU" : driver.status().message().c_str());
      return 1;
    }
  }
#endif
  if (kind == "cuda" && !copier) {
    std::fprintf(stderr, "bench_gpu: --gpus=cuda, but this build has no CUDA support\n");
    return 1;
  }
  std::vector<std::string> flags = {"--memory",         "2GiB",   "--segment-size", "1GiB",
                                    "--gpu-chunk-size", "512MiB", "--gpu-memory",   "2GiB"};
  if (!copier) {
    kind = "simulated";
    copier = std::make_unique<MemcpyCopier>();
    setup.gpus = 2;
    // The start-up probe of copy bandwidths would run beside the first figures: on
    // simulated GPUs its copies are as slow as the ones measured here.
    flags.insert(flags.end(), {"--simulate-gpus", "2:2GiB", "--bandwidth-probe", "0"});
  }
  std::printf("bench_gpu: %s GPUs (%d)\n", kind.c_str(), setup.gpus);
  setup.copier = copier.get();

  depot::bench::Daemon daemon(flags);
  auto client = depot::Client::Connect(daemon.socket_path());
  if (!client.ok()) {
    std::fprintf(stderr, "bench_gpu: %s\n", client.status().ToString().c_str());
    return 1;
  }
  setup.socket = daemon.socket_path();
  setup.client = &*client;
  setup.small_gpu = depot::ObjectId::FromName("bench_gpu/small-gpu");
  setup.small_host = depot::ObjectId::FromName("bench_gpu/small-host");
  {
    const std::vector<std::byte> small(kSmall, std::byte{1});
    auto created = client->CreateOnDevice(setup.small_gpu, kSmall, 0);
    Status st = created.ok() ? client->Seal(setup.small_gpu) : created.status();
    if (st.ok()) st = client->Put(setup.small_host, small);
    if (!st.ok()) {
      std::fprintf(stderr, "bench_gpu: setting up: %s\n", st.ToString().c_str());
      return 1;
    }
  }
  // Copies from and to the arena run at full speed once it is page-locked: wait for that.
  for (auto deadline = Clock::now() + std::chrono::seconds(60); Clock::now() < deadline;) {
    auto status = client->GetStatus();
    if (!status.ok() || kind != "cuda" || status->arena_page_locked_bytes >= status->mapped_bytes) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }

  const Setup* s = &setup;
  auto add = [](benchmark::internal::Benchmark* b) {
    b->Repetitions(kRepetitions)->DisplayAggregatesOnly(true);
  };
  add(benchmark::RegisterBenchmark("socket_rtt/1KiB", SocketRoundTrip)->UseRealTime());
  add(benchmark::RegisterBenchmark("host_get/1KiB", WarmGet, s, false)->UseRealTime());
  add(benchmark::RegisterBenchmark("warm_get/1KiB", WarmGet, s, true)->UseRealTime());
  add(benchmark::RegisterBenchmark("first_import/1KiB", FirstImport, s)
          ->UseManualTime()
          ->Iterations(20));
  for (Direction d :
       {Direction::kHostToDevice, Direction::kDeviceToHost, Direction::kDeviceToDevice}) {
    if (d == Direction::kDeviceToDevice && setup.gpus < 2) continue;
    add(benchmark::RegisterBenchmark((std::string("baseline/") + NameOf(d)).c_str(), BaselineCopy,
                                     s, d)
            ->UseManualTime()
            ->Iterations(10));
    add(benchmark::RegisterBenchmark(NameOf(d), StoreCopy, s, d)->UseManualTime()->Iterations(10));
  }
  for (bool reserve : {false, true}) {
    add(benchmark::RegisterBenchmark(reserve ? "first_put/1GiB/reserved" : "first_put/1GiB/growing",
                                     FirstPut, &flags, reserve)
            ->UseManualTime()
            ->Iterations(3)
            ->Unit(benchmark::kMillisecond));
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  PrintSummary(setup, kind);
  return 0;
}
