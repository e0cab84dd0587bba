#include "store/data_requests.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <string>
#include <utility>

#include "depot/ipc/protocol.h"

namespace depot::store {

namespace {

// Longest object name accepted.
constexpr size_t kMaxNameBytes = 4096;
// Gets that would wait longer than this (30 days) wait for ever (and longer ones would
// overflow the timer's nanoseconds).
constexpr int64_t kForeverMs = 30ll * 24 * 3600 * 1000;
// Most bytes of failed objects' messages in one get reply (each is at most 4 KiB): enough
// for the first failure of any get, which is the one the client library reports.
constexpr size_t kMaxFailureReplyBytes = 1u << 20;

int64_t WaitMs(int64_t timeout_ms) {
  const int64_t timeout = std::max<int64_t>(timeout_ms, -1);
  return timeout > kForeverMs ? -1 : timeout;
}

// A put in one round trip, once created: seals now, and drops the creator's reference if
// asked; an object that cannot be sealed is aborted (the client never got a handle to it).
void SealAfterPut(ObjectStore& store, const Responder& reply, ClientId client, const ObjectId& id,
                  bool release, const Location& loc) {
  store.Seal(client, id, [&store, reply, client, id, release, loc](Status st) {
    if (reply.gone()) return;
    if (st.ok() && release) st = store.Release(client, std::span(&id, 1));
    if (st.ok()) return SendLocation(reply, loc, /*writable=*/false);
    (void)store.Abort(client, id);
    reply.Error(st);
  });
}

}  // namespace

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

void SendLocation(const Responder& reply, const Location& loc, bool writable) {
  capnp::MallocMessageBuilder message;
  auto r = message.initRoot<wire::Reply>();
  ToWire(loc, r.initCreate());
  if (loc.device != kHost) {
    // A GPU object is always written by its creator, through its device pointer.
    return reply.Send(message, r,
                      {.chunk_device = loc.device,
                       .chunks = std::span(&loc.segment, 1),
                       .writable_chunk = int64_t{loc.segment}});
  }
  reply.Send(message, r,
             {.segments = std::span(&loc.segment, 1),
              .writable_segment = writable ? int64_t{loc.segment} : -1});
}

void SendGetReply(const Responder& reply, int32_t device, const std::vector<GetResult>& results) {
  capnp::MallocMessageBuilder message;
  auto r = message.initRoot<wire::Reply>();
  auto out = r.initGet(static_cast<unsigned>(results.size()));
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
    reply.Send(message, r, {.segments = regions});
  } else {
    reply.Send(message, r, {.chunk_device = device, .chunks = regions});
  }
}

void DataRequests::Create(const Responder& reply, const Requester& who,
                          wire::Request::Create::Reader create) {
  auto name = create.getName();
  if (name.size() > kMaxNameBytes) {
    return reply.Error(Status::InvalidArgument("object name of " + std::to_string(name.size()) +
                                               " bytes is longer than the limit of " +
                                               std::to_string(kMaxNameBytes)));
  }
  const bool seal = create.getSeal();
  const bool release = create.getRelease();
  if (release && !seal) {
    return reply.Error(
        Status::InvalidArgument("a create may drop the creator's reference only if it also seals"));
  }
  auto metadata = create.getMetadata();
  auto data = create.getData();
  if (seal && data.size() != create.getDataSize()) {
    // Sealing bytes nobody wrote would publish whatever the block held before.
    return reply.Error(Status::InvalidArgument(
        "a create that seals must carry all " + std::to_string(create.getDataSize()) +
        " bytes of data, not " + std::to_string(data.size())));
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
    return reply.Error(Status::InvalidArgument(
        "a GPU object is written by its creator, so its create cannot seal; create it, write "
        "it, then seal it"));
  }
  if (!seal && data.size() == 0 && outputs_ != nullptr &&
      outputs_->MakesNow(who.client, params.id) != 0) {
    auto kept = std::make_shared<KeptCreate>();
    kept->metadata.assign(params.metadata.begin(), params.metadata.end());
    kept->name = std::string(params.name);
    kept->params = params;
    kept->params.metadata = kept->metadata;
    kept->params.name = kept->name;
    return CreateOutput(reply, who.client, std::move(kept));
  }
  // Answered at once for host objects; a GPU create may wait for room (spills).
  store_.Create(who.client, params,
                [&store = store_, reply, client = who.client, seal, release,
                 id = params.id](Result<Location> created) {
                  if (reply.gone()) return;
                  if (!created.ok()) return reply.Error(created.status());
                  if (!seal) return SendLocation(reply, *created, /*writable=*/true);
                  SealAfterPut(store, reply, client, id, release, *created);
                });
}

