#include "store/daemon_options.h"

#include <grp.h>
#include <pwd.h>
#include <sys/sysinfo.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <set>
#include <thread>

#include "depot/ipc/protocol.h"
#include "depot/ipc/units.h"
#include "store/disk_pool.h"
#include "store/leases.h"
#include "store/version.h"

namespace depot::store {
namespace {

// The settings a running daemon changes when it reads its configuration again.
const std::set<std::string, std::less<>> kReloadable = {"log-level",           "client-max-bytes",
                                                        "client-max-objects",  "client-max-pending",
                                                        "client-max-metadata", "metadata-budget"};

// The flags as written, before Resolve turns them into DaemonSettings.
struct RawOptions {
  bool check_config = false;
  std::string socket_path = ipc::DefaultSocketPath();
  std::string socket_mode = "0600";
  std::string socket_group;
  int exit_with_pid = 0;
  std::vector<std::string> share_users, share_groups;
  std::vector<std::string> share_write_users, share_write_groups;
  std::string memory = "25%";
  std::string segment_size = "1GiB";
  std::string arena_dir;
  bool no_prefault = false;
  bool no_keep_large = false;
  bool huge_pages = false;
  bool no_evict = false;
  std::string spill_dir;
  std::string spill_limit = "0";
  std::string spill_file_size = "1GiB";
  std::string spill_io = "direct";
  uint32_t max_objects = 4u << 20;
  std::string max_frame = "16MiB";
  std::string bandwidth_probe = "64MiB";
  uint32_t max_batch = ipc::kDefaultMaxBatch;
  std::string client_max_bytes = "0";
  uint32_t client_max_objects = 0;
  uint32_t client_max_pending = 1024;
  std::string metadata_budget = "1GiB";
  std::string client_max_metadata = "256MiB";
  uint32_t lease_entries = Leases::kDefaultEntries;
  unsigned workers = std::max(2u, std::thread::hardware_concurrency() / 8);
  std::string log_level = "info";
  bool no_metrics = false;
  uint16_t metrics_port = 0;
  std::string metrics_address = "127.0.0.1";
  gpu::GpuOptions gpu;
  std::string placement = "cost";
  std::string pipeline = "on";
  scheduler::Bandwidths bandwidths;
};

// Declares every option on `app`, bound to `raw`'s fields.
void Declare(CLI::App& app, RawOptions& raw) {
  app.set_version_flag("--version", std::string("depotd ") + kDepotVersion);
  app.set_config("--config", "",
                 "read settings from this TOML file: each flag is a key, its name without the "
                 "dashes (memory = \"8GiB\"); flags given here override it");
  // Keys the daemon does not know are found by CheckKeys, which says more than CLI11 would.
  app.allow_config_extras(CLI::config_extras_mode::ignore);
  app.add_flag("--check-config", raw.check_config,
               "check the settings (the --config file and the flags) and exit: 0 if valid")
      ->configurable(false);

  app.add_option("--socket", raw.socket_path, "Unix socket to listen on (env DEPOT_SOCKET)")
      ->capture_default_str();
  app.add_option("--socket-mode", raw.socket_mode, "permissions of the socket file, in octal")
      ->capture_default_str();
  app.add_option("--socket-group", raw.socket_group,
                 "group (gid or name) of the socket file, for a --socket-mode such as 0660 that "
                 "lets its members connect; default: the daemon's");
  app.add_option("--exit-with-pid", raw.exit_with_pid,
                 "shut down, as on SIGTERM, when the process of this pid exits (a daemon private "
                 "to a program: depot.start_daemon(stop_with_parent=True))")
      ->capture_default_str();
  app.add_option("--share-with-uid", raw.share_users,
                 "users (uids or names; besides root and the daemon's own) that may read objects; "
                 "they can never create, delete or change any (needs a --socket-mode they can "
                 "open)")
      ->delimiter(',');
  app.add_option("--share-with-group", raw.share_groups,
                 "groups (gids or names) whose members may read objects, as --share-with-uid")
      ->delimiter(',');
  app.add_option("--share-writable-with-uid", raw.share_write_users,
                 "users (uids or names) that may read objects and create objects in host memory, "
                 "kept apart from other users' (they may delete their own objects only, and use "
                 "no GPU, tasks or administration)")
      ->delimiter(',');
  app.add_option("--share-writable-with-group", raw.share_write_groups,
                 "groups (gids or names) whose members may read and create objects, as "
                 "--share-writable-with-uid")
      ->delimiter(',');
  app.add_option("--memory", raw.memory,
                 "host arena capacity: a size (4GiB) or a share of RAM (25%)")
      ->capture_default_str();
  app.add_option("--segment-size", raw.segment_size,
                 "arena segment size: objects up to this size share segments, larger ones get one "
                 "of their own")
      ->capture_default_str();
  app.add_option("--arena-dir", raw.arena_dir,
                 "put segments in this directory (a tmpfs or hugetlbfs mount) instead of memfds");
  app.add_flag("--no-prefault", raw.no_prefault,
               "allocate the arena's pages as objects first use them, not 64 MiB ahead of them "
               "in each segment (less memory, slower puts into new pages; memfd segments are "
               "not page-locked for GPUs)");
  app.add_flag("--huge-pages", raw.huge_pages,
               "make the arena of 2 MiB pages: the host's reserved huge pages (vm.nr_hugepages) "
               "if they hold --memory, else transparent huge pages where the kernel allows them "
               "in shared memory; never fails for lack of them (status says what it got)");
  app.add_flag("--no-keep-large", raw.no_keep_large,
               "give back the memory of an object larger than a segment when it goes, instead "
               "of keeping it (free for any object) for the next large object");
  app.add_flag("--no-evict", raw.no_evict, "never evict objects; a create that does not fit fails");
  app.add_option("--spill-dir", raw.spill_dir,
                 "directory (created 0700) where objects that do not fit in host memory are "
                 "spilled, and read back from on get; default: none, they are evicted");
  app.add_option("--spill-limit", raw.spill_limit,
                 "most bytes of spill files (0: the directory's free space at start)")
      ->capture_default_str();
  app.add_option("--spill-file-size", raw.spill_file_size,
                 "spill files that pack objects up to this size; larger ones get their own")
      ->capture_default_str();
  app.add_option("--spill-io", raw.spill_io,
                 "how spills and restores move the bulk of an object: direct (O_DIRECT, past the "
                 "page cache, where the file system has it) or buffered")
      ->capture_default_str()
      ->check(CLI::IsMember({"direct", "buffered"}));
  app.add_option("--max-objects", raw.max_objects, "most objects the store holds at once")
      ->capture_default_str()
      ->check(CLI::Range(1u, 1u << 30));
  app.add_option("--max-frame", raw.max_frame, "largest message a client may send")
      ->capture_default_str();
  app.add_option("--max-batch", raw.max_batch, "most ids in one request")
      ->capture_default_str()
      ->check(CLI::Range(1u, 10'000'000u));
  app.add_option("--client-max-bytes", raw.client_max_bytes,
                 "bytes one client may hold (creating, referenced or leased); 0: no limit")
      ->capture_default_str();
  app.add_option("--client-max-objects", raw.client_max_objects,
                 "objects one client may hold; 0: no limit")
      ->capture_default_str();
  app.add_option("--metadata-budget", raw.metadata_budget,
                 "daemon memory it may keep for all clients together (object entries, names, "
                 "GPU metadata, waiting gets), taken back from objects nobody holds by "
                 "evicting them; 0: no limit")
      ->capture_default_str();
  app.add_option("--client-max-metadata", raw.client_max_metadata,
                 "the same for one client, and for all sessions of one uid other than root and "
                 "the daemon's; 0: no limit")
      ->capture_default_str();
  app.add_option("--lease-entries", raw.lease_entries,
                 "entries of each client's lease table, through which it gets objects it has "
                 "seen before with no round trip (fewer where --client-max-objects or "
                 "--client-max-bytes set a quarter aside for them); a power of two, 0: no "
                 "leases")
      ->capture_default_str()
      ->check(CLI::Range(0u, 1u << 20))
      ->check(CLI::Validator(
          [](std::string& value) -> std::string {
            const unsigned long n = std::stoul(value);
            return (n & (n - 1)) == 0 ? std::string() : "not a power of two: " + value;
          },
          "POWER OF TWO"));
  app.add_option("--client-max-pending", raw.client_max_pending,
                 "gets one client may have waiting; 0: no limit")
      ->capture_default_str();
  app.add_option("--workers", raw.workers, "threads for long work (pre-faulting, checksums)")
      ->capture_default_str()
      ->check(CLI::Range(1u, 256u));
  app.add_flag("--no-metrics", raw.no_metrics, "keep no request counters or latency histograms");
  app.add_option("--metrics-port", raw.metrics_port,
                 "serve GET /metrics (Prometheus text format) on this TCP port; 0: off")
      ->capture_default_str();
  app.add_option("--metrics-address", raw.metrics_address, "address of the metrics endpoint")
      ->capture_default_str();
  app.add_option("--gpu-memory", raw.gpu.memory,
                 "what each GPU pool may take: 75% (the default), 8GiB, or per GPU 0:8GiB,1:50%");
  app.add_option("--gpu-chunk-size", raw.gpu.chunk_size,
                 "size of the chunks GPU pools grow by (objects larger get their own)")
      ->capture_default_str();
  app.add_option("--gpu-reserve", raw.gpu.reserve,
                 "GPU pool memory to make at start-up (not on the first puts): 8GiB, 50%, or "
                 "per GPU 0:8GiB,1:50%");
  app.add_option("--simulate-gpus", raw.gpu.simulate,
                 "serve N simulated GPUs of SIZE (N or N:SIZE, default size 1GiB), backed by "
                 "host memory, instead of real ones: for tests and demos");
  app.add_flag("--no-gpus", raw.gpu.disabled, "serve no GPUs (do not load the CUDA driver)");
  app.add_option("--placement", raw.placement,
                 "how tasks are placed: cost (least estimated completion, inputs' locality "
                 "included) or random (a baseline to compare with)")
      ->capture_default_str()
      ->check(CLI::IsMember({"cost", "random"}));
  app.add_option("--pipeline", raw.pipeline,
                 "send tasks to busy workers ahead, each to start when a task of the same shape "
                 "running there ends (on), or only when they start (off)")
      ->capture_default_str()
      ->check(CLI::IsMember({"on", "off"}));
  app.add_option("--host-gpu-bandwidth", raw.bandwidths.host_to_gpu,
                 "bytes/s placement assumes for copies between host memory and a GPU (default: "
                 "measured on the store's copies, this until then)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--gpu-gpu-bandwidth", raw.bandwidths.gpu_to_gpu,
                 "bytes/s placement assumes for copies between GPUs (default: measured, this "
                 "until then)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--bandwidth-probe", raw.bandwidth_probe,
                 "bytes of the copies timed at start-up between host memory and GPUs, whose "
                 "bandwidths placement starts from (at most an eighth of a GPU; 0: none)")
      ->capture_default_str();
  app.add_option("--log-level", raw.log_level, "trace, debug, info, warn, error")
      ->capture_default_str()
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}));
}

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
  return ipc::ParseSize(text);
}

