// The store: create, seal, get (waiting for seals and copies), release, delete, abort, and
// room made under memory pressure, on every tier.
//
// Failed objects. The scheduler seals the outputs of a task that failed as failed objects
// (SealFailed): each takes its id, is counted, held, deleted and evicted like any sealed
// object, has no bytes (an empty block in host memory, which gives it a place in the
// eviction order), and keeps its message in daemon memory; a get of it answers TaskFailed
// with the message. No client request makes one.
//
// Tiers. An object's bytes may be in host memory (the arena) and on any number of GPUs (their
// pools), a replica on each, all of one kind (ObjectTable); references are per replica. A
// get on a tier where the object has no replica makes one: the copy runs on the worker pool
// and the get is answered when it is done. When a GPU pool is full, unreferenced extra
// replicas there are dropped first, then unreferenced objects whose only replica is there
// spill to host memory (their id stays valid); under host pressure, host replicas of
// objects that are also on a GPU go before whole objects are evicted (EvictionPolicy).
//
// The store is a front over parts that each own one concern and are tested on their own:
// ObjectTable (ids, slots, headers, names, replicas), ClientAccounts (references and limits
// per client), WaitingGets (gets waiting for seals or copies, and their time-outs),
// EvictionPolicy (which copies may go, in which order) and Tiers (each tier's memory, making
// room, and the copies between tiers). The store keeps the parts in step: references,
// answers to gets, events.
//
// All of it runs on the daemon's one event-loop thread: no locks. Long work (checksums of
// large objects, copies between tiers) goes to an Executor and comes back to the loop. The
// store knows clients only by ClientId; sessions (the network side) call in and get
// callbacks; listeners inside the daemon (the scheduler) get StoreEvents.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_set>
#include <utility>
#include <vector>

#include "depot/object_id.h"
#include "depot/status.h"
#include "store/arena.h"
#include "store/client_accounts.h"
#include "store/eviction_policy.h"
#include "store/executor.h"
#include "store/gpu/pool.h"
#include "store/handoff_deadlines.h"
#include "store/header_table.h"
#include "store/leases.h"
#include "store/log_limiter.h"
#include "store/object_table.h"
#include "store/store_events.h"
#include "store/tiers.h"
#include "store/waiting_gets.h"

