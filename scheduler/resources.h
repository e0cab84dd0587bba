// A worker's resources: what it registered, and what the tasks placed on it hold. Reserve
// never lets a resource go below zero (no oversubscription, fractional GPU shares included);
// Release gives exactly back what a reservation took.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "depot/status.h"
#include "scheduler/placement.h"

namespace depot::scheduler {

// What a worker offers when it registers.
struct Capacity {
  double cpu = 0;                        // slots
  std::vector<int32_t> gpus;             // the daemon's indices of the GPUs it may use
  std::map<std::string, double> custom;  // e.g. {"ssd": 1}
};

class Resources {
 public:
  // InvalidArgument for a negative amount, a GPU named twice or a negative index.
  static Result<Resources> Make(const Capacity& capacity);

  // What one task holds: its request, on `device` (kHostMemory for a CPU task).
  struct Reservation {
    ResourceRequest request;
    int32_t device = kHostMemory;
  };
  // Takes `request` on `device` (kHostMemory for a CPU task); false, taking nothing, when it
  // does not fit now or `device` is not one of this worker's GPUs.
  bool Reserve(const ResourceRequest& request, int32_t device);
  // Gives back what Reserve(request, device) took.
  void Release(const Reservation& reservation);

  // Whether a request could ever fit this worker, were it idle.
  bool CouldEverFit(const ResourceRequest& request) const;
  // What is free now, as Place sees it (with this queue wait).
  WorkerView View(double queue_wait_s) const;
  // What the worker has when idle: the view of a task that waits `queue_wait_s` for its turn.
  WorkerView IdleView(double queue_wait_s) const;

  // Whether no task could start on what is free now: every task asks for some CPU or some
  // GPU (CheckResources), and neither is left.
  bool Exhausted() const;

  double free_cpu() const { return free_.cpu; }
  double free_share(int32_t device) const;

 private:
  struct Amounts {
    double cpu = 0;
    std::map<int32_t, double> gpu_share;  // by device: 1.0 is the whole device
    std::map<std::string, double> custom;
  };
  explicit Resources(Amounts total) : total_(total), free_(std::move(total)) {}
  static bool Fits(const ResourceRequest& request, int32_t device, const Amounts& have);
  static WorkerView ViewOf(const Amounts& have, double queue_wait_s);

  Amounts total_;
  Amounts free_;
};

}  // namespace depot::scheduler
