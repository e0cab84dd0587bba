// ObjectId: the 16-byte name of an object in the store.
#pragma once

#include <array>
#include <compare>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace depot {

class ObjectId {
 public:
  static constexpr size_t kSize = 16;

  // The all-zero id. It is never a valid object id: the daemon rejects it.
  constexpr ObjectId() = default;

  // The id of a string key: the XXH3-128 hash of `name`. The same name gives the same id in
  // every process and language, so keys (file names, Dask keys) need no registry.
  static ObjectId FromName(std::string_view name);
  // A fresh id from the system's random source, unique for all practical purposes.
  static ObjectId Random();
  // Parses the 32-character hex form written by Hex(); nullopt if `hex` is not one.
  static std::optional<ObjectId> FromHex(std::string_view hex);
  // The id whose bytes are exactly `bytes`.
  static ObjectId FromBytes(const std::array<std::byte, kSize>& bytes);
  // The id made of two 64-bit words (the wire form).
  static constexpr ObjectId FromWords(uint64_t lo, uint64_t hi) {
    ObjectId id;
    id.lo_ = lo;
    id.hi_ = hi;
    return id;
  }

  // Lower-case hex, 32 characters.
  std::string Hex() const;
  std::array<std::byte, kSize> Bytes() const;
  uint64_t lo() const { return lo_; }
  uint64_t hi() const { return hi_; }
  bool IsNil() const { return lo_ == 0 && hi_ == 0; }

  friend constexpr bool operator==(const ObjectId&, const ObjectId&) = default;
  friend constexpr auto operator<=>(const ObjectId&, const ObjectId&) = default;

 private:
  uint64_t hi_ = 0;  // compared first, so ids sort as their hex forms do
  uint64_t lo_ = 0;
};

}  // namespace depot

template <>
struct std::hash<depot::ObjectId> {
  size_t operator()(const depot::ObjectId& id) const noexcept {
    // Ids are hashes or random already; mixing the words is enough.
    return static_cast<size_t>(id.lo() ^ (id.hi() * 0x9E3779B97F4A7C15ull));
  }
};
