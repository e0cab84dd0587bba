// DeviceBuffer and MutableDeviceBuffer: handles to an object's bytes in a GPU pool.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "depot/object_id.h"

namespace depot {

namespace internal {
struct DeviceHolding;  // one store reference to one GPU replica
}  // namespace internal

// A read-only view of a sealed object on a GPU, pointing straight into the store's pool on
// that device: no copy. device_ptr() is a CUdeviceptr in this process (for a simulated GPU,
// an ordinary host address). The reference is released when the last copy of the handle
// goes (queued, like a Buffer's). Thread-safe to copy.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;

  explicit operator bool() const { return holding_ != nullptr; }
  const ObjectId& id() const;
  uint64_t device_ptr() const;
  uint64_t size() const;
  int device() const;  // the ordinal this process gave in Get/Create
  std::span<const std::byte> metadata() const;
  bool simulated() const;  // on a simulated GPU: device_ptr() is a host address

 private:
  friend class Client;
  explicit DeviceBuffer(std::shared_ptr<internal::DeviceHolding> h) : holding_(std::move(h)) {}
  std::shared_ptr<internal::DeviceHolding> holding_;
};

// The writable bytes of a GPU object this client is creating. Write them (kernels,
// cuMemcpy), make sure the writes are complete, then seal: Client::Seal(id, stream)
// synchronises `stream` first. Like MutableBuffer, dropping the last handle to an object
// never sealed aborts it.
class MutableDeviceBuffer {
 public:
  MutableDeviceBuffer() = default;

  explicit operator bool() const { return holding_ != nullptr; }
  const ObjectId& id() const;
  uint64_t device_ptr() const;
  uint64_t size() const;
  int device() const;
  bool simulated() const;

 private:
  friend class Client;
  explicit MutableDeviceBuffer(std::shared_ptr<internal::DeviceHolding> h)
      : holding_(std::move(h)) {}
  std::shared_ptr<internal::DeviceHolding> holding_;
};

}  // namespace depot
