#include "holding.h"

#include "connection.h"

namespace depot::internal {

Holding::~Holding() {
  // In a forked child, leave the parent's table and socket alone (see Connection::forked).
  if (conn->forked()) return;
  conn->holdings().Forget(id, this);
  if (leased) {
    conn->DropLease(id, location.slot);
  } else if (!aborted.load(std::memory_order_acquire)) {
    // Queued: it goes with the connection's next request, or within about 1 ms.
    conn->Release(id);
  }
}

std::shared_ptr<Holding> HoldingTable::Find(const ObjectId& id) const {
  std::lock_guard lock(mu_);
  auto it = entries_.find(id);
  return it == entries_.end() ? nullptr : it->second.weak.lock();
}

std::shared_ptr<Holding> HoldingTable::Adopt(std::shared_ptr<Holding> fresh) {
  // Declared before the lock so that, if this is the last reference to a replaced Holding,
  // it is destroyed after the lock is released.
  std::shared_ptr<Holding> existing;
  std::lock_guard lock(mu_);
  Entry& entry = entries_[fresh->id];
  existing = entry.weak.lock();
  if (existing && SameLocation(existing->location, fresh->location)) return existing;
  entry = Entry{fresh, fresh.get()};
  return fresh;
}

void HoldingTable::Replace(const std::shared_ptr<Holding>& holding) {
  std::lock_guard lock(mu_);
  entries_[holding->id] = Entry{holding, holding.get()};
}

void HoldingTable::Forget(const ObjectId& id) {
  std::lock_guard lock(mu_);
  entries_.erase(id);
}

void HoldingTable::Forget(const ObjectId& id, const Holding* holding) {
  std::lock_guard lock(mu_);
  auto it = entries_.find(id);
  if (it != entries_.end() && it->second.raw == holding) entries_.erase(it);
}

}  // namespace depot::internal

namespace depot::internal {

DeviceHolding::~DeviceHolding() {
  if (!aborted.load(std::memory_order_acquire)) conn->Release(id, device);
}

}  // namespace depot::internal
