// The scheduler: tasks that clients submit, the workers that run them, and where each runs.
//
// A task waits until its inputs are sealed, then joins the ready queue (priority first, then
// depth first: tasks that consume tasks' outputs before those that produce new data, so a
// large graph runs in a store much smaller than the sum of its intermediates). Placement
// (placement.h) puts a ready task on the worker and device where it would finish first. A
// worker runs as many tasks as its resources fit (resources.h: never oversubscribed) and
// keeps a short queue, its window, of tasks placed on it and waiting for their resources:
// their inputs are prefetched to their device meanwhile, and the rest wait in the daemon so
// that each placement sees fresh locality. Tasks are sent to a worker (WorkerLink) when they
// start, batched per dispatch.
//
// The graph holds a reference (StoreAccess::Hold) to each object a pending task reads and
// drops it when its last consumer is done. A task whose function fails, or whose worker died
// more often than its retries allow, seals its outputs as failed with the reason; a task
// reading a failed object fails with it.
//
// All of it runs on the daemon's loop thread. Store events come in through ObjectEvents.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "depot/object_id.h"
#include "depot/status.h"
#include "scheduler/durations.h"
#include "scheduler/placement.h"
#include "scheduler/resources.h"
#include "scheduler/store_access.h"
#include "scheduler/task.h"

namespace depot::scheduler {

// A task sent to a worker to run now, on `device` (kHostMemory for a CPU task).
struct Assignment {
  TaskId task = 0;
  uint32_t attempt = 1;  // 2 and more: its earlier workers died running it
  int32_t device = kHostMemory;
  const TaskSpec* spec = nullptr;  // valid until the task's completion or its worker's end
  std::span<const ObjectId> outputs;
  // Indices of outputs an earlier attempt sealed: they are kept, and not made again.
  std::vector<uint32_t> sealed;
  // 0, or a task running on the same worker: this one starts when that one's function has
  // returned, on the resources it held (pipelined: no round trip to the daemon between).
  TaskId after = 0;
};

// How the scheduler reaches workers: the daemon's sessions implement it.
class WorkerLink {
 public:
  virtual ~WorkerLink() = default;
  // Sends `tasks` to `worker` in one message. The worker answers each with Complete.
  virtual void Assign(SessionId worker, std::span<const Assignment> tasks) = 0;
  // Tells a draining worker that it has nothing left to run and gets no more tasks.
  virtual void Drained(SessionId worker) = 0;
};

struct WorkerSpec {
  std::string name;  // for people: depotctl workers
  Capacity capacity;
  std::vector<std::string> functions;      // the names it runs (the CPU variant of two)
  std::vector<std::string> gpu_functions;  // the names it has a GPU variant of
};

// What a worker reports of one task it ran.
struct Completion {
  TaskId task = 0;
  bool ok = true;
  std::string message;  // why it failed (cut to kMaxFailureMessage)
};

enum class TaskState : uint8_t {
  kWaiting,   // for inputs to be sealed
  kReady,     // in the daemon's queue, for a worker with room
  kQueued,    // placed on a worker, waiting for its resources (inputs being prefetched)
  kRunning,   // sent to its worker (to run now, or after a task running there)
  kDone,      // its outputs sealed
  kFailed,    // its outputs sealed as failed
  kCancelled  // its outputs sealed as failed, cancelled
};
std::string_view TaskStateName(TaskState state);

// One task, as `depotctl tasks` shows it.
struct TaskInfo {
  TaskId id = 0;
  std::string function;
  TaskState state = TaskState::kWaiting;
  SessionId submitter = 0;
  SessionId worker = 0;  // kQueued, kRunning (and the last one for done tasks): 0 if none
  int32_t device = kHostMemory;
  std::vector<ObjectId> outputs;
  int32_t priority = 0;
  uint32_t attempts = 0;        // times it was started
  uint32_t inputs_missing = 0;  // kWaiting: inputs not sealed yet
  // Why there: the placement's terms.
  uint64_t local_bytes = 0;
  uint64_t moved_bytes = 0;
  double wait_s = 0;
  double transfer_s = 0;
  double duration_s = 0;
  std::string reason;  // kReady: why no worker takes it now; kFailed: why it failed
  // For a task whose function has two variants, placed: which ("cpu" or "gpu") and why.
  std::string variant;
  std::string variant_reason;
};

// One worker, as `depotctl workers` shows it.
struct WorkerInfo {
  SessionId id = 0;
  std::string name;
  Capacity capacity;
  double free_cpu = 0;
  std::vector<std::pair<int32_t, double>> free_gpu_share;  // by device
  std::vector<std::string> functions;
  std::vector<std::string> gpu_functions;
  uint64_t running = 0;
  uint64_t queued = 0;
  uint64_t done = 0;
  uint64_t failed = 0;
  bool draining = false;
  double attached_s = 0;  // seconds since it attached
};

struct SchedulerCounters {
  uint64_t submitted = 0;
  uint64_t completed = 0;  // done with their outputs
  uint64_t failed = 0;     // by their function, their inputs or their workers' deaths
  uint64_t cancelled = 0;
  uint64_t retried = 0;  // started again after their worker died
  uint64_t placements = 0;
  uint64_t local_bytes = 0;    // input bytes where placed tasks read them
  uint64_t moved_bytes = 0;    // input bytes that had to be copied there
  uint64_t prefetches = 0;     // inputs asked for ahead of a queued task
  uint64_t workers = 0;        // attached now
  uint64_t tasks_pending = 0;  // waiting, ready, queued or running
  // How long placements took (PlaceOne, a task placed or not): bucket i counts those of
  // (2^(i-1), 2^i] x 64 ns, bucket 0 those up to 64 ns, the last everything longer.
  static constexpr int kPlacementBuckets = 20;
  std::array<uint64_t, kPlacementBuckets> placement_ns_buckets{};
  uint64_t placement_ns_sum = 0;
  uint64_t placement_tries = 0;
};

struct SchedulerOptions {
  Bandwidths bandwidths;
  // Tasks a worker may have placed on it beyond those running (at least 1).
  uint32_t window = 2;
  // Whether tasks placed on a busy worker are sent to it ahead, each to start when a task
  // of the same shape (resources and device) running there ends, on its resources: a worker
  // then goes from task to task with no round trip to the daemon between. Only short tasks
  // (functions measured at under a millisecond) are.
  bool pipeline = true;
  // Finished tasks kept for `depotctl tasks` after they are done (the oldest go first).
  size_t finished_kept = 1024;
  // Seconds since some fixed point: task durations are measured with it.
  std::function<double()> clock;
  // Whether placement goes by the store's measured copy bandwidths (where it has measured
  // them) rather than `bandwidths` alone.
  bool measure_bandwidths = true;
  // Places each task on a worker and device chosen at random among those that fit, with no
  // regard for locality or queues: the baseline placement is measured against.
  bool random_placement = false;
};

class Scheduler final : public ObjectEvents {
 public:
  Scheduler(StoreAccess& store, WorkerLink& link, SchedulerOptions options);
  ~Scheduler() override;
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Attaches `session` as a worker. InvalidArgument for bad resources or a function name
  // that is empty or too long, AlreadyExists if it is a worker already.
  Status AddWorker(SessionId session, WorkerSpec spec);
  // A worker that asks to leave: it gets no new task, its queued ones go back to the daemon's
  // queue, and it is gone once its running ones complete. NotFound if it is not a worker.
  Status DrainWorker(SessionId session);
  // The session ended (cleanly or not): its queued tasks go back to the queue and its running
  // ones run again elsewhere up to their retries, then fail with the reason. Then, as a
  // submitter, its pending tasks whose outputs no other client's task reads are cancelled.
  // Call after the store has given back what the session held.
  void RemoveSession(SessionId session);

