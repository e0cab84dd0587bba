// bench_spill: the disk tier (depotd --spill-dir, issue 18) against the disk itself.
//
//   disk/write, disk/read    the baseline: one 1 GiB file in the spill directory's file system
//                            written with O_DIRECT in 64 MiB pieces, then fdatasync, then read
//                            back with O_DIRECT (no page cache either way). bytes_per_second.
//   spill+restore/<size>/direct:<0|1>/batch:<n>
//                            a daemon with --memory --arena_MiB and a spill directory there
//                            (--spill-io direct, or buffered: through the page cache); puts
//                            four times the arena in objects of <size>, waits until no copy to
//                            disk is under way, and reports the daemon's own figures: spilled
//                            GiB, spill_GBps (bytes written / the writes' time, each copy timed
//                            alone; copies run two at a time, so this is per copy) and
//                            spill_vs_disk (that over disk/write).
//                            Then gets every object once, oldest first (most are on disk), one
//                            at a time or <batch> ids a get: restore_GBps and restore_vs_disk
//                            as above, get_us (median) and get_p99_us per get, and
//                            get_wall_GBps (object bytes / wall time of the gets, restores and
//                            the spills they cause included); spills_per_write and
//                            restores_per_read: objects per disk write (read) of the daemon's.
//
// Flags besides Google Benchmark's: --spill_dir=DIR (default $TMPDIR or /tmp: pass a directory
// on the disk to measure), --arena_MiB=N (default 256).
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "daemon.h"
#include "depot/client.h"
#include "latency.h"

namespace {

using depot::bench::Latencies;
using Clock = std::chrono::steady_clock;

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kGiB = uint64_t{1} << 30;

std::string g_spill_root;
uint64_t g_arena_mib = 256;
double g_disk_write = 0;  // bytes per second, O_DIRECT
double g_disk_read = 0;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

// A fresh directory under the spill root, removed at the end.
struct ScratchDir {
  std::string path;
  ScratchDir() {
    std::string pattern = g_spill_root + "/depot-bench-spill-XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) {
      std::perror(("mkdtemp under " + g_spill_root).c_str());
      std::exit(1);
    }
    path = pattern;
  }
  ~ScratchDir() { std::filesystem::remove_all(path); }
};

void DiskWrite(benchmark::State& state) {
  ScratchDir dir;
  const std::string file = dir.path + "/baseline";
  constexpr uint64_t kPiece = 64 * kMiB;
  const uint64_t total = kGiB;
  void* raw = nullptr;
  if (posix_memalign(&raw, 4096, kPiece) != 0) std::abort();
  std::unique_ptr<std::byte, decltype(&std::free)> buffer(static_cast<std::byte*>(raw), &std::free);
  std::memset(buffer.get(), 0x5a, kPiece);
  for (auto _ : state) {
    const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT, 0600);
    if (fd < 0) {
      state.SkipWithError(("O_DIRECT open: " + std::string(std::strerror(errno))).c_str());
      return;
    }
    const auto start = Clock::now();
    for (uint64_t off = 0; off < total; off += kPiece) {
      if (::pwrite(fd, buffer.get(), kPiece, static_cast<off_t>(off)) !=
          static_cast<ssize_t>(kPiece)) {
        state.SkipWithError("write failed");
      }
    }
    ::fdatasync(fd);
    const double s = Seconds(start);
    ::close(fd);
    state.SetIterationTime(s);
    g_disk_write = static_cast<double>(total) / s;
    // Read it back, the same way.
    const int rfd = ::open(file.c_str(), O_RDONLY | O_DIRECT);
    const auto read_start = Clock::now();
    for (uint64_t off = 0; off < total; off += kPiece) {
      if (::pread(rfd, buffer.get(), kPiece, static_cast<off_t>(off)) !=
          static_cast<ssize_t>(kPiece)) {
        state.SkipWithError("read failed");
      }
    }
    g_disk_read = static_cast<double>(total) / Seconds(read_start);
    ::close(rfd);
    ::unlink(file.c_str());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * total));
  state.counters["write_GBps"] = g_disk_write / 1e9;
  state.counters["read_GBps"] = g_disk_read / 1e9;
}