void DataRequests::CreateOutput(const Responder& reply, ClientId client,
                                std::shared_ptr<KeptCreate> kept, bool again) {
  store_.Create(client, kept->params, [this, reply, client, kept, again](Result<Location> created) {
    if (reply.gone()) return;
    if (created.ok()) return SendLocation(reply, *created, /*writable=*/true);
    // Room may come as other tasks end; nothing else will change (a size over the store's
    // capacity is InvalidArgument, a client over its limits LimitExceeded).
    const ObjectId& id = kept->params.id;
    const uint64_t task = outputs_->MakesNow(client, id);
    if (created.status().code() != StatusCode::kOutOfMemory || task == 0 ||
        outputs_->Unwanted(id)) {
      return reply.Error(created.status());
    }
    RoomWaits& waits = outputs_->room_waits();
    // One wait a task (a task makes its outputs one at a time): the daemon keeps what waits,
    // so a worker sending creates again and again must not make it keep more.
    if (!again && waits.Waiting(id)) {
      return reply.Error(
          Status::AlreadyExists("a create of " + id.Hex() + " waits for room already"));
    }
    if (!again && waits.TaskWaits(task)) {
      return reply.Error(Status::LimitExceeded(
          "a create of another output of the task making " + id.Hex() +
          " waits for room already: a task's outputs wait for room one at a time"));
    }
    waits.Park(
        client, task, id, created.status(),
        [this, reply, client, kept] {
          if (!reply.gone()) CreateOutput(reply, client, kept, /*again=*/true);
        },
        [reply](Status why) {
          if (!reply.gone()) reply.Error(why);
        },
        again);
  });
}

void DataRequests::Seal(const Responder& reply, const Requester& who, const ObjectId& id) {
  store_.Seal(who.client, id, [reply](Status st) { reply.Answer(st); });
}

void DataRequests::Abort(const Responder& reply, const Requester& who, const ObjectId& id) {
  reply.Answer(store_.Abort(who.client, id));
}

void DataRequests::Get(const Responder& reply, const Requester& who,
                       wire::Request::Get::Reader get) {
  if (get.getClaim()) return Claim(reply, who, get);
  auto ids = who.Ids(get.getIds());
  if (!ids.ok()) return reply.Error(ids.status());
  const int32_t device = get.getDevice();
  Status st = store_.Get(
      who.client, reply.rid(), std::move(ids).value(), device, WaitMs(get.getTimeoutMs()),
      [reply, device](std::vector<GetResult> results) { SendGetReply(reply, device, results); });
  if (!st.ok()) reply.Error(st);
}

void DataRequests::Claim(const Responder& reply, const Requester& who,
                         wire::Request::Get::Reader get) {
  auto ids = who.Ids(get.getIds());
  if (!ids.ok()) return reply.Error(ids.status());
  if (!who.group) {
    return reply.Error(Status::InvalidArgument(
        "this session belongs to no group (Hello.group), so it has nothing to claim"));
  }
  const int32_t device = get.getDevice();
  Result<std::vector<GetResult>> results = store_.Claim(who.client, *who.group, *ids, device);
  if (!results.ok()) return reply.Error(results.status());
  SendGetReply(reply, device, *results);
}

void DataRequests::Wait(const Responder& reply, const Requester& who,
                        wire::Request::Wait::Reader wait) {
  auto ids = who.Ids(wait.getIds());
  if (!ids.ok()) return reply.Error(ids.status());
  Status st =
      store_.Wait(who.client, reply.rid(), std::move(ids).value(), wait.getCount(),
                  WaitMs(wait.getTimeoutMs()), [reply](std::vector<GetResult> results) {
                    capnp::MallocMessageBuilder message;
                    auto r = message.initRoot<wire::Reply>();
                    auto sealed = r.initWait(static_cast<unsigned>(results.size()));
                    for (unsigned i = 0; i < results.size(); ++i) {
                      const StatusCode code = results[i].code;
                      sealed.set(i, code == StatusCode::kOk || code == StatusCode::kTaskFailed);
                    }
                    reply.Send(message, r);
                  });
  if (!st.ok()) reply.Error(st);
}

void DataRequests::CancelWait(const Responder& reply, const Requester& who, uint64_t target) {
  // Only the requester's own: the store looks the request id up among its client's gets.
  const bool cancelled = store_.CancelWait(who.client, target);
  capnp::MallocMessageBuilder message;
  auto r = message.initRoot<wire::Reply>();
  r.setCancelWait(cancelled);
  reply.Send(message, r);
}

