// depotd: the depot daemon. One per host; see docs/architecture.md.
#include <grp.h>
#include <pwd.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/syscall.h>
#include <sys/sysinfo.h>
#include <unistd.h>

#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/thread_pool.hpp>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "depot/ipc/protocol.h"
#include "depot/ipc/units.h"
#include "store/arena.h"
#include "store/disk_pool.h"
#include "store/gpu/setup.h"
#include "store/header_table.h"
#include "store/metrics_http.h"
#include "store/object_store.h"
#include "store/server.h"
#include "store/version.h"

namespace {

using depot::Result;
using depot::Status;

// A size, or a percentage of physical memory ("25%").
Result<uint64_t> ParseMemory(const std::string& text) {
  if (!text.empty() && text.back() == '%') {
    double pct = 0;
    try {
      pct = std::stod(text.substr(0, text.size() - 1));
    } catch (const std::exception&) {
      pct = -1;
    }
    if (!(pct > 0 && pct <= 100)) {
      return Status::InvalidArgument("'" + text + "' is not a percentage between 0 and 100");
    }
    struct sysinfo si {};
    ::sysinfo(&si);
    return static_cast<uint64_t>(static_cast<double>(si.totalram) * si.mem_unit * pct / 100);
  }
  return depot::ipc::ParseSize(text);
}

// A uid (or, with `group`, a gid) given as a number or a name.
Result<uint32_t> IdOf(const std::string& text, bool is_group) {
  const char* flag = is_group ? "--share-with-group" : "--share-with-uid";
  if (!text.empty() && text.find_first_not_of("0123456789") == std::string::npos) {
    const unsigned long id = std::strtoul(text.c_str(), nullptr, 10);
    if (id < UINT32_MAX) return static_cast<uint32_t>(id);
  } else if (is_group) {
    if (const struct group* g = ::getgrnam(text.c_str())) return g->gr_gid;
  } else if (const struct passwd* p = ::getpwnam(text.c_str())) {
    return p->pw_uid;
  }
  return Status::InvalidArgument(std::string(flag) + ": '" + text + "' is not a " +
                                 (is_group ? "group" : "user") + " of this host");
}

int Fail(const Status& st) {
  std::fprintf(stderr, "depotd: %s\n", st.message().c_str());
  return 1;
}

// Blocks SIGINT and SIGTERM in the calling thread, and so in every thread it starts later,
// and returns a signalfd that reads them. Called before any thread exists, this means the
// shutdown signals never run a handler on some thread at some moment: they wait in the
// kernel until the loop reads them from the descriptor, even if they arrive before the loop
// runs. (Asio's signal_set runs a handler; under ThreadSanitizer, which defers handlers to
// its own safe points, a SIGTERM could then sit unhandled while the loop slept.)
Result<int> BlockShutdownSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  if (int err = pthread_sigmask(SIG_BLOCK, &signals, nullptr); err != 0) {
    return Status::IoError(std::string("pthread_sigmask: ") + std::strerror(err));
  }
  int fd = ::signalfd(-1, &signals, SFD_CLOEXEC | SFD_NONBLOCK);
  if (fd < 0) return Status::IoError(std::string("signalfd: ") + std::strerror(errno));
  return fd;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"depotd: the depot shared-memory object store daemon"};
  app.set_version_flag("--version", std::string("depotd ") + depot::store::kDepotVersion);
  std::string socket_path = depot::ipc::DefaultSocketPath();
  std::string socket_mode = "0600";
  std::string memory = "25%";
  std::string segment_size = "1GiB";
  std::string arena_dir;
  bool no_evict = false;
  std::string spill_dir;
  std::string spill_limit = "0";
  std::string spill_file_size = "1GiB";
  std::string spill_io = "direct";
  uint32_t max_objects = 4u << 20;
  std::string max_frame = "16MiB";
  std::string bandwidth_probe = "64MiB";
  uint32_t max_batch = depot::ipc::kDefaultMaxBatch;
  std::string client_max_bytes = "0";
  uint32_t client_max_objects = 0;
  uint32_t client_max_pending = 1024;
  unsigned workers = std::max(2u, std::thread::hardware_concurrency() / 8);
  std::string log_level = "info";
  bool no_metrics = false;
  uint16_t metrics_port = 0;
  std::string metrics_address = "127.0.0.1";
  depot::store::gpu::GpuOptions gpu_options;

  app.add_option("--socket", socket_path, "Unix socket to listen on (env DEPOT_SOCKET)")
      ->capture_default_str();
  app.add_option("--socket-mode", socket_mode, "permissions of the socket file, in octal")
      ->capture_default_str();
  int exit_with_pid = 0;
  app.add_option("--exit-with-pid", exit_with_pid,
                 "shut down, as on SIGTERM, when the process of this pid exits (a daemon private "
                 "to a program: depot.start_daemon(stop_with_parent=True))");
  std::vector<std::string> share_users, share_groups;
  app.add_option("--share-with-uid", share_users,
                 "users (uids or names; besides root and the daemon's own) that may read objects; "
                 "they can never create, delete or change any (needs a --socket-mode they can "
                 "open)")
      ->delimiter(',');
  app.add_option("--share-with-group", share_groups,
                 "groups (gids or names) whose members may read objects, as --share-with-uid")
      ->delimiter(',');
  app.add_option("--memory", memory, "host arena capacity: a size (4GiB) or a share of RAM (25%)")
      ->capture_default_str();
  app.add_option("--segment-size", segment_size,
                 "arena segment size: objects up to this size share segments, larger ones get one "
                 "of their own")
      ->capture_default_str();
  app.add_option("--arena-dir", arena_dir,
                 "put segments in this directory (a tmpfs or hugetlbfs mount) instead of memfds");
  app.add_flag("--no-evict", no_evict, "never evict objects; a create that does not fit fails");
  app.add_option("--spill-dir", spill_dir,
                 "directory (created 0700) where objects that do not fit in host memory are "
                 "spilled, and read back from on get; default: none, they are evicted");
  app.add_option("--spill-limit", spill_limit,
                 "most bytes of spill files (0: the directory's free space at start)")
      ->capture_default_str();
  app.add_option("--spill-file-size", spill_file_size,
                 "spill files that pack objects up to this size; larger ones get their own")
      ->capture_default_str();
  app.add_option("--spill-io", spill_io,
                 "how spills and restores move the bulk of an object: direct (O_DIRECT, past the "
                 "page cache, where the file system has it) or buffered")
      ->capture_default_str()
      ->check(CLI::IsMember({"direct", "buffered"}));
  app.add_option("--max-objects", max_objects, "most objects the store holds at once")
      ->capture_default_str()
      ->check(CLI::Range(1u, 1u << 30));
  app.add_option("--max-frame", max_frame, "largest message a client may send")
      ->capture_default_str();
  app.add_option("--max-batch", max_batch, "most ids in one request")
      ->capture_default_str()
      ->check(CLI::Range(1u, 10'000'000u));
  app.add_option("--client-max-bytes", client_max_bytes,
                 "bytes one client may hold (creating or referenced); 0: no limit")
      ->capture_default_str();
  app.add_option("--client-max-objects", client_max_objects,
                 "objects one client may hold; 0: no limit")
      ->capture_default_str();
  std::string metadata_budget = "1GiB", client_max_metadata = "256MiB";
  app.add_option("--metadata-budget", metadata_budget,
                 "daemon memory it may keep for all clients together (object entries, names, "
                 "GPU metadata, waiting gets); 0: no limit")
      ->capture_default_str();
  app.add_option("--client-max-metadata", client_max_metadata,
                 "the same for one client; 0: no limit")
      ->capture_default_str();
  uint32_t lease_entries = depot::store::Leases::kDefaultEntries;
  app.add_option("--lease-entries", lease_entries,
                 "entries of each client's lease table, through which it gets objects it has "
                 "seen before with no round trip and holds at most that many of them more than "
                 "--client-max-objects counts; a power of two, 0: no leases")
      ->capture_default_str()
      ->check(CLI::Range(0u, 1u << 20))
      ->check(CLI::Validator(
          [](std::string& value) -> std::string {
            const unsigned long n = std::stoul(value);
            return (n & (n - 1)) == 0 ? std::string() : "not a power of two: " + value;
          },
          "POWER OF TWO"));
  app.add_option("--client-max-pending", client_max_pending,
                 "gets one client may have waiting; 0: no limit")
      ->capture_default_str();
  app.add_option("--workers", workers, "threads for long work (pre-faulting, checksums)")
      ->capture_default_str()
      ->check(CLI::Range(1u, 256u));
  app.add_flag("--no-metrics", no_metrics, "keep no request counters or latency histograms");
  app.add_option("--metrics-port", metrics_port,
                 "serve GET /metrics (Prometheus text format) on this TCP port; 0: off")
      ->capture_default_str();
  app.add_option("--metrics-address", metrics_address, "address of the metrics endpoint")
      ->capture_default_str();
  app.add_option("--gpu-memory", gpu_options.memory,
                 "what each GPU pool may take: 75% (the default), 8GiB, or per GPU 0:8GiB,1:50%");
  app.add_option("--gpu-chunk-size", gpu_options.chunk_size,
                 "size of the chunks GPU pools grow by (objects larger get their own)")
      ->capture_default_str();
  app.add_option("--gpu-reserve", gpu_options.reserve,
                 "GPU pool memory to make at start-up (not on the first puts): 8GiB, 50%, or "
                 "per GPU 0:8GiB,1:50%");
  app.add_option("--simulate-gpus", gpu_options.simulate,
                 "serve N simulated GPUs of SIZE (N or N:SIZE, default size 1GiB), backed by "
                 "host memory, instead of real ones: for tests and demos");
  app.add_flag("--no-gpus", gpu_options.disabled, "serve no GPUs (do not load the CUDA driver)");
  depot::scheduler::SchedulerOptions scheduler_options;
  std::string placement = "cost";
  std::string pipeline = "on";
  app.add_option("--placement", placement,
                 "how tasks are placed: cost (least estimated completion, inputs' locality "
                 "included) or random (a baseline to compare with)")
      ->capture_default_str()
      ->check(CLI::IsMember({"cost", "random"}));
  app.add_option("--pipeline", pipeline,
                 "send tasks to busy workers ahead, each to start when a task of the same shape "
                 "running there ends (on), or only when they start (off)")
      ->capture_default_str()
      ->check(CLI::IsMember({"on", "off"}));
  auto* host_gpu_bandwidth =
      app.add_option("--host-gpu-bandwidth", scheduler_options.bandwidths.host_to_gpu,
                     "bytes/s placement assumes for copies between host memory and a GPU (default: "
                     "measured "
                     "on the store's copies, this until then)")
          ->capture_default_str()
          ->check(CLI::PositiveNumber);
  auto* gpu_gpu_bandwidth =
      app.add_option("--gpu-gpu-bandwidth", scheduler_options.bandwidths.gpu_to_gpu,
                     "bytes/s placement assumes for copies between GPUs (default: measured, this "
                     "until then)")
          ->capture_default_str()
          ->check(CLI::PositiveNumber);
  app.add_option("--bandwidth-probe", bandwidth_probe,
                 "bytes of the copies timed at start-up between host memory and GPUs, whose "
                 "bandwidths placement starts from (at most an eighth of a GPU; 0: none)")
      ->capture_default_str();
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error")
      ->capture_default_str()
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}));
  CLI11_PARSE(app, argc, argv);
  scheduler_options.bandwidths.gpu_to_host = scheduler_options.bandwidths.host_to_gpu;
  scheduler_options.random_placement = placement == "random";
  scheduler_options.pipeline = pipeline == "on";
  // Bandwidths given are kept; otherwise placement goes by those the store measures.
  scheduler_options.measure_bandwidths =
      host_gpu_bandwidth->count() == 0 && gpu_gpu_bandwidth->count() == 0;

  spdlog::set_level(spdlog::level::from_str(log_level));
  spdlog::set_pattern("[%Y-%m-%d %H:%M:%S.%e] [depotd] [%^%l%$] %v");
  std::signal(SIGPIPE, SIG_IGN);
  // A file size limit makes a spill fail with EFBIG (the object stays in memory), not the daemon.
  std::signal(SIGXFSZ, SIG_IGN);
  // Every session, segment and spill file (two each) takes a descriptor: take all that this
  // process may have, not the usual soft limit of 1,024.
  if (rlimit files{}; getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    setrlimit(RLIMIT_NOFILE, &files);
  }

  auto capacity = ParseMemory(memory);
  if (!capacity.ok())
    return Fail(Status::InvalidArgument("--memory: " + capacity.status().message()));
  auto segment = depot::ipc::ParseSize(segment_size);
  if (!segment.ok())
    return Fail(Status::InvalidArgument("--segment-size: " + segment.status().message()));
  auto frame = depot::ipc::ParseSize(max_frame);
  if (!frame.ok() || *frame < 4096 || *frame > (1u << 30)) {
    return Fail(Status::InvalidArgument("--max-frame must be a size between 4KiB and 1GiB"));
  }
  auto probe_bytes = depot::ipc::ParseSize(bandwidth_probe);
  if (!probe_bytes.ok()) {
    return Fail(Status::InvalidArgument("--bandwidth-probe: " + probe_bytes.status().message()));
  }
  auto client_bytes = depot::ipc::ParseSize(client_max_bytes);
  if (!client_bytes.ok())
    return Fail(Status::InvalidArgument("--client-max-bytes: " + client_bytes.status().message()));
  auto budget = depot::ipc::ParseSize(metadata_budget);
  if (!budget.ok())
    return Fail(Status::InvalidArgument("--metadata-budget: " + budget.status().message()));
  auto client_metadata = depot::ipc::ParseSize(client_max_metadata);
  if (!client_metadata.ok()) {
    return Fail(
        Status::InvalidArgument("--client-max-metadata: " + client_metadata.status().message()));
  }
  auto spill_bytes = depot::ipc::ParseSize(spill_limit);
  if (!spill_bytes.ok())
    return Fail(Status::InvalidArgument("--spill-limit: " + spill_bytes.status().message()));
  auto spill_file_bytes = depot::ipc::ParseSize(spill_file_size);
  if (!spill_file_bytes.ok() || *spill_file_bytes < depot::store::DiskPool::kAlignment) {
    return Fail(Status::InvalidArgument("--spill-file-size must be a size of at least 4KiB"));
  }
  if (!spill_dir.empty() && no_evict) {
    return Fail(Status::InvalidArgument(
        "--spill-dir and --no-evict do not go together: spilling takes objects out of host "
        "memory, which --no-evict forbids"));
  }
  mode_t mode = 0;
  try {
    size_t used = 0;
    mode = static_cast<mode_t>(std::stoul(socket_mode, &used, 8));
    if (used != socket_mode.size() || mode > 0777) throw std::invalid_argument("mode");
  } catch (const std::exception&) {
    return Fail(Status::InvalidArgument("--socket-mode '" + socket_mode +
                                        "' is not an octal mode like 0660"));
  }

  std::vector<uid_t> share_uids;
  std::vector<gid_t> share_gids;
  for (const std::string& user : share_users) {
    auto uid = IdOf(user, /*group=*/false);
    if (!uid.ok()) return Fail(uid.status());
    share_uids.push_back(*uid);
  }
  for (const std::string& group : share_groups) {
    auto gid = IdOf(group, /*group=*/true);
    if (!gid.ok()) return Fail(gid.status());
    share_gids.push_back(*gid);
  }

  // Before the arena is made: a second daemon on a busy socket should fail fast.
  if (Status st = depot::store::Server::ClaimSocketPath(socket_path); !st.ok()) return Fail(st);

  auto signal_fd = BlockShutdownSignals();
  if (!signal_fd.ok()) return Fail(signal_fd.status());
  boost::asio::io_context loop(1);
  boost::asio::posix::stream_descriptor signals(loop, *signal_fd);
  // A pidfd of --exit-with-pid's process: readable once that process has exited.
  boost::asio::posix::stream_descriptor lifeline(loop);
  if (exit_with_pid != 0) {
    const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, exit_with_pid, 0));
    if (pidfd < 0) {
      return Fail(
          depot::Status::InvalidArgument("--exit-with-pid " + std::to_string(exit_with_pid) +
                                         ": cannot watch that process: " + std::strerror(errno)));
    }
    lifeline.assign(pidfd);
  }
  boost::asio::thread_pool pool(workers);
  {
    auto gpus = depot::store::gpu::SetUpGpus(gpu_options);
    if (!gpus.ok()) return Fail(gpus.status());
    depot::store::ArenaOptions arena_options{*capacity, *segment, arena_dir};
    if (depot::store::gpu::DeviceBackend* backend = (*gpus)->backend.get();
        backend != nullptr && backend->kind() == "cuda" && !backend->devices().empty()) {
      arena_options.lock_pages = [backend](void* base, uint64_t bytes) {
        return backend->RegisterHostMemory(base, bytes);
      };
      arena_options.unlock_pages = [backend](void* base) { backend->UnregisterHostMemory(base); };
    }
    auto arena = depot::store::Arena::Create(arena_options, pool);
    if (!arena.ok()) return Fail(arena.status());
    auto headers = depot::store::HeaderTable::Create(max_objects);
    if (!headers.ok()) return Fail(headers.status());
    std::unique_ptr<depot::store::DiskPool> disk;
    if (!spill_dir.empty()) {
      auto opened = depot::store::DiskPool::Open(
          {spill_dir, *spill_bytes, *spill_file_bytes, spill_io == "direct"}, pool);
      if (!opened.ok()) return Fail(opened.status());
      disk = std::move(opened).value();
      spdlog::info("spilling to {} (up to {}, files of {}, {} I/O)", disk->dir(),
                   depot::ipc::FormatSize(disk->capacity()),
                   depot::ipc::FormatSize(disk->file_size()),
                   disk->direct_io() ? "direct" : "buffered");
    }
    depot::store::ClientLimits limits{*client_bytes, client_max_objects, client_max_pending,
                                      *client_metadata, *budget};
    depot::store::WorkerPoolExecutor executor(loop, pool);
    depot::store::ObjectStore store(loop, executor, **arena, **headers, limits, !no_evict,
                                    (*gpus)->pool_pointers(), lease_entries, disk.get());
    // Off the loop: placement assumes the flags' bandwidths until it is done.
    if (scheduler_options.measure_bandwidths && *probe_bytes > 0) {
      store.ProbeCopyRates(*probe_bytes);
    }
    depot::store::Server server(
        loop, store,
        {socket_path, mode, static_cast<uint32_t>(*frame), max_batch, !no_metrics,
         (*gpus)->description, share_uids, share_gids, scheduler_options});
    depot::store::MetricsHttp metrics_http(loop, [&server] { return server.RenderMetrics(); });

    // The shutdown signals have been blocked since before the socket existed, so a SIGTERM
    // that arrives as soon as clients can connect still shuts down cleanly and removes the
    // socket file: it is read here when the loop starts.
    signalfd_siginfo received{};
    signals.async_read_some(boost::asio::buffer(&received, sizeof received),
                            [&](const boost::system::error_code& ec, size_t) {
                              if (ec) return;
                              spdlog::info("received SIG{}, shutting down",
                                           sigabbrev_np(static_cast<int>(received.ssi_signo)));
                              server.Shutdown();
                              metrics_http.Close();
                              loop.stop();
                            });
    if (lifeline.is_open()) {
      lifeline.async_wait(boost::asio::posix::stream_descriptor::wait_read,
                          [&](const boost::system::error_code& ec) {
                            if (ec) return;
                            spdlog::info("process {} exited (--exit-with-pid), shutting down",
                                         exit_with_pid);
                            server.Shutdown();
                            metrics_http.Close();
                            loop.stop();
                          });
    }
    if (Status st = server.Listen(); !st.ok()) return Fail(st);
    if (metrics_port != 0) {
      if (Status st = metrics_http.Listen(metrics_address, metrics_port); !st.ok()) return Fail(st);
      spdlog::info("serving metrics at http://{}:{}/metrics", metrics_address, metrics_http.port());
    }
    spdlog::info("depotd {} listening on {} (arena {} {}, segments of {}, eviction {})",
                 depot::store::kDepotVersion, socket_path,
                 depot::ipc::FormatSize((*arena)->capacity()), (*arena)->backend(),
                 depot::ipc::FormatSize((*arena)->segment_size()), no_evict ? "off" : "on");
    loop.run();
    pool.join();
  }
  spdlog::info("stopped");
  return 0;
}
