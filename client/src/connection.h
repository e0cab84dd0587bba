// Connection: one Client's socket to the daemon, and everything the Client shares with the
// Buffers it handed out (segment mappings, the table of held objects).
//
// Requests are pipelined: any number of threads may wait for replies at once. There is no
// reader thread (a hand-off between threads costs several microseconds per request);
// instead, leader/follower: a caller sends its request, and if no other thread is reading
// the socket it becomes the reader, files the replies it reads for the other callers and
// wakes them, and on receiving its own reply hands the reader role to a waiting caller.
//
// Releases are batched. A dropped Holding or DeviceHolding queues its reference, an id on
// a tier (Release). The queue goes out as one release frame (request id 0, no reply; the
// ids grouped by tier) in the same write as the next request any thread sends, ahead of
// it, so the daemon always processes a client's releases before its later requests. A full
// queue (kReleaseBatch ids) is sent at once by the thread that filled it. Otherwise a
// flusher thread, started with the first release, sends what is still queued at the end of
// a gathering round (kReleaseGatherDelay), so that a client that makes no further request
// never keeps references the daemon could reclaim. Rounds follow one another while handles
// keep being dropped; after two rounds without any, the flusher sleeps until the next
// release wakes it (the only notify: a queue going from empty to not while it sleeps).
#pragma once

#include <capnp/message.h>
#include <capnp/serialize.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "depot/client.h"
#include "depot/ipc/framing.h"
#include "depot/ipc/gpu.h"
#include "depot/ipc/object_header.h"
#include "depot/ipc/protocol.h"
#include "device_import.h"
#include "holding.h"
#include "leases.h"
#include "mapping.h"
#include "segments.h"

namespace depot::internal {

// A reply read from the socket, owned by the caller that asked for it.
class Reply {
 public:
  Reply() = default;
  Reply(const Reply&) = delete;
  Reply& operator=(const Reply&) = delete;

  // The message. Valid while this Reply lives. Cap'n Proto throws kj::Exception from
  // accessors of a malformed message: read it inside Decode().
  wire::Reply::Reader get();
  // The descriptors the reply carried besides those of its new segments (hello's table).
  std::vector<ipc::UniqueFd>& fds() { return fds_; }

 private:
  friend class Connection;
  std::vector<capnp::word> words_;
  std::vector<ipc::UniqueFd> fds_;
  // The dedicated segments the reply carried, mapped until the objects' Holdings take them.
  // (Pushes carry none.)
  std::vector<std::shared_ptr<const Mapping>> mappings_;
  std::optional<capnp::FlatArrayMessageReader> message_;
};

// A request being built. Its first segment lies inside this object, so a small request
// allocates nothing until it is framed.
class RequestMessage {
 public:
  RequestMessage() = default;
  RequestMessage(const RequestMessage&) = delete;
  RequestMessage& operator=(const RequestMessage&) = delete;

  wire::Request::Builder root() { return message_.getRoot<wire::Request>(); }
  capnp::MessageBuilder& message() { return message_; }

 private:
  static constexpr size_t kFirstSegmentWords = 64;
  capnp::word first_segment_[kFirstSegmentWords]{};  // zeroed, as MallocMessageBuilder needs
  capnp::MallocMessageBuilder message_{kj::arrayPtr(first_segment_, kFirstSegmentWords)};
};

// Runs `decode` (which reads a Reply and returns a Status or Result), turning an exception
// Cap'n Proto throws on a malformed reply into an Internal error: exceptions never cross
// the client's API.
template <typename F>
auto Decode(F&& decode) -> decltype(decode()) {
  try {
    return decode();
  } catch (const kj::Exception& e) {
    return Status::Internal(std::string("malformed reply from the daemon: ") +
                            e.getDescription().cStr());
  }
}

// How many times this process came out of fork() as the child (see Connection::forked).
extern std::atomic<uint64_t> fork_generation;

// A GPU as the daemon's hello describes it.
struct DaemonGpu {
  ipc::DeviceUuid uuid{};
  std::string name;
  bool simulated = false;
};

class Connection {
 private:
  // A reply awaited: on Call's stack, in CallMany's array, in a Pending. Guarded by mu_.
  struct Waiter {
    uint64_t id;
    Reply* reply;
    bool done = false;
    Status status;  // set, with done, when the connection breaks first
    // A thread waits for it in Await, so may take the reader role (a Pending's often has
    // none: its owner looks at it now and then, or an event loop learns of it).
    bool awaited = false;
    bool notify = false;   // its completion is announced (completion_fd, TakeCompleted)
    bool discard = false;  // nobody reads its reply: its Pending goes with it (SendDiscarding)
    std::condition_variable cv;
  };

