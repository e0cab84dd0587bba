#include "format.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <iostream>
#include <ostream>
#include <sstream>

#include "depot/ipc/units.h"

namespace depot::ctl {

namespace {

// Columns a cell takes on a terminal: UTF-8 continuation bytes take none.
size_t DisplayWidth(std::string_view text) {
  return static_cast<size_t>(std::count_if(text.begin(), text.end(), [](char c) {
    return (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  }));
}

}  // namespace

void ReportError(const Status& status) {
  std::cerr << "depotctl: " << (status.message().empty() ? status.ToString() : status.message())
            << '\n';
}

std::string FormatAge(uint64_t nanos) {
  const uint64_t seconds = nanos / 1'000'000'000ull;
  if (seconds < 60) return std::to_string(seconds) + "s";
  if (seconds < 60 * 60) return std::to_string(seconds / 60) + "m";
  if (seconds < 48 * 60 * 60) return std::to_string(seconds / (60 * 60)) + "h";
  return std::to_string(seconds / (24 * 60 * 60)) + "d";
}

std::string FormatTime(uint64_t epoch_nanos) {
  const time_t seconds = static_cast<time_t>(epoch_nanos / 1'000'000'000ull);
  tm utc{};
  ::gmtime_r(&seconds, &utc);
  char text[64];
  const size_t n = std::strftime(text, sizeof(text), "%Y-%m-%d %H:%M:%S", &utc);
  char millis[32];
  std::snprintf(millis, sizeof(millis), ".%03u UTC",
                static_cast<unsigned>(epoch_nanos / 1'000'000ull % 1000));
  return std::string(text, n) + millis;
}

Result<uint64_t> ParseDuration(std::string_view text) {
  const auto bad = [&] {
    return Status::InvalidArgument("'" + Printable(text) +
                                   "' is not a duration: give a number and a unit, ms, s, m, h or "
                                   "d (e.g. 30s, 5m, 2h)");
  };
  size_t digits = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') ++digits;
  if (digits == 0 || digits > 12) return bad();
  uint64_t value = 0;
  for (size_t i = 0; i < digits; ++i) value = value * 10 + static_cast<uint64_t>(text[i] - '0');
  const std::string_view unit = text.substr(digits);
  constexpr uint64_t kSecond = 1'000'000'000ull;
  uint64_t scale = 0;
  if (unit.empty() || unit == "s") {
    scale = kSecond;
  } else if (unit == "ms") {
    scale = 1'000'000ull;
  } else if (unit == "m") {
    scale = 60 * kSecond;
  } else if (unit == "h") {
    scale = 60 * 60 * kSecond;
  } else if (unit == "d") {
    scale = 24 * 60 * 60 * kSecond;
  } else {
    return bad();
  }
  if (value > UINT64_MAX / scale) return bad();
  return value * scale;
}

void HexDump(std::ostream& out, const unsigned char* bytes, size_t size) {
  char text[24];
  for (size_t line = 0; line < size; line += 16) {
    std::snprintf(text, sizeof(text), "%08zx ", line);
    std::string row = text;
    std::string ascii;
    for (size_t i = 0; i < 16; ++i) {
      if (i == 8) row += ' ';
      if (line + i < size) {
        const unsigned char c = bytes[line + i];
        std::snprintf(text, sizeof(text), " %02x", c);
        row += text;
        ascii += (c >= 0x20 && c < 0x7f) ? static_cast<char>(c) : '.';
      } else {
        row += "   ";
      }
    }
    out << row << "  |" << ascii << "|\n";
  }
  std::snprintf(text, sizeof(text), "%08zx", size);
  out << text << '\n';
}

std::string Printable(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t at = 0; at < text.size();) {
    const ipc::Utf8Char c = ipc::NextUtf8(text, at);
    if (c.length == 0 || ipc::IsControl(c.code)) {
      out += '?';
      at += c.length == 0 ? 1 : c.length;
    } else {
      out.append(text.substr(at, c.length));
      at += c.length;
    }
  }
  return out;
}

std::string FitWidth(std::string_view text, size_t columns) {
  size_t used = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    // A character starts at every byte that is not a UTF-8 continuation byte.
    if ((static_cast<unsigned char>(text[i]) & 0xC0) != 0x80 && used++ == columns) {
      return std::string(text.substr(0, i));
    }
  }
  return std::string(text);
}

std::string TierName(int device) {
  // -2: the daemon's spill directory (protocol.capnp Replica.device).
  if (device == -2) return "disk";
  return device < 0 ? "host" : "gpu" + std::to_string(device);
}

std::string TiersText(const ObjectInfo& o) {
  std::string tiers = o.on_host ? "host" : "";
  for (uint32_t gpu : o.gpus) {
    tiers += (tiers.empty() ? "" : "+") + TierName(static_cast<int>(gpu));
  }
  if (o.on_disk) tiers += tiers.empty() ? "disk" : "+disk";
  return tiers.empty() ? "-" : tiers;
}

std::string GpuName(const GpuInfo& gpu) {
  if (!gpu.simulated || gpu.name.find("simulated") != std::string::npos) return gpu.name;
  return gpu.name + " (simulated)";
}

void PrintFields(std::ostream& out,
                 const std::vector<std::pair<std::string, std::string>>& fields) {
  size_t width = 0;
  for (const auto& field : fields) width = std::max(width, DisplayWidth(field.first));
  for (const auto& [key, value] : fields) {
    out << key << std::string(width - DisplayWidth(key) + 2, ' ') << value << '\n';
  }
}

void Table::Print(std::ostream& out) const {
  std::vector<size_t> widths;
  for (const Column& column : columns_) widths.push_back(DisplayWidth(column.title));
  for (const auto& row : rows_) {
    for (size_t i = 0; i < row.size() && i < widths.size(); ++i) {
      widths[i] = std::max(widths[i], DisplayWidth(row[i]));
    }
  }
  auto print_row = [&](auto cell_at) {
    std::string line;
    for (size_t i = 0; i < columns_.size(); ++i) {
      const std::string& cell = cell_at(i);
      const std::string pad(widths[i] - DisplayWidth(cell), ' ');
      if (i > 0) line += "  ";
      line += columns_[i].align == Align::kRight ? pad + cell : cell + pad;
    }
    line.erase(line.find_last_not_of(' ') + 1);
    out << line << '\n';
  };
  print_row([&](size_t i) -> const std::string& { return columns_[i].title; });
  static const std::string kEmpty;
  for (const auto& row : rows_) {
    print_row([&](size_t i) -> const std::string& { return i < row.size() ? row[i] : kEmpty; });
  }
}

std::string JsonString(std::string_view text) {
  std::string out = "\"";
  for (size_t at = 0; at < text.size();) {
    const ipc::Utf8Char c = ipc::NextUtf8(text, at);
    if (c.length == 0) {  // not UTF-8, which JSON text must be
      out += "\\ufffd";
      ++at;
      continue;
    }
    switch (c.code) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (ipc::IsControl(c.code) && c.code != 0x7f) {  // C0 and C1; DEL may stand as it is
          char escaped[8];
          std::snprintf(escaped, sizeof(escaped), "\\u%04x", static_cast<unsigned>(c.code));
          out += escaped;
        } else {
          out.append(text.substr(at, c.length));
        }
    }
    at += c.length;
  }
  out += '"';
  return out;
}

