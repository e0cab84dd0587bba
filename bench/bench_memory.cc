// bench_memory: depotd's memory per live object. Puts a million 64-byte objects (unpinned,
// kept) and reads the daemon's resident memory before and after, split by mapping:
//
//   arena     the segments holding object bytes (resident here only where the daemon itself
//             touched them; the arena's pages are counted by its used bytes instead)
//   headers   the shared header table (one 96-byte slot per object)
//   heap      everything else: the object table, allocator nodes, LRU links, ...
//
// overhead per object = (heap + headers) growth / objects + arena bytes used per object - 64,
// so an object costs its 64 data bytes plus the overhead. The baseline is the data itself.
//
//   bench_memory [--objects=N] [benchmark flags]   (default 1,000,000)
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "daemon.h"
#include "depot/client.h"
#include "latency.h"

namespace {

constexpr size_t kObjectBytes = 64;
// 256 bytes, plus the daemon-private copy of each 96-byte header that the trust model
// requires (docs/architecture.md, Trust): the daemon never reads the shared table back.
constexpr double kTargetOverhead = 256 + 96;

// A process's resident bytes, by kind of mapping.
struct Resident {
  uint64_t total = 0;  // VmRSS
  uint64_t arena = 0;
  uint64_t headers = 0;
  uint64_t heap = 0;  // the rest
};

Resident ReadResident(pid_t pid) {
  Resident r;
  std::ifstream smaps("/proc/" + std::to_string(pid) + "/smaps");
  std::string line;
  uint64_t* bucket = &r.heap;
  while (std::getline(smaps, line)) {
    std::istringstream in(line);
    std::string first;
    in >> first;
    if (first == "Rss:") {
      uint64_t kib = 0;
      in >> kib;
      *bucket += kib << 10;
      r.total += kib << 10;
    } else if (first.find('-') != std::string::npos && first.back() != ':') {
      // A mapping's header line: "start-end perms offset dev inode [path]".
      bucket = line.find("depot-segment") != std::string::npos   ? &r.arena
               : line.find("depot-headers") != std::string::npos ? &r.headers
                                                                 : &r.heap;
    }
  }
  return r;
}

void LiveObjects(benchmark::State& state, depot::Client* client, pid_t daemon, size_t objects) {
  const std::vector<std::byte> payload(kObjectBytes, std::byte{0x42});
  for (auto _ : state) {
    auto before_status = client->GetStatus();
    if (!before_status.ok()) {
      state.SkipWithError(before_status.status().ToString().c_str());
      break;
    }
    const Resident before = ReadResident(daemon);
    auto start = depot::bench::Latencies::Clock::now();
    auto lap = start;
    for (size_t i = 0; i < objects; ++i) {
      const auto id = depot::ObjectId::FromWords(i + 1, 0x3e3031);
      if (depot::Status st = client->Put(id, payload, {.pin = false}); !st.ok()) {
        state.SkipWithError(st.ToString().c_str());
        return;
      }
      if ((i + 1) % 100'000 == 0) {
        const auto now = depot::bench::Latencies::Clock::now();
        std::fprintf(stderr, "  %zu objects put, %.0f puts/s\n", i + 1,
                     1e5 / std::chrono::duration<double>(now - lap).count());
        lap = now;
      }
    }
    const double seconds =
        std::chrono::duration<double>(depot::bench::Latencies::Clock::now() - start).count();
    // A round trip after the puts: the daemon has handled every release before answering.
    auto after_status = client->GetStatus();
    if (!after_status.ok()) {
      state.SkipWithError(after_status.status().ToString().c_str());
      break;
    }
    const Resident after = ReadResident(daemon);
    if (after_status->evictions != before_status->evictions ||
        after_status->objects_sealed - before_status->objects_sealed != objects) {
      state.SkipWithError("objects were evicted: give the daemon more --memory");
      break;
    }

    const double n = static_cast<double>(objects);
    auto per_object = [n](uint64_t a, uint64_t b) { return (static_cast<double>(a) - b) / n; };
    const double heap = per_object(after.heap, before.heap);
    const double headers = per_object(after.headers, before.headers);
    const double arena_resident = per_object(after.arena, before.arena);
    const double arena_used = per_object(after_status->used_bytes, before_status->used_bytes);
    const double overhead = heap + headers + arena_used - kObjectBytes;
    state.counters["overhead_B_per_object"] = overhead;
    state.counters["heap_B"] = heap;
    state.counters["headers_B"] = headers;
    state.counters["arena_used_B"] = arena_used;
    state.counters["arena_resident_B"] = arena_resident;
    state.counters["vmrss_B_minus_data"] = per_object(after.total, before.total) - kObjectBytes;
    state.counters["ratio_to_data"] = overhead / kObjectBytes;
    state.counters["puts_per_s"] = n / seconds;

    std::printf(
        "\n%zu live objects of %zu B. Daemon resident memory: %.1f MiB before, %.1f MiB after.\n"
        "Per object: heap %.1f B + header table %.1f B + arena %.1f B used for %zu data bytes\n"
        "  => overhead %.1f B/object (%.2fx the data; target <= %.0f B: %s).\n"
        "  VmRSS growth per object minus %zu data bytes: %.1f B (arena pages resident in the "
        "daemon: %.1f B/object).\n",
        objects, kObjectBytes, before.total / 1048576.0, after.total / 1048576.0, heap, headers,
        arena_used, kObjectBytes, overhead, overhead / kObjectBytes, kTargetOverhead,
        overhead <= kTargetOverhead ? "met" : "MISSED", kObjectBytes,
        per_object(after.total, before.total) - kObjectBytes, arena_resident);
  }
}

// Takes --objects=N out of the arguments.
size_t ObjectsFlag(int* argc, char** argv) {
  size_t objects = 1'000'000;
  int out = 1;
  for (int i = 1; i < *argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--objects=", 0) == 0) {
      objects = std::strtoull(arg.c_str() + 10, nullptr, 10);
    } else {
      argv[out++] = argv[i];
    }
  }
  *argc = out;
  return objects;
}

}  // namespace

int main(int argc, char** argv) {
  const size_t objects = ObjectsFlag(&argc, argv);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;

  depot::bench::Daemon daemon({"--memory", "512MiB", "--max-objects", "2000000"});
  auto client = depot::Client::Connect(daemon.socket_path());
  if (!client.ok()) {
    std::fprintf(stderr, "bench_memory: %s\n", client.status().ToString().c_str());
    return 1;
  }
  benchmark::RegisterBenchmark("live_objects/64B", LiveObjects, &*client, daemon.pid(), objects)
      ->Iterations(1)
      ->Unit(benchmark::kSecond);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
