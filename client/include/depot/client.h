// depot's C++ client: put immutable objects into a local depotd, and read anyone's objects
// with no copy.
//
//   DEPOT_ASSIGN_OR_RETURN(auto client, depot::Client::Connect());
//   auto id = depot::ObjectId::FromName("weights/layer1");
//   DEPOT_RETURN_NOT_OK(client.Put(id, bytes));
//   DEPOT_ASSIGN_OR_RETURN(auto buffer, client.Get(id, std::chrono::seconds(1)));
//   use(buffer.data());  // points into shared memory
//
// Every call is thread-safe. Calls that fail return a Status whose message is the
// daemon's own explanation. A Client holds one connection. Buffers and MutableBuffers keep
// that connection open, so they may outlive their Client: their bytes stay valid and their
// reference is released when the last handle goes. When the connection closes (the Client
// and all its handles are gone, or the process dies) the daemon releases every reference it
// still held and aborts every object it was creating. A MutableBuffer outliving its Client
// cannot be sealed any more: dropping it aborts the object.
//
// Releases are batched: dropping the last handle to an object queues its reference, which
// reaches the daemon with the Client's next request (in the same write, ahead of it), or
// within about 1 ms, whichever is first; a full queue (about a thousand ids) goes at once.
// The Client's own later requests therefore always see the release. A Client starts one
// helper thread, with every signal blocked, the first time it releases, to send the queue
// of a client that makes no further request.
//
// A Client and its handles belong to the process that connected it. After fork(), the child
// must not use the parent's Client: connect one of its own. (The parent's connection is
// unusable in the child: its calls fail with Disconnected, and dropping its handles there
// sends nothing, so the parent's references are untouched.)
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "depot/buffer.h"
#include "depot/device_buffer.h"
#include "depot/object_id.h"
#include "depot/status.h"
#include "depot/task.h"

namespace depot {

namespace internal {
class Connection;
class Reply;
struct PendingCall;
}  // namespace internal

// A get or wait sent to the daemon and answered later (Client::StartGet, StartGetOnDevice,
// StartWait). The daemon keeps one waiting request for it, however the caller waits: in
// slices (to notice Ctrl-C), from an event loop (Client::TakeCompleted), or not at all
// (Cancel). Dropping one that was not taken cancels it, waits for the daemon's answer
// (at once: nothing is waited for any more) and gives back what it granted. Belongs to
// one thread at a time; movable, not copyable.
template <typename T>
class Pending {
 public:
  Pending(Pending&&) noexcept;
  Pending& operator=(Pending&&) noexcept;
  ~Pending();

  // The request's id, as Client::TakeCompleted names it (0: answered without a request,
  // from what this client held).
  uint64_t id() const;
  // Whether the answer is in (or the connection broke); waits up to `wait` for it, reading
  // the socket meanwhile if no other thread is. With no wait it only looks: something else
  // must read the answer (another call of this Client, a Ready with a wait, or an event
  // loop's Pump).
  bool Ready(std::chrono::milliseconds wait = std::chrono::milliseconds(0));
  // The answer, as the blocking call returns it (Get, GetOnDevice, Wait), after waiting for
  // it as long as it takes. Once: a second Take fails with InvalidArgument.
  Result<T> Take();
  // Asks the daemon to answer now, as if the timeout had passed: what is not sealed yet
  // comes back as not there (Take: empty entries; a one-object get's Timeout). Sends the
  // request and returns: waits neither for the daemon nor for the answer. Nothing happens
  // if it was answered already.
  Status Cancel();

