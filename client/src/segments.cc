#include "segments.h"

#include "depot/ipc/checked.h"
#include "depot/ipc/protocol.h"

#include <sys/mman.h>
#include <sys/stat.h>

#include <cstring>

#include <string>
#include <utility>

namespace depot::internal {

namespace {

std::string Describe(uint32_t index, bool writable) {
  return ipc::IsDedicatedSegment(index)
             ? "the arena segment of object " +
                   std::to_string(index - ipc::kFirstDedicatedSegment) +
                   (writable ? " (writable)" : "")
             : "arena segment " + std::to_string(index) + (writable ? " (writable)" : "");
}

}  // namespace

Result<std::shared_ptr<const Mapping>> Segments::Add(uint32_t index, uint64_t size, bool writable,
                                                     bool dedicated, uint32_t generation,
                                                     ipc::UniqueFd fd) {
  const int prot = writable ? PROT_READ | PROT_WRITE : PROT_READ;
  if (dedicated != ipc::IsDedicatedSegment(index)) {
    return Status::Internal("the daemon sent " + Describe(index, writable) + " as " +
                            (dedicated ? "dedicated" : "shared"));
  }
  if (dedicated) {
    // The file the daemon sent: an index names one file for the daemon's life, but a view
    // kept from a daemon whose indices wrapped around (2^31 large objects later) must not
    // pass for this file's.
    struct stat st {};
    const bool known = ::fstat(fd.get(), &st) == 0;
    std::lock_guard lock(mu_);
    Dedicated& entry = dedicated_[index];
    std::weak_ptr<const Mapping>& view = writable ? entry.writable : entry.readable;
    if (auto live = view.lock();
        live && known && st.st_dev == entry.dev && st.st_ino == entry.ino) {
      return live;
    }
    if (known && (st.st_dev != entry.dev || st.st_ino != entry.ino)) {
      entry.readable.reset();  // views of another file: this index no longer names it
      entry.writable.reset();
      entry.dev = st.st_dev;
      entry.ino = st.st_ino;
    }
    // Mapped under the lock: with no populate this is one system call, and a second thread
    // must not map the same view beside it.
    auto mapped = Mapping::Map(fd.get(), size, prot, 0, Describe(index, writable).c_str());
    if (!mapped.ok()) {
      entry.error = mapped.status();  // for the Resolve that will not find it
      return std::shared_ptr<const Mapping>();
    }
    if (!writable) mapped->KeepFile(std::move(fd));
    auto live = std::make_shared<const Mapping>(std::move(mapped).value());
    view = live;
    if (writable) entry.first_write = true;
    recent_.push_back(live);
    if (recent_.size() > kRecentDedicated) recent_.pop_front();
    if (dedicated_.size() >= prune_at_) {
      std::erase_if(dedicated_, [](const auto& e) {
        return e.second.readable.expired() && e.second.writable.expired();
      });
      prune_at_ = std::max<size_t>(64, 2 * dedicated_.size());
    }
    return live;
  }
  std::lock_guard lock(mu_);
  if (index >= shared_.size()) shared_.resize(index + 1);
  Shared& entry = shared_[index];
  if (entry.announced && generation != entry.generation) {
    if (writable) {
      return Status::Internal("the daemon sent " + Describe(index, true) + " of generation " +
                              std::to_string(generation) + " before its read-only view");
    }
    // A new file: the daemon gave the segment, empty, to another user's objects, so nothing
    // this client holds is in it. The old writable view goes; the read-only one is replaced
    // where it is.
    entry.generation = generation;
    if (entry.writable.data() != nullptr) {
      entry.writable.Revoke();
      revoked_.push_back(std::move(entry.writable));
      if (revoked_.size() > kMaxRevoked) revoked_.pop_front();
      entry.writable = Mapping();
    }
    entry.writable_error = Status::OK();
    if (entry.readable.data() != nullptr && entry.readable.size() == size) {
      entry.error = entry.readable.Replace(fd.get(), prot, Describe(index, false).c_str());
      if (entry.error.ok()) entry.readable.KeepFile(std::move(fd));
      return std::shared_ptr<const Mapping>();
    }
    entry.announced = false;
    entry.error = Status::OK();
  }
  if (writable ? entry.writable.data() != nullptr || !entry.writable_error.ok() : entry.announced) {
    return std::shared_ptr<const Mapping>();
  }
  if (!writable) entry.generation = generation;
  auto mapped = Mapping::Map(fd.get(), size, prot, 0, Describe(index, writable).c_str());
  if (writable) {
    if (mapped.ok()) {
      entry.writable = std::move(mapped).value();
    } else {
      entry.writable_error = mapped.status();
    }
    return std::shared_ptr<const Mapping>();
  }
  entry.announced = true;
  if (mapped.ok()) {
    entry.readable = std::move(mapped).value();
    entry.readable.KeepFile(std::move(fd));
  } else {
    entry.error = mapped.status();
  }
  return std::shared_ptr<const Mapping>();
}

bool Segments::FirstWrite(uint32_t index) {
  std::lock_guard lock(mu_);
  auto it = dedicated_.find(index);
  return it != dedicated_.end() && std::exchange(it->second.first_write, false);
}

Result<Segments::View<std::byte>> Segments::Find(uint32_t index, uint64_t offset, uint64_t size,
                                                 bool writable) const {
  View<std::byte> view;
  const Mapping* mapping = nullptr;
  if (ipc::IsDedicatedSegment(index)) {
    auto it = dedicated_.find(index);
    if (it != dedicated_.end())
      view.keep = (writable ? it->second.writable : it->second.readable).lock();
    if (!view.keep) {
      if (it != dedicated_.end() && !it->second.error.ok()) return it->second.error;
      return Status::Internal("the daemon referred to " + Describe(index, writable) +
                              ", which this client does not map");
    }
    mapping = view.keep.get();
  } else {
    if (index >= shared_.size() || !shared_[index].announced) {
      return Status::Internal("the daemon referred to arena segment " + std::to_string(index) +
                              ", which it never sent to this client");
    }
    const Shared& entry = shared_[index];
    if (!entry.error.ok()) return entry.error;
    if (writable) {
      if (!entry.writable_error.ok()) return entry.writable_error;
      if (entry.writable.data() == nullptr) {
        return Status::Internal("the daemon placed a new object in arena segment " +
                                std::to_string(index) + " without sending it writable");
      }
    }
    mapping = writable ? &entry.writable : &entry.readable;
  }
  const uint64_t limit = mapping->size();
  if (!ipc::RangeWithin(offset, size, limit)) {
    return Status::Internal("the daemon placed an object at [" + std::to_string(offset) + ", +" +
                            std::to_string(size) + ") in " + Describe(index, false) +
                            ", which has only " + std::to_string(limit) + " bytes");
  }
  view.data = mapping->data() + offset;
  return view;
}

Result<Segments::View<const std::byte>> Segments::Resolve(uint32_t index, uint64_t offset,
                                                          uint64_t size) const {
  std::lock_guard lock(mu_);
  DEPOT_ASSIGN_OR_RETURN(View<std::byte> view, Find(index, offset, size, false));
  return View<const std::byte>{view.data, std::move(view.keep)};
}

Result<Segments::View<std::byte>> Segments::ResolvePrivate(uint32_t index, uint64_t offset,
                                                           uint64_t size) const {
  std::lock_guard lock(mu_);
  DEPOT_ASSIGN_OR_RETURN(View<std::byte> found, Find(index, offset, size, false));
  if (size == 0) return View<std::byte>{};
  const Mapping& readable = found.keep ? *found.keep : shared_[index].readable;
  const std::string what = Describe(index, false);
  uint64_t skip = 0;
  auto view = readable.PrivateView(offset, size, what.c_str(), &skip);
  if (!view.ok()) {
    // Where the file cannot be mapped privately (memory limits, an odd filesystem): a copy
    // made now, private all the same.
    DEPOT_ASSIGN_OR_RETURN(view, Mapping::Anonymous(size, what.c_str()));
    std::memcpy(view->data(), found.data, size);
    skip = 0;
  }
  auto keep = std::make_shared<const Mapping>(std::move(view).value());
  return View<std::byte>{keep->data() + skip, std::move(keep)};
}

Result<Segments::View<std::byte>> Segments::ResolveWritable(uint32_t index, uint64_t offset,
                                                            uint64_t size) const {
  std::lock_guard lock(mu_);
  return Find(index, offset, size, true);
}

}  // namespace depot::internal
