// GPU vocabulary both sides of the socket share: how a device is named and how a chunk of
// device memory travels to a client.
#pragma once

#include <array>
#include <cstdint>
#include <string>

namespace depot::ipc {

// A GPU's UUID, as the CUDA driver reports it (cuDeviceGetUuid). Ordinals differ between
// processes (CUDA_VISIBLE_DEVICES), UUIDs do not, so the daemon and its clients agree on
// devices by UUID.
using DeviceUuid = std::array<uint8_t, 16>;

// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", the form nvidia-smi prints.
std::string FormatUuid(const DeviceUuid& uuid);

// How a client reaches a chunk of a GPU pool.
enum class ChunkHandle : uint8_t {
  // cuMemCreate memory exported as a POSIX file descriptor (passed with SCM_RIGHTS): the
  // client imports it, reserves address space of the chunk's size, maps it and sets access.
  kPosixFd = 0,
  // A legacy CUDA IPC handle (64 bytes, in the message) of a cuMemAlloc'd chunk, for
  // devices that cannot export file descriptors: opened with cuIpcOpenMemHandle.
  kLegacyIpc = 1,
  // A simulated device's chunk: a memfd (passed with SCM_RIGHTS) the client maps as host
  // memory. The "device pointer" is then an ordinary pointer.
  kMemfd = 2,
};

}  // namespace depot::ipc
