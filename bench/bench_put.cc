// bench_put: writing objects into depotd, against baselines measured in the same run.
//
//   put/1KiB           create + write + seal of a fresh 1 KiB object, and the release of the
//                      creator's reference (Client::Put), against a raw 1 KiB socket round
//                      trip. /no_spin: a client that does not poll for replies (blocking
//                      reads, as the baseline).
//   put/256MiB/warm    create + write + seal + release of a fresh 256 MiB object in an arena
//                      whose pages are already allocated (a first put was deleted), against
//                      memcpy of 256 MiB into an already-faulted, page-aligned heap buffer.
//                      The source is page-aligned too, and the arena empty, so the object
//                      lands page-aligned.
//   Put/1GiB/again     Client::Put of a fresh 1 GiB object, larger than a segment (256 MiB
//                      here), each deleted before the next: the daemon keeps the segment of
//                      the last one and the client its view, so this is what a repeated
//                      put of model weights or a large array costs; against memcpy of 1 GiB
//                      into an already-faulted buffer on one thread (memcpy/1GiB/warm), on
//                      one copy thread and on the default. Also of 4 GiB where the machine
//                      has room (then against memcpy/4GiB/warm).
//   put/1GiB/again     the same, Client::Put's steps timed one by one (create, copy, seal).
//   .../new_client     the same from a new client each time: it maps the kept segment anew
//                      and populates its view (as a new worker process's first put does).
//   Put/1GiB/first     a first put of 1 GiB: every object gets a new file (depotd
//                      --no-keep-large), whose pages the writer and a worker of the daemon
//                      allocate as it is written; against memcpy into freshly mapped
//                      anonymous memory (memcpy/1GiB/fresh: what any new buffer of 1 GiB
//                      costs, page allocation included). /no_backfill: without the
//                      daemon's worker (depotd --no-prefault).
//   .../after_64B      the same behind a live 64-byte object, so the object starts 64 bytes
//                      into a page; against memcpy to a buffer 64 bytes into a page. glibc's
//                      memcpy loses 3-4x when the destination is a little (16..~1000 bytes)
//                      ahead of the source modulo 4 KiB (4K aliasing); this pair shows how
//                      much of that a put inherits from where the store places the object.
#include <benchmark/benchmark.h>
#include <sys/mman.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "daemon.h"
#include "depot/client.h"
#include "latency.h"
#include "socket_echo.h"

namespace {

using depot::bench::Latencies;

constexpr size_t kSmallBytes = 1024;
constexpr size_t kLargeBytes = size_t{256} << 20;
constexpr size_t kHugeBytes = size_t{1} << 30;
constexpr size_t kGiantBytes = size_t{4} << 30;
constexpr size_t kPage = 4096;
const char kRtt[] = "socket_rtt/1KiB";

// Every run's per-operation latencies, by benchmark name, for ratios and the summary.
std::map<std::string, Latencies> g_latencies;
// Fresh ids: no put ever reuses one, deleted or not.
uint64_t g_next_id = 1;
// put_many/1KiB's median time per object, one entry per repetition.
std::vector<double> g_put_many_per_object_ns;

double MedianNs(const std::string& name) {
  auto it = g_latencies.find(name);
  return it == g_latencies.end() ? 0 : it->second.Median();
}

// Page faults this process has taken so far that needed no I/O.
uint64_t MinorFaults() {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  return static_cast<uint64_t>(usage.ru_minflt);
}

// Page-aligned private memory, every page already faulted in.
class PageBuffer {
 public:
  explicit PageBuffer(size_t bytes) : bytes_(bytes) {
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    data_ = p == MAP_FAILED ? nullptr : static_cast<std::byte*>(p);
    if (data_ != nullptr) std::memset(data_, 0x42, bytes);
  }
  PageBuffer(const PageBuffer&) = delete;
  PageBuffer& operator=(const PageBuffer&) = delete;
  ~PageBuffer() {
    if (data_ != nullptr) ::munmap(data_, bytes_);
  }
  std::byte* data() const { return data_; }