// A uid (or, with `is_group`, a gid) given as a number or a name.
Result<uint32_t> IdOf(const std::string& flag, const std::string& text, bool is_group) {
  if (!text.empty() && text.find_first_not_of("0123456789") == std::string::npos) {
    const unsigned long id = std::strtoul(text.c_str(), nullptr, 10);
    if (id < UINT32_MAX) return static_cast<uint32_t>(id);
  } else if (is_group) {
    if (const struct group* g = ::getgrnam(text.c_str())) return g->gr_gid;
  } else if (const struct passwd* p = ::getpwnam(text.c_str())) {
    return p->pw_uid;
  }
  return Status::InvalidArgument(flag + ": '" + text + "' is not a " +
                                 (is_group ? "group" : "user") + " of this host");
}

// IdOf of each of `texts`.
Result<std::vector<uint32_t>> IdsOf(const std::string& flag, const std::vector<std::string>& texts,
                                    bool is_group) {
  std::vector<uint32_t> ids;
  for (const std::string& text : texts) {
    DEPOT_ASSIGN_OR_RETURN(uint32_t id, IdOf(flag, text, is_group));
    ids.push_back(id);
  }
  return ids;
}

// A size flag's value, or InvalidArgument naming the flag.
Result<uint64_t> SizeOf(const std::string& flag, const std::string& text) {
  auto size = ipc::ParseSize(text);
  if (!size.ok()) return Status::InvalidArgument(flag + ": " + size.status().message());
  return size;
}

