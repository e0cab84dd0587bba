#include "leases.h"

#include <sys/mman.h>

#include "depot/ipc/checked.h"

namespace depot::internal {

Status Leases::Map(int fd, uint32_t entries, uint64_t max_object_bytes) {
  if (entries == 0 || (entries & (entries - 1)) != 0) {
    return Status::Internal("the daemon sent a lease table of " + std::to_string(entries) +
                            " entries, not a power of two");
  }
  DEPOT_ASSIGN_OR_RETURN(table_, Mapping::Map(fd, ipc::LeaseTableBytes(entries),
                                              PROT_READ | PROT_WRITE, 0, "the lease table"));
  view_ = ipc::LeaseTableView(table_.data(), entries);
  max_object_bytes_ = max_object_bytes;
  return Status::OK();
}

void Leases::Remember(const ObjectId& id, const Seen& seen) {
  if (!enabled()) return;
  // The daemon would not honour a lease on it: it is got through the socket.
  if (max_object_bytes_ != 0 &&
      !ipc::RangeWithin(seen.data_size, seen.metadata_size, max_object_bytes_)) {
    return;
  }
  std::lock_guard lock(mu_);
  if (seen_.size() >= kMaxSeen && !seen_.contains(id)) seen_.erase(seen_.begin());
  seen_[id] = seen;
}

std::optional<Leases::Seen> Leases::Take(const ObjectId& id,
                                         std::span<const ipc::ObjectHeader> headers) {
  if (!enabled()) return std::nullopt;
  Seen seen;
  {
    std::lock_guard lock(mu_);
    auto it = seen_.find(id);
    if (it == seen_.end()) return std::nullopt;
    seen = it->second;
  }
  if (seen.slot >= headers.size()) return std::nullopt;
  switch (view_.Take(seen.slot, seen.generation, headers[seen.slot])) {
    case ipc::LeaseTableView::Taken::kTaken:
      return seen;
    case ipc::LeaseTableView::Taken::kBusy:
      return std::nullopt;
    case ipc::LeaseTableView::Taken::kGone:
      break;
  }
  std::lock_guard lock(mu_);
  if (auto it = seen_.find(id); it != seen_.end() && it->second.slot == seen.slot &&
                                it->second.generation == seen.generation) {
    seen_.erase(it);
  }
  return std::nullopt;
}

}  // namespace depot::internal
