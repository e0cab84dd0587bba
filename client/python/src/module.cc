// depot._depot: the C++ client as the low-level layer of the Python package. Encoding of
// Python values (numpy, pickle) lives in Python (depot/_codec.py); this module moves bytes
// and references, and releases the GIL around every call that may block.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "buffers.h"
#include "depot/client.h"
#include "depot/ipc/protocol.h"
#include "device.h"
#include "errors.h"
#include "gil.h"
#include "ids.h"
#include "info.h"
#include "tasks.h"
#include "text.h"
#include "waits.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace depot::python {
namespace {

using std::chrono::milliseconds;

// CreateOptions over the caller's `metadata` (which must outlive them) and `name`.
CreateOptions MakeCreateOptions(const nb::bytes& metadata, const std::string& name, bool pin,
                                bool spill = true) {
  CreateOptions options;
  options.metadata = BytesOf(metadata);
  options.name = name;
  options.pin = pin;
  options.spill = spill;
  return options;
}

// Calls `f(client)` with the GIL released; returns its value or raises its error.
template <typename F>
auto Blocking(depot::Client& client, F&& f) {
  auto r = [&] {
    ReleaseGil release;
    return f(client);
  }();
  return ValueOrRaise(std::move(r));
}

// A reference this client keeps to an object it handed off (Client::Put with `handoff`), so
// that it may hand it off again after every claim; given back when dropped. It offers no
// bytes to Python.
struct Held {
  Buffer reference;
};

// _depot.Client: one depot::Client, for depot.Client (Python) to wrap. Thread-safe.
class Client {
 public:
  Client(const std::string& socket_path, const std::string& client_name, nb::bytes group,
         uint32_t handoff_grace_ms) {
    ConnectOptions options;
    options.client_name = client_name;
    options.group.assign(group.c_str(), group.size());
    options.handoff_grace = std::chrono::milliseconds(handoff_grace_ms);
    Result<depot::Client> client = [&] {
      ReleaseGil release;
      return depot::Client::Connect(socket_path, options);
    }();
    client_.emplace(ValueOrRaise(std::move(client)));
    socket_path_ = client_->socket_path();
  }

  void Close() {
    // Handles (StoreBuffer, WritableBuffer) keep the connection itself open until they go.
    std::optional<depot::Client> client = std::move(client_);
    client_.reset();
    ReleaseGil release;
    client.reset();
  }

  bool closed() const { return !client_.has_value(); }
  const std::string& socket_path() const { return socket_path_; }
  uint64_t session_id() { return client().session_id(); }

  // Stores `parts` at `offsets` in a new object of `size` bytes and seals it
  // (depot::Client::PutParts). With `handoff`, hands it to the group
  // (depot::Client::PutAndHandoff) and returns the creator's reference as a Held, which
  // keeps the object (so that this client may hand it off again) until it is dropped;
  // else returns None. `ttl_ms` as for Handoff.
  nb::object Put(nb::bytes id_bytes, nb::list parts, const std::vector<uint64_t>& offsets,
                 uint64_t size, nb::bytes metadata, const std::string& name, bool pin, bool spill,
                 bool handoff, uint32_t ttl_ms) {
    const ObjectId id = ToId(id_bytes);
    const Parts viewed = ViewParts(parts, offsets);
    const CreateOptions options = MakeCreateOptions(metadata, name, pin, spill);
    if (handoff) {
      Buffer held = Blocking(client(), [&](depot::Client& c) {
        return c.PutAndHandoff(id, size, viewed.parts, options, std::chrono::milliseconds(ttl_ms));
      });
      return nb::cast(Held{std::move(held)});
    }
    depot::Client& c = client();
    Status st;
    {
      ReleaseGil release;
      st = c.PutParts(id, size, viewed.parts, options);
    }
    RaiseIfError(st);
    return nb::none();
  }

  // Hands `ids` (held by this client, or by its group) to its group, in host memory or on
  // GPU `device`; with `ttl_ms`, for at most that long unless claimed.
  void Handoff(const std::vector<nb::bytes>& id_bytes, int device, uint32_t ttl_ms) {
    std::vector<ObjectId> ids = ToIds(id_bytes);
    RaiseIfError([&] {
      ReleaseGil release;
      return client().Handoff(ids, device, std::chrono::milliseconds(ttl_ms));
    }());
  }