// Every configurable setting's value as a configuration file would write it (CLI11's own
// rendering), in the order --help lists them; "" for one that is not set and has no default.
std::vector<SettingValue> ValuesOf(const CLI::App& app) {
  std::map<std::string, std::string, std::less<>> rendered;
  std::istringstream lines(app.config_to_str(/*default_also=*/true, /*write_description=*/false));
  for (std::string line; std::getline(lines, line);) {
    const size_t eq = line.find('=');
    if (eq == std::string::npos) continue;
    std::string value = line.substr(eq + 1);
    if (value.size() >= 2 && value.front() == '"' && value.back() == '"') {
      value = value.substr(1, value.size() - 2);
    }
    rendered[line.substr(0, eq)] = std::move(value);
  }
  std::vector<SettingValue> values;
  for (const CLI::Option* option : app.get_options()) {
    if (!option->get_configurable() || option->get_lnames().empty()) continue;
    const std::string& name = option->get_lnames().front();
    const auto it = rendered.find(name);
    values.push_back({name, it == rendered.end() ? std::string() : it->second});
  }
  return values;
}

// The edit distance between two keys, for "did you mean".
size_t Distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// The keys written in the configuration file `path`. InvalidArgument naming the first key
// that is no setting of the daemon, or a section (the file has none).
Result<std::set<std::string, std::less<>>> CheckKeys(const CLI::App& app, const std::string& path) {
  std::set<std::string, std::less<>> known;
  for (const CLI::Option* option : app.get_options()) {
    if (option->get_configurable() && !option->get_lnames().empty()) {
      known.insert(option->get_lnames().front());
    }
  }
  std::vector<CLI::ConfigItem> items;
  try {
    items = CLI::ConfigTOML().from_file(path);
  } catch (const CLI::Error& e) {
    return Status::InvalidArgument(e.what());
  }
  std::set<std::string, std::less<>> keys;
  for (const CLI::ConfigItem& item : items) {
    if (!item.parents.empty()) {
      return Status::InvalidArgument(path + ": [" + item.parents.front() +
                                     "]: the file has no sections; write every key at the top");
    }
    if (item.name == "config" || item.name == "check-config") {
      return Status::InvalidArgument(path + ": " + item.name +
                                     " is a flag of the command line only, not a setting");
    }
    if (!known.contains(item.name)) {
      std::string message = path + ": unknown key '" + item.name + "'";
      const auto closest = std::min_element(known.begin(), known.end(), [&](auto& a, auto& b) {
        return Distance(item.name, a) < Distance(item.name, b);
      });
      if (closest != known.end() && Distance(item.name, *closest) <= 2) {
        message += " (did you mean '" + *closest + "'?)";
      } else if (item.name.find(' ') != std::string::npos) {
        message += " (lines are key = value)";
      } else {
        message += " (depotd --help lists the settings: each flag without its dashes)";
      }
      return Status::InvalidArgument(message);
    }
    keys.insert(item.name);
  }
  return keys;
}

