#include "depot/ipc/cuda_driver.h"

#include "depot/ipc/undo.h"

#include <dlfcn.h>

#include <cstdlib>
#include <memory>
#include <mutex>
#include <vector>

namespace depot::ipc {

namespace {

constexpr const char* kDefaultLibrary = "libcuda.so.1";
// cuGetProcAddress_v2 (CUDA 12.0) is the entry point through which everything else is
// fetched. The older cuGetProcAddress (11.3) would serve drivers 11.3 to 11.8 too, but those
// are long out of support, and one entry point is one code path to get right.
constexpr int kMinimumDriver = 12000;

}  // namespace

std::string FormatCudaVersion(int version) {
  return std::to_string(version / 1000) + "." + std::to_string(version % 1000 / 10);
}

Result<const CudaDriver*> CudaDriver::Load() {
  // Function-local statics: initialised on first use, whichever thread and translation unit
  // gets here first, so Load() is safe even during other objects' static initialisation.
  static std::mutex mutex;
  static const CudaDriver* loaded = nullptr;  // never freed: see below
  std::lock_guard lock(mutex);
  if (loaded != nullptr) return loaded;
  std::unique_ptr<CudaDriver> driver(new CudaDriver);
  DEPOT_RETURN_NOT_OK(driver->Open());
  // Never unloaded: the driver keeps threads and handlers of its own after cuInit, and
  // destructors that run at exit (chunks still mapped, contexts still retained) may call it.
  loaded = driver.release();
  return loaded;
}

Status CudaDriver::Open() {
  const char* configured = std::getenv("DEPOT_CUDA_LIBRARY");
  const bool from_env = configured != nullptr && configured[0] != '\0';
  library_ = from_env ? configured : kDefaultLibrary;

  // RTLD_LOCAL: the driver's symbols stay out of the global namespace, so they cannot
  // interpose on (or be confused with) a libcuda another part of the process loads itself;
  // dlopen of the same file returns the same handle anyway.
  void* handle = ::dlopen(library_.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* error = ::dlerror();
    std::string message =
        "cannot load the CUDA driver (" + std::string(error ? error : library_.c_str()) + "): ";
    message +=
        from_env ? "check DEPOT_CUDA_LIBRARY, which names it" : "this host has no NVIDIA driver";
    return Status::IoError(std::move(message));
  }
  // Until cuInit has run, the library can be unloaded again on failure.
  bool initialised = false;
  struct CloseUnlessInitialised {
    void* handle;
    const bool& initialised;
    ~CloseUnlessInitialised() {
      if (!initialised) ::dlclose(handle);
    }
  } closer{handle, initialised};

  // cuDriverGetVersion has had one ABI since CUDA 2.2, so it is safe to call by name, and
  // it tells a driver too old for cuGetProcAddress_v2 from a library that is no driver.
  auto get_version =
      reinterpret_cast<PFN_cuDriverGetVersion_v2020>(::dlsym(handle, "cuDriverGetVersion"));
  if (get_version == nullptr || get_version(&version_) != CUDA_SUCCESS) {
    return Status::IoError(library_ + " is not a CUDA driver: it has no cuDriverGetVersion");
  }
  auto get_proc_address =
      reinterpret_cast<PFN_cuGetProcAddress_v12000>(::dlsym(handle, "cuGetProcAddress_v2"));
  if (get_proc_address == nullptr) {
    return Status::IoError("the NVIDIA driver supports CUDA " + FormatCudaVersion(version_) +
                           ", older than the " + FormatCudaVersion(kMinimumDriver) +
                           " that depot needs (" + library_ +
                           " has no cuGetProcAddress_v2): update the driver");
  }

  // LEGACY_STREAM: the functions whose handle 0 means the legacy default stream, not their
  // per-thread-default-stream (_ptsz) variants. depot passes explicit streams anyway.
  auto fetch = [&](const char* symbol, int abi, void** out) -> Status {
    CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    const CUresult r =
        get_proc_address(symbol, out, abi, CU_GET_PROC_ADDRESS_LEGACY_STREAM, &found);
    if (r == CUDA_SUCCESS && found == CU_GET_PROC_ADDRESS_SUCCESS && *out != nullptr) {
      return Status::OK();
    }
    return Status::IoError("the CUDA driver " + library_ + " (CUDA " + FormatCudaVersion(version_) +
                           ") has no " + symbol + " with the ABI of CUDA " +
                           FormatCudaVersion(abi) + ": update the NVIDIA driver");
  };
#define DEPOT_CUDA_DRIVER_FETCH(name, abi)             \
  {                                                    \
    void* p = nullptr;                                 \
    DEPOT_RETURN_NOT_OK(fetch("cu" #name, abi, &p));   \
    name = reinterpret_cast<PFN_cu##name##_v##abi>(p); \
  }
  DEPOT_CUDA_DRIVER_FUNCTIONS(DEPOT_CUDA_DRIVER_FETCH)
#undef DEPOT_CUDA_DRIVER_FETCH

  initialised = true;  // from here on the driver may hold state: never unload it
  const CUresult r = Init(0);
  if (r == CUDA_SUCCESS) return Status::OK();
  Status st = Check(r, "cuInit");
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  if (r != CUDA_ERROR_NO_DEVICE || visible == nullptr) return st;
  // The usual reason a driver sees no device on a host that has some.
  return Status(st.code(), st.message() + " (CUDA_VISIBLE_DEVICES=" + visible + ")");
}

Result<CUdeviceptr> CudaDriver::MapWithAccess(CUmemGenericAllocationHandle handle, uint64_t size,
                                              std::span<const CUdevice> devices) const {
  CUdeviceptr ptr = 0;
  DEPOT_RETURN_NOT_OK(Check(MemAddressReserve(&ptr, size, 0, 0, 0), "cuMemAddressReserve"));
  Undo free_address([&] { MemAddressFree(ptr, size); });
  DEPOT_RETURN_NOT_OK(Check(MemMap(ptr, size, 0, handle, 0), "cuMemMap"));
  Undo unmap([&] { MemUnmap(ptr, size); });
  std::vector<CUmemAccessDesc> access(devices.size());
  for (size_t i = 0; i < devices.size(); ++i) {
    access[i].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access[i].location.id = devices[i];
    access[i].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  }
  DEPOT_RETURN_NOT_OK(
      Check(MemSetAccess(ptr, size, access.data(), access.size()), "cuMemSetAccess"));
  unmap.Cancel();
  free_address.Cancel();
  return ptr;
}

Status CudaDriver::Check(CUresult result, const char* call) const {
  if (result == CUDA_SUCCESS) return Status::OK();
  const char* name = nullptr;
  const char* description = nullptr;
  if (GetErrorName == nullptr || GetErrorName(result, &name) != CUDA_SUCCESS) name = nullptr;
  if (GetErrorString == nullptr || GetErrorString(result, &description) != CUDA_SUCCESS) {
    description = nullptr;
  }
  std::string message = std::string(call) + ": ";
  message += name ? std::string(name) : "CUDA error " + std::to_string(static_cast<int>(result));
  if (description != nullptr) message += std::string(" (") + description + ")";
  if (result == CUDA_ERROR_OUT_OF_MEMORY) return Status::OutOfMemory(std::move(message));
  return Status::IoError(std::move(message));
}

Result<std::shared_ptr<CudaPrimaryContext>> CudaPrimaryContext::Retain(const CudaDriver& driver,
                                                                       CUdevice device) {
  CUcontext context = nullptr;
  DEPOT_RETURN_NOT_OK(
      driver.Check(driver.DevicePrimaryCtxRetain(&context, device), "cuDevicePrimaryCtxRetain"));
  return std::shared_ptr<CudaPrimaryContext>(new CudaPrimaryContext(driver, device, context));
}

Result<CudaContextScope> CudaContextScope::Enter(const CudaDriver& driver, CUcontext context) {
  DEPOT_RETURN_NOT_OK(driver.Check(driver.CtxPushCurrent(context), "cuCtxPushCurrent"));
  return CudaContextScope(driver);
}

}  // namespace depot::ipc