 private:
  friend class Client;
  using Finish = std::function<Result<T>(internal::Reply*)>;
  Pending(std::unique_ptr<internal::PendingCall> call, Finish finish);
  std::unique_ptr<internal::PendingCall> call_;
  Finish finish_;  // turns the reply (none: nothing was asked) into the answer
};

struct ConnectOptions {
  // Shown in the daemon's logs. Default: this program's name.
  std::string client_name;
  // How long a call waiting for the daemon's reply polls the socket before it sleeps.
  // Polling saves a scheduler wake-up per request (about 3 µs); 0 turns it off.
  //
  // Polling adapts to the machine: it goes on while replies arrive within `spin`. When
  // they stop doing so (three polls in a row, or more than about one in five, saw no reply
  // in time: a busy machine, where polling takes the CPU the daemon needs, or a daemon that
  // answers slowly), calls block at once, and only one wait in 64 polls first; when those
  // see their replies in time again, polling resumes. This costs no clock reads beyond the
  // polling's own.
  std::chrono::microseconds spin{20};
  // Joins a group of sessions that hand objects to one another (Handoff, Claim): 16 bytes,
  // random, the same in every process of the group (depot.multiprocessing passes them to its
  // children), or empty for none. A group belongs to the uid of its first session.
  std::string group;
  // Threads a put copies an object of 16 MiB or more into the store with, this one among
  // them (each a slice of it); 0: $DEPOT_COPY_THREADS if set (1 to 64; any other value fails
  // Connect with InvalidArgument), else 4 or the hardware's threads if fewer. 1 copies on the
  // calling thread alone.
  unsigned copy_threads = 0;
  // How long what this client hands off (Handoff, SealAndHandoff, PutAndHandoff) outlives
  // it unclaimed: the group gives each such reference back this long after this session has
  // ended (or at the handoff's ttl, if sooner). 0, the default: until the group ends (or the
  // ttl). For a sender whose receiver stops claiming when it ends (a DataLoader's worker),
  // a few seconds covers what was already on its way. At most about 49 days (2^32 - 1 ms):
  // Connect fails with InvalidArgument beyond, or below 0.
  std::chrono::milliseconds handoff_grace{0};
};

struct CreateOptions {
  // A small blob stored with the object (e.g. dtype and shape); bounded by the daemon's
  // message size limit (16 MiB by default).
  std::span<const std::byte> metadata;
  // The key the id was made from, if any; kept for display (`depotctl ls`).
  std::string name;
  // Never evict this object under memory pressure.
  bool pin = false;
  // Compute an XXH3-64 checksum of data and metadata at Seal, for `depotctl verify`.
  bool checksum = false;
  // With a daemon that spills to disk (depotd --spill-dir): false evicts this object for good
  // under memory pressure instead of writing it to disk, for values cheaper to recompute than
  // to read back. Without a spill directory every unpinned object is evicted anyway.
  bool spill = true;
  // For an object larger than the daemon's --segment-size (a segment of its own, mapped
  // afresh): allocate and map all its pages for writing at Create, in one system call,
  // rather than fault them in 4 KiB at a time as they are first written (about 10% faster
  // in all; bench_put's put/1GiB/dedicated). Turn it off for such an object that will be
  // written only in part: pages never written then take no memory in this process's
  // mapping (a daemon that pre-faults, the default, still allocates a new large object's
  // pages from its end on a worker as it is written; `depotd --no-prefault` does not; a
  // segment the daemon kept from an earlier object has its pages already). Objects in shared
  // segments are never prefaulted: their pages are allocated by the daemon ahead of time,
  // and mapped in this process once by their first writer, after which prefaulting would
  // only walk page tables that are there already (as slow as the copy itself).
  bool prefault = true;
};

// One object of Client::PutMany.
struct PutItem {
  ObjectId id;
  std::span<const std::byte> data;
  CreateOptions options;
};

// One piece of an object's data (Client::PutParts): `data`, written at byte `offset`.
struct PutPart {
  uint64_t offset = 0;
  std::span<const std::byte> data;
};

// Whether `parts` can make up an object of `data_size` bytes: in order of offset, none
// starting before the end of the one before it, none running past `data_size`. OK, or
// InvalidArgument naming the first part that is wrong. Client::PutParts checks this itself;
// call it to refuse a batch before putting any of it.
Status CheckParts(std::span<const PutPart> parts, uint64_t data_size);

// One object of Client::CreateMany, as Create takes it.
struct CreateItem {
  ObjectId id;
  uint64_t data_size = 0;
  CreateOptions options;
};

// One object of Client::PutManyParts, as PutParts takes it.
struct PutPartsItem {
  ObjectId id;
  uint64_t data_size = 0;
  std::span<const PutPart> parts;
  CreateOptions options;
};

enum class ObjectState : uint8_t { kCreating, kSealed };

// A GPU the daemon serves, with its pool (Client::Gpus, StoreStatus::gpus).
struct GpuInfo {
  int ordinal = -1;  // this process's ordinal for it; -1 if this process cannot see it
  std::array<uint8_t, 16> uuid{};
  std::string name;
  bool simulated = false;
  uint64_t total_bytes = 0;
  uint64_t limit_bytes = 0;     // what the pool may take of it
  uint64_t reserved_bytes = 0;  // in chunks allocated so far
  uint64_t used_bytes = 0;      // allocated to objects
  uint64_t held_bytes = 0;      // of which referenced or being created
  uint32_t chunks = 0;
  uint64_t replicas = 0;  // objects with bytes on it
};

// What the daemon knows of one object (Client::List).
struct ObjectInfo {
  ObjectId id;
  std::string name;
  ObjectState state = ObjectState::kSealed;
  uint64_t data_size = 0;
  uint64_t metadata_size = 0;
  uint32_t ref_count = 0;  // references held by all clients together
  bool pinned = false;
  bool delete_pending = false;  // deleted, goes when the last reference is released
  bool has_checksum = false;
  uint64_t checksum = 0;
  uint64_t create_time_ns = 0;  // since the epoch
  uint64_t access_time_ns = 0;
  uint32_t segment = 0;
  uint64_t offset = 0;
  bool on_host = true;         // has bytes in host memory (segment and offset are valid)
  std::vector<uint32_t> gpus;  // the daemon's GPUs (StoreStatus::gpus) it has bytes on
  uint32_t owner_uid = 0;      // the uid of the client that created it
  bool failed = false;         // the output of a failed task: no bytes (Get: TaskFailed)
  bool on_disk = false;        // has a copy in the daemon's spill directory (Get restores it)
};

// The disk tier (depotd --spill-dir): host objects spilled when host memory is full, read
// back by gets (StoreStatus::disk).
struct DiskStatus {
  bool enabled = false;  // false: no --spill-dir, the rest is zero
  std::string dir;
  uint64_t limit_bytes = 0;  // --spill-limit
  uint64_t used_bytes = 0;   // allocated to objects in spill files
  uint64_t file_bytes = 0;   // of the spill files open
  uint32_t files = 0;
  uint64_t objects = 0;  // with a copy on disk
  uint64_t spills = 0;   // objects written to disk to make room in host memory
  uint64_t spilled_bytes = 0;
  double spill_seconds = 0;  // while writes were under way: bytes / seconds is the throughput
  uint64_t restores = 0;     // objects read back for gets
  uint64_t restored_bytes = 0;
  double restore_seconds = 0;
  uint64_t drops = 0;  // objects dropped from disk for good (the spill limit reached)
  uint64_t dropped_bytes = 0;
  uint64_t spill_failures = 0;    // writes that failed: the objects stayed in memory
  uint64_t restore_failures = 0;  // reads that failed (I/O error, checksum): objects lost
  uint32_t copies_in_flight = 0;  // spills (ahead of need too) and restores under way
  bool direct_io = false;         // the bulk of each copy bypasses the page cache (O_DIRECT)
  // Disk writes made by spills (small objects spilled together share one) and reads made by
  // restores (small objects restored one after another share a read window).
  uint64_t writes = 0;
  uint64_t reads = 0;
};

// A setting the daemon runs with (StoreStatus::settings): its key, the flag's name without
// the dashes, and its value as a configuration file writes it.
struct Setting {
  std::string name;
  std::string value;
};

// The daemon's state (Client::GetStatus).
struct StoreStatus {
  std::string daemon_version;
  uint32_t pid = 0;
  uint64_t uptime_ns = 0;
  std::string socket_path;
  std::string arena_backend;  // "memfd" or the arena directory
  uint64_t capacity_bytes = 0;
  uint64_t mapped_bytes = 0;  // in segments created so far
  uint64_t used_bytes = 0;    // allocated to objects
  uint64_t held_bytes = 0;    // of which referenced by some client (not evictable)
  uint64_t pinned_bytes = 0;
  uint64_t largest_free_block = 0;
  uint64_t kept_bytes = 0;        // of large objects gone, kept for the next (free, not mapped)
  uint64_t arena_page_bytes = 0;  // the arena's page size (2 MiB with huge pages)
  std::string arena_pages;        // how it got them, or why not huge ones if asked
  uint32_t segments = 0;
  uint64_t objects_sealed = 0;
  uint64_t objects_creating = 0;
  uint32_t clients = 0;
  uint64_t evictions = 0;
  uint64_t evicted_bytes = 0;
  bool eviction_enabled = true;
  uint32_t header_slots = 0;
  uint64_t requests = 0;
  std::vector<GpuInfo> gpus;  // ordinal: this process's, -1 if it cannot see the GPU
  std::string gpu_backend;    // "cuda", "simulated", or why there are no GPUs
  uint64_t spills = 0;        // objects moved from a full GPU to host memory
  uint64_t spilled_bytes = 0;
  uint64_t replicas_made = 0;     // copies made for gets on another tier
  uint64_t replicas_dropped = 0;  // extra copies dropped to make room
  // Arena bytes registered with the CUDA driver (page-locked), so that copies between them
  // and GPUs run at full speed; 0 without CUDA GPUs.
  uint64_t arena_page_locked_bytes = 0;
  // Objects with a copy in host memory, ready or being made (GpuInfo::replicas: on a GPU).
  uint64_t objects_on_host = 0;
  // The daemon's own memory kept for its clients (object entries, names, metadata of GPU
  // objects, waiting gets), and its budget for it (0: none).
  uint64_t metadata_bytes = 0;
  uint64_t metadata_budget_bytes = 0;
  // Its memory for requests in progress (large requests being read, lists and verifies),
  // counted apart within the same budget.
  uint64_t request_bytes = 0;
  SchedulerStatus scheduler;
  DiskStatus disk;
  std::string config_file;  // the file its settings were read from (--config); empty: none
  // Every setting, flags and file together, as it runs now (after SIGHUP reloads).
  std::vector<Setting> settings;
};

// A client connected to the daemon (Client::Clients). pid, uid and command are the
// peer's, as the kernel reported them (SO_PEERCRED, /proc/<pid>/comm) when it connected.
struct ClientInfo {
  uint64_t session_id = 0;
  uint32_t pid = 0;
  uint32_t uid = 0;
  std::string command;
  std::string client_name;         // ConnectOptions::client_name; empty before its handshake
  uint64_t objects_held = 0;       // distinct objects it references or is creating
  uint64_t references = 0;         // references it holds, all objects together
  uint64_t bytes_held = 0;         // allocated bytes of those objects
  uint64_t requests = 0;           // requests it has sent
  uint64_t connected_time_ns = 0;  // since the epoch
};

// A holder's references on one tier (Holder::tiers).
struct TierReferences {
  int device = -1;  // -1: host memory; else the daemon's GPU (StoreStatus::gpus)
  uint32_t references = 0;
};

// A client holding references to an object (ObjectDetails). Session id 0 is the daemon
// itself, holding the object while a Verify reads it or while it is the source of a copy to
// another tier.
struct Holder {
  uint64_t session_id = 0;
  uint32_t pid = 0;
  uint32_t uid = 0;
  std::string command;
  std::string client_name;
  uint32_t references = 0;            // on all tiers together
  std::vector<TierReferences> tiers;  // the same by tier, host first; only tiers with some
};

// One copy of an object's bytes.
struct Replica {
  int device = -1;       // -1: host memory; else the daemon's GPU (StoreStatus::gpus)
  uint32_t segment = 0;  // arena segment, or chunk of the GPU's pool
  uint64_t offset = 0;
  uint32_t references = 0;  // references to this copy
  bool ready = false;       // false while it is being copied
};

// One object and who holds it (Client::Describe).
struct ObjectDetails {
  ObjectInfo info;
  std::vector<Holder> holders;    // by session id; their references add up to info.ref_count
  std::vector<Replica> replicas;  // host first, then GPUs in order
};

enum class VerifyState : uint8_t {
  kOk,          // the checksum of the bytes now matches the one taken at Seal
  kMismatch,    // it does not: the bytes were written after Seal
  kNoChecksum,  // created without CreateOptions::checksum: nothing to compare with
  kNotFound,    // no such object, or it was deleted
  kNotSealed,   // still being created
  kNotOnHost,   // its bytes are only on GPUs now (the checksum is of host bytes)
};

struct VerifyResult {
  ObjectId id;
  VerifyState state = VerifyState::kNotFound;
  uint64_t expected = 0;  // XXH3-64 taken at Seal (kOk, kMismatch)
  uint64_t actual = 0;    // XXH3-64 of the bytes now (kOk, kMismatch)
};

struct EvictResult {
  uint64_t objects = 0;  // evicted: gone from the store
  // Host bytes freed: those objects', and the host copies dropped of objects that also have
  // a copy on a GPU (which stay, and count in StoreStatus::replicas_dropped).
  uint64_t bytes = 0;
};

// Where an object's bytes are (Client::Locate).
struct ObjectPlacement {
  ObjectId id;
  bool found = false;          // sealed and not deleted; the rest is empty if not
  bool failed = false;         // found, the output of a failed task: no bytes (Get: TaskFailed)
  bool on_host = false;        // its bytes are in host memory
  std::vector<int> gpus;       // this process's ordinals of the GPUs its bytes are on
  uint64_t data_size = 0;      // on each of them
  uint64_t metadata_size = 0;  // in host memory, after the data (GPU copies hold data only)
};

// Wait for ever (Get).
inline constexpr std::chrono::milliseconds kForever{-1};

class Client {
 public:
  // Connects to the daemon at `socket_path`; empty means $DEPOT_SOCKET, then the default
  // per-user path. Fails with ConnectionFailed if no daemon listens there (the message says
  // how to start one) and ProtocolMismatch if the daemon speaks another protocol version.
  static Result<Client> Connect(const std::string& socket_path = {}, ConnectOptions options = {});

