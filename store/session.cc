#include "store/session.h"

#include <unistd.h>

#include <capnp/serialize.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <bit>
#include <boost/asio/post.hpp>

#include "depot/ipc/protocol.h"
#include "depot/ipc/units.h"
#include "store/server.h"
#include "store/version.h"

namespace depot::store {

namespace {
// Longest object name accepted.
constexpr size_t kMaxNameBytes = 4096;
// Gets that would wait longer than this (30 days) wait for ever.
constexpr int64_t kForeverMs = 30ll * 24 * 3600 * 1000;
// Most objects in one page of a list reply, and about the most bytes.
constexpr uint32_t kMaxListPage = 10'000;
constexpr size_t kMaxListReplyBytes = 1u << 20;
// What an object costs in a list reply besides its name (ObjectInfo, a little generously).
constexpr size_t kListEntryBytes = 192;
// Most bytes of failed objects' messages in one get reply (each is at most 4 KiB): enough
// for the first failure of any get, which is the one the client library reports.
constexpr size_t kMaxFailureReplyBytes = 1u << 20;
// The disk tier in a `show` reply's replicas (protocol.capnp Replica.device).
constexpr int32_t kWireDisk = -2;
// A slice of a job (SliceQueue) looks at this many header slots, or writes this many list
// entries, or starts verifying this many objects: each a few microseconds (bench_fairness),
// since a request arriving meanwhile waits for about two slices.
constexpr uint32_t kSliceSlots = 1024;
constexpr uint32_t kSliceEntries = 8;
constexpr size_t kSliceVerifies = 8;
// Batches of a verify hashing on the workers at once.
constexpr int kVerifiesInFlight = 8;
// Most results in one page of a verify of every object.
constexpr uint32_t kVerifyPage = 4096;
// Jobs (list, verify) one session may have running at once; its later requests wait while
// it has this many.
constexpr int kMaxJobsPerSession = 4;
// What a list job holds per object at most (scan entry, found entry, reply entry), and a
// verify job (id, batch copy, result), counted against the client's limits while it runs.
constexpr uint32_t kListJobEntryBytes = 48 + 24 + kListEntryBytes;
constexpr uint32_t kVerifyJobEntryBytes = 16 + 16 + 48;

void ToWire(const Location& loc, wire::Location::Builder out) {
  out.setSlot(loc.slot);
  out.setSegment(loc.segment);
  out.setOffset(loc.offset);
  out.setDataSize(loc.data_size);
  out.setMetadataSize(loc.metadata_size);
  if (loc.device != kHost) {
    out.setDevice(loc.device);
    out.setMetadata(capnp::Data::Reader(reinterpret_cast<const capnp::byte*>(loc.metadata.data()),
                                        loc.metadata.size()));
  }
}

void ToWire(const ObjectStore& store, uint32_t device, wire::Device::Builder out) {
  const gpu::DevicePool& pool = *store.pools()[device];
  const gpu::DeviceInfo& info = pool.info();
  out.setUuid(capnp::Data::Reader(info.uuid.data(), info.uuid.size()));
  out.setName(info.name);
  out.setSimulated(info.simulated);
  out.setTotalBytes(info.total_bytes);
  out.setLimitBytes(pool.limit());
  out.setReservedBytes(pool.reserved_bytes());
  out.setUsedBytes(pool.used_bytes());
  out.setHeldBytes(store.device_usage(device).held_bytes);
  out.setChunks(pool.chunk_count());
  out.setReplicas(store.device_usage(device).replicas);
}

void ToWire(const ObjectView& v, wire::ObjectInfo::Builder o) {
  ipc::ToWire(v.id, o.initId());
  o.setName(v.name);
  o.setState(v.sealed ? wire::ObjectState::SEALED : wire::ObjectState::CREATING);
  o.setFailed(v.failed);
  o.setDataSize(v.data_size);
  o.setMetadataSize(v.metadata_size);
  o.setRefCount(static_cast<uint32_t>(v.references));
  o.setPinned(v.pinned);
  o.setHasChecksum(v.has_checksum);
  o.setChecksum(v.checksum);
  o.setCreateTimeNs(v.create_time_ns);
  o.setAccessTimeNs(v.access_time_ns);
  o.setSegment(v.segment);
  o.setOffset(v.offset);
  o.setDeletePending(v.delete_pending);
  o.setOwnerUid(v.owner_uid);
  o.setOnHost(v.tiers & ipc::kTierHost);
  o.setOnDisk(v.tiers & ipc::kTierDisk);
  const auto devices = static_cast<unsigned>(std::popcount(v.tiers & ipc::kTierGpus));
  auto out = o.initDevices(devices);
  unsigned i = 0;
  for (uint32_t d = 0; i < devices; ++d) {
    if (v.tiers & ipc::TierBit(static_cast<int32_t>(d))) out.set(i++, d);
  }
}

wire::VerifyState ToWire(VerifyState state) {
  switch (state) {
    case VerifyState::kOk:
      return wire::VerifyState::OK;
    case VerifyState::kMismatch:
      return wire::VerifyState::MISMATCH;
    case VerifyState::kNoChecksum:
      return wire::VerifyState::NO_CHECKSUM;
    case VerifyState::kNotFound:
      return wire::VerifyState::NOT_FOUND;
    case VerifyState::kNotSealed:
      return wire::VerifyState::NOT_SEALED;
    case VerifyState::kNotOnHost:
      return wire::VerifyState::NOT_ON_HOST;
  }
  return wire::VerifyState::NOT_FOUND;
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
      connected_time_ns_(ipc::WallNanos()) {}

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
  if (group_) server_.LeaveGroup(group_key_);
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

bool Session::BeginJob(uint64_t rid, uint64_t bytes) {
  if (Status st = store_.ChargeRequests(id_, static_cast<int64_t>(bytes)); !st.ok()) {
    SendError(rid, st);
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

bool Session::CheckBatch(uint64_t rid, size_t count) {
  if (count <= server_.options().max_batch) return true;
  SendError(rid, Status::LimitExceeded("a request may name at most " +
                                       std::to_string(server_.options().max_batch) +
                                       " objects, this one names " + std::to_string(count)));
  return false;
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
  if (Status allowed = CheckAccess(request); !allowed.ok()) return SendError(rid, allowed);
  const uint64_t start = server_.metrics().enabled() ? ipc::MonotonicNanos() : 0;
  switch (which) {
    case wire::Request::HELLO:
      return HandleHello(rid, request.getHello(), start);
    case wire::Request::CREATE:
      return HandleCreate(rid, request.getCreate(), start);
    case wire::Request::SEAL:
      return HandleSeal(rid, ipc::FromWire(request.getSeal()), start);
    case wire::Request::ABORT:
      return HandleAbort(rid, ipc::FromWire(request.getAbort()), start);
    case wire::Request::GET:
      return HandleGet(rid, request.getGet(), start);
    case wire::Request::PREFETCH:
      return HandlePrefetch(rid, request.getPrefetch(), start);
    case wire::Request::RELEASE:
      return HandleRelease(rid, request.getRelease(), start);
    case wire::Request::RETIRED_RELEASE:
    case wire::Request::RETIRED_RELEASE_REFS:
      return SendError(
          rid, Status::InvalidArgument("this form of release was retired in protocol version 6; "
                                       "send `release` (references grouped by tier)"));
    case wire::Request::DELETE:
      return HandleDelete(rid, request.getDelete(), start);
    case wire::Request::CONTAINS:
      return HandleContains(rid, request.getContains(), start);
    case wire::Request::LOCATE:
      return HandleLocate(rid, request.getLocate(), start);
    case wire::Request::LIST:
      return HandleList(rid, request.getList(), start);
    case wire::Request::STATUS:
      return HandleStatus(rid, start);
    case wire::Request::METRICS:
      return HandleMetrics(rid, start);
    case wire::Request::CLIENTS:
      return HandleClients(rid, start);
    case wire::Request::OBJECT_INFO:
      return HandleObjectInfo(rid, ipc::FromWire(request.getObjectInfo()), start);
    case wire::Request::VERIFY:
      return HandleVerify(rid, request.getVerify(), start);
    case wire::Request::EVICT:
      return HandleEvict(rid, request.getEvict(), start);
    case wire::Request::REGISTER_WORKER:
      server_.tasks().RegisterWorker(*this, rid, request.getRegisterWorker());
      return Observe(RequestType::kRegisterWorker, start);
    case wire::Request::SUBMIT:
      server_.tasks().Submit(*this, rid, request.getSubmit());
      return Observe(RequestType::kSubmit, start);
    case wire::Request::COMPLETE:
      server_.tasks().Complete(*this, rid, request.getComplete());
      return Observe(RequestType::kComplete, start);
    case wire::Request::CANCEL:
      server_.tasks().Cancel(*this, rid, request.getCancel());
      return Observe(RequestType::kCancel, start);
    case wire::Request::DRAIN_WORKER:
      server_.tasks().Drain(*this, rid);
      return Observe(RequestType::kDrainWorker, start);
    case wire::Request::WORKERS:
      server_.tasks().Workers(*this, rid);
      return Observe(RequestType::kWorkers, start);
    case wire::Request::TASKS:
      server_.tasks().Tasks(*this, rid);
      return Observe(RequestType::kTasks, start);
    case wire::Request::HANDOFF:
      return HandleHandoff(rid, request.getHandoff(), start);
    case wire::Request::WAIT:
      return HandleWait(rid, request.getWait(), start);
    case wire::Request::CANCEL_WAIT:
      return HandleCancelWait(rid, request.getCancelWait(), start);
  }
  SendError(rid, Status::InvalidArgument(
                     "unknown request type " + std::to_string(static_cast<int>(which)) +
                     "; is the client newer than this depotd (" + kDepotVersion + ")?"));
}

void Session::HandleSeal(uint64_t rid, const ObjectId& id, uint64_t start) {
  store_.Seal(id_, id, [weak = weak_from_this(), rid, start](Status st) {
    auto self = weak.lock();
    if (!self || self->closed()) return;
    st.ok() ? self->SendOk(rid) : self->SendError(rid, st);
    self->Observe(RequestType::kSeal, start);
  });
}

void Session::HandleAbort(uint64_t rid, const ObjectId& id, uint64_t start) {
  Status st = store_.Abort(id_, id);
  st.ok() ? SendOk(rid) : SendError(rid, st);
  Observe(RequestType::kAbort, start);
}

void Session::HandleRelease(uint64_t rid, capnp::List<wire::Request::TierRefs>::Reader tiers,
                            uint64_t start) {
  // Bounded as any batch, a group counting as at least one id: each costs a store call.
  size_t count = 0;
  for (auto tier : tiers) count += std::max<size_t>(1, tier.getIds().size());
  if (!CheckBatch(rid, count)) return;
  std::vector<ObjectId> ids;
  Status first;  // NotHeld naming the first id not held, or why a tier is wrong
  for (auto tier : tiers) {
    ids.clear();
    ids.reserve(tier.getIds().size());
    for (auto id : tier.getIds()) ids.push_back(ipc::FromWire(id));
    if (tier.getDevice() == ipc::kLeasedReads) {
      store_.LeasedReads(ids);
      continue;
    }
    Status st = store_.Release(id_, ids, tier.getDevice());
    if (first.ok()) first = std::move(st);
  }
  if (rid == 0) {
    if (!first.ok()) spdlog::debug("session {}: release: {}", id_, first.message());
  } else {
    first.ok() ? SendOk(rid) : SendError(rid, first);
  }
  Observe(RequestType::kRelease, start);
}

void Session::HandleDelete(uint64_t rid, capnp::List<wire::Id>::Reader list, uint64_t start) {
  if (!CheckBatch(rid, list.size())) return;
  std::vector<ObjectId> ids;
  ids.reserve(list.size());
  for (auto id : list) ids.push_back(ipc::FromWire(id));
  const std::vector<StatusCode> codes = store_.Delete(ids, OnlyOwnObjects());
  capnp::MallocMessageBuilder message;
  auto reply = message.initRoot<wire::Reply>();
  reply.setId(rid);
  auto out = reply.initDelete(static_cast<unsigned>(codes.size()));
  for (unsigned i = 0; i < codes.size(); ++i) out.set(i, ipc::ToWire(codes[i]));
  SendReply(message, reply);
  Observe(RequestType::kDelete, start);
}

void Session::HandleContains(uint64_t rid, capnp::List<wire::Id>::Reader list, uint64_t start) {
  if (!CheckBatch(rid, list.size())) return;
  capnp::MallocMessageBuilder message;
  auto reply = message.initRoot<wire::Reply>();
  reply.setId(rid);
  auto out = reply.initContains(list.size());
  for (unsigned i = 0; i < list.size(); ++i) out.set(i, store_.Contains(ipc::FromWire(list[i])));
  SendReply(message, reply);
  Observe(RequestType::kContains, start);
}

void Session::HandleLocate(uint64_t rid, capnp::List<wire::Id>::Reader list, uint64_t start) {
  if (!CheckBatch(rid, list.size())) return;
  std::vector<ObjectId> ids;
  ids.reserve(list.size());
  for (auto id : list) ids.push_back(ipc::FromWire(id));
  const std::vector<Placement> placements = store_.Locate(ids);
  capnp::MallocMessageBuilder message;
  auto reply = message.initRoot<wire::Reply>();
  reply.setId(rid);
  auto out = reply.initLocate(static_cast<unsigned>(placements.size()));
  for (unsigned i = 0; i < placements.size(); ++i) {
    out[i].setFound(placements[i].found);
    out[i].setTiers(placements[i].tiers);
    out[i].setDataSize(placements[i].data_size);
    out[i].setMetadataSize(placements[i].metadata_size);
    out[i].setFailed(placements[i].failed);
  }
  SendReply(message, reply);
  Observe(RequestType::kLocate, start);
}

void Session::HandleMetrics(uint64_t rid, uint64_t start) {
  capnp::MallocMessageBuilder message;
  auto reply = message.initRoot<wire::Reply>();
  reply.setId(rid);
  reply.setMetrics(server_.RenderMetrics());
  SendReply(message, reply);
  Observe(RequestType::kMetrics, start);
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

void Session::HandleHello(uint64_t rid, wire::Request::Hello::Reader hello, uint64_t start) {
  if (said_hello_) return connection_->Violation("hello sent twice");
  if (peer_.access == Access::kNone) {
    SendError(rid,
              Status::PermissionDenied(
                  "uid " + std::to_string(peer_.uid) + " may not use the depot daemon of uid " +
                  std::to_string(::geteuid()) + " (start depotd with --share-with-uid " +
                  std::to_string(peer_.uid) +
                  " or --share-with-group to let it read objects, or "
                  "--share-writable-with-uid/--share-writable-with-group to let it create them "
                  "too)"));
    Observe(RequestType::kHello, start);
    return CloseSoon("uid " + std::to_string(peer_.uid) + " is not shared with");
  }
  if (hello.getProtocolVersion() != ipc::kProtocolVersion) {
    SendError(rid, Status::ProtocolMismatch(
                       "the client speaks depot protocol version " +
                       std::to_string(hello.getProtocolVersion()) + " but this depotd (" +
                       kDepotVersion + ") speaks version " + std::to_string(ipc::kProtocolVersion) +
                       "; use a client and a daemon from the same release"));
    Observe(RequestType::kHello, start);
    return CloseSoon("client speaks another protocol version");
  }
  if (hello.getGroup().size() > 0) {
    const auto key = hello.getGroup();
    Result<ClientId> group = server_.JoinGroup(
        std::string_view(reinterpret_cast<const char*>(key.begin()), key.size()), peer_.uid);
    if (!group.ok()) {
      SendError(rid, Status(group.status().code(),
                            "cannot join the group of this hello: " + group.status().message()));
      Observe(RequestType::kHello, start);
      return CloseSoon("refused its group");
    }
    group_key_.assign(reinterpret_cast<const char*>(key.begin()), key.size());
    group_ = *group;
  }
  said_hello_ = true;
  client_name_ = hello.getClientName().cStr();
  spdlog::info("session {}: hello from {} (pid {}, uid {})", id_,
               client_name_.empty() ? peer_.command : client_name_, peer_.pid, peer_.uid);
  capnp::MallocMessageBuilder message;
  auto reply = message.initRoot<wire::Reply>();
  reply.setId(rid);
  auto h = reply.initHello();
  h.setProtocolVersion(ipc::kProtocolVersion);
  h.setDaemonVersion(kDepotVersion);
  h.setEpoch(server_.epoch());
  h.setSessionId(id_);
  h.setHeaderSlots(store_.headers().slots());
  h.setMaxFrameBytes(server_.options().max_frame_bytes);
  h.setMaxBatch(server_.options().max_batch);
  auto devices = h.initDevices(static_cast<unsigned>(store_.pools().size()));
  for (unsigned d = 0; d < devices.size(); ++d) ToWire(store_, d, devices[d]);
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
  SendReply(message, reply, {.extra_fds = std::span(fds, leasing ? 2 : 1)});
  Observe(RequestType::kHello, start);
}

void Session::HandleCreate(uint64_t rid, wire::Request::Create::Reader create, uint64_t start) {
  auto name = create.getName();
  if (name.size() > kMaxNameBytes) {
    return SendError(rid, Status::InvalidArgument("object name of " + std::to_string(name.size()) +
                                                  " bytes is longer than the limit of " +
                                                  std::to_string(kMaxNameBytes)));
  }
  const bool seal = create.getSeal();
  const bool release = create.getRelease();
  if (release && !seal) {
    return SendError(rid, Status::InvalidArgument(
                              "a create may drop the creator's reference only if it also seals"));
  }
  auto metadata = create.getMetadata();
  auto data = create.getData();
  if (seal && data.size() != create.getDataSize()) {
    // Sealing bytes nobody wrote would publish whatever the block held before.
    return SendError(
        rid, Status::InvalidArgument("a create that seals must carry all " +
                                     std::to_string(create.getDataSize()) + " bytes of data, not " +
                                     std::to_string(data.size())));
  }
  CreateParams params;
  params.id = ipc::FromWire(create.getId());
  params.data_size = create.getDataSize();
  params.metadata = std::as_bytes(std::span(metadata.begin(), metadata.size()));
  params.data = std::as_bytes(std::span(data.begin(), data.size()));
  params.name = std::string_view(name.cStr(), name.size());
  params.pin = create.getPin();
  params.checksum = create.getChecksum();
  params.spill = !create.getNoSpill();
  params.device = create.getDevice();
  if (params.device != kHost && seal) {
    return SendError(rid, Status::InvalidArgument(
                              "a GPU object is written by its creator, so its create cannot seal; "
                              "create it, write it, then seal it"));
  }
  // Answered at once for host objects; a GPU create may wait for room (spills).
  store_.Create(id_, params,
                [weak = weak_from_this(), rid, seal, release, id = params.id,
                 start](Result<Location> created) {
                  auto self = weak.lock();
                  if (!self || self->closed()) return;
                  if (!created.ok()) {
                    self->SendError(rid, created.status());
                    return self->Observe(seal ? RequestType::kPut : RequestType::kCreate, start);
                  }
                  if (!seal) {
                    self->SendLocation(rid, *created, /*writable=*/true);
                    return self->Observe(RequestType::kCreate, start);
                  }
                  self->SealAfterPut(rid, id, release, *created, start);
                });
}

void Session::SealAfterPut(uint64_t rid, const ObjectId& id, bool release, const Location& loc,
                           uint64_t start) {
  // A put in one round trip: seal now, and drop the creator's reference if asked.
  store_.Seal(id_, id, [weak = weak_from_this(), rid, id, release, loc, start](Status st) {
    auto self = weak.lock();
    if (!self || self->closed()) return;
    if (st.ok() && release) st = self->store_.Release(self->id_, std::span(&id, 1));
    if (st.ok()) {
      self->SendLocation(rid, loc, /*writable=*/false);
    } else {
      // The client never got a handle to this object: do not leave it behind.
      (void)self->store_.Abort(self->id_, id);
      self->SendError(rid, st);
    }
    self->Observe(RequestType::kPut, start);
  });
}

void Session::SendLocation(uint64_t rid, const Location& loc, bool writable) {
  capnp::MallocMessageBuilder message;
  auto reply = message.initRoot<wire::Reply>();
  reply.setId(rid);
  ToWire(loc, reply.initCreate());
  if (loc.device != kHost) {
    // A GPU object is always written by its creator, through its device pointer.
    return SendReply(message, reply,
                     {.chunk_device = loc.device,
                      .chunks = std::span(&loc.segment, 1),
                      .writable_chunk = int64_t{loc.segment}});
  }
  SendReply(message, reply,
            {.segments = std::span(&loc.segment, 1),
             .writable_segment = writable ? int64_t{loc.segment} : -1});
}

std::optional<std::vector<ObjectId>> Session::GetIds(uint64_t rid,
                                                     capnp::List<wire::Id>::Reader list) {
  if (!CheckBatch(rid, list.size())) return std::nullopt;
  std::vector<ObjectId> ids;
  ids.reserve(list.size());
  for (auto id : list) {
    ids.push_back(ipc::FromWire(id));
    if (ids.back().IsNil()) {
      SendError(rid, Status::InvalidArgument("the nil object id (all zeros) is reserved"));
      return std::nullopt;
    }
  }
  return ids;
}

void Session::HandleGet(uint64_t rid, wire::Request::Get::Reader get, uint64_t start) {
  if (get.getClaim()) return HandleClaim(rid, get, start);
  auto wanted = GetIds(rid, get.getIds());
  if (!wanted) return Observe(RequestType::kGet, start);
  std::vector<ObjectId>& ids = *wanted;
  // Waits longer than kForeverMs are for ever (and would overflow the timer's nanoseconds).
  int64_t timeout = std::max<int64_t>(get.getTimeoutMs(), -1);
  if (timeout > kForeverMs) timeout = -1;
  const int32_t device = get.getDevice();
  Status st =
      store_.Get(id_, rid, std::move(ids), device, timeout,
                 [weak = weak_from_this(), rid, start, device](std::vector<GetResult> results) {
                   auto self = weak.lock();
                   if (!self || self->closed()) return;
                   self->SendGetReply(rid, device, results);
                   self->Observe(RequestType::kGet, start);
                 });
  if (!st.ok()) {
    SendError(rid, st);
    Observe(RequestType::kGet, start);
  }
}

void Session::HandleWait(uint64_t rid, wire::Request::Wait::Reader wait, uint64_t start) {
  auto wanted = GetIds(rid, wait.getIds());
  if (!wanted) return Observe(RequestType::kWait, start);
  int64_t timeout = std::max<int64_t>(wait.getTimeoutMs(), -1);
  if (timeout > kForeverMs) timeout = -1;
  Status st =
      store_.Wait(id_, rid, std::move(*wanted), wait.getCount(), timeout,
                  [weak = weak_from_this(), rid, start](std::vector<GetResult> results) {
                    auto self = weak.lock();
                    if (!self || self->closed()) return;
                    capnp::MallocMessageBuilder message;
                    auto reply = message.initRoot<wire::Reply>();
                    reply.setId(rid);
                    auto sealed = reply.initWait(static_cast<unsigned>(results.size()));
                    for (unsigned i = 0; i < results.size(); ++i) {
                      const StatusCode code = results[i].code;
                      sealed.set(i, code == StatusCode::kOk || code == StatusCode::kTaskFailed);
                    }
                    self->SendReply(message, reply);
                    self->Observe(RequestType::kWait, start);
                  });
  if (!st.ok()) {
    SendError(rid, st);
    Observe(RequestType::kWait, start);
  }
}

void Session::HandleCancelWait(uint64_t rid, uint64_t target, uint64_t start) {
  // Only this session's own: the store looks the request id up among its client's gets.
  const bool cancelled = store_.CancelWait(id_, target);
  capnp::MallocMessageBuilder message;
  auto reply = message.initRoot<wire::Reply>();
  reply.setId(rid);
  reply.setCancelWait(cancelled);
  SendReply(message, reply);
  Observe(RequestType::kCancelWait, start);
}

void Session::HandleClaim(uint64_t rid, wire::Request::Get::Reader get, uint64_t start) {
  auto wanted = GetIds(rid, get.getIds());
  if (!wanted) return Observe(RequestType::kGet, start);
  if (!group_) {
    SendError(rid, Status::InvalidArgument(
                       "this session belongs to no group (Hello.group), so it has nothing to "
                       "claim"));
    return Observe(RequestType::kGet, start);
  }
  const int32_t device = get.getDevice();
  Result<std::vector<GetResult>> results = store_.Claim(id_, *group_, *wanted, device);
  if (results.ok()) {
    SendGetReply(rid, device, *results);
  } else {
    SendError(rid, results.status());
  }
  Observe(RequestType::kGet, start);
}

void Session::SendGetReply(uint64_t rid, int32_t device, const std::vector<GetResult>& results) {
  capnp::MallocMessageBuilder message;
  auto reply = message.initRoot<wire::Reply>();
  reply.setId(rid);
  auto out = reply.initGet(static_cast<unsigned>(results.size()));
  std::vector<uint32_t> regions;  // segments or chunks of the objects found
  size_t failure_bytes = 0;
  for (unsigned i = 0; i < results.size(); ++i) {
    out[i].setError(ipc::ToWire(results[i].code));
    if (results[i].code == StatusCode::kOk) {
      ToWire(results[i].location, out[i].initLocation());
      regions.push_back(results[i].location.segment);
    } else if (results[i].failure) {
      const std::string& why = *results[i].failure;
      failure_bytes += why.size();
      if (failure_bytes <= kMaxFailureReplyBytes) {
        out[i].setMessage(why);
      } else {
        out[i].setMessage(
            "(the message is left out: this reply carries 1 MiB of failure messages already; "
            "get this object alone)");
      }
    }
  }
  if (device == kHost) {
    SendReply(message, reply, {.segments = regions});
  } else {
    SendReply(message, reply, {.chunk_device = device, .chunks = regions});
  }
}

void Session::HandleHandoff(uint64_t rid, wire::Request::Handoff::Reader handoff, uint64_t start) {
  auto wanted = GetIds(rid, handoff.getIds());
  if (!wanted) return Observe(RequestType::kHandoff, start);
  if (!group_) {
    SendError(rid, Status::InvalidArgument(
                       "this session belongs to no group (Hello.group): there is nobody to hand "
                       "objects to"));
    return Observe(RequestType::kHandoff, start);
  }
  Result<std::vector<StatusCode>> codes = store_.Handoff(id_, *group_, *wanted, handoff.getDevice(),
                                                         handoff.getTtlMs(), OnlyOwnObjects());
  if (!codes.ok()) {
    SendError(rid, codes.status());
    return Observe(RequestType::kHandoff, start);
  }
  capnp::MallocMessageBuilder message;
  auto reply = message.initRoot<wire::Reply>();
  reply.setId(rid);
  auto out = reply.initHandoff(static_cast<unsigned>(codes->size()));
  for (unsigned i = 0; i < codes->size(); ++i) out.set(i, ipc::ToWire((*codes)[i]));
  SendReply(message, reply);
  Observe(RequestType::kHandoff, start);
}

struct Session::ListJob {
  explicit ListJob(uint32_t largest) : scan(largest) {}

  uint64_t rid = 0;
  uint64_t start = 0;   // when the request arrived, for the metrics
  uint64_t charge = 0;  // counted for it (ChargeRequests)
  bool largest = false;
  LargestScan scan;        // largest: the walk
  uint32_t limit = 0;      // paged: most entries
  ObjectStore::Page page;  // paged: where the walk stopped (its slots go to `found`)
  bool walked = false;
  std::vector<std::pair<uint32_t, ObjectId>> found;  // what the walk found, in reply order
  // The reply, built a slice at a time from `found`.
  capnp::MallocMessageBuilder message;
  capnp::Orphan<capnp::List<wire::ObjectInfo>> objects;
  size_t looked = 0;  // entries of `found` looked at so far
  unsigned kept = 0;  // entries written to `objects`
  size_t bytes = 0;   // about what the reply takes
};

void Session::HandlePrefetch(uint64_t rid, wire::Request::Get::Reader prefetch, uint64_t start) {
  auto ids = GetIds(rid, prefetch.getIds());
  if (!ids) return Observe(RequestType::kPrefetch, start);
  Status st =
      store_.Prefetch(id_, std::move(*ids), prefetch.getDevice(),
                      [weak = weak_from_this(), rid, start](std::vector<GetResult> results) {
                        auto self = weak.lock();
                        if (!self || self->closed()) return;
                        capnp::MallocMessageBuilder message;
                        auto reply = message.initRoot<wire::Reply>();
                        reply.setId(rid);
                        auto codes = reply.initPrefetch(static_cast<unsigned>(results.size()));
                        for (unsigned i = 0; i < results.size(); ++i)
                          codes.set(i, ipc::ToWire(results[i].code));
                        self->SendReply(message, reply);
                        self->Observe(RequestType::kPrefetch, start);
                      });
  if (!st.ok()) {
    SendError(rid, st);
    Observe(RequestType::kPrefetch, start);
  }
}

void Session::HandleList(uint64_t rid, wire::Request::ListObjects::Reader list, uint64_t start) {
  auto job = std::make_shared<ListJob>(std::min(list.getLargest(), kMaxListPage));
  job->rid = rid;
  job->start = start;
  job->largest = list.getLargest() != 0;
  job->limit = std::clamp<uint32_t>(list.getLimit(), 1, kMaxListPage);
  job->page.next = list.getStartSlot();
  // What it may hold at most: a scan entry, a found entry and a reply entry per object.
  job->charge = (job->largest ? std::min(list.getLargest(), kMaxListPage) : job->limit) *
                uint64_t{kListJobEntryBytes};
  if (!BeginJob(rid, job->charge)) return Observe(RequestType::kList, start);
  RunSlices([this, job] { return ListSlice(*job); });
}

bool Session::ListSlice(ListJob& job) {
  const ObjectStore& store = store_;
  if (!job.walked) {
    if (job.largest) {
      if (!job.scan.Step(store, kSliceSlots)) return false;
      job.found = job.scan.Finish(store);
      job.page.done = true;
    } else {
      const auto more = store.List(
          job.page.next, job.limit - static_cast<uint32_t>(job.found.size()), kSliceSlots);
      for (uint32_t slot : more.slots) job.found.emplace_back(slot, store.IdAt(slot));
      job.page.next = more.next;
      job.page.done = more.done;
      if (!more.done && job.found.size() < job.limit) return false;
    }
    job.walked = true;
    job.objects = job.message.getOrphanage().newOrphan<capnp::List<wire::ObjectInfo>>(
        static_cast<unsigned>(job.found.size()));
  }
  auto objects = job.objects.get();
  for (const size_t stop = std::min(job.found.size(), job.looked + kSliceEntries);
       job.looked < stop; ++job.looked) {
    const auto& [slot, id] = job.found[job.looked];
    if (!store.Holds(slot, id)) continue;  // gone since the walk found it
    // Long names make entries large: end the page early rather than send a reply of tens of
    // MiB; the client asks for the next page from where this one ends.
    job.bytes += kListEntryBytes + store.NameOf(slot).size();
    if (job.bytes > kMaxListReplyBytes && job.kept > 0) {
      if (!job.largest) {
        job.page.next = slot;
        job.page.done = false;
      }
      job.looked = job.found.size();
      break;
    }
    ToWire(store.Describe(slot), objects[job.kept++]);
  }
  if (job.looked < job.found.size()) return false;
  job.objects.truncate(job.kept);
  auto reply = job.message.initRoot<wire::Reply>();
  reply.setId(job.rid);
  auto out = reply.initList();
  out.setNextSlot(job.page.next);
  out.setDone(job.page.done);
  out.adoptObjects(kj::mv(job.objects));
  SendReply(job.message, reply);
  Observe(RequestType::kList, job.start);
  EndJob(job.charge);
  return true;
}

void Session::HandleStatus(uint64_t rid, uint64_t start) {
  const ObjectStore& store = store_;
  const Arena& arena = store.arena();
  const StoreCounters c = store.counters();
  capnp::MallocMessageBuilder message;
  auto reply = message.initRoot<wire::Reply>();
  reply.setId(rid);
  auto s = reply.initStatus();
  s.setDaemonVersion(kDepotVersion);
  s.setPid(static_cast<uint32_t>(::getpid()));
  s.setUptimeNs(ipc::MonotonicNanos() - server_.start_ns());
  s.setSocketPath(server_.options().socket_path);
  s.setArenaBackend(arena.backend());
  s.setCapacityBytes(arena.capacity());
  s.setMappedBytes(arena.mapped_bytes());
  s.setUsedBytes(arena.used_bytes());
  s.setHeldBytes(c.held_bytes);
  s.setPinnedBytes(c.pinned_bytes);
  s.setSegments(arena.segment_count());
  s.setObjectsSealed(c.objects_sealed);
  s.setObjectsCreating(c.objects_creating);
  s.setClients(static_cast<uint32_t>(server_.session_count()));
  s.setEvictions(c.evictions);
  s.setEvictedBytes(c.evicted_bytes);
  s.setEvictionEnabled(store.eviction_enabled());
  s.setLargestFreeBlock(arena.largest_free_block());
  s.setHeaderSlots(store.headers().slots());
  auto devices = s.initDevices(static_cast<unsigned>(store.pools().size()));
  for (unsigned d = 0; d < devices.size(); ++d) ToWire(store, d, devices[d]);
  s.setDeviceBackend(server_.options().device_backend);
  s.setSpills(c.spills);
  s.setSpilledBytes(c.spilled_bytes);
  s.setReplicasMade(c.replicas_made);
  s.setReplicasDropped(c.replicas_dropped);
  s.setArenaPageLockedBytes(arena.page_locked_bytes());
  s.setObjectsOnHost(store.ObjectsOnHost());
  s.setMetadataBytes(c.metadata_bytes);
  s.setMetadataBudgetBytes(store.limits().metadata_budget);
  s.setRequestBytes(c.request_bytes);
  s.setRequests(server_.requests());
  server_.tasks().FillStatus(s.initScheduler());
  s.setConfigFile(server_.config_file());
  auto settings = s.initSettings(static_cast<unsigned>(server_.settings().size()));
  for (unsigned i = 0; i < settings.size(); ++i) {
    settings[i].setName(server_.settings()[i].name);
    settings[i].setValue(server_.settings()[i].value);
  }
  if (const DiskPool* pool = store.disk()) {
    const TierCounters& t = store.tier_counters();
    auto d = s.initDisk();
    d.setEnabled(true);
    d.setDir(pool->dir());
    d.setLimitBytes(pool->capacity());
    d.setUsedBytes(pool->used_bytes());
    d.setFileBytes(pool->file_bytes());
    d.setFiles(pool->file_count());
    d.setObjects(store.ObjectsOnDisk());
    d.setSpills(t.disk_spills);
    d.setSpilledBytes(t.disk_spilled_bytes);
    d.setSpillSeconds(t.disk_spill_seconds);
    d.setRestores(t.disk_restores);
    d.setRestoredBytes(t.disk_restored_bytes);
    d.setRestoreSeconds(t.disk_restore_seconds);
    d.setDrops(t.disk_drops);
    d.setDroppedBytes(t.disk_dropped_bytes);
    d.setSpillFailures(t.disk_spill_failures);
    d.setRestoreFailures(t.disk_restore_failures);
    d.setCopiesInFlight(store.DiskCopiesInFlight());
    d.setDirectIo(pool->direct_io());
  }
  SendReply(message, reply);
  Observe(RequestType::kStatus, start);
}

void Session::HandleClients(uint64_t rid, uint64_t start) {
  const std::vector<ClientView> clients = server_.Clients();
  capnp::MallocMessageBuilder message;
  auto reply = message.initRoot<wire::Reply>();
  reply.setId(rid);
  auto out = reply.initClients(static_cast<unsigned>(clients.size()));
  for (unsigned i = 0; i < clients.size(); ++i) {
    const ClientView& client = clients[i];
    auto c = out[i];
    c.setSessionId(client.id);
    c.setPid(static_cast<uint32_t>(client.peer.pid));
    c.setUid(client.peer.uid);
    c.setCommand(client.peer.command);
    c.setClientName(client.client_name);
    c.setObjectsHeld(client.usage.objects);
    c.setReferences(client.usage.references);
    c.setBytesHeld(client.usage.bytes);
    c.setRequests(client.requests);
    c.setConnectedTimeNs(client.connected_time_ns);
  }
  SendReply(message, reply);
  Observe(RequestType::kClients, start);
}

void Session::HandleObjectInfo(uint64_t rid, const ObjectId& id, uint64_t start) {
  const ObjectStore& store = store_;
  const uint32_t slot = store.SlotOf(id);
  if (slot == HeaderTable::kNoSlot) {
    SendError(rid, Status::NotFound("object " + id.Hex() + " does not exist"));
    return Observe(RequestType::kObjectInfo, start);
  }
  const auto holders = store.HoldersOf(slot);
  capnp::MallocMessageBuilder message;
  auto reply = message.initRoot<wire::Reply>();
  reply.setId(rid);
  auto details = reply.initObjectInfo();
  ToWire(store.Describe(slot), details.initInfo());
  auto out = details.initHolders(static_cast<unsigned>(holders.size()));
  for (unsigned i = 0; i < holders.size(); ++i) {
    const ClientId client = holders[i].client;
    auto h = out[i];
    h.setSessionId(client);
    h.setReferences(holders[i].references);
    auto tiers = h.initTiers(static_cast<unsigned>(holders[i].tiers.size()));
    for (unsigned t = 0; t < tiers.size(); ++t) {
      tiers[t].setDevice(holders[i].tiers[t].first);
      tiers[t].setReferences(holders[i].tiers[t].second);
    }
    if (client == kDaemonClient) {  // a verify or a copy between tiers reading the object
      h.setPid(static_cast<uint32_t>(::getpid()));
      h.setUid(::getuid());
      h.setCommand("depotd");
      h.setClientName("depotd (verify or copy)");
    } else if (client == kSchedulerClient) {  // the task graph: inputs of pending tasks
      h.setPid(static_cast<uint32_t>(::getpid()));
      h.setUid(::getuid());
      h.setCommand("depotd");
      h.setClientName("depotd (task graph)");
    } else if (const std::optional<uint32_t> uid = server_.GroupUid(client)) {
      h.setPid(static_cast<uint32_t>(::getpid()));
      h.setUid(*uid);
      h.setCommand("depotd");
      h.setClientName("group (handed off, not yet claimed)");
    } else if (const std::optional<ClientView> holder = server_.FindClient(client)) {
      h.setPid(static_cast<uint32_t>(holder->peer.pid));
      h.setUid(holder->peer.uid);
      h.setCommand(holder->peer.command);
      h.setClientName(holder->client_name);
    }
  }
  const auto replicas = store.ReplicasOf(slot);
  auto copies = details.initReplicas(static_cast<unsigned>(replicas.size()));
  for (unsigned i = 0; i < replicas.size(); ++i) {
    copies[i].setDevice(replicas[i].device == kDisk ? kWireDisk : replicas[i].device);
    copies[i].setSegment(replicas[i].segment);
    copies[i].setOffset(replicas[i].offset);
    copies[i].setReferences(replicas[i].references);
    copies[i].setReady(replicas[i].ready);
  }
  SendReply(message, reply);
  Observe(RequestType::kObjectInfo, start);
}

struct Session::VerifyJob {
  uint64_t rid = 0;
  uint64_t start = 0;   // when the request arrived, for the metrics
  uint64_t charge = 0;  // counted for it (ChargeRequests)
  bool all = false;
  std::vector<ObjectId> ids;   // not all: what to verify
  size_t next_id = 0;          // not all: the first of `ids` not yet started
  ObjectStore::Page page;      // all: where the walk stopped
  bool collected_all = false;  // every object of the request (or page) has been started
  unsigned started = 0;        // results handed out, in order, to batches
  int in_flight = 0;           // batches hashing on the workers
  bool queued = false;         // a VerifySlice is on the SliceQueue
  bool replied = false;
  // The reply, filled in as batches finish.
  capnp::MallocMessageBuilder message;
  capnp::Orphan<capnp::List<wire::VerifyResult>> results;
};

void Session::HandleVerify(uint64_t rid, wire::Request::Verify::Reader verify, uint64_t start) {
  auto list = verify.getIds();
  if (verify.getAll() && list.size() != 0) {
    return SendError(rid, Status::InvalidArgument("verify takes ids or all, not both"));
  }
  if (!CheckBatch(rid, list.size())) return;
  auto job = std::make_shared<VerifyJob>();
  job->rid = rid;
  job->start = start;
  job->all = verify.getAll();
  job->charge = (job->all ? kVerifyPage : list.size()) * uint64_t{kVerifyJobEntryBytes};
  if (!BeginJob(rid, job->charge)) return Observe(RequestType::kVerify, start);
  job->page.next = verify.getStartSlot();
  job->page.done = false;
  job->ids.reserve(list.size());
  for (auto id : list) job->ids.push_back(ipc::FromWire(id));
  job->results = job->message.getOrphanage().newOrphan<capnp::List<wire::VerifyResult>>(
      job->all ? kVerifyPage : static_cast<unsigned>(job->ids.size()));
  job->queued = true;
  RunSlices([this, job] { return VerifySlice(job); });
}

bool Session::VerifySlice(const std::shared_ptr<VerifyJob>& job) {
  // Starts one small batch per slice, keeping up to kVerifiesInFlight of them hashing.
  ObjectStore& store = store_;
  std::vector<ObjectId> batch;
  if (job->all) {
    const auto page =
        store.List(job->page.next, std::min<uint32_t>(kSliceVerifies, kVerifyPage - job->started),
                   kSliceSlots, ObjectStore::Filter::kVerifiable);
    for (uint32_t slot : page.slots) batch.push_back(store.IdAt(slot));
    job->page.next = page.next;
    job->page.done = page.done;
    job->collected_all = page.done || job->started + batch.size() >= kVerifyPage;
  } else {
    const size_t n = std::min(kSliceVerifies, job->ids.size() - job->next_id);
    batch.assign(job->ids.begin() + static_cast<std::ptrdiff_t>(job->next_id),
                 job->ids.begin() + static_cast<std::ptrdiff_t>(job->next_id + n));
    job->next_id += n;
    job->collected_all = job->next_id == job->ids.size();
  }
  if (!batch.empty()) {
    const unsigned first = job->started;
    job->started += static_cast<unsigned>(batch.size());
    job->in_flight++;
    // The callback may run inside this call, when there is nothing to hash.
    store.Verify(std::move(batch),
                 [weak = weak_from_this(), job, first](std::vector<VerifyOutcome> outcomes) {
                   if (auto self = weak.lock(); self && !self->closed()) {
                     self->Guarded([&] {
                       self->VerifyBatchDone(job, first, std::move(outcomes));
                       return true;
                     });
                   }
                 });
  }
  if (!job->collected_all && job->in_flight < kVerifiesInFlight) return false;
  job->queued = false;  // VerifyBatchDone queues it again, or replies
  if (job->collected_all && job->in_flight == 0) SendVerifyReply(*job);
  return true;
}

void Session::VerifyBatchDone(const std::shared_ptr<VerifyJob>& job, unsigned first,
                              std::vector<VerifyOutcome> outcomes) {
  auto out = job->results.get();
  for (size_t k = 0; k < outcomes.size(); ++k) {
    auto r = out[first + static_cast<unsigned>(k)];
    ipc::ToWire(outcomes[k].id, r.initId());
    r.setState(ToWire(outcomes[k].state));
    r.setExpected(outcomes[k].expected);
    r.setActual(outcomes[k].actual);
  }
  job->in_flight--;
  if (job->queued) return;  // its next slice is on the way
  if (!job->collected_all) {
    job->queued = true;
    return RunSlices([this, job] { return VerifySlice(job); });
  }
  if (job->in_flight == 0) SendVerifyReply(*job);
}

void Session::SendVerifyReply(VerifyJob& job) {
  if (job.replied) return;
  job.replied = true;
  job.results.truncate(job.started);
  auto reply = job.message.initRoot<wire::Reply>();
  reply.setId(job.rid);
  auto out = reply.initVerify();
  out.setNextSlot(job.page.next);
  out.setDone(!job.all || job.page.done);
  out.adoptResults(kj::mv(job.results));
  SendReply(job.message, reply);
  Observe(RequestType::kVerify, job.start);
  EndJob(job.charge);
}

void Session::HandleEvict(uint64_t rid, wire::Request::Evict::Reader evict, uint64_t start) {
  if (evict.getBytes() == 0 && !evict.getAllUnreferenced()) {
    SendError(rid,
              Status::InvalidArgument("evict needs a number of bytes to free, or allUnreferenced"));
    return Observe(RequestType::kEvict, start);
  }
  const EvictOutcome outcome =
      store_.EvictUnreferenced(evict.getBytes(), evict.getAllUnreferenced());
  spdlog::info("session {} (pid {}, {}): evicted {} objects ({})", id_, peer_.pid, peer_.command,
               outcome.objects, ipc::FormatSize(outcome.bytes));
  capnp::MallocMessageBuilder message;
  auto reply = message.initRoot<wire::Reply>();
  reply.setId(rid);
  auto out = reply.initEvict();
  out.setObjects(outcome.objects);
  out.setBytes(outcome.bytes);
  SendReply(message, reply);
  Observe(RequestType::kEvict, start);
}

void Session::Observe(RequestType type, uint64_t start) {
  if (start != 0) server_.metrics().Observe(type, ipc::MonotonicNanos() - start);
}

void Session::SendOk(uint64_t rid) {
  capnp::MallocMessageBuilder message(64);
  auto reply = message.initRoot<wire::Reply>();
  reply.setId(rid);
  reply.setNone();
  SendReply(message, reply);
}

void Session::SendError(uint64_t rid, const Status& status) {
  server_.metrics().CountError(status.code());
  if (rid == 0) {  // the client asked for no reply (release)
    spdlog::debug("session {}: {}", id_, status.ToString());
    return;
  }
  capnp::MallocMessageBuilder message(256);
  auto reply = message.initRoot<wire::Reply>();
  reply.setId(rid);
  reply.setError(ipc::ToWire(status.code()));
  reply.setMessage(status.message());
  SendReply(message, reply);
}

}  // namespace depot::store
