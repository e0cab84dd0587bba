// The CUDA device backend: GPU chunks through the driver API, loaded at run time.
//
// A device that supports the virtual memory management API and POSIX file descriptor export
// gets its chunks from cuMemCreate, exported once as a file descriptor; any other device that
// supports legacy CUDA IPC gets them from cuMemAlloc, exported as a cuIpcGetMemHandle handle.
// The daemon reaches every chunk through its own mapping, in the device's primary context.
#include <fcntl.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <utility>
#include <vector>

#include "depot/ipc/cuda_driver.h"
#include "depot/ipc/undo.h"
#include "depot/ipc/units.h"
#include "store/gpu/device_backend.h"

namespace depot::store::gpu {

namespace {

using ipc::CudaDriver;

// CopyBetweenDevices, between devices that cannot reach each other's memory, stages the bytes
// through pinned host memory in pieces of this size, two at a time: while one piece goes up
// to the destination, the next comes down from the source.
constexpr uint64_t kStagingPiece = 8 << 20;
// Chunk sizes for cuMemAlloc devices, which have no allocation granularity to ask for:
// cuMemAlloc hands out whole 2 MiB pages of device memory.
constexpr uint64_t kLegacyGranularity = 2 << 20;

// The same status with `context` in front of its message.
Status Prefixed(const std::string& context, const Status& st) {
  if (st.ok()) return st;
  return Status(st.code(), context + ": " + st.message());
}

// The properties of every cuMemCreate chunk on `device`: device memory that can be exported
// as a POSIX file descriptor. Granularity is asked for with the same properties.
CUmemAllocationProp ChunkProperties(CUdevice device) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  return prop;
}

// Streams of one device for the copies of the daemon's worker threads. Each copy takes a
// stream of its own, so the copies of several threads run at once: the legacy default
// stream would serialise them, and synchronise with every other stream of the context.
// The streams are non-blocking for the same reason. A stream goes back to the pool when its
// copy is complete, so the pool holds as many streams as copies were ever in flight at once
// on the device. The pool (not a thread_local cache) owns them, so they are destroyed with
// the backend, in their context, and a worker thread that exits leaks nothing.
class StreamPool {
 public:
  // A stream of the current context (the device's): call with that context current.
  Result<CUstream> Acquire(const CudaDriver& driver) {
    {
      std::lock_guard lock(mutex_);
      if (!idle_.empty()) {
        CUstream stream = idle_.back();
        idle_.pop_back();
        return stream;
      }
    }
    CUstream stream = nullptr;
    DEPOT_RETURN_NOT_OK(
        driver.Check(driver.StreamCreate(&stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate"));
    return stream;
  }
  void Release(CUstream stream) {
    std::lock_guard lock(mutex_);
    idle_.push_back(stream);
  }
  // With the device's context current, and no copy in flight.
  void DestroyAll(const CudaDriver& driver) {
    std::lock_guard lock(mutex_);
    for (CUstream stream : idle_) driver.StreamDestroy(stream);
    idle_.clear();
  }

 private:
  std::mutex mutex_;
  std::vector<CUstream> idle_;
};

// One device the backend serves.
struct Device {
  Device(const CudaDriver& d, CUdevice dev, CUcontext ctx) : driver(d), device(dev), context(ctx) {}
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;
  ~Device() {
    driver.CtxSetCurrent(context);
    streams.DestroyAll(driver);
    // Nothing of this thread refers to the context once it may be gone.
    driver.CtxSetCurrent(nullptr);
    driver.DevicePrimaryCtxRelease(device);
  }

  const CudaDriver& driver;
  const CUdevice device;
  // The device's primary context, retained for the backend's lifetime. The primary context
  // (not one of our own) is the one the CUDA runtime and most libraries use, so the daemon
  // shares it with any of them that run in its process instead of adding a second one.
  const CUcontext context;
  // Chunks from cuMemCreate, exported as POSIX file descriptors; otherwise from cuMemAlloc,
  // exported as legacy IPC handles.
  bool vmm = false;
  uint64_t granularity = 0;
  // reaches[k]: this device can read and write device k's memory directly (peer access).
  std::vector<bool> reaches;
  // The devices whose access is set on every chunk of this one besides itself: the VMM
  // devices that reach it. Direct copies from and to them then need no staging.
  std::vector<CUdevice> readers;
  StreamPool streams;
};

// A stream taken from a device's pool for one copy, returned on destruction.
class StreamLease {
 public:
  static Result<StreamLease> Take(Device& device) {
    DEPOT_ASSIGN_OR_RETURN(CUstream stream, device.streams.Acquire(device.driver));
    return StreamLease(device.streams, stream);
  }
  StreamLease(StreamLease&& o) noexcept
      : pool_(o.pool_), stream_(std::exchange(o.stream_, nullptr)) {}
  StreamLease& operator=(StreamLease&&) = delete;
  ~StreamLease() {
    if (stream_ != nullptr) pool_.Release(stream_);
  }
  CUstream get() const { return stream_; }

 private:
  StreamLease(StreamPool& pool, CUstream stream) : pool_(pool), stream_(stream) {}
  StreamPool& pool_;
  CUstream stream_;
};

Result<int> Attribute(const CudaDriver& d, CUdevice device, CUdevice_attribute attribute,
                      const char* name) {
  int value = 0;
  DEPOT_RETURN_NOT_OK(Prefixed(
      name, d.Check(d.DeviceGetAttribute(&value, attribute, device), "cuDeviceGetAttribute")));
  return value;
}

// Opens CUDA device `ordinal`: its identity, its primary context, and how its chunks are
// made. Fails, with the reason, for a device that can share memory neither way.
Result<std::unique_ptr<Device>> OpenDevice(const CudaDriver& d, int ordinal, DeviceInfo* info) {
  CUdevice device = 0;
  DEPOT_RETURN_NOT_OK(d.Check(d.DeviceGet(&device, ordinal), "cuDeviceGet"));
  char name[256] = {};
  DEPOT_RETURN_NOT_OK(d.Check(d.DeviceGetName(name, sizeof(name) - 1, device), "cuDeviceGetName"));
  info->name = name;
  CUuuid uuid{};
  DEPOT_RETURN_NOT_OK(d.Check(d.DeviceGetUuid(&uuid, device), "cuDeviceGetUuid"));
  static_assert(sizeof(uuid.bytes) == std::tuple_size_v<ipc::DeviceUuid>);
  std::memcpy(info->uuid.data(), uuid.bytes, info->uuid.size());
  size_t total = 0;
  DEPOT_RETURN_NOT_OK(d.Check(d.DeviceTotalMem(&total, device), "cuDeviceTotalMem"));
  info->total_bytes = total;
  info->simulated = false;

  DEPOT_ASSIGN_OR_RETURN(
      int vmm, Attribute(d, device, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                         "virtual memory management"));
  DEPOT_ASSIGN_OR_RETURN(
      int posix_fd,
      Attribute(d, device, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
                "POSIX file descriptor export"));
  // Legacy IPC needs unified addressing; drivers that know the attribute also say whether
  // the device supports IPC at all (older ones fail the query: then unified addressing is
  // the whole test, as their documentation says).
  DEPOT_ASSIGN_OR_RETURN(int legacy, Attribute(d, device, CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING,
                                               "unified addressing"));
  if (auto ipc = Attribute(d, device, CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED, "IPC"); ipc.ok()) {
    legacy = legacy && *ipc;
  }
  if (!(vmm && posix_fd) && !legacy) {
    return Status::InvalidArgument(
        "it supports neither cuMemCreate memory exported as file descriptors nor legacy CUDA "
        "IPC, so no other process could map its memory");
  }

  CUcontext context = nullptr;
  DEPOT_RETURN_NOT_OK(
      d.Check(d.DevicePrimaryCtxRetain(&context, device), "cuDevicePrimaryCtxRetain"));
  auto opened = std::make_unique<Device>(d, device, context);
  DEPOT_RETURN_NOT_OK(d.Check(d.CtxSetCurrent(context), "cuCtxSetCurrent"));
  opened->vmm = vmm && posix_fd;
  if (opened->vmm) {
    const CUmemAllocationProp prop = ChunkProperties(device);
    size_t granularity = 0;
    DEPOT_RETURN_NOT_OK(d.Check(
        d.MemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
        "cuMemGetAllocationGranularity"));
    opened->granularity = granularity;
  } else {
    opened->granularity = kLegacyGranularity;
  }
  info->granularity = opened->granularity;
  return opened;
}

class CudaBackend final : public DeviceBackend {
 public:
  // `driver` is null, and there are no devices, when the driver could not be loaded.
  CudaBackend(const CudaDriver* driver, std::vector<DeviceInfo> infos,
              std::vector<std::unique_ptr<Device>> devices)
      : driver_(driver), infos_(std::move(infos)), devices_(std::move(devices)) {}

  ~CudaBackend() override {
    if (devices_.empty()) return;
    // Chunks are the pools' to free before this; the staging buffers are ours.
    driver_->CtxSetCurrent(devices_[0]->context);
    for (void* buffer : idle_staging_) driver_->MemFreeHost(buffer);
    // Each device then destroys its streams and releases its primary context.
  }

  std::string_view kind() const override { return "cuda"; }
  std::span<const DeviceInfo> devices() const override { return infos_; }

  Result<Chunk> AllocateChunk(uint32_t device, uint64_t size) override {
    DEPOT_ASSIGN_OR_RETURN(Device * dev, Enter(device));
    if (size == 0 || size % dev->granularity != 0) {
      return Status::InvalidArgument(Describe(device) + ": a chunk of " + std::to_string(size) +
                                     " bytes is not a multiple of the device's granularity (" +
                                     std::to_string(dev->granularity) + " bytes)");
    }
    Result<Chunk> chunk = dev->vmm ? AllocateExportable(*dev, size) : AllocateLegacy(size);
    if (chunk.ok()) return chunk;
    std::string context =
        Describe(device) + ": cannot allocate a chunk of " + ipc::FormatSize(size);
    size_t free = 0;
    size_t total = 0;
    if (chunk.status().Is(StatusCode::kOutOfMemory) &&
        driver_->MemGetInfo(&free, &total) == CUDA_SUCCESS) {
      context += " (" + ipc::FormatSize(free) + " of " + ipc::FormatSize(total) + " free)";
    }
    return Prefixed(context, chunk.status());
  }

  void FreeChunk(uint32_t device, Chunk& chunk) override {
    auto dev = Enter(device);
    if (!dev.ok()) {
      spdlog::error("cuda: cannot free a chunk of {}: {}", Describe(device),
                    dev.status().ToString());
      return;
    }
    const CudaDriver& d = *driver_;
    // Errors here would leave device memory behind, but there is nothing to retry: log
    // them and go on undoing the rest.
    auto check = [&](CUresult r, const char* call) {
      Status st = d.Check(r, call);
      if (!st.ok()) spdlog::warn("cuda: freeing a chunk of {}: {}", Describe(device), st.message());
    };
    const auto ptr = static_cast<CUdeviceptr>(chunk.address);
    if (chunk.handle == ipc::ChunkHandle::kPosixFd) {
      check(d.MemUnmap(ptr, chunk.size), "cuMemUnmap");
      check(d.MemAddressFree(ptr, chunk.size), "cuMemAddressFree");
      // The memory itself goes when the last client that imported it unmaps it too.
      check(d.MemRelease(chunk.backend_handle), "cuMemRelease");
    } else if (chunk.handle == ipc::ChunkHandle::kLegacyIpc) {
      check(d.MemFree(ptr), "cuMemFree");
    }
    chunk.fd.reset();
    chunk.ipc_handle.clear();
    chunk.address = 0;
    chunk.backend_handle = 0;
    chunk.size = 0;
  }

  Status CopyToHost(uint32_t device, uint64_t source, void* destination, uint64_t bytes) override {
    if (bytes == 0) return Status::OK();
    DEPOT_ASSIGN_OR_RETURN(Device * dev, Enter(device));
    DEPOT_ASSIGN_OR_RETURN(StreamLease stream, StreamLease::Take(*dev));
    return Prefixed(Describe(device) + ": copying " + ipc::FormatSize(bytes) + " to host memory",
                    Run(stream, driver_->MemcpyDtoHAsync(destination, source, bytes, stream.get()),
                        "cuMemcpyDtoHAsync"));
  }

  Status CopyFromHost(uint32_t device, const void* source, uint64_t destination,
                      uint64_t bytes) override {
    if (bytes == 0) return Status::OK();
    DEPOT_ASSIGN_OR_RETURN(Device * dev, Enter(device));
    DEPOT_ASSIGN_OR_RETURN(StreamLease stream, StreamLease::Take(*dev));
    return Prefixed(Describe(device) + ": copying " + ipc::FormatSize(bytes) + " from host memory",
                    Run(stream, driver_->MemcpyHtoDAsync(destination, source, bytes, stream.get()),
                        "cuMemcpyHtoDAsync"));
  }

  Status CopyBetweenDevices(uint32_t source_device, uint64_t source, uint32_t destination_device,
                            uint64_t destination, uint64_t bytes) override {
    if (bytes == 0) return Status::OK();
    const std::string context = "copying " + ipc::FormatSize(bytes) + " from " +
                                Describe(source_device) + " to " + Describe(destination_device);
    if (destination_device >= devices_.size()) {
      return Status::InvalidArgument(context + ": no such device");
    }
    DEPOT_ASSIGN_OR_RETURN(Device * from, Enter(source_device));
    Device& to = *devices_[destination_device];
    if (from == &to) {
      DEPOT_ASSIGN_OR_RETURN(StreamLease stream, StreamLease::Take(to));
      return Prefixed(
          context, Run(stream, driver_->MemcpyDtoDAsync(destination, source, bytes, stream.get()),
                       "cuMemcpyDtoDAsync"));
    }
    const bool push = from->reaches[destination_device];
    const bool pull = to.reaches[source_device];
    if (from->vmm && to.vmm && (push || pull)) {
      // Each chunk is mapped with access for the devices that reach it, so the device that
      // reaches the other's memory copies directly, between the two mappings.
      Device& copier = push ? *from : to;
      if (!push) DEPOT_RETURN_NOT_OK(Prefixed(context, MakeCurrent(to)));
      DEPOT_ASSIGN_OR_RETURN(StreamLease stream, StreamLease::Take(copier));
      return Prefixed(
          context, Run(stream, driver_->MemcpyDtoDAsync(destination, source, bytes, stream.get()),
                       "cuMemcpyDtoDAsync"));
    }
    if (!from->vmm && !to.vmm && (push || pull)) {
      // cuMemAlloc memory: the driver copies peer to peer between the two contexts.
      DEPOT_ASSIGN_OR_RETURN(StreamLease stream, StreamLease::Take(*from));
      return Prefixed(context, Run(stream,
                                   driver_->MemcpyPeerAsync(destination, to.context, source,
                                                            from->context, bytes, stream.get()),
                                   "cuMemcpyPeerAsync"));
    }
    return Prefixed(context + " through host memory",
                    CopyThroughHost(*from, source, to, destination, bytes));
  }

  Status RegisterHostMemory(void* base, uint64_t bytes) override {
    // Without devices there is nothing to copy to, so nothing to pin for.
    if (devices_.empty()) return Status::OK();
    DEPOT_RETURN_NOT_OK(MakeCurrent(*devices_[0]));
    // PORTABLE: pinned for every context, so copies to and from any device run at full
    // speed, not only those of the context current here.
    return Prefixed(
        "pinning " + ipc::FormatSize(bytes) + " of host memory for the GPUs",
        driver_->Check(driver_->MemHostRegister(base, bytes, CU_MEMHOSTREGISTER_PORTABLE),
                       "cuMemHostRegister"));
  }

  void UnregisterHostMemory(void* base) override {
    if (devices_.empty()) return;
    Status st = MakeCurrent(*devices_[0]);
    if (st.ok()) st = driver_->Check(driver_->MemHostUnregister(base), "cuMemHostUnregister");
    if (!st.ok()) spdlog::warn("cuda: unpinning host memory: {}", st.message());
  }

 private:
  // "GPU 0 (NVIDIA H100 80GB HBM3)": the CUDA ordinal in the daemon and the device's name.
  std::string Describe(uint32_t device) const {
    if (device >= devices_.size()) return "device " + std::to_string(device);
    return "GPU " + std::to_string(devices_[device]->device) + " (" + infos_[device].name + ")";
  }

  Status MakeCurrent(const Device& device) const {
    return driver_->Check(driver_->CtxSetCurrent(device.context), "cuCtxSetCurrent");
  }

  // The device, with its context made current in this thread. Every call sets it, since
  // the copies run on whichever worker thread is free, and setting it costs next to nothing.
  Result<Device*> Enter(uint32_t device) {
    if (device >= devices_.size()) {
      return Status::InvalidArgument("no GPU " + std::to_string(device) + ": this backend has " +
                                     std::to_string(devices_.size()));
    }
    Device* dev = devices_[device].get();
    DEPOT_RETURN_NOT_OK(MakeCurrent(*dev));
    return dev;
  }

  // Waits for the copy just queued on `stream` (whose enqueueing returned `queued`).
  Status Run(const StreamLease& stream, CUresult queued, const char* call) {
    DEPOT_RETURN_NOT_OK(driver_->Check(queued, call));
    return driver_->Check(driver_->StreamSynchronize(stream.get()), "cuStreamSynchronize");
  }

  // cuMemCreate memory, exported as a file descriptor and mapped, with access for the
  // device and for every device that reaches it. On failure, undoes what was done.
  Result<Chunk> AllocateExportable(Device& dev, uint64_t size) {
    const CudaDriver& d = *driver_;
    const CUmemAllocationProp prop = ChunkProperties(dev.device);
    CUmemGenericAllocationHandle handle = 0;
    DEPOT_RETURN_NOT_OK(d.Check(d.MemCreate(&handle, size, &prop, 0), "cuMemCreate"));
    ipc::Undo release([&] { d.MemRelease(handle); });

    int fd = -1;
    DEPOT_RETURN_NOT_OK(d.Check(
        d.MemExportToShareableHandle(&fd, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
        "cuMemExportToShareableHandle"));
    ipc::UniqueFd exported(fd);
    // The daemon starts other programs (spill helpers, tests' children): they must not
    // inherit descriptors of GPU memory.
    if (::fcntl(exported.get(), F_SETFD, FD_CLOEXEC) != 0) {
      return Status::FromErrno("fcntl(FD_CLOEXEC) on an exported GPU chunk", errno);
    }

    std::vector<CUdevice> access(dev.readers.begin(), dev.readers.end());
    access.push_back(dev.device);
    DEPOT_ASSIGN_OR_RETURN(const CUdeviceptr ptr, d.MapWithAccess(handle, size, access));

    release.Cancel();
    Chunk chunk;
    chunk.size = size;
    chunk.handle = ipc::ChunkHandle::kPosixFd;
    chunk.fd = std::move(exported);
    chunk.address = ptr;
    chunk.backend_handle = handle;
    return chunk;
  }

  // cuMemAlloc memory (on the current context's device) with a legacy IPC handle, for
  // devices that cannot export file descriptors.
  Result<Chunk> AllocateLegacy(uint64_t size) {
    const CudaDriver& d = *driver_;
    CUdeviceptr ptr = 0;
    DEPOT_RETURN_NOT_OK(d.Check(d.MemAlloc(&ptr, size), "cuMemAlloc"));
    ipc::Undo free_memory([&] { d.MemFree(ptr); });
    CUipcMemHandle handle{};
    DEPOT_RETURN_NOT_OK(d.Check(d.IpcGetMemHandle(&handle, ptr), "cuIpcGetMemHandle"));
    free_memory.Cancel();
    Chunk chunk;
    chunk.size = size;
    chunk.handle = ipc::ChunkHandle::kLegacyIpc;
    chunk.ipc_handle.resize(sizeof(handle.reserved));
    std::memcpy(chunk.ipc_handle.data(), handle.reserved, sizeof(handle.reserved));
    chunk.address = ptr;
    return chunk;
  }

  // Copies between two devices that cannot reach each other: down from the source into a
  // pinned staging buffer, up from there to the destination, a piece at a time, with the
  // buffer's two halves in turn so that a piece goes down while the one before goes up.
  Status CopyThroughHost(Device& from, uint64_t source, Device& to, uint64_t destination,
                         uint64_t bytes) {
    const CudaDriver& d = *driver_;
    DEPOT_ASSIGN_OR_RETURN(void* staging, TakeStaging());
    ipc::Undo give_back([&] { ReturnStaging(staging); });
    auto* halves = static_cast<std::byte*>(staging);

    DEPOT_RETURN_NOT_OK(MakeCurrent(from));
    DEPOT_ASSIGN_OR_RETURN(StreamLease down, StreamLease::Take(from));
    DEPOT_RETURN_NOT_OK(MakeCurrent(to));
    // One upload stream per half: waiting for a half's stream waits for exactly the upload
    // that last read that half.
    DEPOT_ASSIGN_OR_RETURN(StreamLease up0, StreamLease::Take(to));
    DEPOT_ASSIGN_OR_RETURN(StreamLease up1, StreamLease::Take(to));
    const StreamLease* up[2] = {&up0, &up1};

    // Whatever happens, no upload may still read the buffer when it goes back to the pool.
    ipc::Undo drain([&] {
      d.StreamSynchronize(up0.get());
      d.StreamSynchronize(up1.get());
    });
    for (uint64_t offset = 0, piece = 0; offset < bytes; offset += kStagingPiece, ++piece) {
      const uint64_t n = std::min(kStagingPiece, bytes - offset);
      const int half = static_cast<int>(piece % 2);
      std::byte* buffer = halves + half * kStagingPiece;
      DEPOT_RETURN_NOT_OK(
          d.Check(d.StreamSynchronize(up[half]->get()), "cuStreamSynchronize (upload)"));
      DEPOT_RETURN_NOT_OK(MakeCurrent(from));
      DEPOT_RETURN_NOT_OK(Run(down, d.MemcpyDtoHAsync(buffer, source + offset, n, down.get()),
                              "cuMemcpyDtoHAsync"));
      DEPOT_RETURN_NOT_OK(MakeCurrent(to));
      DEPOT_RETURN_NOT_OK(
          d.Check(d.MemcpyHtoDAsync(destination + offset, buffer, n, up[half]->get()),
                  "cuMemcpyHtoDAsync"));
    }
    drain.Cancel();
    DEPOT_RETURN_NOT_OK(d.Check(d.StreamSynchronize(up0.get()), "cuStreamSynchronize (upload)"));
    return d.Check(d.StreamSynchronize(up1.get()), "cuStreamSynchronize (upload)");
  }

  // A pinned buffer of two staging pieces, from the pool or newly allocated. Allocating
  // pinned memory takes milliseconds, so buffers are kept for the next copy.
  Result<void*> TakeStaging() {
    {
      std::lock_guard lock(staging_mutex_);
      if (!idle_staging_.empty()) {
        void* buffer = idle_staging_.back();
        idle_staging_.pop_back();
        return buffer;
      }
    }
    void* buffer = nullptr;
    // PORTABLE: pinned for every device's context, not only the one current here.
    DEPOT_RETURN_NOT_OK(
        driver_->Check(driver_->MemHostAlloc(&buffer, 2 * kStagingPiece, CU_MEMHOSTALLOC_PORTABLE),
                       "cuMemHostAlloc"));
    return buffer;
  }
  void ReturnStaging(void* buffer) {
    std::lock_guard lock(staging_mutex_);
    idle_staging_.push_back(buffer);
  }

  const CudaDriver* driver_;
  std::vector<DeviceInfo> infos_;
  std::vector<std::unique_ptr<Device>> devices_;
  std::mutex staging_mutex_;
  std::vector<void*> idle_staging_;
};

}  // namespace

std::unique_ptr<DeviceBackend> LoadCudaBackend(std::string* why) {
  std::string reasons;
  auto note = [&](const std::string& reason) {
    if (!reasons.empty()) reasons += "; ";
    reasons += reason;
  };
  auto finish = [&](const CudaDriver* driver, std::vector<DeviceInfo> infos,
                    std::vector<std::unique_ptr<Device>> devices) {
    if (devices.empty() && reasons.empty()) note("the CUDA driver reports no GPU");
    if (why != nullptr) *why = reasons;
    return std::make_unique<CudaBackend>(driver, std::move(infos), std::move(devices));
  };

  auto loaded = CudaDriver::Load();
  if (!loaded.ok()) {
    note(loaded.status().message());
    return finish(nullptr, {}, {});
  }
  const CudaDriver& d = **loaded;
  int count = 0;
  if (Status st = d.Check(d.DeviceGetCount(&count), "cuDeviceGetCount"); !st.ok()) {
    note(st.message());
    return finish(nullptr, {}, {});
  }

  std::vector<DeviceInfo> infos;
  std::vector<std::unique_ptr<Device>> devices;
  for (int ordinal = 0; ordinal < count; ++ordinal) {
    DeviceInfo info;
    auto device = OpenDevice(d, ordinal, &info);
    if (!device.ok()) {
      note("GPU " + std::to_string(ordinal) + (info.name.empty() ? "" : " (" + info.name + ")") +
           " skipped: " + device.status().message());
      continue;
    }
    infos.push_back(std::move(info));
    devices.push_back(std::move(device).value());
  }

  // Which device reaches which. A failed query counts as "cannot": copies between the two
  // then go through host memory, slower but correct.
  for (auto& device : devices) {
    device->reaches.assign(devices.size(), false);
    for (size_t k = 0; k < devices.size(); ++k) {
      int can = 0;
      if (devices[k].get() != device.get() &&
          d.DeviceCanAccessPeer(&can, device->device, devices[k]->device) == CUDA_SUCCESS) {
        device->reaches[k] = can != 0;
      }
    }
  }
  for (size_t owner = 0; owner < devices.size(); ++owner) {
    for (size_t k = 0; k < devices.size(); ++k) {
      if (devices[k]->reaches[owner] && devices[k]->vmm) {
        devices[owner]->readers.push_back(devices[k]->device);
      }
    }
  }
  d.CtxSetCurrent(nullptr);  // the loop thread does not keep the last device's context
  return finish(&d, std::move(infos), std::move(devices));
}

}  // namespace depot::store::gpu
