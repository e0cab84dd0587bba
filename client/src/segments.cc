#include "segments.h"

#include <sys/mman.h>

#include <string>

namespace depot::internal {

void Segments::Add(uint32_t index, uint64_t size, bool writable, ipc::UniqueFd fd) {
  {
    std::lock_guard lock(mu_);
    if (index < table_.size()) {
      const Entry& entry = table_[index];
      if (writable ? entry.writable.data() != nullptr || !entry.writable_error.ok()
                   : entry.announced) {
        return;
      }
    }
  }
  // Mapped outside the lock: populating a large segment takes a while and other threads
  // may resolve objects in segments mapped earlier meanwhile. Only the connection's reader
  // calls Add, so no other Add of this view can slip in.
  const std::string what =
      "arena segment " + std::to_string(index) + (writable ? " (writable)" : "");
  auto mapped = Mapping::Map(fd.get(), size, writable ? PROT_READ | PROT_WRITE : PROT_READ,
                             MAP_POPULATE, what.c_str());
  std::lock_guard lock(mu_);
  if (index >= table_.size()) table_.resize(index + 1);
  Entry& entry = table_[index];
  if (writable) {
    if (mapped.ok()) {
      entry.writable = std::move(mapped).value();
    } else {
      entry.writable_error = mapped.status();
    }
    return;
  }
  entry.announced = true;
  if (mapped.ok()) {
    entry.readable = std::move(mapped).value();
  } else {
    entry.error = mapped.status();
  }
}

Result<const Segments::Entry*> Segments::Check(uint32_t index, uint64_t offset,
                                               uint64_t size) const {
  if (index >= table_.size() || !table_[index].announced) {
    return Status::Internal("the daemon referred to arena segment " + std::to_string(index) +
                            ", which it never sent to this client");
  }
  const Entry& entry = table_[index];
  if (!entry.error.ok()) return entry.error;
  const uint64_t limit = entry.readable.size();
  if (offset > limit || size > limit - offset) {
    return Status::Internal("the daemon placed an object at [" + std::to_string(offset) + ", +" +
                            std::to_string(size) + ") in arena segment " + std::to_string(index) +
                            ", which has only " + std::to_string(limit) + " bytes");
  }
  return &entry;
}

Result<const std::byte*> Segments::Resolve(uint32_t index, uint64_t offset, uint64_t size) const {
  std::lock_guard lock(mu_);
  DEPOT_ASSIGN_OR_RETURN(const Entry* entry, Check(index, offset, size));
  return static_cast<const std::byte*>(entry->readable.data() + offset);
}

Result<std::byte*> Segments::ResolveWritable(uint32_t index, uint64_t offset, uint64_t size) const {
  std::lock_guard lock(mu_);
  DEPOT_ASSIGN_OR_RETURN(const Entry* entry, Check(index, offset, size));
  if (!entry->writable_error.ok()) return entry->writable_error;
  if (entry->writable.size() != entry->readable.size()) {
    return Status::Internal("the daemon placed a new object in arena segment " +
                            std::to_string(index) + " without sending it writable");
  }
  return entry->writable.data() + offset;
}

}  // namespace depot::internal