  // Takes over the group's references to `ids` (depot::Client::Claim): StoreBuffers, in order.
  nb::list Claim(const std::vector<nb::bytes>& id_bytes) {
    std::vector<ObjectId> ids = ToIds(id_bytes);
    std::vector<Buffer> buffers =
        Blocking(client(), [&](depot::Client& c) { return c.Claim(ids); });
    nb::list out;
    for (auto& b : buffers) out.append(nb::cast(StoreBuffer{std::move(b)}));
    return out;
  }

  nb::list ClaimOnDevice(const std::vector<nb::bytes>& id_bytes, int device) {
    std::vector<ObjectId> ids = ToIds(id_bytes);
    std::vector<DeviceBuffer> buffers =
        Blocking(client(), [&](depot::Client& c) { return c.ClaimOnDevice(ids, device); });
    nb::list out;
    for (auto& b : buffers) out.append(nb::cast(DeviceStoreBuffer{std::move(b)}));
    return out;
  }

  // Puts each of `items`, tuples (id, parts, offsets, size, metadata, name) as Put takes
  // them, pipelining the small ones (depot::Client::PutManyParts). Items with malformed parts are
  // refused before anything is stored; then every item is attempted. Returns, per item,
  // None or the exception its failure is raised as.
  nb::list PutMany(nb::list items, bool pin) {
    struct Source {  // what an item's PutPartsItem points into while the GIL is released
      Parts parts;
      nb::bytes metadata;
    };
    std::vector<Source> sources(items.size());
    std::vector<PutPartsItem> batch(items.size());
    for (size_t i = 0; i < items.size(); ++i) {
      nb::tuple item = nb::cast<nb::tuple>(items[i]);
      if (item.size() != 6) throw nb::value_error("put_many: each item is 6 values");
      PutPartsItem& put = batch[i];
      put.id = ToId(nb::cast<nb::bytes>(item[0]));
      put.data_size = nb::cast<uint64_t>(item[3]);
      sources[i].parts =
          ViewParts(nb::cast<nb::list>(item[1]), nb::cast<std::vector<uint64_t>>(item[2]));
      put.parts = sources[i].parts.parts;
      RaiseIfError(CheckParts(put.parts, put.data_size));
      sources[i].metadata = nb::cast<nb::bytes>(item[4]);
      put.options = MakeCreateOptions(sources[i].metadata, nb::cast<std::string>(item[5]), pin);
    }
    depot::Client& c = client();
    std::vector<Status> statuses;
    {
      ReleaseGil release;
      statuses = c.PutManyParts(batch);
    }
    nb::list errors;
    for (const Status& st : statuses) errors.append(st.ok() ? nb::none() : ErrorOf(st));
    return errors;
  }

  WritableBuffer Create(nb::bytes id_bytes, uint64_t size, nb::bytes metadata,
                        const std::string& name, bool pin, bool spill) {
    const ObjectId id = ToId(id_bytes);
    const CreateOptions options = MakeCreateOptions(metadata, name, pin, spill);
    depot::Client& c = client();
    Result<MutableBuffer> r = [&] {
      ReleaseGil release;
      return c.Create(id, size, options);
    }();
    return WritableBuffer{ValueOrRaise(std::move(r))};
  }

  // Creates an object of `size` bytes on GPU `device`, copies `size` bytes from `source` (a
  // device pointer there; see CopyIntoDevice) into it, and seals it, with the GIL released.
  // The creator's reference goes with the handle; a failed copy aborts the object. With
  // `handoff`, hands it to the group on `device` (depot::Client::SealAndHandoff), for
  // `ttl_ms` as Handoff takes it.
  void PutDevice(nb::bytes id_bytes, uint64_t source, uint64_t size, int device,
                 std::optional<uintptr_t> wait_stream, nb::bytes metadata, const std::string& name,
                 bool pin, bool handoff, uint32_t ttl_ms) {
    const ObjectId id = ToId(id_bytes);
    const CreateOptions options = MakeCreateOptions(metadata, name, pin);
    depot::Client& c = client();
    Status st;
    {
      ReleaseGil release;
      st = [&]() -> Status {
        DEPOT_ASSIGN_OR_RETURN(MutableDeviceBuffer target,
                               c.CreateOnDevice(id, size, device, options));
        DEPOT_RETURN_NOT_OK(CopyIntoDevice(target, source, size, wait_stream));
        // Before `target`, the creator's reference, goes.
        return handoff ? c.SealAndHandoff(id, device, std::chrono::milliseconds(ttl_ms))
                       : c.Seal(id);
      }();
    }
    RaiseIfError(st);
  }