namespace depot::store {

struct CreateParams {
  ObjectId id;
  uint64_t data_size = 0;
  std::span<const std::byte> metadata;
  std::span<const std::byte> data;  // copied in by the daemon when given (one-round-trip put)
  std::string_view name;
  bool pin = false;
  bool checksum = false;
  bool spill = true;  // may spill to disk (--spill-dir); false: evicted for good instead
  int32_t device = kHost;
};

// What the daemon's own memory holds for clients, as counted against ClientLimits: about
// this much per object (its table entries), plus its name, plus its metadata while that is
// kept in daemon memory (objects on a GPU), plus this much per id a get waits for.
inline constexpr uint64_t kObjectMetadataBytes = 256;
inline constexpr uint64_t kWaitingIdMetadataBytes = 200;
// The most references one client may hold to one object on one tier, and all clients
// together to one replica: far past any use (a get of one id many times in one batch),
// and short of wrapping the 32-bit counts (Replica::refs, ClientAccounts' per-object count).
inline constexpr uint32_t kMaxClientReferences = 1u << 20;
inline constexpr uint32_t kMaxReplicaReferences = 1u << 31;

struct StoreCounters {
  uint64_t objects_sealed = 0;
  uint64_t objects_creating = 0;
  uint64_t held_bytes = 0;  // host bytes allocated to objects referenced or being created
  uint64_t pinned_bytes = 0;
  uint64_t evictions = 0;
  uint64_t evicted_bytes = 0;
  uint64_t bytes_in = 0;          // data and metadata of objects created in host memory
  uint64_t bytes_out = 0;         // of host objects handed out by gets
  uint64_t get_hits = 0;          // ids a get found sealed at once
  uint64_t get_waits = 0;         // ids a get had to wait for
  uint64_t get_timeouts = 0;      // ids still missing when a wait ran out
  uint64_t leased_reads = 0;      // hits read through leases, as clients report them
  uint64_t replicas_made = 0;     // copies made for gets on another tier
  uint64_t replicas_dropped = 0;  // extra copies dropped to make room
  uint64_t spills = 0;            // objects moved from a full GPU to host memory
  uint64_t spilled_bytes = 0;
  uint64_t objects_on_host = 0;  // with a host block: ready or being copied in
  uint64_t metadata_bytes = 0;   // daemon memory held for clients (kObjectMetadataBytes, ...)
  uint64_t request_bytes = 0;    // daemon memory held for requests (ChargeRequests)
};

// What the admin views (list, show) say of one object: a value read from the store's own
// tables, valid after the store changes.
struct ObjectView {
  ObjectId id;
  std::string name;
  bool sealed = false;
  bool failed = false;  // sealed as failed (SealFailed): no bytes
  uint64_t data_size = 0;
  uint64_t metadata_size = 0;
  uint64_t references = 0;  // all clients' and the daemon's, all tiers together
  bool pinned = false;
  bool delete_pending = false;
  bool has_checksum = false;
  uint64_t checksum = 0;
  uint64_t create_time_ns = 0;
  uint64_t access_time_ns = 0;
  uint32_t segment = 0;  // of its host copy, when it has one
  uint64_t offset = 0;
  uint64_t tiers = 0;  // with ready bytes (ObjectHeader::tiers)
  uint32_t owner_uid = 0;
};

// Where an object's bytes are (Locate): what the scheduler places tasks by.
struct Placement {
  bool found = false;      // sealed and not deleted
  bool failed = false;     // found, and sealed as failed: no bytes, the rest is zero
  bool creating = false;   // not found: being created (not sealed yet)
  uint64_t tiers = 0;      // with ready bytes (ObjectHeader::tiers bits)
  uint64_t arriving = 0;   // with a copy being made (for a get, a prefetch or a spill)
  uint64_t data_size = 0;  // bytes on each tier (host copies also hold the metadata)
  uint64_t metadata_size = 0;
};

// One replica of an object (the admin `show` view).
struct ReplicaInfo {
  int32_t device = kHost;
  uint32_t segment = 0;  // arena segment, or chunk of the GPU's pool
  uint64_t offset = 0;
  uint32_t references = 0;
  bool ready = false;  // false while it is being copied
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

class ObjectStore final : private Tiers::Owner {
 public:
  // `gpus`: one pool per GPU, in device order (empty: no GPUs); `disk`: the spill
  // directory's pool, or null (objects that leave host memory are gone). They must outlive
  // the store. Waits time out on `loop`; checksums and copies run on `executor`.
  // `lease_entries`: the size of each client's lease table (Leases; 0: no leases).
  ObjectStore(boost::asio::io_context& loop, Executor& executor, Arena& arena, HeaderTable& headers,
              ClientLimits limits, bool eviction, std::vector<gpu::DevicePool*> gpus = {},
              uint32_t lease_entries = Leases::kDefaultEntries, DiskPool* disk = nullptr);
  ~ObjectStore();
  ObjectStore(const ObjectStore&) = delete;
  ObjectStore& operator=(const ObjectStore&) = delete;

