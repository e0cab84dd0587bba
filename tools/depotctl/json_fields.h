// depotctl's JSON of the info structs, written from their field tables (info_fields.h): every
// field the daemon sends, under its table name, in table order, nested structs as objects,
// lists as arrays, custom resources as an object, enums by their names, ids and GPU uuids as
// text. A field added to a struct and its table is in depotctl's JSON with nothing to write
// here. The commands change only how a few fields are shown (commands.cc says which and why).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <type_traits>
#include <vector>

#include "depot/client.h"
#include "depot/ipc/gpu.h"
#include "depot/task.h"
#include "format.h"
#include "info_fields.h"

namespace depot::ctl {

// "ok", "mismatch", "no_checksum", "not_found", "not_sealed", "not_on_host".
const char* VerifyStateName(VerifyState state);

template <typename V>
requires std::is_integral_v<V> std::string JsonValue(V value) {
  if constexpr (std::is_same_v<V, bool>) {
    return value ? "true" : "false";
  } else {
    return std::to_string(value);
  }
}
inline std::string JsonValue(double value) { return JsonReal(value); }
inline std::string JsonValue(const std::string& text) { return JsonString(text); }
inline std::string JsonValue(const ObjectId& id) { return JsonString(id.Hex()); }
inline std::string JsonValue(const std::array<uint8_t, 16>& uuid) {
  return JsonString(ipc::FormatUuid(uuid));
}
inline std::string JsonValue(ObjectState state) {
  return JsonString(state == ObjectState::kSealed ? "sealed" : "creating");
}
inline std::string JsonValue(VerifyState state) { return JsonString(VerifyStateName(state)); }
inline std::string JsonValue(TaskState state) { return JsonString(TaskStateName(state)); }
std::string JsonValue(const std::map<std::string, double>& resources);
template <typename V>
std::string JsonValue(const std::vector<V>& list);
template <internal::Info T>
std::string JsonValue(const T& record);

// `record` as a JSON object: each field of its table that is on the wire (the rest, such as
// GpuInfo::ordinal, are this process's, not the daemon's).
template <internal::Info T>
JsonObject JsonOf(const T& record) {
  JsonObject json;
  internal::ForEachField<T>([&](const auto& field) {
    if constexpr (std::decay_t<decltype(field)>::kOnWire) {
      json.Json(field.name, JsonValue(record.*field.member));
    }
  });
  return json;
}

template <typename V>
std::string JsonValue(const std::vector<V>& list) {
  std::string out = "[";
  for (size_t i = 0; i < list.size(); ++i) out += (i == 0 ? "" : ", ") + JsonValue(list[i]);
  return out + "]";
}

template <internal::Info T>
std::string JsonValue(const T& record) {
  return JsonOf(record).str();
}

}  // namespace depot::ctl
