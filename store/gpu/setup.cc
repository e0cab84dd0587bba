#include "store/gpu/setup.h"

#include <spdlog/spdlog.h>

#include <charconv>
#include <string_view>

#include "depot/ipc/gpu.h"
#include "depot/ipc/units.h"

namespace depot::store::gpu {

namespace {

constexpr double kDefaultShare = 0.75;  // of each device's memory, when --gpu-memory is silent

// "8GiB" or "50%" of `total`.
Result<uint64_t> ParseLimit(std::string_view text, uint64_t total) {
  if (!text.empty() && text.back() == '%') {
    double pct = 0;
    const std::string number(text.substr(0, text.size() - 1));
    try {
      pct = std::stod(number);
    } catch (const std::exception&) {
      pct = -1;
    }
    if (!(pct > 0 && pct <= 100)) {
      return Status::InvalidArgument("'" + std::string(text) +
                                     "' is not a percentage between 0 and 100");
    }
    return static_cast<uint64_t>(static_cast<double>(total) * pct / 100);
  }
  return ipc::ParseSize(text);
}

}  // namespace

Result<std::vector<uint64_t>> ParsePoolLimits(const std::string& spec,
                                              const std::vector<uint64_t>& device_bytes) {
  return ParsePerDevice(spec, device_bytes, kDefaultShare);
}

Result<std::vector<uint64_t>> ParsePerDevice(const std::string& spec,
                                             const std::vector<uint64_t>& device_bytes,
                                             double default_share) {
  std::vector<uint64_t> limits;
  for (uint64_t total : device_bytes) {
    limits.push_back(static_cast<uint64_t>(static_cast<double>(total) * default_share));
  }
  if (spec.empty()) return limits;
  if (spec.find(':') == std::string::npos) {  // one value for every device
    for (size_t d = 0; d < limits.size(); ++d) {
      DEPOT_ASSIGN_OR_RETURN(limits[d], ParseLimit(spec, device_bytes[d]));
    }
    return limits;
  }
  std::string_view rest = spec;
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    const size_t colon = item.find(':');
    uint32_t device = 0;
    const auto [end, ec] = std::from_chars(item.data(), item.data() + colon, device);
    if (colon == std::string_view::npos || ec != std::errc() || end != item.data() + colon) {
      return Status::InvalidArgument("'" + std::string(item) +
                                     "' is not DEVICE:SIZE, like 0:8GiB or 1:50%");
    }
    if (device >= limits.size()) {
      return Status::InvalidArgument("there is no GPU " + std::to_string(device) +
                                     " (this host has " + std::to_string(limits.size()) + ")");
    }
    DEPOT_ASSIGN_OR_RETURN(limits[device],
                           ParseLimit(item.substr(colon + 1), device_bytes[device]));
  }
  return limits;
}

std::vector<DevicePool*> Gpus::pool_pointers() const {
  std::vector<DevicePool*> out;
  for (const auto& pool : pools) out.push_back(pool.get());
  return out;
}

Result<std::unique_ptr<Gpus>> SetUpGpus(const GpuOptions& options) {
  auto gpus = std::make_unique<Gpus>();
  if (!options.simulate.empty()) {
    const size_t colon = options.simulate.find(':');
    uint32_t count = 0;
    const std::string n = options.simulate.substr(0, colon);
    const auto [end, ec] = std::from_chars(n.data(), n.data() + n.size(), count);
    if (ec != std::errc() || end != n.data() + n.size() || count == 0 || count > 63) {
      return Status::InvalidArgument("--simulate-gpus '" + options.simulate +
                                     "' is not N or N:SIZE with N from 1 to 63, like 2:1GiB");
    }
    uint64_t bytes = 1ull << 30;
    if (colon != std::string::npos) {
      auto size = ipc::ParseSize(options.simulate.substr(colon + 1));
      if (!size.ok()) return Status::InvalidArgument("--simulate-gpus: " + size.status().message());
      bytes = *size;
    }
    if (bytes < (2u << 20)) {
      return Status::InvalidArgument("--simulate-gpus: a simulated GPU needs at least 2MiB");
    }
    gpus->backend = MakeSimulatedBackend(count, bytes);
    gpus->description = "simulated";
  } else if (options.disabled) {
    gpus->backend = MakeSimulatedBackend(0, 0);
    gpus->description = "none (--no-gpus)";
  } else {
    std::string why;
    gpus->backend = LoadCudaBackend(&why);
    gpus->description = gpus->backend->devices().empty() ? "none: " + why : "cuda";
  }
  auto chunk = ipc::ParseSize(options.chunk_size);
  if (!chunk.ok()) return Status::InvalidArgument("--gpu-chunk-size: " + chunk.status().message());
  std::vector<uint64_t> totals;
  for (const DeviceInfo& info : gpus->backend->devices()) totals.push_back(info.total_bytes);
  auto limits = ParsePoolLimits(options.memory, totals);
  if (!limits.ok()) return Status::InvalidArgument("--gpu-memory: " + limits.status().message());
  auto reserves = ParsePerDevice(options.reserve, totals, 0);
  if (!reserves.ok())
    return Status::InvalidArgument("--gpu-reserve: " + reserves.status().message());
  for (uint32_t d = 0; d < totals.size(); ++d) {
    gpus->pools.push_back(std::make_unique<DevicePool>(*gpus->backend, d, (*limits)[d], *chunk));
    DevicePool& pool = *gpus->pools.back();
    const DeviceInfo& info = gpus->backend->devices()[d];
    spdlog::info("GPU {}: {} ({}, {} of memory), pool of up to {}", d, info.name,
                 ipc::FormatUuid(info.uuid), ipc::FormatSize(info.total_bytes),
                 ipc::FormatSize(pool.limit()));
    if ((*reserves)[d] > pool.limit()) {
      return Status::InvalidArgument("--gpu-reserve: " + ipc::FormatSize((*reserves)[d]) +
                                     " on GPU " + std::to_string(d) + " is more than its pool (" +
                                     ipc::FormatSize(pool.limit()) + ", --gpu-memory)");
    }
    if ((*reserves)[d] > 0) DEPOT_RETURN_NOT_OK(pool.Reserve((*reserves)[d]));
  }
  if (totals.empty()) spdlog::info("no GPUs: {}", gpus->description);
  return gpus;
}

}  // namespace depot::store::gpu
