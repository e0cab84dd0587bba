// The device backend: everything depotd needs from GPUs, behind one interface, with two
// implementations.
//
// - CUDA (cuda_backend.cc): the driver API, loaded at run time with dlopen and
//   cuGetProcAddress and never linked, so one depotd binary runs on hosts with and without
//   GPUs (there it reports zero devices and serves host objects).
// - Simulated (simulated_backend.cc): devices whose memory is memfd chunks, for tests and
//   demos on machines without GPUs. Their names say "simulated" wherever they show.
//
// The backend deals in chunks: large allocations that the daemon's pools (store/gpu/pool.h)
// carve into objects with the same offset allocator as the host arena. A chunk is exported
// once, and every client maps it once, so a warm get of a GPU object costs no driver call.
//
// Threading: devices(), AllocateChunk and FreeChunk run on the daemon's loop thread; the
// copies and RegisterHostMemory run on worker threads, several at once.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "depot/ipc/framing.h"
#include "depot/ipc/gpu.h"
#include "depot/status.h"

namespace depot::store::gpu {

struct DeviceInfo {
  ipc::DeviceUuid uuid{};
  std::string name;          // e.g. "NVIDIA H100 80GB HBM3", or "simulated GPU 1"
  uint64_t total_bytes = 0;  // the device's memory
  uint64_t granularity = 0;  // chunk sizes are multiples of this
  bool simulated = false;
};

// A chunk of one device's memory, as the backend allocated it. Movable, not copyable; give
// it back with FreeChunk.
struct Chunk {
  uint64_t size = 0;
  ipc::ChunkHandle handle = ipc::ChunkHandle::kPosixFd;
  // What clients import: a descriptor (kPosixFd, kMemfd), duplicated for each client...
  ipc::UniqueFd fd;
  // ...and, where the backend can share the chunk read-only (kMemfd), the same memory opened
  // read-only, for clients that only read it. CUDA has no read-only export: a process that
  // imports a chunk may map it read-write (docs/architecture.md, Trust).
  ipc::UniqueFd read_fd;
  // ...or a legacy IPC handle (kLegacyIpc).
  std::vector<std::byte> ipc_handle;
  // Where the daemon itself reaches the chunk's bytes: a CUdeviceptr in its own context, or,
  // for a simulated device, the address of its mapping.
  uint64_t address = 0;
  // The backend's own handle (a CUmemGenericAllocationHandle); opaque to everyone else.
  uint64_t backend_handle = 0;
};

class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;

  // "cuda" or "simulated".
  virtual std::string_view kind() const = 0;
  // The devices, in the daemon's order: pool k serves devices()[k].
  virtual std::span<const DeviceInfo> devices() const = 0;

  // Allocates `size` bytes (a multiple of the device's granularity) on `device` and exports
  // them. OutOfMemory when the device has no room.
  virtual Result<Chunk> AllocateChunk(uint32_t device, uint64_t size) = 0;
  virtual void FreeChunk(uint32_t device, Chunk& chunk) = 0;

  // Copies `bytes` between device memory (addresses as in Chunk::address) and host memory,
  // or between two devices, and returns when the copy is complete. Host memory passed here
  // lies in the host arena; copies run at full speed once its segment is registered
  // (RegisterHostMemory), and still work, more slowly, before that.
  virtual Status CopyToHost(uint32_t device, uint64_t source, void* destination,
                            uint64_t bytes) = 0;
  virtual Status CopyFromHost(uint32_t device, const void* source, uint64_t destination,
                              uint64_t bytes) = 0;
  virtual Status CopyBetweenDevices(uint32_t source_device, uint64_t source,
                                    uint32_t destination_device, uint64_t destination,
                                    uint64_t bytes) = 0;

  // Pins host memory (an arena segment) so that copies to and from it run at full PCIe
  // speed. Does nothing for simulated devices.
  virtual Status RegisterHostMemory(void* base, uint64_t bytes) = 0;
  virtual void UnregisterHostMemory(void* base) = 0;
};

// Loads the CUDA driver and opens every visible device that supports the virtual memory
// management API (or legacy IPC). When there is no driver, or no device, the backend has no
// devices and `*why` says why, in words for the log.
std::unique_ptr<DeviceBackend> LoadCudaBackend(std::string* why);

// `count` simulated devices of `bytes` each.
std::unique_ptr<DeviceBackend> MakeSimulatedBackend(uint32_t count, uint64_t bytes);

}  // namespace depot::store::gpu