  Client(Client&&) noexcept;
  Client& operator=(Client&&) noexcept;
  ~Client();

  // Creates an object of `data_size` bytes that only this client can see until Seal.
  // Returns its writable bytes. Fails with AlreadyExists if the id is taken (sealed or being
  // created), OutOfMemory if it cannot fit even after evicting unreferenced objects (the
  // message says how much was asked, free and held), InvalidArgument for the nil id or a
  // size (with the metadata) over the host arena's capacity, LimitExceeded past this
  // client's quotas.
  Result<MutableBuffer> Create(const ObjectId& id, uint64_t data_size,
                               const CreateOptions& options = {});
  // Creates each item as Create does, and returns each one's result, in order: one failing
  // does not stop the others. The requests are pipelined, up to kPutManyWindow in one
  // write, so that several objects cost about one round trip instead of one each (a task
  // with several outputs; TaskContext::PutPartsMany). If the connection breaks, the items
  // not yet answered fail with Disconnected.
  std::vector<Result<MutableBuffer>> CreateMany(std::span<const CreateItem> items);

  // Makes the object immutable and visible to all; wakes everyone waiting in Get for it.
  // Handles from Create stay valid (now read-only by contract). Fails with NotFound for an
  // unknown id, AlreadySealed if sealed before, NotHeld if another client is creating it.
  Status Seal(const ObjectId& id);

