// The CUDA importer: maps the daemon's GPU chunks into this process with the driver API,
// loaded at run time.
//
// The importer runs inside the user's program, next to whatever CUDA code it runs itself
// (often through the CUDA runtime), so it leaves that code's state alone: it works in each
// device's primary context (the runtime's), and it makes that context current only for the
// length of its own calls, restoring whatever was current before.
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "depot/ipc/cuda_driver.h"
#include "depot/ipc/undo.h"
#include "depot/ipc/units.h"
#include "device_import.h"

namespace depot::internal {

namespace {

using ipc::CudaDriver;

// Each device's primary context is retained while the importer or any chunk imported on the
// device lives: releasing the last reference would destroy the context and every mapping in
// it.
using PrimaryContext = ipc::CudaPrimaryContext;
using ContextScope = ipc::CudaContextScope;

// A chunk mapped into this process in a device's primary context: how it was mapped decides
// how it is undone (Release), in that context.
class ChunkInContext : public ImportedChunk {
 public:
  ChunkInContext(const CudaDriver& driver, std::shared_ptr<PrimaryContext> context,
                 CUdeviceptr address, uint64_t size)
      : driver_(driver), context_(std::move(context)), address_(address), size_(size) {}
  uint64_t address() const override { return address_; }
  uint64_t size() const override { return size_; }

 protected:
  // For the destructors: undoes the mapping with the chunk's context current. Errors cannot
  // be reported from there; at process exit the driver may already be shut down
  // (CUDA_ERROR_DEINITIALIZED), which frees everything anyway.
  template <typename Undo>
  void Release(Undo undo) {
    auto scope = ContextScope::Enter(driver_, context_->get());
    undo(driver_, address_, size_);
  }

 private:
  const CudaDriver& driver_;
  const std::shared_ptr<PrimaryContext> context_;
  const CUdeviceptr address_;
  const uint64_t size_;
};

// A cuMemCreate chunk imported from its file descriptor and mapped at an address range of
// exactly its size. The mapping alone keeps the memory alive (the import handle is released
// once mapped), so unmapping is all there is to undo.
class MappedChunk final : public ChunkInContext {
 public:
  using ChunkInContext::ChunkInContext;
  ~MappedChunk() override {
    Release([](const CudaDriver& driver, CUdeviceptr address, uint64_t size) {
      driver.MemUnmap(address, size);
      driver.MemAddressFree(address, size);
    });
  }
};

// A cuMemAlloc chunk opened from its legacy IPC handle.
class OpenedIpcChunk final : public ChunkInContext {
 public:
  using ChunkInContext::ChunkInContext;
  ~OpenedIpcChunk() override {
    Release([](const CudaDriver& driver, CUdeviceptr address, uint64_t) {
      driver.IpcCloseMemHandle(address);
    });
  }
};

class CudaImporter final : public DeviceImporter {
 public:
  CudaImporter(const CudaDriver& driver, std::vector<CUdevice> devices,
               std::vector<ipc::DeviceUuid> uuids)
      : driver_(driver),
        devices_(std::move(devices)),
        uuids_(std::move(uuids)),
        contexts_(devices_.size()) {}

  std::vector<ipc::DeviceUuid> VisibleDevices() const override { return uuids_; }

  Result<std::unique_ptr<ImportedChunk>> Import(ChunkToImport chunk) override {
    const std::string where = "importing a GPU chunk of " + ipc::FormatSize(chunk.size) + " on " +
                              ipc::FormatUuid(chunk.device);
    if (chunk.handle != ipc::ChunkHandle::kPosixFd &&
        chunk.handle != ipc::ChunkHandle::kLegacyIpc) {
      return Status::InvalidArgument(where +
                                     ": it is a simulated device's memory, which the CUDA "
                                     "importer cannot map");
    }
    size_t index = 0;
    while (index < uuids_.size() && uuids_[index] != chunk.device) ++index;
    if (index == uuids_.size()) {
      std::string message = where + ": this process cannot see that GPU";
      if (const char* visible = std::getenv("CUDA_VISIBLE_DEVICES")) {
        message += std::string(" (CUDA_VISIBLE_DEVICES=") + visible + ")";
      }
      return Status::InvalidArgument(std::move(message));
    }
    DEPOT_ASSIGN_OR_RETURN(std::shared_ptr<PrimaryContext> context, Context(index));
    DEPOT_ASSIGN_OR_RETURN(ContextScope scope, ContextScope::Enter(driver_, context->get()));
    auto imported = chunk.handle == ipc::ChunkHandle::kPosixFd
                        ? Map(devices_[index], std::move(context), chunk)
                        : OpenIpc(std::move(context), chunk);
    if (imported.ok()) return imported;
    const Status st = imported.status();
    return Status(st.code(), where + ": " + st.message());
  }