  // Counts `bytes` more (or, negative, fewer) of memory the daemon keeps for `client`'s
  // requests in progress (its session's read buffer beyond the first MiB, the work of its
  // lists and verifies). They have an account of their own, with the same limits as the
  // metadata (--client-max-metadata, --metadata-budget), so that a store full of objects can
  // still be sent the large delete that empties it. Fails with LimitExceeded, counting
  // nothing, if more would pass either limit.
  Status ChargeRequests(ClientId client, int64_t bytes) {
    return accounts_.ChargeRequests(client, bytes);
  }
  // `uid`: its session's (SO_PEERCRED); the objects it creates are that uid's.
  void AddClient(ClientId client, uint32_t uid) { accounts_.Open(client, uid); }
  // Whether `client` has an account: a session, a group, the daemon or the scheduler.
  bool HasClient(ClientId client) const { return accounts_.Find(client) != nullptr; }
  // InvalidArgument, naming it, unless `tier` is host memory or a GPU this store serves.
  Status CheckTier(int32_t tier) const;
  // Gives back everything the client held: references released, objects it was creating
  // aborted, its waiting gets dropped (their callbacks are never called), its lease table
  // forgotten.
  void RemoveClient(ClientId client);
  // A session's lease table: the descriptor to send it (open until the client is removed;
  // -1 when it has none) and what the table may keep.
  struct LeaseTable {
    int fd = -1;
    LeaseAllowance allowance;
  };
  // Makes `client`'s lease table (Leases::Open), with the allowance its limits give it
  // (AllowanceFor), which its references may no longer take.
  Result<LeaseTable> OpenLeases(ClientId client);
  // A client read `ids` through leases (and has dropped them): counted as gets (the LRU
  // order, access times, counters); objects that leases kept from being freed are looked at
  // again soon. Ids that name nothing are passed over.
  void LeasedReads(std::span<const ObjectId> ids);
  LeaseCounters lease_counters() const { return leases_.counters(); }

  // Reserves and publishes (as creating) a new object; the creator holds one reference.
  // Evicts least-recently-used unreferenced objects when it must; on a GPU, may first wait
  // for objects to spill to host memory, and in host memory, with a spill directory, for
  // objects to spill to disk. `done` runs on the loop thread, at once for host objects that
  // find room without a spill. It is dropped uncalled if the client goes away meanwhile.
  using CreateDone = std::function<void(Result<Location>)>;
  void Create(ClientId client, const CreateParams& params, CreateDone done);

  // Creates, seals and lets go of a host object at once, for bytes the daemon received in a
  // message (a task's small outputs, TaskService): what a put in one round trip does, with
  // no checksum. The object is the client's, counted and charged as its put would be; it
  // ends unreferenced. Fails as Create does, holding nothing.
  Status Put(ClientId client, const CreateParams& params);

  // Seals: `done` runs on the loop thread, at once or after a checksum on the worker pool.
  void Seal(ClientId client, const ObjectId& id, std::function<void(Status)> done);
  Status Abort(ClientId client, const ObjectId& id);

  using GetDone = WaitingGets::Done;
  // Answers `done` (possibly before returning) with one result per id, located on `device`;
  // an OK result grants the client a reference to that replica. Waits up to `timeout_ms`
  // (-1: for ever) for missing ids, and for as long as copies to `device` take; the client
  // may cancel the wait by `request`, its id for the request (CancelWait). Returns an
  // error, and never calls `done`, if the client has too many gets waiting or `device` is
  // not a tier of this store.
  Status Get(ClientId client, uint64_t request, std::vector<ObjectId> ids, int32_t device,
             int64_t timeout_ms, GetDone done) {
    return Fetch({.client = client, .request = request, .tier = device, .ids = std::move(ids)},
                 timeout_ms, std::move(done));
  }
  // Makes a replica on `device` of each of `ids` that has none there, as a get there would,
  // and answers `done` with one code per id once they are ready (kOk), or why not (kNotFound,
  // or why a copy failed). Holds nothing: the replicas stay until room is needed. Waits for
  // no seal. Fails as Get does.
  Status Prefetch(ClientId client, std::vector<ObjectId> ids, int32_t device, GetDone done) {
    return Fetch({.client = client, .tier = device, .hold = false, .ids = std::move(ids)},
                 /*timeout_ms=*/0, std::move(done));
  }
  // Answers `done` once `count` of `ids` (0: all; an id listed twice counts twice) are
  // sealed, as succeeded (kOk) or failed (kTaskFailed), or once `timeout_ms` has passed
  // (the others kTimeout, or kNotFound with no wait). Holds and copies nothing; may be
  // cancelled as a get. Fails as Get does, and with InvalidArgument for a count above the
  // number of ids.
  Status Wait(ClientId client, uint64_t request, std::vector<ObjectId> ids, size_t count,
              int64_t timeout_ms, GetDone done);
  // Answers `client`'s get or wait of request id `request` now, as if its time were up
  // (WaitingGets::Cancel). False if it has none waiting by that id.
  bool CancelWait(ClientId client, uint64_t request) { return waiting_.Cancel(client, request); }

