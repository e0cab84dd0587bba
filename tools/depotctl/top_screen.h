// What one frame of `depotctl top` shows, drawn from two successive looks at the daemon.
// Pure functions of their arguments: the same text goes to a live terminal and, plain, to a
// pipe (`top --once`).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "depot/client.h"
#include "terminal.h"

namespace depot::ctl {

// Counters the rates are computed from, read from the daemon's metrics.
struct ActivityCounters {
  uint64_t get_objects = 0;  // objects asked for by gets
  uint64_t put_objects = 0;  // objects created (create and put requests)
  uint64_t bytes_in = 0;     // bytes of objects created
  uint64_t bytes_out = 0;    // bytes of objects handed out by gets
  // Whether the daemon counts requests by type: with --no-metrics it does not, and
  // put_objects stays 0 whatever happens.
  bool requests_counted = true;
};

// One look at the daemon.
struct Sample {
  uint64_t taken_ns = 0;  // monotonic clock, when the counters were read
  uint64_t wall_ns = 0;   // wall clock, for the ages of objects
  StoreStatus status;
  ActivityCounters counters;
  std::vector<ClientInfo> clients;  // by session id
  std::vector<WorkerInfo> workers;  // by session id
  std::vector<ObjectInfo> largest;  // the largest objects, largest first; not all of them
  size_t objects = 0;               // how many there are in all
};

// The most objects a Sample keeps: more rows than any screen has.
inline constexpr size_t kMaxObjectRows = 500;

// One tier's memory as a bar `width` columns wide, e.g.
//   host  [#####=====                ]  1.5 GiB of 4.0 GiB (37.5%)
// '#' are bytes held by clients, '=' the rest of the used bytes, blank the free bytes. A
// share too small for a whole cell that is not zero still gets one. Each tier (the host
// arena, each GPU pool) is one such line.
std::string TierBar(std::string_view label, uint64_t capacity, uint64_t used, uint64_t held,
                    size_t width);

// The frame for `now`, with rates per second since `before` (nullptr: the first frame,
// whose rates are shown as "-"). At most size.rows lines, none wider than size.columns:
// the tables get the rows left after the summary, cut to fit. `hint` (e.g. "q quits") ends
// the first line.
std::vector<std::string> RenderFrame(const Sample& now, const Sample* before, ScreenSize size,
                                     std::string_view hint);

}  // namespace depot::ctl
