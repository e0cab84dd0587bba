#include "segments.h"

#include <sys/mman.h>

#include <string>

namespace depot::internal {

void Segments::Add(uint32_t index, uint64_t size, ipc::UniqueFd fd) {
  {
    std::lock_guard lock(mu_);
    if (index < table_.size() && table_[index].announced) return;
  }
  // Mapped outside the lock: populating a large segment takes a while and other threads
  // may resolve objects in segments mapped earlier meanwhile. Only the connection's reader
  // calls Add, so no other Add of this index can slip in.
  auto mapped = Mapping::Map(fd.get(), size, PROT_READ | PROT_WRITE, MAP_POPULATE,
                             ("arena segment " + std::to_string(index)).c_str());
  std::lock_guard lock(mu_);
  if (index >= table_.size()) table_.resize(index + 1);
  Entry& entry = table_[index];
  entry.announced = true;
  if (mapped.ok()) {
    entry.mapping = std::move(mapped).value();
  } else {
    entry.error = mapped.status();
  }
}

Result<std::byte*> Segments::Resolve(uint32_t index, uint64_t offset, uint64_t size) const {
  std::lock_guard lock(mu_);
  if (index >= table_.size() || !table_[index].announced) {
    return Status::Internal("the daemon referred to arena segment " + std::to_string(index) +
                            ", which it never sent to this client");
  }
  const Entry& entry = table_[index];
  if (!entry.error.ok()) return entry.error;
  const uint64_t limit = entry.mapping.size();
  if (offset > limit || size > limit - offset) {
    return Status::Internal("the daemon placed an object at [" + std::to_string(offset) + ", +" +
                            std::to_string(size) + ") in arena segment " + std::to_string(index) +
                            ", which has only " + std::to_string(limit) + " bytes");
  }
  return entry.mapping.data() + offset;
}

}  // namespace depot::internal
