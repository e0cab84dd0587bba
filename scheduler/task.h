// A task as clients submit it, and the names the scheduler gives tasks and the clients and
// workers it serves.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "depot/object_id.h"
#include "scheduler/placement.h"

namespace depot::scheduler {

// The daemon's number for a client's session (store::ClientId): submitters and workers.
using SessionId = uint64_t;
// A task's number in this daemon, from 1; 0 is none.
using TaskId = uint64_t;

// Bounds on what one task may ask for; a submission past one is refused with its name.
inline constexpr size_t kMaxFunctionName = 256;
inline constexpr size_t kMaxInlineArgs = 64 * 1024;
inline constexpr size_t kMaxLabel = 256;
inline constexpr size_t kMaxInputs = 4096;
inline constexpr uint32_t kMaxOutputs = 64;
inline constexpr uint32_t kMaxRetries = 100;
// A task's CPU, GPU share or custom resource is 0 or at least this much, so that a worker
// runs a bounded number of tasks at once.
inline constexpr double kMinResourceAmount = 1.0 / 1024;
// At most this many tasks run on one worker at once, whatever their amounts.
inline constexpr size_t kMaxRunningPerWorker = 1024;
// What a worker may register: function names, custom resources, the length of its name.
inline constexpr size_t kMaxWorkerFunctions = 1024;
inline constexpr size_t kMaxWorkerResources = 64;
inline constexpr size_t kMaxWorkerName = 256;

// Which implementation of its function a task runs, where a worker registered two (a CPU and
// a GPU variant under one name).
enum class Variant : uint8_t {
  // The scheduler chooses for a task that asks no GPU, when some worker has a GPU variant:
  // the CPU variant with the task's resources, or the GPU variant with one GPU (no CPU) and
  // the task's custom resources, whichever it expects to finish first. A task that asks a
  // GPU runs on one: the GPU variant where its worker has one.
  kAuto,
  kCpu,
  kGpu,  // with one GPU and no CPU, unless the task asks a GPU share itself
};

struct TaskSpec {
  std::string function;          // a name workers registered
  std::vector<ObjectId> inputs;  // objects or other tasks' outputs, in order; repeats allowed
  std::string args;              // small inline argument bytes, passed as they are
  // The outputs' ids: named by the caller, or empty for `num_outputs` ids the scheduler
  // derives (returned by Submit).
  std::vector<ObjectId> outputs;
  uint32_t num_outputs = 1;  // when `outputs` is empty
  ResourceRequest resources;
  Affinity affinity = Affinity::kNone;
  int32_t priority = 0;  // higher runs first
  // How many times the task runs again after its worker died running it.
  uint32_t retries = 1;
  // Bytes its outputs will take on the device it runs on (0: unknown). The task starts only
  // where that much room exists without evicting anything held.
  uint64_t output_bytes = 0;
  // Runs even if its submitter disconnects first (otherwise cancelled then, unless another
  // client's task reads its outputs).
  bool detach = false;
  Variant variant = Variant::kAuto;
  // Indices of inputs it reads in host memory wherever it runs: placement counts them as
  // read there, and they are not prefetched to its GPU.
  std::vector<uint32_t> host_inputs;
  // Its submitter's name for it, for people (a Dask key): at most kMaxLabel bytes, shown,
  // never interpreted; kept while the task is listed.
  std::string label;
  // A memory bound shared with its submitter's other tasks naming `bound_id` (Bounds):
  // `bound_bytes` for the outputs of those tasks still stored and those placed tasks
  // declared. 0: none; both or neither.
  uint64_t bound_id = 0;
  uint64_t bound_bytes = 0;
  // Held back by its bound, it waits for its submitter to free the bound's outputs, however
  // long, rather than failing when nothing of the bound moves; only an output larger than
  // the bound alone fails (Scheduler::FailStuckBounds).
  bool bound_waits = false;
  // Its kind, for people, for output sizes (OutputSizes: tasks of a kind make outputs of
  // about one size) and for durations (DurationModel: tasks of a kind do the same work). At
  // most kMaxLabel bytes.
  std::string kind;
};

}  // namespace depot::scheduler