  // Releases one reference per id on `device`. Returns NotHeld naming the first id the
  // client did not hold there; the others are released all the same.
  Status Release(ClientId client, std::span<const ObjectId> ids, int32_t device = kHost);

  // With `only_of_uid`, only objects whose owner is that uid (kPermissionDenied for others).
  std::vector<StatusCode> Delete(std::span<const ObjectId> ids,
                                 std::optional<uint32_t> only_of_uid = std::nullopt);

  // Objects handed from one client to another through a group (Groups): `group` is the
  // account of `client`'s group. For each id, the group takes one more reference to the
  // object's replica on `tier`, and the object is deleted (it goes once the group and those
  // who claim it let go). The client must hold a reference there, or the group one already
  // (a value sent again). Per id: kOk, kNotFound, kNotSealed (being created), kNotHeld,
  // kLimitExceeded (the group holds kMaxHandoffs of it, or a deadline would pass the group's
  // metadata limits). With `ttl_ms` > 0 the group gives each reference back after that long
  // if nobody has claimed it (HandoffDeadlines); with `grace_ms` > 0, also that long after
  // `client`'s session has ended (RemoveClient), if sooner. Fails as a whole for a bad tier.
  static constexpr uint32_t kMaxHandoffs = 1u << 20;
  // A handoff deletes the object's name, so with `only_of_uid` (another uid that may write,
  // Access::kWrite) an object whose owner is another uid is kPermissionDenied, as in Delete.
  Result<std::vector<StatusCode>> Handoff(ClientId client, ClientId group,
                                          std::span<const ObjectId> ids, int32_t tier,
                                          uint32_t ttl_ms = 0, uint32_t grace_ms = 0,
                                          std::optional<uint32_t> only_of_uid = std::nullopt);
  // Moves one of `group`'s references to each of `ids` on `tier` to `client`, answered as a
  // get there (a location granting the reference), or kNotHeld, with a message, where the
  // group holds none. Never waits. Fails as a whole for a bad tier.
  Result<std::vector<GetResult>> Claim(ClientId client, ClientId group,
                                       std::span<const ObjectId> ids, int32_t tier);

  bool Contains(const ObjectId& id) const;
  // Where each of `ids` is, in order; holds nothing. Clients read the same from the header
  // table (ObjectHeader::tiers) without asking.
  std::vector<Placement> Locate(std::span<const ObjectId> ids) const;

  // Seals each of `ids` that does not exist (nothing sealed, being created or deleted but
  // still referenced under that id) as a failed object carrying `message`, cut to
  // scheduler::kMaxFailureMessage bytes (at a UTF-8 character boundary), and answers the gets
  // waiting for it with TaskFailed. `client` is its creator: its metadata account counts
  // each one (kObjectMetadataBytes and the message), with no limit checked, since the
  // daemon makes them. An id that finds no header slot or no host block, even after
  // eviction, is left missing (logged). Returns how many it made.
  size_t SealFailed(ClientId client, std::span<const ObjectId> ids, std::string_view message);
  // The message the object `id` was sealed as failed with; empty for any other object or id.
  std::string FailureOf(const ObjectId& id) const;

  // Takes one reference of `client` to the replica of the sealed (or failed), not deleted
  // object `id` on `tier`, as a get there would, but with no wait and no copy: the object is
  // neither evicted nor freed, nor that replica dropped or spilled, until Release(client,
  // {id}, tier). With kAnyTier, on its host replica if that is ready, else on the ready
  // replica of the lowest GPU, else on the disk's. Returns the tier held, or kAnyTier,
  // holding nothing, if the object is not sealed or has no ready replica there.
  static constexpr int32_t kAnyTier = -2;
  int32_t Hold(ClientId client, const ObjectId& id, int32_t tier = kAnyTier);
  // Gives back one reference of the task graph (kSchedulerClient) to `id`, taken with Hold,
  // on whichever copy it is now: it moves down the tiers as the object spills
  // (Replica::graph_held). Nothing if the graph holds none.
  void ReleaseGraphHold(const ObjectId& id);

