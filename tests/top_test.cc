// depotctl top against a real depotd: the live view driven in a real pseudo-terminal (what
// it shows, that q, Ctrl-C and SIGTERM end it with the terminal given back, that it redraws
// on a resize, that rates follow the clients' work), the plain frames a pipe gets, and
// clear failures when there is no daemon or the daemon goes away.
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <functional>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "child_process.h"
#include "daemon.h"
#include "depot/client.h"
#include "test_support.h"

#ifndef DEPOTCTL_PATH
#error "DEPOTCTL_PATH must name the depotctl binary (set by tests/CMakeLists.txt)"
#endif

namespace depot::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using Clock = std::chrono::steady_clock;

// What the view writes to enter and to leave the alternate screen (DEC private modes 1049,
// and 25 for the cursor).
constexpr std::string_view kEnterView = "\x1b[?1049h";
constexpr std::string_view kHideCursor = "\x1b[?25l";
constexpr std::string_view kLeaveView = "\x1b[?1049l\x1b[?25h";
// Generous bounds for slow (sanitizer) builds; a passing test waits only as long as it must.
constexpr milliseconds kPatience = seconds(15);

bool Has(std::string_view text, std::string_view part) {
  return text.find(part) != std::string_view::npos;
}

// The first line that contains every one of `parts`, if any.
std::optional<std::string> LineWith(const std::vector<std::string>& lines,
                                    std::initializer_list<std::string_view> parts) {
  for (const std::string& line : lines) {
    if (std::all_of(parts.begin(), parts.end(), [&](std::string_view p) { return Has(line, p); })) {
      return line;
    }
  }
  return std::nullopt;
}

// `text` without its escape sequences (ESC [ ... final byte) and carriage returns.
std::string Plain(std::string_view text) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\x1b' && i + 1 < text.size() && text[i + 1] == '[') {
      i += 2;
      while (i < text.size() && !(text[i] >= 0x40 && text[i] <= 0x7e)) ++i;
    } else if (text[i] != '\r') {
      out += text[i];
    }
  }
  return out;
}

std::vector<std::string> SplitLines(std::string_view text) {
  std::vector<std::string> lines;
  while (!text.empty()) {
    const size_t end = std::min(text.find('\n'), text.size());
    lines.emplace_back(text.substr(0, end));
    text.remove_prefix(std::min(end + 1, text.size()));
  }
  return lines;
}

// The frames the view drew, as lines of plain text: each starts where the cursor is sent
// home (ESC [H). The last one may still be arriving.
std::vector<std::vector<std::string>> Frames(std::string_view raw) {
  std::vector<std::vector<std::string>> frames;
  size_t at = raw.find("\x1b[H");
  while (at != std::string_view::npos) {
    const size_t next = raw.find("\x1b[H", at + 3);
    const std::string text =
        Plain(raw.substr(at, next == std::string_view::npos ? next : next - at));
    if (text.find_first_not_of(" \n") != std::string::npos) frames.push_back(SplitLines(text));
    at = next;
  }
  return frames;
}

std::vector<std::string> LastFrame(std::string_view raw) {
  auto frames = Frames(raw);
  return frames.empty() ? std::vector<std::string>{} : frames.back();
}

// The rate after `label` on the frame's rates line ("gets 12/s"), or "" if there is none.
std::string RateOf(const std::vector<std::string>& frame, const std::string& label) {
  const auto line = LineWith(frame, {"rates", "requests "});
  if (!line) return "";
  const size_t at = line->find("  " + label + " ");
  if (at == std::string::npos) return "";
  const size_t start = at + label.size() + 3;
  const size_t end = line->find("/s", start);
  return end == std::string::npos ? "" : line->substr(start, end + 2 - start);
}

bool IsNonZeroRate(const std::string& rate) {
  return !rate.empty() && rate != "-" && rate != "0.0/s" && rate != "0 B/s";
}

