// The object table and everything that happens to objects: create, seal, get (waiting for
// seals), release, delete, abort, and eviction under memory pressure.
//
// All of it runs on the daemon's one event-loop thread: no locks. Long work (checksums of
// large objects) goes to the worker pool and posts its result back to the loop. The store
// knows clients only by ClientId; sessions (the network side) call in and get callbacks.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/thread_pool.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "depot/object_id.h"
#include "depot/status.h"
#include "store/arena.h"
#include "store/header_table.h"
#include "store/lru_list.h"

namespace depot::store {

using ClientId = uint32_t;
// The store's own client id: it holds references under it to objects a Verify is reading.
// Sessions are numbered from 1.
inline constexpr ClientId kStoreClient = 0;

struct Location {
  uint32_t slot = 0;
  uint32_t segment = 0;
  uint64_t offset = 0;
  uint64_t data_size = 0;
  uint64_t metadata_size = 0;
};

struct CreateParams {
  ObjectId id;
  uint64_t data_size = 0;
  std::span<const std::byte> metadata;
  std::span<const std::byte> data;  // copied in by the daemon when given (one-round-trip put)
  std::string_view name;
  bool pin = false;
  bool checksum = false;
};

struct GetResult {
  StatusCode code = StatusCode::kOk;  // kOk, kNotFound or kTimeout
  Location location;
};

struct ClientLimits {
  uint64_t max_bytes = 0;         // bytes a client may hold (creating or referenced); 0: no limit
  uint32_t max_objects = 0;       // objects a client may hold; 0: no limit
  uint32_t max_pending_gets = 0;  // gets of one client waiting at once; 0: no limit
};

struct StoreCounters {
  uint64_t objects_sealed = 0;
  uint64_t objects_creating = 0;
  uint64_t held_bytes = 0;  // allocated to objects that are referenced or being created
  uint64_t pinned_bytes = 0;
  uint64_t evictions = 0;
  uint64_t evicted_bytes = 0;
  uint64_t bytes_in = 0;      // data and metadata of objects created
  uint64_t bytes_out = 0;     // of objects handed out by gets
  uint64_t get_hits = 0;      // ids a get found sealed at once
  uint64_t get_waits = 0;     // ids a get had to wait for
  uint64_t get_timeouts = 0;  // ids still missing when a wait ran out
};

// What a client holds (the admin `clients` view).
struct ClientUsage {
  uint64_t objects = 0;     // distinct objects referenced or being created
  uint64_t references = 0;  // references, all objects together
  uint64_t bytes = 0;       // allocated bytes of those objects
};

enum class VerifyState : uint8_t { kOk, kMismatch, kNoChecksum, kNotFound, kNotSealed };

struct VerifyOutcome {
  ObjectId id;
  VerifyState state = VerifyState::kNotFound;
  uint64_t expected = 0;  // the checksum taken at seal (kOk, kMismatch)
  uint64_t actual = 0;    // the checksum of the bytes now (kOk, kMismatch)
};

struct EvictOutcome {
  uint64_t objects = 0;
  uint64_t bytes = 0;  // allocated bytes freed
};

class ObjectStore {
 public:
  ObjectStore(boost::asio::io_context& loop, boost::asio::thread_pool& workers, Arena& arena,
              HeaderTable& headers, ClientLimits limits, bool eviction);
  ~ObjectStore();
  ObjectStore(const ObjectStore&) = delete;
  ObjectStore& operator=(const ObjectStore&) = delete;

  void AddClient(ClientId client);
  // Gives back everything the client held: references released, objects it was creating
  // aborted, its waiting gets dropped (their callbacks are never called).
  void RemoveClient(ClientId client);

  // Reserves and publishes (as creating) a new object; the creator holds one reference.
  // Evicts least-recently-used unreferenced objects when it must.
  Result<Location> Create(ClientId client, const CreateParams& params);

  // Seals: `done` runs on the loop thread, at once or after a checksum on the worker pool.
  void Seal(ClientId client, const ObjectId& id, std::function<void(Status)> done);
  Status Abort(ClientId client, const ObjectId& id);

  using GetDone = std::function<void(std::vector<GetResult>)>;
  // Answers `done` (possibly before returning) with one result per id; an OK result grants
  // the client a reference. Waits up to `timeout_ms` (-1: for ever) for missing ids. Returns
  // an error, and never calls `done`, if the client has too many gets waiting.
  Status Get(ClientId client, std::vector<ObjectId> ids, int64_t timeout_ms, GetDone done);

  // Releases one reference per id. Returns NotHeld naming the first id the client did not
  // hold; the others are released all the same.
  Status Release(ClientId client, std::span<const ObjectId> ids);

