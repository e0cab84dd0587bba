// The object table and everything that happens to objects: create, seal, get (waiting for
// seals), release, delete, abort, and eviction under memory pressure.
//
// Tiers. An object's bytes may be in host memory (the arena) and on any number of GPUs (their
// pools), a replica on each; references are per replica. A get on a tier where the object has
// no replica makes one: the copy runs on the worker pool and the get is answered when it is
// done. When a GPU pool is full, unreferenced extra replicas there are dropped first, then
// unreferenced objects whose only replica is there spill to host memory (their id stays
// valid); under host pressure, host replicas of objects that are also on a GPU go before
// whole objects are evicted.
//
// All of it runs on the daemon's one event-loop thread: no locks. Long work (checksums of
// large objects, copies between tiers) goes to the worker pool and posts its result back to
// the loop. The store knows clients only by ClientId; sessions (the network side) call in and
// get callbacks.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/thread_pool.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "depot/object_id.h"
#include "depot/status.h"
#include "store/arena.h"
#include "store/gpu/pool.h"
#include "store/header_table.h"
#include "store/log_limiter.h"
#include "store/lru_list.h"

namespace depot::store {

using ClientId = uint32_t;
// The daemon's own client id: it holds references under it to objects a verify is reading
// and to the sources of copies between tiers, so that neither goes meanwhile. Sessions are
// numbered from 1.
inline constexpr ClientId kDaemonClient = 0;

// A tier: host memory, or GPU pool k (k >= 0), numbered as on the wire.
inline constexpr int32_t kHost = -1;

struct Location {
  uint32_t slot = 0;
  uint32_t segment = 0;  // on a GPU: the chunk of its pool
  uint64_t offset = 0;
  uint64_t data_size = 0;
  uint64_t metadata_size = 0;
  int32_t device = kHost;
  // On a GPU: the metadata, kept in daemon memory. Valid until the store next changes.
  std::span<const std::byte> metadata;
};

struct CreateParams {
  ObjectId id;
  uint64_t data_size = 0;
  std::span<const std::byte> metadata;
  std::span<const std::byte> data;  // copied in by the daemon when given (one-round-trip put)
  std::string_view name;
  bool pin = false;
  bool checksum = false;
  int32_t device = kHost;
};

struct GetResult {
  // kOk, kNotFound, kTimeout, or why a copy to the asked tier failed (kOutOfMemory, ...)
  StatusCode code = StatusCode::kOk;
  Location location;
};

struct ClientLimits {
  uint64_t max_bytes = 0;         // bytes a client may hold (creating or referenced); 0: no limit
  uint32_t max_objects = 0;       // objects a client may hold; 0: no limit
  uint32_t max_pending_gets = 0;  // gets of one client waiting at once; 0: no limit
  // Daemon memory kept on a client's behalf (MetadataCost): the objects it created and its
  // waiting gets; 0: no limit. And the same for all clients together.
  uint64_t max_metadata_bytes = 0;
  uint64_t metadata_budget = 0;
};

// What the daemon's own memory holds for clients, as counted against ClientLimits: about
// this much per object (its table entries), plus its name, plus its metadata while that is
// kept in daemon memory (objects on a GPU), plus this much per id a get waits for.
inline constexpr uint64_t kObjectMetadataBytes = 256;
inline constexpr uint64_t kWaitingIdMetadataBytes = 200;

struct StoreCounters {
  uint64_t objects_sealed = 0;
  uint64_t objects_creating = 0;
  uint64_t held_bytes = 0;  // allocated to objects that are referenced or being created
  uint64_t pinned_bytes = 0;
  uint64_t evictions = 0;
  uint64_t evicted_bytes = 0;
  uint64_t bytes_in = 0;          // data and metadata of objects created in host memory
  uint64_t bytes_out = 0;         // of host objects handed out by gets
  uint64_t get_hits = 0;          // ids a get found sealed at once
  uint64_t get_waits = 0;         // ids a get had to wait for
  uint64_t get_timeouts = 0;      // ids still missing when a wait ran out
  uint64_t replicas_made = 0;     // copies made for gets on another tier
  uint64_t replicas_dropped = 0;  // extra copies dropped to make room
  uint64_t spills = 0;            // objects moved from a full GPU to host memory
  uint64_t spilled_bytes = 0;
  uint64_t objects_on_host = 0;  // with a host block: ready or being copied in
  uint64_t metadata_bytes = 0;   // daemon memory held for clients (kObjectMetadataBytes, ...)
  uint64_t request_bytes = 0;    // daemon memory held for requests (ChargeRequests)
};

// One GPU pool's use (status).
struct DeviceUsage {
  uint64_t held_bytes = 0;  // of replicas referenced or being created
  uint64_t replicas = 0;    // objects with a replica there
  uint64_t bytes_in = 0;    // data of objects created there (their metadata stays on host)
  uint64_t bytes_out = 0;   // of objects handed out there by gets
};

// One replica of an object (the admin `show` view).
struct ReplicaInfo {
  int32_t device = kHost;
  uint32_t segment = 0;  // arena segment, or chunk of the GPU's pool
  uint64_t offset = 0;
  uint32_t references = 0;
  bool ready = false;  // false while it is being copied
};

// A client's references to one object (the admin `show` view).
struct HolderInfo {
  ClientId client = 0;
  uint32_t references = 0;  // on all tiers together
  // (tier, references) for each tier it holds references on, host first.
  std::vector<std::pair<int32_t, uint32_t>> tiers;
};

// What a client holds (the admin `clients` view).
struct ClientUsage {
  uint64_t objects = 0;     // distinct objects referenced or being created
  uint64_t references = 0;  // references, all objects together
  uint64_t bytes = 0;       // allocated bytes of those objects
};

enum class VerifyState : uint8_t { kOk, kMismatch, kNoChecksum, kNotFound, kNotSealed, kNotOnHost };

struct VerifyOutcome {
  ObjectId id;
  VerifyState state = VerifyState::kNotFound;
  uint64_t expected = 0;  // the checksum taken at seal (kOk, kMismatch)
  uint64_t actual = 0;    // the checksum of the bytes now (kOk, kMismatch)
};

struct EvictOutcome {
  uint64_t objects = 0;  // evicted: gone from the store
  uint64_t bytes = 0;    // host bytes freed, host copies of objects also on a GPU included
};

class ObjectStore;

// Finds the n largest objects by data size (ties: oldest first) a slice of the header table
// at a time, so that a walk of a big store never holds the loop for long (Session runs one
// slice per turn). An object created or deleted while the scan runs may be missed; what
// Finish returns exists when it is called.
class LargestScan {
 public:
  explicit LargestScan(uint32_t n) : n_(n) {}
  // Looks at up to `max_slots` more slots; true once the whole table has been seen.
  bool Step(const ObjectStore& store, uint32_t max_slots);
  // The largest objects found that still exist, largest first, with their ids.
  std::vector<std::pair<uint32_t, ObjectId>> Finish(const ObjectStore& store);