// A program on a pseudo-terminal of its own (forkpty): its stdin, stdout and stderr, and
// its controlling terminal, as in a terminal emulator. Killed and reaped on destruction if
// still running.
class PtyProgram {
 public:
  PtyProgram(const std::vector<std::string>& argv, unsigned short columns, unsigned short rows) {
    // Everything the child needs is made before forking: only exec follows in the child.
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    winsize size{};
    size.ws_col = columns;
    size.ws_row = rows;
    pid_ = ::forkpty(&master_, nullptr, nullptr, &size);
    if (pid_ == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      ::execv(args[0], args.data());
      ::_exit(127);
    }
  }
  ~PtyProgram() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (master_ >= 0) ::close(master_);
  }
  PtyProgram(const PtyProgram&) = delete;
  PtyProgram& operator=(const PtyProgram&) = delete;

  bool started() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }
  // Everything the program wrote to the terminal so far.
  const std::string& output() const { return output_; }

  // Reads what the program writes until `done(output())` holds or `timeout` passes (or the
  // program closes the terminal); returns whether it held.
  bool ReadUntil(const std::function<bool(const std::string&)>& done, milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    while (!done(output_)) {
      if (eof_ || Clock::now() >= deadline) return false;
      ReadSome(milliseconds(50));
    }
    return true;
  }
  // Types `keys` on the terminal.
  bool Type(std::string_view keys) {
    return ::write(master_, keys.data(), keys.size()) == static_cast<ssize_t>(keys.size());
  }
  // Resizes the window; the kernel sends the program SIGWINCH.
  bool Resize(unsigned short columns, unsigned short rows) {
    winsize size{};
    size.ws_col = columns;
    size.ws_row = rows;
    return ::ioctl(master_, TIOCSWINSZ, &size) == 0;
  }
  // The terminal's modes as the program set them.
  tcflag_t LocalModes() const {
    termios modes{};
    ::tcgetattr(master_, &modes);
    return modes.c_lflag;
  }
  // Waits up to `timeout` for the program to exit, reading its output meanwhile and then to
  // the end. Returns its exit code (128 + signal if killed by one), or -1 on timeout.
  int Wait(milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    while (Clock::now() < deadline) {
      int status = 0;
      const pid_t r = ::waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        pid_ = -1;
        while (!eof_ && Clock::now() < deadline) ReadSome(milliseconds(50));
        return WIFEXITED(status) ? WEXITSTATUS(status) : kSignalExitBase + WTERMSIG(status);
      }
      ReadSome(milliseconds(10));
    }
    return -1;
  }

 private:
  void ReadSome(milliseconds timeout) {
    pollfd p{master_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(timeout.count())) <= 0) return;
    char buf[65536];
    const ssize_t n = ::read(master_, buf, sizeof(buf));
    if (n > 0) {
      output_.append(buf, static_cast<size_t>(n));
    } else if (n == 0 || errno != EINTR) {
      eof_ = true;  // EIO: every process has closed the terminal
    }
  }

  int master_ = -1;
  pid_t pid_ = -1;
  std::string output_;
  bool eof_ = false;
};

// This test's row in the clients table: its pid, command and client name.
std::optional<std::string> OwnRow(const std::vector<std::string>& frame) {
  return LineWith(frame, {std::to_string(::getpid()) + "  top_test", "top-test"});
}

class TopTest : public ::testing::Test {
 protected:
  // Without GPUs, so that the frame has the same summary lines on every host (a GPU pool
  // adds its own).
  void SetUp() override { StartDaemon({"--no-gpus"}); }

  void StartDaemon(std::vector<std::string> flags) {
    daemon_.emplace(std::move(flags));
    ASSERT_TRUE(daemon_->ok()) << daemon_->error();
    ConnectOptions options;
    options.client_name = "top-test";
    auto client = Client::Connect(daemon_->socket_path(), options);
    ASSERT_OK(client);
    client_.emplace(std::move(client).value());
    auto status = client_->GetStatus();
    ASSERT_OK(status);
    version_ = status->daemon_version;
  }

  void PutNamed(const std::string& name, size_t size) {
    CreateOptions options;
    options.name = name;
    ASSERT_OK(client_->Put(ObjectId::FromName(name), SeededBytes(size, size), options));
  }

  std::vector<std::string> TopArgs(std::vector<std::string> args) const {
    args.insert(args.begin(), {DEPOTCTL_PATH, "top", "--socket", daemon_->socket_path()});
    return args;
  }