 public:
  // A request sent whose reply is awaited later, in slices, or by an event loop (Start).
  // Whichever thread reads the reply files it here. It stays registered with the
  // connection until its reply is in or the connection breaks (Done): its owner keeps it
  // alive until then.
  class Pending {
   public:
    Pending() { waiter_.reply = &reply_; }
    Pending(const Pending&) = delete;
    Pending& operator=(const Pending&) = delete;
    uint64_t id() const { return waiter_.id; }
    Reply& reply() { return reply_; }

   private:
    friend class Connection;
    Reply reply_;
    Waiter waiter_{};
  };

  // Connects to the daemon at `socket_path` and performs the handshake. Fails with
  // ConnectionFailed if no daemon listens there and ProtocolMismatch (the daemon's message)
  // if it speaks another protocol version.
  static Result<std::shared_ptr<Connection>> Open(const std::string& socket_path,
                                                  const ConnectOptions& options);

  Connection(ipc::UniqueFd socket, std::string socket_path, std::chrono::microseconds spin);
  // Threads a put copies a large object with (ConnectOptions::copy_threads, resolved).
  unsigned copy_threads() const { return copy_threads_; }
  // ConnectOptions::handoff_grace, in milliseconds.
  uint32_t handoff_grace_ms() const { return handoff_grace_ms_; }
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;
  // Stops the flusher; releases still queued are dropped (closing the socket releases
  // everything). Never runs on the flusher thread, which holds no reference to this.
  ~Connection();

  // Sends `request` (its id is set here), preceded in the same write by the queued
  // releases, and waits for the reply. Returns the reply's error as a Status (OK: read the
  // result from `*reply`); Disconnected if the connection breaks first or broke earlier, or
  // in a child process forked after the connection was made; LimitExceeded if the request
  // exceeds the daemon's frame limit. Thread-safe.
  Status Call(RequestMessage& request, Reply* reply);
  // Call for several requests at once: they go out in one write, after the queued releases,
  // and the caller waits for every reply (`replies[i]` for `requests[i]`). Returns each
  // request's status as Call would, in order. The caller reads no reply until all are
  // written, and the daemon stops reading once it holds 64 MiB of replies unsent: keep a
  // batch's replies well below that (hundreds of small replies, not a get of large ones).
  // Thread-safe.
  std::vector<Status> CallMany(std::span<RequestMessage* const> requests, Reply* replies);

  // Sends `request` as Call does, and returns without waiting for its reply: AwaitUntil
  // waits for it. With `notify`, its completion is also announced through completion_fd()
  // and TakeCompleted (for an event loop, whose callbacks must not block). Thread-safe.
  Result<std::unique_ptr<Pending>> Start(RequestMessage& request, bool notify = false);
  // Waits for `pending`'s reply until `deadline` (none: for as long as it takes), reading
  // replies for every caller meanwhile, as Call does. Returns nullopt if the deadline came
  // first, else what Call would have returned. Thread-safe; one thread per Pending.
  std::optional<Status> AwaitUntil(Pending& pending,
                                   std::optional<std::chrono::steady_clock::time_point> deadline);
  // Whether `pending`'s reply is in, or the connection broke (or this is a forked child).
  bool Done(const Pending& pending);
  // Sends `request` as Call does, and forgets it: its reply is dropped when it comes (for
  // a request whose answer nobody needs, such as a cancelWait). Never waits for the daemon
  // unless the socket is full. Thread-safe.
  Status SendDiscarding(RequestMessage& request);
  // Reads and files the replies the socket holds now, without blocking, unless another
  // thread is reading it: what an event loop calls when fd() is readable. Thread-safe.
  void Pump();
  // The socket, for an event loop to watch (Pump).
  int fd() const { return socket_.get(); }
  // An eventfd that is readable while TakeCompleted has ids to give; made on first use.
  Result<int> completion_fd();
  // The ids of the notify Pendings completed since the last call (in the order their
  // replies came, or broken), and clears completion_fd(). Only Pendings started with
  // `notify` are announced, and their ids are kept until taken: start them only where
  // something takes them. Thread-safe.
  std::vector<uint64_t> TakeCompleted();

