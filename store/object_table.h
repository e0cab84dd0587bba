// The object table: which objects exist, in which header slot, and where their copies are.
//
// An object lives in one slot of the shared header table (what clients read) and has a
// record here in daemon memory (what the daemon decides on): its creator, and one Replica
// for each copy of its bytes, whatever the tier. Host memory is a tier like any GPU: the
// host copy is a replica too, and the table writes its place into the header for clients.
//
// The table knows nothing of clients' references, waits, eviction or copies; the store and
// its other parts keep those and ask the table what an object is and where its bytes are.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "depot/object_id.h"
#include "store/header_table.h"
#include "store/tier_pool.h"

namespace depot::store {

using ClientId = uint32_t;

// One copy of an object's bytes, on one tier.
struct Replica {
  uint32_t region = 0;  // arena segment or GPU pool chunk
  uint32_t handle = 0;  // of its block, in the region's allocator
  uint32_t refs = 0;    // references to this copy, all clients together
  int8_t tier = kHost;
  bool ready = false;     // its bytes are there: false while being created or copied in
  bool spilling = false;  // being copied to host memory, to be dropped after
  // The task graph (kSchedulerClient) holds a reference to it for tasks waiting to read it.
  // Such a copy may still spill, the reference moving with it (ObjectStore::CopyDone): a
  // GPU's to host memory, host memory's to disk where there is a spill directory
  // (EvictionPolicy::GraphHoldMoves). Waiting tasks pin no memory the store could free so.
  bool graph_held = false;

  // Whether its bytes are held where they are: referenced by anyone but the graph alone
  // where the graph's reference may move (`graph_moves`).
  bool held_here(bool graph_moves) const { return refs > (graph_held && graph_moves ? 1u : 0u); }
};
static_assert(sizeof(Replica) == 16);

// An object's replicas, at most one per tier. Most objects only ever have the one they were
// created with, so the first is kept inline and the rest on the heap.
class ReplicaSet {
 public:
  size_t size() const { return first_.tier == kNone ? 0 : 1 + (more_ ? more_->copies.size() : 0); }
  bool empty() const { return first_.tier == kNone; }
  Replica& operator[](size_t i) { return i == 0 ? first_ : more_->copies[i - 1]; }
  const Replica& operator[](size_t i) const { return i == 0 ? first_ : more_->copies[i - 1]; }
  // Calls `f(replica)` for each replica.
  template <typename F>
  void ForEach(F&& f) const {
    if (empty()) return;
    f(first_);
    if (more_) {
      for (const Replica& r : more_->copies) f(r);
    }
  }
  // The replica on `tier`, or null. The first is the only one for most objects: checked
  // without a loop (an empty set's kNone is no tier).
  Replica* Find(int32_t tier) { return first_.tier == tier ? &first_ : FindMore(tier); }
  const Replica* Find(int32_t tier) const { return const_cast<ReplicaSet*>(this)->Find(tier); }
  // Adds a replica on a tier the object has none on.
  Replica& Add(const Replica& replica);
  // Removes the replica on `tier`, if any.
  void Remove(int32_t tier);

  // The object's metadata, kept in daemon memory once it has a copy on a tier whose
  // replicas hold data only (a GPU). Empty until then.
  std::span<const std::byte> kept_metadata() const {
    return more_ ? std::span<const std::byte>(more_->metadata) : std::span<const std::byte>();
  }
  std::vector<std::byte>& kept_metadata() { return More().metadata; }

 private:
  static constexpr int8_t kNone = -2;
  Replica* FindMore(int32_t tier);
  struct Spare {
    std::vector<Replica> copies;  // after the first
    std::vector<std::byte> metadata;
  };
  Spare& More() {
    if (!more_) more_ = std::make_unique<Spare>();
    return *more_;
  }

  Replica first_{.tier = kNone};
  std::unique_ptr<Spare> more_;
};

// Daemon-only state of a live slot.
struct Object {
  uint32_t owner = 0;  // the uid of its creator's session (SO_PEERCRED)
  // The session that created it: the one that may seal or abort it while it is being
  // created, and whose metadata account counts it for its whole life.
  ClientId creator = 0;
  uint32_t metadata_cost = 0;  // daemon memory counted for it (its creator's and all)
  bool want_checksum = false;
  bool sealing = false;  // checksum running on the worker pool
  // Sealed as failed (ObjectStore::SealFailed): no bytes, a message (ObjectTable::FailureOf)
  // that gets answer with TaskFailed, and one empty host block that references, eviction and
  // deletes treat as any object's.
  bool failed = false;
  // A client's lease table held its host copy when the daemon last looked (Leases): the copy
  // counts as referenced until a look finds no lease.
  bool leased = false;
  ReplicaSet replicas;
};

// Everything but the bytes of a new object.
struct NewObject {
  ObjectId id;
  uint64_t data_size = 0;
  uint64_t metadata_size = 0;
  std::string_view name;
  bool pin = false;
  bool checksum = false;
  bool spill = true;
  ClientId creator = 0;
  uint32_t owner = 0;
};

class ObjectTable {
 public:
  explicit ObjectTable(HeaderTable& headers) : headers_(headers) {}