  // Whether a frame shows the header and, in the clients table, this test's client and
  // then the view itself (the last row, so the frame is all there).
  bool ShowsDaemonAndTest(const std::vector<std::string>& frame) const {
    return LineWith(frame, {"depotd " + version_, daemon_->socket_path()}) && OwnRow(frame) &&
           LineWith(frame, {"depotctl", "depotctl top"});
  }

  std::optional<TestDaemon> daemon_;
  std::optional<Client> client_;
  std::string version_;
};

std::string Explain(const PtyProgram& top) { return "terminal output:\n" + Plain(top.output()); }

TEST_F(TopTest, LiveViewShowsObjectsAndClientsAndQuitsOnQ) {
  PutNamed("top/weights", 3 << 20);
  PutNamed("top/config", 1000);
  ASSERT_OK_AND_ASSIGN(Buffer held, client_->Get(ObjectId::FromName("top/weights")));

  PtyProgram top(TopArgs({"--interval", "0.2"}), 100, 30);
  ASSERT_TRUE(top.started());
  const auto shows_everything = [&](const std::string& out) {
    const auto frame = LastFrame(out);
    return ShowsDaemonAndTest(frame) &&
           LineWith(frame, {ObjectId::FromName("top/weights").Hex().substr(0, 12), "3.00 MiB",
                            " 1 ", "sealed", "top/weights"}) &&
           LineWith(frame, {"1000 B", " 0 ", "sealed", "top/config"});
  };
  ASSERT_TRUE(top.ReadUntil(shows_everything, kPatience)) << Explain(top);
  EXPECT_TRUE(top.output().starts_with(kEnterView)) << Explain(top);
  EXPECT_TRUE(Has(top.output(), kHideCursor)) << Explain(top);
  const auto frame = LastFrame(top.output());
  EXPECT_TRUE(LineWith(frame, {"host", "[", "] ", " of 64.0 MiB"})) << Explain(top);
  EXPECT_TRUE(LineWith(frame, {"largest objects (all 2)"})) << Explain(top);
  EXPECT_EQ(top.LocalModes() & (ICANON | ECHO), 0u) << "keys are read raw while it runs";

  ASSERT_TRUE(top.Type("q"));
  EXPECT_EQ(top.Wait(kPatience), 0) << Explain(top);
  EXPECT_TRUE(top.output().ends_with(kLeaveView)) << Explain(top);
  EXPECT_EQ(top.LocalModes() & (ICANON | ECHO), tcflag_t{ICANON | ECHO})
      << "the terminal's modes are given back";
}

TEST_F(TopTest, LiveViewFitsTheWindowAndRedrawsWhenItIsResized) {
  for (int i = 0; i < 40; ++i) PutNamed("top/many-" + std::to_string(i), 1000 + 10 * i);
  // A long interval: a frame that fits the new size can only come from SIGWINCH.
  PtyProgram top(TopArgs({"--interval", "60"}), 100, 30);
  ASSERT_TRUE(top.started());
  ASSERT_TRUE(top.ReadUntil(
      [&](const std::string& out) { return ShowsDaemonAndTest(LastFrame(out)); }, kPatience))
      << Explain(top);
  auto frame = LastFrame(top.output());
  EXPECT_EQ(frame.size(), 30u) << "the object table fills the screen\n" << Explain(top);
  EXPECT_TRUE(LineWith(frame, {"largest objects (", " of 40)"})) << Explain(top);
  EXPECT_TRUE(LineWith(frame, {"1.36 KiB", "top/many-39"})) << "largest first\n" << Explain(top);

  ASSERT_TRUE(top.Resize(60, 16));
  const auto fits = [](const std::string& out) {
    const auto last = LastFrame(out);
    return last.size() == 16 && std::all_of(last.begin(), last.end(),
                                            [](const std::string& l) { return l.size() <= 60; });
  };
  ASSERT_TRUE(top.ReadUntil(fits, seconds(5))) << Explain(top);
  frame = LastFrame(top.output());
  EXPECT_TRUE(LineWith(frame, {"top/many-39"})) << Explain(top);
  EXPECT_TRUE(LineWith(frame, {"top_test"})) << Explain(top);
  ASSERT_TRUE(top.Type("Q"));
  EXPECT_EQ(top.Wait(kPatience), 0) << Explain(top);
}