  // Seal for an object written on a GPU: waits for the work queued on `stream` (a
  // CUstream; 0: the legacy default stream) to complete, then seals. The writer must make
  // its writes complete before sealing; this is the usual way. On a simulated GPU there is
  // nothing to wait for.
  Status Seal(const ObjectId& id, uintptr_t stream);

  // GPU objects. `device` is this process's ordinal for the GPU (as CUDA numbers them here,
  // after CUDA_VISIBLE_DEVICES); the daemon knows GPUs by UUID. On a daemon with simulated
  // GPUs, ordinal k is its simulated GPU k.

  // The GPUs the daemon serves that this process can use, by ordinal.
  Result<std::vector<GpuInfo>> Gpus();

  // Makes a copy of each object on GPU `device` (this process's ordinal), or in host memory
  // for kHostMemory, ahead of the gets that will want it there, and returns when every copy
  // is ready; a GetOnDevice (or Get) afterwards makes no copy. Holds nothing: the copies stay
  // until the daemon needs the room. Fails with NotFound naming the first object that does
  // not exist or is not sealed (the others are still copied), OutOfMemory naming one that
  // found no room, InvalidArgument for a GPU the daemon does not serve.
  static constexpr int kHostMemory = -1;
  Status Prefetch(std::span<const ObjectId> ids, int device);

