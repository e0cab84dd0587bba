#include "depot/client.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>

#include "connection.h"
#include "holding.h"
#include "info_fields.h"
#include "parts.h"
#include "pending_call.h"

namespace depot {

using internal::CheckBatch;
using internal::Connection;
using internal::Decode;
using internal::FillParts;
using internal::FromWire;
using internal::Holding;
using internal::IsOnePart;
using internal::JoinParts;
using internal::Reply;
using internal::RequestMessage;
using internal::UnexpectedReply;

namespace {

// Objects per List page: a few hundred KiB of reply.
constexpr uint32_t kListPage = 1024;

// Puts of at most this many bytes take one round trip: the bytes travel inside the create
// request, and the daemon copies them in, seals and drops the creator's reference. Larger
// puts create, copy straight into shared memory, and seal: two round trips, but one copy of
// the bytes instead of four (into the frame, into and out of the socket, into the arena).
// The extra copies grow with the size and the round trip saved does not: measured on a
// 2-core machine, a one-round-trip put takes 17 µs at 1 KiB, 26 µs at 32 KiB and 41 µs at
// 64 KiB, against 33, 35 and 37 µs for create + copy + seal; they cross near 50 KiB. 32 KiB
// stays clear of that, and bounds the copying done on the daemon's single thread.
constexpr size_t kInlinePutBytes = Client::kInlinePutBytes;
// Room kept in an inline put's frame for everything besides data, metadata and name.
constexpr size_t kCreateFrameOverhead = 512;

int64_t WireTimeout(std::chrono::milliseconds timeout) {
  return timeout.count() < 0 ? -1 : static_cast<int64_t>(timeout.count());
}

// Fills the create request for `id` of `data_size` bytes, without data.
wire::Request::Create::Builder InitCreate(RequestMessage& request, const ObjectId& id,
                                          uint64_t data_size, const CreateOptions& options) {
  auto create = request.root().initCreate();
  ipc::ToWire(id, create.initId());
  create.setDataSize(data_size);
  create.setMetadata(capnp::Data::Reader(reinterpret_cast<const kj::byte*>(options.metadata.data()),
                                         options.metadata.size()));
  create.setName(capnp::Text::Reader(options.name.c_str(), options.name.size()));
  create.setPin(options.pin);
  create.setChecksum(options.checksum);
  create.setNoSpill(!options.spill);
  return create;
}

// Allocates and maps the pages of [data, data + size), a shared writable view, for writing,
// in one system call rather than a page fault per 4 KiB (CreateOptions::prefault). Where the
// file has its pages already (a segment the daemon kept from an earlier large object: its
// first page is resident), mapping them as for a read is enough, and 2.4x faster per GiB
// than as for a write (a shared writable view maps them writable either way); else the
// write populate allocates them. On up to `threads` threads for a large object (InSlices),
// as page tables fill at a core's pace. Best effort: without MADV_POPULATE_* (Linux before
// 5.14) the writes fault the pages in as they go.
void Prefault(std::byte* data, uint64_t size, unsigned threads) {
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(data) / page * page;
  const uintptr_t end = reinterpret_cast<uintptr_t>(data) + size;
#if defined(MADV_POPULATE_WRITE) && defined(MADV_POPULATE_READ)
  unsigned char resident = 0;
  const bool allocated =
      ::mincore(reinterpret_cast<void*>(begin), page, &resident) == 0 && (resident & 1) != 0;
  // Slices start on 64 KiB boundaries from `begin`: on pages.
  internal::InSlices(end - begin, threads, [begin, allocated](uint64_t from, uint64_t len) {
    (void)::madvise(reinterpret_cast<void*>(begin + from), len,
                    allocated ? MADV_POPULATE_READ : MADV_POPULATE_WRITE);
  });
#else
  (void)begin;
  (void)end;
  (void)threads;
#endif
}

// A Holding for the reference the daemon just granted to `id` at `location`: read-only, or
// also writable for the object's creator. If the location is unusable, the reference is
// given back.
Result<std::shared_ptr<Holding>> MakeHolding(const std::shared_ptr<Connection>& conn,
                                             const ObjectId& id, wire::Location::Reader location,
                                             bool sealed) {
  const uint64_t data_size = location.getDataSize();
  const uint64_t metadata_size = location.getMetadataSize();
  using Segments = internal::Segments;
  auto resolved =
      [&]() -> Result<std::pair<Segments::View<const std::byte>, Segments::View<std::byte>>> {
    if (metadata_size > UINT64_MAX - data_size) return Status::Internal("object sizes overflow");
    const uint64_t size = data_size + metadata_size;
    Segments& segments = conn->segments();
    DEPOT_ASSIGN_OR_RETURN(auto data,
                           segments.Resolve(location.getSegment(), location.getOffset(), size));
    Segments::View<std::byte> writable;
    if (!sealed) {
      DEPOT_ASSIGN_OR_RETURN(
          writable, segments.ResolveWritable(location.getSegment(), location.getOffset(), size));
    }
    return std::pair(std::move(data), std::move(writable));
  }();
  if (!resolved.ok()) {
    conn->Release(id);
    return Status(resolved.status().code(),
                  "object " + id.Hex() + " is unreadable: " + resolved.status().message());
  }
  const BufferLocation where{location.getSegment(), location.getOffset(), location.getSlot()};
  return std::make_shared<Holding>(conn, id, std::move(resolved->first),
                                   std::move(resolved->second), data_size, metadata_size, where,
                                   sealed);
}

// The live Holding of `id` if it may answer a Get without asking the daemon: sealed, not
// deleted since (the header table shows deletes by other clients), and still referenced (a
// broken connection has lost its references; the Get then fails as any request does).
std::shared_ptr<Holding> FindSealed(Connection& conn, const ObjectId& id) {
  if (conn.broken() || conn.forked()) return nullptr;
  auto holding = conn.holdings().Find(id);
  if (!holding || !holding->sealed.load(std::memory_order_acquire)) return nullptr;
  if (const ipc::ObjectHeader* header = conn.header(holding->location.slot)) {
    if (header->flags.load(std::memory_order_acquire) & ipc::kFlagDeletePending) {
      return nullptr;
    }
  }
  return holding;
}

// Remembers where the sealed object `id` of `holding`, which holds a reference to it, lies,
// for leases (leases.h): objects in shared segments only.
void RememberPlace(Connection& conn, const ObjectId& id, const Holding& holding) {
  const BufferLocation& where = holding.location;
  const ipc::ObjectHeader* header = conn.header(where.slot);
  if (!conn.leases().enabled() || header == nullptr || ipc::IsDedicatedSegment(where.segment)) {
    return;
  }
  // The reference keeps the object, so the slot's generation cannot change meanwhile.
  conn.leases().Remember(id, {.slot = where.slot,
                              .generation = header->generation.load(std::memory_order_acquire),
                              .segment = where.segment,
                              .offset = where.offset,
                              .data_size = holding.data_size,
                              .metadata_size = holding.metadata_size});
}

// A Holding of `id` on a lease, with no message, if this client has seen where it lies and
// it is still there (leases.h); null otherwise.
std::shared_ptr<Holding> Lease(const std::shared_ptr<Connection>& conn, const ObjectId& id) {
  if (conn->broken() || conn->forked()) return nullptr;
  auto seen = conn->leases().Take(id, conn->headers());
  if (!seen) return nullptr;
  // Until a Holding owns the lease, it is dropped on every way out (a throwing allocation
  // included).
  struct Unowned {
    internal::Leases& leases;
    uint32_t slot;
    bool owned = false;
    ~Unowned() {
      if (!owned) leases.Drop(slot);
    }
  } lease{conn->leases(), seen->slot};
  auto data =
      conn->segments().Resolve(seen->segment, seen->offset, seen->data_size + seen->metadata_size);
  if (!data.ok()) return nullptr;
  const BufferLocation where{seen->segment, seen->offset, seen->slot};
  auto holding = std::make_shared<Holding>(
      conn, id, std::move(data).value(), internal::Segments::View<std::byte>{}, seen->data_size,
      seen->metadata_size, where, /*sealed=*/true, /*leased=*/true);
  lease.owned = true;
  // Another thread's Holding of the same object may have come first: then this one, dropped
  // here, drops its lease.
  return conn->holdings().Adopt(std::move(holding));
}

// A DeviceHolding for the reference the daemon just granted on GPU `device`. If the
// location is unusable, the reference is given back.
// `writable`: the creator's holding, whose bytes it writes; readers' point into read-only
// memory where the daemon shares the chunk so.
Result<std::shared_ptr<internal::DeviceHolding>> MakeDeviceHolding(
    const std::shared_ptr<Connection>& conn, const ObjectId& id, wire::Location::Reader location,
    bool writable) {
  const int32_t device = location.getDevice();
  auto address = conn->ResolveChunk(device, location.getSegment(), location.getOffset(),
                                    location.getDataSize(), writable);
  if (!address.ok() || device < 0) {
    conn->Release(id, device);
    return address.ok() ? Status::Internal("the daemon answered a GPU get with a host object")
                        : address.status();
  }
  auto meta = location.getMetadata();
  std::vector<std::byte> metadata(reinterpret_cast<const std::byte*>(meta.begin()),
                                  reinterpret_cast<const std::byte*>(meta.end()));
  return std::make_shared<internal::DeviceHolding>(
      conn, id, device, conn->LocalOrdinal(device), *address, location.getDataSize(),
      std::move(metadata), conn->gpus()[static_cast<size_t>(device)].simulated);
}

// Where a get or prefetch wants its objects, for messages: `device` is this process's GPU
// ordinal, or Client::kHostMemory.
std::string TierName(int device) {
  return device == Client::kHostMemory ? std::string("host memory")
                                       : "GPU " + std::to_string(device);
}

// What a get found: per id, in order, a holding where `codes` says kOk; empty where the
// object was not there (kNotFound: does not exist and no wait; kTimeout: not sealed in time).
template <typename Held>
struct Got {
  std::vector<std::shared_ptr<Held>> holdings;
  std::vector<StatusCode> codes;
};

// A get in two halves, so that it may be answered later (Client::StartGet): what the
// client answers itself (`local`: objects it holds), and which ids it asks the daemon for.
template <typename Held>
struct GetPlan {
  std::vector<ObjectId> ids;
  Got<Held> got;
  std::vector<size_t> remote;  // indices into ids
};

template <typename Held, typename Local>
Result<GetPlan<Held>> PlanGet(const Connection& conn, std::span<const ObjectId> ids, Local local) {
  DEPOT_RETURN_NOT_OK(CheckBatch(ids.size(), conn, "a get"));
  GetPlan<Held> plan;
  plan.ids.assign(ids.begin(), ids.end());
  plan.got.holdings.resize(ids.size());
  plan.got.codes.assign(ids.size(), StatusCode::kOk);
  for (size_t i = 0; i < ids.size(); ++i) {
    plan.got.holdings[i] = local(ids[i]);
    if (!plan.got.holdings[i]) plan.remote.push_back(i);
  }
  return plan;
}

// The get request for the plan's remote ids.
template <typename Held>
void EncodeGet(RequestMessage& request, const GetPlan<Held>& plan, int32_t tier,
               std::chrono::milliseconds timeout, bool claim) {
  auto get = request.root().initGet();
  auto list = get.initIds(static_cast<unsigned>(plan.remote.size()));
  for (size_t k = 0; k < plan.remote.size(); ++k) ipc::ToWire(plan.ids[plan.remote[k]], list[k]);
  get.setTimeoutMs(WireTimeout(timeout));
  get.setDevice(tier);
  get.setClaim(claim);
}

// Completes the plan with the daemon's reply: `make` turns each location granted into a
// holding. Missing and late objects are "not there" alike on every tier. Any other failure
// of an object (the output of a failed task, its copy to the tier failed or found no room,
// or its location is unusable here) fails the call with the first such error in the order
// of the ids: TaskFailed with the task's message as it is, the others naming the object
// (`ordinal`: this process's GPU, or kHostMemory); the holdings made meanwhile are dropped,
// which gives their references back.
template <typename Held, typename Make>
Result<Got<Held>> FinishGet(GetPlan<Held>& plan, Reply& reply, int ordinal, bool claim, Make make) {
  const std::vector<size_t>& remote = plan.remote;
  return Decode([&]() -> Result<Got<Held>> {
    auto r = reply.get();
    if (!r.isGet() || r.getGet().size() != remote.size()) return UnexpectedReply("get");
    auto results = r.getGet();
    Got<Held>& got = plan.got;
    // Every result granted becomes a holding even after one fails, so that each reference
    // is given back when `got` is dropped.
    Status first_error;
    for (size_t k = 0; k < remote.size(); ++k) {
      const size_t i = remote[k];
      StatusCode& code = got.codes[i];
      code = ipc::FromWire(results[k].getError());
      if (code == StatusCode::kNotFound || code == StatusCode::kTimeout) continue;
      Status st;
      if (code == StatusCode::kTaskFailed) {
        const auto why = results[k].getMessage();
        st = Status::TaskFailed(std::string(why.begin(), why.size()));
      } else if (code != StatusCode::kOk) {
        // The daemon may say why (a copy between tiers that failed).
        const auto why = results[k].getMessage();
        st = Status(code, std::string(claim ? "cannot claim object " : "cannot get object ") +
                              plan.ids[i].Hex() +
                              (ordinal == Client::kHostMemory ? " in " : " on ") +
                              TierName(ordinal) + ": " +
                              (why.size() == 0 ? std::string(StatusCodeName(code))
                                               : std::string(why.begin(), why.size())));
      }
      if (st.ok()) {
        auto made = make(plan.ids[i], results[k].getLocation());
        if (made.ok()) {
          got.holdings[i] = std::move(made).value();
        } else {
          st = made.status();
          code = st.code();
        }
      }
      if (first_error.ok()) first_error = std::move(st);
    }
    if (!first_error.ok()) return first_error;
    return std::move(got);
  });
}

// Get and GetOnDevice: one get request on `tier` (the daemon's numbering; `ordinal` this
// process's, for messages) for the ids `local` does not answer from what this client holds,
// completed by FinishGet. With `claim`, the references are those the session's group holds
// (Client::Claim).
template <typename Held, typename Local, typename Make>
Result<Got<Held>> GetOnTier(const std::shared_ptr<Connection>& conn, std::span<const ObjectId> ids,
                            int32_t tier, int ordinal, std::chrono::milliseconds timeout,
                            Local local, Make make, bool claim = false) {
  DEPOT_ASSIGN_OR_RETURN(auto plan, PlanGet<Held>(*conn, ids, local));
  if (plan.remote.empty()) return std::move(plan.got);
  RequestMessage request;
  EncodeGet(request, plan, tier, timeout, claim);
  Reply reply;
  DEPOT_RETURN_NOT_OK(conn->Call(request, &reply));
  return FinishGet(plan, reply, ordinal, claim, make);
}

// How a host get answers what it can locally: objects this client holds are answered from
// its table (or its lease table), but for a claim, which always takes the group's reference.
auto HostLocal(const std::shared_ptr<Connection>& conn, bool claim) {
  return [conn, claim](const ObjectId& id) -> std::shared_ptr<Holding> {
    if (claim) return nullptr;
    auto held = FindSealed(*conn, id);
    return held ? held : Lease(conn, id);
  };
}

// How a host get turns a location granted into a holding.
auto HostMake(const std::shared_ptr<Connection>& conn) {
  return [conn](const ObjectId& id,
                wire::Location::Reader location) -> Result<std::shared_ptr<Holding>> {
    DEPOT_ASSIGN_OR_RETURN(auto fresh, MakeHolding(conn, id, location, /*sealed=*/true));
    RememberPlace(*conn, id, *fresh);
    // A second reference to an object already held (another thread's Get, or this
    // client's own Create) is dropped here, which gives it back.
    auto holding = conn->holdings().Adopt(std::move(fresh));
    holding->sealed.store(true, std::memory_order_release);
    return holding;
  };
}

// A GPU get answers nothing locally: each get takes a reference of its own (see
// DeviceHolding).
std::shared_ptr<internal::DeviceHolding> NothingLocal(const ObjectId&) { return nullptr; }

auto GpuMake(const std::shared_ptr<Connection>& conn) {
  return [conn](const ObjectId& id, wire::Location::Reader location) {
    return MakeDeviceHolding(conn, id, location, /*writable=*/false);
  };
}

// GetOnTier in host memory.
Result<Got<Holding>> GetOnHost(const std::shared_ptr<Connection>& conn,
                               std::span<const ObjectId> ids, std::chrono::milliseconds timeout,
                               bool claim = false) {
  return GetOnTier<Holding>(conn, ids, ipc::kHostDevice, Client::kHostMemory, timeout,
                            HostLocal(conn, claim), HostMake(conn), claim);
}

// GetOnTier on GPU `ordinal` (this process's).
Result<Got<internal::DeviceHolding>> GetOnGpu(const std::shared_ptr<Connection>& conn,
                                              std::span<const ObjectId> ids, int ordinal,
                                              std::chrono::milliseconds timeout,
                                              bool claim = false) {
  DEPOT_ASSIGN_OR_RETURN(const int32_t tier, conn->DaemonDevice(ordinal));
  return GetOnTier<internal::DeviceHolding>(conn, ids, tier, ordinal, timeout, NothingLocal,
                                            GpuMake(conn), claim);
}

// GetOnTier as a request answered later: the PendingCall, and what turns its reply into
// the holdings (Client::StartGet and StartGetOnDevice wrap them in handles).
template <typename Held>
using FinishHoldings = std::function<Result<Got<Held>>(Reply*)>;
template <typename Held, typename Local, typename Make>
Result<std::pair<std::unique_ptr<internal::PendingCall>, FinishHoldings<Held>>> StartGetOnTier(
    const std::shared_ptr<Connection>& conn, std::span<const ObjectId> ids, int32_t tier,
    int ordinal, std::chrono::milliseconds timeout, bool announce, Local local, Make make) {
  DEPOT_ASSIGN_OR_RETURN(auto plan, PlanGet<Held>(*conn, ids, local));
  auto call = std::make_unique<internal::PendingCall>();
  call->conn = conn;
  if (!plan.remote.empty()) {
    RequestMessage request;
    EncodeGet(request, plan, tier, timeout, /*claim=*/false);
    DEPOT_ASSIGN_OR_RETURN(call->request, conn->Start(request, announce));
  }
  auto kept = std::make_shared<GetPlan<Held>>(std::move(plan));
  FinishHoldings<Held> finish = [kept, ordinal, make](Reply* reply) -> Result<Got<Held>> {
    if (reply == nullptr) return std::move(kept->got);
    return FinishGet(*kept, *reply, ordinal, /*claim=*/false, make);
  };
  return std::make_pair(std::move(call), std::move(finish));
}

// A wait's answer: per id (`n` of them), whether it was sealed.
Result<std::vector<bool>> DecodeWait(Reply& reply, size_t n) {
  return Decode([&]() -> Result<std::vector<bool>> {
    auto r = reply.get();
    if (!r.isWait() || r.getWait().size() != n) return UnexpectedReply("wait");
    // The list read once: each read of it counts against the traversal limit.
    const auto list = r.getWait();
    std::vector<bool> sealed(n);
    for (size_t i = 0; i < n; ++i) sealed[i] = list[static_cast<unsigned>(i)];
    return sealed;
  });
}

// A one-object get's error for an object that was not there (`code`: as Got's).
Status NotThere(const ObjectId& id, StatusCode code, std::chrono::milliseconds timeout) {
  if (code == StatusCode::kNotFound) {
    return Status::NotFound("object " + id.Hex() + " does not exist (or is not sealed yet)");
  }
  return Status::Timeout("object " + id.Hex() + " was not sealed within " +
                         std::to_string(timeout.count()) + " ms");
}

std::string DeleteError(const ObjectId& id, StatusCode code) {
  const std::string what = "cannot delete object " + id.Hex() + ": ";
  switch (code) {
    case StatusCode::kNotFound:
      return what + "no such object";
    case StatusCode::kNotSealed:
      return what + "it is still being created (seal or abort it first)";
    case StatusCode::kPermissionDenied:
      return what + "another user's object (a user the daemon shares with deletes its own only)";
    default:
      return what + std::string(StatusCodeName(code));
  }
}

}  // namespace

Result<Client> Client::Connect(const std::string& socket_path, ConnectOptions options) {
  const std::string path = socket_path.empty() ? ipc::DefaultSocketPath() : socket_path;
  DEPOT_ASSIGN_OR_RETURN(auto conn, Connection::Open(path, options));
  return Client(std::move(conn));
}

Client::Client(std::shared_ptr<Connection> conn) : conn_(std::move(conn)) {}
Client::Client(Client&&) noexcept = default;
Client& Client::operator=(Client&&) noexcept = default;
Client::~Client() = default;

Result<MutableBuffer> Client::Create(const ObjectId& id, uint64_t data_size,
                                     const CreateOptions& options) {
  RequestMessage request;
  InitCreate(request, id, data_size, options);
  Reply reply;
  DEPOT_RETURN_NOT_OK(conn_->Call(request, &reply));
  return Created(id, data_size, options, reply);
}

Result<MutableBuffer> Client::Created(const ObjectId& id, uint64_t data_size,
                                      const CreateOptions& options, Reply& reply) {
  return Decode([&]() -> Result<MutableBuffer> {
    auto r = reply.get();
    if (!r.isCreate()) return UnexpectedReply("create");
    DEPOT_ASSIGN_OR_RETURN(auto holding, MakeHolding(conn_, id, r.getCreate(), /*sealed=*/false));
    if (options.prefault && holding->writable_mapping &&
        conn_->segments().FirstWrite(holding->location.segment)) {
      Prefault(holding->writable, data_size, conn_->copy_threads());
    }
    conn_->holdings().Replace(holding);
    return MutableBuffer(std::move(holding));
  });
}

std::vector<Result<MutableBuffer>> Client::CreateMany(std::span<const CreateItem> items) {
  std::vector<Result<MutableBuffer>> results;
  results.reserve(items.size());
  for (size_t start = 0; start < items.size(); start += kPutManyWindow) {
    const auto window = items.subspan(start, std::min(kPutManyWindow, items.size() - start));
    std::vector<RequestMessage> requests(window.size());
    std::vector<RequestMessage*> pointers;
    pointers.reserve(window.size());
    for (size_t k = 0; k < window.size(); ++k) {
      InitCreate(requests[k], window[k].id, window[k].data_size, window[k].options);
      pointers.push_back(&requests[k]);
    }
    std::unique_ptr<Reply[]> replies(new Reply[window.size()]);
    std::vector<Status> done = conn_->CallMany(pointers, replies.get());
    for (size_t k = 0; k < window.size(); ++k) {
      if (!done[k].ok()) {
        results.emplace_back(std::move(done[k]));
        continue;
      }
      results.push_back(Created(window[k].id, window[k].data_size, window[k].options, replies[k]));
    }
  }
  return results;
}

Status Client::Seal(const ObjectId& id) {
  RequestMessage request;
  ipc::ToWire(id, request.root().initSeal());
  Reply reply;
  DEPOT_RETURN_NOT_OK(conn_->Call(request, &reply));
  Sealed(id);
  return Status::OK();
}

void Client::Sealed(const ObjectId& id) {
  // From now on Gets of it are answered from the creator's Holding, and after it from leases.
  if (auto holding = conn_->holdings().Find(id)) {
    holding->sealed.store(true, std::memory_order_release);
    RememberPlace(*conn_, id, *holding);
  }
}

Status Client::Abort(const ObjectId& id) {
  RequestMessage request;
  ipc::ToWire(id, request.root().initAbort());
  Reply reply;
  DEPOT_RETURN_NOT_OK(conn_->Call(request, &reply));
  // The daemon dropped the creator's reference with the object.
  if (auto holding = conn_->holdings().Find(id)) {
    holding->aborted.store(true, std::memory_order_release);
  }
  conn_->holdings().Forget(id);
  return Status::OK();
}

namespace {

// Whether Put sends `data` inside the create request (see kInlinePutBytes).
bool PutsInline(std::span<const std::byte> data, const CreateOptions& options,
                const Connection& conn) {
  return data.size() <= kInlinePutBytes &&
         data.size() + options.metadata.size() + options.name.size() + kCreateFrameOverhead <=
             conn.max_frame_bytes();
}

// Fills `request` with a create that carries `data`, seals it and keeps no reference: the
// whole put in one request, with no Holding left behind.
void InitInlinePut(RequestMessage& request, const ObjectId& id, std::span<const std::byte> data,
                   const CreateOptions& options) {
  auto create = InitCreate(request, id, data.size(), options);
  const capnp::Data::Reader bytes(reinterpret_cast<const kj::byte*>(data.data()), data.size());
  if (!data.empty() && reinterpret_cast<uintptr_t>(data.data()) % sizeof(capnp::word) == 0 &&
      data.size() % sizeof(capnp::word) == 0) {
    // Whole words, word-aligned: the request points at the caller's bytes, which are
    // copied once, into the frame, instead of twice.
    create.adoptData(request.message().getOrphanage().referenceExternalData(bytes));
  } else {
    create.setData(bytes);
  }
  create.setSeal(true);
  create.setRelease(true);
}

Status CheckInlinePutReply(Reply& reply) {
  return Decode([&]() -> Status {
    return reply.get().isCreate() ? Status::OK() : UnexpectedReply("create");
  });
}

}  // namespace

Status Client::Put(const ObjectId& id, std::span<const std::byte> data,
                   const CreateOptions& options) {
  if (PutsInline(data, options, *conn_)) {
    RequestMessage request;
    InitInlinePut(request, id, data, options);
    Reply reply;
    DEPOT_RETURN_NOT_OK(conn_->Call(request, &reply));
    return CheckInlinePutReply(reply);
  }
  DEPOT_ASSIGN_OR_RETURN(MutableBuffer buffer, Create(id, data.size(), options));
  if (!data.empty())
    internal::CopyBytes(buffer.ptr(), data.data(), data.size(), conn_->copy_threads());
  return Seal(id);
}

std::vector<Status> Client::PutMany(std::span<const PutItem> items) {
  std::vector<Status> statuses(items.size());
  // The small items of a window: their requests, and where their statuses go.
  std::vector<std::unique_ptr<RequestMessage>> requests;
  std::vector<RequestMessage*> pointers;
  std::vector<size_t> positions;
  auto send_window = [&] {
    if (requests.empty()) return;
    std::unique_ptr<Reply[]> replies(new Reply[requests.size()]);
    std::vector<Status> done = conn_->CallMany(pointers, replies.get());
    for (size_t k = 0; k < done.size(); ++k) {
      statuses[positions[k]] = done[k].ok() ? CheckInlinePutReply(replies[k]) : std::move(done[k]);
    }
    requests.clear();
    pointers.clear();
    positions.clear();
  };
  for (size_t i = 0; i < items.size(); ++i) {
    const PutItem& item = items[i];
    if (!PutsInline(item.data, item.options, *conn_)) {
      send_window();  // the items reach the daemon in their order, as Puts would
      statuses[i] = Put(item.id, item.data, item.options);
      continue;
    }
    requests.push_back(std::make_unique<RequestMessage>());
    InitInlinePut(*requests.back(), item.id, item.data, item.options);
    pointers.push_back(requests.back().get());
    positions.push_back(i);
    if (requests.size() == kPutManyWindow) send_window();
  }
  send_window();
  return statuses;
}

Status CheckParts(std::span<const PutPart> parts, uint64_t data_size) {
  uint64_t end = 0;  // of the part before
  for (size_t i = 0; i < parts.size(); ++i) {
    const uint64_t offset = parts[i].offset;
    const uint64_t size = parts[i].data.size();
    if (offset < end) {
      return Status::InvalidArgument("parts overlap or are out of order: part " +
                                     std::to_string(i) + " starts at byte " +
                                     std::to_string(offset) + ", before the end of the one " +
                                     "before it at byte " + std::to_string(end));
    }
    if (size > data_size || offset > data_size - size) {
      return Status::InvalidArgument("parts run past the object's size: part " + std::to_string(i) +
                                     ", " + std::to_string(size) + " bytes at byte " +
                                     std::to_string(offset) + ", in " + std::to_string(data_size) +
                                     " bytes");
    }
    end = offset + size;
  }
  return Status::OK();
}

Status Client::PutParts(const ObjectId& id, uint64_t data_size, std::span<const PutPart> parts,
                        const CreateOptions& options) {
  DEPOT_RETURN_NOT_OK(CheckParts(parts, data_size));
  // Put sends small objects inline, in one round trip, and copies one buffer into shared
  // memory itself.
  if (IsOnePart(parts, data_size) || data_size <= kInlinePutBytes) {
    std::vector<std::byte> scratch;
    return Put(id, JoinParts(parts, data_size, &scratch), options);
  }
  DEPOT_ASSIGN_OR_RETURN(MutableBuffer buffer, Create(id, data_size, options));
  FillParts(buffer.ptr(), parts, data_size, conn_->copy_threads());
  return Seal(id);
}

std::vector<Status> Client::PutManyParts(std::span<const PutPartsItem> items) {
  std::vector<Status> statuses(items.size());
  std::vector<std::vector<std::byte>> joined(items.size());  // of the small items of parts
  std::vector<PutItem> batch;
  std::vector<size_t> positions;  // of the batch's items in `items`
  auto put_batch = [&] {
    std::vector<Status> done = PutMany(batch);
    for (size_t k = 0; k < done.size(); ++k) statuses[positions[k]] = std::move(done[k]);
    batch.clear();
    positions.clear();
  };
  for (size_t i = 0; i < items.size(); ++i) {
    const PutPartsItem& item = items[i];
    if (Status valid = CheckParts(item.parts, item.data_size); !valid.ok()) {
      statuses[i] = std::move(valid);
      continue;
    }
    if (item.data_size > kInlinePutBytes) {
      put_batch();  // in order, as puts one by one would be
      statuses[i] = PutParts(item.id, item.data_size, item.parts, item.options);
      continue;
    }
    batch.push_back(
        PutItem{item.id, JoinParts(item.parts, item.data_size, &joined[i]), item.options});
    positions.push_back(i);
  }
  put_batch();
  return statuses;
}

Result<Buffer> Client::PutAndHandoff(const ObjectId& id, uint64_t data_size,
                                     std::span<const PutPart> parts, const CreateOptions& options,
                                     std::chrono::milliseconds ttl) {
  DEPOT_RETURN_NOT_OK(CheckParts(parts, data_size));
  DEPOT_ASSIGN_OR_RETURN(MutableBuffer buffer, Create(id, data_size, options));
  FillParts(buffer.ptr(), parts, data_size, conn_->copy_threads());
  DEPOT_RETURN_NOT_OK(SealAndHandoff(id, kHostMemory, ttl));
  return Buffer(std::move(buffer.holding_));
}

Result<std::vector<Buffer>> Client::Get(std::span<const ObjectId> ids,
                                        std::chrono::milliseconds timeout) {
  DEPOT_ASSIGN_OR_RETURN(auto got, GetOnHost(conn_, ids, timeout));
  std::vector<Buffer> buffers;
  buffers.reserve(got.holdings.size());
  for (auto& holding : got.holdings) buffers.push_back(Buffer(std::move(holding)));
  return buffers;
}

Result<Buffer> Client::Get(const ObjectId& id, std::chrono::milliseconds timeout) {
  DEPOT_ASSIGN_OR_RETURN(auto got, GetOnHost(conn_, std::span(&id, 1), timeout));
  if (!got.holdings[0]) return NotThere(id, got.codes[0], timeout);
  return Buffer(std::move(got.holdings[0]));
}

Result<Pending<std::vector<Buffer>>> Client::StartGet(std::span<const ObjectId> ids,
                                                      std::chrono::milliseconds timeout,
                                                      bool announce) {
  DEPOT_ASSIGN_OR_RETURN(
      auto started, StartGetOnTier<Holding>(conn_, ids, ipc::kHostDevice, kHostMemory, timeout,
                                            announce, HostLocal(conn_, false), HostMake(conn_)));
  auto& [call, holdings] = started;
  return Pending<std::vector<Buffer>>(
      std::move(call),
      [holdings = std::move(holdings)](Reply* reply) -> Result<std::vector<Buffer>> {
        DEPOT_ASSIGN_OR_RETURN(auto got, holdings(reply));
        std::vector<Buffer> buffers;
        buffers.reserve(got.holdings.size());
        for (auto& holding : got.holdings) buffers.push_back(Buffer(std::move(holding)));
        return buffers;
      });
}

Result<Pending<std::vector<DeviceBuffer>>> Client::StartGetOnDevice(
    std::span<const ObjectId> ids, int device, std::chrono::milliseconds timeout, bool announce) {
  DEPOT_ASSIGN_OR_RETURN(const int32_t tier, conn_->DaemonDevice(device));
  DEPOT_ASSIGN_OR_RETURN(
      auto started, StartGetOnTier<internal::DeviceHolding>(
                        conn_, ids, tier, device, timeout, announce, NothingLocal, GpuMake(conn_)));
  auto& [call, holdings] = started;
  return Pending<std::vector<DeviceBuffer>>(
      std::move(call),
      [holdings = std::move(holdings)](Reply* reply) -> Result<std::vector<DeviceBuffer>> {
        DEPOT_ASSIGN_OR_RETURN(auto got, holdings(reply));
        std::vector<DeviceBuffer> buffers;
        buffers.reserve(got.holdings.size());
        for (auto& holding : got.holdings) buffers.push_back(DeviceBuffer(std::move(holding)));
        return buffers;
      });
}

Result<std::vector<bool>> Client::Wait(std::span<const ObjectId> ids, size_t count,
                                       std::chrono::milliseconds timeout) {
  DEPOT_ASSIGN_OR_RETURN(auto pending, StartWait(ids, count, timeout));
  return pending.Take();
}

Result<Pending<std::vector<bool>>> Client::StartWait(std::span<const ObjectId> ids, size_t count,
                                                     std::chrono::milliseconds timeout,
                                                     bool announce) {
  DEPOT_RETURN_NOT_OK(CheckBatch(ids.size(), *conn_, "a wait"));
  if (count > ids.size()) {
    return Status::InvalidArgument("a wait for " + std::to_string(count) + " of " +
                                   std::to_string(ids.size()) + " objects can never end");
  }
  RequestMessage request;
  auto wait = request.root().initWait();
  auto list = wait.initIds(static_cast<unsigned>(ids.size()));
  for (size_t i = 0; i < ids.size(); ++i) ipc::ToWire(ids[i], list[i]);
  wait.setTimeoutMs(WireTimeout(timeout));
  wait.setCount(static_cast<uint32_t>(count));
  auto call = std::make_unique<internal::PendingCall>();
  call->conn = conn_;
  DEPOT_ASSIGN_OR_RETURN(call->request, conn_->Start(request, announce));
  const size_t n = ids.size();
  return Pending<std::vector<bool>>(std::move(call),
                                    [n](Reply* reply) { return DecodeWait(*reply, n); });
}

int Client::fd() const { return conn_->fd(); }
void Client::Pump() { conn_->Pump(); }
Result<int> Client::CompletionFd() { return conn_->completion_fd(); }
std::vector<uint64_t> Client::TakeCompleted() { return conn_->TakeCompleted(); }

Status Client::Delete(const ObjectId& id) { return Delete(std::span(&id, 1)); }

Status Client::Delete(std::span<const ObjectId> ids) { return Delete(ids, /*after_tasks=*/false); }

Status Client::DeleteAfterTasks(std::span<const ObjectId> ids) {
  return Delete(ids, /*after_tasks=*/true);
}

Status Client::Delete(std::span<const ObjectId> ids, bool after_tasks) {
  if (ids.empty()) return Status::OK();
  const char* what = after_tasks ? "deleteAfterTasks" : "delete";
  DEPOT_RETURN_NOT_OK(CheckBatch(ids.size(), *conn_, what));
  RequestMessage request;
  auto list = after_tasks ? request.root().initDeleteAfterTasks(static_cast<unsigned>(ids.size()))
                          : request.root().initDelete(static_cast<unsigned>(ids.size()));
  for (size_t i = 0; i < ids.size(); ++i) ipc::ToWire(ids[i], list[i]);
  Reply reply;
  DEPOT_RETURN_NOT_OK(conn_->Call(request, &reply));
  return Decode([&]() -> Status {
    auto r = reply.get();
    const bool matches = after_tasks ? r.isDeleteAfterTasks() : r.isDelete();
    if (!matches) return UnexpectedReply(what);
    auto codes = after_tasks ? r.getDeleteAfterTasks() : r.getDelete();
    if (codes.size() != ids.size()) return UnexpectedReply(what);
    Status first_error;
    for (size_t i = 0; i < ids.size(); ++i) {
      const StatusCode code = ipc::FromWire(codes[i]);
      if (code == StatusCode::kOk) {
        // A deleted object is not found by new Gets, even while this client still holds it
        // (after tasks: it will not be).
        conn_->holdings().Forget(ids[i]);
      } else if (first_error.ok()) {
        first_error = Status(code, DeleteError(ids[i], code));
      }
    }
    return first_error;
  });
}

Status Client::Handoff(std::span<const ObjectId> ids, int device, std::chrono::milliseconds ttl) {
  return Handoff(ids, device, ttl, /*seal=*/false);
}

Status Client::Handoff(std::span<const ObjectId> ids, int device, std::chrono::milliseconds ttl,
                       bool seal) {
  if (ttl.count() < 0 || ttl.count() > UINT32_MAX) {
    return Status::InvalidArgument("a handoff's ttl is between 0 and " +
                                   std::to_string(UINT32_MAX) + " ms, not " +
                                   std::to_string(ttl.count()));
  }
  if (ids.empty()) return Status::OK();
  DEPOT_RETURN_NOT_OK(CheckBatch(ids.size(), *conn_, "a handoff"));
  int32_t tier = ipc::kHostDevice;
  if (device != kHostMemory) {
    DEPOT_ASSIGN_OR_RETURN(tier, conn_->DaemonDevice(device));
  }
  RequestMessage request;
  auto handoff = request.root().initHandoff();
  handoff.setDevice(tier);
  handoff.setTtlMs(static_cast<uint32_t>(ttl.count()));
  handoff.setGraceMs(conn_->handoff_grace_ms());
  handoff.setSeal(seal);
  auto list = handoff.initIds(static_cast<unsigned>(ids.size()));
  for (size_t i = 0; i < ids.size(); ++i) ipc::ToWire(ids[i], list[i]);
  Reply reply;
  DEPOT_RETURN_NOT_OK(conn_->Call(request, &reply));
  return Decode([&]() -> Status {
    auto r = reply.get();
    if (!r.isHandoff() || r.getHandoff().size() != ids.size()) return UnexpectedReply("handoff");
    if (seal) Sealed(ids[0]);  // handed off, or deleted by the daemon when it could not be
    auto codes = r.getHandoff();
    Status first_error;
    for (size_t i = 0; i < ids.size(); ++i) {
      const StatusCode code = ipc::FromWire(codes[i]);
      if (code == StatusCode::kOk || seal) {
        // Handed off objects are deleted: new Gets do not find them, only claims. So is one
        // the daemon sealed and could not hand off.
        conn_->holdings().Forget(ids[i]);
        if (code == StatusCode::kOk) continue;
      }
      if (!first_error.ok()) continue;
      std::string why;
      switch (code) {
        case StatusCode::kNotFound:
          why = "no such object";
          break;
        case StatusCode::kNotSealed:
          why = "it is still being created (seal it first)";
          break;
        case StatusCode::kNotHeld:
          why = "this client holds no reference to it on " + TierName(device) +
                ", nor does its group";
          break;
        case StatusCode::kLimitExceeded:
          why = "the group holds too many handoffs of it already";
          break;
        case StatusCode::kPermissionDenied:
          why = "another user's object (a user the daemon shares with hands off its own only)";
          break;
        default:
          why = std::string(StatusCodeName(code));
      }
      first_error = Status(code, "cannot hand off object " + ids[i].Hex() + ": " + why);
    }
    return first_error;
  });
}

Status Client::SealAndHandoff(const ObjectId& id, int device, std::chrono::milliseconds ttl) {
  // One request: the daemon seals, hands off, and deletes the object if the handoff fails.
  return Handoff(std::span(&id, 1), device, ttl, /*seal=*/true);
}

Result<std::vector<Buffer>> Client::Claim(std::span<const ObjectId> ids) {
  DEPOT_ASSIGN_OR_RETURN(auto got, GetOnHost(conn_, ids, std::chrono::milliseconds(0),
                                             /*claim=*/true));
  std::vector<Buffer> buffers;
  buffers.reserve(got.holdings.size());
  for (auto& holding : got.holdings) buffers.push_back(Buffer(std::move(holding)));
  return buffers;
}

Result<std::vector<DeviceBuffer>> Client::ClaimOnDevice(std::span<const ObjectId> ids, int device) {
  DEPOT_ASSIGN_OR_RETURN(auto got, GetOnGpu(conn_, ids, device, std::chrono::milliseconds(0),
                                            /*claim=*/true));
  std::vector<DeviceBuffer> buffers;
  buffers.reserve(got.holdings.size());
  for (auto& holding : got.holdings) buffers.push_back(DeviceBuffer(std::move(holding)));
  return buffers;
}

Result<bool> Client::Contains(const ObjectId& id) {
  RequestMessage request;
  ipc::ToWire(id, request.root().initContains(1)[0]);
  Reply reply;
  DEPOT_RETURN_NOT_OK(conn_->Call(request, &reply));
  return Decode([&]() -> Result<bool> {
    auto r = reply.get();
    if (!r.isContains() || r.getContains().size() != 1) return UnexpectedReply("contains");
    return r.getContains()[0];
  });
}

namespace {

// The placement of a sealed object from its tiers bits, in this process's GPU ordinals.
ObjectPlacement PlacementOf(Connection& conn, const ObjectId& id, uint64_t tiers,
                            uint64_t data_size, uint64_t metadata_size) {
  ObjectPlacement p{.id = id,
                    .found = true,
                    .on_host = (tiers & ipc::kTierHost) != 0,
                    .data_size = data_size,
                    .metadata_size = metadata_size};
  tiers &= ~ipc::kTierDisk;  // the daemon's spill directory: no place to read from
  for (int32_t device = 0; (tiers >> (device + 1)) != 0; ++device) {
    if (!(tiers & ipc::TierBit(device))) continue;
    if (const int ordinal = conn.LocalOrdinal(device); ordinal >= 0) p.gpus.push_back(ordinal);
  }
  std::sort(p.gpus.begin(), p.gpus.end());
  return p;
}

}  // namespace

Result<std::vector<ObjectPlacement>> Client::Locate(std::span<const ObjectId> ids) {
  std::vector<ObjectPlacement> out(ids.size());
  std::vector<size_t> ask;  // those the header table cannot answer
  for (size_t i = 0; i < ids.size(); ++i) {
    out[i].id = ids[i];
    // A held object's slot is its own until the last reference goes: its header is current.
    std::shared_ptr<Holding> holding = FindSealed(*conn_, ids[i]);
    const ipc::ObjectHeader* header = holding ? conn_->header(holding->location.slot) : nullptr;
    if (header == nullptr) {
      ask.push_back(i);
      continue;
    }
    out[i] = PlacementOf(*conn_, ids[i], header->tiers.load(std::memory_order_acquire),
                         holding->data_size, holding->metadata_size);
  }
  if (ask.empty()) return out;
  DEPOT_RETURN_NOT_OK(CheckBatch(ask.size(), *conn_, "a locate"));
  RequestMessage request;
  auto list = request.root().initLocate(static_cast<unsigned>(ask.size()));
  for (unsigned k = 0; k < ask.size(); ++k) ipc::ToWire(ids[ask[k]], list[k]);
  Reply reply;
  DEPOT_RETURN_NOT_OK(conn_->Call(request, &reply));
  DEPOT_RETURN_NOT_OK(Decode([&]() -> Status {
    auto r = reply.get();
    if (!r.isLocate() || r.getLocate().size() != ask.size()) return UnexpectedReply("locate");
    auto placements = r.getLocate();
    for (unsigned k = 0; k < ask.size(); ++k) {
      auto p = placements[k];
      if (!p.getFound()) continue;
      if (p.getFailed()) {
        out[ask[k]] = ObjectPlacement{.id = ids[ask[k]], .found = true, .failed = true};
        continue;
      }
      out[ask[k]] =
          PlacementOf(*conn_, ids[ask[k]], p.getTiers(), p.getDataSize(), p.getMetadataSize());
    }
    return Status::OK();
  }));
  return out;
}

namespace {

// One list request (ListObjects: from `start`, at most `limit` whose names start with
// `prefix`, or the `largest` largest): appends what the daemon returned to `objects`; the slot
// the next page starts from, or nullopt when the list is complete.
Result<std::optional<uint32_t>> ListPage(Connection& conn, uint32_t start, uint32_t limit,
                                         uint32_t largest, std::string_view prefix,
                                         std::vector<ObjectInfo>& objects) {
  RequestMessage request;
  auto list = request.root().initList();
  list.setStartSlot(start);
  list.setLimit(limit);
  list.setLargest(largest);
  const std::string text(prefix);  // capnp's Text::Reader wants the NUL after it
  list.setPrefix(capnp::Text::Reader(text.data(), text.size()));
  Reply reply;
  DEPOT_RETURN_NOT_OK(conn.Call(request, &reply));
  return Decode([&]() -> Result<std::optional<uint32_t>> {
    auto r = reply.get();
    if (!r.isList()) return UnexpectedReply("list");
    auto page = r.getList();
    for (auto o : page.getObjects()) objects.push_back(FromWire<ObjectInfo>(o));
    if (page.getDone()) return std::optional<uint32_t>();
    return std::optional<uint32_t>(page.getNextSlot());
  });
}

}  // namespace

Result<std::vector<ObjectInfo>> Client::ListLargest(uint32_t n) {
  std::vector<ObjectInfo> objects;
  if (n == 0) return objects;
  DEPOT_RETURN_NOT_OK(ListPage(*conn_, 0, n, n, {}, objects).status());
  return objects;
}

Result<std::vector<ObjectInfo>> Client::List(std::string_view prefix) {
  std::vector<ObjectInfo> objects;
  uint32_t start = 0;
  for (;;) {
    DEPOT_ASSIGN_OR_RETURN(std::optional<uint32_t> next,
                           ListPage(*conn_, start, kListPage, 0, prefix, objects));
    if (!next) return objects;
    if (*next <= start) {
      return Status::Internal("the daemon's list did not advance past slot " +
                              std::to_string(start));
    }
    start = *next;
  }
}

Result<std::vector<ClientInfo>> Client::Clients() {
  RequestMessage request;
  request.root().setClients();
  Reply reply;
  DEPOT_RETURN_NOT_OK(conn_->Call(request, &reply));
  return Decode([&]() -> Result<std::vector<ClientInfo>> {
    auto r = reply.get();
    if (!r.isClients()) return UnexpectedReply("clients");
    std::vector<ClientInfo> clients;
    for (auto c : r.getClients()) clients.push_back(FromWire<ClientInfo>(c));
    return clients;
  });
}

Result<ObjectDetails> Client::Describe(const ObjectId& id) {
  RequestMessage request;
  ipc::ToWire(id, request.root().initObjectInfo());
  Reply reply;
  DEPOT_RETURN_NOT_OK(conn_->Call(request, &reply));
  return Decode([&]() -> Result<ObjectDetails> {
    auto r = reply.get();
    if (!r.isObjectInfo()) return UnexpectedReply("objectInfo");
    return FromWire<ObjectDetails>(r.getObjectInfo());
  });
}

namespace {

// One verify request: of `ids`, or with `all` of a page of every checksummed object from
// `start`. Appends the results to `results`; returns where the next page starts, or nullopt
// when there is none.
Result<std::optional<uint32_t>> VerifyPage(Connection& conn, std::span<const ObjectId> ids,
                                           bool all, uint32_t start,
                                           std::vector<VerifyResult>& results) {
  RequestMessage request;
  auto verify = request.root().initVerify();
  auto list = verify.initIds(static_cast<unsigned>(ids.size()));
  for (size_t i = 0; i < ids.size(); ++i) ipc::ToWire(ids[i], list[i]);
  verify.setAll(all);
  verify.setStartSlot(start);
  Reply reply;
  DEPOT_RETURN_NOT_OK(conn.Call(request, &reply));
  return Decode([&]() -> Result<std::optional<uint32_t>> {
    auto r = reply.get();
    if (!r.isVerify() || (!all && r.getVerify().getResults().size() != ids.size())) {
      return UnexpectedReply("verify");
    }
    auto page = r.getVerify();
    for (auto v : page.getResults()) results.push_back(FromWire<VerifyResult>(v));
    if (page.getDone()) return std::optional<uint32_t>();
    return std::optional<uint32_t>(page.getNextSlot());
  });
}

}  // namespace

Result<std::vector<VerifyResult>> Client::Verify(std::span<const ObjectId> ids) {
  DEPOT_RETURN_NOT_OK(CheckBatch(ids.size(), *conn_, "a verify"));
  std::vector<VerifyResult> results;
  if (!ids.empty()) {
    DEPOT_RETURN_NOT_OK(VerifyPage(*conn_, ids, false, 0, results).status());
    return results;
  }
  // Every object, a page at a time (the daemon bounds what one request may cost).
  uint32_t start = 0;
  for (;;) {
    DEPOT_ASSIGN_OR_RETURN(std::optional<uint32_t> next,
                           VerifyPage(*conn_, {}, true, start, results));
    if (!next) return results;
    if (*next <= start) {
      return Status::Internal("the daemon's verify did not advance past slot " +
                              std::to_string(start));
    }
    start = *next;
  }
}

Result<EvictResult> Client::Evict(uint64_t bytes, bool all_unreferenced) {
  if (bytes == 0 && !all_unreferenced) {
    return Status::InvalidArgument("evict needs a number of bytes to free, or all_unreferenced");
  }
  RequestMessage request;
  auto evict = request.root().initEvict();
  evict.setBytes(bytes);
  evict.setAllUnreferenced(all_unreferenced);
  Reply reply;
  DEPOT_RETURN_NOT_OK(conn_->Call(request, &reply));
  return Decode([&]() -> Result<EvictResult> {
    auto r = reply.get();
    if (!r.isEvict()) return UnexpectedReply("evict");
    return FromWire<EvictResult>(r.getEvict());
  });
}

Result<StoreStatus> Client::GetStatus() {
  RequestMessage request;
  request.root().setStatus();
  Reply reply;
  DEPOT_RETURN_NOT_OK(conn_->Call(request, &reply));
  return Decode([&]() -> Result<StoreStatus> {
    auto r = reply.get();
    if (!r.isStatus()) return UnexpectedReply("status");
    StoreStatus status = FromWire<StoreStatus>(r.getStatus());
    for (size_t d = 0; d < status.gpus.size(); ++d) {
      status.gpus[d].ordinal = conn_->LocalOrdinal(static_cast<int32_t>(d));
    }
    return status;
  });
}

Result<std::string> Client::Metrics() {
  RequestMessage request;
  request.root().setMetrics();
  Reply reply;
  DEPOT_RETURN_NOT_OK(conn_->Call(request, &reply));
  return Decode([&]() -> Result<std::string> {
    auto r = reply.get();
    if (!r.isMetrics()) return UnexpectedReply("metrics");
    return std::string(r.getMetrics().cStr(), r.getMetrics().size());
  });
}

uint64_t Client::epoch() const { return conn_->epoch(); }
uint64_t Client::session_id() const { return conn_->session_id(); }
const std::string& Client::socket_path() const { return conn_->socket_path(); }

}  // namespace depot

