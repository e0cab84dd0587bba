#include "waits.h"

#include <nanobind/stl/vector.h>

#include "buffers.h"
#include "device.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace depot::python {

namespace {

using std::chrono::milliseconds;

// Runs `start` (a Client::Start* call) with the GIL released; raises its error.
template <typename F>
auto Started(F&& start) {
  auto r = [&] {
    ReleaseGil release;
    return start();
  }();
  return ValueOrRaise(std::move(r));
}

// The answer of an event loop's Pending, which has come (so this does not block).
template <typename T>
std::vector<T> Answer(PendingAnswer<T>& p) {
  auto r = [&] {
    ReleaseGil release;
    return p.pending.Take();
  }();
  return ValueOrRaise(std::move(r));
}

// Binds the calls the three kinds share: id, ready, cancel.
template <typename T>
nb::class_<PendingAnswer<T>> BindPending(nb::module_& m, const char* name, const char* doc) {
  using P = PendingAnswer<T>;
  return nb::class_<P>(m, name, doc)
      .def_prop_ro(
          "id", [](const P& p) { return p.pending.id(); },
          "The request's id, as Client.take_completed names it (0: answered "
          "without a request).")
      .def(
          "ready", [](P& p) { return p.pending.Ready(); },
          "Whether the answer is in (take then does not block).")
      .def(
          "cancel",
          [](P& p) {
            Status st;
            {
              ReleaseGil release;
              st = p.pending.Cancel();
            }
            RaiseIfError(st);
          },
          "Asks the daemon to answer now, as if the timeout had passed (one round trip).");
}

}  // namespace

PendingGet StartGet(Client& c, std::vector<ObjectId> ids, int64_t timeout_ms) {
  auto pending =
      Started([&] { return c.StartGet(ids, milliseconds(timeout_ms), /*announce=*/true); });
  return PendingGet{std::move(pending), std::move(ids), timeout_ms};
}

PendingDeviceGet StartGetOnDevice(Client& c, std::vector<ObjectId> ids, int device,
                                  int64_t timeout_ms) {
  auto pending = Started(
      [&] { return c.StartGetOnDevice(ids, device, milliseconds(timeout_ms), /*announce=*/true); });
  return PendingDeviceGet{std::move(pending), std::move(ids), timeout_ms};
}

PendingWait StartWait(Client& c, std::vector<ObjectId> ids, size_t count, int64_t timeout_ms) {
  auto pending =
      Started([&] { return c.StartWait(ids, count, milliseconds(timeout_ms), /*announce=*/true); });
  return PendingWait{std::move(pending), std::move(ids), timeout_ms};
}

void BindWaits(nb::module_& m) {
  BindPending<Buffer>(m, "PendingGet", "A get an event loop awaits (Client.start_get).")
      .def(
          "take",
          [](PendingGet& p) {
            nb::list out;
            for (auto& b : AllThere(Answer(p), p.ids, p.timeout_ms)) {
              out.append(nb::cast(StoreBuffer{std::move(b)}));
            }
            return out;
          },
          "The StoreBuffers, in order; raises as Client.get_many does. Once.");
  BindPending<DeviceBuffer>(m, "PendingDeviceGet",
                            "A get on a GPU an event loop awaits (Client.start_get_on_device).")
      .def(
          "take",
          [](PendingDeviceGet& p) {
            nb::list out;
            for (auto& b : AllThere(Answer(p), p.ids, p.timeout_ms)) {
              out.append(nb::cast(DeviceStoreBuffer{std::move(b)}));
            }
            return out;
          },
          "The DeviceStoreBuffers, in order; raises as Client.get_many_on_device does. "
          "Once.");
  BindPending<bool>(m, "PendingWait", "A wait an event loop awaits (Client.start_wait).")
      .def(
          "take", [](PendingWait& p) { return Answer(p); },
          "Per id, whether it was sealed when the daemon answered. Once.");
}

}  // namespace depot::python