// `message` about a flag ("--memory: ...", or CLI11's "Could not convert: --workers = x"),
// saying that the value came from `path` when the file sets it and the command line does not.
std::string Located(std::string message, const CLI::App& app, const std::string& path,
                    const std::set<std::string, std::less<>>& file_keys,
                    const std::vector<std::string>& args) {
  const size_t start = message.find("--");
  if (path.empty() || start == std::string::npos) return message;
  const size_t end = message.find_first_not_of("abcdefghijklmnopqrstuvwxyz-", start + 2);
  const std::string flag = message.substr(start, end - start);
  const std::string key = flag.substr(2);
  const bool on_command_line = std::any_of(args.begin(), args.end(), [&](const std::string& arg) {
    return arg == flag || arg.rfind(flag + "=", 0) == 0;
  });
  if (!file_keys.contains(key) || on_command_line || app.get_option_no_throw(flag) == nullptr) {
    return message;
  }
  if (start == 0) return path + ": " + key + message.substr(flag.size());  // "--key: why"
  return path + ": " + key + ": " + message;
}

// Turns the parsed flags into settings.
Result<DaemonSettings> Resolve(const CLI::App& app, const RawOptions& raw) {
  DaemonSettings s;
  if (const std::string path = app.get_config_ptr()->as<std::string>(); !path.empty()) {
    s.config_file = std::filesystem::absolute(path).lexically_normal();
  }
  s.check_config = raw.check_config;
  s.values = ValuesOf(app);

  s.socket_path = raw.socket_path;
  try {
    size_t used = 0;
    s.socket_mode = static_cast<mode_t>(std::stoul(raw.socket_mode, &used, 8));
    if (used != raw.socket_mode.size() || s.socket_mode > 0777) throw std::invalid_argument("");
  } catch (const std::exception&) {
    return Status::InvalidArgument("--socket-mode: '" + raw.socket_mode +
                                   "' is not an octal mode like 0660");
  }
  if (!raw.socket_group.empty()) {
    DEPOT_ASSIGN_OR_RETURN(s.socket_group, IdOf("--socket-group", raw.socket_group, true));
  }
  s.exit_with_pid = raw.exit_with_pid;
  DEPOT_ASSIGN_OR_RETURN(s.share_uids, IdsOf("--share-with-uid", raw.share_users, false));
  DEPOT_ASSIGN_OR_RETURN(s.share_gids, IdsOf("--share-with-group", raw.share_groups, true));
  DEPOT_ASSIGN_OR_RETURN(s.share_write_uids,
                         IdsOf("--share-writable-with-uid", raw.share_write_users, false));
  DEPOT_ASSIGN_OR_RETURN(s.share_write_gids,
                         IdsOf("--share-writable-with-group", raw.share_write_groups, true));

  auto memory = ParseMemory(raw.memory);
  if (!memory.ok()) return Status::InvalidArgument("--memory: " + memory.status().message());
  s.memory = *memory;
  DEPOT_ASSIGN_OR_RETURN(s.segment_size, SizeOf("--segment-size", raw.segment_size));
  s.arena_dir = raw.arena_dir;
  s.prefault = !raw.no_prefault;
  s.keep_large = !raw.no_keep_large;
  s.huge_pages = raw.huge_pages;
  s.evict = !raw.no_evict;
  s.spill_dir = raw.spill_dir;
  DEPOT_ASSIGN_OR_RETURN(s.spill_limit, SizeOf("--spill-limit", raw.spill_limit));
  auto spill_file = ipc::ParseSize(raw.spill_file_size);
  if (!spill_file.ok() || *spill_file < DiskPool::kAlignment) {
    return Status::InvalidArgument("--spill-file-size: must be a size of at least 4KiB");
  }
  s.spill_file_size = *spill_file;
  s.spill_direct_io = raw.spill_io == "direct";
  if (!s.spill_dir.empty() && !s.evict) {
    return Status::InvalidArgument(
        "--spill-dir and --no-evict do not go together: spilling takes objects out of host "
        "memory, which --no-evict forbids");
  }

  s.max_objects = raw.max_objects;
  auto frame = ipc::ParseSize(raw.max_frame);
  if (!frame.ok() || *frame < 4096 || *frame > (1u << 30)) {
    return Status::InvalidArgument("--max-frame: must be a size between 4KiB and 1GiB");
  }
  s.max_frame = static_cast<uint32_t>(*frame);
  s.max_batch = raw.max_batch;
  DEPOT_ASSIGN_OR_RETURN(s.limits.max_bytes, SizeOf("--client-max-bytes", raw.client_max_bytes));
  s.limits.max_objects = raw.client_max_objects;
  s.limits.max_pending_gets = raw.client_max_pending;
  DEPOT_ASSIGN_OR_RETURN(s.limits.max_metadata_bytes,
                         SizeOf("--client-max-metadata", raw.client_max_metadata));
  DEPOT_ASSIGN_OR_RETURN(s.limits.metadata_budget,
                         SizeOf("--metadata-budget", raw.metadata_budget));
  s.lease_entries = raw.lease_entries;
  s.workers = raw.workers;

  s.log_level = raw.log_level;
  s.metrics = !raw.no_metrics;
  s.metrics_port = raw.metrics_port;
  s.metrics_address = raw.metrics_address;

  s.gpu = raw.gpu;
  DEPOT_ASSIGN_OR_RETURN(s.bandwidth_probe, SizeOf("--bandwidth-probe", raw.bandwidth_probe));
  s.scheduler.bandwidths = raw.bandwidths;
  s.scheduler.bandwidths.gpu_to_host = raw.bandwidths.host_to_gpu;
  s.scheduler.random_placement = raw.placement == "random";
  s.scheduler.pipeline = raw.pipeline == "on";
  // Bandwidths given are kept; otherwise placement goes by those the store measures.
  s.scheduler.measure_bandwidths = app.get_option("--host-gpu-bandwidth")->count() == 0 &&
                                   app.get_option("--gpu-gpu-bandwidth")->count() == 0;
  return s;
}

