#include "parts.h"

#include <cstring>

namespace depot::internal {

bool IsOnePart(std::span<const PutPart> parts, uint64_t size) {
  return parts.size() == 1 && parts[0].offset == 0 && parts[0].data.size() == size;
}

void FillParts(std::byte* dst, std::span<const PutPart> parts, uint64_t size) {
  uint64_t pos = 0;
  for (const PutPart& part : parts) {
    if (part.offset > pos) std::memset(dst + pos, 0, part.offset - pos);
    if (!part.data.empty()) std::memcpy(dst + part.offset, part.data.data(), part.data.size());
    pos = part.offset + part.data.size();
  }
  if (size > pos) std::memset(dst + pos, 0, size - pos);
}

std::span<const std::byte> JoinParts(std::span<const PutPart> parts, uint64_t size,
                                     std::vector<std::byte>* scratch) {
  if (IsOnePart(parts, size)) return parts[0].data;
  scratch->resize(size);
  FillParts(scratch->data(), parts, size);
  return *scratch;
}

}  // namespace depot::internal