  // Takes the sealed object `id` out of memory to disk for the scheduler (a graph's memory
  // bound): Tiers::SpillToDisk. Whether its bytes are leaving memory (StoreListener's
  // OnLeftMemory follows once they have).
  bool SpillToDisk(const ObjectId& id);

  // Bytes an object could be given on `tier` now without evicting, dropping or spilling
  // anything referenced or being created: the tier's limit less the bytes of such replicas
  // (in host memory, of pinned objects too), or, with eviction off, the host's free bytes.
  // An upper bound: the room may lie in pieces, and a GPU's may come only after spills to
  // host memory. 0 for a tier the store does not have.
  uint64_t Room(int32_t tier) const;

  // Tells `listener` of every seal, new replica and freed object from now on, until
  // Unsubscribe. It must outlive its subscription.
  void Subscribe(StoreListener* listener) { listeners_.push_back(listener); }
  void Unsubscribe(StoreListener* listener) { std::erase(listeners_, listener); }

  using Filter = ObjectTable::Filter;
  using Page = ObjectTable::Page;
  // Live slots from `start` on (ObjectTable::List).
  Page List(uint32_t start, uint32_t limit, uint32_t max_scan, Filter filter = Filter::kAll) const {
    return table_.List(start, limit, max_scan, filter);
  }
  // The id of the object in a live slot.
  ObjectId IdAt(uint32_t slot) const { return table_.IdAt(slot); }
  // Whether `slot` still holds the object `id` (the admin views check this between slices).
  bool Holds(uint32_t slot, const ObjectId& id) const { return table_.Holds(slot, id); }
  // The display name of the object in `slot`, empty if it has none.
  std::string_view NameOf(uint32_t slot) const { return table_.NameOf(slot); }
  bool IsDeletePending(uint32_t slot) const { return table_.IsDeletePending(slot); }

  // Admin views and actions (depotctl). They may walk every client or object: they are for
  // people, not for hot paths.

  // The live slot of `id`, or HeaderTable::kNoSlot.
  uint32_t SlotOf(const ObjectId& id) const { return table_.Find(id); }
  // What `client` holds, its leases included; all zero for an unknown client.
  ClientUsage UsageOf(ClientId client) const;
  // The clients holding references to the object in `slot`, with how many each, in all and
  // by tier (leases counting as references in host memory), in client id order
  // (kDaemonClient first, while a verify or a copy reads it).
  std::vector<HolderInfo> HoldersOf(uint32_t slot) const;
  // Objects with a copy in host memory, ready or being made.
  uint64_t ObjectsOnHost() const { return tiers_.usage(kHost).replicas; }
  // The object in `slot`, as the admin views show it.
  ObjectView Describe(uint32_t slot) const;
  // The replicas of the object in `slot`: host first, then GPUs in device order.
  std::vector<ReplicaInfo> ReplicasOf(uint32_t slot) const;
  // The tiers the object in `slot` has ready bytes on (ObjectHeader::tiers).
  uint64_t TiersOf(uint32_t slot) const { return table_.TiersOf(slot); }

  using VerifyDone = std::function<void(std::vector<VerifyOutcome>)>;
  // Recomputes the checksums of `ids` and compares them with those taken at seal. The hashing runs
  // on the worker pool; the store holds a reference to each object meanwhile, so it is neither
  // evicted nor freed under the reader. `done` runs on the loop thread with one outcome per id, in
  // order: at once if there is nothing to hash, else when the last worker reports back.
  void Verify(std::vector<ObjectId> ids, VerifyDone done);