  std::vector<StatusCode> Delete(std::span<const ObjectId> ids);
  bool Contains(const ObjectId& id) const;

  // Live slots from `start` on, at most `limit` of them, and where the next page starts.
  struct Page {
    std::vector<uint32_t> slots;
    uint32_t next = 0;
    bool done = true;
  };
  Page List(uint32_t start, uint32_t limit) const;
  // The display name of the object in `slot`, empty if it has none.
  std::string_view NameOf(uint32_t slot) const;
  bool IsDeletePending(uint32_t slot) const;

  // Admin views and actions (depotctl). They may walk every client or object: they are for
  // people, not for hot paths.

  // The live slot of `id`, or HeaderTable::kNoSlot.
  uint32_t SlotOf(const ObjectId& id) const { return Find(id); }
  // What `client` holds; all zero for an unknown client.
  ClientUsage UsageOf(ClientId client) const;
  // The clients holding references to the object in `slot`, with how many each, in client
  // id order (kStoreClient first, when a Verify is reading it).
  std::vector<std::pair<ClientId, uint32_t>> HoldersOf(uint32_t slot) const;

  using VerifyDone = std::function<void(std::vector<VerifyOutcome>)>;
  // Recomputes the checksums of `ids` (empty: every sealed object that has one, in slot
  // order) and compares them with those taken at seal. The hashing runs on the worker pool;
  // the store holds a reference to each object meanwhile, so it is neither evicted nor freed
  // under the reader. `done` runs on the loop thread with one outcome per id, in order: at
  // once if there is nothing to hash, else when the last worker reports back.
  void Verify(std::vector<ObjectId> ids, VerifyDone done);

  // Evicts sealed, unreferenced, unpinned objects in LRU order until at least `bytes` are
  // freed or none is left; with `all`, every one of them. Counted as evictions.
  EvictOutcome EvictUnreferenced(uint64_t bytes, bool all);

  const StoreCounters& counters() const { return counters_; }
  const HeaderTable& headers() const { return headers_; }
  const Arena& arena() const { return arena_; }
  bool eviction_enabled() const { return eviction_; }

 private:
  struct Object {          // daemon-only state of a live slot
    uint32_t alloc = 0;    // allocator handle in the header's segment
    ClientId creator = 0;  // while being created
    bool want_checksum = false;
    bool sealing = false;  // checksum running on the worker pool
  };
  struct ClientState {
    std::unordered_map<uint32_t, uint32_t> refs;  // slot -> references held
    uint64_t held_bytes = 0;
    std::vector<uint64_t> pending_gets;
  };
  struct PendingGet {
    ClientId client = 0;
    std::vector<ObjectId> ids;
    std::vector<GetResult> results;
    size_t missing = 0;
    std::unique_ptr<boost::asio::steady_timer> timer;
    GetDone done;
  };

  uint32_t Find(const ObjectId& id) const;
  uint64_t BlockBytes(uint32_t slot) const;
  Location LocationOf(uint32_t slot) const;
  Status CheckLimits(ClientId client, const ClientState& state, uint64_t bytes) const;
  std::optional<Arena::Block> AllocateOrEvict(uint64_t bytes);
  // A free header slot, evicting the least recently used object if the table is full.
  uint32_t AcquireSlot();
  void Evict(uint32_t slot);
  // The LRU list, kept together with the evictable bytes of each segment.
  void MakeEvictable(uint32_t slot);
  void MakeUnevictable(uint32_t slot);
  void AddRef(ClientId client, ClientState& state, uint32_t slot);
  // Drops one of the client's references; frees or aborts the object when it was the last.
  void DropRef(ClientState& state, uint32_t slot);
  void FinishSeal(uint32_t slot, std::optional<uint64_t> checksum);
  void FreeObject(uint32_t slot);
  void CompleteWaiters(uint32_t slot);
  void ExpireGet(uint64_t pending_id);
  void ForgetWaits(uint64_t pending_id, const PendingGet& get);
  std::string OutOfMemoryMessage(const ObjectId& id, uint64_t bytes) const;
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
  LruList lru_;  // sealed, unreferenced, unpinned objects: the eviction candidates
  std::vector<uint64_t> evictable_bytes_;  // by segment: bytes of the objects in lru_
  std::unordered_map<ClientId, ClientState> clients_;
  std::unordered_map<uint64_t, PendingGet> pending_;
  std::unordered_map<ObjectId, std::vector<uint64_t>> waiting_;  // id -> pending gets
  uint64_t next_pending_ = 1;
  StoreCounters counters_;
};

}  // namespace depot::store