// Parses `argv` with a fresh declaration of the options. Throws CLI::ParseError for --help
// and --version (CLI::Success); every error is InvalidArgument, saying where it is.
Result<DaemonSettings> Parse(CLI::App& app, RawOptions& raw, int argc, const char* const* argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  std::string parse_error;
  try {
    app.parse(argc, argv);
  } catch (const CLI::FileError& e) {
    return Status::InvalidArgument(e.what());  // the file named cannot be read
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) throw;
    parse_error = e.what();
  }
  const std::string path = app.get_config_ptr()->as<std::string>();
  std::set<std::string, std::less<>> file_keys;
  if (!path.empty()) {
    DEPOT_ASSIGN_OR_RETURN(file_keys, CheckKeys(app, path));
  }
  if (!parse_error.empty()) {
    return Status::InvalidArgument(Located(parse_error, app, path, file_keys, args));
  }
  auto settings = Resolve(app, raw);
  if (!settings.ok()) {
    return Status::InvalidArgument(
        Located(settings.status().message(), app, path, file_keys, args));
  }
  return settings;
}

}  // namespace

CommandLine ParseCommandLine(int argc, const char* const* argv) {
  CLI::App app{"depotd: the depot shared-memory object store daemon"};
  RawOptions raw;
  Declare(app, raw);
  CommandLine out;
  try {
    auto settings = Parse(app, raw, argc, argv);
    if (settings.ok()) {
      out.settings = std::move(settings).value();
    } else {
      std::cerr << "depotd: " << settings.status().message() << "\n";
      out.exit_code = 1;
    }
  } catch (const CLI::ParseError& e) {
    out.exit_code = app.exit(e);  // --help, --version
  }
  return out;
}