  // The live slot of `id`, or HeaderTable::kNoSlot.
  uint32_t Find(const ObjectId& id) const;
  // Publishes a new object, being created, in `slot` (from HeaderTable::Acquire): header,
  // record and name, with no replica and no references yet.
  void Insert(uint32_t slot, const NewObject& object);
  // Forgets the object in `slot` and frees the slot. Its replicas must be gone already.
  void Remove(uint32_t slot);

  Object& at(uint32_t slot) { return objects_[slot]; }
  const Object& at(uint32_t slot) const { return objects_[slot]; }
  ipc::ObjectHeader& header(uint32_t slot) { return headers_.at(slot); }
  const ipc::ObjectHeader& header(uint32_t slot) const { return headers_.at(slot); }
  HeaderTable& headers() { return headers_; }
  const HeaderTable& headers() const { return headers_; }

  ObjectId IdAt(uint32_t slot) const;
  // Whether `slot` still holds the object `id`.
  bool Holds(uint32_t slot, const ObjectId& id) const;
  std::string_view NameOf(uint32_t slot) const;
  // Marks the object in `slot` (just inserted) as failed with `message`, which it keeps until
  // it is removed.
  void SetFailed(uint32_t slot, std::shared_ptr<const std::string> message);
  bool IsFailed(uint32_t slot) const { return objects_[slot].failed; }
  // The message of a failed object; null for any other.
  const std::shared_ptr<const std::string>& FailureOf(uint32_t slot) const;
  bool IsSealed(uint32_t slot) const { return headers_.state(slot) == ipc::ObjectState::kSealed; }
  bool IsDeletePending(uint32_t slot) const {
    return (headers_.at(slot).flags.load(std::memory_order_relaxed) & ipc::kFlagDeletePending) != 0;
  }
  bool IsPinned(uint32_t slot) const {
    return (headers_.at(slot).flags.load(std::memory_order_relaxed) & ipc::kFlagPinned) != 0;
  }
  // Its creator opted out of spilling to disk: it is evicted for good instead.
  bool IsNoSpill(uint32_t slot) const {
    return (headers_.at(slot).flags.load(std::memory_order_relaxed) & ipc::kFlagNoSpill) != 0;
  }
  // Sealed and not deleted: what a get may hand out.
  bool IsUsable(uint32_t slot) const { return IsSealed(slot) && !IsDeletePending(slot); }

  // Bytes a replica on a tier holds: data, and on the host and disk the metadata after it.
  uint64_t BytesOn(uint32_t slot, int32_t tier) const {
    const auto& h = headers_.at(slot);
    return h.data_size + (tier == kHost || tier == kDisk ? h.metadata_size : 0);
  }
  // A tier's bit in ObjectHeader::tiers.
  static uint64_t BitOf(int32_t tier) {
    return tier == kDisk ? ipc::kTierDisk : ipc::TierBit(tier);
  }
  // Adds a replica of the object in `slot` in `block` of `tier`; the host one's place goes
  // into the header. Not ready, so not published in the header's tiers yet.
  Replica& AddReplica(uint32_t slot, int32_t tier, const TierPool::Block& block);
  Replica* FindReplica(uint32_t slot, int32_t tier) { return objects_[slot].replicas.Find(tier); }
  const Replica* FindReplica(uint32_t slot, int32_t tier) const {
    return objects_[slot].replicas.Find(tier);
  }
  bool IsReady(uint32_t slot, int32_t tier) const {
    const Replica* r = FindReplica(slot, tier);
    return r != nullptr && r->ready;
  }
  // Whether the object has ready bytes on a tier other than `tier`.
  bool HasOtherCopy(uint32_t slot, int32_t tier) const;
  // The tiers with ready bytes (ObjectHeader::tiers), and the same written to the header.
  uint64_t TiersOf(uint32_t slot) const;
  void PublishTiers(uint32_t slot);

  // Live slots from `start` on, at most `limit` of them, looking at no more than `max_scan`
  // slots (so a page may be empty and not done), and where the next page starts. With
  // kVerifiable, only sealed, not deleted objects with a checksum.
  enum class Filter : uint8_t { kAll, kVerifiable };
  struct Page {
    std::vector<uint32_t> slots;
    uint32_t next = 0;
    bool done = true;
  };
  Page List(uint32_t start, uint32_t limit, uint32_t max_scan, Filter filter) const;

 private:
  HeaderTable& headers_;
  std::unordered_map<ObjectId, uint32_t> index_;  // live objects -> header slot
  std::vector<Object> objects_;                   // by slot
  std::unordered_map<uint32_t, std::string> names_;
  std::unordered_map<uint32_t, std::shared_ptr<const std::string>> failures_;  // failed objects
};

// An Object is kept for every slot ever used: keep it small (bench_memory).
static_assert(sizeof(Object) <= 40);

}  // namespace depot::store