  // The GPUs the daemon serves that this process sees, by ordinal.
  std::vector<GpuInfo> Gpus() {
    return Blocking(client(), [](depot::Client& c) { return c.Gpus(); });
  }

  // One object on GPU `device` (the daemon copies it there if needed), waiting as Get.
  DeviceStoreBuffer GetOnDevice(nb::bytes id_bytes, int device, int64_t timeout_ms) {
    std::vector<ObjectId> ids{ToId(id_bytes)};
    return DeviceStoreBuffer{std::move(GetAllOnDevice(client(), ids, device, timeout_ms)[0])};
  }

  nb::list GetManyOnDevice(const std::vector<nb::bytes>& id_bytes, int device, int64_t timeout_ms) {
    std::vector<ObjectId> ids;
    ids.reserve(id_bytes.size());
    for (const auto& b : id_bytes) ids.push_back(ToId(b));
    std::vector<DeviceBuffer> buffers = GetAllOnDevice(client(), ids, device, timeout_ms);
    nb::list out;
    for (auto& b : buffers) out.append(nb::cast(DeviceStoreBuffer{std::move(b)}));
    return out;
  }

  void Seal(nb::bytes id_bytes) { Call(&depot::Client::Seal, id_bytes); }
  void Abort(nb::bytes id_bytes) { Call(&depot::Client::Abort, id_bytes); }

  // Seals an object this client created and hands it to the group on `device`, deleting
  // it if the handoff fails (depot::Client::SealAndHandoff); `ttl_ms` as Handoff takes it.
  void SealAndHandoff(nb::bytes id_bytes, int device, uint32_t ttl_ms) {
    const ObjectId id = ToId(id_bytes);
    depot::Client& c = client();
    Status st;
    {
      ReleaseGil release;
      st = c.SealAndHandoff(id, device, std::chrono::milliseconds(ttl_ms));
    }
    RaiseIfError(st);
  }

  // One object, waiting up to `timeout_ms` (-1: for ever) for its seal. Raises NotFound
  // (timeout 0) or Timeout.
  StoreBuffer Get(nb::bytes id_bytes, int64_t timeout_ms) {
    const ObjectId id = ToId(id_bytes);
    depot::Client& c = client();
    if (timeout_ms >= 0 && timeout_ms <= kWaitSlice.count()) {
      Result<Buffer> r = [&] {
        ReleaseGil release;
        return c.Get(id, milliseconds(timeout_ms));
      }();
      return StoreBuffer{ValueOrRaise(std::move(r))};
    }
    std::vector<ObjectId> ids{id};
    std::vector<Buffer> out = GetAll(c, ids, timeout_ms);
    return StoreBuffer{std::move(out[0])};
  }

  // Many objects in one request: a list of StoreBuffer in the order of `ids`. Raises
  // NotFound (timeout 0) or Timeout naming the first object that was not there in time.
  nb::list GetMany(const std::vector<nb::bytes>& id_bytes, int64_t timeout_ms) {
    std::vector<ObjectId> ids;
    ids.reserve(id_bytes.size());
    for (const auto& b : id_bytes) ids.push_back(ToId(b));
    std::vector<Buffer> buffers = GetAll(client(), ids, timeout_ms);
    nb::list out;
    for (auto& b : buffers) out.append(nb::cast(StoreBuffer{std::move(b)}));
    return out;
  }