 private:
  size_t bytes_;
  std::byte* data_;
};

// MemAvailable of /proc/meminfo, in bytes; 0 if unknown.
uint64_t AvailableBytes() {
  std::ifstream meminfo("/proc/meminfo");
  for (std::string key; meminfo >> key;) {
    uint64_t kib = 0;
    meminfo >> kib;
    if (key == "MemAvailable:") return kib * 1024;
    meminfo.ignore(64, '\n');
  }
  return 0;
}

// Deletes `ids`, in requests the daemon's batch limit allows.
depot::Status DeleteAll(depot::Client& client, const std::vector<depot::ObjectId>& ids) {
  constexpr size_t kChunk = 10'000;
  for (size_t i = 0; i < ids.size(); i += kChunk) {
    const size_t n = std::min(kChunk, ids.size() - i);
    DEPOT_RETURN_NOT_OK(client.Delete(std::span(ids).subspan(i, n)));
  }
  return depot::Status::OK();
}

void SocketRoundTrip(benchmark::State& state) {
  const Latencies run = depot::bench::MeasureRoundTrips(state, kSmallBytes);
  state.counters["median_us"] = run.Median() / 1e3;
  g_latencies[kRtt].AddRun(run);
}

void PutSmall(benchmark::State& state, depot::Client* client, const std::string& name) {
  const std::vector<std::byte> payload(kSmallBytes, std::byte{0x42});
  std::vector<depot::ObjectId> ids;
  ids.reserve(state.max_iterations);
  Latencies run;
  run.Reserve(state.max_iterations);
  run.Start();
  for (auto _ : state) {
    ids.push_back(depot::ObjectId::FromWords(g_next_id++, 0xbe9c4));
    if (depot::Status st = client->Put(ids.back(), payload); !st.ok()) {
      state.SkipWithError(st.ToString().c_str());
      break;
    }
    run.Lap();
  }
  state.SetItemsProcessed(state.iterations());
  state.counters["median_us"] = run.Median() / 1e3;
  state.counters["p99_us"] = run.Quantile(0.99) / 1e3;
  if (MedianNs(kRtt) > 0) state.counters["ratio_to_socket_rtt"] = run.Median() / MedianNs(kRtt);
  g_latencies[name].AddRun(run);
  // After the timed loop: keeps the store the same size from run to run.
  if (depot::Status st = DeleteAll(*client, ids); !st.ok()) {
    state.SkipWithError(st.ToString().c_str());
  }
}

// 1 KiB puts through PutMany, a window (Client::kPutManyWindow) per call: the time per
// object, against put/1KiB's one round trip per object.
void PutManySmall(benchmark::State& state, depot::Client* client) {
  const std::vector<std::byte> payload(kSmallBytes, std::byte{0x42});
  std::vector<depot::ObjectId> ids;
  std::vector<depot::PutItem> items(depot::Client::kPutManyWindow);
  Latencies run;
  run.Reserve(state.max_iterations);
  run.Start();
  for (auto _ : state) {
    for (depot::PutItem& item : items) {
      item.id = depot::ObjectId::FromWords(g_next_id++, 0xba7c4);
      item.data = payload;
      ids.push_back(item.id);
    }
    for (const depot::Status& st : client->PutMany(items)) {
      if (!st.ok()) {
        state.SkipWithError(st.ToString().c_str());
        break;
      }
    }
    run.Lap();
  }
  const double per_object = run.Median() / static_cast<double>(items.size());
  state.SetItemsProcessed(state.iterations() * static_cast<int64_t>(items.size()));
  state.counters["per_object_us"] = per_object / 1e3;
  if (MedianNs("put/1KiB") > 0)
    state.counters["speedup_vs_put"] = MedianNs("put/1KiB") / per_object;
  g_put_many_per_object_ns.push_back(per_object);
  if (depot::Status st = DeleteAll(*client, ids); !st.ok()) {
    state.SkipWithError(st.ToString().c_str());
  }
}

// The same 1 KiB puts through the explicit two-round-trip path (Create, write, Seal, drop
// the MutableBuffer), which Client::Put no longer takes for small objects: shows what the
// one-round-trip put saves.
void CreateSealSmall(benchmark::State& state, depot::Client* client) {
  const std::vector<std::byte> payload(kSmallBytes, std::byte{0x42});
  std::vector<depot::ObjectId> ids;
  ids.reserve(state.max_iterations);
  Latencies run;
  run.Reserve(state.max_iterations);
  run.Start();
  for (auto _ : state) {
    ids.push_back(depot::ObjectId::FromWords(g_next_id++, 0xc5ea1));
    auto buffer = client->Create(ids.back(), payload.size());
    depot::Status st = buffer.status();
    if (st.ok()) {
      std::memcpy(buffer->ptr(), payload.data(), payload.size());
      st = client->Seal(ids.back());
      *buffer = depot::MutableBuffer{};  // the creator's reference: a queued release
    }
    if (!st.ok()) {
      state.SkipWithError(st.ToString().c_str());
      break;
    }
    run.Lap();
  }
  state.SetItemsProcessed(state.iterations());
  state.counters["median_us"] = run.Median() / 1e3;
  state.counters["p99_us"] = run.Quantile(0.99) / 1e3;
  if (MedianNs(kRtt) > 0) state.counters["ratio_to_socket_rtt"] = run.Median() / MedianNs(kRtt);
  const double put = MedianNs("put/1KiB");
  if (put > 0) state.counters["put_speedup"] = run.Median() / put;
  g_latencies["create_seal/1KiB"].AddRun(run);
  if (depot::Status st = DeleteAll(*client, ids); !st.ok()) {
    state.SkipWithError(st.ToString().c_str());
  }
}

// memcpy of `bytes` from `src` to `dst_offset` bytes into a page of warm memory.
void MemcpyWarm(benchmark::State& state, const PageBuffer* src, size_t bytes, size_t dst_offset,
                const std::string& name) {
  PageBuffer dst(bytes + kPage);
  if (dst.data() == nullptr) {
    state.SkipWithError("no memory for the destination");
    return;
  }
  Latencies run;
  for (auto _ : state) {
    const auto t0 = Latencies::Clock::now();
    std::memcpy(dst.data() + dst_offset, src->data(), bytes);
    benchmark::ClobberMemory();
    const auto t1 = Latencies::Clock::now();
    const double ns = static_cast<double>((t1 - t0).count());
    state.SetIterationTime(ns / 1e9);
    run.Add(ns);
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(bytes));
  state.counters["GB_per_s"] = static_cast<double>(bytes) / run.Median();
  g_latencies[name].AddRun(run);
}

// How PutLarge puts.
struct LargePut {
  size_t bytes = kLargeBytes;
  bool warm = true;      // a first put (deleted) allocates the pages the timed ones reuse
  bool pad = false;      // a 64-byte object stays in the arena meanwhile, in front of them
  bool prefault = true;  // CreateOptions::prefault
};

// Puts of fresh objects, each deleted afterwards (not timed).
void PutLarge(benchmark::State& state, depot::Client* client, const PageBuffer* src, LargePut how,
              const std::string& name, const std::string& baseline) {
  const std::span<const std::byte> data(src->data(), how.bytes);
  const auto pad_id = depot::ObjectId::FromWords(g_next_id++, 0x9ad);
  depot::Status st = how.pad ? client->Put(pad_id, data.first(64)) : depot::Status::OK();
  const auto warm = depot::ObjectId::FromWords(g_next_id++, 0x1a29e);
  if (st.ok() && how.warm) st = client->Put(warm, data);
  if (st.ok() && how.warm) st = client->Delete(warm);
  if (!st.ok()) {
    state.SkipWithError(st.ToString().c_str());
    return;
  }
  Latencies run, create, copy, seal;
  uint64_t faults = 0;
  uint64_t offset = 0;
  for (auto _ : state) {
    const auto id = depot::ObjectId::FromWords(g_next_id++, 0x1a29e);
    // Client::Put's steps, timed one by one.
    const auto t0 = Latencies::Clock::now();
    auto buffer = client->Create(id, how.bytes, {.prefault = how.prefault});
    if (!buffer.ok()) {
      state.SkipWithError(buffer.status().ToString().c_str());
      break;
    }
    const auto t1 = Latencies::Clock::now();
    const uint64_t faults0 = MinorFaults();
    std::memcpy(buffer->ptr(), data.data(), how.bytes);
    faults += MinorFaults() - faults0;
    const auto t2 = Latencies::Clock::now();
    offset = buffer->location().offset;
    st = client->Seal(id);
    buffer = depot::MutableBuffer{};  // the creator's reference: a one-way release
    const auto t3 = Latencies::Clock::now();
    if (st.ok()) st = client->Delete(id);
    if (!st.ok()) {
      state.SkipWithError(st.ToString().c_str());
      break;
    }
    const double ns = static_cast<double>((t3 - t0).count());
    state.SetIterationTime(ns / 1e9);
    run.Add(ns);
    create.Add(static_cast<double>((t1 - t0).count()));
    copy.Add(static_cast<double>((t2 - t1).count()));
    seal.Add(static_cast<double>((t3 - t2).count()));
  }
  if (how.pad && !(st = client->Delete(pad_id)).ok()) state.SkipWithError(st.ToString().c_str());
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(how.bytes));
  state.counters["GB_per_s"] = static_cast<double>(how.bytes) / run.Median();
  state.counters["create_ms"] = create.Median() / 1e6;
  state.counters["copy_ms"] = copy.Median() / 1e6;
  state.counters["seal_ms"] = seal.Median() / 1e6;
  // Nonzero on a warm arena means the copy took page faults: it was not warm for this client.
  state.counters["faults_per_put"] =
      static_cast<double>(faults) / static_cast<double>(state.iterations());
  state.counters["offset_in_page"] = static_cast<double>(offset % kPage);
  if (MedianNs(baseline) > 0) state.counters["ratio_to_memcpy"] = MedianNs(baseline) / run.Median();
  g_latencies[name].AddRun(run);
}

