// Gets and waits the daemon answers later (depot::Pending), for Python: awaited with the
// GIL released in slices that notice Ctrl-C (the blocking calls), or learnt of by an event
// loop (depot.aio), whose callbacks never block.
#pragma once

#include <nanobind/nanobind.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "depot/client.h"
#include "errors.h"
#include "gil.h"

namespace depot::python {

// How long a blocking call waits, with the GIL released, between looks at signals. The
// request itself is one, however many slices its caller waits.
inline constexpr std::chrono::milliseconds kWaitSlice{200};

// Waits for `pending`'s answer with the GIL released, in slices between which signals are
// checked: a signal whose handler raises (Ctrl-C: KeyboardInterrupt) cancels the request in
// the daemon and gives back what it was granted, then raises.
template <typename T>
void AwaitAnswer(Pending<T>& pending) {
  for (;;) {
    bool ready;
    {
      ReleaseGil release;
      ready = pending.Ready(kWaitSlice);
    }
    if (ready) return;
    if (PyErr_CheckSignals() != 0) {
      {
        ReleaseGil release;
        Pending<T> dropped(std::move(pending));  // cancelled, and given back
      }
      throw nanobind::python_error();
    }
  }
}

// The handles a get was answered with, every one there; else raises NotFound (`timeout_ms`
// 0) or Timeout naming the first object that was not.
template <typename T>
std::vector<T> AllThere(std::vector<T> got, const std::vector<ObjectId>& ids, int64_t timeout_ms) {
  const auto missing = std::find_if(got.begin(), got.end(), [](const T& b) { return !b; });
  if (missing == got.end()) return got;
  const std::string what = "object " + ids[static_cast<size_t>(missing - got.begin())].Hex();
  if (timeout_ms == 0) Raise(Status::NotFound(what + " does not exist"));
  const auto others = std::count_if(missing + 1, got.end(), [](const T& b) { return !b; });
  Raise(Status::Timeout(what + " was not sealed within " + std::to_string(timeout_ms) + " ms" +
                        (others > 0 ? " (nor " + std::to_string(others) + " other objects)" : "")));
}

// A get or wait started for an event loop (with `announce`): what depot.aio awaits.
template <typename T>
struct PendingAnswer {
  PendingAnswer(Pending<std::vector<T>> p, std::vector<ObjectId> i, int64_t t)
      : pending(std::move(p)), ids(std::move(i)), timeout_ms(t) {}
  PendingAnswer(PendingAnswer&&) noexcept = default;
  PendingAnswer& operator=(PendingAnswer&&) noexcept = default;
  // Dropped with the GIL held (by Python): one not taken is cancelled and its answer waited
  // for (Pending's destructor) with the GIL released.
  ~PendingAnswer() {
    ReleaseGil release;
    Pending<std::vector<T>> dropped(std::move(pending));
  }

  Pending<std::vector<T>> pending;
  std::vector<ObjectId> ids;
  int64_t timeout_ms = -1;
};
using PendingGet = PendingAnswer<Buffer>;
using PendingDeviceGet = PendingAnswer<DeviceBuffer>;
using PendingWait = PendingAnswer<bool>;

// Starts a get (on `device`, unless kHostMemory) or a wait for an event loop.
PendingGet StartGet(Client& c, std::vector<ObjectId> ids, int64_t timeout_ms);
PendingDeviceGet StartGetOnDevice(Client& c, std::vector<ObjectId> ids, int device,
                                  int64_t timeout_ms);
PendingWait StartWait(Client& c, std::vector<ObjectId> ids, size_t count, int64_t timeout_ms);

// The Python classes of the three, and of the event loop's calls on a connection.
void BindWaits(nanobind::module_& m);

}  // namespace depot::python