  // `device`: this process's GPU ordinal, or -1 for host memory (depot::Client::kHostMemory).
  void Prefetch(const std::vector<nb::bytes>& id_bytes, int device) {
    std::vector<ObjectId> ids;
    for (const auto& b : id_bytes) ids.push_back(ToId(b));
    depot::Client& c = client();
    Status st;
    {
      ReleaseGil release;
      st = c.Prefetch(ids, device);
    }
    RaiseIfError(st);
  }

  std::vector<ObjectPlacement> Locate(const std::vector<nb::bytes>& id_bytes) {
    std::vector<ObjectId> ids;
    for (const auto& b : id_bytes) ids.push_back(ToId(b));
    return Blocking(client(), [&](depot::Client& c) { return c.Locate(ids); });
  }

  void Delete(const std::vector<nb::bytes>& id_bytes, bool after_tasks) {
    std::vector<ObjectId> ids;
    for (const auto& b : id_bytes) ids.push_back(ToId(b));
    depot::Client& c = client();
    Status st;
    {
      ReleaseGil release;
      st = after_tasks ? c.DeleteAfterTasks(ids) : c.Delete(ids);
    }
    RaiseIfError(st);
  }

  bool Contains(nb::bytes id_bytes) {
    const ObjectId id = ToId(id_bytes);
    depot::Client& c = client();
    Result<bool> r = [&] {
      ReleaseGil release;
      return c.Contains(id);
    }();
    return ValueOrRaise(std::move(r));
  }

  std::vector<ObjectInfo> List(const std::string& prefix) {
    return Blocking(client(), [&](depot::Client& c) { return c.List(prefix); });
  }
  StoreStatus GetStatus() {
    return Blocking(client(), [](depot::Client& c) { return c.GetStatus(); });
  }

  nb::str Metrics() {
    return Text(Blocking(client(), [](depot::Client& c) { return c.Metrics(); }));
  }
  std::vector<ClientInfo> Clients() {
    return Blocking(client(), [](depot::Client& c) { return c.Clients(); });
  }
  std::vector<WorkerInfo> Workers() {
    return Blocking(client(), [](depot::Client& c) { return c.Workers(); });
  }
  std::vector<TaskInfo> Tasks() {
    return Blocking(client(), [](depot::Client& c) { return c.Tasks(); });
  }
  std::vector<std::vector<nb::bytes>> Submit(nb::list tasks) {
    return python::Submit(client(), tasks);
  }
  std::vector<std::string> Cancel(const std::vector<nb::bytes>& outputs) {
    return python::Cancel(client(), outputs);
  }

 private:
  depot::Client& client() {
    if (!client_) {
      Raise(Status::ConnectionFailed("this Client is closed; connect a new one"));
    }
    return *client_;
  }

  // Calls a depot::Client method that takes one id and returns a Status, with the GIL released.
  void Call(Status (depot::Client::*method)(const ObjectId&), nb::bytes id_bytes) {
    const ObjectId id = ToId(id_bytes);
    depot::Client& c = client();
    Status st;
    {
      ReleaseGil release;
      st = (c.*method)(id);
    }
    RaiseIfError(st);
  }

  // Gets `ids` in one request, which the daemon answers once they are all there or
  // `timeout_ms` (-1: for ever) has passed (depot::Client::StartGet), awaited as AwaitAnswer does.
  static std::vector<Buffer> GetAll(depot::Client& c, const std::vector<ObjectId>& ids,
                                    int64_t timeout_ms) {
    auto pending =
        Blocking(c, [&](depot::Client& c) { return c.StartGet(ids, milliseconds(timeout_ms)); });
    AwaitAnswer(pending);
    return AllThere(Blocking(c, [&](depot::Client&) { return pending.Take(); }), ids, timeout_ms);
  }

  // The same on GPU `device` (depot::Client::StartGetOnDevice).
  static std::vector<DeviceBuffer> GetAllOnDevice(depot::Client& c,
                                                  const std::vector<ObjectId>& ids, int device,
                                                  int64_t timeout_ms) {
    auto pending = Blocking(c, [&](depot::Client& c) {
      return c.StartGetOnDevice(ids, device, milliseconds(timeout_ms));
    });
    AwaitAnswer(pending);
    return AllThere(Blocking(c, [&](depot::Client&) { return pending.Take(); }), ids, timeout_ms);
  }

