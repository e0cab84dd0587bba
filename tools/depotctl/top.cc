// depotctl top: looks at the daemon every interval and shows each look as a frame, live on
// a terminal or as plain text on a pipe. top_screen.cc draws the frames; terminal.cc owns
// the terminal.
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <optional>
#include <string_view>
#include <thread>

#include "commands.h"
#include "depot/client.h"
#include "depot/ipc/units.h"
#include "terminal.h"
#include "top_screen.h"

namespace depot::ctl {

namespace {

using Clock = std::chrono::steady_clock;

// Below this the view's own requests would be a noticeable load on the daemon; above it the
// interval would overflow the clock's arithmetic long before anyone wanted it.
constexpr double kMinInterval = 0.1;
constexpr double kMaxInterval = 24 * 60 * 60;

Status CheckOptions(const TopOptions& options) {
  // Written so that NaN fails too.
  if (options.interval >= kMinInterval && options.interval <= kMaxInterval) return Status::OK();
  char text[64];
  std::snprintf(text, sizeof(text), "%g", options.interval);
  return Status::InvalidArgument("--interval must be from 0.1 to 86400 seconds, not " +
                                 std::string(text));
}

Clock::duration Interval(const TopOptions& options) {
  return std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(options.interval));
}

// The value of one series (`name{labels}`, exactly as the daemon writes it) in Prometheus
// text, or 0 if the daemon does not report it.
uint64_t SeriesValue(std::string_view text, std::string_view series) {
  while (!text.empty()) {
    const size_t end = std::min(text.find('\n'), text.size());
    const std::string_view line = text.substr(0, end);
    text.remove_prefix(std::min(end + 1, text.size()));
    if (line.size() <= series.size() || !line.starts_with(series) || line[series.size()] != ' ') {
      continue;
    }
    double value = 0;
    std::from_chars(line.data() + series.size() + 1, line.data() + line.size(), value);
    return value > 0 ? static_cast<uint64_t>(value) : 0;
  }
  return 0;
}

ActivityCounters ParseCounters(std::string_view metrics) {
  const auto value = [&](std::string_view series) { return SeriesValue(metrics, series); };
  ActivityCounters c;
  // Every object asked for is found at once (hit) or waited for (wait); a wait that runs
  // out is counted again as a timeout, so timeouts are left out.
  c.get_objects = value(R"(depot_get_objects_total{result="hit"})") +
                  value(R"(depot_get_objects_total{result="wait"})");
  // A small Put is one `put` request; a larger one, or a Create, is a `create`.
  c.put_objects = value(R"(depot_requests_total{type="create"})") +
                  value(R"(depot_requests_total{type="put"})");
  c.bytes_in = value(R"(depot_bytes_in_total{tier="host"})");
  c.bytes_out = value(R"(depot_bytes_out_total{tier="host"})");
  c.requests_counted = value("depot_metrics_enabled") != 0;
  return c;
}

// Four requests, all of which exist for the other commands: status, metrics, clients, list.
Result<Sample> TakeSample(Client& client) {
  Sample sample;
  DEPOT_ASSIGN_OR_RETURN(sample.status, client.GetStatus());
  DEPOT_ASSIGN_OR_RETURN(std::string metrics, client.Metrics());
  sample.taken_ns = ipc::MonotonicNanos();
  sample.counters = ParseCounters(metrics);
  DEPOT_ASSIGN_OR_RETURN(sample.clients, client.Clients());
  DEPOT_ASSIGN_OR_RETURN(sample.workers, client.Workers());
  // The daemon picks the largest: a frame costs the same with a million objects as with ten.
  DEPOT_ASSIGN_OR_RETURN(sample.largest, client.ListLargest(static_cast<uint32_t>(kMaxObjectRows)));
  sample.wall_ns = ipc::WallNanos();
  sample.objects = sample.status.objects_sealed + sample.status.objects_creating;
  return sample;
}

// A sample; if the connection broke, an error that says plainly that the daemon went away.
Result<Sample> Look(Client& client) {
  auto sample = TakeSample(client);
  if (!sample.status().Is(StatusCode::kDisconnected)) return sample;
  return Status(StatusCode::kDisconnected,
                "lost the daemon at " + client.socket_path() + ": " + sample.status().message());
}

const Sample* Earlier(const std::optional<Sample>& sample) { return sample ? &*sample : nullptr; }

// Frames as plain text, one after another, a blank line between them.
Status RunPlain(Client& client, const TopOptions& options) {
  const size_t frames = options.once || options.iterations == 0 ? 1 : options.iterations;
  std::optional<Sample> before;
  Clock::time_point next;
  for (size_t frame = 0; frame < frames; ++frame) {
    if (frame > 0) {
      std::this_thread::sleep_until(next);
      std::cout << '\n';
    }
    next = Clock::now() + Interval(options);
    DEPOT_ASSIGN_OR_RETURN(Sample now, Look(client));
    for (const std::string& line :
         RenderFrame(now, Earlier(before), QueryScreenSize(STDOUT_FILENO), "")) {
      std::cout << line << '\n';
    }
    std::cout.flush();
    before = std::move(now);
  }
  if (!std::cout) return Status::IoError("cannot write to standard output");
  return Status::OK();
}

// Shows the frame of `now` until `deadline`, drawn again whenever the window changes size.
// Returns whether the user asked to quit.
Result<bool> ShowUntil(FullScreen& screen, const Sample& now, const Sample* before,
                       Clock::time_point deadline, std::string_view hint) {
  for (;;) {
    const ScreenSize size = QueryScreenSize(STDOUT_FILENO);
    DEPOT_RETURN_NOT_OK(screen.Draw(RenderFrame(now, before, size, hint), size.rows));
    DEPOT_ASSIGN_OR_RETURN(FullScreen::Event event, screen.WaitUntil(deadline));
    if (event == FullScreen::Event::kQuit) return true;
    if (event == FullScreen::Event::kTimeout) return false;
  }
}

// The live view. Whatever ends it, `screen` gives the terminal back on the way out, before
// main reports an error.
Status RunLive(Client& client, const TopOptions& options) {
  FullScreen screen;
  DEPOT_RETURN_NOT_OK(screen.Enter());
  char hint[64];
  std::snprintf(hint, sizeof(hint), "every %gs, q quits", options.interval);
  std::optional<Sample> before;
  for (size_t frame = 0; options.iterations == 0 || frame < options.iterations; ++frame) {
    // The next look is due an interval after this one started, however long it takes.
    const Clock::time_point deadline = Clock::now() + Interval(options);
    DEPOT_ASSIGN_OR_RETURN(Sample now, Look(client));
    DEPOT_ASSIGN_OR_RETURN(bool quit, ShowUntil(screen, now, Earlier(before), deadline, hint));
    if (quit) break;
    before = std::move(now);
  }
  return Status::OK();
}

}  // namespace

Status ShowTop(const std::string& socket, const TopOptions& options) {
  DEPOT_RETURN_NOT_OK(CheckOptions(options));
  ConnectOptions connect;
  connect.client_name = "depotctl top";
  DEPOT_ASSIGN_OR_RETURN(Client client, Client::Connect(socket, connect));
  // Live only with a terminal to draw on and to read q from; otherwise plain frames, for
  // scripts and logs.
  const bool live = !options.once && ::isatty(STDIN_FILENO) == 1 && ::isatty(STDOUT_FILENO) == 1;
  return live ? RunLive(client, options) : RunPlain(client, options);
}

}  // namespace depot::ctl