  // Creates an object of `data_size` bytes in `device`'s pool, visible only to this client
  // until Seal. Fails as Create does, with OutOfMemory naming the GPU when its pool cannot
  // make room even by dropping extra replicas and spilling objects to host memory, and
  // InvalidArgument for a GPU the daemon does not serve or `checksum` (host objects only).
  Result<MutableDeviceBuffer> CreateOnDevice(const ObjectId& id, uint64_t data_size, int device,
                                             const CreateOptions& options = {});

  // Gets objects on `device`: the daemon makes a replica there (from another GPU or host
  // memory) when the object is not there yet, and answers when it is ready. Results and
  // failures as Get. A warm get (the chunk is mapped already) makes no CUDA call.
  Result<std::vector<DeviceBuffer>> GetOnDevice(
      std::span<const ObjectId> ids, int device,
      std::chrono::milliseconds timeout = std::chrono::milliseconds(0));
  Result<DeviceBuffer> GetOnDevice(
      const ObjectId& id, int device,
      std::chrono::milliseconds timeout = std::chrono::milliseconds(0));

  // Drops an object this client is creating. Fails with NotFound, AlreadySealed, NotHeld as
  // Seal does. Outstanding MutableBuffers of it must not be written afterwards.
  Status Abort(const ObjectId& id);

  // Create + copy `data` + Seal, and drops this client's reference. Errors as Create/Seal.
  // Up to 32 KiB, the bytes travel in the request and the daemon does all of it: one round
  // trip, and no reference is held afterwards. Larger data is copied straight into shared
  // memory between Create and Seal (two round trips), and the creator's reference is
  // released as a dropped handle's is.
  Status Put(const ObjectId& id, std::span<const std::byte> data,
             const CreateOptions& options = {});