  // Evicts sealed, unreferenced, unpinned objects in LRU order until at least `bytes` are
  // freed or none is left; with `all`, every one of them. Counted as evictions.
  EvictOutcome EvictUnreferenced(uint64_t bytes, bool all);

  StoreCounters counters() const;
  // What the tiers count: the disk's spills, restores and drops among them.
  const TierCounters& tier_counters() const { return tiers_.counters(); }
  // The spill directory's pool, or null.
  const DiskPool* disk() const { return tiers_.disk(); }
  uint32_t DiskCopiesInFlight() const { return tiers_.disk_copies_running(); }
  uint64_t DiskReads() const { return tiers_.disk_reads(); }
  // Objects with a copy on disk.
  uint64_t ObjectsOnDisk() const { return tiers_.disk() ? tiers_.usage(kDisk).replicas : 0; }
  // The copies between tiers as measured so far (Tiers).
  const CopyRates& copy_rates() const { return tiers_.copy_rates(); }
  // Times copies of `bytes` between host memory and the GPUs off the loop (copy_probe.h),
  // and starts copy_rates() from them once done; logs what it measured, or why it could not.
  // Does nothing without GPUs.
  void ProbeCopyRates(uint64_t bytes);
  const ClientLimits& limits() const { return accounts_.limits(); }
  // Applies new per-client limits and metadata budget (SIGHUP): see ClientAccounts.
  void SetLimits(const ClientLimits& limits) { accounts_.set_limits(limits); }
  std::span<gpu::DevicePool* const> pools() const { return gpus_; }
  const TierUsage& device_usage(uint32_t device) const {
    return tiers_.usage(static_cast<int32_t>(device));
  }
  const HeaderTable& headers() const { return table_.headers(); }
  const Arena& arena() const { return arena_; }
  bool eviction_enabled() const { return eviction_; }

 private:
  using Account = ClientAccounts::Account;

  // Tiers::Owner: what the copies between tiers need of the store.
  void HoldSource(uint32_t slot, int32_t tier) override;
  void LetGoOfSource(uint32_t slot, int32_t tier) override;
  void CopyDone(uint32_t slot, int32_t tier, const Status& status,
                std::span<const WaitingGets::Id> waiters) override;
  // A copy of `slot` is ready on `to`: the task graph's reference to a copy above it (a
  // GPU's for host memory, host memory's for the disk) moves there, so that the copy above
  // may go (and a spill of it finish).
  void MoveGraphHold(uint32_t slot, int32_t to);
  void Evict(uint32_t slot) override;
  bool Reclaim(uint32_t slot) override;
  void ChargeObject(uint32_t slot, uint64_t bytes) override;
  void LeftMemory(uint32_t slot) override;

