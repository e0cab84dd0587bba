// Tasks: functions that workers attached to the daemon run on objects in the store, placed
// where their inputs already are (docs/architecture.md, "The scheduler").
//
//   depot::TaskRequest sum{.function = "sum", .inputs = {array_id}};
//   DEPOT_ASSIGN_OR_RETURN(auto outputs, client.Submit(sum));
//   DEPOT_ASSIGN_OR_RETURN(auto result, client.Get(outputs[0], std::chrono::seconds(10)));
//
// A task's outputs are ordinary objects: read them with Get, which waits for their seal. A
// task that failed seals its outputs as failed objects, and a Get of one answers TaskFailed
// with the reason. Graphs are built by passing one task's output ids as another's inputs.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "depot/object_id.h"

namespace depot {

enum class Affinity : uint8_t {
  kNone,  // placement alone decides
  kSoft,  // a GPU task prefers the GPU holding most of its input bytes, when it can start there
  kHard,  // only that GPU
};

// Which implementation a task runs where a worker registered two under its function's name
// (Worker::Register with a CPU and a GPU variant).
enum class Variant : uint8_t {
  // The scheduler chooses, for a task that asks no GPU: the CPU variant with the task's
  // resources, or the GPU variant with one GPU and no CPU slot, by which it expects to finish
  // first, counting the copies of its inputs. It tries each variant until it has measured it
  // at the task's input size, and now and then after. A task that asks a GPU runs on one.
  kAuto,
  kCpu,
  kGpu,  // one GPU and no CPU slot, unless `gpu` asks a share
};

struct TaskRequest {
  std::string function;          // a name some attached worker registered
  std::vector<ObjectId> inputs;  // objects or other tasks' outputs, in order
  std::string args;              // small inline arguments (at most 64 KiB), passed as they are
  // Output ids named by the caller, or empty: `num_outputs` ids derived by the daemon.
  std::vector<ObjectId> outputs;
  uint32_t num_outputs = 1;
  double cpu = 1;  // CPU slots it holds; 0 for a GPU task that needs none
  double gpu = 0;  // share of one GPU, 0 to 1: 0.25 lets four such tasks share a device
  std::map<std::string, double> resources;  // custom resources, e.g. {"ssd", 1}
  Affinity affinity = Affinity::kNone;
  int32_t priority = 0;       // higher runs first
  uint32_t retries = 1;       // runs again after its worker died, at most this often
  uint64_t output_bytes = 0;  // what its outputs take, if known: it starts only where they fit
  // Runs even if this client disconnects before it starts. Otherwise a task is cancelled
  // then, unless another client's task reads its outputs.
  bool detach = false;
  Variant variant = Variant::kAuto;
  // Indices of inputs the function reads in host memory wherever it runs (a Python
  // function's pickle, say): not copied to its GPU, nor counted as copies there.
  std::vector<uint32_t> host_inputs;
  // What `depotctl tasks` shows of it (a Dask key, say): at most 256 bytes, display only.
  std::string label;
  // A memory bound shared with this client's other tasks naming `bound_id` (a graph's on
  // a shared daemon): the task starts only while the outputs of that bound's tasks still
  // stored, those its placed tasks declared and its own `output_bytes` fit `bound_bytes`.
  // 0: none; both or neither, and the same bytes for every task naming the bound.
  uint64_t bound_id = 0;
  uint64_t bound_bytes = 0;
  // Held back by its bound, the task waits for this client to free the bound's outputs it
  // holds, however long, instead of failing once nothing of the bound has moved for a
  // while; it fails only if its output alone is larger than the bound.
  bool bound_waits = false;
  // Its kind (a Dask layer, say; at most 256 bytes): a task that declares no output_bytes is
  // expected to make as much as the most a task of its kind of this client made so far.
  std::string kind;
};

enum class CancelOutcome : uint8_t {
  kCancelled,  // it will not run; its outputs are sealed as failed ("cancelled")
  kRunning,    // it runs already and will finish
  kFinished,   // it was done or had failed already
  kUnknown,    // no task of this daemon produces the id
};

enum class TaskState : uint8_t {
  kWaiting,  // for its inputs to be sealed
  kReady,    // for a worker with room
  kQueued,   // placed on a worker, waiting for its resources (its inputs being prefetched)
  kRunning,
  kDone,
  kFailed,
  kCancelled,
};
// "waiting", "ready", ...
const char* TaskStateName(TaskState state);

// One task, as the daemon's scheduler sees it (Client::Tasks).
struct TaskInfo {
  uint64_t task = 0;
  std::string function;
  TaskState state = TaskState::kWaiting;
  uint64_t submitter = 0;  // session ids (ClientInfo::session_id)
  uint64_t worker = 0;     // 0 before it is placed
  int device = -1;         // the daemon's GPU index it runs on; -1: a CPU task
  std::vector<ObjectId> outputs;
  int32_t priority = 0;
  uint32_t attempts = 0;
  uint32_t inputs_missing = 0;
  // Why it was placed there: input bytes already on its device and moved there, and the
  // estimate's terms in seconds.
  uint64_t local_bytes = 0;
  uint64_t moved_bytes = 0;
  double wait_s = 0;
  double transfer_s = 0;
  double duration_s = 0;
  std::string reason;  // why it waits (ready) or why it failed
  // For a task of a function with two variants, once placed: "cpu" or "gpu", and why (the
  // estimates compared, or exploring a variant not measured yet).
  std::string variant;
  std::string variant_reason;
  std::string label;  // TaskRequest::label
};

// One attached worker (Client::Workers).
struct WorkerInfo {
  uint64_t session_id = 0;
  std::string name;
  double cpus = 0;
  double free_cpus = 0;
  std::vector<int> gpus;                // the daemon's GPU indices it may use
  std::vector<double> free_gpu_shares;  // of each of `gpus`
  std::map<std::string, double> resources;
  std::vector<std::string> functions;
  uint64_t running = 0;
  uint64_t queued = 0;
  uint64_t done = 0;
  uint64_t failed = 0;
  bool draining = false;
  double attached_s = 0;                   // seconds since it attached
  std::vector<std::string> gpu_functions;  // those it has a GPU variant of
};

// The scheduler's totals (StoreStatus::scheduler).
struct SchedulerStatus {
  uint64_t workers = 0;
  uint64_t tasks_pending = 0;
  uint64_t submitted = 0;
  uint64_t completed = 0;
  uint64_t failed = 0;
  uint64_t cancelled = 0;
  uint64_t retried = 0;
  uint64_t placements = 0;
  uint64_t local_bytes = 0;  // input bytes placed tasks found where they ran
  uint64_t moved_bytes = 0;  // input bytes copied to where they ran
  uint64_t prefetches = 0;
  uint64_t steals = 0;       // queued tasks taken from a busy worker for an idle one
  uint64_t preemptions = 0;  // queued tasks that gave their place to one outranking them
  double host_to_gpu = 0;    // bandwidths placement assumes, bytes per second
  double gpu_to_host = 0;
  double gpu_to_gpu = 0;
  bool bandwidths_measured = false;  // from the store's copies (as set by flag if false)
};

}  // namespace depot
