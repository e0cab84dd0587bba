// Importing a simulated device's chunk: map its memfd. Its "device pointer" is a host address.
#include <sys/mman.h>

#include <string>

#include "device_import.h"
#include "mapping.h"

namespace depot::internal {

namespace {

class SimulatedChunk final : public ImportedChunk {
 public:
  explicit SimulatedChunk(Mapping mapping) : mapping_(std::move(mapping)) {}
  uint64_t address() const override { return reinterpret_cast<uint64_t>(mapping_.data()); }
  uint64_t size() const override { return mapping_.size(); }

 private:
  Mapping mapping_;
};

class SimulatedImporter final : public DeviceImporter {
 public:
  explicit SimulatedImporter(std::vector<ipc::DeviceUuid> devices) : devices_(std::move(devices)) {}

  std::vector<ipc::DeviceUuid> VisibleDevices() const override { return devices_; }

  Result<std::unique_ptr<ImportedChunk>> Import(ChunkToImport chunk) override {
    if (chunk.handle != ipc::ChunkHandle::kMemfd || !chunk.fd) {
      return Status::Internal("the daemon sent a GPU chunk of a simulated device without a memfd");
    }
    // A reader's chunk is a descriptor opened read-only: its bytes cannot be written here.
    DEPOT_ASSIGN_OR_RETURN(
        auto mapping,
        Mapping::Map(chunk.fd.get(), chunk.size,
                     chunk.writable ? PROT_READ | PROT_WRITE : PROT_READ, 0,
                     chunk.writable ? "simulated GPU chunk" : "read-only simulated GPU chunk"));
    return std::unique_ptr<ImportedChunk>(new SimulatedChunk(std::move(mapping)));
  }

  // Simulated devices run no asynchronous work: there is nothing to wait for.
  Status SynchronizeStream(uintptr_t) override { return Status::OK(); }

 private:
  std::vector<ipc::DeviceUuid> devices_;
};

}  // namespace

std::unique_ptr<DeviceImporter> MakeSimulatedImporter(std::vector<ipc::DeviceUuid> devices) {
  return std::make_unique<SimulatedImporter>(std::move(devices));
}

}  // namespace depot::internal