// Polls the daemon until no copy to or from disk is under way, three looks in a row.
depot::DiskStatus Settled(depot::Client& client) {
  const auto deadline = Clock::now() + std::chrono::minutes(5);
  depot::DiskStatus disk;
  for (int idle = 0; idle < 3 && Clock::now() < deadline;) {
    auto status = client.GetStatus();
    if (!status.ok()) break;
    disk = status->disk;
    idle = disk.copies_in_flight == 0 ? idle + 1 : 0;
    if (idle == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return disk;
}

void SpillAndRestore(benchmark::State& state) {
  const uint64_t object = static_cast<uint64_t>(state.range(0));
  const bool direct = state.range(1) != 0;
  const size_t batch = static_cast<size_t>(state.range(2));
  const uint64_t arena = g_arena_mib * kMiB;
  const uint64_t count = 4 * arena / object;
  for (auto _ : state) {
    ScratchDir dir;
    depot::bench::Daemon daemon({"--memory", std::to_string(g_arena_mib) + "MiB", "--segment-size",
                                 std::to_string(std::max<uint64_t>(g_arena_mib / 4, 1)) + "MiB",
                                 "--spill-dir", dir.path + "/spill", "--spill-io",
                                 direct ? "direct" : "buffered"});
    auto client = depot::Client::Connect(daemon.socket_path());
    if (!client.ok()) {
      state.SkipWithError(client.status().ToString().c_str());
      return;
    }
    std::vector<std::byte> bytes(object);
    for (size_t i = 0; i < bytes.size(); i += 4096) bytes[i] = std::byte(i / 4096);
    std::vector<depot::ObjectId> ids;
    const auto put_start = Clock::now();
    for (uint64_t i = 0; i < count; ++i) {
      ids.push_back(depot::ObjectId::Random());
      if (depot::Status st = client->Put(ids.back(), bytes); !st.ok()) {
        state.SkipWithError(st.ToString().c_str());
        return;
      }
    }
    const depot::DiskStatus spilled = Settled(*client);
    const double put_s = Seconds(put_start);
    // Every object once, oldest first: most of them come back from disk. One at a time, or
    // `batch` ids a get.
    Latencies gets;
    const auto get_start = Clock::now();
    for (size_t i = 0; i < ids.size(); i += batch) {
      const std::vector<depot::ObjectId> some(
          ids.begin() + static_cast<ptrdiff_t>(i),
          ids.begin() + static_cast<ptrdiff_t>(std::min(ids.size(), i + batch)));
      const auto t = Clock::now();
      auto got = client->Get(some);
      if (!got.ok()) {
        state.SkipWithError(got.status().ToString().c_str());
        return;
      }
      for (const depot::Buffer& b : *got) benchmark::DoNotOptimize(b.data()[0]);
      gets.Add(std::chrono::duration<double, std::nano>(Clock::now() - t).count());
    }
    const double get_s = Seconds(get_start);
    const depot::DiskStatus restored = Settled(*client);
    state.SetIterationTime(put_s + get_s);
    const double spill_rate = static_cast<double>(spilled.spilled_bytes) / spilled.spill_seconds;
    const double restore_rate =
        static_cast<double>(restored.restored_bytes) / restored.restore_seconds;
    state.counters["spilled_GiB"] = static_cast<double>(spilled.spilled_bytes) / kGiB;
    state.counters["spill_GBps"] = spill_rate / 1e9;
    state.counters["put_wall_GBps"] = static_cast<double>(count * object) / put_s / 1e9;
    state.counters["restored_GiB"] = static_cast<double>(restored.restored_bytes) / kGiB;
    state.counters["restore_GBps"] = restore_rate / 1e9;
    state.counters["get_wall_GBps"] = static_cast<double>(count * object) / get_s / 1e9;
    // How many objects went to (came from) disk in one write (read) of the daemon's.
    state.counters["spills_per_write"] = static_cast<double>(spilled.spills) /
                                         static_cast<double>(std::max<uint64_t>(spilled.writes, 1));
    state.counters["restores_per_read"] =
        static_cast<double>(restored.restores) /
        static_cast<double>(std::max<uint64_t>(restored.reads, 1));
    state.counters["get_us"] = gets.Median() / 1e3;
    state.counters["get_p99_us"] = gets.Quantile(0.99) / 1e3;
    if (g_disk_write > 0) state.counters["spill_vs_disk"] = spill_rate / g_disk_write;
    if (g_disk_read > 0) state.counters["restore_vs_disk"] = restore_rate / g_disk_read;
  }
}

BENCHMARK(DiskWrite)
    ->Name("disk/write+read")
    ->Iterations(1)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(SpillAndRestore)
    ->Name("spill+restore")
    ->ArgNames({"", "direct", "batch"})
    ->Args({64 * kMiB, 1, 1})
    ->Args({64 * kMiB, 0, 1})
    ->Args({64 << 10, 1, 1})
    ->Args({64 << 10, 0, 1})
    ->Args({64 << 10, 1, 64})
    ->Iterations(1)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) {
  const char* tmp = std::getenv("TMPDIR");
  g_spill_root = tmp != nullptr ? tmp : "/tmp";
  std::vector<char*> rest;
  for (int i = 0; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.starts_with("--spill_dir=")) {
      g_spill_root = arg.substr(12);
    } else if (arg.starts_with("--arena_MiB=")) {
      g_arena_mib = std::stoull(arg.substr(12));
    } else {
      rest.push_back(argv[i]);
    }
  }
  int n = static_cast<int>(rest.size());
  benchmark::Initialize(&n, rest.data());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
