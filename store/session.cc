#include "store/session.h"

#include <unistd.h>

#include <capnp/serialize.h>
#include <spdlog/spdlog.h>

#include <boost/asio/post.hpp>

#include "depot/ipc/protocol.h"
#include "depot/ipc/units.h"
#include "info_fields.h"
#include "store/server.h"
#include "store/version.h"

namespace depot::store {

namespace {

// Jobs (list, verify) one session may have running at once; its later requests wait while
// it has this many.
constexpr int kMaxJobsPerSession = 4;

// The most bytes of the name a client gives itself in hello that the daemon keeps.
constexpr size_t kMaxClientName = 256;

// How the metrics name a request; nullopt for one of an unknown type.
std::optional<RequestType> TypeOf(wire::Request::Reader request) {
  switch (request.which()) {
    case wire::Request::HELLO:
      return RequestType::kHello;
    case wire::Request::CREATE:
      return request.getCreate().getSeal() ? RequestType::kPut : RequestType::kCreate;
    case wire::Request::SEAL:
      return RequestType::kSeal;
    case wire::Request::ABORT:
      return RequestType::kAbort;
    case wire::Request::GET:
      return RequestType::kGet;
    case wire::Request::PREFETCH:
      return RequestType::kPrefetch;
    case wire::Request::RELEASE:
    case wire::Request::RETIRED_RELEASE:
    case wire::Request::RETIRED_RELEASE_REFS:
      return RequestType::kRelease;
    case wire::Request::DELETE:
      return RequestType::kDelete;
    case wire::Request::CONTAINS:
      return RequestType::kContains;
    case wire::Request::LOCATE:
      return RequestType::kLocate;
    case wire::Request::LIST:
      return RequestType::kList;
    case wire::Request::STATUS:
      return RequestType::kStatus;
    case wire::Request::METRICS:
      return RequestType::kMetrics;
    case wire::Request::CLIENTS:
      return RequestType::kClients;
    case wire::Request::OBJECT_INFO:
      return RequestType::kObjectInfo;
    case wire::Request::VERIFY:
      return RequestType::kVerify;
    case wire::Request::EVICT:
      return RequestType::kEvict;
    case wire::Request::REGISTER_WORKER:
      return RequestType::kRegisterWorker;
    case wire::Request::SUBMIT:
      return RequestType::kSubmit;
    case wire::Request::COMPLETE:
      return RequestType::kComplete;
    case wire::Request::CANCEL:
      return RequestType::kCancel;
    case wire::Request::DRAIN_WORKER:
      return RequestType::kDrainWorker;
    case wire::Request::WORKERS:
      return RequestType::kWorkers;
    case wire::Request::TASKS:
      return RequestType::kTasks;
    case wire::Request::HANDOFF:
      return RequestType::kHandoff;
    case wire::Request::WAIT:
      return RequestType::kWait;
    case wire::Request::CANCEL_WAIT:
      return RequestType::kCancelWait;
    case wire::Request::DELETE_AFTER_TASKS:
      return RequestType::kDeleteAfterTasks;
  }
  return std::nullopt;
}

}  // namespace

Session::Session(Server& server, boost::asio::local::stream_protocol::socket socket, ClientId id,
                 Peer peer)
    : server_(server),
      store_(server.store()),
      connection_(std::make_shared<Connection>(
          server.loop(), std::move(socket), server.options().max_frame_bytes,
          server.store().arena(), server.store().pools(), Arena::WritersOf(peer.uid),
          static_cast<Connection::Handler&>(*this))),
      id_(id),
      peer_(std::move(peer)),
      connected_time_ns_(ipc::WallNanos()),
      requester_{.client = id,
                 .group = std::nullopt,
                 .only_own_objects = peer_.access == Access::kFull
                                         ? std::nullopt
                                         : std::optional<uint32_t>(peer_.uid),
                 .max_batch = server.options().max_batch} {}

Session::~Session() = default;

void Session::Start() {
  store_.AddClient(id_, peer_.uid);
  connection_->Start();
}

void Session::Close(const std::string& reason) { connection_->Close(reason); }

void Session::OnClosed(const std::string& reason, bool protocol_error) {
  server_.metrics().SessionClosed(protocol_error);
  spdlog::info("session {} (pid {}, {}) closed: {}", id_, peer_.pid, peer_.command, reason);
  // Jobs still running end with the session: give back what they had counted.
  (void)store_.ChargeRequests(id_, -static_cast<int64_t>(jobs_charge_));
  jobs_charge_ = 0;
  store_.RemoveClient(id_);
  if (requester_.group) server_.LeaveGroup(group_key_);
  server_.tasks().SessionClosed(id_);
  // The server owns the last reference; let pending handlers finish with a live object.
  boost::asio::post(server_.loop(),
                    [self = shared_from_this()] { self->server_.Forget(self->id_); });
}

bool Session::Saturated() const { return jobs_ >= kMaxJobsPerSession; }

Status Session::Charge(int64_t bytes) { return store_.ChargeRequests(id_, bytes); }

void Session::CloseSoon(std::string reason) {
  boost::asio::post(server_.loop(), [self = shared_from_this(), reason = std::move(reason)] {
    self->Close(reason);
  });
}

bool Session::BeginJob(const Responder& reply, uint64_t bytes) {
  if (Status st = store_.ChargeRequests(id_, static_cast<int64_t>(bytes)); !st.ok()) {
    reply.Error(st);
    return false;
  }
  jobs_charge_ += bytes;
  jobs_++;
  return true;
}

void Session::EndJob(uint64_t bytes) {
  (void)store_.ChargeRequests(id_, -static_cast<int64_t>(bytes));
  jobs_charge_ -= bytes;
  // Its frames stopped being handled when the last job slot filled.
  if (jobs_-- == kMaxJobsPerSession) connection_->Resume();
}

void Session::RunSlices(std::function<bool()> slice) {
  server_.slices().Run([weak = weak_from_this(), slice = std::move(slice)] {
    auto self = weak.lock();
    if (!self || self->closed()) return true;
    return self->Guarded(slice);
  });
}

void Session::RunGuarded(const std::function<void()>& work) {
  if (closed()) return;
  Guarded([&] {
    work();
    return true;
  });
}

bool Session::Guarded(const std::function<bool()>& work) {
  // Slices run outside OnFrame's guard: an exception here must end this session only.
  try {
    return work();
  } catch (const kj::Exception& e) {
    Close("failed to handle a request (" + std::string(e.getDescription().cStr()) + ")");
  } catch (const std::exception& e) {
    Close(std::string("failed to handle a request: ") + e.what());
  }
  return true;
}

void Session::OnFrame(kj::ArrayPtr<const capnp::word> payload) {
  try {
    capnp::ReaderOptions options;
    options.traversalLimitInWords = ipc::TraversalLimitWords(server_.options().max_frame_bytes);
    options.nestingLimit = 16;
    capnp::FlatArrayMessageReader message(payload, options);
    Dispatch(message.getRoot<wire::Request>());
  } catch (const kj::Exception& e) {
    connection_->Violation("malformed message (" + std::string(e.getDescription().cStr()) + ")");
  } catch (const std::exception& e) {
    Close(std::string("failed to handle a request: ") + e.what());
  }
}

void Session::Dispatch(wire::Request::Reader request) {
  const uint64_t rid = request.getId();
  ++requests_;
  server_.CountRequest();
  const auto which = request.which();
  if (!said_hello_ && which != wire::Request::HELLO) {
    return connection_->Violation("the first request must be hello");
  }
  if (rid == 0 && which != wire::Request::RELEASE && which != wire::Request::COMPLETE) {
    return connection_->Violation("request id 0 is only allowed for release and complete");
  }
  // The latency of every request is recorded once, by its Responder, when it is answered.
  const std::optional<RequestType> type = TypeOf(request);
  const uint64_t start = server_.metrics().enabled() && type ? ipc::MonotonicNanos() : 0;
  const Responder reply(std::static_pointer_cast<Responder::Sink>(shared_from_this()),
                        server_.metrics(), rid, type.value_or(RequestType::kHello), start);
  if (Status allowed = CheckAccess(request); !allowed.ok()) return reply.Error(allowed);
  if (which == wire::Request::HELLO) {
    if (said_hello_) return connection_->Violation("hello sent twice");
    return HandleHello(reply, request.getHello());
  }
  Handle(reply, request);
}

void Session::Handle(const Responder& reply, wire::Request::Reader request) {
  DataRequests& data = server_.data();
  AdminRequests& admin = server_.admin();
  TaskService& tasks = server_.tasks();
  const Requester& who = requester_;
  switch (request.which()) {
    case wire::Request::HELLO:
      break;  // Dispatch's
    case wire::Request::CREATE:
      return data.Create(reply, who, request.getCreate());
    case wire::Request::SEAL:
      return data.Seal(reply, who, ipc::FromWire(request.getSeal()));
    case wire::Request::ABORT:
      return data.Abort(reply, who, ipc::FromWire(request.getAbort()));
    case wire::Request::GET:
      return data.Get(reply, who, request.getGet());
    case wire::Request::WAIT:
      return data.Wait(reply, who, request.getWait());
    case wire::Request::CANCEL_WAIT:
      return data.CancelWait(reply, who, request.getCancelWait());
    case wire::Request::PREFETCH:
      return data.Prefetch(reply, who, request.getPrefetch());
    case wire::Request::RELEASE:
      return data.Release(reply, who, request.getRelease());
    case wire::Request::RETIRED_RELEASE:
    case wire::Request::RETIRED_RELEASE_REFS:
      return reply.Error(
          Status::InvalidArgument("this form of release was retired in protocol version 6; "
                                  "send `release` (references grouped by tier)"));
    case wire::Request::DELETE:
      return data.Delete(reply, who, request.getDelete());
    case wire::Request::CONTAINS:
      return data.Contains(reply, who, request.getContains());
    case wire::Request::LOCATE:
      return data.Locate(reply, who, request.getLocate());
    case wire::Request::HANDOFF:
      return data.Handoff(reply, who, request.getHandoff());
    case wire::Request::LIST:
      return admin.List(reply, std::static_pointer_cast<Jobs>(shared_from_this()),
                        request.getList());
    case wire::Request::STATUS:
      return admin.Status(reply);
    case wire::Request::METRICS:
      return admin.Metrics(reply);
    case wire::Request::CLIENTS:
      return admin.Clients(reply);
    case wire::Request::OBJECT_INFO:
      return admin.ObjectInfo(reply, ipc::FromWire(request.getObjectInfo()));
    case wire::Request::VERIFY:
      return admin.Verify(reply, who, std::static_pointer_cast<Jobs>(shared_from_this()),
                          request.getVerify());
    case wire::Request::EVICT:
      return admin.Evict(reply,
                         "session " + std::to_string(id_) + " (pid " + std::to_string(peer_.pid) +
                             ", " + peer_.command + ")",
                         request.getEvict());
    case wire::Request::REGISTER_WORKER:
      return tasks.RegisterWorker(reply, who, request.getRegisterWorker());
    case wire::Request::SUBMIT:
      return tasks.Submit(reply, who, request.getSubmit());
    case wire::Request::COMPLETE:
      return tasks.Complete(reply, who, request.getComplete());
    case wire::Request::CANCEL:
      return tasks.Cancel(reply, who, request.getCancel());
    case wire::Request::DRAIN_WORKER:
      return tasks.Drain(reply, who);
    case wire::Request::WORKERS:
      return tasks.Workers(reply);
    case wire::Request::TASKS:
      return tasks.Tasks(reply);
    case wire::Request::DELETE_AFTER_TASKS:
      return tasks.DeleteAfterTasks(reply, who, request.getDeleteAfterTasks());
  }
  reply.Error(Status::InvalidArgument(
      "unknown request type " + std::to_string(static_cast<int>(request.which())) +
      "; is the client newer than this depotd (" + kDepotVersion + ")?"));
}

Status Session::CheckAccess(wire::Request::Reader request) const {
  if (peer_.access == Access::kFull) return Status::OK();
  if (peer_.access == Access::kNone && request.which() != wire::Request::HELLO) {
    return Status::PermissionDenied("uid " + std::to_string(peer_.uid) + " is not shared with");
  }
  switch (request.which()) {
    case wire::Request::HELLO:
    case wire::Request::RELEASE:
    case wire::Request::RETIRED_RELEASE:
    case wire::Request::RETIRED_RELEASE_REFS:
    case wire::Request::CONTAINS:
    case wire::Request::LOCATE:
    case wire::Request::LIST:
    case wire::Request::STATUS:
    case wire::Request::METRICS:
    case wire::Request::CLIENTS:
    case wire::Request::OBJECT_INFO:
    case wire::Request::WORKERS:
    case wire::Request::TASKS:
    // A wait reads only whether objects are sealed; a cancel reaches the session's own.
    case wire::Request::WAIT:
    case wire::Request::CANCEL_WAIT:
      return Status::OK();
    case wire::Request::GET:
      if (request.getGet().getDevice() == kHost) return Status::OK();
      // A GPU chunk travels as a descriptor that imports read-write: no way to share it
      // read-only with another user yet.
      return Status::PermissionDenied("uid " + std::to_string(peer_.uid) +
                                      " may read objects from host memory only, not on a GPU");
    default:
      break;
  }
  if (peer_.access == Access::kWrite) {
    // Its own objects, in host memory, kept apart from others' (Arena, Writers). Delete
    // checks each object's owner (HandleDelete); seal, abort and handoff reach only what
    // this client creates or holds.
    switch (request.which()) {
      case wire::Request::CREATE:
        if (request.getCreate().getDevice() != kHost) {
          return Status::PermissionDenied("uid " + std::to_string(peer_.uid) +
                                          " may create objects in host memory only, not on a GPU");
        }
        // A pinned object that nobody holds counts against no client's limits.
        if (request.getCreate().getPin()) {
          return Status::PermissionDenied("uid " + std::to_string(peer_.uid) +
                                          " may not pin objects (they could fill the store)");
        }
        return Status::OK();
      case wire::Request::HANDOFF:
        if (request.getHandoff().getDevice() == kHost) return Status::OK();
        return Status::PermissionDenied("uid " + std::to_string(peer_.uid) +
                                        " may hand off objects in host memory only");
      case wire::Request::SEAL:
      case wire::Request::ABORT:
      case wire::Request::DELETE:
        return Status::OK();
      default:
        return Status::PermissionDenied(
            "uid " + std::to_string(peer_.uid) +
            " may read this daemon's objects and create and delete its own in host memory, but "
            "not verify, evict or prefetch any, nor submit, cancel or run tasks (the daemon's "
            "own uid may)");
    }
  }
  return Status::PermissionDenied(
      "uid " + std::to_string(peer_.uid) +
      " may read this daemon's objects but not create, seal, abort, delete, verify, evict or "
      "prefetch any, nor submit, cancel or run tasks (depotd --share-with-uid/"
      "--share-with-group give read access only; --share-writable-with-* lets it create "
      "objects)");
}

void Session::HandleHello(const Responder& reply, wire::Request::Hello::Reader hello) {
  if (peer_.access == Access::kNone) {
    reply.Error(Status::PermissionDenied(
        "uid " + std::to_string(peer_.uid) + " may not use the depot daemon of uid " +
        std::to_string(::geteuid()) + " (start depotd with --share-with-uid " +
        std::to_string(peer_.uid) +
        " or --share-with-group to let it read objects, or "
        "--share-writable-with-uid/--share-writable-with-group to let it create them too)"));
    return CloseSoon("uid " + std::to_string(peer_.uid) + " is not shared with");
  }
  if (hello.getProtocolVersion() != ipc::kProtocolVersion) {
    reply.Error(Status::ProtocolMismatch(
        "the client speaks depot protocol version " + std::to_string(hello.getProtocolVersion()) +
        " but this depotd (" + kDepotVersion + ") speaks version " +
        std::to_string(ipc::kProtocolVersion) +
        "; use a client and a daemon from the same release"));
    return CloseSoon("client speaks another protocol version");
  }
  if (hello.getGroup().size() > 0) {
    const auto key = hello.getGroup();
    Result<ClientId> group = server_.JoinGroup(
        std::string_view(reinterpret_cast<const char*>(key.begin()), key.size()), peer_.uid);
    if (!group.ok()) {
      reply.Error(Status(group.status().code(),
                         "cannot join the group of this hello: " + group.status().message()));
      return CloseSoon("refused its group");
    }
    group_key_.assign(reinterpret_cast<const char*>(key.begin()), key.size());
    requester_.group = *group;
  }
  said_hello_ = true;
  // What a client calls itself is for people (logs, `depotctl clients`): bounded, so that
  // no one's name can swell every listing of the clients.
  const auto name = hello.getClientName();
  client_name_ = ipc::CutUtf8(std::string_view(name.cStr(), name.size()), kMaxClientName);
  spdlog::info("session {}: hello from {} (pid {}, uid {})", id_,
               client_name_.empty() ? peer_.command : client_name_, peer_.pid, peer_.uid);
  capnp::MallocMessageBuilder message;
  auto r = message.initRoot<wire::Reply>();
  auto h = r.initHello();
  h.setProtocolVersion(ipc::kProtocolVersion);
  h.setDaemonVersion(kDepotVersion);
  h.setEpoch(server_.epoch());
  h.setSessionId(id_);
  h.setHeaderSlots(store_.headers().slots());
  h.setMaxFrameBytes(server_.options().max_frame_bytes);
  h.setMaxBatch(server_.options().max_batch);
  auto devices = h.initDevices(static_cast<unsigned>(store_.pools().size()));
  for (unsigned d = 0; d < devices.size(); ++d) internal::ToWire(GpuInfoOf(store_, d), devices[d]);
  h.setDeviceBackend(server_.options().device_backend);
  auto leases = store_.OpenLeases(id_);
  if (!leases.ok()) {
    spdlog::warn("session {}: no lease table: {}", id_, leases.status().message());
  }
  const bool leasing = leases.ok() && leases->fd >= 0;
  if (leasing) {
    h.setLeaseEntries(leases->allowance.entries);
    h.setLeaseMaxBytes(leases->allowance.max_object_bytes);
  }
  const int fds[] = {store_.headers().fd(), leasing ? leases->fd : -1};
  reply.Send(message, r, {.extra_fds = std::span(fds, leasing ? 2 : 1)});
}

}  // namespace depot::store
