// Simulated devices: chunks are memfds the daemon maps like arena segments, and "device
// addresses" are the addresses of those mappings. The protocol, pools, replicas and spilling
// run exactly as with real GPUs; only the copies are memcpy. For tests and demos.
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "depot/ipc/units.h"
#include "store/gpu/device_backend.h"
#include "store/read_only.h"

namespace depot::store::gpu {

namespace {

class SimulatedBackend final : public DeviceBackend {
 public:
  SimulatedBackend(uint32_t count, uint64_t bytes) {
    for (uint32_t k = 0; k < count; ++k) {
      DeviceInfo info;
      // Recognisable and distinct from any real GPU: "GPU-5e5e5e5e-..." with the index last.
      info.uuid.fill(0x5e);
      info.uuid[14] = static_cast<uint8_t>(k >> 8);
      info.uuid[15] = static_cast<uint8_t>(k);
      info.name = "simulated GPU " + std::to_string(k);
      info.total_bytes = bytes;
      info.granularity = 2u << 20;  // as a real GPU's recommended granularity
      info.simulated = true;
      devices_.push_back(std::move(info));
    }
  }

  std::string_view kind() const override { return "simulated"; }
  std::span<const DeviceInfo> devices() const override { return devices_; }

  Result<Chunk> AllocateChunk(uint32_t device, uint64_t size) override {
    const std::string name = "depot-sim-gpu" + std::to_string(device);
    ipc::UniqueFd fd(::memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
    if (!fd) return Status::FromErrno("memfd_create for " + devices_[device].name, errno);
    if (::ftruncate(fd.get(), static_cast<off_t>(size)) != 0) {
      return Status::FromErrno("ftruncate of a " + ipc::FormatSize(size) + " chunk", errno);
    }
    // Readers get a read-only descriptor, as for arena segments; writers the read-write one.
    DEPOT_ASSIGN_OR_RETURN(ipc::UniqueFd read_fd,
                           ShareReadOnly(fd.get(), "a chunk of " + devices_[device].name));
    void* base = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
    if (base == MAP_FAILED) return Status::FromErrno("mmap of a simulated GPU chunk", errno);
    Chunk chunk;
    chunk.size = size;
    chunk.handle = ipc::ChunkHandle::kMemfd;
    chunk.fd = std::move(fd);
    chunk.read_fd = std::move(read_fd);
    chunk.address = reinterpret_cast<uint64_t>(base);
    return chunk;
  }

  void FreeChunk(uint32_t, Chunk& chunk) override {
    if (chunk.address != 0) ::munmap(reinterpret_cast<void*>(chunk.address), chunk.size);
    chunk.address = 0;
    chunk.fd.reset();
    chunk.read_fd.reset();
  }

  Status CopyToHost(uint32_t, uint64_t source, void* destination, uint64_t bytes) override {
    std::memcpy(destination, reinterpret_cast<const void*>(source), bytes);
    return Status::OK();
  }
  Status CopyFromHost(uint32_t, const void* source, uint64_t destination, uint64_t bytes) override {
    std::memcpy(reinterpret_cast<void*>(destination), source, bytes);
    return Status::OK();
  }
  Status CopyBetweenDevices(uint32_t, uint64_t source, uint32_t, uint64_t destination,
                            uint64_t bytes) override {
    std::memcpy(reinterpret_cast<void*>(destination), reinterpret_cast<const void*>(source), bytes);
    return Status::OK();
  }

  Status RegisterHostMemory(void*, uint64_t) override { return Status::OK(); }
  void UnregisterHostMemory(void*) override {}

 private:
  std::vector<DeviceInfo> devices_;
};

}  // namespace

std::unique_ptr<DeviceBackend> MakeSimulatedBackend(uint32_t count, uint64_t bytes) {
  return std::make_unique<SimulatedBackend>(count, bytes);
}

}  // namespace depot::store::gpu
