// A session: one client connection. It reads frames, decodes requests, calls the object
// store, and writes replies (with the file descriptors of segments the client has not been
// sent yet). Anything malformed closes this session only, with a logged reason.
#pragma once

#include <sys/types.h>

#include <boost/asio/local/stream_protocol.hpp>

#include <capnp/message.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_set>

#include "depot/ipc/framing.h"
#include "protocol.capnp.h"
#include "store/metrics.h"
#include "store/object_store.h"

namespace depot::store {

class Server;

// Who is on the other end, from SO_PEERCRED.
// What a client's uid may do (docs/architecture.md, Trust).
enum class Access : uint8_t {
  kNone,  // another uid the daemon does not share with: refused at hello
  kRead,  // a uid or group of --share-with-*: gets, lists and status, nothing that changes objects
  kFull,  // root, or the daemon's own uid
};

struct Peer {
  pid_t pid = 0;
  uid_t uid = static_cast<uid_t>(-1);  // unknown until SO_PEERCRED says
  std::string command;                 // /proc/<pid>/comm
  Access access = Access::kNone;
};

// What a reply carries besides its message: the segments up to `max_segment` (-1: none) that
// the session has not been sent, read-only; `writable_segment` (-1: none) writable, unless
// it was sent so before; likewise the chunks up to `max_chunk` of GPU `chunk_device`'s pool
// (kHost: none) and its `writable_chunk`; and one more descriptor of the reply's own.
struct ReplyAttachments {
  int64_t max_segment = -1;
  int64_t writable_segment = -1;
  int32_t chunk_device = kHost;
  int64_t max_chunk = -1;
  int64_t writable_chunk = -1;
  int extra_fd = -1;
};

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(Server& server, boost::asio::local::stream_protocol::socket socket, ClientId id,
          Peer peer);
  ~Session();

  void Start();
  // Closes the connection and gives back everything the client held. Idempotent.
  void Close(const std::string& reason);
  // Closes the session of a client that broke the protocol.
  void Violation(const std::string& what);

  ClientId id() const { return id_; }
  const Peer& peer() const { return peer_; }
  // For the admin views: the name the client gave in hello (empty before it), when it
  // connected (CLOCK_REALTIME ns), the requests it has sent, and whether it has gone.
  const std::string& client_name() const { return client_name_; }
  uint64_t connected_time_ns() const { return connected_time_ns_; }
  uint64_t requests() const { return requests_; }
  bool closed() const { return closed_; }

 private:
  void WaitReadable();
  // Counts the read buffer's growth past what every session may take (or its shrinking) in
  // the client's metadata; LimitExceeded if that would pass a limit.
  Status ChargeReadBuffer();
  void OnReadable();
  // Handles the complete frames read so far; returns false when the session has closed or
  // must wait for its replies to drain (paused_).
  bool HandleBufferedFrames();
  // Goes on after the replies drained: the frames already read first, then the socket.
  void Resume();
  // Handles one frame; returns false when the session must close (reason already given).
  bool HandleFrame(ipc::FrameReader::Frame& frame);
  void Dispatch(wire::Request::Reader request);