  // Submits `tasks` from `submitter`, all or none: the output ids of each, in order, or why
  // the batch was refused (InvalidArgument with the task's index: bad resources or bounds,
  // no worker able ever to run it, a cycle; NotFound: an input that neither exists nor is
  // produced by a task; AlreadyExists: an output id taken).
  Result<std::vector<std::vector<ObjectId>>> Submit(SessionId submitter,
                                                    std::span<const TaskSpec> tasks);
  // What `worker` reports of tasks it ran. InvalidArgument (and nothing done for that task)
  // naming a task that is not running on it.
  Status Complete(SessionId worker, std::span<const Completion> completions);
  // The outputs of `task` if it is running on `worker` (which may store them before it
  // completes the task); empty otherwise.
  std::span<const ObjectId> RunningOutputs(SessionId worker, TaskId task) const;

  enum class CancelOutcome : uint8_t { kCancelled, kRunning, kFinished, kUnknown };
  // Cancels the tasks producing `outputs` that have not started: their outputs are sealed as
  // failed ("cancelled"), which fails the tasks reading them. One outcome per id: kRunning
  // for a task already running (it finishes), kFinished for one done or failed, kUnknown for
  // an id no task of this daemon produces.
  std::vector<CancelOutcome> Cancel(std::span<const ObjectId> outputs);

  // ObjectEvents.
  void OnSealed(const ObjectId& id, bool failed) override;
  void OnFreed(const ObjectId& id) override;

  std::vector<WorkerInfo> Workers() const;
  // Pending tasks in id order, then the finished ones kept; at most `limit` of them.
  std::vector<TaskInfo> Tasks(size_t limit = SIZE_MAX) const;
  SchedulerCounters counters() const;
  // The bandwidths placement goes by now: measured, or as set.
  Bandwidths bandwidths() const {
    return options_.measure_bandwidths ? store_.CopyBandwidths(options_.bandwidths)
                                       : options_.bandwidths;
  }
  bool bandwidths_measured() const { return options_.measure_bandwidths; }
  bool random_placement() const { return options_.random_placement; }