 private:
  struct Entry {
    uint64_t data_size;
    uint64_t create_time_ns;
    uint32_t slot;
    ObjectId id;
  };
  // Heap order: the smallest of the n kept so far on top.
  static bool Larger(const Entry& a, const Entry& b);

  uint32_t n_;
  uint32_t next_ = 0;
  std::vector<Entry> heap_;
};

class ObjectStore {
 public:
  // `pools`: one per GPU, in device order (empty: no GPUs). They must outlive the store.
  ObjectStore(boost::asio::io_context& loop, boost::asio::thread_pool& workers, Arena& arena,
              HeaderTable& headers, ClientLimits limits, bool eviction,
              std::vector<gpu::DevicePool*> pools = {});
  ~ObjectStore();
  ObjectStore(const ObjectStore&) = delete;
  ObjectStore& operator=(const ObjectStore&) = delete;

  // Counts `bytes` more (or, negative, fewer) of memory the daemon keeps for `client`'s
  // requests in progress (its session's read buffer beyond the first MiB, the work of its
  // lists and verifies). They have an account of their own, with the same limits as the
  // metadata (--client-max-metadata, --metadata-budget), so that a store full of objects can
  // still be sent the large delete that empties it. Fails with LimitExceeded, counting
  // nothing, if more would pass either limit.
  Status ChargeRequests(ClientId client, int64_t bytes);
  // `uid`: its session's (SO_PEERCRED); the objects it creates are that uid's.
  void AddClient(ClientId client, uint32_t uid);
  // Gives back everything the client held: references released, objects it was creating
  // aborted, its waiting gets dropped (their callbacks are never called).
  void RemoveClient(ClientId client);

