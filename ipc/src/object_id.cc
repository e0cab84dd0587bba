#include "depot/object_id.h"

#include <sys/random.h>
#include <xxhash.h>

#include <cerrno>
#include <stdexcept>

namespace depot {

ObjectId ObjectId::FromName(std::string_view name) {
  XXH128_hash_t h = XXH3_128bits(name.data(), name.size());
  return FromWords(h.low64, h.high64);
}

ObjectId ObjectId::Random() {
  uint64_t words[2] = {0, 0};
  size_t got = 0;
  auto* p = reinterpret_cast<char*>(words);
  while (got < sizeof(words)) {
    ssize_t n = getrandom(p + got, sizeof(words) - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      // getrandom cannot fail on Linux ≥ 3.17 with a valid buffer; there is no id to return.
      throw std::runtime_error("getrandom failed");
    }
    got += static_cast<size_t>(n);
  }
  if (words[0] == 0 && words[1] == 0) words[0] = 1;  // never the nil id
  return FromWords(words[0], words[1]);
}

namespace {
int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}
}  // namespace

std::optional<ObjectId> ObjectId::FromHex(std::string_view hex) {
  if (hex.size() != 2 * kSize) return std::nullopt;
  uint64_t words[2] = {0, 0};  // hi, lo: the hex form is big-endian hi then lo
  for (size_t i = 0; i < hex.size(); ++i) {
    int d = HexDigit(hex[i]);
    if (d < 0) return std::nullopt;
    words[i / 16] = (words[i / 16] << 4) | static_cast<uint64_t>(d);
  }
  return FromWords(words[1], words[0]);
}

ObjectId ObjectId::FromBytes(const std::array<std::byte, kSize>& bytes) {
  uint64_t hi = 0, lo = 0;
  for (size_t i = 0; i < 8; ++i) hi = (hi << 8) | std::to_integer<uint64_t>(bytes[i]);
  for (size_t i = 8; i < 16; ++i) lo = (lo << 8) | std::to_integer<uint64_t>(bytes[i]);
  return FromWords(lo, hi);
}

std::array<std::byte, ObjectId::kSize> ObjectId::Bytes() const {
  std::array<std::byte, kSize> out;
  for (size_t i = 0; i < 8; ++i) out[i] = static_cast<std::byte>(hi_ >> (56 - 8 * i));
  for (size_t i = 0; i < 8; ++i) out[8 + i] = static_cast<std::byte>(lo_ >> (56 - 8 * i));
  return out;
}

std::string ObjectId::Hex() const {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(2 * kSize, '0');
  for (int i = 0; i < 16; ++i) out[i] = kDigits[(hi_ >> (60 - 4 * i)) & 0xf];
  for (int i = 0; i < 16; ++i) out[16 + i] = kDigits[(lo_ >> (60 - 4 * i)) & 0xf];
  return out;
}

}  // namespace depot