 private:
  struct Task;
  struct Worker;
  struct Node;
  // The ready queue's order: priority, then depth first (consumers of data before producers
  // of new data), then submission.
  struct ReadyKey {
    int32_t priority;
    uint32_t depth;
    TaskId id;
    friend bool operator<(const ReadyKey& a, const ReadyKey& b) {
      if (a.priority != b.priority) return a.priority > b.priority;
      if (a.depth != b.depth) return a.depth > b.depth;
      return a.id < b.id;
    }
  };

  // Checks a batch: the order to admit it in (producers before consumers), or why not.
  Result<std::vector<size_t>> Validate(std::span<const TaskSpec> tasks,
                                       const std::vector<std::vector<ObjectId>>& outputs) const;
  bool SomeWorkerCouldRun(const TaskSpec& spec) const;
  // Where a task's inputs are now, those it reads on host marked (InputView::host).
  std::vector<InputView> InputsOf(const TaskSpec& spec) const;
  // Whether some worker attached could ever take the task (for hard affinity: offers the GPU
  // holding most of its input).
  bool CouldEverPlace(const Task& task) const;
  std::vector<ObjectId> DeriveOutputs(TaskId task, uint32_t count) const;
  void Admit(Task& task);
  void MakeReady(Task& task);
  // Starts queued tasks whose resources are free and places ready tasks while workers have
  // room; sends what started, a message per worker. Again while a send changed anything.
  void Dispatch();
  void DispatchRound();
  // Places one ready task; false if no worker can take it now. Timed (SchedulerCounters).
  bool PlaceOne(Task& task);
  bool TryPlace(Task& task);
  // The ways a task may run: with which resources, on which workers.
  struct Way;
  struct Plan;
  std::vector<Way> Ways(const TaskSpec& spec) const;
  // Where `task` would run `way` best now, or nullopt.
  std::optional<Plan> PlanWay(const Task& task, const Way& way, std::span<const SessionId> runners,
                              std::span<const InputView> inputs,
                              const std::function<bool(int32_t)>& has_room);
  // Of two plans for a task with two variants, the one to take, and why.
  const Plan& ChooseVariant(Task& task, const Plan& cpu, const Plan& gpu);
  // Starts the tasks queued on `worker` that fit now, in queue order.
  void StartQueued(Worker& worker);
  void Start(Worker& worker, Task& task);
  void Flush();
  double Now() const { return options_.clock ? options_.clock() : 0; }
  // Seconds until `worker` could start one more task, by the expected durations of its own.
  double QueueWait(const Worker& worker) const;
  // Takes a placed (queued or running) task off its worker, giving back what it held there.
  void Unplace(Task& task);
  // Puts a task taken off its worker back in the ready queue.
  void Requeue(Task& task);
  // The task is over: its outputs sealed as failed unless it is done, its inputs let go of,
  // and it is kept among the finished.
  void Finish(Task& task, TaskState state, std::string reason);
  void LetGoOfInputs(Task& task);
  void LetGoOfKept(Task& task);
  // Sends the tasks queued on `worker` that can follow a task running there (Assignment's
  // `after`).
  void Pipeline(Worker& worker);
  // Tasks placed on `worker` and not started: queued in the daemon, or sent ahead.
  size_t Waiting(const Worker& worker) const;
  // Fails the tasks waiting for outputs that will not come (failures_), one at a time.
  void Settle();
  // `id` is sealed: the graph holds it for its consumers, and those waiting for it have one
  // input fewer to wait for, unless a pending task makes it (they wait for that task).
  void Sealed(const ObjectId& id);
  // `id` will never be sealed with bytes: the tasks waiting for it fail with `reason`.
  void InputFailed(const ObjectId& id, const std::string& reason);
  void ForgetWorker(Worker& worker);
  void Retire(Task& task);

  StoreAccess& store_;
  WorkerLink& link_;
  SchedulerOptions options_;
  DurationModel durations_;
  ObjectId nonce_;  // derived output ids: unique to this daemon

  TaskId next_task_ = 1;
  uint64_t next_ready_ = 0;
  std::unordered_map<TaskId, std::unique_ptr<Task>> tasks_;  // pending
  std::deque<std::unique_ptr<Task>> finished_;               // kept for Tasks(), oldest first
  std::unordered_map<ObjectId, TaskId> finished_outputs_;    // of the tasks in finished_
  // Outputs of tasks that ended without them, and the reason their readers fail with.
  std::deque<std::pair<ObjectId, std::string>> failures_;
  std::unordered_map<ObjectId, Node> nodes_;  // objects pending tasks read or produce
  std::set<ReadyKey> ready_;
  std::unordered_set<TaskId> stalled_;  // ready, but for no worker attached: set aside
  std::map<SessionId, std::unique_ptr<Worker>> workers_;
  std::unordered_map<std::string, std::vector<SessionId>> runners_;  // function -> workers
  std::unordered_map<std::string, size_t> gpu_variants_;             // function -> workers with one
  std::unordered_map<SessionId, std::vector<Assignment>> outbox_;
  SchedulerCounters counters_;
  std::minstd_rand random_;  // for random_placement
  bool dispatching_ = false;
  bool dispatch_again_ = false;
};

}  // namespace depot::scheduler
