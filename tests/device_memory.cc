#include "device_memory.h"

#include <cstring>
#include <map>
#include <mutex>
#include <string>

#ifdef DEPOT_HAVE_CUDA
#include "depot/ipc/cuda_driver.h"
#endif

namespace depot::testing {

std::string_view GpuKindName(GpuKind kind) { return kind == GpuKind::kCuda ? "CUDA" : "simulated"; }

#ifdef DEPOT_HAVE_CUDA
namespace {

// The primary context of `device`, retained for the rest of the process.
Result<std::shared_ptr<ipc::CudaPrimaryContext>> Context(const ipc::CudaDriver& driver,
                                                         int device) {
  static std::mutex mutex;
  static std::map<int, std::shared_ptr<ipc::CudaPrimaryContext>> contexts;
  std::lock_guard lock(mutex);
  if (auto it = contexts.find(device); it != contexts.end()) return it->second;
  CUdevice handle = 0;
  DEPOT_RETURN_NOT_OK(driver.Check(driver.DeviceGet(&handle, device), "cuDeviceGet"));
  DEPOT_ASSIGN_OR_RETURN(auto context, ipc::CudaPrimaryContext::Retain(driver, handle));
  contexts.emplace(device, context);
  return context;
}

// Runs `copy` (a driver call queued on the legacy default stream) with the device's context
// current, and waits for it.
template <typename Copy>
Status RunCopy(int device, const char* call, Copy copy) {
  DEPOT_ASSIGN_OR_RETURN(const ipc::CudaDriver* driver, ipc::CudaDriver::Load());
  DEPOT_ASSIGN_OR_RETURN(auto context, Context(*driver, device));
  DEPOT_ASSIGN_OR_RETURN(auto scope, ipc::CudaContextScope::Enter(*driver, context->get()));
  DEPOT_RETURN_NOT_OK(driver->Check(copy(*driver), call));
  return driver->Check(driver->StreamSynchronize(nullptr), "cuStreamSynchronize");
}

}  // namespace

Result<int> CudaDeviceCount() {
  DEPOT_ASSIGN_OR_RETURN(const ipc::CudaDriver* driver, ipc::CudaDriver::Load());
  int count = 0;
  DEPOT_RETURN_NOT_OK(driver->Check(driver->DeviceGetCount(&count), "cuDeviceGetCount"));
  if (count == 0) return Status::IoError("the CUDA driver sees no device");
  return count;
}

Status CopyToDevice(GpuKind kind, int device, uint64_t device_ptr,
                    std::span<const std::byte> bytes) {
  if (kind == GpuKind::kSimulated) {
    std::memcpy(reinterpret_cast<void*>(device_ptr), bytes.data(), bytes.size());
    return Status::OK();
  }
  return RunCopy(device, "cuMemcpyHtoDAsync", [&](const ipc::CudaDriver& driver) {
    return driver.MemcpyHtoDAsync(device_ptr, bytes.data(), bytes.size(), nullptr);
  });
}

Result<std::vector<std::byte>> CopyFromDevice(GpuKind kind, int device, uint64_t device_ptr,
                                              uint64_t size) {
  std::vector<std::byte> bytes(size);
  if (kind == GpuKind::kSimulated) {
    std::memcpy(bytes.data(), reinterpret_cast<const void*>(device_ptr), size);
    return bytes;
  }
  DEPOT_RETURN_NOT_OK(RunCopy(device, "cuMemcpyDtoHAsync", [&](const ipc::CudaDriver& driver) {
    return driver.MemcpyDtoHAsync(bytes.data(), device_ptr, size, nullptr);
  }));
  return bytes;
}

#else  // !DEPOT_HAVE_CUDA

namespace {
Status NoCuda() { return Status::IoError("this build has no CUDA support (no CUDA headers)"); }
}  // namespace

Result<int> CudaDeviceCount() { return NoCuda(); }

Status CopyToDevice(GpuKind kind, int, uint64_t device_ptr, std::span<const std::byte> bytes) {
  if (kind == GpuKind::kCuda) return NoCuda();
  std::memcpy(reinterpret_cast<void*>(device_ptr), bytes.data(), bytes.size());
  return Status::OK();
}

Result<std::vector<std::byte>> CopyFromDevice(GpuKind kind, int, uint64_t device_ptr,
                                              uint64_t size) {
  if (kind == GpuKind::kCuda) return NoCuda();
  std::vector<std::byte> bytes(size);
  std::memcpy(bytes.data(), reinterpret_cast<const void*>(device_ptr), size);
  return bytes;
}

#endif

}  // namespace depot::testing
