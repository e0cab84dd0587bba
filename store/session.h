// A session: one client's requests. Its Connection carries the frames; the session decodes
// each request, checks it, calls the object store, and answers with the reply and the
// descriptors it needs. Anything malformed closes this session only, with a logged reason.
#pragma once

#include <boost/asio/local/stream_protocol.hpp>

#include <capnp/message.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "protocol.capnp.h"
#include "store/connection.h"
#include "store/largest_scan.h"
#include "store/metrics.h"
#include "store/object_store.h"
#include "store/peer.h"

namespace depot::store {

class Server;

class Session : public std::enable_shared_from_this<Session>, private Connection::Handler {
 public:
  Session(Server& server, boost::asio::local::stream_protocol::socket socket, ClientId id,
          Peer peer);
  ~Session() override;

  void Start();
  // Closes the connection and gives back everything the client held. Idempotent.
  void Close(const std::string& reason);

  ClientId id() const { return id_; }
  const Peer& peer() const { return peer_; }
  // For the admin views: the name the client gave in hello (empty before it), when it
  // connected (CLOCK_REALTIME ns), the requests it has sent, and whether it has gone.
  const std::string& client_name() const { return client_name_; }
  uint64_t connected_time_ns() const { return connected_time_ns_; }
  uint64_t requests() const { return requests_; }
  bool closed() const { return connection_->closed(); }

  // Answers, for the request handlers beside the store's (TaskService), and messages the
  // daemon pushes (id 0).
  void Send(capnp::MessageBuilder& message, wire::Reply::Builder reply,
            const ReplyAttachments& attach = {}) {
    connection_->Send(message, reply, attach);
  }
  void SendOk(uint64_t rid);
  void SendError(uint64_t rid, const Status& status);

 private:
  // Connection::Handler.
  void OnFrame(kj::ArrayPtr<const capnp::word> payload) override;
  bool Saturated() const override;
  Status Charge(int64_t bytes) override;
  void OnClosed(const std::string& reason, bool protocol_error) override;

  void Dispatch(wire::Request::Reader request);
  // OK if this client's uid may make `request`, else PermissionDenied saying why.
  Status CheckAccess(wire::Request::Reader request) const;
  // The uid whose objects alone this client may delete or hand off (those end an object's
  // name): its own if it is another uid that may write, none (all) if it is trusted.
  std::optional<uint32_t> OnlyOwnObjects() const {
    return peer_.access == Access::kFull ? std::nullopt : std::optional<uint32_t>(peer_.uid);
  }
  // Whether a request naming `count` objects is within the batch limit; answers `rid` if not.
  bool CheckBatch(uint64_t rid, size_t count);

  // One handler per request; `start`: when the request arrived (monotonic ns), 0 when
  // metrics are off. Each answers its request, now or later, and records its latency.
  void HandleHello(uint64_t rid, wire::Request::Hello::Reader hello, uint64_t start);
  void HandleCreate(uint64_t rid, wire::Request::Create::Reader create, uint64_t start);
  void HandleSeal(uint64_t rid, const ObjectId& id, uint64_t start);
  void HandleAbort(uint64_t rid, const ObjectId& id, uint64_t start);
  void HandleGet(uint64_t rid, wire::Request::Get::Reader get, uint64_t start);
  // A get with `claim`: references the session's group holds (ObjectStore::Claim).
  void HandleClaim(uint64_t rid, wire::Request::Get::Reader get, uint64_t start);
  void HandleHandoff(uint64_t rid, wire::Request::Handoff::Reader handoff, uint64_t start);
  void HandleWait(uint64_t rid, wire::Request::Wait::Reader wait, uint64_t start);
  // Answers this session's get or wait `target` (a request id) now, then `rid`.
  void HandleCancelWait(uint64_t rid, uint64_t target, uint64_t start);
  void SendGetReply(uint64_t rid, int32_t device, const std::vector<GetResult>& results);
  void HandlePrefetch(uint64_t rid, wire::Request::Get::Reader prefetch, uint64_t start);
  // Gives back one reference per id on each group's tier; the first error (NotHeld, or a
  // tier the daemon does not serve) is the answer, the other ids are still released.
  void HandleRelease(uint64_t rid, capnp::List<wire::Request::TierRefs>::Reader tiers,
                     uint64_t start);
  void HandleDelete(uint64_t rid, capnp::List<wire::Id>::Reader ids, uint64_t start);
  void HandleContains(uint64_t rid, capnp::List<wire::Id>::Reader ids, uint64_t start);
  void HandleLocate(uint64_t rid, capnp::List<wire::Id>::Reader ids, uint64_t start);
  void HandleList(uint64_t rid, wire::Request::ListObjects::Reader list, uint64_t start);
  void HandleStatus(uint64_t rid, uint64_t start);
  void HandleMetrics(uint64_t rid, uint64_t start);
  // Admin requests (depotctl).
  void HandleClients(uint64_t rid, uint64_t start);
  void HandleObjectInfo(uint64_t rid, const ObjectId& id, uint64_t start);
  void HandleVerify(uint64_t rid, wire::Request::Verify::Reader verify, uint64_t start);
  void HandleEvict(uint64_t rid, wire::Request::Evict::Reader evict, uint64_t start);

