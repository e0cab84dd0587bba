// Device memory as a test reaches it, on either kind of GPU the tests run against.
//
// On a simulated GPU (depotd --simulate-gpus) a "device pointer" is a host address in this
// process and a copy is memcpy. On a CUDA GPU the copy goes through the driver, loaded at run
// time as depot loads it, in the device's primary context. A process that has used CUDA must
// not fork children that use it too (the driver does not survive fork): GPU tests run their
// other clients as separate programs (gpu_test_client).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "depot/status.h"

namespace depot::testing {

enum class GpuKind { kSimulated, kCuda };

std::string_view GpuKindName(GpuKind kind);

// The CUDA GPUs this process sees, or why it sees none (no driver, no device, or a build
// without the CUDA headers), in words for a skip message.
Result<int> CudaDeviceCount();

// Copies between this process's memory and device memory at `device_ptr` on GPU `device`
// (this process's ordinal), returning once the copy is complete.
Status CopyToDevice(GpuKind kind, int device, uint64_t device_ptr,
                    std::span<const std::byte> bytes);
Result<std::vector<std::byte>> CopyFromDevice(GpuKind kind, int device, uint64_t device_ptr,
                                              uint64_t size);

}  // namespace depot::testing