  // Sends `request` with id 0, asking for no reply (a worker's completions), after the
  // queued releases. Disconnected as Call. Thread-safe.
  Status Post(RequestMessage& request);
  // Waits for the next message the daemon pushes unasked (a Reply with id 0: a worker's
  // assignments), reading replies for every caller meanwhile, as Call does; pushes that came
  // while nobody waited are kept, in order. Disconnected when the connection breaks.
  // Thread-safe; meant for one thread at a time.
  Status AwaitPush(Reply* push);
  // A push read already and kept (no thread waited in AwaitPush when it came), without
  // reading the socket: whether there was one. Disconnected once the connection breaks.
  Result<bool> TakePush(Reply* push);
  // Called, on the thread that read it and with no lock held, for each push that arrives
  // while no thread waits in AwaitPush (it is kept for the next one): the worker wakes a
  // thread to take it.
  void SetPushHook(std::function<void()> hook) {
    std::lock_guard lock(mu_);
    push_hook_ = std::move(hook);
  }

  // Gives a reference back, asking for no reply: queues `id` on `device` (host memory, or
  // the daemon's index of a GPU) for the next release frame (see the top of this file).
  // Does nothing once the connection is broken (the daemon has released everything then),
  // nor in a forked child (the socket is the parent's). Thread-safe; never blocks on the
  // daemon except when it fills the queue.
  void Release(const ObjectId& id, int32_t device = ipc::kHostDevice);

  // GPUs. The daemon numbers them in its own order; this process by its CUDA ordinals.
  const std::vector<DaemonGpu>& gpus() const { return gpus_; }
  // The daemon's index of this process's GPU `ordinal`; InvalidArgument if the daemon does
  // not serve it.
  Result<int32_t> DaemonDevice(int ordinal);
  // This process's ordinal of the daemon's GPU `device`, or -1.
  int LocalOrdinal(int32_t device);
  // The address in this process of bytes [offset, offset + size) of chunk `chunk` of GPU
  // `device`'s pool, imported when the daemon announced it: in its read-write mapping if
  // `writable` (a creator's), else in its read-only one where there is one. Thread-safe.
  Result<uint64_t> ResolveChunk(int32_t device, uint32_t chunk, uint64_t offset, uint64_t size,
                                bool writable);
  // The importer matching the daemon's GPUs, made on first use.
  Result<DeviceImporter*> Importer();

  // Whether the connection broke: the daemon has then released every reference it held.
  bool broken() const { return is_broken_.load(std::memory_order_acquire); }
  // Whether this process is a child forked after the connection was made. The socket then
  // belongs to the parent, and only the forking thread was copied: the child sends nothing
  // and takes no lock another thread of the parent may have held at the fork.
  bool forked() const {
    return fork_generation.load(std::memory_order_relaxed) != fork_generation_;
  }

  // The header of `slot` in the shared header table; null if the slot is out of range.
  const ipc::ObjectHeader* header(uint32_t slot) const;
  std::span<const ipc::ObjectHeader> headers() const {
    return {reinterpret_cast<const ipc::ObjectHeader*>(header_table_.data()), header_slots_};
  }