  // Reserves and publishes (as creating) a new object; the creator holds one reference.
  // Evicts least-recently-used unreferenced objects when it must; on a GPU, may first wait
  // for objects to spill to host memory. `done` runs on the loop thread, at once for host
  // objects. It is dropped uncalled if the client goes away meanwhile.
  using CreateDone = std::function<void(Result<Location>)>;
  void Create(ClientId client, const CreateParams& params, CreateDone done);

  // Seals: `done` runs on the loop thread, at once or after a checksum on the worker pool.
  void Seal(ClientId client, const ObjectId& id, std::function<void(Status)> done);
  Status Abort(ClientId client, const ObjectId& id);

  using GetDone = std::function<void(std::vector<GetResult>)>;
  // Answers `done` (possibly before returning) with one result per id, located on `device`;
  // an OK result grants the client a reference to that replica. Waits up to `timeout_ms`
  // (-1: for ever) for missing ids, and for as long as copies to `device` take. Returns an
  // error, and never calls `done`, if the client has too many gets waiting or `device` is
  // not a tier of this store.
  Status Get(ClientId client, std::vector<ObjectId> ids, int32_t device, int64_t timeout_ms,
             GetDone done);

  // Releases one reference per id on `device`. Returns NotHeld naming the first id the
  // client did not hold there; the others are released all the same.
  Status Release(ClientId client, std::span<const ObjectId> ids, int32_t device = kHost);

  std::vector<StatusCode> Delete(std::span<const ObjectId> ids);
  bool Contains(const ObjectId& id) const;

  // Live slots from `start` on, at most `limit` of them, looking at no more than `max_scan`
  // slots (so a page may be empty and not done), and where the next page starts. With
  // kVerifiable, only objects Verify can check: sealed, not deleted, with a checksum.
  enum class Filter : uint8_t { kAll, kVerifiable };
  struct Page {
    std::vector<uint32_t> slots;
    uint32_t next = 0;
    bool done = true;
  };
  Page List(uint32_t start, uint32_t limit, uint32_t max_scan, Filter filter = Filter::kAll) const;
  // The id of the object in a live slot.
  ObjectId IdAt(uint32_t slot) const;
  // Whether `slot` still holds the object `id` (the admin views check this between slices).
  bool Holds(uint32_t slot, const ObjectId& id) const;
  // The uid that created the object in `slot`.
  uint32_t OwnerOf(uint32_t slot) const { return objects_[slot].owner; }
  // The display name of the object in `slot`, empty if it has none.
  std::string_view NameOf(uint32_t slot) const;
  bool IsDeletePending(uint32_t slot) const;

  // Admin views and actions (depotctl). They may walk every client or object: they are for
  // people, not for hot paths.

  // The live slot of `id`, or HeaderTable::kNoSlot.
  uint32_t SlotOf(const ObjectId& id) const { return Find(id); }
  // What `client` holds; all zero for an unknown client.
  ClientUsage UsageOf(ClientId client) const;
  // The clients holding references to the object in `slot`, with how many each, in all and
  // by tier, in client id order (kDaemonClient first, while a verify or a copy reads it).
  std::vector<HolderInfo> HoldersOf(uint32_t slot) const;
  // Objects with a copy in host memory, ready or being made.
  uint64_t ObjectsOnHost() const { return counters_.objects_on_host; }
  // The replicas of the object in `slot`: host first, then GPUs in device order.
  std::vector<ReplicaInfo> ReplicasOf(uint32_t slot) const;
  // The tiers the object in `slot` has ready bytes on (ObjectHeader::tiers).
  uint64_t TiersOf(uint32_t slot) const;