  // OK if this client's uid may make `request`, else PermissionDenied saying why.
  Status CheckAccess(wire::Request::Reader request) const;
  void HandleHello(uint64_t rid, wire::Request::Hello::Reader hello);
  // `start`: when the request arrived (monotonic ns), 0 when metrics are off.
  void HandleCreate(uint64_t rid, wire::Request::Create::Reader create, uint64_t start);
  // Gives back one reference per id on each group's tier; the first error (NotHeld, or a
  // tier the daemon does not serve) is the answer, the other ids are still released.
  void HandleRelease(uint64_t rid, capnp::List<wire::Request::TierRefs>::Reader tiers,
                     uint64_t start);
  // The ids of a get or prefetch; nullopt after answering `rid` with why they are refused
  // (more than the batch limit, or the nil id).
  std::optional<std::vector<ObjectId>> GetIds(uint64_t rid, capnp::List<wire::Id>::Reader list);
  void HandleGet(uint64_t rid, wire::Request::Get::Reader get, uint64_t start);
  void HandlePrefetch(uint64_t rid, wire::Request::Get::Reader prefetch, uint64_t start);
  void HandleList(uint64_t rid, wire::Request::ListObjects::Reader list, uint64_t start);
  struct ListJob;
  // One slice of a list reply: a stretch of the walk, or some entries of the reply; true
  // when the reply has gone.
  bool ListSlice(ListJob& job);
  void HandleStatus(uint64_t rid);
  // Admin requests (depotctl).
  void HandleClients(uint64_t rid);
  void HandleObjectInfo(uint64_t rid, const ObjectId& id);
  void HandleVerify(uint64_t rid, wire::Request::Verify::Reader verify, uint64_t start);
  struct VerifyJob;
  // Starts verifying a small batch of the job's objects; true when the job leaves the
  // SliceQueue (enough batches in flight, or none left to start).
  bool VerifySlice(const std::shared_ptr<VerifyJob>& job);
  // Files a batch's outcomes (results `first` on); queues the job again, or replies.
  void VerifyBatchDone(const std::shared_ptr<VerifyJob>& job, unsigned first,
                       std::vector<VerifyOutcome> outcomes);
  void SendVerifyReply(VerifyJob& job);
  void HandleEvict(uint64_t rid, wire::Request::Evict::Reader evict);

  // Requests that walk many objects (list, verify) run as jobs of slices on the server's
  // SliceQueue, between which everyone else's requests run. A session may have
  // kMaxJobsPerSession of them at once; then it handles none of its later requests until
  // one ends (they wait, in order, as for paused_). BeginJob counts `bytes`, what the job may
  // hold, against the client's limits, or answers `rid` LimitExceeded and returns false;
  // EndJob gives them back.
  bool BeginJob(uint64_t rid, uint64_t bytes);
  void EndJob(uint64_t bytes);
  // Queues `slice` (true: no more slices) on the SliceQueue; it is dropped if the session
  // has closed by the time it would run.
  void RunSlices(std::function<bool()> slice);
  // Runs `work` (a slice, or a job's callback); an exception closes the session, as in
  // HandleFrame. Returns what `work` returned, or true after an exception.
  bool Guarded(const std::function<bool()>& work);

  void SealAfterPut(uint64_t rid, const ObjectId& id, bool release, const Location& loc,
                    uint64_t start);

  // Sends a reply with the descriptors `attach` names.
  void SendReply(capnp::MessageBuilder& message, wire::Reply::Builder reply,
                 const ReplyAttachments& attach = {});
  void AttachChunks(wire::Reply::Builder reply, int32_t device, int64_t max_chunk,
                    int64_t writable_chunk, std::vector<int>& fds);
  void Observe(RequestType type, uint64_t start);
  void SendOk(uint64_t rid);
  // A create's reply; `writable`: the creator will write the bytes (not a put).
  void SendLocation(uint64_t rid, const Location& loc, bool writable);
  void SendError(uint64_t rid, const Status& status);
  void Flush();
  bool CheckBatch(uint64_t rid, size_t count);

  Server& server_;
  boost::asio::local::stream_protocol::socket socket_;
  const ClientId id_;
  const Peer peer_;
  const uint64_t connected_time_ns_;
  std::string client_name_;
  ipc::FrameReader reader_;
  std::deque<ipc::OutFrame> out_;
  size_t out_bytes_ = 0;
  bool writing_ = false;
  bool reading_ = false;
  bool paused_ = false;  // not reading until queued replies drain
  int jobs_ = 0;         // jobs running (BeginJob)
  bool closed_ = false;
  bool said_hello_ = false;
  bool counted_close_ = false;                  // metrics already counted this close
  uint32_t segments_sent_ = 0;                  // read-only: segments 0 .. segments_sent_ - 1
  std::unordered_set<uint32_t> writable_sent_;  // segments sent writable
  std::vector<uint32_t> chunks_sent_;           // by GPU: chunks of its pool sent so far
  std::set<std::pair<int32_t, uint32_t>> writable_chunks_sent_;  // (GPU, chunk) sent writable
  uint64_t requests_ = 0;
  uint64_t buffer_charge_ = 0;  // of the read buffer, counted by ChargeRequests
  uint64_t jobs_charge_ = 0;    // of the jobs running, likewise
};

}  // namespace depot::store
