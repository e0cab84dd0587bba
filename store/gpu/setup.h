// depotd's GPU side as its flags describe it: which backend, and a pool per device.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "depot/status.h"
#include "store/gpu/device_backend.h"
#include "store/gpu/pool.h"

namespace depot::store::gpu {

struct GpuOptions {
  // "N" or "N:SIZE": N simulated devices of SIZE (default 1GiB) each, instead of real GPUs.
  std::string simulate;
  // The pools' limits: "75%" or "8GiB" for every device, or per device "0:8GiB,1:50%"
  // (devices not named get the default, 75% of their memory).
  std::string memory;
  std::string chunk_size = "256MiB";  // the usual size of a pool's chunks
  // Pool memory made at start-up, as --gpu-memory is written (devices not named: none), so
  // that puts into a fresh daemon do not pay for making and exporting chunks.
  std::string reserve;
  bool disabled = false;  // serve no GPUs (do not even load the driver)
};

struct Gpus {
  std::unique_ptr<DeviceBackend> backend;
  std::vector<std::unique_ptr<DevicePool>> pools;  // destroyed before the backend
  std::string description;                         // "cuda", "simulated", or why there are no GPUs

  ~Gpus() { pools.clear(); }
  std::vector<DevicePool*> pool_pointers() const;
};

// Parses the options and sets the GPUs up. Bad flags are InvalidArgument errors naming the
// flag; a host without a driver or devices is no error (no GPUs, and `description` says why).
Result<std::unique_ptr<Gpus>> SetUpGpus(const GpuOptions& options);

// Parses a --gpu-memory value for `devices` devices of the given sizes.
Result<std::vector<uint64_t>> ParsePoolLimits(const std::string& spec,
                                              const std::vector<uint64_t>& device_bytes);
// Parses a per-device size ("8GiB", "50%", or "0:8GiB,1:50%"); devices not named get
// `default_share` of their memory.
Result<std::vector<uint64_t>> ParsePerDevice(const std::string& spec,
                                             const std::vector<uint64_t>& device_bytes,
                                             double default_share);

}  // namespace depot::store::gpu