  Location LocationOf(uint32_t slot, int32_t tier) const;
  // Before a get that waited is answered: the places of objects it granted early, as they
  // are now, or notHeld for those its client has released since (the object may be gone).
  void KeepWhatIsStillHeld(WaitingGets::Get& get) const;
  // Why `params` cannot be created (a bad id or size, an id taken), or OK.
  Status CheckNew(const CreateParams& params) const;
  // Creates a host object if it finds room at once; OutOfMemory if it does not.
  Result<Location> CreateOnHost(ClientId client, const CreateParams& params);
  // Creates once room is made on the tier (after spills), as Create says.
  void CreateAfterRoom(ClientId client, const CreateParams& params, CreateDone done);
  // Why `params` cannot be created on its tier, whatever room is made (its size, the
  // client's limits), or OK.
  Status CheckRoom(ClientId client, const CreateParams& params);
  // Publishes a new object, being created, in `slot`, and counts it.
  void Publish(ClientId client, const CreateParams& params, uint32_t slot);
  // What creating `params` costs the daemon's memory before any GPU metadata.
  static uint64_t CreateCost(const CreateParams& params);
  // The bytes `params` takes on its tier: the data, and on the host the metadata after it.
  // CheckNew has made sure the sum fits.
  static uint64_t BytesOnTier(const CreateParams& params);
  void FreeObject(uint32_t slot);
  // Frees the deleted, unreferenced object in `slot` unless a lease still holds it (then it
  // is freed when no lease does: LeaseEnded).
  void FreeDeleted(uint32_t slot);
  // Marks the sealed object in `slot` delete pending (new gets do not find it), and frees it
  // at once if nobody references it.
  void MarkDeleted(uint32_t slot);
  // No lease holds the host copy of the object in `slot` any more.
  void LeaseEnded(uint32_t slot);
  // One more reference of `account` to the replica on `tier`.
  void AddRef(Account& account, uint32_t slot, int32_t tier);
  // Drops one of the client's references; frees or aborts the object when it was the last.
  void DropRef(Account& account, uint32_t slot, int32_t tier);
  // Get, Prefetch and Wait: `get` says which (hold, wait) and what it asks for (client,
  // request, tier, ids, enough); the rest of it is filled here.
  Status Fetch(WaitingGets::Get get, int64_t timeout_ms, GetDone done);
  // A reference of `holder` to the replica on `tier` for a get, and where it is, the object
  // used at `now`; with no holder (a prefetch), only that it is there.
  GetResult Grant(Account* holder, uint32_t slot, int32_t tier, uint64_t now);
  // Whether `holder` may take one more reference to the object in `slot` on `tier`: within
  // its limits (--client-max-bytes, --client-max-objects) if it is a new object to it, and
  // short of the most references one client, and all together, may hold (LimitExceeded).
  Status CheckReference(const Account& holder, uint32_t slot, int32_t tier) const;

  // A free header slot, evicting the least recently used object if the table is full.
  uint32_t AcquireSlot();
  // Evicts unreferenced objects whole (every copy), least recently used first, until
  // `enough()`: what gives back header slots and the daemon memory kept for objects.
  // Returns enough().
  bool EvictWholeObjects(const std::function<bool()>& enough);
  // CheckMetadata, after evicting objects nobody holds while the budget is short.
  Status CheckMetadataRoom(ClientId client, const Account& account, uint64_t bytes);
  // Grants a get waiting for a copy the replica on its tier, or tells it why not.
  void Answer(WaitingGets::Id waiter, uint32_t slot, const ObjectId& id, const Status& failure);
  void FinishSeal(uint32_t slot, std::optional<uint64_t> checksum);
  // Answers the gets that waited for the object in `slot` to be sealed.
  void CompleteWaiters(uint32_t slot);
  // What a get of the failed object in `slot` is answered.
  GetResult FailureResult(uint32_t slot) const;
  struct VerifyRun;
  // Gives back the references a Verify took, fills in its outcomes and answers it.
  void FinishVerify(const std::shared_ptr<VerifyRun>& run);
  // Delivers an event to the listeners, after the current change (StoreListener).
  void Notify(std::function<void(StoreListener&)> event);
  // Gives back the handed-off references whose deadlines have passed, and sets the timer
  // for the next.
  void ExpireHandoffs();
  // Gives what `sender` handed off with a grace and is still unclaimed its due time, from
  // `ended_ns` on (HandoffDeadlines::SenderEnded), in slices.
  void SenderEnded(ClientId sender, uint64_t ended_ns);
  void ArmHandoffTimer();

  Executor& executor_;
  Arena& arena_;
  const bool eviction_;
  std::vector<gpu::DevicePool*> gpus_;

  ObjectTable table_;
  Leases leases_;
  ClientAccounts accounts_;
  WaitingGets waiting_;
  Tiers tiers_;
  EvictionPolicy policy_;

  HandoffDeadlines handoff_deadlines_;
  boost::asio::steady_timer handoff_timer_;
  uint64_t handoff_timer_at_ = 0;  // when the timer fires (MonotonicNanos); 0: not set

  std::unordered_set<ObjectId> creating_;  // GPU creates waiting for room
  std::vector<StoreListener*> listeners_;
  StoreCounters counters_;  // those kept here; counters() adds the parts'
  LogLimiter failure_log_;  // failed objects that found no room
};

}  // namespace depot::store
