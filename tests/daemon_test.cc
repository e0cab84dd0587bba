// depotd as a process: starting where another daemon listens or a dead one left its socket,
// the socket's permissions, bad flags, and shutting down with clients still connected.
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <optional>
#include <string>
#include <thread>

#include "child_process.h"
#include "daemon.h"
#include "depot/client.h"
#include "test_support.h"

namespace depot::testing {
namespace {

using std::chrono::milliseconds;

// The time slice the kernel gives thread `tid` (sched_getattr's runtime for a normal
// thread: Linux 6.12 and later), or nullopt where it says none.
std::optional<uint64_t> SliceOf(pid_t tid) {
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
  if (::syscall(SYS_sched_getattr, tid, &attr, sizeof attr, 0) != 0) return std::nullopt;
  if (attr.policy != SCHED_OTHER || attr.runtime == 0) return std::nullopt;
  return attr.runtime;
}

TEST(DaemonTest, RefusesToStartWhereAnotherDaemonListens) {
  TestDaemon first;
  ASSERT_TRUE(first.ok()) << first.error();
  ProgramRun second =
      RunProgram({DEPOT_DAEMON_PATH, "--socket", first.socket_path(), "--memory", "16MiB"}, {},
                 milliseconds(10'000));
  EXPECT_NE(second.exit_code, 0);
  EXPECT_NE(second.err.find("already listening"), std::string::npos) << second.err;
  // The first one is untouched.
  ASSERT_OK_AND_ASSIGN(Client client, Client::Connect(first.socket_path()));
  EXPECT_OK(client.Put(ObjectId::FromName("daemon/still-here"), AsBytes("yes")));
}

TEST(DaemonTest, ReplacesTheStaleSocketOfADeadDaemon) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty()) << dir.error();
  // What a daemon killed with SIGKILL leaves: a socket file nobody listens on.
  const std::string path = dir.path() + "/stale.sock";
  {
    const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
    ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0)
        << std::strerror(errno);
    ::close(fd);
  }
  TestDaemon daemon({"--socket", path});
  ASSERT_TRUE(daemon.ok()) << daemon.error();
  ASSERT_OK_AND_ASSIGN(Client client, Client::Connect(path));
  EXPECT_OK(client.Put(ObjectId::FromName("daemon/fresh"), AsBytes("ok")));
}

TEST(DaemonTest, RefusesASocketPathThatIsNotASocket) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty()) << dir.error();
  const std::string path = dir.path() + "/precious.txt";
  {
    std::FILE* f = std::fopen(path.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs("data", f);
    std::fclose(f);
  }
  ProgramRun run = RunProgram({DEPOT_DAEMON_PATH, "--socket", path, "--memory", "16MiB"}, {},
                              milliseconds(10'000));
  EXPECT_NE(run.exit_code, 0);
  EXPECT_NE(run.err.find(path), std::string::npos) << run.err;
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0) << "the daemon removed a file that was not its socket";
  EXPECT_TRUE(S_ISREG(st.st_mode));
}

TEST(DaemonTest, SocketIsPrivateByDefault) {
  TestDaemon daemon;
  ASSERT_TRUE(daemon.ok()) << daemon.error();
  struct stat st {};
  ASSERT_EQ(::stat(daemon.socket_path().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

TEST(DaemonTest, SigtermAsSoonAsTheSocketAcceptsShutsDownCleanly) {
  // The signal handler must be in place before the socket exists: TestDaemon sends SIGTERM
  // right after its first successful connect, then checks exit status 0 and that the socket
  // file is gone. Repeated, because the window it guards against is short.
  for (int i = 0; i < 20; ++i) {
    TestDaemon daemon;
    ASSERT_TRUE(daemon.ok()) << daemon.error();
  }
}

TEST(DaemonTest, SocketModeFlagSetsThePermissions) {
  TestDaemon daemon({"--socket-mode", "0660"});
  ASSERT_TRUE(daemon.ok()) << daemon.error();
  struct stat st {};
  ASSERT_EQ(::stat(daemon.socket_path().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0660u);
}

// --exit-with-pid: a daemon private to a program (depot.start_daemon(stop_with_parent=True))
// shuts down as on SIGTERM when that program's process exits, even killed.
TEST(DaemonTest, ExitWithPidShutsDownCleanlyWhenThatProcessExits) {
  ChildProcess watched = ChildProcess::Start([] {
    ::pause();
    return 0;
  });
  TestDaemon daemon({"--exit-with-pid", std::to_string(watched.pid())});
  ASSERT_TRUE(daemon.ok()) << daemon.error();
  {
    ASSERT_OK_AND_ASSIGN(Client client, Client::Connect(daemon.socket_path()));
    EXPECT_OK(client.Put(ObjectId::FromName("daemon/lifeline"), AsBytes("ok")));
  }
  watched.Kill(SIGKILL);
  EXPECT_EQ(watched.Wait(), kSignalExitBase + SIGKILL);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  struct stat st {};
  while (::stat(daemon.socket_path().c_str(), &st) == 0 &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::yield();
  }
  EXPECT_NE(::stat(daemon.socket_path().c_str(), &st), 0) << "the daemon is still listening";
  EXPECT_NE(daemon.Log().find("exited (--exit-with-pid), shutting down"), std::string::npos)
      << daemon.Log();
  daemon.Stop();  // it exited with status 0, having removed its socket
}

TEST(DaemonTest, ExitWithPidOfNoProcessIsAClearErrorAtStartup) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty()) << dir.error();
  ProgramRun run = RunProgram(
      {DEPOT_DAEMON_PATH, "--socket", dir.path() + "/depot.sock", "--exit-with-pid", "999999999"},
      {}, milliseconds(10'000));
  EXPECT_NE(run.exit_code, 0);
  EXPECT_NE(run.err.find("--exit-with-pid 999999999: cannot watch that process"), std::string::npos)
      << run.Explain();
}

TEST(DaemonTest, BadFlagIsAClearErrorAtStartup) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty()) << dir.error();
  ProgramRun run =
      RunProgram({DEPOT_DAEMON_PATH, "--socket", dir.path() + "/depot.sock", "--memory", "lots"},
                 {}, milliseconds(10'000));
  EXPECT_NE(run.exit_code, 0);
  EXPECT_NE(run.err.find("--memory"), std::string::npos) << run.err;
  EXPECT_NE(run.err.find("lots"), std::string::npos) << run.err;
}

TEST(DaemonTest, BadSchedulerFlagsAreClearErrorsAtStartup) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty()) << dir.error();
  for (const auto& [flag, value] :
       {std::pair{"--pipeline", "sometimes"}, std::pair{"--placement", "anywhere"}}) {
    ProgramRun run =
        RunProgram({DEPOT_DAEMON_PATH, "--socket", dir.path() + "/depot.sock", flag, value}, {},
                   milliseconds(10'000));
    EXPECT_NE(run.exit_code, 0) << run.Explain();
    EXPECT_NE(run.err.find(flag), std::string::npos) << run.Explain();
    EXPECT_NE(run.err.find(value), std::string::npos) << run.Explain();
  }
}

TEST(DaemonTest, BadSharingSizeAndProbeFlagsAreClearErrorsAtStartup) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty()) << dir.error();
  for (const auto& [flag, value] :
       {std::pair{"--share-with-uid", "no-such-user-here"},
        std::pair{"--share-with-uid", "99999999999"},
        std::pair{"--share-with-group", "no-such-group-here"},
        std::pair{"--share-writable-with-uid", "no-such-user-here"},
        std::pair{"--share-writable-with-uid", "99999999999"},
        std::pair{"--share-writable-with-group", "no-such-group-here"},
        std::pair{"--metadata-budget", "lots"}, std::pair{"--client-max-metadata", "-5"},
        std::pair{"--bandwidth-probe", "lots"}}) {
    ProgramRun run =
        RunProgram({DEPOT_DAEMON_PATH, "--socket", dir.path() + "/depot.sock", flag, value}, {},
                   milliseconds(10'000));
    EXPECT_NE(run.exit_code, 0) << run.Explain();
    EXPECT_NE(run.err.find(std::string(flag) + ": '" + value + "'"), std::string::npos)
        << run.Explain();
  }
}

TEST(DaemonTest, BadLeaseEntriesAreClearErrorsAtStartup) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty()) << dir.error();
  for (const char* value : {"3", "2000000", "-1", "many", "99999999999999999999999"}) {
    ProgramRun run = RunProgram(
        {DEPOT_DAEMON_PATH, "--socket", dir.path() + "/depot.sock", "--lease-entries", value}, {},
        milliseconds(10'000));
    EXPECT_NE(run.exit_code, 0) << run.Explain();
    EXPECT_NE(run.err.find("--lease-entries"), std::string::npos) << run.Explain();
    EXPECT_NE(run.err.find(value), std::string::npos) << run.Explain();
  }
}

TEST(DaemonTest, StatusDescribesTheDaemon) {
  TestDaemon daemon({"--memory", "32MiB", "--segment-size", "8MiB", "--max-objects", "1000"});
  ASSERT_TRUE(daemon.ok()) << daemon.error();
  ASSERT_OK_AND_ASSIGN(Client client, Client::Connect(daemon.socket_path()));
  ASSERT_OK_AND_ASSIGN(StoreStatus status, client.GetStatus());
  EXPECT_EQ(status.pid, static_cast<uint32_t>(daemon.pid()));
  EXPECT_EQ(status.socket_path, daemon.socket_path());
  EXPECT_EQ(status.arena_backend, "memfd");
  EXPECT_EQ(status.capacity_bytes, 32u << 20);
  EXPECT_EQ(status.header_slots, 1000u);
  EXPECT_TRUE(status.eviction_enabled);
  EXPECT_EQ(status.used_bytes, 0u);
  EXPECT_GE(status.clients, 1u);
  EXPECT_FALSE(status.daemon_version.empty());
}

// The loop asks for the kernel's shortest slice, so that its answers preempt clients' batch
// work; this test process's threads keep the default, longer one.
TEST(DaemonTest, TheLoopRunsWithAShortTimeSliceWhereTheKernelGrantsOne) {
  const std::optional<uint64_t> mine = SliceOf(static_cast<pid_t>(::syscall(SYS_gettid)));
  if (!mine) GTEST_SKIP() << "this kernel reports no time slices (custom slices: Linux 6.12)";
  TestDaemon daemon({"--memory", "8MiB"});
  ASSERT_TRUE(daemon.ok()) << daemon.error();
  // An answer comes from the loop, which asks for its slice before it runs.
  ASSERT_OK_AND_ASSIGN(Client client, Client::Connect(daemon.socket_path()));
  ASSERT_OK(client.GetStatus().status());
  const std::optional<uint64_t> loop = SliceOf(daemon.pid());  // the loop is its main thread
  ASSERT_TRUE(loop.has_value());
  EXPECT_EQ(*loop, 100'000u);
  EXPECT_GT(*mine, *loop);
}

TEST(DaemonTest, ShutdownWithClientsConnectedIsCleanAndDisconnectsThem) {
  TestDaemon daemon;
  ASSERT_TRUE(daemon.ok()) << daemon.error();
  ASSERT_OK_AND_ASSIGN(Client client, Client::Connect(daemon.socket_path()));
  ASSERT_OK(client.Put(ObjectId::FromName("daemon/held"), AsBytes("held")));
  ASSERT_OK_AND_ASSIGN(Buffer held, client.Get(ObjectId::FromName("daemon/held")));
  ASSERT_OK_AND_ASSIGN(MutableBuffer creating,
                       client.Create(ObjectId::FromName("daemon/creating"), 64));
  Result<Buffer> waited = Status::Internal("not run");
  std::thread waiter([&] { waited = client.Get(ObjectId::FromName("daemon/never"), kForever); });
  std::this_thread::sleep_for(milliseconds(50));

  daemon.Stop();  // checks exit status 0 and that the socket file is gone
  waiter.join();
  EXPECT_EQ(waited.status().code(), StatusCode::kDisconnected) << waited.status().ToString();
  // The mapping outlives the daemon: what a client holds stays readable.
  EXPECT_TRUE(SameBytes(held.data(), AsBytes("held")));
  EXPECT_STATUS(client.GetStatus(), StatusCode::kDisconnected);
}

}  // namespace
}  // namespace depot::testing