// Client::Put of `bytes` as a user calls it (create, the copy on the client's copy threads,
// seal), each object deleted afterwards (not timed); warm: one put and delete first.
// With `new_client_socket` (else null), each put is from a new client connected to it (untimed): a
// process that has not mapped the kept segment yet, as a new worker's first put is.
void PutWhole(benchmark::State& state, depot::Client* client, const PageBuffer* src, size_t bytes,
              bool warm, const std::string& name, const std::string& baseline,
              const std::string* new_client_socket) {
  const std::span<const std::byte> data(src->data(), bytes);
  const auto first = depot::ObjectId::FromWords(g_next_id++, 0x3a01e);
  depot::Status st = warm ? client->Put(first, data) : depot::Status::OK();
  if (st.ok() && warm) st = client->Delete(first);
  Latencies run;
  for (auto _ : state) {
    if (!st.ok()) break;
    std::optional<depot::Client> fresh;
    if (new_client_socket != nullptr) {
      auto connected = depot::Client::Connect(*new_client_socket);
      if (!connected.ok()) {
        st = connected.status();
        break;
      }
      fresh.emplace(std::move(connected).value());
      client = &*fresh;
    }
    const auto id = depot::ObjectId::FromWords(g_next_id++, 0x3a01e);
    const auto t0 = Latencies::Clock::now();
    st = client->Put(id, data);
    const double ns = static_cast<double>((Latencies::Clock::now() - t0).count());
    if (st.ok()) st = client->Delete(id);
    state.SetIterationTime(ns / 1e9);
    run.Add(ns);
  }
  if (!st.ok()) {
    state.SkipWithError(st.ToString().c_str());
    return;
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(bytes));
  state.counters["GB_per_s"] = static_cast<double>(bytes) / run.Median();
  if (MedianNs(baseline) > 0) state.counters["ratio_to_memcpy"] = MedianNs(baseline) / run.Median();
  g_latencies[name].AddRun(run);
}