// GPU objects.
namespace depot {

Status Client::Seal(const ObjectId& id, uintptr_t stream) {
  if (!conn_->gpus().empty()) {
    DEPOT_ASSIGN_OR_RETURN(internal::DeviceImporter * importer, conn_->Importer());
    DEPOT_RETURN_NOT_OK(importer->SynchronizeStream(stream));
  }
  return Seal(id);
}

Result<std::vector<GpuInfo>> Client::Gpus() {
  DEPOT_ASSIGN_OR_RETURN(StoreStatus status, GetStatus());
  return status.gpus;
}

Result<MutableDeviceBuffer> Client::CreateOnDevice(const ObjectId& id, uint64_t data_size,
                                                   int device, const CreateOptions& options) {
  DEPOT_ASSIGN_OR_RETURN(const int32_t daemon_device, conn_->DaemonDevice(device));
  RequestMessage request;
  InitCreate(request, id, data_size, options).setDevice(daemon_device);
  Reply reply;
  DEPOT_RETURN_NOT_OK(conn_->Call(request, &reply));
  return Decode([&]() -> Result<MutableDeviceBuffer> {
    auto r = reply.get();
    if (!r.isCreate()) return UnexpectedReply("create");
    DEPOT_ASSIGN_OR_RETURN(auto holding,
                           MakeDeviceHolding(conn_, id, r.getCreate(), /*writable=*/true));
    return MutableDeviceBuffer(std::move(holding));
  });
}

Status Client::Prefetch(std::span<const ObjectId> ids, int device) {
  if (ids.empty()) return Status::OK();
  DEPOT_RETURN_NOT_OK(CheckBatch(ids.size(), *conn_, "a prefetch"));
  int32_t daemon_device = kHostMemory;  // the wire numbers host memory -1 too
  if (device != kHostMemory) {
    DEPOT_ASSIGN_OR_RETURN(daemon_device, conn_->DaemonDevice(device));
  }
  RequestMessage request;
  auto prefetch = request.root().initPrefetch();
  auto list = prefetch.initIds(static_cast<unsigned>(ids.size()));
  for (size_t i = 0; i < ids.size(); ++i) ipc::ToWire(ids[i], list[i]);
  prefetch.setDevice(daemon_device);
  Reply reply;
  DEPOT_RETURN_NOT_OK(conn_->Call(request, &reply));
  return Decode([&]() -> Status {
    auto r = reply.get();
    if (!r.isPrefetch() || r.getPrefetch().size() != ids.size()) return UnexpectedReply("prefetch");
    auto codes = r.getPrefetch();
    for (unsigned i = 0; i < codes.size(); ++i) {
      const StatusCode code = ipc::FromWire(codes[i]);
      if (code == StatusCode::kOk) continue;
      return Status(
          code,
          "cannot prefetch object " + ids[i].Hex() + " to " + TierName(device) + ": " +
              (code == StatusCode::kNotFound ? std::string("it does not exist or is not sealed")
                                             : std::string(StatusCodeName(code))));
    }
    return Status::OK();
  });
}

Result<std::vector<DeviceBuffer>> Client::GetOnDevice(std::span<const ObjectId> ids, int device,
                                                      std::chrono::milliseconds timeout) {
  DEPOT_ASSIGN_OR_RETURN(auto got, GetOnGpu(conn_, ids, device, timeout));
  std::vector<DeviceBuffer> buffers;
  buffers.reserve(got.holdings.size());
  for (auto& holding : got.holdings) buffers.push_back(DeviceBuffer(std::move(holding)));
  return buffers;
}

Result<DeviceBuffer> Client::GetOnDevice(const ObjectId& id, int device,
                                         std::chrono::milliseconds timeout) {
  DEPOT_ASSIGN_OR_RETURN(auto got, GetOnGpu(conn_, std::span(&id, 1), device, timeout));
  if (!got.holdings[0]) return NotThere(id, got.codes[0], timeout);
  return DeviceBuffer(std::move(got.holdings[0]));
}

}  // namespace depot