  Status SynchronizeStream(uintptr_t stream) override {
    auto handle = reinterpret_cast<CUstream>(stream);
    CUcontext current = nullptr;
    DEPOT_RETURN_NOT_OK(driver_.Check(driver_.CtxGetCurrent(&current), "cuCtxGetCurrent"));
    if (current != nullptr) {
      // The legacy default stream of, and any stream made in, the current context.
      return driver_.Check(driver_.StreamSynchronize(handle), "cuStreamSynchronize");
    }
    // A stream of its own knows its context; the special handles (0, CU_STREAM_LEGACY,
    // CU_STREAM_PER_THREAD) mean a stream of the current context, and there is none.
    if (handle == nullptr || handle == CU_STREAM_LEGACY || handle == CU_STREAM_PER_THREAD) {
      return Status::InvalidArgument(
          "cannot wait for the default stream: no CUDA context is current in this thread, so "
          "it has queued no work on one; pass the stream the data was written on");
    }
    CUcontext owner = nullptr;
    DEPOT_RETURN_NOT_OK(driver_.Check(driver_.StreamGetCtx(handle, &owner), "cuStreamGetCtx"));
    DEPOT_ASSIGN_OR_RETURN(ContextScope scope, ContextScope::Enter(driver_, owner));
    return driver_.Check(driver_.StreamSynchronize(handle), "cuStreamSynchronize");
  }

 private:
  // The primary context of device `index`, retained on first use: retaining creates the
  // context if no one in the process has yet, which takes a while and memory on the device,
  // so only devices this process imports chunks from get one.
  Result<std::shared_ptr<PrimaryContext>> Context(size_t index) {
    std::lock_guard lock(mutex_);
    if (!contexts_[index]) {
      DEPOT_ASSIGN_OR_RETURN(contexts_[index], PrimaryContext::Retain(driver_, devices_[index]));
    }
    return contexts_[index];
  }

  // With the device's context current.
  Result<std::unique_ptr<ImportedChunk>> Map(CUdevice device,
                                             std::shared_ptr<PrimaryContext> context,
                                             const ChunkToImport& chunk) {
    const CudaDriver& d = driver_;
    if (!chunk.fd) return Status::InvalidArgument("the chunk came without its file descriptor");
    CUmemGenericAllocationHandle handle = 0;
    // A POSIX descriptor is passed by value, as the pointer-sized handle itself. The driver
    // does not take it over: the caller's UniqueFd closes it afterwards.
    void* os_handle = reinterpret_cast<void*>(static_cast<uintptr_t>(chunk.fd.get()));
    DEPOT_RETURN_NOT_OK(d.Check(d.MemImportFromShareableHandle(
                                    &handle, os_handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
                                "cuMemImportFromShareableHandle"));
    // Released on every path: once mapped, the mapping holds the memory.
    ipc::Undo release([&] { d.MemRelease(handle); });

    DEPOT_ASSIGN_OR_RETURN(const CUdeviceptr ptr,
                           d.MapWithAccess(handle, chunk.size, std::span(&device, 1)));
    return std::unique_ptr<ImportedChunk>(new MappedChunk(d, std::move(context), ptr, chunk.size));
  }

  // With the device's context current.
  Result<std::unique_ptr<ImportedChunk>> OpenIpc(std::shared_ptr<PrimaryContext> context,
                                                 const ChunkToImport& chunk) {
    CUipcMemHandle handle{};
    if (chunk.ipc_handle.size() != sizeof(handle.reserved)) {
      return Status::InvalidArgument("a legacy IPC handle has " +
                                     std::to_string(sizeof(handle.reserved)) + " bytes, not " +
                                     std::to_string(chunk.ipc_handle.size()));
    }
    std::memcpy(handle.reserved, chunk.ipc_handle.data(), sizeof(handle.reserved));
    CUdeviceptr ptr = 0;
    // LAZY_ENABLE_PEER_ACCESS is the one flag there is, and required.
    DEPOT_RETURN_NOT_OK(
        driver_.Check(driver_.IpcOpenMemHandle(&ptr, handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
                      "cuIpcOpenMemHandle"));
    return std::unique_ptr<ImportedChunk>(
        new OpenedIpcChunk(driver_, std::move(context), ptr, chunk.size));
  }

  const CudaDriver& driver_;
  const std::vector<CUdevice> devices_;  // by this process's ordinal
  const std::vector<ipc::DeviceUuid> uuids_;
  std::mutex mutex_;
  std::vector<std::shared_ptr<PrimaryContext>> contexts_;  // by ordinal; null until used
};

}  // namespace

Result<std::unique_ptr<DeviceImporter>> LoadCudaImporter() {
  DEPOT_ASSIGN_OR_RETURN(const CudaDriver* driver, CudaDriver::Load());
  const CudaDriver& d = *driver;
  int count = 0;
  DEPOT_RETURN_NOT_OK(d.Check(d.DeviceGetCount(&count), "cuDeviceGetCount"));
  std::vector<CUdevice> devices(count);
  std::vector<ipc::DeviceUuid> uuids(count);
  for (int ordinal = 0; ordinal < count; ++ordinal) {
    DEPOT_RETURN_NOT_OK(d.Check(d.DeviceGet(&devices[ordinal], ordinal), "cuDeviceGet"));
    CUuuid uuid{};
    DEPOT_RETURN_NOT_OK(d.Check(d.DeviceGetUuid(&uuid, devices[ordinal]), "cuDeviceGetUuid"));
    static_assert(sizeof(uuid.bytes) == std::tuple_size_v<ipc::DeviceUuid>);
    std::memcpy(uuids[ordinal].data(), uuid.bytes, sizeof(uuid.bytes));
  }
  return std::unique_ptr<DeviceImporter>(new CudaImporter(d, std::move(devices), std::move(uuids)));
}

}  // namespace depot::internal
