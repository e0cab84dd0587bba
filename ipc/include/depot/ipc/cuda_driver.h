// The CUDA driver API, loaded at run time.
//
// depot never links libcuda: a binary linked against it (or against CMake's stub) fails to
// start on a host without an NVIDIA driver, and one depotd binary must serve hosts with and
// without GPUs. CudaDriver dlopens the driver once per process and fetches each function it
// needs with cuGetProcAddress, asking for the exact ABI version whose PFN_ typedef (from
// cudaTypedefs.h) the pointer is stored as. Building needs only the toolkit's headers.
//
// Both sides use it: the daemon's CUDA device backend (store/gpu/cuda_backend.cc) and the
// client's CUDA importer (client/src/cuda_import.cc).
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>

#include <memory>
#include <span>
#include <string>

#include "depot/status.h"

namespace depot::ipc {

// Every driver function depot calls, as X(name without the "cu" prefix, ABI version). The
// version is the one in the PFN_ typedef's name, and the one cuGetProcAddress is asked for,
// so the pointer's type and the function the driver hands back always agree: for example
// X(MemcpyDtoHAsync, 3020) declares `PFN_cuMemcpyDtoHAsync_v3020 MemcpyDtoHAsync` and fetches
// "cuMemcpyDtoHAsync" at 3020, which is cuMemcpyDtoHAsync_v2 (64-bit sizes and pointers).
// Functions with several ABIs: DeviceGetUuid 11040 (_v2: the UUID nvidia-smi prints, also for
// MIG instances), DevicePrimaryCtxRelease 11000 (_v2), IpcOpenMemHandle 11000 (_v2),
// MemHostRegister 6050 (_v2), CtxPushCurrent, CtxPopCurrent and StreamDestroy 4000 (_v2),
// DeviceTotalMem, MemAlloc, MemFree, MemGetInfo and the memcpys 3020 (_v2).
#define DEPOT_CUDA_DRIVER_FUNCTIONS(X)   \
  X(GetErrorName, 6000)                  \
  X(GetErrorString, 6000)                \
  X(Init, 2000)                          \
  X(DeviceGetCount, 2000)                \
  X(DeviceGet, 2000)                     \
  X(DeviceGetUuid, 11040)                \
  X(DeviceGetName, 2000)                 \
  X(DeviceTotalMem, 3020)                \
  X(DeviceGetAttribute, 2000)            \
  X(DeviceCanAccessPeer, 4000)           \
  X(DevicePrimaryCtxRetain, 7000)        \
  X(DevicePrimaryCtxRelease, 11000)      \
  X(CtxSetCurrent, 4000)                 \
  X(CtxGetCurrent, 4000)                 \
  X(CtxPushCurrent, 4000)                \
  X(CtxPopCurrent, 4000)                 \
  X(MemGetInfo, 3020)                    \
  X(MemGetAllocationGranularity, 10020)  \
  X(MemCreate, 10020)                    \
  X(MemRelease, 10020)                   \
  X(MemExportToShareableHandle, 10020)   \
  X(MemImportFromShareableHandle, 10020) \
  X(MemAddressReserve, 10020)            \
  X(MemAddressFree, 10020)               \
  X(MemMap, 10020)                       \
  X(MemUnmap, 10020)                     \
  X(MemSetAccess, 10020)                 \
  X(MemAlloc, 3020)                      \
  X(MemFree, 3020)                       \
  X(IpcGetMemHandle, 4010)               \
  X(IpcOpenMemHandle, 11000)             \
  X(IpcCloseMemHandle, 4010)             \
  X(MemHostRegister, 6050)               \
  X(PointerGetAttribute, 4000)           \
  X(MemHostUnregister, 4000)             \
  X(MemHostAlloc, 2020)                  \
  X(MemFreeHost, 2000)                   \
  X(StreamCreate, 2000)                  \
  X(StreamDestroy, 4000)                 \
  X(StreamSynchronize, 2000)             \
  X(StreamGetCtx, 9020)                  \
  X(MemcpyHtoDAsync, 3020)               \
  X(MemcpyDtoHAsync, 3020)               \
  X(MemcpyDtoDAsync, 3020)               \
  X(MemcpyPeerAsync, 4000)

// The loaded driver: a table of function pointers, immutable once loaded, so any thread may
// call through it. Members are named as the driver's functions without "cu" (cuMemCreate is
// MemCreate); the unprefixed names keep clear of cuda.h's macros, which rename e.g.
// cuMemcpyDtoHAsync to cuMemcpyDtoHAsync_v2.
class CudaDriver {
 public:
  // The driver of this process, loading it on the first successful call: dlopen of the
  // library named by the environment variable DEPOT_CUDA_LIBRARY, or "libcuda.so.1", then
  // cuGetProcAddress_v2 for every function above, then cuInit(0). Thread-safe. A loaded driver
  // stays loaded for the life of the process. A failure is not remembered, so a later call
  // tries again; it returns IoError saying what is missing in words for an operator: no
  // driver on this host, a driver older than CUDA 12.0 (the first with cuGetProcAddress_v2),
  // or cuInit's error (e.g. CUDA_ERROR_NO_DEVICE).
  static Result<const CudaDriver*> Load();