void DataRequests::Handoff(const Responder& reply, const Requester& who,
                           wire::Request::Handoff::Reader handoff) {
  auto ids = who.Ids(handoff.getIds());
  if (!ids.ok()) return reply.Error(ids.status());
  if (!who.group) {
    return reply.Error(Status::InvalidArgument(
        "this session belongs to no group (Hello.group): there is nobody to hand objects to"));
  }
  const ClientId client = who.client;
  const ClientId group = *who.group;
  const int32_t device = handoff.getDevice();
  const uint32_t ttl_ms = handoff.getTtlMs();
  const uint32_t grace_ms = handoff.getGraceMs();
  const std::optional<uint32_t> only_own = who.only_own_objects;
  auto hand_off = [this, reply, client, group, device, ttl_ms, grace_ms, only_own](
                      std::span<const ObjectId> ids, bool delete_unless_handed) {
    Result<std::vector<StatusCode>> codes =
        store_.Handoff(client, group, ids, device, ttl_ms, grace_ms, only_own);
    if (delete_unless_handed && (!codes.ok() || codes->at(0) != StatusCode::kOk)) {
      (void)store_.Delete(ids, only_own);
    }
    if (!codes.ok()) return reply.Error(codes.status());
    capnp::MallocMessageBuilder message;
    auto r = message.initRoot<wire::Reply>();
    auto out = r.initHandoff(static_cast<unsigned>(codes->size()));
    for (unsigned i = 0; i < codes->size(); ++i) out.set(i, ipc::ToWire((*codes)[i]));
    reply.Send(message, r);
  };
  if (!handoff.getSeal()) return hand_off(*ids, false);
  if (ids->size() != 1) {
    return reply.Error(Status::InvalidArgument("a handoff that seals names one object, not " +
                                               std::to_string(ids->size())));
  }
  // Before the seal: a handoff refused as a whole must leave the object as it was.
  if (Status st = store_.CheckTier(device); !st.ok()) return reply.Error(st);
  // Sealed and handed off in one request: a sender that dies between the two would leave
  // the sealed object in the store with no reference and an id nobody knows.
  store_.Seal(client, ids->front(),
              [this, reply, client, only_own, id = ids->front(), hand_off](Status st) {
                if (!st.ok()) return reply.Error(st);
                if (!store_.HasClient(client)) {  // gone while a checksum was taken
                  (void)store_.Delete(std::span(&id, 1), only_own);
                  return;
                }
                hand_off(std::span(&id, 1), true);
              });
}

void DataRequests::Prefetch(const Responder& reply, const Requester& who,
                            wire::Request::Get::Reader prefetch) {
  auto ids = who.Ids(prefetch.getIds());
  if (!ids.ok()) return reply.Error(ids.status());
  Status st = store_.Prefetch(who.client, std::move(ids).value(), prefetch.getDevice(),
                              [reply](std::vector<GetResult> results) {
                                capnp::MallocMessageBuilder message;
                                auto r = message.initRoot<wire::Reply>();
                                auto codes = r.initPrefetch(static_cast<unsigned>(results.size()));
                                for (unsigned i = 0; i < results.size(); ++i) {
                                  codes.set(i, ipc::ToWire(results[i].code));
                                }
                                reply.Send(message, r);
                              });
  if (!st.ok()) reply.Error(st);
}

void DataRequests::Release(const Responder& reply, const Requester& who,
                           capnp::List<wire::Request::TierRefs>::Reader tiers) {
  // Bounded as any batch, a group counting as at least one id: each costs a store call.
  size_t count = 0;
  for (auto tier : tiers) count += std::max<size_t>(1, tier.getIds().size());
  if (Status st = who.CheckBatch(count); !st.ok()) return reply.Error(st);
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
    Status st = store_.Release(who.client, ids, tier.getDevice());
    if (first.ok()) first = std::move(st);
  }
  reply.Answer(first);
}

void DataRequests::Delete(const Responder& reply, const Requester& who,
                          capnp::List<wire::Id>::Reader list) {
  if (Status st = who.CheckBatch(list.size()); !st.ok()) return reply.Error(st);
  std::vector<ObjectId> ids;
  ids.reserve(list.size());
  for (auto id : list) ids.push_back(ipc::FromWire(id));
  const std::vector<StatusCode> codes = store_.Delete(ids, who.only_own_objects);
  capnp::MallocMessageBuilder message;
  auto r = message.initRoot<wire::Reply>();
  auto out = r.initDelete(static_cast<unsigned>(codes.size()));
  for (unsigned i = 0; i < codes.size(); ++i) out.set(i, ipc::ToWire(codes[i]));
  reply.Send(message, r);
}

void DataRequests::Contains(const Responder& reply, const Requester& who,
                            capnp::List<wire::Id>::Reader list) {
  if (Status st = who.CheckBatch(list.size()); !st.ok()) return reply.Error(st);
  capnp::MallocMessageBuilder message;
  auto r = message.initRoot<wire::Reply>();
  auto out = r.initContains(list.size());
  for (unsigned i = 0; i < list.size(); ++i) out.set(i, store_.Contains(ipc::FromWire(list[i])));
  reply.Send(message, r);
}

void DataRequests::Locate(const Responder& reply, const Requester& who,
                          capnp::List<wire::Id>::Reader list) {
  if (Status st = who.CheckBatch(list.size()); !st.ok()) return reply.Error(st);
  std::vector<ObjectId> ids;
  ids.reserve(list.size());
  for (auto id : list) ids.push_back(ipc::FromWire(id));
  const std::vector<Placement> placements = store_.Locate(ids);
  capnp::MallocMessageBuilder message;
  auto r = message.initRoot<wire::Reply>();
  auto out = r.initLocate(static_cast<unsigned>(placements.size()));
  for (unsigned i = 0; i < placements.size(); ++i) {
    out[i].setFound(placements[i].found);
    out[i].setTiers(placements[i].tiers);
    out[i].setDataSize(placements[i].data_size);
    out[i].setMetadataSize(placements[i].metadata_size);
    out[i].setFailed(placements[i].failed);
  }
  reply.Send(message, r);
}

}  // namespace depot::store
