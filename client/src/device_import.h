// Device import: how a client process maps the daemon's GPU chunks, with two
// implementations to match the daemon's backends.
//
// - CUDA (cuda_import.cc): the driver loaded at run time (never linked). A kPosixFd chunk is
//   imported (cuMemImportFromShareableHandle), given address space of exactly the chunk's
//   size (cuMemAddressReserve), mapped (cuMemMap) and made accessible (cuMemSetAccess) once;
//   a kLegacyIpc chunk is opened with cuIpcOpenMemHandle once.
// - Simulated (simulated_import.cc): a kMemfd chunk is mmap'd; its "device pointer" is a
//   host address.
//
// The connection keeps each chunk imported for as long as any DeviceBuffer may point into
// it, so a warm get of a GPU object makes no driver call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "depot/ipc/framing.h"
#include "depot/ipc/gpu.h"
#include "depot/status.h"

namespace depot::internal {

// A chunk mapped into this process. Unmapped (and its import released) on destruction.
class ImportedChunk {
 public:
  virtual ~ImportedChunk() = default;
  // The chunk's first byte in this process: a CUdeviceptr, or a host address for a
  // simulated device.
  virtual uint64_t address() const = 0;
  virtual uint64_t size() const = 0;
};

struct ChunkToImport {
  ipc::ChunkHandle handle = ipc::ChunkHandle::kPosixFd;
  uint64_t size = 0;
  ipc::UniqueFd fd;                       // kPosixFd, kMemfd
  std::span<const std::byte> ipc_handle;  // kLegacyIpc
  ipc::DeviceUuid device{};               // the device the chunk lives on
  // Whether to map it read-write. A read-only chunk is a descriptor opened read-only
  // (simulated devices); CUDA chunks always come writable.
  bool writable = true;
};

class DeviceImporter {
 public:
  virtual ~DeviceImporter() = default;

  // The UUIDs of the devices this process sees, by its own ordinal: device k of the user's
  // API is VisibleDevices()[k].
  virtual std::vector<ipc::DeviceUuid> VisibleDevices() const = 0;

  // Maps `chunk` into this process. Fails with a message naming the driver call and its
  // error, or saying that this process cannot see the chunk's device.
  virtual Result<std::unique_ptr<ImportedChunk>> Import(ChunkToImport chunk) = 0;

  // Waits until the work queued on `stream` (a CUstream; 0: the legacy default stream) is
  // complete: what a writer does before sealing an object it wrote on the GPU.
  virtual Status SynchronizeStream(uintptr_t stream) = 0;
};

// The CUDA importer, loading the driver on first use in this process. Fails with a clear
// message when there is no driver (libcuda.so.1) to load.
Result<std::unique_ptr<DeviceImporter>> LoadCudaImporter();

// The importer for a daemon with simulated devices, which this process sees in the daemon's
// order: `devices` are their UUIDs.
std::unique_ptr<DeviceImporter> MakeSimulatedImporter(std::vector<ipc::DeviceUuid> devices);

}  // namespace depot::internal