 public:
  // Waits until `count` of `ids` (0: all) are sealed or `timeout_ms` (-1: for ever) has
  // passed, in one request, awaited as AwaitAnswer does; per id, whether it is sealed.
  std::vector<bool> Wait(const std::vector<nb::bytes>& id_bytes, size_t count, int64_t timeout_ms) {
    const std::vector<ObjectId> ids = ToIds(id_bytes);
    auto pending = Blocking(client(), [&](depot::Client& c) {
      return c.StartWait(ids, count, milliseconds(timeout_ms));
    });
    AwaitAnswer(pending);
    return Blocking(client(), [&](depot::Client&) { return pending.Take(); });
  }

  // For an event loop (depot.aio): gets and waits it learns the answers of through
  // take_completed, and the calls that read the socket without blocking.
  PendingGet StartGet(const std::vector<nb::bytes>& ids, int64_t timeout_ms) {
    return python::StartGet(client(), ToIds(ids), timeout_ms);
  }
  PendingDeviceGet StartGetOnDevice(const std::vector<nb::bytes>& ids, int device,
                                    int64_t timeout_ms) {
    return python::StartGetOnDevice(client(), ToIds(ids), device, timeout_ms);
  }
  PendingWait StartWait(const std::vector<nb::bytes>& ids, size_t count, int64_t timeout_ms) {
    return python::StartWait(client(), ToIds(ids), count, timeout_ms);
  }
  int fd() { return client().fd(); }
  void Pump() {
    depot::Client& c = client();
    ReleaseGil release;
    c.Pump();
  }
  int CompletionFd() { return ValueOrRaise(client().CompletionFd()); }
  std::vector<uint64_t> TakeCompleted() { return client().TakeCompleted(); }

 private:
  static std::vector<ObjectId> ToIds(const std::vector<nb::bytes>& id_bytes) {
    std::vector<ObjectId> ids;
    ids.reserve(id_bytes.size());
    for (const auto& b : id_bytes) ids.push_back(ToId(b));
    return ids;
  }

  std::optional<depot::Client> client_;
  std::string socket_path_;
};

}  // namespace
}  // namespace depot::python