  using VerifyDone = std::function<void(std::vector<VerifyOutcome>)>;
  // Recomputes the checksums of `ids` and compares them with those taken at seal. The hashing runs
  // on the worker pool; the store holds a reference to each object meanwhile, so it is neither
  // evicted nor freed under the reader. `done` runs on the loop thread with one outcome per id, in
  // order: at once if there is nothing to hash, else when the last worker reports back.
  void Verify(std::vector<ObjectId> ids, VerifyDone done);

  // Evicts sealed, unreferenced, unpinned objects in LRU order until at least `bytes` are
  // freed or none is left; with `all`, every one of them. Counted as evictions.
  EvictOutcome EvictUnreferenced(uint64_t bytes, bool all);

  const StoreCounters& counters() const { return counters_; }
  const ClientLimits& limits() const { return limits_; }
  std::span<gpu::DevicePool* const> pools() const { return pools_; }
  const DeviceUsage& device_usage(uint32_t device) const { return device_usage_[device]; }
  const HeaderTable& headers() const { return headers_; }
  const Arena& arena() const { return arena_; }
  bool eviction_enabled() const { return eviction_; }

 private:
  struct Replica {  // an object's bytes on a GPU
    int32_t device = 0;
    uint32_t chunk = 0;
    uint32_t alloc = 0;  // allocator handle in the chunk
    uint64_t offset = 0;
    uint32_t refs = 0;
    bool ready = false;     // its bytes are there (false while being copied in)
    bool spilling = false;  // being copied to host memory, to be dropped after
  };
  struct Object {        // daemon-only state of a live slot
    uint32_t alloc = 0;  // allocator handle in the header's segment (when on_host)
    uint32_t owner = 0;  // the uid of its creator's session (SO_PEERCRED)
    // The session that created it: the one that may seal or abort it while it is being
    // created, and whose metadata_bytes count it for its whole life.
    ClientId creator = 0;
    bool want_checksum = false;
    bool sealing = false;        // checksum running on the worker pool
    bool on_host = true;         // has a host block: alloc and the header's location are valid
    bool host_ready = true;      // the host block holds the bytes (false while copied in)
    uint32_t host_refs = 0;      // references to the host replica
    uint32_t metadata_cost = 0;  // counted in metadata_bytes (its creator's and all)
    // What only an object that has been on a GPU needs, on the heap: most never are.
    struct GpuCopies {
      std::vector<Replica> replicas;    // few: found by linear search
      std::vector<std::byte> metadata;  // kept here once the object has a GPU replica
    };
    std::unique_ptr<GpuCopies> gpu;  // null until it first goes to a GPU
  };
  // An Object is kept for every slot ever used: keep it small (bench_memory).
  static_assert(sizeof(Object) <= 32);
  // The object's GPU replicas (none if it never had one).
  static std::span<Replica> Replicas(Object& o) {
    return o.gpu ? std::span<Replica>(o.gpu->replicas) : std::span<Replica>();
  }
  static std::span<const Replica> Replicas(const Object& o) {
    return o.gpu ? std::span<const Replica>(o.gpu->replicas) : std::span<const Replica>();
  }
  // Its GPU record, made on first use.
  static Object::GpuCopies& GpuCopiesOf(Object& o) {
    if (!o.gpu) o.gpu = std::make_unique<Object::GpuCopies>();
    return *o.gpu;
  }
  // A client's references are per (slot, tier): RefKey packs the pair.
  static uint64_t RefKey(uint32_t slot, int32_t device) {
    return (uint64_t{slot} << 8) | static_cast<uint8_t>(device + 1);
  }
  static uint32_t SlotOfKey(uint64_t key) { return static_cast<uint32_t>(key >> 8); }
  static int32_t DeviceOfKey(uint64_t key) { return static_cast<int32_t>(key & 0xff) - 1; }
  struct ClientState {
    uint32_t uid = 0;  // its session's, from SO_PEERCRED (the daemon's own for kDaemonClient)
    std::unordered_map<uint64_t, uint32_t> refs;  // RefKey -> references held
    // Kept as refs changes, so that the admin views cost no walk of it: all its references,
    // and the distinct objects they are to.
    uint64_t references = 0;
    uint64_t objects = 0;
    uint64_t held_bytes = 0;
    uint64_t metadata_bytes = 0;  // MetadataCost of its objects and waiting gets
    uint64_t request_bytes = 0;   // ChargeRequests
    std::vector<uint64_t> pending_gets;
  };
  enum class Wait { kNone, kSeal, kCopy };
  struct PendingGet {
    ClientId client = 0;
    int32_t device = kHost;
    std::vector<ObjectId> ids;
    std::vector<GetResult> results;
    std::vector<Wait> waits;  // by id: what it still waits for
    size_t missing = 0;
    std::unique_ptr<boost::asio::steady_timer> timer;
    GetDone done;
    uint64_t metadata_cost = 0;
  };
  // A copy of an object to another tier, in flight or waiting for room there.
  struct Transfer {
    int32_t source = kHost;
    bool spill = false;             // drop the source replica after, if nobody holds it
    std::vector<uint64_t> waiters;  // pending gets
  };
  // A create or copy on a GPU waiting for spills to make room.
  using RoomDone = std::function<void(std::optional<gpu::DevicePool::Block>)>;
  struct RoomWait {
    uint64_t bytes = 0;
    RoomDone then;
  };

