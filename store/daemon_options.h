// depotd's settings: its flags, the same settings in a configuration file (--config), and
// which of them a running daemon changes when it reads them again (SIGHUP).
//
// Every flag is a key of the file, its name without the dashes (`memory = "8GiB"`,
// `no-evict = true`, `share-with-group = ["depot"]`); flags given on the command line
// override the file. A key the daemon does not know, or a value it cannot use, is an error
// that names it.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "depot/status.h"
#include "scheduler/scheduler.h"
#include "store/client_accounts.h"
#include "store/gpu/setup.h"

namespace depot::store {

// One setting as the daemon runs with it (for `status`): its key, and its value as the
// configuration file would write it.
struct SettingValue {
  std::string name;
  std::string value;
  bool operator==(const SettingValue&) const = default;
};

struct DaemonSettings {
  std::string config_file;    // --config; empty: none
  bool check_config = false;  // --check-config: validate, then exit
  // Every setting, in the order --help lists them (not --config and --check-config).
  std::vector<SettingValue> values;

  std::string socket_path;
  mode_t socket_mode = 0600;
  std::optional<gid_t> socket_group;  // the socket file's group; nullopt: the daemon's
  int exit_with_pid = 0;
  std::vector<uid_t> share_uids;
  std::vector<gid_t> share_gids;
  std::vector<uid_t> share_write_uids;
  std::vector<gid_t> share_write_gids;

  uint64_t memory = 0;  // the host arena's capacity, in bytes
  uint64_t segment_size = 0;
  std::string arena_dir;
  bool prefault = true;     // allocate shared segments' pages ahead of use (ArenaOptions)
  bool keep_large = true;   // keep large objects' memory for the next ones (ArenaOptions)
  bool huge_pages = false;  // ask for 2 MiB pages (ArenaOptions)
  bool evict = true;
  std::string spill_dir;
  uint64_t spill_limit = 0;
  uint64_t spill_file_size = 0;
  bool spill_direct_io = true;

  uint32_t max_objects = 0;
  uint32_t max_frame = 0;
  uint32_t max_batch = 0;
  ClientLimits limits;
  uint32_t lease_entries = 0;
  unsigned workers = 0;

  std::string log_level;  // trace, debug, info, warn, error
  bool metrics = true;
  uint16_t metrics_port = 0;
  std::string metrics_address;

  gpu::GpuOptions gpu;
  uint64_t bandwidth_probe = 0;
  scheduler::SchedulerOptions scheduler;
};

// What main is to do after reading its command line.
struct CommandLine {
  // Set: exit now with this code. --help and --version have printed what they print, and
  // an error its message.
  std::optional<int> exit_code;
  DaemonSettings settings;
};

// Reads depotd's command line and the configuration file it names.
CommandLine ParseCommandLine(int argc, const char* const* argv);

// Reads the settings again from the same arguments (argv without argv[0]), and so from the
// configuration file as it is now: what a SIGHUP does. InvalidArgument naming the key or
// flag if they are not valid.
Result<DaemonSettings> ReadSettings(const std::vector<std::string>& args);

// What a reload changes: the settings a running daemon applies (log level, per-client limits,
// metadata budget), and those that differ but take a restart.
struct SettingChanges {
  std::vector<std::pair<SettingValue, SettingValue>> applied;  // (running, new)
  std::vector<std::pair<SettingValue, SettingValue>> need_restart;
};
SettingChanges CompareSettings(const DaemonSettings& running, const DaemonSettings& fresh);

// `running` with the settings a reload applies taken from `fresh`.
DaemonSettings ApplyReload(const DaemonSettings& running, const DaemonSettings& fresh);

}  // namespace depot::store
