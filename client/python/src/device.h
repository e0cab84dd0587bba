// GPU objects in the Python binding: DeviceStoreBuffer (a DeviceBuffer, exported to other
// libraries as a DLPack capsule), DLPackImport (a producer's capsule, consumed), and the copy
// of a GPU array into an object being created on a GPU.
//
// Lifetime: a capsule made from a DeviceStoreBuffer holds its own copy of the DeviceBuffer
// (one shared store reference), released by the DLPack deleter, which the consumer calls when
// it is done (from any thread, with or without the GIL: it touches no Python object), or by
// the capsule's destructor if no one consumed it.
#pragma once

#include <nanobind/nanobind.h>

#include <cstdint>
#include <optional>

#include "depot/client.h"
#include "depot/status.h"

namespace depot::python {

// A sealed object's bytes on a GPU (Client::GetOnDevice).
struct DeviceStoreBuffer {
  DeviceBuffer buffer;
};

// Copies `size` bytes from `source` into `target`, an object this client is creating on a
// GPU, and returns once the copy is complete. `source` is a device pointer on the target's
// device in this process (for a simulated GPU: a host address, checked to be readable host
// memory). With `wait_stream`, first waits for the work queued on that CUstream (the
// producer's, for __cuda_array_interface__). CUDA: cuMemcpyDtoDAsync on the legacy default
// stream in the device's primary context, made current for the length of the call, then
// cuStreamSynchronize. Call without the GIL.
Status CopyIntoDevice(const MutableDeviceBuffer& target, uint64_t source, uint64_t size,
                      std::optional<uintptr_t> wait_stream);

void BindDevice(nanobind::module_& m);

}  // namespace depot::python