  // Puts each item as Put does, and returns each one's status, in order: one failing does
  // not stop the others. The small ones (those Put sends in one request) are pipelined, up
  // to kPutManyWindow requests in one write, so that a batch of small objects costs about
  // one round trip per window instead of one per object. Items reach the daemon in order.
  // If the connection breaks, the items not yet answered fail with Disconnected, though the
  // daemon may have stored some of them. Thread-safe, like every Client call.
  std::vector<Status> PutMany(std::span<const PutItem> items);
  static constexpr size_t kPutManyWindow = 256;
  // Puts of at most this many bytes of data travel inside their request (see Put), provided
  // data, metadata and name also fit the daemon's frame limit with room to spare.
  static constexpr size_t kInlinePutBytes = 32 * 1024;

  // Put of an object gathered from `parts` (a value encoded as a header and the buffers it
  // refers to, say): a new object of `data_size` bytes with each part's bytes at its offset
  // and zeros between them and after the last, sealed, and the creator's reference dropped,
  // as Put does. Up to kInlinePutBytes, or when one part is the whole object, it is Put of
  // those bytes (small ones in one round trip); larger objects are created, each part copied
  // straight into shared memory, and sealed. Fails with InvalidArgument, storing nothing,
  // for parts CheckParts refuses; otherwise as Put.
  Status PutParts(const ObjectId& id, uint64_t data_size, std::span<const PutPart> parts,
                  const CreateOptions& options = {});

  // PutMany of objects gathered from parts: each item as PutParts puts it, with PutMany's
  // statuses and order. The small ones (up to kInlinePutBytes) are joined, one copy each,
  // and pipelined as PutMany's are; the larger ones are put one by one, in their place. An
  // item whose parts CheckParts refuses fails with InvalidArgument and spoils none of the
  // others.
  std::vector<Status> PutManyParts(std::span<const PutPartsItem> items);

  // PutParts for a handoff (see Handoff): creates the object, copies the parts in, then
  // seals it and hands it to this client's group in host memory as SealAndHandoff does,
  // deleting it if the handoff fails. Never inline: the creator's reference holds the
  // object until the group has it. Returns that reference, read-only now: while it lives,
  // this client may hand the object off again (Handoff) after every claim. `ttl` as for
  // Handoff. Fails as PutParts and Handoff do (InvalidArgument if this client joined no
  // group).
  Result<Buffer> PutAndHandoff(const ObjectId& id, uint64_t data_size,
                               std::span<const PutPart> parts, const CreateOptions& options = {},
                               std::chrono::milliseconds ttl = std::chrono::milliseconds(0));

  // Returns read-only handles to the objects, in the order of `ids`, waiting up to `timeout`
  // (0: not at all; kForever) for those not sealed yet. An entry is an empty Buffer if its
  // object was not sealed in time (or does not exist). Objects this client already holds
  // cost no round trip. Fails as a whole on connection errors, LimitExceeded for more ids
  // than the daemon's batch limit, InvalidArgument for the nil id, and with the first error
  // of an object that exists but cannot be had: TaskFailed for the output of a task that
  // failed, with the task's message as it is; OutOfMemory, naming the object, when its copy
  // to host memory (from a GPU) finds no room.
  Result<std::vector<Buffer>> Get(std::span<const ObjectId> ids,
                                  std::chrono::milliseconds timeout = std::chrono::milliseconds(0));

  // One object: fails with NotFound if it does not exist and `timeout` is 0, Timeout if it
  // was not sealed within `timeout`, TaskFailed (with the task's message) if it is the
  // output of a task that failed.
  Result<Buffer> Get(const ObjectId& id,
                     std::chrono::milliseconds timeout = std::chrono::milliseconds(0));

  // Get as a Pending: the request goes now and the caller takes the answer when it likes.
  // With `announce`, the answer's arrival is also announced to TakeCompleted (an event
  // loop's way; an announced id is kept until TakeCompleted takes it). Fails at once as Get would
  // before sending (batch limit, nil id); the other failures come from Take.
  Result<Pending<std::vector<Buffer>>> StartGet(std::span<const ObjectId> ids,
                                                std::chrono::milliseconds timeout = kForever,
                                                bool announce = false);
  // GetOnDevice as a Pending, as StartGet.
  Result<Pending<std::vector<DeviceBuffer>>> StartGetOnDevice(
      std::span<const ObjectId> ids, int device, std::chrono::milliseconds timeout = kForever,
      bool announce = false);