// memcpy of `bytes` into memory mapped afresh each time (and unmapped after, untimed).
void MemcpyFresh(benchmark::State& state, const PageBuffer* src, size_t bytes,
                 const std::string& name) {
  Latencies run;
  for (auto _ : state) {
    const auto t0 = Latencies::Clock::now();
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      state.SkipWithError("mmap failed");
      break;
    }
    std::memcpy(p, src->data(), bytes);
    benchmark::ClobberMemory();
    const auto t1 = Latencies::Clock::now();
    ::munmap(p, bytes);
    const double ns = static_cast<double>((t1 - t0).count());
    state.SetIterationTime(ns / 1e9);
    run.Add(ns);
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(bytes));
  state.counters["GB_per_s"] = static_cast<double>(bytes) / run.Median();
  g_latencies[name].AddRun(run);
}

void PrintSummary() {
  std::printf("\nSummary: medians over all repetitions, measured in this run.\n");
  const double rtt = MedianNs(kRtt);
  if (rtt > 0) std::printf("  %-34s %8.2f us %8.0f /s  (baseline)\n", kRtt, rtt / 1e3, 1e9 / rtt);
  for (const char* name : {"put/1KiB", "put/1KiB/no_spin"}) {
    const double put = MedianNs(name);
    if (put == 0) continue;
    std::printf(
        "  %-34s %8.2f us %8.0f /s  ratio to RTT %.2f, throughput %.0f /s  (target >= 40,000 "
        "puts/s)\n",
        name, put / 1e3, 1e9 / put, rtt > 0 ? put / rtt : 0, 1e9 / g_latencies[name].Mean());
  }
  if (!g_put_many_per_object_ns.empty()) {
    std::vector<double> v = g_put_many_per_object_ns;
    std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
    const double per_object = v[v.size() / 2], put = MedianNs("put/1KiB");
    std::printf("  %-34s %8.2f us per object, %zu a call: %.1fx the rate of put/1KiB\n",
                "put_many/1KiB", per_object / 1e3, depot::Client::kPutManyWindow,
                per_object > 0 ? put / per_object : 0);
  }
  std::set<std::string> printed;
  struct Pair {
    const char* put;
    const char* copy;
    size_t bytes;
    const char* target;
  };
  for (const Pair& p : std::initializer_list<Pair>{
           {"put/256MiB/warm", "memcpy/256MiB", kLargeBytes, "  (target >= 85%)"},
           {"put/256MiB/warm/after_64B", "memcpy/256MiB/dst+64", kLargeBytes, ""},
           {"Put/1GiB/again/1_thread", "memcpy/1GiB/warm", kHugeBytes, "  (target >= 85%)"},
           {"Put/1GiB/again/default_threads", "memcpy/1GiB/warm", kHugeBytes, ""},
           {"put/1GiB/again", "memcpy/1GiB/warm", kHugeBytes, ""},
           {"Put/1GiB/again/new_client", "memcpy/1GiB/warm", kHugeBytes, ""},
           {"Put/4GiB/again/1_thread", "memcpy/4GiB/warm", kGiantBytes, "  (target >= 85%)"},
           {"Put/4GiB/again/default_threads", "memcpy/4GiB/warm", kGiantBytes, ""},
           {"Put/1GiB/first", "memcpy/1GiB/fresh", kHugeBytes, ""},
           {"Put/1GiB/first/no_backfill", "memcpy/1GiB/fresh", kHugeBytes, ""}}) {
    const double copy_ns = MedianNs(p.copy), put_ns = MedianNs(p.put);
    const auto bytes = static_cast<double>(p.bytes);
    if (copy_ns > 0 && (printed.insert(p.copy).second)) {
      std::printf("  %-34s %8.2f GB/s  (baseline)\n", p.copy, bytes / copy_ns);
    }
    if (put_ns == 0) continue;
    std::printf("  %-34s %8.2f GB/s  %5.1f%% of %s%s\n", p.put, bytes / put_ns,
                copy_ns > 0 ? 100 * copy_ns / put_ns : 0, p.copy, p.target);
  }
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;

  depot::bench::Daemon daemon({"--memory", "1GiB"});
  auto client = depot::Client::Connect(daemon.socket_path());
  auto no_spin =
      depot::Client::Connect(daemon.socket_path(), {.spin = std::chrono::microseconds(0)});
  if (!client.ok() || !no_spin.ok()) {
    std::fprintf(stderr, "bench_put: %s\n",
                 (client.ok() ? no_spin.status() : client.status()).ToString().c_str());
    return 1;
  }
  // A client's first request maps the arena's segment (MAP_POPULATE), once per connection:
  // shown here, kept out of the per-put figures.
  for (depot::Client* c : {&*client, &*no_spin}) {
    const auto id = depot::ObjectId::FromWords(g_next_id++, 0xf125);
    const auto t0 = Latencies::Clock::now();
    depot::Status st = c->Put(id, {});
    const auto t1 = Latencies::Clock::now();
    if (st.ok()) st = c->Delete(id);
    if (!st.ok()) {
      std::fprintf(stderr, "bench_put: %s\n", st.ToString().c_str());
      return 1;
    }
    std::printf("First put of a client (maps the arena segment it lands in): %.1f ms\n",
                std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  const PageBuffer src(kLargeBytes);
  if (src.data() == nullptr) {
    std::fprintf(stderr, "bench_put: cannot allocate 256 MiB\n");
    return 1;
  }

  benchmark::RegisterBenchmark(kRtt, SocketRoundTrip)
      ->Repetitions(5)
      ->UseRealTime()
      ->DisplayAggregatesOnly(true);
  for (auto [name, c] :
       {std::pair{"put/1KiB", &*client}, std::pair{"put/1KiB/no_spin", &*no_spin}}) {
    benchmark::RegisterBenchmark(name, PutSmall, c, std::string(name))
        ->Repetitions(5)
        ->UseRealTime()
        ->DisplayAggregatesOnly(true);
  }
  benchmark::RegisterBenchmark("put_many/1KiB", PutManySmall, &*client)
      ->Repetitions(5)
      ->UseRealTime()
      ->DisplayAggregatesOnly(true);
  benchmark::RegisterBenchmark("create_seal/1KiB", CreateSealSmall, &*client)
      ->Repetitions(5)
      ->UseRealTime()
      ->DisplayAggregatesOnly(true);
  for (size_t pad : {0, 64}) {
    const std::string copy = pad == 0 ? "memcpy/256MiB" : "memcpy/256MiB/dst+64";
    const std::string put = pad == 0 ? "put/256MiB/warm" : "put/256MiB/warm/after_64B";
    benchmark::RegisterBenchmark(copy.c_str(), MemcpyWarm, &src, kLargeBytes, pad, copy)
        ->Repetitions(3)
        ->DisplayAggregatesOnly(true)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(put.c_str(), PutLarge, &*client, &src, LargePut{.pad = pad != 0},
                                 put, copy)
        ->Repetitions(3)
        ->DisplayAggregatesOnly(true)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
  }
  // Client::Put on one copy thread and on the default (ConnectOptions::copy_threads).
  auto one_thread = depot::Client::Connect(daemon.socket_path(), {.copy_threads = 1});
  if (!one_thread.ok()) {
    std::fprintf(stderr, "bench_put: %s\n", one_thread.status().ToString().c_str());
    return 1;
  }
  for (auto [name, c] : {std::pair{"Put/256MiB/warm/1_thread", &*one_thread},
                         std::pair{"Put/256MiB/warm/default_threads", &*client}}) {
    benchmark::RegisterBenchmark(name, PutWhole, c, &src, kLargeBytes, true, std::string(name),
                                 std::string("memcpy/256MiB"), nullptr)
        ->Repetitions(3)
        ->DisplayAggregatesOnly(true)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
  }
  // Objects larger than a segment, against daemons of 256 MiB segments: the default (large
  // objects' segments kept for the next), and for first puts one that keeps none, with and
  // without pages allocated ahead by its worker.
  depot::bench::Daemon large_daemon({"--memory", "2GiB", "--segment-size", "256MiB"});
  depot::bench::Daemon first_daemon(
      {"--memory", "2GiB", "--segment-size", "256MiB", "--no-keep-large"});
  depot::bench::Daemon plain_daemon(
      {"--memory", "2GiB", "--segment-size", "256MiB", "--no-keep-large", "--no-prefault"});
  auto large_client = depot::Client::Connect(large_daemon.socket_path());
  auto large_one_thread = depot::Client::Connect(large_daemon.socket_path(), {.copy_threads = 1});
  auto first_client = depot::Client::Connect(first_daemon.socket_path());
  auto plain_client = depot::Client::Connect(plain_daemon.socket_path());
  const PageBuffer huge(kHugeBytes);
  if (!large_client.ok() || !large_one_thread.ok() || !first_client.ok() || !plain_client.ok() ||
      huge.data() == nullptr) {
    std::fprintf(stderr, "bench_put: no daemons for large objects or no 1 GiB buffer\n");
    return 1;
  }
  const auto repeat = [](benchmark::internal::Benchmark* b) {
    b->Repetitions(3)->DisplayAggregatesOnly(true)->UseManualTime()->Unit(benchmark::kMillisecond);
  };
  repeat(benchmark::RegisterBenchmark("memcpy/1GiB/warm", MemcpyWarm, &huge, kHugeBytes, 0,
                                      std::string("memcpy/1GiB/warm")));
  repeat(benchmark::RegisterBenchmark("memcpy/1GiB/fresh", MemcpyFresh, &huge, kHugeBytes,
                                      std::string("memcpy/1GiB/fresh")));
  for (auto [name, c] : {std::pair{"Put/1GiB/again/1_thread", &*large_one_thread},
                         std::pair{"Put/1GiB/again/default_threads", &*large_client}}) {
    repeat(benchmark::RegisterBenchmark(name, PutWhole, c, &huge, kHugeBytes, true,
                                        std::string(name), std::string("memcpy/1GiB/warm"),
                                        nullptr));
  }
  repeat(benchmark::RegisterBenchmark("put/1GiB/again", PutLarge, &*large_client, &huge,
                                      LargePut{.bytes = kHugeBytes}, std::string("put/1GiB/again"),
                                      std::string("memcpy/1GiB/warm")));
  const std::string large_socket = large_daemon.socket_path();
  repeat(benchmark::RegisterBenchmark("Put/1GiB/again/new_client", PutWhole, &*large_client, &huge,
                                      kHugeBytes, true, std::string("Put/1GiB/again/new_client"),
                                      std::string("memcpy/1GiB/warm"), &large_socket));
  for (auto [name, c] : {std::pair{"Put/1GiB/first", &*first_client},
                         std::pair{"Put/1GiB/first/no_backfill", &*plain_client}}) {
    repeat(benchmark::RegisterBenchmark(name, PutWhole, c, &huge, kHugeBytes, false,
                                        std::string(name), std::string("memcpy/1GiB/fresh"),
                                        nullptr));
  }
  // 4 GiB where the machine has room for the source, the baseline's copy and the object,
  // and 2 GiB to spare.
  std::optional<depot::bench::Daemon> giant_daemon;
  std::optional<PageBuffer> giant;
  std::optional<depot::Client> giant_client, giant_one_thread;
  constexpr uint64_t kGiantNeeds = 3 * kGiantBytes + (uint64_t{2} << 30);
  if (AvailableBytes() > kGiantNeeds) {
    giant_daemon.emplace(std::vector<std::string>{"--memory", "5GiB", "--segment-size", "256MiB"});
    giant.emplace(kGiantBytes);
    auto c = depot::Client::Connect(giant_daemon->socket_path());
    auto one = depot::Client::Connect(giant_daemon->socket_path(), {.copy_threads = 1});
    if (!c.ok() || !one.ok() || giant->data() == nullptr) {
      std::fprintf(stderr, "bench_put: no daemon or buffer for 4 GiB\n");
      return 1;
    }
    giant_client.emplace(std::move(c).value());
    giant_one_thread.emplace(std::move(one).value());
    repeat(benchmark::RegisterBenchmark("memcpy/4GiB/warm", MemcpyWarm, &*giant, kGiantBytes, 0,
                                        std::string("memcpy/4GiB/warm")));
    for (auto [name, c] : {std::pair{"Put/4GiB/again/1_thread", &*giant_one_thread},
                           std::pair{"Put/4GiB/again/default_threads", &*giant_client}}) {
      repeat(benchmark::RegisterBenchmark(name, PutWhole, c, &*giant, kGiantBytes, true,
                                          std::string(name), std::string("memcpy/4GiB/warm"),
                                          nullptr));
    }
  } else {
    std::printf("4 GiB puts left out: %.1f GiB available, %.1f needed\n",
                static_cast<double>(AvailableBytes()) / (1 << 30),
                static_cast<double>(kGiantNeeds) / (1 << 30));
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  PrintSummary();
  return 0;
}