  // Leases (leases.h): off when the daemon gave no table.
  Leases& leases() { return leases_; }
  // Drops the lease a Holding of `id` in `slot` had, and tells the daemon of the read with
  // the next releases (ipc::kLeasedReads). Thread-safe.
  void DropLease(const ObjectId& id, uint32_t slot);

  Segments& segments() { return segments_; }
  HoldingTable& holdings() { return holdings_; }
  uint64_t epoch() const { return epoch_; }
  uint64_t session_id() const { return session_id_; }
  uint32_t max_batch() const { return max_batch_; }
  uint32_t max_frame_bytes() const { return max_frame_bytes_; }
  const std::string& socket_path() const { return socket_path_; }

 private:
  Status Handshake(const ConnectOptions& options);
  // Gives `request` an id, registers `me` for its reply, and sends it (after the queued
  // releases). An error if it was not sent; a send that fails breaks the connection, which
  // completes `me` with why.
  Status SendAwaited(RequestMessage& request, Waiter& me);
  // Imports the chunks a reply announces; `fds` are the descriptors after its segments'.
  Status ImportChunks(capnp::List<wire::Chunk>::Reader chunks, std::vector<ipc::UniqueFd>& fds);
  // Writes the queued releases, then `requests`, in one sendmsg (as far as the socket takes
  // them); breaks the connection on failure. The flusher says so (`from_flusher`): it does
  // all but taking the send lock and the write inside the fork gate (connection.cc).
  void Send(std::span<ipc::OutFrame> requests, bool from_flusher = false);
  // Waits until `me` is done or `deadline`, reading replies for everyone while no other
  // thread does. Returns whether `me` is done.
  bool Await(Waiter& me, std::optional<std::chrono::steady_clock::time_point> deadline = {});
  // Wakes a thread waiting for its reply other than `except`'s, to take the reader role.
  // Called with mu_ held, once reading_ is false.
  void HandOnReading(const Waiter* except);
  // Marks `w` done (its reply, or the connection's failure, filed), and wakes or announces
  // it. Called with mu_ held.
  void Complete(Waiter* w);
  // A reference queued for release.
  struct Ref {
    ObjectId id;
    int32_t device;
  };
  // Most ids one release frame carries: the daemon's maxBatch, and what fits its frame limit
  // with a group for every tier.
  size_t ReleaseIdsPerFrame() const;
  // Appends to out_frames_ the release frames of sending_, grouped by tier.
  void EncodeReleases();
  // The flusher thread's body (see the top of this file).
  void FlushLoop();
  // Starts the flusher. Called with release_mu_ held, at the first release.
  void StartFlusher();
  // As the reader: reads and files replies until `me`'s has arrived, the connection breaks,
  // or `deadline`.
  void ReadUntilDone(Waiter& me, std::optional<std::chrono::steady_clock::time_point> deadline);
  // Files every frame already buffered, setting `*mine` if `me`'s reply was one. Returns
  // false after breaking the connection on a bad frame.
  bool FileBuffered(const Waiter* me, bool* mine);
  // Files one frame's reply for its waiter, after mapping the segments it announces.
  // Returns whether it was `me`'s; an error means the daemon broke the protocol.
  Result<bool> Dispatch(ipc::FrameReader::Frame frame, const Waiter* me);
  // Waits for the socket to be readable (first polling for up to spin_, while polling
  // pays: see ShouldSpin; with a `deadline`, until then at most, setting `*timed_out` if
  // nothing came) and reads what is there.
  Status Fill(std::optional<std::chrono::steady_clock::time_point> deadline = {},
              bool* timed_out = nullptr);
  // Adaptive spinning: whether this wait polls first. Reader only.
  bool ShouldSpin();
  // Fails every waiter, and every later call, with `why`; shuts the socket down.
  void Break(Status why);

  ipc::UniqueFd socket_;
  const std::string socket_path_;
  const std::chrono::microseconds spin_;
  unsigned copy_threads_ = 1;
  uint32_t handoff_grace_ms_ = 0;
  const uint64_t fork_generation_;  // the process's fork generation when connected
  std::atomic<uint64_t> next_id_{1};

