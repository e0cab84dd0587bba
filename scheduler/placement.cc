#include "scheduler/placement.h"

#include <algorithm>
#include <bit>

namespace depot::scheduler {

namespace {

uint64_t Bit(int32_t device) { return uint64_t{1} << (device + 1); }

// Whether `worker` has the CPU and custom resources `request` asks for.
bool FitsBesidesGpu(const ResourceRequest& request, const WorkerView& worker) {
  if (worker.free_cpu + kResourceEpsilon < request.cpu) return false;
  for (const auto& [name, amount] : request.custom) {
    auto it = worker.free_custom.find(name);
    if (amount > 0 && (it == worker.free_custom.end() || it->second + kResourceEpsilon < amount)) {
      return false;
    }
  }
  return true;
}

}  // namespace

std::optional<int32_t> DeviceWithMostInput(std::span<const InputView> inputs, bool gpus_only) {
  std::map<int32_t, uint64_t> bytes;  // by device
  for (const InputView& in : inputs) {
    if (in.host) continue;
    for (uint64_t tiers = in.tiers; tiers != 0; tiers &= tiers - 1) {
      bytes[std::countr_zero(tiers) - 1] += in.bytes;
    }
  }
  std::optional<int32_t> best;
  uint64_t most = 0;
  for (const auto& [device, total] : bytes) {  // host first: a GPU must hold strictly more
    if (gpus_only && device == kHostMemory) continue;
    if (!best || total > most) {
      best = device;
      most = total;
    }
  }
  return best;
}

Transfer TransferTo(int32_t task_device, std::span<const InputView> inputs, const Bandwidths& bw) {
  Transfer t;
  for (const InputView& in : inputs) {
    const int32_t device = in.host ? kHostMemory : task_device;
    if (in.tiers & Bit(device)) {
      t.local_bytes += in.bytes;
      continue;
    }
    t.moved_bytes += in.bytes;
    const double bytes = static_cast<double>(in.bytes);
    if (device == kHostMemory) {
      t.seconds += bytes / bw.gpu_to_host;
    } else if (in.tiers & ~Bit(kHostMemory)) {
      t.seconds += bytes / bw.gpu_to_gpu;  // another GPU has it: a peer copy
    } else {
      t.seconds += bytes / bw.host_to_gpu;
    }
  }
  return t;
}

std::optional<Choice> Place(const ResourceRequest& request, Affinity affinity,
                            std::span<const InputView> inputs, std::span<const WorkerView> workers,
                            const Durations& durations, const Bandwidths& bandwidths) {
  const bool on_gpu = request.gpu > 0;
  const double duration = on_gpu ? durations.gpu : durations.cpu;
  if (duration < 0) return std::nullopt;  // no variant for this kind of device
  // The device the affinity prefers: the GPU holding most input bytes, for a GPU task with
  // affinity. None otherwise: every CPU task reads in the same host memory.
  constexpr int32_t kNoDevice = kHostMemory - 1;
  const int32_t favourite =
      affinity != Affinity::kNone && on_gpu
          ? DeviceWithMostInput(inputs, /*gpus_only=*/true).value_or(kNoDevice)
          : kNoDevice;

  std::optional<Choice> best, best_favoured;
  auto consider = [&](size_t w, int32_t device) {
    const Transfer t = TransferTo(device, inputs, bandwidths);
    const Choice c{w,         device,        workers[w].queue_wait_s + t.seconds + duration,
                   t.seconds, t.local_bytes, t.moved_bytes};
    if (!best || c.finish_s < best->finish_s) best = c;
    if (device == favourite && (!best_favoured || c.finish_s < best_favoured->finish_s)) {
      best_favoured = c;
    }
  };
  for (size_t w = 0; w < workers.size(); ++w) {
    if (!FitsBesidesGpu(request, workers[w])) continue;
    if (!on_gpu) {
      consider(w, kHostMemory);
      continue;
    }
    for (const WorkerView::Gpu& gpu : workers[w].gpus) {
      if (gpu.free_share + kResourceEpsilon >= request.gpu) consider(w, gpu.device);
    }
  }
  if (best_favoured) return best_favoured;
  if (affinity == Affinity::kHard && favourite != kNoDevice) return std::nullopt;
  return best;
}

}  // namespace depot::scheduler
