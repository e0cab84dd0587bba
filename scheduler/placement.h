// Placement: which worker, and which device on it, a ready task runs on.
//
// The choice is the one with the least estimated completion time (StarPU's dmda, across
// processes and with device-level locality): the worker's queue wait, plus the time to move
// every input byte that is not already where the task would read it, plus the function's
// expected duration on that kind of device. A GPU task reads its inputs on its device; a
// CPU task reads them in host memory. Only workers whose free resources fit the request are
// candidates, so nothing is ever oversubscribed; with none, the task waits.
//
// Affinity narrows a GPU task's choice to the GPU that holds the most of its input bytes:
// `kSoft` takes it when it fits and otherwise chooses as `kNone` does; `kHard` takes it or
// waits. Where no GPU holds any input, and for CPU tasks (every worker reads in the same host
// memory), affinity changes nothing.
//
// Pure computation over values: no store, no sockets (tests/placement_test.cc).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace depot::scheduler {

// Devices as the store numbers its tiers: host memory, or the daemon's GPU k (k >= 0).
inline constexpr int32_t kHostMemory = -1;

// Resources are compared with this margin: shares such as 0.1 and 0.2, taken and given back,
// must leave a device whole again.
inline constexpr double kResourceEpsilon = 1e-9;

// What a task asks for. `gpu` is a share of one device, in (0, 1]; 0: a CPU task.
struct ResourceRequest {
  double cpu = 1;
  double gpu = 0;
  std::map<std::string, double> custom;  // e.g. {"ssd": 1}

  bool operator==(const ResourceRequest&) const = default;
};

enum class Affinity : uint8_t { kNone, kSoft, kHard };

// Where one input is now (the store's Locate): its size and the tiers with its bytes
// (bit 0 host memory, bit k + 1 GPU k, as ObjectHeader::tiers).
struct InputView {
  uint64_t bytes = 0;
  uint64_t tiers = 0;
  bool host = false;  // read in host memory wherever the task runs
};

// A worker as placement sees it: what it has free, and when its queue empties.
struct WorkerView {
  double free_cpu = 0;
  struct Gpu {
    int32_t device = 0;     // the daemon's index
    double free_share = 0;  // of the device, for this worker's tasks
  };
  std::vector<Gpu> gpus;
  std::map<std::string, double> free_custom;
  double queue_wait_s = 0;  // until the tasks it already has are done
};

// Bytes per second of the store's copies (measured at start-up, or set by flag).
struct Bandwidths {
  double host_to_gpu = 10e9;
  double gpu_to_host = 10e9;
  double gpu_to_gpu = 20e9;
};

// The function's expected duration, in seconds, on each kind of device; a negative one means
// the function has no variant there.
struct Durations {
  double cpu = 0;
  double gpu = -1;
};

struct Choice {
  size_t worker = 0;             // index into the workers given
  int32_t device = kHostMemory;  // where the task runs and reads its inputs
  double finish_s = 0;           // queue wait + transfer + duration
  double transfer_s = 0;
  uint64_t local_bytes = 0;  // input bytes already on `device`
  uint64_t moved_bytes = 0;  // input bytes a copy must bring there
};

// The device holding the most input bytes (host memory on a tie with no GPU ahead; with
// `gpus_only`, the GPU holding most), or nullopt when none holds any. Inputs read in host
// memory wherever the task runs do not count.
std::optional<int32_t> DeviceWithMostInput(std::span<const InputView> inputs,
                                           bool gpus_only = false);

// Seconds to bring every input to `device`, and the bytes already there and to move.
struct Transfer {
  double seconds = 0;
  uint64_t local_bytes = 0;
  uint64_t moved_bytes = 0;
};
Transfer TransferTo(int32_t device, std::span<const InputView> inputs, const Bandwidths& bw);

// The best place for a task, or nullopt when no worker's free resources fit it now (or none
// fits where a hard affinity requires).
std::optional<Choice> Place(const ResourceRequest& request, Affinity affinity,
                            std::span<const InputView> inputs, std::span<const WorkerView> workers,
                            const Durations& durations, const Bandwidths& bandwidths);

}  // namespace depot::scheduler
