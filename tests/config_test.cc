// depotd's configuration file (--config), --check-config, SIGHUP reloads, the socket's
// group and the journal's log format: against the real daemon binary.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "child_process.h"
#include "daemon.h"
#include "daemon_process.h"
#include "depot/client.h"
#include "test_support.h"

namespace depot {
namespace {

using testing::RunProgram;
using testing::StatusOf;
using testing::TempDir;
using testing::TestDaemon;

constexpr auto kDeadline = std::chrono::seconds(10);

// Writes `text` to `dir`/`name` and returns its path.
std::string WriteFile(const TempDir& dir, const std::string& name, const std::string& text) {
  const std::string path = dir.path() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

std::map<std::string, std::string> SettingsOf(const StoreStatus& status) {
  std::map<std::string, std::string> settings;
  for (const Setting& s : status.settings) settings[s.name] = s.value;
  return settings;
}

// The daemon's settings once `done` holds of them, polling its status (up to kDeadline): a
// SIGHUP is read by the daemon's loop some time after kill() returns.
std::optional<StoreStatus> AwaitStatus(Client& client,
                                       const std::function<bool(const StoreStatus&)>& done) {
  const auto deadline = std::chrono::steady_clock::now() + kDeadline;
  while (std::chrono::steady_clock::now() < deadline) {
    auto status = client.GetStatus();
    if (!status.ok()) return std::nullopt;
    if (done(*status)) return *status;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return std::nullopt;
}

// Runs `depotd args...` to completion (it must not start serving: these fail or check).
testing::ProgramRun Depotd(std::vector<std::string> args) {
  args.insert(args.begin(), DEPOT_DAEMON_PATH);
  return RunProgram(args);
}

TEST(ConfigTest, EverySettingOfTheFileTakesEffect) {
  TempDir files;
  const std::string config = WriteFile(files, "depotd.toml", R"(# a node's depotd
memory = "48MiB"
segment-size = "8MiB"
no-evict = true
socket-mode = "0660"
client-max-objects = 2
client-max-bytes = "16MiB"
client-max-pending = 5
metadata-budget = "64MiB"
client-max-metadata = "8MiB"
max-batch = 1000
max-objects = 5000
max-frame = "1MiB"
lease-entries = 64
workers = 3
simulate-gpus = "1:32MiB"
placement = "random"
log-level = "warn"
)");
  TestDaemon daemon({"--config", config});
  ASSERT_TRUE(daemon.ok()) << daemon.error();
  ASSERT_OK_AND_ASSIGN(Client client, Client::Connect(daemon.socket_path()));
  ASSERT_OK_AND_ASSIGN(StoreStatus status, client.GetStatus());
  EXPECT_EQ(status.config_file, config);
  const auto settings = SettingsOf(status);
  const std::map<std::string, std::string> expected = {
      {"memory", "48MiB"},
      {"segment-size", "8MiB"},
      {"no-evict", "true"},
      {"socket-mode", "0660"},
      {"client-max-objects", "2"},
      {"client-max-bytes", "16MiB"},
      {"client-max-pending", "5"},
      {"metadata-budget", "64MiB"},
      {"client-max-metadata", "8MiB"},
      {"max-batch", "1000"},
      {"max-objects", "5000"},
      {"max-frame", "1MiB"},
      {"lease-entries", "64"},
      {"workers", "3"},
      {"simulate-gpus", "1:32MiB"},
      {"placement", "random"},
      {"log-level", "warn"},
      {"socket", daemon.socket_path()},
  };
  for (const auto& [key, value] : expected) {
    ASSERT_TRUE(settings.contains(key)) << key;
    EXPECT_EQ(settings.at(key), value) << key;
  }
  // Settings not in the file are listed with their defaults.
  EXPECT_EQ(settings.at("spill-io"), "direct");
  EXPECT_EQ(settings.at("pipeline"), "on");

  // And they are what the daemon does.
  EXPECT_EQ(status.capacity_bytes, uint64_t{48} << 20);
  EXPECT_FALSE(status.eviction_enabled);
  EXPECT_EQ(status.metadata_budget_bytes, uint64_t{64} << 20);
  ASSERT_EQ(status.gpus.size(), 1u);
  EXPECT_EQ(status.gpus[0].total_bytes, uint64_t{32} << 20);
  struct stat st {};
  ASSERT_EQ(::stat(daemon.socket_path().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0660u);
  // A create holds its object while its buffer lives.
  ASSERT_OK_AND_ASSIGN(MutableBuffer first, client.Create(ObjectId::Random(), 100));
  ASSERT_OK_AND_ASSIGN(MutableBuffer second, client.Create(ObjectId::Random(), 100));
  const Status third = StatusOf(client.Create(ObjectId::Random(), 100));
  EXPECT_EQ(third.code(), StatusCode::kLimitExceeded) << third.ToString();
  EXPECT_NE(third.message().find("--client-max-objects"), std::string::npos) << third.message();
  // log-level = "warn": a session's info lines are not written.
  EXPECT_EQ(daemon.Log().find("connected (pid"), std::string::npos) << daemon.Log();
}

TEST(ConfigTest, FlagsOverrideTheFile) {
  TempDir files;
  const std::string config =
      WriteFile(files, "depotd.toml", "memory = \"48MiB\"\nsegment-size = \"8MiB\"\n");
  TestDaemon daemon({"--config", config, "--memory", "24MiB"});
  ASSERT_TRUE(daemon.ok()) << daemon.error();
  ASSERT_OK_AND_ASSIGN(Client client, Client::Connect(daemon.socket_path()));
  ASSERT_OK_AND_ASSIGN(StoreStatus status, client.GetStatus());
  EXPECT_EQ(status.capacity_bytes, uint64_t{24} << 20);
  EXPECT_EQ(SettingsOf(status).at("memory"), "24MiB");
  EXPECT_EQ(SettingsOf(status).at("segment-size"), "8MiB");
}

TEST(ConfigTest, AnUnknownKeyFailsNamingIt) {
  TempDir files;
  const std::string typo = WriteFile(files, "typo.toml", "memroy = \"4GiB\"\n");
  testing::ProgramRun run = Depotd({"--config", typo, "--socket", files.path() + "/d.sock"});
  EXPECT_EQ(run.exit_code, 1) << run.Explain();
  EXPECT_NE(run.err.find(typo + ": unknown key 'memroy' (did you mean 'memory'?)"),
            std::string::npos)
      << run.Explain();
  struct stat st {};
  EXPECT_NE(::lstat((files.path() + "/d.sock").c_str(), &st), 0) << "it must not start";

  const std::string unknown = WriteFile(files, "unknown.toml", "colour = \"blue\"\n");
  run = Depotd({"--config", unknown, "--check-config"});
  EXPECT_EQ(run.exit_code, 1) << run.Explain();
  EXPECT_NE(run.err.find("unknown key 'colour'"), std::string::npos) << run.Explain();

  const std::string section = WriteFile(files, "section.toml", "[depotd]\nmemory = \"1GiB\"\n");
  run = Depotd({"--config", section, "--check-config"});
  EXPECT_EQ(run.exit_code, 1) << run.Explain();
  EXPECT_NE(run.err.find("[depotd]: the file has no sections"), std::string::npos) << run.Explain();

  run = Depotd({"--config", files.path() + "/missing.toml", "--check-config"});
  EXPECT_EQ(run.exit_code, 1) << run.Explain();
  EXPECT_NE(run.err.find("missing.toml"), std::string::npos) << run.Explain();
}

TEST(ConfigTest, ABadValueFailsNamingTheKeyAndTheFile) {
  TempDir files;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"memory = \"lots\"\n", "memory: 'lots' is not a size"},
      {"max-batch = 0\n", "max-batch: Value 0 not in range"},
      {"log-level = \"loud\"\n", "log-level: loud not in"},
      {"socket-mode = \"0999\"\n", "socket-mode: '0999' is not an octal mode"},
      {"share-with-group = [\"no-such-group-here\"]\n",
       "share-with-group: 'no-such-group-here' is not a group of this host"},
      {"socket-group = \"no-such-group-here\"\n", "socket-group: 'no-such-group-here'"},
      {"lease-entries = 3\n", "not a power of two"},
      {"client-max-objects = \"lots\"\n", "client-max-objects: Could not convert"},
      {"no-prefault = \"maybe\"\n", "no-prefault: Could not convert"},
      {"huge-pages = \"maybe\"\n", "huge-pages: Could not convert"},
      {"config = \"other.toml\"\n", "config is a flag of the command line only"},
      {"spill-dir = \"/tmp/x\"\nno-evict = true\n", "do not go together"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto& [text, message] = cases[i];
    const std::string config = WriteFile(files, "bad" + std::to_string(i) + ".toml", text);
    const testing::ProgramRun run = Depotd({"--config", config, "--check-config"});
    EXPECT_EQ(run.exit_code, 1) << text << run.Explain();
    EXPECT_NE(run.err.find(message), std::string::npos) << text << run.Explain();
    // Each names the file, but for two keys that do not go together.
    if (message != "do not go together") {
      EXPECT_NE(run.err.find(config + ": "), std::string::npos) << text << run.Explain();
    }
  }
  // The same value given as a flag is the flag's error.
  const testing::ProgramRun run = Depotd({"--memory", "lots", "--check-config"});
  EXPECT_EQ(run.exit_code, 1) << run.Explain();
  EXPECT_NE(run.err.find("--memory: 'lots' is not a size"), std::string::npos) << run.Explain();
}

TEST(ConfigTest, CheckConfigValidatesWithoutStarting) {
  TempDir files;
  const std::string socket = files.path() + "/d.sock";
  const std::string config = WriteFile(files, "depotd.toml",
                                       "memory = \"64MiB\"\nsocket = \"" + socket +
                                           "\"\nshare-with-uid = [\"0\"]\nno-gpus = true\n");
  const testing::ProgramRun run = Depotd({"--config", config, "--check-config"});
  EXPECT_EQ(run.exit_code, 0) << run.Explain();
  EXPECT_NE(run.out.find(config + ": the settings are valid"), std::string::npos) << run.Explain();
  struct stat st {};
  EXPECT_NE(::lstat(socket.c_str(), &st), 0) << "--check-config must not start the daemon";
}

TEST(ConfigTest, SighupAppliesLogLevelAndLimitsAndNamesWhatTakesARestart) {
  TempDir files;
  const std::string config = WriteFile(
      files, "depotd.toml",
      "memory = \"64MiB\"\nsegment-size = \"16MiB\"\nlog-level = \"info\"\nno-gpus = true\n");
  TestDaemon daemon({"--config", config});
  ASSERT_TRUE(daemon.ok()) << daemon.error();
  ASSERT_OK_AND_ASSIGN(Client client, Client::Connect(daemon.socket_path()));
  EXPECT_NE(daemon.Log().find("connected (pid"), std::string::npos) << daemon.Log();

  WriteFile(files, "depotd.toml",
            "memory = \"32MiB\"\nsegment-size = \"16MiB\"\nlog-level = \"warn\"\n"
            "client-max-objects = 1\nmetadata-budget = \"512MiB\"\nno-gpus = true\n"
            "spill-dir = \"/tmp/depot-spill\"\n");
  ASSERT_EQ(::kill(daemon.pid(), SIGHUP), 0);
  auto status = AwaitStatus(
      client, [](const StoreStatus& s) { return SettingsOf(s).at("log-level") == "warn"; });
  ASSERT_TRUE(status) << "the reload did not show within 10 s\n" << daemon.Log();
  const auto settings = SettingsOf(*status);
  EXPECT_EQ(settings.at("client-max-objects"), "1");
  EXPECT_EQ(status->metadata_budget_bytes, uint64_t{512} << 20);
  // memory takes a restart: the daemon says so and keeps its arena.
  EXPECT_EQ(settings.at("memory"), "64MiB");
  EXPECT_EQ(status->capacity_bytes, uint64_t{64} << 20);
  const std::string log = daemon.Log();
  EXPECT_NE(log.find("SIGHUP: log-level is now warn (was info)"), std::string::npos) << log;
  EXPECT_NE(log.find("SIGHUP: client-max-objects is now 1 (was 0)"), std::string::npos) << log;
  EXPECT_NE(
      log.find("SIGHUP: memory is 32MiB in " + config + " but stays 64MiB until depotd restarts"),
      std::string::npos)
      << log;
  // A setting the file did not have before, and has no default, is a change too.
  EXPECT_NE(log.find("SIGHUP: spill-dir is /tmp/depot-spill in " + config +
                     " but stays (not set) until depotd restarts"),
            std::string::npos)
      << log;

  // The new limit holds for the next create; the new level for the next session.
  ASSERT_OK_AND_ASSIGN(MutableBuffer held, client.Create(ObjectId::Random(), 100));
  EXPECT_STATUS(client.Create(ObjectId::Random(), 100), StatusCode::kLimitExceeded);
  const size_t before = daemon.Log().size();
  ASSERT_OK_AND_ASSIGN(Client second, Client::Connect(daemon.socket_path()));
  ASSERT_OK(second.GetStatus());
  EXPECT_EQ(daemon.Log().find("connected (pid", before), std::string::npos) << daemon.Log();
}

TEST(ConfigTest, SighupWithAnInvalidFileChangesNothing) {
  TempDir files;
  const std::string config = WriteFile(
      files, "depotd.toml",
      "memory = \"64MiB\"\nsegment-size = \"16MiB\"\nclient-max-objects = 1\nno-gpus = true\n");
  TestDaemon daemon({"--config", config});
  ASSERT_TRUE(daemon.ok()) << daemon.error();
  ASSERT_OK_AND_ASSIGN(Client client, Client::Connect(daemon.socket_path()));
  WriteFile(files, "depotd.toml", "memroy = \"32MiB\"\nclient-max-objects = 5\n");
  ASSERT_EQ(::kill(daemon.pid(), SIGHUP), 0);
  const auto deadline = std::chrono::steady_clock::now() + kDeadline;
  while (daemon.Log().find("the settings stay as they were") == std::string::npos &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const std::string log = daemon.Log();
  EXPECT_NE(log.find("SIGHUP: " + config + ": unknown key 'memroy'"), std::string::npos) << log;
  ASSERT_OK_AND_ASSIGN(StoreStatus status, client.GetStatus());
  EXPECT_EQ(SettingsOf(status).at("client-max-objects"), "1");
  ASSERT_OK_AND_ASSIGN(MutableBuffer held, client.Create(ObjectId::Random(), 100));
  EXPECT_STATUS(client.Create(ObjectId::Random(), 100), StatusCode::kLimitExceeded);
}

TEST(ConfigTest, TheSocketGetsItsGroupAndMode) {
  // Giving a file to another group takes root (or membership of it).
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to give the socket to another group";
  constexpr gid_t kGroup = 65534;  // nogroup: not the daemon's
  TestDaemon daemon({"--socket-group", std::to_string(kGroup), "--socket-mode", "0660"});
  ASSERT_TRUE(daemon.ok()) << daemon.error();
  struct stat st {};
  ASSERT_EQ(::stat(daemon.socket_path().c_str(), &st), 0);
  EXPECT_EQ(st.st_gid, kGroup);
  EXPECT_EQ(st.st_mode & 0777, 0660u);
}

TEST(ConfigTest, UnderSystemdTheLogCarriesTheJournalsPriorities) {
  TempDir dir;
  const std::string socket = dir.path() + "/d.sock";
  const std::string log_path = dir.path() + "/journal.log";
  const int log_fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
  ASSERT_GE(log_fd, 0);
  struct stat st {};
  ASSERT_EQ(::fstat(log_fd, &st), 0);
  // What systemd sets for a service whose output goes to the journal.
  const std::string stream = std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino);
  ::setenv("JOURNAL_STREAM", stream.c_str(), 1);
  std::string error;
  pid_t pid = launch::Spawn({DEPOT_DAEMON_PATH, "--socket", socket, "--memory", "16MiB",
                             "--segment-size", "8MiB", "--no-gpus"},
                            {.output_fd = log_fd}, &error);
  ::unsetenv("JOURNAL_STREAM");
  ::close(log_fd);
  ASSERT_GT(pid, 0) << error;
  error = launch::AwaitAccepting(&pid, socket, kDeadline);
  ASSERT_EQ(error, "");
  EXPECT_EQ(launch::Terminate(pid, kDeadline), std::optional<int>(0));
  std::ifstream in(log_path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  ASSERT_FALSE(lines.empty());
  // "<6>" is info, "<4>" a warning; the journal adds the time and the unit itself.
  bool listening = false;
  for (const std::string& line : lines) {
    EXPECT_TRUE(line.size() > 3 && line[0] == '<' && line[2] == '>') << line;
    listening = listening || line.rfind("<6>depotd ", 0) == 0;
  }
  EXPECT_TRUE(listening) << lines.front();
}

// The next datagram on `fd`, or "" if none comes within kDeadline.
std::string NextDatagram(int fd) {
  pollfd p{.fd = fd, .events = POLLIN, .revents = 0};
  if (::poll(&p, 1, static_cast<int>(std::chrono::milliseconds(kDeadline).count())) != 1) {
    return "";
  }
  char buffer[512];
  const ssize_t n = ::recv(fd, buffer, sizeof buffer, 0);
  return n > 0 ? std::string(buffer, static_cast<size_t>(n)) : "";
}

TEST(ConfigTest, UnderSystemdItSaysWhenItIsReadyReloadingAndStopping) {
  TempDir dir;
  const std::string socket = dir.path() + "/d.sock";
  const std::string notify = dir.path() + "/notify";
  // What systemd listens on for a Type=notify service.
  const int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un address{.sun_family = AF_UNIX, .sun_path = {}};
  std::memcpy(address.sun_path, notify.c_str(), notify.size());
  ASSERT_EQ(::bind(fd, reinterpret_cast<const sockaddr*>(&address), sizeof address), 0);
  ::setenv("NOTIFY_SOCKET", notify.c_str(), 1);
  const int log_fd =
      ::open((dir.path() + "/depotd.log").c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
  ASSERT_GE(log_fd, 0);
  std::string error;
  pid_t pid = launch::Spawn({DEPOT_DAEMON_PATH, "--socket", socket, "--memory", "16MiB",
                             "--segment-size", "8MiB", "--no-gpus"},
                            {.output_fd = log_fd}, &error);
  ::unsetenv("NOTIFY_SOCKET");
  ::close(log_fd);
  ASSERT_GT(pid, 0) << error;
  const std::string ready = NextDatagram(fd);
  EXPECT_EQ(ready, "READY=1\nSTATUS=listening on " + socket);
  // Ready means clients can connect.
  EXPECT_TRUE(launch::Accepts(socket));
  ASSERT_EQ(::kill(pid, SIGHUP), 0);
  EXPECT_EQ(NextDatagram(fd), "RELOADING=1");
  EXPECT_EQ(NextDatagram(fd), "READY=1");
  EXPECT_EQ(launch::Terminate(pid, kDeadline), std::optional<int>(0));
  EXPECT_EQ(NextDatagram(fd), "STOPPING=1");
  ::close(fd);
}

}  // namespace
}  // namespace depot