  // From the handshake.
  uint64_t epoch_ = 0;
  uint64_t session_id_ = 0;
  uint32_t max_batch_ = ipc::kDefaultMaxBatch;
  uint32_t max_frame_bytes_ = ipc::kDefaultMaxFrameBytes;
  uint32_t header_slots_ = 0;
  Mapping header_table_;  // read-only

  // One writer at a time on the socket. Held while the release queue is taken and written,
  // so that releases reach the socket in the order they were queued relative to requests.
  // Lock order: send_mu_, then release_mu_.
  std::mutex send_mu_;
  std::vector<Ref> sending_;               // the queue being sent; guarded by send_mu_
  std::vector<ipc::OutFrame> out_frames_;  // its frames; guarded by send_mu_

  // The flusher's thread and what it sleeps on. On the heap, created with the first
  // release, so that a forked child can leave it alone (see ~Connection).
  struct Flusher {
    std::condition_variable cv;  // with release_mu_
    std::thread thread;
    std::atomic<bool> started{false};  // its code runs (see StartFlusher)
  };

  // The release queue and the flusher's state, guarded by release_mu_.
  std::mutex release_mu_;
  std::vector<Ref> releases_;  // references that go back with the next write
  size_t release_batch_;       // send at once at this many ids (see Handshake)
  std::unique_ptr<Flusher> flusher_;
  bool flusher_idle_ = false;  // it waits for a first release, and needs a notify
  bool released_ = false;      // a release was queued in the flusher's current round
  bool stop_flusher_ = false;
  bool no_flusher_ = false;  // its thread could not start: releases go at once

  std::mutex mu_;
  bool reading_ = false;             // some caller is the reader
  size_t awaiting_ = 0;              // threads in Await (Waiter::awaited)
  std::vector<Waiter*> waiters_;     // callers whose reply has not arrived; id 0: AwaitPush's
  std::function<void()> push_hook_;  // SetPushHook's
  // Pushes read while no AwaitPush waited, oldest first.
  std::deque<std::pair<std::vector<capnp::word>, std::vector<ipc::UniqueFd>>> pushes_;
  Status broken_;  // why the connection is unusable; OK while it works
  std::atomic<bool> is_broken_{false};
  // Announced completions (Waiter::notify): their ids, and the eventfd that says so.
  std::vector<uint64_t> completed_;
  ipc::UniqueFd completion_fd_;
  // The requests sent by SendDiscarding whose replies have not come, by id.
  std::unordered_map<const Waiter*, std::unique_ptr<Pending>> discarded_;

  ipc::FrameReader reader_;  // used only by the thread that is the reader
  // Adaptive spinning; used only by the thread that is the reader.
  uint32_t spin_debt_ = 0;   // what recent misses cost, less recent hits (see kSpinMissCost)
  uint32_t spin_skips_ = 0;  // waits that did not poll since polling was turned off

  Segments segments_;
  HoldingTable holdings_;
  Leases leases_;

  // GPUs, from the handshake, and their chunks, imported as the daemon announces them.
  std::vector<DaemonGpu> gpus_;
  std::mutex device_mu_;
  std::unique_ptr<DeviceImporter> importer_;  // guarded by device_mu_
  Status importer_error_;                     // why it could not be made; guarded by device_mu_
  struct ImportedEntry {
    std::shared_ptr<ImportedChunk> chunk;  // shared with this process's other connections
    Status error;                          // why importing failed, if it did
  };
  // By (GPU, chunk, writable); guarded by device_mu_.
  std::map<std::tuple<int32_t, uint32_t, bool>, ImportedEntry> chunks_;
};

// LimitExceeded, saying `what` it was, if a request naming `count` ids is over the daemon's
// batch limit.
Status CheckBatch(size_t count, const Connection& conn, const char* what);
// The error for a reply of another kind than its request's.
Status UnexpectedReply(const char* request);

}  // namespace depot::internal
