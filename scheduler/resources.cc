#include "scheduler/resources.h"

#include <algorithm>

#include "scheduler/task.h"

namespace depot::scheduler {

Result<Resources> Resources::Make(const Capacity& capacity) {
  if (capacity.cpu < 0) return Status::InvalidArgument("a worker cannot offer negative CPU slots");
  Amounts total;
  total.cpu = capacity.cpu;
  for (int32_t gpu : capacity.gpus) {
    if (gpu < 0) return Status::InvalidArgument("GPU index " + std::to_string(gpu) + " is not one");
    if (!total.gpu_share.emplace(gpu, 1.0).second) {
      return Status::InvalidArgument("GPU " + std::to_string(gpu) + " is offered twice");
    }
  }
  for (const auto& [name, amount] : capacity.custom) {
    if (amount < 0) {
      return Status::InvalidArgument("a worker cannot offer a negative amount of " + name);
    }
    total.custom[name] = amount;
  }
  return Resources(std::move(total));
}

bool Resources::Fits(const ResourceRequest& request, int32_t device, const Amounts& have) {
  if (have.cpu + kResourceEpsilon < request.cpu) return false;
  if (request.gpu > 0) {
    auto it = have.gpu_share.find(device);
    if (it == have.gpu_share.end() || it->second + kResourceEpsilon < request.gpu) return false;
  } else if (device != kHostMemory) {
    return false;
  }
  for (const auto& [name, amount] : request.custom) {
    if (amount <= 0) continue;
    auto it = have.custom.find(name);
    if (it == have.custom.end() || it->second + kResourceEpsilon < amount) return false;
  }
  return true;
}

bool Resources::Reserve(const ResourceRequest& request, int32_t device) {
  if (!Fits(request, device, free_)) return false;
  free_.cpu -= request.cpu;
  if (request.gpu > 0) free_.gpu_share[device] -= request.gpu;
  for (const auto& [name, amount] : request.custom) {
    if (amount > 0) free_.custom[name] -= amount;
  }
  return true;
}

void Resources::Release(const Reservation& r) {
  free_.cpu = std::min(total_.cpu, free_.cpu + r.request.cpu);
  if (r.request.gpu > 0) {
    double& share = free_.gpu_share[r.device];
    share = std::min(total_.gpu_share.at(r.device), share + r.request.gpu);
  }
  for (const auto& [name, amount] : r.request.custom) {
    if (amount > 0)
      free_.custom[name] = std::min(total_.custom.at(name), free_.custom[name] + amount);
  }
}

bool Resources::Exhausted() const {
  if (free_.cpu + kResourceEpsilon >= kMinResourceAmount) return false;
  return std::none_of(free_.gpu_share.begin(), free_.gpu_share.end(), [](const auto& gpu) {
    return gpu.second + kResourceEpsilon >= kMinResourceAmount;
  });
}

bool Resources::CouldEverFit(const ResourceRequest& request) const {
  if (request.gpu > 1 + kResourceEpsilon || request.cpu < 0 || request.gpu < 0) return false;
  if (request.gpu == 0) return Fits(request, kHostMemory, total_);
  return std::any_of(total_.gpu_share.begin(), total_.gpu_share.end(),
                     [&](const auto& gpu) { return Fits(request, gpu.first, total_); });
}

WorkerView Resources::ViewOf(const Amounts& have, double queue_wait_s) {
  WorkerView view;
  view.free_cpu = have.cpu;
  for (const auto& [device, share] : have.gpu_share) view.gpus.push_back({device, share});
  view.free_custom = have.custom;
  view.queue_wait_s = queue_wait_s;
  return view;
}

WorkerView Resources::View(double queue_wait_s) const { return ViewOf(free_, queue_wait_s); }

WorkerView Resources::IdleView(double queue_wait_s) const { return ViewOf(total_, queue_wait_s); }

double Resources::free_share(int32_t device) const {
  auto it = free_.gpu_share.find(device);
  return it == free_.gpu_share.end() ? 0 : it->second;
}

}  // namespace depot::scheduler
