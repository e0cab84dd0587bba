// depotd: the depot daemon. One per host; see docs/architecture.md.
#include <sched.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <spdlog/pattern_formatter.h>
#include <spdlog/spdlog.h>
#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/thread_pool.hpp>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "depot/ipc/units.h"
#include "store/arena.h"
#include "store/daemon_options.h"
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

int Fail(const Status& st) {
  std::fprintf(stderr, "depotd: %s\n", st.message().c_str());
  return 1;
}

// Whether stdout, where the log goes, is a stream to systemd's journal: systemd names it in
// $JOURNAL_STREAM ("device:inode") for the services it starts.
bool LogsToJournal() {
  const char* stream = std::getenv("JOURNAL_STREAM");
  struct stat st {};
  if (stream == nullptr || ::fstat(STDOUT_FILENO, &st) != 0) return false;
  return std::string(stream) ==
         std::to_string(static_cast<uint64_t>(st.st_dev)) + ":" + std::to_string(st.st_ino);
}

// A log line's syslog priority as the journal reads it from a stream: "<6>" for info.
class PriorityPrefix : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&,
              spdlog::memory_buf_t& dest) override {
    static constexpr std::string_view kPrefixes[] = {"<7>", "<7>", "<6>", "<4>", "<3>", "<2>", ""};
    const std::string_view prefix = kPrefixes[msg.level];
    dest.append(prefix.data(), prefix.data() + prefix.size());
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<PriorityPrefix>();
  }
};

// Log lines with a timestamp, or under systemd with the priority prefix the journal reads
// (it adds the time and the unit's name itself).
void SetUpLogging(const std::string& level) {
  spdlog::set_level(spdlog::level::from_str(level));
  if (LogsToJournal()) {
    auto formatter = std::make_unique<spdlog::pattern_formatter>();
    formatter->add_flag<PriorityPrefix>('*').set_pattern("%*%v");
    spdlog::set_formatter(std::move(formatter));
  } else {
    spdlog::set_pattern("[%Y-%m-%d %H:%M:%S.%e] [depotd] [%^%l%$] %v");
  }
}

// Tells systemd how the daemon is (sd_notify(3), for Type=notify): "READY=1" once clients
// can connect, "RELOADING=1" while a SIGHUP is applied, "STOPPING=1" on the way out. A
// datagram to the socket $NOTIFY_SOCKET names; nothing without it.
void Notify(const std::string& state) {
  const char* path = std::getenv("NOTIFY_SOCKET");
  sockaddr_un address{};
  if (path == nullptr || path[0] == '\0' || std::strlen(path) >= sizeof address.sun_path) return;
  address.sun_family = AF_UNIX;
  const size_t length = std::strlen(path);
  std::memcpy(address.sun_path, path, length);
  if (address.sun_path[0] == '@') address.sun_path[0] = '\0';  // an abstract socket
  const int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return;
  if (::sendto(fd, state.data(), state.size(), MSG_NOSIGNAL,
               reinterpret_cast<const sockaddr*>(&address),
               static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + length)) < 0) {
    spdlog::warn("cannot notify systemd at {}: {}", path, std::strerror(errno));
  }
  ::close(fd);
}

// Blocks SIGINT, SIGTERM and SIGHUP in the calling thread, and so in every thread it starts
// later, and returns a signalfd that reads them. Called before any thread exists, this means
// the signals never run a handler on some thread at some moment: they wait in the kernel
// until the loop reads them from the descriptor, even if they arrive before the loop runs.
// (Asio's signal_set runs a handler; under ThreadSanitizer, which defers handlers to its own
// safe points, a SIGTERM could then sit unhandled while the loop slept.)
Result<int> BlockSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGHUP);
  if (int err = pthread_sigmask(SIG_BLOCK, &signals, nullptr); err != 0) {
    return Status::IoError(std::string("pthread_sigmask: ") + std::strerror(err));
  }
  int fd = ::signalfd(-1, &signals, SFD_CLOEXEC | SFD_NONBLOCK);
  if (fd < 0) return Status::IoError(std::string("signalfd: ") + std::strerror(errno));
  return fd;
}

// The loop answers every request, and its clients wait for each answer: asks the kernel for a
// short time slice for the calling thread (EEVDF's custom slices, Linux 6.12), so that its
// wake-ups preempt the batch work of other processes at once instead of waiting for the end
// of their slice. On a host whose cores are all busy with a graph's workers this is most of a
// request's time (bench/README.md). Best effort, and no privilege is needed: older kernels
// ignore it, and nothing depends on it. The nice value and policy stay as they are.
void AskForAShortSlice() {
  constexpr uint64_t kSliceNs = 100'000;  // the shortest the kernel grants
  // The kernel's struct sched_attr as first published (SCHED_ATTR_SIZE_VER0): its header
  // clashes with glibc's <sched.h> on this distribution's headers.
  struct {
    uint32_t size = 48;
    uint32_t policy = 0;
    uint64_t flags = 0;
    int32_t nice = 0;
    uint32_t priority = 0;
    uint64_t runtime = 0;
    uint64_t deadline = 0;
    uint64_t period = 0;
  } attr;
  static_assert(sizeof attr == 48);
  if (::syscall(SYS_sched_getattr, 0, &attr, sizeof attr, 0) != 0) return;
  if (attr.policy != SCHED_OTHER) return;  // set by the administrator: left alone
  attr.runtime = kSliceNs;
  attr.flags = 0;
  if (::syscall(SYS_sched_setattr, 0, &attr, 0) != 0) {
    spdlog::debug("no short time slice for the loop: {}", std::strerror(errno));
  }
}