TEST_F(TopTest, CtrlCQuitsAndGivesTheTerminalBack) {
  PtyProgram top(TopArgs({"--interval", "0.2"}), 100, 30);
  ASSERT_TRUE(top.started());
  ASSERT_TRUE(top.ReadUntil(
      [&](const std::string& out) { return ShowsDaemonAndTest(LastFrame(out)); }, kPatience))
      << Explain(top);
  ASSERT_TRUE(top.Type("\x03"));  // the terminal turns it into SIGINT
  EXPECT_EQ(top.Wait(kPatience), 0) << Explain(top);
  EXPECT_TRUE(top.output().ends_with(kLeaveView)) << Explain(top);
  EXPECT_EQ(top.LocalModes() & (ICANON | ECHO), tcflag_t{ICANON | ECHO});
}

TEST_F(TopTest, SigtermQuitsAndGivesTheTerminalBack) {
  PtyProgram top(TopArgs({"--interval", "0.2"}), 100, 30);
  ASSERT_TRUE(top.started());
  ASSERT_TRUE(top.ReadUntil(
      [&](const std::string& out) { return ShowsDaemonAndTest(LastFrame(out)); }, kPatience))
      << Explain(top);
  ASSERT_EQ(::kill(top.pid(), SIGTERM), 0);
  EXPECT_EQ(top.Wait(kPatience), 0) << Explain(top);
  EXPECT_TRUE(top.output().ends_with(kLeaveView)) << Explain(top);
  EXPECT_EQ(top.LocalModes() & (ICANON | ECHO), tcflag_t{ICANON | ECHO});
}

TEST_F(TopTest, RatesBecomeNonZeroWhenClientsWorkBetweenFrames) {
  PtyProgram top(TopArgs({"--interval", "0.2"}), 100, 30);
  ASSERT_TRUE(top.started());
  ASSERT_TRUE(top.ReadUntil(
      [&](const std::string& out) { return ShowsDaemonAndTest(LastFrame(out)); }, kPatience))
      << Explain(top);
  const auto first = Frames(top.output()).front();
  EXPECT_TRUE(LineWith(first, {"requests -  gets -  puts -  in -  out -"}))
      << "no rates before a second sample\n"
      << Explain(top);

  // Work between frames: puts (in bytes), then gets of them (out bytes).
  const size_t frames_before = Frames(top.output()).size();
  for (int i = 0; i < 20; ++i) PutNamed("top/rate-" + std::to_string(i), 64 << 10);
  for (int i = 0; i < 20; ++i) {
    ASSERT_OK(client_->Get(ObjectId::FromName("top/rate-" + std::to_string(i))));
  }
  // The work may straddle two frames: each rate must show in some frame after it, as must
  // this test's requests per second in its row of the clients table.
  const auto shows_rates = [&](const std::string& out) {
    const auto frames = Frames(out);
    const auto in_some_frame = [&](const std::function<bool(const std::vector<std::string>&)>& f) {
      return std::any_of(frames.begin() + static_cast<ptrdiff_t>(frames_before), frames.end(), f);
    };
    const auto rate_shown = [&](const std::string& label) {
      return in_some_frame([&](const auto& frame) { return IsNonZeroRate(RateOf(frame, label)); });
    };
    const auto own_rate_shown = in_some_frame([&](const auto& frame) {
      const auto row = OwnRow(frame);
      return row && !Has(*row, " - ") && !Has(*row, " 0.0/s ");
    });
    return frames.size() > frames_before && rate_shown("gets") && rate_shown("puts") &&
           rate_shown("in") && rate_shown("out") && own_rate_shown;
  };
  EXPECT_TRUE(top.ReadUntil(shows_rates, kPatience)) << Explain(top);
  ASSERT_TRUE(top.Type("q"));
  EXPECT_EQ(top.Wait(kPatience), 0) << Explain(top);
}

