#include "store/leases.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "depot/ipc/checked.h"

namespace depot::store {

Leases::Leases(boost::asio::io_context& loop, ObjectTable& table, uint32_t entries,
               bool writable_for_tests)
    : table_(table),
      entries_(entries),
      prot_(writable_for_tests ? PROT_READ | PROT_WRITE : PROT_READ),
      timer_(loop) {}

Leases::~Leases() {
  for (const Table& t : tables_) ::munmap(t.base, ipc::LeaseTableBytes(t.entries));
}

Result<int> Leases::Open(ClientId client, uint32_t entries, uint64_t max_object_bytes) {
  if (entries == 0) return -1;
  if (entries > entries_ || (entries & (entries - 1)) != 0) {
    return Status::Internal("a lease table of " + std::to_string(entries) +
                            " entries (a power of two, at most " + std::to_string(entries_) + ")");
  }
  const size_t bytes = ipc::LeaseTableBytes(entries);
  ipc::UniqueFd fd(::memfd_create("depot-leases", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd) return Status::FromErrno("memfd_create of a lease table", errno);
  if (::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) {
    return Status::FromErrno("ftruncate of a lease table", errno);
  }
  // The client cannot shrink it under the daemon's mapping (a read past the end would be
  // SIGBUS) nor grow it; it may punch holes, which read as zeros: no lease.
  if (::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return Status::FromErrno("sealing a lease table", errno);
  }
  void* base = ::mmap(nullptr, bytes, prot_, MAP_SHARED, fd.get(), 0);
  if (base == MAP_FAILED) return Status::FromErrno("mmap of a lease table", errno);
  const int raw = fd.get();
  tables_.push_back(Table{client, std::move(fd), base, entries, max_object_bytes,
                          ipc::LeaseTableView(base, entries)});
  return raw;
}

void Leases::Close(ClientId client) {
  auto it = std::find_if(tables_.begin(), tables_.end(),
                         [client](const Table& t) { return t.client == client; });
  if (it == tables_.end()) return;
  ::munmap(it->base, ipc::LeaseTableBytes(it->entries));
  *it = std::move(tables_.back());
  tables_.pop_back();
  RecheckSoon();
}

void* Leases::MappingOf(ClientId client) const {
  for (const Table& t : tables_) {
    if (t.client == client) return t.base;
  }
  return nullptr;
}

bool Leases::MayKeep(const Table& t, uint32_t slot) const {
  if (t.max_object_bytes == 0) return true;
  const ipc::ObjectHeader& h = table_.headers().at(slot);
  return ipc::RangeWithin(h.data_size, h.metadata_size, t.max_object_bytes);
}

bool Leases::AnyHolds(uint32_t slot, uint32_t generation) const {
  for (const Table& t : tables_) {
    if (t.view.Holds(slot, generation) && MayKeep(t, slot)) return true;
  }
  return false;
}

bool Leases::Reclaim(uint32_t slot) {
  HeaderTable& headers = table_.headers();
  ipc::ObjectHeader& h = headers.at(slot);
  const uint32_t generation = h.generation.load(std::memory_order_relaxed);
  // The mark, published with a sequentially consistent store, then the look (lease.h).
  const uint32_t before = h.flags.fetch_or(ipc::kFlagReclaiming, std::memory_order_relaxed);
  if (before & ipc::kFlagReclaiming) {
    // An earlier reclaim of this object freed a host copy and left the mark: no lease has
    // been taken on the object since, so none can hold this copy (a table that claims one
    // lies). Lifting the mark would let a client lease the old copy's place.
    leased_.erase(slot);
    return true;
  }
  headers.Publish(slot);
  if (!AnyHolds(slot, generation)) {
    leased_.erase(slot);
    return true;
  }
  // Kept: the mark was set by this look alone, and the copy stays where it is, so leases
  // may be taken on it again.
  h.flags.fetch_and(~uint32_t{ipc::kFlagReclaiming}, std::memory_order_relaxed);
  headers.Publish(slot);
  ++blocked_reclaims_;
  leased_[slot] = generation;
  ArmTimer();
  return false;
}

void Leases::RecheckSoon() {
  if (leased_.empty() || soon_) return;
  soon_ = true;
  // At most one look per kMinRecheckGap however often clients ask (each reads every
  // table for every kept copy).
  const auto earliest = last_recheck_ + kMinRecheckGap;
  timer_.expires_at(std::max(earliest, std::chrono::steady_clock::now()));  // cancels a wait
  timer_armed_ = false;
  ArmTimer();
}

void Leases::ArmTimer() {
  if (timer_armed_) return;
  timer_armed_ = true;
  if (!soon_) timer_.expires_after(kRecheckInterval);
  timer_.async_wait([this](const boost::system::error_code& ec) {
    // Aborted: the Leases is gone, or the wait was replaced by a sooner one.
    if (ec) return;
    timer_armed_ = false;
    soon_ = false;
    Recheck();
  });
}

void Leases::Recheck() {
  last_recheck_ = std::chrono::steady_clock::now();
  std::vector<uint32_t> ended;
  for (auto it = leased_.begin(); it != leased_.end();) {
    const auto [slot, generation] = *it;
    const bool same =
        table_.headers().state(slot) != ipc::ObjectState::kFree &&
        table_.headers().at(slot).generation.load(std::memory_order_relaxed) == generation;
    if (same && AnyHolds(slot, generation)) {
      ++it;
      continue;
    }
    if (same) ended.push_back(slot);
    it = leased_.erase(it);
  }
  if (!leased_.empty()) ArmTimer();
  if (ended_) {
    for (uint32_t slot : ended) ended_(slot);
  }
}

uint32_t Leases::CountIn(const Table& t, uint32_t slot) const {
  const HeaderTable& headers = table_.headers();
  if (headers.state(slot) != ipc::ObjectState::kSealed || !MayKeep(t, slot)) return 0;
  const ipc::LeaseTableView& view = t.view;
  const uint32_t generation = headers.at(slot).generation.load(std::memory_order_relaxed);
  const uint64_t word = view.entry(slot).load(std::memory_order_relaxed);
  const bool names =
      ipc::LeaseGeneration(word) == generation && ipc::LeaseTag(word) == (view.tag(slot) & 0xffff);
  return names ? ipc::LeaseCount(word) : 0;
}

uint32_t Leases::Count(uint32_t slot) const {
  uint32_t count = 0;
  for (const Table& t : tables_) count += CountIn(t, slot);
  return count;
}

std::vector<std::pair<ClientId, uint32_t>> Leases::HoldersOf(uint32_t slot) const {
  std::vector<std::pair<ClientId, uint32_t>> holders;
  for (const Table& t : tables_) {
    if (uint32_t n = CountIn(t, slot); n != 0) holders.emplace_back(t.client, n);
  }
  return holders;
}

std::vector<std::pair<uint32_t, uint32_t>> Leases::LeasedBy(ClientId client) const {
  std::vector<std::pair<uint32_t, uint32_t>> leased;
  auto it = std::find_if(tables_.begin(), tables_.end(),
                         [client](const Table& t) { return t.client == client; });
  if (it == tables_.end()) return leased;
  const uint32_t shift = static_cast<uint32_t>(__builtin_ctz(it->entries));
  const uint32_t slots = table_.headers().high_water();
  for (uint32_t index = 0; index < it->entries; ++index) {
    const uint64_t word = it->view.entry(index).load(std::memory_order_relaxed);
    if (ipc::LeaseCount(word) == 0) continue;
    // The slot the entry names, if the table has no more slots than tags tell apart.
    const uint64_t slot = (uint64_t{ipc::LeaseTag(word)} << shift) | index;
    if (slot >= slots) continue;
    const auto s = static_cast<uint32_t>(slot);
    if (uint32_t n = CountIn(*it, s); n != 0) leased.emplace_back(s, n);
  }
  return leased;
}

LeaseCounters Leases::counters() const {
  return LeaseCounters{tables_.size(), leased_.size(), blocked_reclaims_};
}

}  // namespace depot::store