  uint32_t Find(const ObjectId& id) const;
  // Whether `state` holds references to the object in `slot` on another tier than `device`.
  bool HoldsOnAnotherTier(const ClientState& state, uint32_t slot, int32_t device) const;
  uint64_t BlockBytes(uint32_t slot) const;
  uint64_t TierBytes(uint32_t slot, int32_t device) const;
  Location LocationOf(uint32_t slot, int32_t device = kHost) const;
  Replica* FindReplica(uint32_t slot, int32_t device);
  const Replica* FindReplica(uint32_t slot, int32_t device) const;
  bool IsReady(uint32_t slot, int32_t device) const;
  // Whether the object has ready bytes on a tier other than `device`.
  bool HasOtherCopy(uint32_t slot, int32_t device) const;
  uint32_t& TierRefs(uint32_t slot, int32_t device);
  void PublishTiers(uint32_t slot);
  Status CheckDevice(int32_t device) const;
  void CreateOnHost(ClientId client, const CreateParams& params, CreateDone done);
  void CreateOnDevice(ClientId client, const CreateParams& params, CreateDone done);
  // Fills in the header and tables of a new object whose bytes are placed.
  uint32_t Publish(ClientId client, const CreateParams& params, uint32_t slot);
  // What creating `params` costs the daemon's memory before any GPU metadata.
  static uint64_t CreateCost(const CreateParams& params);
  // Counts a get's bytes handed out on `device` (StoreCounters, DeviceUsage).
  void CountBytesOut(int32_t device, const Location& location);
  Status CheckLimits(ClientId client, const ClientState& state, uint64_t bytes) const;
  // Whether `client` may have the daemon keep `bytes` more for it (ClientLimits' metadata
  // limits); LimitExceeded naming the limit if not.
  Status CheckMetadata(ClientId client, const ClientState& state, uint64_t bytes) const;
  // Counts `bytes` more (or, negative, fewer) of daemon memory for `client` and in all.
  void CountMetadata(ClientId client, int64_t bytes);
  // Counts `bytes` more for the object in `slot`, against its creator.
  void ChargeObject(uint32_t slot, uint64_t bytes);
  // Gives back what a finished, expired or dropped waiting get counted.
  void UncountWait(const PendingGet& get);
  std::optional<Arena::Block> AllocateOrEvict(uint64_t bytes);
  // A free header slot, evicting the least recently used object if the table is full.
  uint32_t AcquireSlot();
  // Makes room in host memory by taking the object in `slot` out of it: drops its host
  // replica if it has another (a replica dropped, not an eviction), else evicts it. Returns
  // whether the object itself went.
  bool FreeHostBlock(uint32_t slot);
  void DropHostReplica(uint32_t slot);
  void DropDeviceReplica(uint32_t slot, int32_t device);
  // Puts the object in, or takes it out of, the LRU lists of its tiers, as its state says.
  // A replica that stays a candidate keeps its place.
  void Reconsider(uint32_t slot);
  bool HostEvictable(uint32_t slot) const;
  void MakeEvictable(uint32_t slot);
  void MakeUnevictable(uint32_t slot);
  void AddRef(ClientId client, ClientState& state, uint32_t slot, int32_t device = kHost);
  // Drops one of the client's references; frees or aborts the object when it was the last.
  void DropRef(ClientState& state, uint32_t slot, int32_t device = kHost);
  // Room on a GPU: allocates at once if it can (dropping extra replicas), else starts
  // spills and calls `then` when they made room, or with nullopt when nothing can.
  void AllocateOnDevice(int32_t device, uint64_t bytes, RoomDone then);
  std::optional<gpu::DevicePool::Block> AllocateDroppingReplicas(int32_t device, uint64_t bytes);
  // Starts spilling LRU objects off `device` until enough bytes are on their way out;
  // returns whether any spill is in flight.
  bool StartSpills(int32_t device, uint64_t bytes);
  void ServeRoomWaits(int32_t device);
  // ServeRoomWaits soon, from the loop, if anything waits for room on `device`.
  void ScheduleRoomWaits(int32_t device);
  // Copies the object in `slot` to `device` unless a copy is under way; `pending_id` (0:
  // none) waits for it.
  void StartTransfer(uint32_t slot, int32_t device, bool spill, uint64_t pending_id);
  // Runs the copy of a transfer whose destination is placed, on the worker pool.
  void RunCopy(uint32_t slot, int32_t device);
  void FinishTransfer(uint32_t slot, int32_t device, Status status);
  // Grants a waiting get the replica on its tier, or tells it why not.
  void Answer(uint64_t pending_id, uint32_t slot, const ObjectId& id, StatusCode failure);
  void FinishGetIfDone(uint64_t pending_id);
  void FinishSeal(uint32_t slot, std::optional<uint64_t> checksum);
  void FreeObject(uint32_t slot);
  void CompleteWaiters(uint32_t slot);
  void ExpireGet(uint64_t pending_id);
  void ForgetWaits(uint64_t pending_id, const PendingGet& get);
  std::string OutOfMemoryMessage(const ObjectId& id, uint64_t bytes) const;
  std::string DeviceOutOfMemoryMessage(int32_t device, const ObjectId& id, uint64_t bytes) const;
  // "host memory" or the GPU's name.
  std::string TierName(int32_t device) const;
  struct VerifyRun;
  // Gives back the references a Verify took, fills in its outcomes and answers it.
  void FinishVerify(const std::shared_ptr<VerifyRun>& run);

