#include "top_screen.h"

#include <algorithm>
#include <cstdio>
#include <optional>
#include <sstream>
#include <utility>

#include "depot/ipc/units.h"
#include "format.h"

namespace depot::ctl {

namespace {

using ipc::FormatSize;

// The summary lines start with a label in a column of this width: "host", "objects".
constexpr size_t kLabelWidth = 8;
// What each table takes besides its rows: a blank line, a caption and the column titles.
constexpr size_t kTableChrome = 3;
// Object ids are shown by their first hex digits, as git shows commits.
constexpr size_t kShortId = 12;

std::string Label(std::string_view label) {
  std::string out(label);
  out.resize(std::max(out.size() + 1, kLabelWidth), ' ');
  return out;
}

std::string Percent(uint64_t part, uint64_t whole, const char* format) {
  char text[32];
  std::snprintf(text, sizeof(text), format,
                whole == 0 ? 0.0 : 100.0 * static_cast<double>(part) / static_cast<double>(whole));
  return text;
}

// Cells of a bar `cells` wide that `part` of `whole` fills, rounded, but at least one for
// any part that is not zero.
size_t Cells(uint64_t part, uint64_t whole, size_t cells) {
  if (part == 0 || whole == 0) return 0;
  const double share = static_cast<double>(part) / static_cast<double>(whole);
  return std::clamp<size_t>(static_cast<size_t>(share * static_cast<double>(cells) + 0.5), 1,
                            cells);
}

uint64_t AgeNanos(uint64_t since_ns, uint64_t now_ns) {
  return now_ns > since_ns ? now_ns - since_ns : 0;
}

std::string HeaderLine(const StoreStatus& s, std::string_view hint) {
  std::string line = "depotd " + s.daemon_version + "  pid " + std::to_string(s.pid) + "  up " +
                     FormatAge(s.uptime_ns) + "  " + s.socket_path;
  if (!hint.empty()) line += "  (" + std::string(hint) + ")";
  return line;
}

// The share of the free bytes that no single object could use: 0% when the largest free
// block is as large as the free bytes, or as a whole segment, since no object is larger
// than a segment (all segments are the same size). Free bytes split between segments
// count as fragmented too: one object cannot span two.
std::string Fragmentation(const StoreStatus& s) {
  const uint64_t free = s.capacity_bytes > s.used_bytes ? s.capacity_bytes - s.used_bytes : 0;
  const uint64_t segment = s.segments == 0 ? free : s.mapped_bytes / s.segments;
  const uint64_t usable = std::min(free, segment);
  const uint64_t largest = std::min(s.largest_free_block, usable);
  return Percent(usable - largest, usable, "%.0f%%");
}

// Under the host tier's bar: what its two shades are, and how usable the free part is.
std::vector<std::string> HostDetail(const StoreStatus& s) {
  const uint64_t unreferenced = s.used_bytes > s.held_bytes ? s.used_bytes - s.held_bytes : 0;
  const uint64_t free = s.capacity_bytes > s.used_bytes ? s.capacity_bytes - s.used_bytes : 0;
  return {Label("") + "# held " + FormatSize(s.held_bytes) + "  = unreferenced " +
              FormatSize(unreferenced) + "  pinned " + FormatSize(s.pinned_bytes),
          Label("") + "free " + FormatSize(free) + ", largest block " +
              FormatSize(s.largest_free_block) + ", fragmentation " + Fragmentation(s)};
}

// Under a GPU pool's bar: which GPU it is, what is held, and what the pool has taken of the
// GPU (last, so that a narrow screen cuts it first).
std::string GpuDetail(const GpuInfo& g) {
  return Label("") + GpuName(g) + "  # held " + FormatSize(g.held_bytes) + "  " +
         std::to_string(g.replicas) + " replica" + (g.replicas == 1 ? "" : "s") + "  reserved " +
         FormatSize(g.reserved_bytes) + " of " + FormatSize(g.total_bytes);
}

// The copies between tiers, once there are GPUs to copy to.
std::string TieringLine(const StoreStatus& s) {
  return Label("tiering") + "replicas made " + std::to_string(s.replicas_made) + ", dropped " +
         std::to_string(s.replicas_dropped) + "   spills " + std::to_string(s.spills) + " (" +
         FormatSize(s.spilled_bytes) + ")";
}

// The disk tier, when there is one: what it holds and its I/O so far.
std::string DiskLine(const StoreStatus& s) {
  const DiskStatus& d = s.disk;
  const auto rate = [](uint64_t bytes, double seconds) {
    return seconds <= 0
               ? std::string("-")
               : FormatSize(static_cast<uint64_t>(static_cast<double>(bytes) / seconds)) + "/s";
  };
  return Label("disk") + FormatSize(d.used_bytes) + " of " + FormatSize(d.limit_bytes) + ", " +
         std::to_string(d.objects) + " objects   spills " + std::to_string(d.spills) + " (" +
         rate(d.spilled_bytes, d.spill_seconds) + ")   restores " + std::to_string(d.restores) +
         " (" + rate(d.restored_bytes, d.restore_seconds) + ")   dropped " +
         std::to_string(d.drops) + "   failed " +
         std::to_string(d.spill_failures + d.restore_failures);
}

std::string CountsLine(const StoreStatus& s) {
  return Label("objects") + std::to_string(s.objects_sealed) + " sealed, " +
         std::to_string(s.objects_creating) + " being created   clients " +
         std::to_string(s.clients) + "   evicted " + std::to_string(s.evictions) + " (" +
         FormatSize(s.evicted_bytes) + ")";
}

// A counter's change per second from `before` to `now`. None for the first frame, and
// none if the counter went back, which only a different daemon could make it do.
std::optional<double> Rate(const Sample& now, const Sample* before,
                           uint64_t (*counter)(const Sample&)) {
  if (before == nullptr || now.taken_ns <= before->taken_ns) return std::nullopt;
  const uint64_t from = counter(*before);
  const uint64_t to = counter(now);
  if (to < from) return std::nullopt;
  return static_cast<double>(to - from) * 1e9 /
         static_cast<double>(now.taken_ns - before->taken_ns);
}

std::string CountRate(std::optional<double> rate) {
  if (!rate) return "-";
  char text[32];
  std::snprintf(text, sizeof(text), *rate < 10 ? "%.1f/s" : "%.0f/s", *rate);
  return text;
}

std::string ByteRate(std::optional<double> rate) {
  return rate ? FormatSize(static_cast<uint64_t>(*rate + 0.5)) + "/s" : "-";
}

std::string RatesLine(const Sample& now, const Sample* before) {
  const auto rate = [&](uint64_t (*counter)(const Sample&)) { return Rate(now, before, counter); };
  const auto requests = rate([](const Sample& s) { return s.status.requests; });
  const auto gets = rate([](const Sample& s) { return s.counters.get_objects; });
  const auto puts = rate([](const Sample& s) { return s.counters.put_objects; });
  const auto in = rate([](const Sample& s) { return s.counters.bytes_in; });
  const auto out = rate([](const Sample& s) { return s.counters.bytes_out; });
  return Label("rates") + "requests " + CountRate(requests) + "  gets " + CountRate(gets) +
         "  puts " + (now.counters.requests_counted ? CountRate(puts) : "- (--no-metrics)") +
         "  in " + ByteRate(in) + "  out " + ByteRate(out);
}

std::string ShortId(const ObjectId& id) { return id.Hex().substr(0, kShortId); }

std::string StateText(const ObjectInfo& o) {
  std::string state = o.state == ObjectState::kSealed ? "sealed" : "creating";
  if (o.pinned) state += ",pinned";
  if (o.delete_pending) state += ",deleted";
  return state;
}

std::vector<std::string> TableLines(const Table& table) {
  std::ostringstream text;
  table.Print(text);
  std::vector<std::string> lines;
  std::istringstream in(text.str());
  for (std::string line; std::getline(in, line);) lines.push_back(std::move(line));
  return lines;
}

std::string Caption(const char* what, size_t shown, size_t all) {
  if (all == 0) return std::string(what) + " (none)";
  return std::string(what) + " (" + (shown == all ? "all " : std::to_string(shown) + " of ") +
         std::to_string(all) + ")";
}

// The name (the only column of unbounded width) comes last, so that a narrow screen cuts
// names and not sizes.
void AddObjects(std::vector<std::string>& lines, const Sample& now, size_t rows) {
  using Align = Table::Align;
  Table table({{"ID"},
               {"SIZE", Align::kRight},
               {"REFS", Align::kRight},
               {"STATE"},
               {"AGE", Align::kRight},
               {"NAME"}});
  for (size_t i = 0; i < rows; ++i) {
    const ObjectInfo& o = now.largest[i];
    table.AddRow({ShortId(o.id), FormatSize(o.data_size), std::to_string(o.ref_count), StateText(o),
                  FormatAge(AgeNanos(o.create_time_ns, now.wall_ns)),
                  o.name.empty() ? "-" : Printable(o.name)});
  }
  lines.emplace_back();
  lines.push_back(Caption("largest objects", rows, now.objects));
  for (std::string& line : TableLines(table)) lines.push_back(std::move(line));
}

std::optional<double> ClientRate(const ClientInfo& c, const Sample& now, const Sample* before) {
  if (before == nullptr || now.taken_ns <= before->taken_ns) return std::nullopt;
  const auto was = std::find_if(before->clients.begin(), before->clients.end(),
                                [&](const ClientInfo& b) { return b.session_id == c.session_id; });
  if (was == before->clients.end() || c.requests < was->requests) return std::nullopt;
  return static_cast<double>(c.requests - was->requests) * 1e9 /
         static_cast<double>(now.taken_ns - before->taken_ns);
}

void AddClients(std::vector<std::string>& lines, const Sample& now, const Sample* before,
                size_t rows) {
  using Align = Table::Align;
  Table table({{"PID", Align::kRight},
               {"COMMAND"},
               {"OBJECTS", Align::kRight},
               {"HELD", Align::kRight},
               {"REQUESTS", Align::kRight},
               {"REQ/S", Align::kRight},
               {"NAME"}});
  for (size_t i = 0; i < rows; ++i) {
    const ClientInfo& c = now.clients[i];
    table.AddRow({std::to_string(c.pid), Printable(c.command), std::to_string(c.objects_held),
                  FormatSize(c.bytes_held), std::to_string(c.requests),
                  CountRate(ClientRate(c, now, before)),
                  c.client_name.empty() ? "-" : Printable(c.client_name)});
  }
  lines.emplace_back();
  lines.push_back(Caption("clients", rows, now.clients.size()));
  for (std::string& line : TableLines(table)) lines.push_back(std::move(line));
}

// The scheduler in one line: workers, tasks pending, and tasks done and failed per second.
std::string TasksLine(const Sample& now, const Sample* before) {
  const SchedulerStatus& t = now.status.scheduler;
  const auto done = Rate(now, before, [](const Sample& s) { return s.status.scheduler.completed; });
  const auto failed = Rate(now, before, [](const Sample& s) { return s.status.scheduler.failed; });
  return Label("tasks") + std::to_string(t.workers) + " workers  " +
         std::to_string(t.tasks_pending) + " pending  done " + CountRate(done) + "  failed " +
         CountRate(failed) + "  inputs moved " + FormatSize(t.moved_bytes) + " of " +
         FormatSize(t.moved_bytes + t.local_bytes);
}

std::optional<double> WorkerRate(const WorkerInfo& w, const Sample& now, const Sample* before) {
  if (before == nullptr || now.taken_ns <= before->taken_ns) return std::nullopt;
  const auto was = std::find_if(before->workers.begin(), before->workers.end(),
                                [&](const WorkerInfo& b) { return b.session_id == w.session_id; });
  if (was == before->workers.end() || w.done < was->done) return std::nullopt;
  return static_cast<double>(w.done - was->done) * 1e9 /
         static_cast<double>(now.taken_ns - before->taken_ns);
}

void AddWorkers(std::vector<std::string>& lines, const Sample& now, const Sample* before,
                size_t rows) {
  using Align = Table::Align;
  Table table({{"SESSION", Align::kRight},
               {"CPUS", Align::kRight},
               {"GPUS"},
               {"RUNNING", Align::kRight},
               {"QUEUED", Align::kRight},
               {"DONE", Align::kRight},
               {"FAILED", Align::kRight},
               {"DONE/S", Align::kRight},
               {"NAME"}});
  for (size_t i = 0; i < rows; ++i) {
    const WorkerInfo& w = now.workers[i];
    std::string gpus;
    for (size_t k = 0; k < w.gpus.size(); ++k) {
      char share[32];
      std::snprintf(share, sizeof(share), ":%g", 1 - FreeShare(w, k));
      gpus += (gpus.empty() ? "" : " ") + TierName(w.gpus[k]) + share;
    }
    char cpus[48];
    std::snprintf(cpus, sizeof(cpus), "%g/%g", w.cpus - w.free_cpus, w.cpus);
    table.AddRow({std::to_string(w.session_id), cpus, gpus.empty() ? "-" : gpus,
                  std::to_string(w.running), std::to_string(w.queued), std::to_string(w.done),
                  std::to_string(w.failed), CountRate(WorkerRate(w, now, before)),
                  Printable(w.name) + (w.draining ? " (draining)" : "")});
  }
  lines.emplace_back();
  lines.push_back(Caption("workers", rows, now.workers.size()));
  for (std::string& line : TableLines(table)) lines.push_back(std::move(line));
}

// Shares `room` rows between the tables: clients (usually a handful) get what they need up
// to half, objects what they need of the rest, and clients then any rows objects left.
std::pair<size_t, size_t> SplitRows(size_t room, size_t objects, size_t clients) {
  size_t client_rows = std::min(clients, room / 2);
  const size_t object_rows = std::min(objects, room - client_rows);
  client_rows = std::min(clients, room - object_rows);
  return {object_rows, client_rows};
}

}  // namespace

std::string TierBar(std::string_view label, uint64_t capacity, uint64_t used, uint64_t held,
                    size_t width) {
  used = std::min(used, capacity);
  held = std::min(held, used);
  const std::string name = Label(label);
  const std::string figures = FormatSize(used) + " of " + FormatSize(capacity) + " (" +
                              Percent(used, capacity, "%.1f%%") + ")";
  // The bar takes the width the label and the figures leave, but at least 10 cells.
  constexpr size_t kMinCells = 10;
  const size_t fixed = name.size() + figures.size() + 4;  // "[", "]" and two blanks
  const size_t cells = width > fixed + kMinCells ? width - fixed : kMinCells;
  const size_t used_cells = Cells(used, capacity, cells);
  const size_t held_cells = Cells(held, capacity, cells);
  return name + "[" + std::string(held_cells, '#') + std::string(used_cells - held_cells, '=') +
         std::string(cells - used_cells, ' ') + "]  " + figures;
}

std::vector<std::string> RenderFrame(const Sample& now, const Sample* before, ScreenSize size,
                                     std::string_view hint) {
  const StoreStatus& s = now.status;
  std::vector<std::string> lines;
  lines.push_back(HeaderLine(s, hint));
  // One bar per tier: the host arena's, then each GPU pool's, out of what the pool may take.
  lines.push_back(TierBar("host", s.capacity_bytes, s.used_bytes, s.held_bytes, size.columns));
  for (std::string& line : HostDetail(s)) lines.push_back(std::move(line));
  for (size_t d = 0; d < s.gpus.size(); ++d) {
    const GpuInfo& g = s.gpus[d];
    lines.push_back(TierBar(TierName(static_cast<int>(d)), g.limit_bytes, g.used_bytes,
                            g.held_bytes, size.columns));
    lines.push_back(GpuDetail(g));
  }
  if (!s.gpus.empty()) lines.push_back(TieringLine(s));
  if (s.disk.enabled) lines.push_back(DiskLine(s));
  lines.push_back(CountsLine(s));
  lines.push_back(RatesLine(now, before));
  // The scheduler's line and workers' table, once workers have attached.
  const bool tasks = !now.workers.empty() || s.scheduler.submitted != 0;
  if (tasks) lines.push_back(TasksLine(now, before));

  const size_t tables = now.workers.empty() ? 2 : 3;
  const size_t chrome = lines.size() + tables * kTableChrome;
  size_t room = size.rows > chrome ? size.rows - chrome : 0;
  // Workers (a handful, usually) get what they need up to a third.
  const size_t worker_rows = std::min(now.workers.size(), room / 3);
  room -= worker_rows;
  const auto [object_rows, client_rows] = SplitRows(room, now.largest.size(), now.clients.size());
  AddObjects(lines, now, object_rows);
  if (!now.workers.empty()) AddWorkers(lines, now, before, worker_rows);
  AddClients(lines, now, before, client_rows);

  if (lines.size() > size.rows) lines.resize(size.rows);
  for (std::string& line : lines) line = FitWidth(line, size.columns);
  return lines;
}

}  // namespace depot::ctl
