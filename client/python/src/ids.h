// Object ids between Python (16-byte `bytes`) and C++.
#pragma once

#include <nanobind/nanobind.h>

#include <array>
#include <cstring>
#include <vector>

#include "depot/object_id.h"

namespace depot::python {

inline ObjectId ToId(nanobind::bytes b) {
  if (b.size() != ObjectId::kSize) throw nanobind::value_error("an object id is 16 bytes");
  std::array<std::byte, ObjectId::kSize> bytes{};
  std::memcpy(bytes.data(), b.c_str(), bytes.size());
  return ObjectId::FromBytes(bytes);
}

inline std::vector<ObjectId> ToIds(const std::vector<nanobind::bytes>& list) {
  std::vector<ObjectId> ids;
  ids.reserve(list.size());
  for (const auto& b : list) ids.push_back(ToId(b));
  return ids;
}

inline nanobind::bytes IdBytes(const ObjectId& id) {
  const auto bytes = id.Bytes();
  return nanobind::bytes(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

}  // namespace depot::python