TEST_F(TopTest, OncePrintsOnePlainFrameWithoutEscapes) {
  PutNamed("top/weights", 3 << 20);
  PutNamed("top/config", 1000);
  ProgramRun run = RunProgram(TopArgs({"--once"}));
  ASSERT_EQ(run.exit_code, 0) << run.Explain();
  EXPECT_FALSE(Has(run.out, "\x1b")) << run.Explain();
  const auto lines = SplitLines(run.out);
  EXPECT_TRUE(ShowsDaemonAndTest(lines)) << run.out;
  EXPECT_EQ(std::count_if(lines.begin(), lines.end(),
                          [](const std::string& l) { return l.starts_with("depotd "); }),
            1)
      << run.out;
  EXPECT_TRUE(LineWith(lines, {"objects", "2 sealed, 0 being created"})) << run.out;
  EXPECT_TRUE(LineWith(lines, {"requests -  gets -  puts -  in -  out -"})) << run.out;
  EXPECT_TRUE(LineWith(lines, {"3.00 MiB", "top/weights"})) << run.out;
  EXPECT_TRUE(LineWith(lines, {"1000 B", "top/config"})) << run.out;
}

// Two simulated GPUs, with pools of 16 MiB and 32 MiB in chunks of 8 MiB.
class TopGpuTest : public TopTest {
 protected:
  void SetUp() override {
    StartDaemon({"--simulate-gpus", "2:64MiB", "--gpu-memory", "0:16MiB,1:32MiB",
                 "--gpu-chunk-size", "8MiB"});
  }
};

TEST_F(TopGpuTest, OnceShowsABarForEachGpuPoolNamedAfterItsGpu) {
  // 6 MiB on GPU 0, held by this test: 37.5% of its pool, all of it held.
  const ObjectId id = ObjectId::FromName("top/on-gpu0");
  ASSERT_OK_AND_ASSIGN(MutableDeviceBuffer buffer, client_->CreateOnDevice(id, 6 << 20, 0));
  ASSERT_OK(client_->Seal(id, /*stream=*/0));
  ProgramRun run = RunProgram(TopArgs({"--once"}), {{"COLUMNS", "100"}, {"LINES", "40"}});
  ASSERT_EQ(run.exit_code, 0) << run.Explain();
  const auto lines = SplitLines(run.out);
  EXPECT_TRUE(ShowsDaemonAndTest(lines)) << run.out;
  const auto host = LineWith(lines, {"host    [", "of 64.0 MiB"});
  const auto gpu0 = LineWith(lines, {"gpu0    [#", "]  6.00 MiB of 16.0 MiB (37.5%)"});
  const auto gpu1 = LineWith(lines, {"gpu1    [ ", "]  0 B of 32.0 MiB (0.0%)"});
  ASSERT_TRUE(host && gpu0 && gpu1) << run.out;
  EXPECT_EQ(gpu0->find('['), host->find('[')) << "the bars line up\n" << run.out;
  EXPECT_FALSE(Has(*gpu0, "=")) << "all of it is held\n" << run.out;
  EXPECT_EQ(gpu0->size(), 100u) << "the bar fills the width\n" << run.out;
  EXPECT_TRUE(LineWith(lines, {"        simulated GPU 0  # held 6.00 MiB  1 replica  reserved "
                               "8.00 MiB of 64.0 MiB"}))
      << run.out;
  EXPECT_TRUE(LineWith(lines, {"        simulated GPU 1  # held 0 B  0 replicas  reserved 0 B of "
                               "64.0 MiB"}))
      << run.out;
  EXPECT_TRUE(LineWith(lines, {"tiering replicas made 0, dropped 0   spills 0 (0 B)"})) << run.out;
  // The pools come in GPU order.
  EXPECT_LT(std::find(lines.begin(), lines.end(), *gpu0),
            std::find(lines.begin(), lines.end(), *gpu1));
}

TEST_F(TopTest, WithoutATerminalPrintsOneFrameSizedByColumnsAndLines) {
  for (int i = 0; i < 30; ++i) PutNamed("top/many-" + std::to_string(i), 1000 + 10 * i);
  ProgramRun run = RunProgram(TopArgs({}), {{"COLUMNS", "70"}, {"LINES", "20"}});
  ASSERT_EQ(run.exit_code, 0) << run.Explain();
  EXPECT_FALSE(Has(run.out, "\x1b")) << run.Explain();
  const auto lines = SplitLines(run.out);
  EXPECT_TRUE(ShowsDaemonAndTest(lines)) << run.out;
  EXPECT_EQ(lines.size(), 20u) << run.out;
  EXPECT_TRUE(std::all_of(lines.begin(), lines.end(), [](const std::string& l) {
    return l.size() <= 70;
  })) << run.out;
  EXPECT_TRUE(LineWith(lines, {"largest objects (6 of 30)"})) << run.out;
}

