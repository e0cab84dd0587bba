// The answer to one request: where it goes, and what the metrics record of it.
//
// Session::Dispatch makes one Responder per request, and hands it to the request's handler,
// which answers through it exactly once, at once or later (a get that waits, a seal whose
// checksum runs on the worker pool). A Responder holds its session weakly: an answer to a
// session that has gone is dropped. The request's latency, from its arrival to its answer,
// is recorded here, once, for every request, so no handler records it.
#pragma once

#include <capnp/message.h>

#include <cstdint>
#include <memory>

#include "depot/status.h"
#include "protocol.capnp.h"
#include "store/connection.h"
#include "store/metrics.h"

namespace depot::store {

class Responder {
 public:
  // Where answers go: a session's socket.
  class Sink {
   public:
    virtual ~Sink() = default;
    virtual void Send(capnp::MessageBuilder& message, wire::Reply::Builder reply,
                      const ReplyAttachments& attach) = 0;
    virtual bool closed() const = 0;
    // For messages the daemon logs about this client.
    virtual uint64_t client_id() const = 0;
  };

  // The answer to request `rid` (0: the client wants none; an error is then only logged)
  // of `type`, which arrived at `start` (monotonic ns; 0: metrics are off), for `sink`.
  Responder(std::weak_ptr<Sink> sink, Metrics& metrics, uint64_t rid, RequestType type,
            uint64_t start)
      : sink_(std::move(sink)), metrics_(&metrics), rid_(rid), type_(type), start_(start) {}

  uint64_t rid() const { return rid_; }
  // Whether nobody will read the answer (its session has gone): a handler that answers
  // later may skip building it.
  bool gone() const;

  // Answers `none`.
  void Ok() const;
  // Answers with `status` (not OK) as the reply's error and message, and counts it.
  void Error(const Status& status) const;
  // OK as Ok, else as Error.
  void Answer(const Status& status) const { status.ok() ? Ok() : Error(status); }
  // Sends the reply `message` holds (its id is set here) with the descriptors `attach` names.
  void Send(capnp::MessageBuilder& message, wire::Reply::Builder reply,
            const ReplyAttachments& attach = {}) const;

 private:
  // The session, if it is still open; records the request's latency either way.
  std::shared_ptr<Sink> Finish() const;

  std::weak_ptr<Sink> sink_;
  Metrics* metrics_;
  uint64_t rid_;
  RequestType type_;
  uint64_t start_;
};

}  // namespace depot::store