NB_MODULE(_depot, m) {
  using depot::ObjectId;
  using depot::python::Client;
  using depot::python::Held;
  m.doc() = "depot's C++ client, the low-level layer of the depot package (use depot.Client).";
  // Objects of this module alive when the interpreter exits are no leak to report: a received
  // array kept in a global, or a daemon thread still in a call (ReleaseGil), keeps its
  // buffer or Client, and the process's exit gives the references back to the daemon.
  nb::set_leak_warnings(false);

  depot::python::BindBuffers(m);
  depot::python::BindDevice(m);
  depot::python::BindInfo(m);
  depot::python::BindTasks(m);
  depot::python::BindWaits(m);

  m.def("_register_errors", &depot::python::RegisterErrorTypes, "types"_a);
  m.def(
      "id_from_name",
      [](const std::string& name) { return depot::python::IdBytes(ObjectId::FromName(name)); },
      "name"_a, "The id of a name: XXH3-128 of its UTF-8 bytes, as in every depot client.");
  m.def(
      "random_id", [] { return depot::python::IdBytes(ObjectId::Random()); }, "A fresh random id.");
  m.def("default_socket_path", &depot::ipc::DefaultSocketPath,
        "The socket a Client connects to when given none: $DEPOT_SOCKET, else "
        "$XDG_RUNTIME_DIR/depot.sock, else /tmp/depot-<uid>.sock.");
  m.def(
      "digest",
      [](nb::handle buffer) {
        const depot::python::ReadView view(buffer);
        const auto bytes = view.bytes();
        ObjectId digest;
        {
          depot::python::ReleaseGil release;
          digest = ObjectId::FromName(
              std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
        }
        return depot::python::IdBytes(digest);
      },
      "buffer"_a,
      "XXH3-128 of a contiguous buffer's bytes (16 bytes), computed with the GIL released.");
  m.def(
      "id_hex", [](nb::bytes id) { return depot::python::ToId(id).Hex(); }, "id"_a,
      "The 32-character hex form depotctl shows.");
  m.def(
      "id_from_hex",
      [](const std::string& hex) {
        auto id = ObjectId::FromHex(hex);
        if (!id) throw nb::value_error("not a 32-character hex object id");
        return depot::python::IdBytes(*id);
      },
      "hex"_a);

  nb::class_<Held>(m, "Held",
                   "A reference to an object this client handed off: it stays in the store, and "
                   "may be handed off again, until this is dropped.");

  nb::class_<Client>(m, "Client",
                     "A client of depotd (depot::Client), which depot.Client wraps. Thread-safe.")
      .def(nb::init<const std::string&, const std::string&, nb::bytes, uint32_t>(), "socket_path"_a,
           "client_name"_a, "group"_a = nb::bytes(""), "handoff_grace_ms"_a = 0)
      .def("close", &Client::Close)
      .def_prop_ro("closed", &Client::closed)
      .def_prop_ro("socket_path", &Client::socket_path)
      .def_prop_ro("session_id", &Client::session_id)
      .def("put", &Client::Put, "id"_a, "parts"_a, "offsets"_a, "size"_a, "metadata"_a, "name"_a,
           "pin"_a, "spill"_a = true, "handoff"_a = false, "ttl_ms"_a = 0)
      .def("handoff", &Client::Handoff, "ids"_a, "device"_a, "ttl_ms"_a = 0)
      .def("claim", &Client::Claim, "ids"_a)
      .def("claim_on_device", &Client::ClaimOnDevice, "ids"_a, "device"_a)
      .def("put_many", &Client::PutMany, "items"_a, "pin"_a)
      .def("create", &Client::Create, "id"_a, "size"_a, "metadata"_a, "name"_a, "pin"_a,
           "spill"_a = true)
      .def("put_device", &Client::PutDevice, "id"_a, "source"_a, "size"_a, "device"_a,
           "wait_stream"_a.none(), "metadata"_a, "name"_a, "pin"_a, "handoff"_a = false,
           "ttl_ms"_a = 0)
      .def("gpus", &Client::Gpus)
      .def("get_on_device", &Client::GetOnDevice, "id"_a, "device"_a, "timeout_ms"_a)
      .def("get_many_on_device", &Client::GetManyOnDevice, "ids"_a, "device"_a, "timeout_ms"_a)
      .def("seal", &Client::Seal, "id"_a)
      .def("abort", &Client::Abort, "id"_a)
      .def("seal_and_handoff", &Client::SealAndHandoff, "id"_a, "device"_a = -1, "ttl_ms"_a = 0)
      .def("get", &Client::Get, "id"_a, "timeout_ms"_a)
      .def("get_many", &Client::GetMany, "ids"_a, "timeout_ms"_a)
      .def("wait", &Client::Wait, "ids"_a, "count"_a, "timeout_ms"_a)
      .def("start_get", &Client::StartGet, "ids"_a, "timeout_ms"_a)
      .def("start_get_on_device", &Client::StartGetOnDevice, "ids"_a, "device"_a, "timeout_ms"_a)
      .def("start_wait", &Client::StartWait, "ids"_a, "count"_a, "timeout_ms"_a)
      .def_prop_ro("fd", &Client::fd)
      .def("pump", &Client::Pump)
      .def("completion_fd", &Client::CompletionFd)
      .def("take_completed", &Client::TakeCompleted)
      .def("delete", &Client::Delete, "ids"_a, "after_tasks"_a = false)
      .def("prefetch", &Client::Prefetch, "ids"_a, "device"_a)
      .def("locate", &Client::Locate, "ids"_a)
      .def("contains", &Client::Contains, "id"_a)
      // Not `list`: in the stubs, a method of that name would hide the builtin from the
      // annotations of the methods after it.
      .def("list_objects", &Client::List, "prefix"_a = "")
      .def("status", &Client::GetStatus)
      .def("metrics", &Client::Metrics)
      .def("clients", &Client::Clients)
      .def("workers", &Client::Workers)
      .def("tasks", &Client::Tasks)
      .def("submit", &Client::Submit, "tasks"_a)
      .def("cancel", &Client::Cancel, "outputs"_a);
}
