#include "store/object_store.h"

#include <spdlog/spdlog.h>
#include <xxhash.h>

#include <algorithm>
#include <boost/asio/post.hpp>
#include <cstring>

#include "depot/ipc/units.h"

namespace depot::store {

namespace {
// Checksums of objects at least this large run on the worker pool, not on the loop.
constexpr uint64_t kInlineChecksumBytes = 1u << 20;

std::string Describe(const ObjectId& id) { return "object " + id.Hex(); }
}  // namespace

ObjectStore::ObjectStore(boost::asio::io_context& loop, boost::asio::thread_pool& workers,
                         Arena& arena, HeaderTable& headers, ClientLimits limits, bool eviction)
    : loop_(loop),
      workers_(workers),
      arena_(arena),
      headers_(headers),
      limits_(limits),
      eviction_(eviction) {
  clients_.try_emplace(kStoreClient);
}

ObjectStore::~ObjectStore() {
  for (auto& [id, get] : pending_) get.timer->cancel();
}

uint32_t ObjectStore::Find(const ObjectId& id) const {
  auto it = index_.find(id);
  return it == index_.end() ? HeaderTable::kNoSlot : it->second;
}

uint64_t ObjectStore::BlockBytes(uint32_t slot) const {
  const auto& h = headers_.at(slot);
  return arena_.ReservedSize(h.data_size + h.metadata_size);
}

Location ObjectStore::LocationOf(uint32_t slot) const {
  const auto& h = headers_.at(slot);
  return Location{slot, h.segment, h.offset, h.data_size, h.metadata_size};
}

void ObjectStore::AddClient(ClientId client) { clients_.try_emplace(client); }

void ObjectStore::RemoveClient(ClientId client) {
  auto it = clients_.find(client);
  if (it == clients_.end()) return;
  ClientState& state = it->second;
  for (uint64_t pending_id : state.pending_gets) {
    auto p = pending_.find(pending_id);
    if (p == pending_.end()) continue;
    p->second.timer->cancel();
    ForgetWaits(pending_id, p->second);
    pending_.erase(p);
  }
  // Drop every reference; the last reference to an unsealed object aborts it.
  std::vector<std::pair<uint32_t, uint32_t>> refs(state.refs.begin(), state.refs.end());
  for (auto [slot, count] : refs) {
    for (uint32_t i = 0; i < count; ++i) DropRef(state, slot);
  }
  clients_.erase(it);
}

Status ObjectStore::CheckLimits(ClientId client, const ClientState& state, uint64_t bytes) const {
  if (limits_.max_objects != 0 && state.refs.size() >= limits_.max_objects) {
    return Status::LimitExceeded("client " + std::to_string(client) + " already holds " +
                                 std::to_string(state.refs.size()) +
                                 " objects, its limit (--client-max-objects); release some first");
  }
  if (limits_.max_bytes != 0 && state.held_bytes + bytes > limits_.max_bytes) {
    return Status::LimitExceeded("client " + std::to_string(client) + " holds " +
                                 ipc::FormatSize(state.held_bytes) + "; another " +
                                 ipc::FormatSize(bytes) + " would pass its limit of " +
                                 ipc::FormatSize(limits_.max_bytes) + " (--client-max-bytes)");
  }
  return Status::OK();
}

std::string ObjectStore::OutOfMemoryMessage(const ObjectId& id, uint64_t bytes) const {
  const uint64_t used = arena_.used_bytes();
  return "cannot fit " + Describe(id) + " of " + ipc::FormatSize(bytes) + ": " +
         ipc::FormatSize(arena_.capacity() - used) + " of " + ipc::FormatSize(arena_.capacity()) +
         " is free (largest free block " + ipc::FormatSize(arena_.largest_free_block()) + "), " +
         ipc::FormatSize(counters_.held_bytes) +
         " is held by references or objects being created, " +
         ipc::FormatSize(counters_.pinned_bytes) + " is pinned" +
         (eviction_ ? "" : ", and eviction is off (--no-evict)") +
         "; release or delete objects, or start depotd with more --memory";
}

void ObjectStore::MakeEvictable(uint32_t slot) {
  const uint32_t segment = headers_.at(slot).segment;
  if (segment >= evictable_bytes_.size()) evictable_bytes_.resize(segment + 1, 0);
  evictable_bytes_[segment] += BlockBytes(slot);
  lru_.PushBack(slot);
}

void ObjectStore::MakeUnevictable(uint32_t slot) {
  if (!lru_.contains(slot)) return;
  lru_.Remove(slot);
  evictable_bytes_[headers_.at(slot).segment] -= BlockBytes(slot);
}

std::optional<Arena::Block> ObjectStore::AllocateOrEvict(uint64_t bytes) {
  auto block = arena_.Allocate(bytes);
  if (block || !eviction_) return block;
  // Evict in LRU order, but only from segments where evicting everything evictable would
  // make enough room: a create that cannot fit anyway must not empty the cache on its way
  // to failing. (Fragmentation can still defeat a segment that has the bytes.)
  const uint64_t need = arena_.ReservedSize(bytes);
  uint32_t victim = lru_.front();
  while (!block && victim != LruList::kNil) {
    const uint32_t segment = headers_.at(victim).segment;
    const uint32_t next = lru_.next(victim);
    if (arena_.free_bytes(segment) + evictable_bytes_[segment] >= need) {
      Evict(victim);
      // Only the victim's segment gained room.
      block = arena_.AllocateIn(segment, bytes);
    }
    victim = next;
  }
  return block;
}

uint32_t ObjectStore::AcquireSlot() {
  uint32_t slot = headers_.Acquire();
  if (slot == HeaderTable::kNoSlot && eviction_ && !lru_.empty()) {
    Evict(lru_.front());
    slot = headers_.Acquire();
  }
  return slot;
}

void ObjectStore::Evict(uint32_t slot) {
  const auto& h = headers_.at(slot);
  spdlog::debug("evicting {} ({})", ObjectId::FromWords(h.id_lo, h.id_hi).Hex(),
                ipc::FormatSize(h.data_size + h.metadata_size));
  counters_.evictions++;
  counters_.evicted_bytes += BlockBytes(slot);
  FreeObject(slot);
}

Result<Location> ObjectStore::Create(ClientId client, const CreateParams& p) {
  if (p.id.IsNil()) return Status::InvalidArgument("the nil object id (all zeros) is reserved");
  const uint64_t total = p.data_size + p.metadata.size();
  if (!p.data.empty() && p.data.size() != p.data_size) {
    return Status::InvalidArgument("inline data of " + std::to_string(p.data.size()) +
                                   " bytes for " + Describe(p.id) + " of " +
                                   std::to_string(p.data_size) + " bytes");
  }
  if (p.data_size > arena_.max_object_size() || total > arena_.max_object_size()) {
    return Status::InvalidArgument(
        Describe(p.id) + " of " + ipc::FormatSize(total) + " is larger than the largest object (" +
        ipc::FormatSize(arena_.max_object_size()) + "); start depotd with a larger --segment-size");
  }
  if (uint32_t existing = Find(p.id); existing != HeaderTable::kNoSlot) {
    const auto state = headers_.state(existing);
    return Status::AlreadyExists(
        Describe(p.id) +
        (state == ipc::ObjectState::kSealed
             ? (IsDeletePending(existing) ? " was deleted but is still referenced; it cannot be "
                                            "created again until released"
                                          : " exists already")
             : " is already being created"));
  }
  ClientState& state = clients_.at(client);
  DEPOT_RETURN_NOT_OK(CheckLimits(client, state, arena_.ReservedSize(total)));

  const uint32_t slot = AcquireSlot();
  if (slot == HeaderTable::kNoSlot) {
    return Status::LimitExceeded("the store holds " + std::to_string(headers_.slots()) +
                                 " objects, its limit; start depotd with a larger --max-objects");
  }
  auto block = AllocateOrEvict(total);
  if (!block) {
    headers_.Release(slot);
    return Status::OutOfMemory(OutOfMemoryMessage(p.id, total));
  }
  std::byte* bytes = arena_.base(block->segment) + block->offset;
  if (!p.data.empty()) std::memcpy(bytes, p.data.data(), p.data.size());
  if (!p.metadata.empty()) std::memcpy(bytes + p.data_size, p.metadata.data(), p.metadata.size());
  if (slot >= objects_.size()) objects_.resize(std::max<size_t>(slot + 1, objects_.size() * 2));
  objects_[slot] = Object{block->handle, client, p.checksum, false};
  auto& h = headers_.at(slot);
  h.id_lo = p.id.lo();
  h.id_hi = p.id.hi();
  h.data_size = p.data_size;
  h.metadata_size = p.metadata.size();
  h.offset = block->offset;
  h.segment = block->segment;
  h.flags.store(p.pin ? uint32_t{ipc::kFlagPinned} : 0u, std::memory_order_relaxed);
  h.checksum = 0;
  h.create_time_ns = h.access_time_ns = ipc::WallNanos();
  headers_.SetStateRefs(slot, ipc::ObjectState::kCreating, 0);
  index_.emplace(p.id, slot);
  if (!p.name.empty()) names_.emplace(slot, std::string(p.name));
  counters_.objects_creating++;
  counters_.bytes_in += total;
  if (p.pin) counters_.pinned_bytes += BlockBytes(slot);
  AddRef(client, state, slot);
  return LocationOf(slot);
}

void ObjectStore::AddRef(ClientId, ClientState& state, uint32_t slot) {
  const uint64_t refs = headers_.refs(slot);
  if (refs == 0) {
    MakeUnevictable(slot);
    counters_.held_bytes += BlockBytes(slot);
  }
  headers_.SetStateRefs(slot, headers_.state(slot), refs + 1);
  auto [it, inserted] = state.refs.try_emplace(slot, 0);
  if (inserted) state.held_bytes += BlockBytes(slot);
  it->second++;
}

void ObjectStore::DropRef(ClientState& state, uint32_t slot) {
  auto it = state.refs.find(slot);
  if (--it->second == 0) {
    state.held_bytes -= BlockBytes(slot);
    state.refs.erase(it);
  }
  const uint64_t refs = headers_.refs(slot) - 1;
  const auto st = headers_.state(slot);
  headers_.SetStateRefs(slot, st, refs);
  if (refs != 0) return;
  counters_.held_bytes -= BlockBytes(slot);
  if (st == ipc::ObjectState::kCreating) {
    // The creator let go of an object it never sealed: abort it. An object whose seal is
    // running on the worker pool is finished by FinishSeal instead.
    if (!objects_[slot].sealing) FreeObject(slot);
    return;
  }
  if (IsDeletePending(slot)) {
    FreeObject(slot);
  } else if (!(headers_.at(slot).flags & ipc::kFlagPinned)) {
    MakeEvictable(slot);
  }
}

void ObjectStore::FreeObject(uint32_t slot) {
  auto& h = headers_.at(slot);
  const ObjectId id = ObjectId::FromWords(h.id_lo, h.id_hi);
  const uint64_t bytes = BlockBytes(slot);
  if (headers_.state(slot) == ipc::ObjectState::kCreating) {
    counters_.objects_creating--;
  } else {
    counters_.objects_sealed--;
  }
  if (h.flags & ipc::kFlagPinned) counters_.pinned_bytes -= bytes;
  MakeUnevictable(slot);
  arena_.Free(h.segment, objects_[slot].alloc);
  index_.erase(id);
  names_.erase(slot);
  headers_.Release(slot);
}

void ObjectStore::Seal(ClientId client, const ObjectId& id, std::function<void(Status)> done) {
  const uint32_t slot = Find(id);
  if (slot == HeaderTable::kNoSlot) return done(Status::NotFound(Describe(id) + " does not exist"));
  if (headers_.state(slot) == ipc::ObjectState::kSealed || objects_[slot].sealing) {
    return done(Status::AlreadySealed(Describe(id) + " is already sealed"));
  }
  if (objects_[slot].creator != client) {
    return done(Status::NotHeld(Describe(id) + " is being created by another client"));
  }
  const auto& h = headers_.at(slot);
  if (!objects_[slot].want_checksum) {
    FinishSeal(slot, std::nullopt);
    return done(Status::OK());
  }
  const std::byte* bytes = arena_.base(h.segment) + h.offset;
  const uint64_t size = h.data_size + h.metadata_size;
  if (size < kInlineChecksumBytes) {
    FinishSeal(slot, XXH3_64bits(bytes, size));
    return done(Status::OK());
  }
  // The creator keeps its reference while the worker reads, so the bytes stay put; if it
  // disconnects meanwhile, FinishSeal sees no references and makes the object evictable.
  objects_[slot].sealing = true;
  boost::asio::post(workers_, [this, slot, bytes, size, done = std::move(done)]() mutable {
    const uint64_t sum = XXH3_64bits(bytes, size);
    boost::asio::post(loop_, [this, slot, sum, done = std::move(done)] {
      FinishSeal(slot, sum);
      done(Status::OK());
    });
  });
}

void ObjectStore::FinishSeal(uint32_t slot, std::optional<uint64_t> checksum) {
  auto& h = headers_.at(slot);
  objects_[slot].sealing = false;
  h.checksum = checksum.value_or(0);
  if (checksum) h.flags |= ipc::kFlagHasChecksum;
  const uint64_t refs = headers_.refs(slot);
  headers_.SetStateRefs(slot, ipc::ObjectState::kSealed, refs);
  counters_.objects_creating--;
  counters_.objects_sealed++;
  if (refs == 0 && !(h.flags & ipc::kFlagPinned)) MakeEvictable(slot);
  CompleteWaiters(slot);
}

Status ObjectStore::Abort(ClientId client, const ObjectId& id) {
  const uint32_t slot = Find(id);
  if (slot == HeaderTable::kNoSlot) return Status::NotFound(Describe(id) + " does not exist");
  if (headers_.state(slot) == ipc::ObjectState::kSealed || objects_[slot].sealing) {
    return Status::AlreadySealed(Describe(id) + " is sealed; delete it instead");
  }
  if (objects_[slot].creator != client) {
    return Status::NotHeld(Describe(id) + " is being created by another client");
  }
  // Only the creator can hold an unsealed object; dropping its references frees it.
  ClientState& state = clients_.at(client);
  uint32_t count = state.refs.at(slot);
  for (uint32_t i = 0; i < count; ++i) DropRef(state, slot);
  return Status::OK();
}

Status ObjectStore::Get(ClientId client, std::vector<ObjectId> ids, int64_t timeout_ms,
                        GetDone done) {
  ClientState& state = clients_.at(client);
  std::vector<GetResult> results(ids.size());
  size_t missing = 0;
  const uint64_t now = ipc::WallNanos();
  for (size_t i = 0; i < ids.size(); ++i) {
    const uint32_t slot = Find(ids[i]);
    if (slot != HeaderTable::kNoSlot && headers_.state(slot) == ipc::ObjectState::kSealed &&
        !IsDeletePending(slot)) {
      AddRef(client, state, slot);
      headers_.at(slot).access_time_ns = now;
      results[i].location = LocationOf(slot);
      counters_.get_hits++;
      counters_.bytes_out += results[i].location.data_size + results[i].location.metadata_size;
    } else {
      results[i].code = StatusCode::kNotFound;
      ++missing;
    }
  }
  if (missing == 0 || timeout_ms == 0) {
    done(std::move(results));
    return Status::OK();
  }
  if (limits_.max_pending_gets != 0 && state.pending_gets.size() >= limits_.max_pending_gets) {
    // Give back what this call granted: the request fails as a whole.
    for (size_t i = 0; i < ids.size(); ++i) {
      if (results[i].code == StatusCode::kOk) DropRef(state, results[i].location.slot);
    }
    return Status::LimitExceeded("client " + std::to_string(client) + " already has " +
                                 std::to_string(state.pending_gets.size()) +
                                 " gets waiting, its limit (--client-max-pending)");
  }
  const uint64_t pending_id = next_pending_++;
  PendingGet& get = pending_[pending_id];
  get.client = client;
  get.missing = missing;
  get.done = std::move(done);
  get.timer = std::make_unique<boost::asio::steady_timer>(loop_);
  for (size_t i = 0; i < ids.size(); ++i) {
    if (results[i].code != StatusCode::kOk) waiting_[ids[i]].push_back(pending_id);
  }
  counters_.get_waits += missing;
  get.ids = std::move(ids);
  get.results = std::move(results);
  state.pending_gets.push_back(pending_id);
  if (timeout_ms > 0) {
    get.timer->expires_after(std::chrono::milliseconds(timeout_ms));
    get.timer->async_wait([this, pending_id](const boost::system::error_code& ec) {
      if (!ec) ExpireGet(pending_id);
    });
  }
  return Status::OK();
}

void ObjectStore::ForgetWaits(uint64_t pending_id, const PendingGet& get) {
  for (size_t i = 0; i < get.ids.size(); ++i) {
    if (get.results[i].code == StatusCode::kOk) continue;
    auto w = waiting_.find(get.ids[i]);
    if (w == waiting_.end()) continue;
    std::erase(w->second, pending_id);
    if (w->second.empty()) waiting_.erase(w);
  }
}

void ObjectStore::ExpireGet(uint64_t pending_id) {
  auto it = pending_.find(pending_id);
  if (it == pending_.end()) return;
  PendingGet get = std::move(it->second);
  pending_.erase(it);
  ForgetWaits(pending_id, get);
  std::erase(clients_.at(get.client).pending_gets, pending_id);
  for (auto& r : get.results) {
    if (r.code != StatusCode::kOk) {
      r.code = StatusCode::kTimeout;
      counters_.get_timeouts++;
    }
  }
  get.done(std::move(get.results));
}

void ObjectStore::CompleteWaiters(uint32_t slot) {
  const auto& h = headers_.at(slot);
  const ObjectId id = ObjectId::FromWords(h.id_lo, h.id_hi);
  auto w = waiting_.find(id);
  if (w == waiting_.end()) return;
  std::vector<uint64_t> waiters = std::move(w->second);
  waiting_.erase(w);
  for (uint64_t pending_id : waiters) {
    auto it = pending_.find(pending_id);
    if (it == pending_.end()) continue;
    PendingGet& get = it->second;
    ClientState& state = clients_.at(get.client);
    for (size_t i = 0; i < get.ids.size(); ++i) {
      if (get.ids[i] != id || get.results[i].code == StatusCode::kOk) continue;
      AddRef(get.client, state, slot);
      get.results[i] = GetResult{StatusCode::kOk, LocationOf(slot)};
      counters_.bytes_out += h.data_size + h.metadata_size;
      --get.missing;
    }
    if (get.missing == 0) {
      PendingGet finished = std::move(get);
      pending_.erase(it);
      finished.timer->cancel();
      std::erase(state.pending_gets, pending_id);
      finished.done(std::move(finished.results));
    }
  }
}

Status ObjectStore::Release(ClientId client, std::span<const ObjectId> ids) {
  ClientState& state = clients_.at(client);
  Status first_error;
  for (const ObjectId& id : ids) {
    const uint32_t slot = Find(id);
    if (slot == HeaderTable::kNoSlot || !state.refs.contains(slot)) {
      if (first_error.ok()) {
        first_error = Status::NotHeld(Describe(id) + (slot == HeaderTable::kNoSlot
                                                          ? " does not exist"
                                                          : " is not held by this client"));
      }
      continue;
    }
    DropRef(state, slot);
  }
  return first_error;
}

std::vector<StatusCode> ObjectStore::Delete(std::span<const ObjectId> ids) {
  std::vector<StatusCode> out;
  out.reserve(ids.size());
  for (const ObjectId& id : ids) {
    const uint32_t slot = Find(id);
    if (slot == HeaderTable::kNoSlot || IsDeletePending(slot)) {
      out.push_back(StatusCode::kNotFound);
    } else if (headers_.state(slot) != ipc::ObjectState::kSealed) {
      out.push_back(StatusCode::kNotSealed);
    } else {
      out.push_back(StatusCode::kOk);
      if (headers_.refs(slot) == 0) {
        FreeObject(slot);
      } else {
        headers_.at(slot).flags |= ipc::kFlagDeletePending;
      }
    }
  }
  return out;
}

bool ObjectStore::Contains(const ObjectId& id) const {
  const uint32_t slot = Find(id);
  return slot != HeaderTable::kNoSlot && headers_.state(slot) == ipc::ObjectState::kSealed &&
         !IsDeletePending(slot);
}

bool ObjectStore::IsDeletePending(uint32_t slot) const {
  return (headers_.at(slot).flags & ipc::kFlagDeletePending) != 0;
}

ObjectStore::Page ObjectStore::List(uint32_t start, uint32_t limit) const {
  Page page;
  uint32_t slot = start;
  const uint32_t end = headers_.high_water();
  for (; slot < end && page.slots.size() < limit; ++slot) {
    if (headers_.state(slot) != ipc::ObjectState::kFree) page.slots.push_back(slot);
  }
  page.next = slot;
  page.done = slot >= end;
  return page;
}

std::string_view ObjectStore::NameOf(uint32_t slot) const {
  auto it = names_.find(slot);
  return it == names_.end() ? std::string_view() : std::string_view(it->second);
}

ClientUsage ObjectStore::UsageOf(ClientId client) const {
  ClientUsage usage;
  auto it = clients_.find(client);
  if (it == clients_.end()) return usage;
  usage.objects = it->second.refs.size();
  usage.bytes = it->second.held_bytes;
  for (const auto& [slot, count] : it->second.refs) usage.references += count;
  return usage;
}

std::vector<std::pair<ClientId, uint32_t>> ObjectStore::HoldersOf(uint32_t slot) const {
  std::vector<std::pair<ClientId, uint32_t>> holders;
  for (const auto& [client, state] : clients_) {
    if (auto it = state.refs.find(slot); it != state.refs.end()) {
      holders.emplace_back(client, it->second);
    }
  }
  std::sort(holders.begin(), holders.end());
  return holders;
}

struct ObjectStore::VerifyRun {
  std::vector<VerifyOutcome> outcomes;
  std::vector<uint32_t> held;  // by outcome: the slot the store holds for it, or kNoSlot
  size_t jobs_left = 0;
  VerifyDone done;
};

void ObjectStore::Verify(std::vector<ObjectId> ids, VerifyDone done) {
  if (ids.empty()) {
    for (uint32_t slot = 0; slot < headers_.high_water(); ++slot) {
      const auto& h = headers_.at(slot);
      if (headers_.state(slot) == ipc::ObjectState::kSealed && !IsDeletePending(slot) &&
          (h.flags & ipc::kFlagHasChecksum)) {
        ids.push_back(ObjectId::FromWords(h.id_lo, h.id_hi));
      }
    }
  }
  auto run = std::make_shared<VerifyRun>();
  run->outcomes.resize(ids.size());
  run->held.assign(ids.size(), HeaderTable::kNoSlot);
  run->done = std::move(done);
  ClientState& store_refs = clients_.at(kStoreClient);
  // Objects are hashed in jobs of about kInlineChecksumBytes, so that many small objects
  // cost few hand-offs and one large object does not wait behind others.
  struct Piece {
    size_t index;  // into run->outcomes
    const std::byte* bytes;
    uint64_t size;
  };
  std::vector<std::vector<Piece>> jobs;
  uint64_t job_bytes = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    VerifyOutcome& outcome = run->outcomes[i];
    outcome.id = ids[i];
    const uint32_t slot = Find(ids[i]);
    if (slot == HeaderTable::kNoSlot || IsDeletePending(slot)) {
      outcome.state = VerifyState::kNotFound;
      continue;
    }
    const auto& h = headers_.at(slot);
    if (headers_.state(slot) != ipc::ObjectState::kSealed) {
      outcome.state = VerifyState::kNotSealed;
    } else if (!(h.flags & ipc::kFlagHasChecksum)) {
      outcome.state = VerifyState::kNoChecksum;
    } else {
      outcome.expected = h.checksum;
      AddRef(kStoreClient, store_refs, slot);
      run->held[i] = slot;
      if (jobs.empty() || job_bytes >= kInlineChecksumBytes) {
        jobs.emplace_back();
        job_bytes = 0;
      }
      const uint64_t size = h.data_size + h.metadata_size;
      jobs.back().push_back({i, arena_.base(h.segment) + h.offset, size});
      job_bytes += size;
    }
  }
  if (jobs.empty()) return FinishVerify(run);
  run->jobs_left = jobs.size();
  for (auto& job : jobs) {
    boost::asio::post(workers_, [this, run, job = std::move(job)]() mutable {
      std::vector<uint64_t> sums;
      sums.reserve(job.size());
      for (const Piece& piece : job) sums.push_back(XXH3_64bits(piece.bytes, piece.size));
      boost::asio::post(loop_,
                        [this, run = std::move(run), job = std::move(job), sums = std::move(sums)] {
                          for (size_t k = 0; k < job.size(); ++k)
                            run->outcomes[job[k].index].actual = sums[k];
                          if (--run->jobs_left == 0) FinishVerify(run);
                        });
    });
  }
}

void ObjectStore::FinishVerify(const std::shared_ptr<VerifyRun>& run) {
  ClientState& store_refs = clients_.at(kStoreClient);
  for (size_t i = 0; i < run->outcomes.size(); ++i) {
    if (run->held[i] == HeaderTable::kNoSlot) continue;
    VerifyOutcome& outcome = run->outcomes[i];
    outcome.state = outcome.actual == outcome.expected ? VerifyState::kOk : VerifyState::kMismatch;
    DropRef(store_refs, run->held[i]);
  }
  run->done(std::move(run->outcomes));
}

EvictOutcome ObjectStore::EvictUnreferenced(uint64_t bytes, bool all) {
  EvictOutcome outcome;
  while (!lru_.empty() && (all || outcome.bytes < bytes)) {
    const uint32_t slot = lru_.front();
    outcome.objects++;
    outcome.bytes += BlockBytes(slot);
    Evict(slot);
  }
  return outcome;
}

}  // namespace depot::store