  // The ids of a get, prefetch or wait; nullopt after answering `rid` with why they are refused
  // (more than the batch limit, or the nil id).
  std::optional<std::vector<ObjectId>> GetIds(uint64_t rid, capnp::List<wire::Id>::Reader list);
  void SealAfterPut(uint64_t rid, const ObjectId& id, bool release, const Location& loc,
                    uint64_t start);

  struct ListJob;
  // One slice of a list reply: a stretch of the walk, or some entries of the reply; true
  // when the reply has gone.
  bool ListSlice(ListJob& job);
  struct VerifyJob;
  // Starts verifying a small batch of the job's objects; true when the job leaves the
  // SliceQueue (enough batches in flight, or none left to start).
  bool VerifySlice(const std::shared_ptr<VerifyJob>& job);
  // Files a batch's outcomes (results `first` on); queues the job again, or replies.
  void VerifyBatchDone(const std::shared_ptr<VerifyJob>& job, unsigned first,
                       std::vector<VerifyOutcome> outcomes);
  void SendVerifyReply(VerifyJob& job);

  // Requests that walk many objects (list, verify) run as jobs of slices on the server's
  // SliceQueue, between which everyone else's requests run. A session may have
  // kMaxJobsPerSession of them at once; then it handles none of its later requests until
  // one ends (Saturated). BeginJob counts `bytes`, what the job may hold, against the
  // client's limits, or answers `rid` LimitExceeded and returns false; EndJob gives them back.
  bool BeginJob(uint64_t rid, uint64_t bytes);
  void EndJob(uint64_t bytes);
  // Queues `slice` (true: no more slices) on the SliceQueue; it is dropped if the session
  // has closed by the time it would run.
  void RunSlices(std::function<bool()> slice);
  // Runs `work` (a slice, or a job's callback); an exception closes the session, as in
  // OnFrame. Returns what `work` returned, or true after an exception.
  bool Guarded(const std::function<bool()>& work);
  // Closes this session from the loop, after the reply just sent has gone out.
  void CloseSoon(std::string reason);

  void Observe(RequestType type, uint64_t start);
  void SendReply(capnp::MessageBuilder& message, wire::Reply::Builder reply,
                 const ReplyAttachments& attach = {}) {
    Send(message, reply, attach);
  }
  // A create's reply; `writable`: the creator will write the bytes (not a put).
  void SendLocation(uint64_t rid, const Location& loc, bool writable);

  Server& server_;
  ObjectStore& store_;
  std::shared_ptr<Connection> connection_;
  const ClientId id_;
  const Peer peer_;
  const uint64_t connected_time_ns_;
  std::string client_name_;
  bool said_hello_ = false;
  // The group this session joined at hello (Groups): its key, and its account in the store.
  std::string group_key_;
  std::optional<ClientId> group_;
  int jobs_ = 0;  // jobs running (BeginJob)
  uint64_t requests_ = 0;
  uint64_t jobs_charge_ = 0;  // of the jobs running, counted by ChargeRequests
};

}  // namespace depot::store