  boost::asio::io_context& loop_;
  boost::asio::thread_pool& workers_;
  Arena& arena_;
  HeaderTable& headers_;
  const ClientLimits limits_;
  const bool eviction_;

  std::unordered_map<ObjectId, uint32_t> index_;  // live objects -> header slot
  std::vector<Object> objects_;                   // by slot
  std::unordered_map<uint32_t, std::string> names_;
  LruList lru_;  // host replicas that can go (HostEvictable): the eviction candidates
  std::vector<uint64_t> evictable_bytes_;  // by segment: bytes of the objects in lru_
  std::vector<gpu::DevicePool*> pools_;
  std::vector<LruList> device_lru_;  // by device: ready, unreferenced replicas there
  std::vector<DeviceUsage> device_usage_;
  std::vector<std::vector<RoomWait>> room_waits_;               // by device, oldest first
  std::vector<uint32_t> spills_in_flight_;                      // by device
  std::map<std::pair<uint32_t, int32_t>, Transfer> transfers_;  // (slot, destination tier)
  std::unordered_set<ObjectId> creating_;                       // GPU creates waiting for room
  std::unordered_map<ClientId, ClientState> clients_;
  std::unordered_map<uint64_t, PendingGet> pending_;
  std::unordered_map<ObjectId, std::vector<uint64_t>> waiting_;  // id -> pending gets
  uint64_t next_pending_ = 1;
  StoreCounters counters_;
  LogLimiter copy_failure_log_;
};

}  // namespace depot::store
