// A session: one client's requests. Its Connection carries the frames; the session decodes
// each request, checks that the client may make it, and hands it to its handler (the data
// requests, the admin requests, or the scheduler's task requests) with a Responder to
// answer through and what the handler needs to know of the requester. It says hello itself,
// and runs the long requests' jobs. Anything malformed closes this session only, with a
// logged reason.
#pragma once

#include <boost/asio/local/stream_protocol.hpp>

#include <capnp/message.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "protocol.capnp.h"
#include "store/admin_requests.h"
#include "store/connection.h"
#include "store/metrics.h"
#include "store/object_store.h"
#include "store/peer.h"
#include "store/requester.h"
#include "store/responder.h"

namespace depot::store {

class Server;

class Session : public std::enable_shared_from_this<Session>,
                public Responder::Sink,
                public Jobs,
                private Connection::Handler {
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

  // Responder::Sink: replies, and messages the daemon pushes (id 0).
  void Send(capnp::MessageBuilder& message, wire::Reply::Builder reply,
            const ReplyAttachments& attach) override {
    connection_->Send(message, reply, attach);
  }
  bool closed() const override { return connection_->closed(); }
  uint64_t client_id() const override { return id_; }

  // Jobs: the list and verify requests' slices.
  bool BeginJob(const Responder& reply, uint64_t bytes) override;
  void EndJob(uint64_t bytes) override;
  void RunSlices(std::function<bool()> slice) override;
  void RunGuarded(const std::function<void()>& work) override;

 private:
  // Connection::Handler.
  void OnFrame(kj::ArrayPtr<const capnp::word> payload) override;
  bool Saturated() const override;
  Status Charge(int64_t bytes) override;
  void OnClosed(const std::string& reason, bool protocol_error) override;

  void Dispatch(wire::Request::Reader request);
  // The handler of each request other than hello.
  void Handle(const Responder& reply, wire::Request::Reader request);
  // OK if this client's uid may make `request`, else PermissionDenied saying why.
  Status CheckAccess(wire::Request::Reader request) const;
  void HandleHello(const Responder& reply, wire::Request::Hello::Reader hello);
  // Runs `work`; an exception closes the session, as in OnFrame. Returns what `work`
  // returned, or true after an exception.
  bool Guarded(const std::function<bool()>& work);
  // Closes this session from the loop, after the reply just sent has gone out.
  void CloseSoon(std::string reason);

  Server& server_;
  ObjectStore& store_;
  std::shared_ptr<Connection> connection_;
  const ClientId id_;
  const Peer peer_;
  const uint64_t connected_time_ns_;
  std::string client_name_;
  bool said_hello_ = false;
  // Who this session is to its requests' handlers; its group is set at hello.
  Requester requester_;
  // The group this session joined at hello (Groups): its key.
  std::string group_key_;
  int jobs_ = 0;  // jobs running (BeginJob)
  uint64_t requests_ = 0;
  uint64_t jobs_charge_ = 0;  // of the jobs running, counted by ChargeRequests
};

}  // namespace depot::store