// SIGHUP: reads the settings again (the same flags, the configuration file as it is now),
// applies those that can change while the daemon runs, and says which others changed.
// Invalid settings change nothing.
void Reload(const std::vector<std::string>& args, depot::store::DaemonSettings& running,
            depot::store::ObjectStore& store, depot::store::Server& server) {
  const std::string source = running.config_file.empty() ? "flags" : running.config_file;
  auto fresh = depot::store::ReadSettings(args);
  if (!fresh.ok()) {
    spdlog::error("SIGHUP: {}; the settings stay as they were", fresh.status().message());
    return;
  }
  const depot::store::SettingChanges changes = depot::store::CompareSettings(running, *fresh);
  const spdlog::level::level_enum was = spdlog::get_level();
  running = depot::store::ApplyReload(running, *fresh);
  const spdlog::level::level_enum level = spdlog::level::from_str(running.log_level);
  store.SetLimits(running.limits);
  server.SetSettings(running.config_file, running.values);
  // What changed is said at the more verbose of the two levels, then the new one holds.
  spdlog::set_level(std::min(was, level));
  auto shown = [](const std::string& value) {
    return value.empty() ? std::string("(not set)") : value;
  };
  for (const auto& [before, after] : changes.applied) {
    spdlog::info("SIGHUP: {} is now {} (was {})", after.name, shown(after.value),
                 shown(before.value));
  }
  for (const auto& [before, after] : changes.need_restart) {
    spdlog::warn("SIGHUP: {} is {} in {} but stays {} until depotd restarts", after.name,
                 shown(after.value), source, shown(before.value));
  }
  if (changes.applied.empty() && changes.need_restart.empty()) {
    spdlog::info("SIGHUP: read {} again; nothing changed", source);
  }
  spdlog::set_level(level);
}

}  // namespace