JsonObject& JsonObject::Member(std::string_view key, std::string_view json) {
  auto member = std::ranges::find(members_, key, &std::pair<std::string, std::string>::first);
  if (member == members_.end()) {
    members_.emplace_back(key, json);
  } else {
    member->second = json;
  }
  return *this;
}

JsonObject& JsonObject::Remove(std::string_view key) {
  std::erase_if(members_, [&](const auto& member) { return member.first == key; });
  return *this;
}

JsonObject& JsonObject::MoveBefore(std::string_view key, std::string_view before) {
  const auto named = [&](std::string_view name) {
    return std::ranges::find(members_, name, &std::pair<std::string, std::string>::first);
  };
  auto from = named(key);
  auto to = named(before);
  if (from == members_.end() || to == members_.end() || from == to) return *this;
  if (from < to) {
    std::rotate(from, from + 1, to);
  } else {
    std::rotate(to, from, from + 1);
  }
  return *this;
}

std::string JsonObject::str() const {
  std::string text = "{";
  for (const auto& [key, json] : members_) {
    if (text.size() > 1) text += ", ";
    text += JsonString(key);
    text += ": ";
    text += json;
  }
  return text + "}";
}

JsonObject& JsonObject::String(std::string_view key, std::string_view value) {
  return Member(key, JsonString(value));
}

JsonObject& JsonObject::Number(std::string_view key, uint64_t value) {
  return Member(key, std::to_string(value));
}

std::string JsonReal(double value) {
  if (!std::isfinite(value)) return "null";
  std::ostringstream out;
  out.precision(9);
  out << value;
  return out.str();
}

JsonObject& JsonObject::Real(std::string_view key, double value) {
  return Member(key, JsonReal(value));
}

Target ParseTarget(const std::string& text) {
  if (auto id = ObjectId::FromHex(text)) return {*id, "object " + id->Hex()};
  const ObjectId id = ObjectId::FromName(text);
  return {id, "'" + Printable(text) + "' (object " + id.Hex() + ")"};
}

JsonObject& JsonObject::Bool(std::string_view key, bool value) {
  return Member(key, value ? "true" : "false");
}

JsonObject& JsonObject::Null(std::string_view key) { return Member(key, "null"); }

}  // namespace depot::ctl
