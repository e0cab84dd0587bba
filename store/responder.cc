#include "store/responder.h"

#include <spdlog/spdlog.h>

#include "depot/ipc/protocol.h"
#include "depot/ipc/units.h"

namespace depot::store {

bool Responder::gone() const {
  auto sink = sink_.lock();
  return !sink || sink->closed();
}

std::shared_ptr<Responder::Sink> Responder::Finish() const {
  if (start_ != 0) metrics_->Observe(type_, ipc::MonotonicNanos() - start_);
  auto sink = sink_.lock();
  if (!sink || sink->closed()) return nullptr;
  return sink;
}

void Responder::Ok() const {
  capnp::MallocMessageBuilder message(64);
  auto reply = message.initRoot<wire::Reply>();
  reply.setNone();
  Send(message, reply);
}

void Responder::Error(const Status& status) const {
  metrics_->CountError(status.code());
  if (rid_ == 0) {  // the client asked for no reply (release, complete)
    if (start_ != 0) metrics_->Observe(type_, ipc::MonotonicNanos() - start_);
    auto sink = sink_.lock();
    spdlog::debug("session {}: {}", sink ? sink->client_id() : 0, status.ToString());
    return;
  }
  capnp::MallocMessageBuilder message(256);
  auto reply = message.initRoot<wire::Reply>();
  reply.setError(ipc::ToWire(status.code()));
  reply.setMessage(status.message());
  Send(message, reply);
}

void Responder::Send(capnp::MessageBuilder& message, wire::Reply::Builder reply,
                     const ReplyAttachments& attach) const {
  auto sink = Finish();
  if (!sink || rid_ == 0) return;  // id 0: the client wants no reply
  reply.setId(rid_);
  sink->Send(message, reply, attach);
}

}  // namespace depot::store