TEST_F(TopTest, IterationsPrintsThatManyPlainFramesWithRatesFromTheSecond) {
  ProgramRun run = RunProgram(TopArgs({"--iterations", "3", "--interval", "0.1"}));
  ASSERT_EQ(run.exit_code, 0) << run.Explain();
  EXPECT_FALSE(Has(run.out, "\x1b")) << run.Explain();
  std::vector<std::string> rates;
  for (const std::string& line : SplitLines(run.out)) {
    if (line.starts_with("rates ")) rates.push_back(line);
  }
  ASSERT_EQ(rates.size(), 3u) << run.out;
  EXPECT_TRUE(Has(rates[0], "requests -")) << rates[0];
  // The view's own requests (status, metrics, clients, list) come between frames.
  EXPECT_TRUE(IsNonZeroRate(RateOf({rates[1]}, "requests"))) << rates[1];
  EXPECT_FALSE(Has(rates[2], "requests -")) << rates[2];
}

TEST_F(TopTest, WithoutADaemonFailsWithAClearMessage) {
  const std::string nowhere = daemon_->dir() + "/nobody-here.sock";
  ProgramRun run = RunProgram({DEPOTCTL_PATH, "top", "--socket", nowhere, "--once"});
  EXPECT_NE(run.exit_code, 0) << run.Explain();
  EXPECT_TRUE(Has(run.err, "no depot daemon")) << run.err;
  EXPECT_TRUE(Has(run.err, nowhere)) << run.err;
  EXPECT_EQ(run.out, "");
}

TEST_F(TopTest, WithoutADaemonOnATerminalFailsBeforeTakingTheScreen) {
  const std::string nowhere = daemon_->dir() + "/nobody-here.sock";
  PtyProgram top({DEPOTCTL_PATH, "top", "--socket", nowhere}, 100, 30);
  ASSERT_TRUE(top.started());
  EXPECT_EQ(top.Wait(kPatience), 1) << Explain(top);
  EXPECT_TRUE(Has(top.output(), "depotctl: no depot daemon is listening at " + nowhere))
      << Explain(top);
  EXPECT_FALSE(Has(top.output(), kEnterView)) << Explain(top);
}

TEST_F(TopTest, DaemonGoingAwayEndsTheViewWithTheTerminalGivenBack) {
  PtyProgram top(TopArgs({"--interval", "0.2"}), 100, 30);
  ASSERT_TRUE(top.started());
  ASSERT_TRUE(top.ReadUntil(
      [&](const std::string& out) { return ShowsDaemonAndTest(LastFrame(out)); }, kPatience))
      << Explain(top);
  client_.reset();
  daemon_->Stop();
  EXPECT_EQ(top.Wait(kPatience), 1) << Explain(top);
  // The error comes after the view has left the screen, so that it stays visible.
  const size_t left = top.output().rfind(kLeaveView);
  ASSERT_NE(left, std::string::npos) << Explain(top);
  const std::string after = Plain(top.output().substr(left));
  EXPECT_TRUE(after.starts_with("depotctl: lost the daemon at " + daemon_->socket_path() + ": "))
      << Explain(top);
  EXPECT_EQ(SplitLines(after).size(), 1u) << Explain(top);
  EXPECT_EQ(top.LocalModes() & (ICANON | ECHO), tcflag_t{ICANON | ECHO});
}

TEST_F(TopTest, IntervalOutOfRangeIsRefused) {
  ProgramRun run = RunProgram(TopArgs({"--interval", "0", "--once"}));
  EXPECT_NE(run.exit_code, 0) << run.Explain();
  EXPECT_TRUE(Has(run.err, "depotctl: --interval must be from 0.1 to 86400 seconds, not 0"))
      << run.err;
}

}  // namespace
}  // namespace depot::testing
