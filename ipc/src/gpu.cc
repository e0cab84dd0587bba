#include "depot/ipc/gpu.h"

namespace depot::ipc {

std::string FormatUuid(const DeviceUuid& uuid) {
  static constexpr char kHex[] = "0123456789abcdef";
  // nvidia-smi groups the 16 bytes 4-2-2-2-6, as RFC 4122 prints a UUID.
  std::string out = "GPU-";
  out.reserve(4 + 2 * uuid.size() + 4);
  for (size_t i = 0; i < uuid.size(); ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out += '-';
    out += kHex[uuid[i] >> 4];
    out += kHex[uuid[i] & 0xf];
  }
  return out;
}

}  // namespace depot::ipc