  CudaDriver(const CudaDriver&) = delete;
  CudaDriver& operator=(const CudaDriver&) = delete;

  // OK for CUDA_SUCCESS; otherwise "<call>: <error name> (<error string>)", e.g.
  // "cuMemCreate: CUDA_ERROR_OUT_OF_MEMORY (out of memory)", as OutOfMemory for
  // CUDA_ERROR_OUT_OF_MEMORY and IoError for every other error.
  Status Check(CUresult result, const char* call) const;

  // Reserves exactly `size` bytes of address space, maps the allocation `handle` there and
  // lets each of `devices` read and write it. Undoes what it did on failure. Needs a current
  // context. The caller still owns `handle` (the mapping keeps the memory alive after
  // cuMemRelease).
  Result<CUdeviceptr> MapWithAccess(CUmemGenericAllocationHandle handle, uint64_t size,
                                    std::span<const CUdevice> devices) const;

  // The driver's CUDA version as cuDriverGetVersion reports it, e.g. 12080 for 12.8.
  int version() const { return version_; }
  // The library that was loaded, e.g. "libcuda.so.1".
  const std::string& library() const { return library_; }

#define DEPOT_CUDA_DRIVER_DECLARE(name, abi) PFN_cu##name##_v##abi name = nullptr;
  DEPOT_CUDA_DRIVER_FUNCTIONS(DEPOT_CUDA_DRIVER_DECLARE)
#undef DEPOT_CUDA_DRIVER_DECLARE

 private:
  CudaDriver() = default;
  Status Open();

  std::string library_;
  int version_ = 0;
};

// "12.8" for 12080.
std::string FormatCudaVersion(int version);

// A device's primary context (the CUDA runtime's, which CuPy and PyTorch use), retained for
// as long as this object lives: whatever was mapped in it stays valid while someone holds it.
class CudaPrimaryContext {
 public:
  static Result<std::shared_ptr<CudaPrimaryContext>> Retain(const CudaDriver& driver,
                                                            CUdevice device);
  CudaPrimaryContext(const CudaPrimaryContext&) = delete;
  CudaPrimaryContext& operator=(const CudaPrimaryContext&) = delete;
  ~CudaPrimaryContext() { driver_.DevicePrimaryCtxRelease(device_); }

  CUcontext get() const { return context_; }

 private:
  CudaPrimaryContext(const CudaDriver& driver, CUdevice device, CUcontext context)
      : driver_(driver), device_(device), context_(context) {}
  const CudaDriver& driver_;
  const CUdevice device_;
  const CUcontext context_;
};

// Makes a context current in this thread for its own lifetime, then restores the one that
// was current before: the caller's thread is left as it was found.
class CudaContextScope {
 public:
  static Result<CudaContextScope> Enter(const CudaDriver& driver, CUcontext context);
  CudaContextScope(CudaContextScope&& o) noexcept : driver_(o.driver_) { o.driver_ = nullptr; }
  CudaContextScope& operator=(CudaContextScope&&) = delete;
  ~CudaContextScope() {
    CUcontext popped = nullptr;
    if (driver_ != nullptr) driver_->CtxPopCurrent(&popped);
  }

 private:
  explicit CudaContextScope(const CudaDriver& driver) : driver_(&driver) {}
  const CudaDriver* driver_;
};

}  // namespace depot::ipc
