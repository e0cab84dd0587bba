#include "store/copy_probe.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <string>
#include <vector>

#include "depot/ipc/framing.h"
#include "depot/ipc/units.h"

namespace depot::store {

namespace {

// Runs of each copy; the fastest counts (the first also faults pages in).
constexpr int kRuns = 3;

// Host memory of the probe's own, a memfd mapping page-locked where the backend does that,
// as the arena's segments are; given back on destruction.
class HostBuffer {
 public:
  static Result<HostBuffer> Make(gpu::DeviceBackend& backend, uint64_t bytes) {
    ipc::UniqueFd fd(::memfd_create("depot-copy-probe", MFD_CLOEXEC));
    if (!fd) return Status::FromErrno("memfd_create for the probe's host memory", errno);
    if (::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) {
      return Status::FromErrno("ftruncate of the probe's host memory", errno);
    }
    void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
    if (base == MAP_FAILED) return Status::FromErrno("mmap of the probe's host memory", errno);
    HostBuffer buffer(backend, base, bytes);
    DEPOT_RETURN_NOT_OK(backend.RegisterHostMemory(base, bytes));
    buffer.registered_ = true;
    return buffer;
  }
  HostBuffer(HostBuffer&& other) noexcept
      : backend_(other.backend_),
        base_(std::exchange(other.base_, nullptr)),
        bytes_(other.bytes_),
        registered_(other.registered_) {}
  HostBuffer& operator=(HostBuffer&&) = delete;
  ~HostBuffer() {
    if (base_ == nullptr) return;
    if (registered_) backend_.UnregisterHostMemory(base_);
    ::munmap(base_, bytes_);
  }
  void* base() const { return base_; }

 private:
  HostBuffer(gpu::DeviceBackend& backend, void* base, uint64_t bytes)
      : backend_(backend), base_(base), bytes_(bytes) {}
  gpu::DeviceBackend& backend_;
  void* base_;
  uint64_t bytes_;
  bool registered_ = false;
};

}  // namespace

Result<CopyRates> ProbeCopyRates(gpu::DeviceBackend& backend, uint64_t bytes) {
  const auto devices = backend.devices();
  if (devices.empty()) return CopyRates{};
  uint64_t granularity = 1;
  for (const gpu::DeviceInfo& d : devices) {
    bytes = std::min(bytes, d.total_bytes / 8);
    granularity = std::max(granularity, d.granularity);
  }
  bytes -= bytes % granularity;
  if (bytes < CopyRates::kMinBytes) return CopyRates{};

  DEPOT_ASSIGN_OR_RETURN(HostBuffer host, HostBuffer::Make(backend, bytes));
  std::vector<gpu::Chunk> chunks;
  // The chunks go back however the probe ends.
  struct FreeChunks {
    gpu::DeviceBackend& backend;
    std::vector<gpu::Chunk>& chunks;
    ~FreeChunks() {
      for (uint32_t d = 0; d < chunks.size(); ++d) backend.FreeChunk(d, chunks[d]);
    }
  } free_chunks{backend, chunks};
  for (uint32_t d = 0; d < devices.size(); ++d) {
    auto chunk = backend.AllocateChunk(d, bytes);
    if (!chunk.ok()) {
      return Status(chunk.status().code(), "cannot take " + ipc::FormatSize(bytes) + " of " +
                                               devices[d].name +
                                               " for the copies: " + chunk.status().message());
    }
    chunks.push_back(std::move(chunk).value());
  }

  // The fastest of kRuns runs of `copy`, in bytes per second.
  const auto rate = [bytes](const char* what, auto copy) -> Result<double> {
    double best = 0;
    for (int run = 0; run < kRuns; ++run) {
      const auto start = std::chrono::steady_clock::now();
      if (Status st = copy(); !st.ok()) {
        return Status(st.code(), std::string("a copy ") + what + " failed: " + st.message());
      }
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      best = std::max(best, static_cast<double>(bytes) / std::max(seconds, 1e-9));
    }
    return best;
  };
  CopyRates rates;
  const double n = static_cast<double>(devices.size());
  for (uint32_t d = 0; d < devices.size(); ++d) {
    const uint64_t device = chunks[d].address;
    DEPOT_ASSIGN_OR_RETURN(const double up, rate("to a GPU", [&] {
                             return backend.CopyFromHost(d, host.base(), device, bytes);
                           }));
    DEPOT_ASSIGN_OR_RETURN(const double down, rate("from a GPU", [&] {
                             return backend.CopyToHost(d, device, host.base(), bytes);
                           }));
    rates.host_to_gpu += up / n;
    rates.gpu_to_host += down / n;
  }
  if (devices.size() >= 2) {
    DEPOT_ASSIGN_OR_RETURN(rates.gpu_to_gpu, rate("between GPUs", [&] {
                             return backend.CopyBetweenDevices(0, chunks[0].address, 1,
                                                               chunks[1].address, bytes);
                           }));
  }
  return rates;
}

}  // namespace depot::store
