// How depotctl shows things to people (aligned tables, sizes, ages) and to programs (JSON).
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "depot/client.h"
#include "depot/status.h"

namespace depot::ctl {

// Prints "depotctl: <what went wrong>" on one line on stderr.
void ReportError(const Status& status);

// A duration for people, in its largest whole unit: "42s", "5m", "3h", "12d".
std::string FormatAge(uint64_t nanos);

// A wall-clock time (ns since the epoch) in UTC: "2025-06-01 12:34:56.789 UTC".
std::string FormatTime(uint64_t epoch_nanos);

// Parses a duration as people write it: a number with a unit, ms, s, m, h or d ("30s",
// "5m", "2h"); a bare number is seconds. Fails with InvalidArgument naming the bad text.
Result<uint64_t> ParseDuration(std::string_view text);

// `bytes` as `hexdump -C` prints them: 16 bytes a line, offset, hex, and printable ASCII,
// then the offset just past the end.
void HexDump(std::ostream& out, const unsigned char* bytes, size_t size);

// `text` with control characters replaced by '?', so that a name cannot break a table.
std::string Printable(std::string_view text);

// `text` cut to at most `columns` terminal columns, counted as Table counts them.
std::string FitWidth(std::string_view text, size_t columns);

// A tier as depotctl names it (ls --tier, the TIER column): "host" for host memory (device
// -1), "gpu<k>" for the daemon's GPU k.
std::string TierName(int device);

// The tiers `o` has ready bytes on, host first, joined by '+': "host", "gpu0", "host+gpu1";
// "-" when it has none yet (being created on a GPU).
std::string TiersText(const ObjectInfo& o);

// The share of the worker's k-th GPU that is free; 0 where the reply lists fewer shares than
// GPUs (it comes from the daemon, and is read as untrusted).
inline double FreeShare(const WorkerInfo& w, size_t k) {
  return k < w.free_gpu_shares.size() ? w.free_gpu_shares[k] : 0;
}

// A GPU's name, marked "(simulated)" for a simulated device whose name does not say so.
std::string GpuName(const GpuInfo& gpu);

// Lines of "key  value", the values aligned.
void PrintFields(std::ostream& out, const std::vector<std::pair<std::string, std::string>>& fields);

// A table printed with its columns aligned: text columns to the left, numbers to the right.
class Table {
 public:
  enum class Align { kLeft, kRight };
  struct Column {
    std::string title;
    Align align = Align::kLeft;
  };

  explicit Table(std::vector<Column> columns) : columns_(std::move(columns)) {}
  // One row: as many cells as columns.
  void AddRow(std::vector<std::string> cells) { rows_.push_back(std::move(cells)); }
  // The title row, then every row, two spaces between columns, no trailing blanks.
  void Print(std::ostream& out) const;

 private:
  std::vector<Column> columns_;
  std::vector<std::vector<std::string>> rows_;
};

// `text` as a JSON string literal, quotes included.
std::string JsonString(std::string_view text);

// `value` as a JSON number: up to 9 significant digits; null if it is not finite.
std::string JsonReal(double value);

// An object named on the command line: 32 hex digits are an id, anything else is a name.
struct Target {
  ObjectId id;
  std::string label;  // how messages name it
};
Target ParseTarget(const std::string& text);

// A JSON object built one member at a time, in order. Member names are written as given; a
// name set again keeps its place and takes the new value.
class JsonObject {
 public:
  JsonObject& String(std::string_view key, std::string_view value);
  JsonObject& Number(std::string_view key, uint64_t value);
  JsonObject& Real(std::string_view key, double value);
  JsonObject& Bool(std::string_view key, bool value);
  JsonObject& Null(std::string_view key);
  // A member whose value is already JSON (an array, a nested object).
  JsonObject& Json(std::string_view key, std::string_view json) { return Member(key, json); }
  // Without the member `key`, if it has one.
  JsonObject& Remove(std::string_view key);
  // The member `key` moved to just before the member `before`; unchanged unless both are there.
  JsonObject& MoveBefore(std::string_view key, std::string_view before);
  // `{...}` on one line.
  std::string str() const;

 private:
  JsonObject& Member(std::string_view key, std::string_view json);
  std::vector<std::pair<std::string, std::string>> members_;  // name, value as JSON
};

}  // namespace depot::ctl