Result<DaemonSettings> ReadSettings(const std::vector<std::string>& args) {
  CLI::App app{"depotd"};
  RawOptions raw;
  Declare(app, raw);
  std::vector<const char*> argv{"depotd"};
  for (const std::string& arg : args) argv.push_back(arg.c_str());
  try {
    return Parse(app, raw, static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::ParseError&) {
    return Status::InvalidArgument("--help and --version are not settings");
  }
}

SettingChanges CompareSettings(const DaemonSettings& running, const DaemonSettings& fresh) {
  SettingChanges changes;
  for (const SettingValue& now : running.values) {
    const auto it = std::find_if(fresh.values.begin(), fresh.values.end(),
                                 [&](const SettingValue& v) { return v.name == now.name; });
    if (it == fresh.values.end() || it->value == now.value) continue;
    (kReloadable.contains(now.name) ? changes.applied : changes.need_restart)
        .emplace_back(now, *it);
  }
  return changes;
}

DaemonSettings ApplyReload(const DaemonSettings& running, const DaemonSettings& fresh) {
  DaemonSettings next = running;
  next.log_level = fresh.log_level;
  next.limits = fresh.limits;
  for (SettingValue& value : next.values) {
    if (!kReloadable.contains(value.name)) continue;
    for (const SettingValue& v : fresh.values) {
      if (v.name == value.name) value.value = v.value;
    }
  }
  return next;
}

}  // namespace depot::store