  // Waits until `count` of `ids` (0: all of them; an id listed twice counts twice) are
  // sealed, as an object or as a failed task's output, or until `timeout` has passed;
  // returns, per id, whether it is then. Holds nothing and copies nothing. Fails with
  // InvalidArgument for a count above the number of ids or the nil id, LimitExceeded past
  // the daemon's batch limit.
  Result<std::vector<bool>> Wait(std::span<const ObjectId> ids, size_t count = 0,
                                 std::chrono::milliseconds timeout = kForever);
  // Wait as a Pending, as StartGet.
  Result<Pending<std::vector<bool>>> StartWait(std::span<const ObjectId> ids, size_t count = 0,
                                               std::chrono::milliseconds timeout = kForever,
                                               bool announce = false);

  // For an event loop running Pendings started with `announce`, none of whose callbacks
  // may block: watch fd() and call Pump() when it is readable (it reads what has come,
  // without blocking); watch CompletionFd() and call TakeCompleted() when it is readable
  // (the ids of the Pendings whose answers are in, whichever thread read them). Then Take
  // those, which does not block.
  int fd() const;
  void Pump();
  Result<int> CompletionFd();
  std::vector<uint64_t> TakeCompleted();

  // Deletes objects. An object that is referenced goes when its last reference is
  // released; new Gets cannot find it meanwhile. Fails with NotFound for an unknown id
  // (the others are still deleted) and NotSealed for an object still being created.
  Status Delete(const ObjectId& id);
  Status Delete(std::span<const ObjectId> ids);
  // Deletes each object once no pending task reads or makes it, and at once (as Delete)
  // those no pending task reads or makes now: how a client gives up the intermediate
  // outputs of a graph once it has submitted every task that reads them. Fails as Delete
  // does; an output of a pending task counts as found and sealed.
  Status DeleteAfterTasks(std::span<const ObjectId> ids);

  // Hands objects to this client's group (ConnectOptions::group) for another of its
  // processes to Claim, as a sender does who may exit before the receiver takes them: the
  // group holds one reference to each object (on GPU `device`, this process's ordinal, or
  // in host memory) until a member claims it, or until every session of the group has
  // gone. The objects are deleted, so that they go as soon as the group and their claimers
  // have let go; Get no longer finds them. This client must hold a reference to each one
  // from the daemon (its creator's, or a Get's: not one answered through a lease), or the
  // group one already (the same value sent twice). With a `ttl` (whole milliseconds, at
  // most about 49 days), the group also gives each reference back if nobody has claimed it
  // by then, so a handoff whose receiver never comes is not held for the group's life.
  // Fails with the first object's error: NotFound, NotSealed, NotHeld, LimitExceeded;
  // InvalidArgument without a group or for a ttl out of range.
  Status Handoff(std::span<const ObjectId> ids, int device = kHostMemory,
                 std::chrono::milliseconds ttl = std::chrono::milliseconds(0));
  // Seals an object this client is creating (Seal) and hands it to the group (Handoff) on
  // `device`: kHostMemory, or the GPU it was created on; `ttl` as for Handoff. One request:
  // the daemon seals and hands off, so a sender that dies meanwhile leaves nothing. If the
  // handoff fails, the daemon deletes the
  // object and returns the handoff's error: handed off or not, Get no longer finds it, and
  // an object under a random id that nobody else knows does not stay in the store,
  // unreachable. The creator's handle keeps its reference either way, until it is dropped.
  // Fails as Seal does (the object is then not deleted) and as Handoff does.
  Status SealAndHandoff(const ObjectId& id, int device = kHostMemory,
                        std::chrono::milliseconds ttl = std::chrono::milliseconds(0));
  // Takes over one of the group's references to each object that was handed off: read-only
  // handles, in the order of `ids`, as Get returns them. Never waits. Fails with NotHeld,
  // naming the object, when the group holds none (claimed already, never handed off, or the
  // group ended); InvalidArgument without a group. A batch that fails gives back what it
  // claimed: those handoffs are used up, so claim one id per call where that matters.
  Result<std::vector<Buffer>> Claim(std::span<const ObjectId> ids);
  // The same for objects handed off on GPU `device`.
  Result<std::vector<DeviceBuffer>> ClaimOnDevice(std::span<const ObjectId> ids, int device);

  // Whether a sealed object with this id exists (and is not pending deletion).
  Result<bool> Contains(const ObjectId& id);