int main(int argc, char** argv) {
  // First of all: a SIGHUP (systemctl reload) or SIGTERM that comes while depotd starts
  // waits for the loop instead of killing it.
  auto signal_fd = BlockSignals();
  if (!signal_fd.ok()) return Fail(signal_fd.status());
  const depot::store::CommandLine command_line = depot::store::ParseCommandLine(argc, argv);
  if (command_line.exit_code) return *command_line.exit_code;
  depot::store::DaemonSettings settings = command_line.settings;
  if (settings.check_config) {
    std::printf("depotd: %s: the settings are valid\n",
                settings.config_file.empty() ? "flags" : settings.config_file.c_str());
    return 0;
  }
  const std::vector<std::string> args(argv + 1, argv + argc);  // read again on SIGHUP

  SetUpLogging(settings.log_level);
  std::signal(SIGPIPE, SIG_IGN);
  // A file size limit makes a spill fail with EFBIG (the object stays in memory), not the daemon.
  std::signal(SIGXFSZ, SIG_IGN);
  // Every session, segment and spill file (two each) takes a descriptor: take all that this
  // process may have, not the usual soft limit of 1,024.
  if (rlimit files{}; getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    setrlimit(RLIMIT_NOFILE, &files);
  }
  const depot::store::DaemonSettings& s = settings;

  // Before the arena is made: a second daemon on a busy socket should fail fast.
  if (Status st = depot::store::Server::ClaimSocketPath(s.socket_path); !st.ok()) return Fail(st);

  boost::asio::io_context loop(1);
  boost::asio::posix::stream_descriptor signals(loop, *signal_fd);
  // A pidfd of --exit-with-pid's process: readable once that process has exited.
  boost::asio::posix::stream_descriptor lifeline(loop);
  if (s.exit_with_pid != 0) {
    const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, s.exit_with_pid, 0));
    if (pidfd < 0) {
      return Fail(
          depot::Status::InvalidArgument("--exit-with-pid " + std::to_string(s.exit_with_pid) +
                                         ": cannot watch that process: " + std::strerror(errno)));
    }
    lifeline.assign(pidfd);
  }
  boost::asio::thread_pool pool(s.workers);
  {
    auto gpus = depot::store::gpu::SetUpGpus(s.gpu);
    if (!gpus.ok()) return Fail(gpus.status());
    depot::store::ArenaOptions arena_options{s.memory, s.segment_size, s.arena_dir};
    arena_options.prefault = s.prefault;
    arena_options.keep_large = s.keep_large;
    arena_options.huge_pages = s.huge_pages;
    if (depot::store::gpu::DeviceBackend* backend = (*gpus)->backend.get();
        backend != nullptr && backend->kind() == "cuda" && !backend->devices().empty()) {
      arena_options.lock_pages = [backend](void* base, uint64_t bytes) {
        return backend->RegisterHostMemory(base, bytes);
      };
      arena_options.unlock_pages = [backend](void* base) { backend->UnregisterHostMemory(base); };
    }
    auto arena = depot::store::Arena::Create(arena_options, pool);
    if (!arena.ok()) return Fail(arena.status());
    auto headers = depot::store::HeaderTable::Create(s.max_objects);
    if (!headers.ok()) return Fail(headers.status());
    std::unique_ptr<depot::store::DiskPool> disk;
    if (!s.spill_dir.empty()) {
      auto opened = depot::store::DiskPool::Open(
          {s.spill_dir, s.spill_limit, s.spill_file_size, s.spill_direct_io}, pool);
      if (!opened.ok()) return Fail(opened.status());
      disk = std::move(opened).value();
      spdlog::info("spilling to {} (up to {}, files of {}, {} I/O)", disk->dir(),
                   depot::ipc::FormatSize(disk->capacity()),
                   depot::ipc::FormatSize(disk->file_size()),
                   disk->direct_io() ? "direct" : "buffered");
    }
    depot::store::WorkerPoolExecutor executor(loop, pool);
    depot::store::ObjectStore store(loop, executor, **arena, **headers, s.limits, s.evict,
                                    (*gpus)->pool_pointers(), s.lease_entries, disk.get());
    // Off the loop: placement assumes the flags' bandwidths until it is done.
    if (s.scheduler.measure_bandwidths && s.bandwidth_probe > 0) {
      store.ProbeCopyRates(s.bandwidth_probe);
    }
    depot::store::Server server(loop, store,
                                {.socket_path = s.socket_path,
                                 .socket_mode = s.socket_mode,
                                 .socket_group = s.socket_group,
                                 .max_frame_bytes = s.max_frame,
                                 .max_batch = s.max_batch,
                                 .metrics = s.metrics,
                                 .device_backend = (*gpus)->description,
                                 .share_uids = s.share_uids,
                                 .share_gids = s.share_gids,
                                 .share_write_uids = s.share_write_uids,
                                 .share_write_gids = s.share_write_gids,
                                 .scheduler = s.scheduler});
    server.SetSettings(s.config_file, s.values);
    depot::store::MetricsHttp metrics_http(loop, [&server] { return server.RenderMetrics(); });
    auto shut_down = [&] {
      Notify("STOPPING=1");
      server.Shutdown();
      metrics_http.Close();
      loop.stop();
    };

    // The signals have been blocked since before the socket existed, so a SIGTERM that
    // arrives as soon as clients can connect still shuts down cleanly and removes the socket
    // file: it is read here when the loop starts.
    signalfd_siginfo received{};
    std::function<void()> read_signal = [&] {
      signals.async_read_some(boost::asio::buffer(&received, sizeof received),
                              [&](const boost::system::error_code& ec, size_t) {
                                if (ec) return;
                                if (received.ssi_signo == SIGHUP) {
                                  Notify("RELOADING=1");
                                  Reload(args, settings, store, server);
                                  Notify("READY=1");
                                  return read_signal();
                                }
                                spdlog::info("received SIG{}, shutting down",
                                             sigabbrev_np(static_cast<int>(received.ssi_signo)));
                                shut_down();
                              });
    };
    read_signal();
    if (lifeline.is_open()) {
      lifeline.async_wait(boost::asio::posix::stream_descriptor::wait_read,
                          [&](const boost::system::error_code& ec) {
                            if (ec) return;
                            spdlog::info("process {} exited (--exit-with-pid), shutting down",
                                         s.exit_with_pid);
                            shut_down();
                          });
    }
    if (Status st = server.Listen(); !st.ok()) return Fail(st);
    if (s.metrics_port != 0) {
      if (Status st = metrics_http.Listen(s.metrics_address, s.metrics_port); !st.ok()) {
        return Fail(st);
      }
      spdlog::info("serving metrics at http://{}:{}/metrics", s.metrics_address,
                   metrics_http.port());
    }
    spdlog::info("depotd {} listening on {} (arena {} {}, segments of {} in {}{}, eviction {}{})",
                 depot::store::kDepotVersion, s.socket_path,
                 depot::ipc::FormatSize((*arena)->capacity()), (*arena)->backend(),
                 depot::ipc::FormatSize((*arena)->segment_size()),
                 depot::ipc::FormatSize((*arena)->page_bytes()) + " pages",
                 s.prefault ? "" : ", pages allocated as used", s.evict ? "on" : "off",
                 s.config_file.empty() ? "" : ", settings from " + s.config_file);
    Notify("READY=1\nSTATUS=listening on " + s.socket_path);
    AskForAShortSlice();  // the loop's thread only: the pool's threads do batch work
    loop.run();
    pool.join();
  }
  spdlog::info("stopped");
  return 0;
}
