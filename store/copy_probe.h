// The start-up probe of copy bandwidths: how fast the store's copies between host memory and
// GPUs, and between GPUs, run on this host, so that the scheduler's placement starts from
// figures of this machine rather than defaults (DESIGN.md, Scheduler).
//
// It copies the way the store's own copies do, through the device backend between
// page-locked host memory and device memory allocated as pool chunks are, but in memory of
// its own that it gives back after: it touches no pool, so it can run on a worker thread
// while the daemon serves.
#pragma once

#include <cstdint>

#include "depot/status.h"
#include "store/gpu/device_backend.h"
#include "store/tiers.h"

namespace depot::store {

// Times copies of `bytes` (cut to an eighth of the smallest device, in whole units of its
// granularity) from host memory to each device and back, and from device 0 to device 1,
// the fastest of a few runs of each; host<->GPU is the devices' mean. Zeros where nothing
// was timed: no devices, devices too small for a copy of CopyRates::kMinBytes, or one device
// (GPU<->GPU). An error (memory the backend would not give, a copy that failed) says which.
// Blocks for as long as the copies take.
Result<CopyRates> ProbeCopyRates(gpu::DeviceBackend& backend, uint64_t bytes);

}  // namespace depot::store