  // Where each of `ids` is, in order: in host memory, on which GPUs (of those this process
  // can see), and how large. Objects this client holds are answered from the shared header
  // table, with no round trip, as the daemon last published them; the others with one
  // request. Holds nothing, so an answer may be out of date by the time it is read (a copy
  // made or dropped, the object deleted). Fails with LimitExceeded past the daemon's batch
  // limit.
  Result<std::vector<ObjectPlacement>> Locate(std::span<const ObjectId> ids);

  // Every object in the store, sealed or being created, in slot order; with a `prefix`, those
  // whose names start with it (the daemon filters: a page carries only those). InvalidArgument
  // for a prefix longer than the longest name (4,096 bytes).
  Result<std::vector<ObjectInfo>> List(std::string_view prefix = {});
  // The `n` largest objects by data size (ties: oldest first), largest first, in one
  // request; at most 1,000 (the daemon's page size).
  Result<std::vector<ObjectInfo>> ListLargest(uint32_t n);

  // The clients connected to the daemon, this one included, by session id: who they are
  // and what they hold.
  Result<std::vector<ClientInfo>> Clients();

  // One object's header fields and the clients holding references to it. Fails with
  // NotFound (naming the id) if no object has this id; an object being created or deleted
  // but still referenced is found.
  Result<ObjectDetails> Describe(const ObjectId& id);

  // Recomputes the checksums of `ids` (empty: of every sealed object that has one) and
  // compares them with those taken at Seal: one result per id, in order (for an empty
  // `ids`, in slot order). The daemon hashes on its worker threads and holds each object
  // meanwhile, so none is evicted or freed while being read. Fails as a whole only on
  // connection errors or LimitExceeded for more ids than the daemon's batch limit.
  Result<std::vector<VerifyResult>> Verify(std::span<const ObjectId> ids = {});

  // Evicts sealed objects that no client references and that are not pinned, least
  // recently used first, until at least `bytes` are freed or none is left; with
  // `all_unreferenced`, every one of them. Returns what was evicted (counted in
  // StoreStatus::evictions like evictions under memory pressure). Fails with
  // InvalidArgument if `bytes` is 0 and `all_unreferenced` is false.
  Result<EvictResult> Evict(uint64_t bytes, bool all_unreferenced = false);

  // The daemon's capacity, usage and counters.
  Result<StoreStatus> GetStatus();

  // The daemon's counters, latency histograms and gauges in the Prometheus text exposition
  // format (version 0.0.4), as `depotd --metrics-port` serves them at /metrics.
  Result<std::string> Metrics();

  // Tasks (depot/task.h). Submits `tasks`, all or none: each one's output ids, in order.
  // Fails, submitting nothing, with the daemon's reason naming the task: InvalidArgument
  // (bad resources or bounds, a function no attached worker can run with the resources
  // asked, a cycle), NotFound (an input that neither exists nor is a task's output) or
  // AlreadyExists (an output id taken).
  Result<std::vector<std::vector<ObjectId>>> Submit(std::span<const TaskRequest> tasks);
  Result<std::vector<ObjectId>> Submit(const TaskRequest& task);
  // Cancels the tasks producing `outputs` that have not started; one outcome per id.
  Result<std::vector<CancelOutcome>> Cancel(std::span<const ObjectId> outputs);
  // The workers attached, by session id; the pending tasks by id, then recent finished ones.
  Result<std::vector<WorkerInfo>> Workers();
  Result<std::vector<TaskInfo>> Tasks();

  // The daemon's epoch (random per daemon start) and this connection's session id.
  uint64_t epoch() const;
  uint64_t session_id() const;
  const std::string& socket_path() const;

 private:
  friend class Worker;  // runs tasks over a Client's connection
  explicit Client(std::shared_ptr<internal::Connection> conn);
  Status Delete(std::span<const ObjectId> ids, bool after_tasks);
  // The object `reply` (to a create of `id`) made: its holding, filed with the connection.
  Result<MutableBuffer> Created(const ObjectId& id, uint64_t data_size,
                                const CreateOptions& options, internal::Reply& reply);
  // Handoff; with `seal`, of the one object in `ids` this client is creating, which the
  // daemon seals first (and deletes if the handoff fails): SealAndHandoff in one request.
  Status Handoff(std::span<const ObjectId> ids, int device, std::chrono::milliseconds ttl,
                 bool seal);
  // `id`, which this client created, is sealed (by its seal, or by the daemon with a task's
  // completion): what this client holds of it is now read as sealed.
  void Sealed(const ObjectId& id);
  std::shared_ptr<internal::Connection> conn_;
};

}  // namespace depot
