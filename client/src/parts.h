// An object's data given as parts (PutPart): copying them into the object's memory, or
// joining them into one buffer. Client::PutParts and TaskContext::PutParts share these;
// CheckParts has passed the parts first.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "depot/client.h"

namespace depot::internal {

// Whether `parts` are one buffer of the whole object.
bool IsOnePart(std::span<const PutPart> parts, uint64_t size);

// Writes `parts` at their offsets into `dst`, `size` bytes, zeroing the gaps between them
// and after the last.
void FillParts(std::byte* dst, std::span<const PutPart> parts, uint64_t size);

// The object's bytes in one span: the one part's own, or the parts joined in `*scratch`.
std::span<const std::byte> JoinParts(std::span<const PutPart> parts, uint64_t size,
                                     std::vector<std::byte>* scratch);

}  // namespace depot::internal
