// The task graph: the tasks submitted and not over (pending), the finished ones kept for
// people to look at, and the objects pending tasks read or make.
//
// It knows which task waits for which object, and holds a reference (StoreAccess::Hold) to
// each sealed object a pending task reads, dropped with its last consumer. A task whose
// inputs are all sealed is handed on (`ready`, given at construction); the graph places
// nothing: where tasks run is the worker table's (worker_table.h) and the dispatcher's
// (dispatcher.h). A task that ends without its outputs fails the tasks reading them, one at a
// time through a queue (Settle) rather than by recursion, so that a long chain cannot
// overflow the stack.
//
// One record per task (Task) is shared by the scheduler's parts: the graph owns it; the
// worker table and the dispatcher keep where it runs in it. All of it runs on the daemon's
// loop thread.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "depot/object_id.h"
#include "depot/status.h"
#include "scheduler/placement.h"
#include "scheduler/store_access.h"
#include "scheduler/task.h"

namespace depot::scheduler {

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

// The ready queue's order: priority, then depth first (consumers of data before producers of
// new data), then submission.
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

struct Task {
  // The graph's.
  TaskId id = 0;
  SessionId submitter = 0;
  TaskSpec spec;
  std::vector<ObjectId> outputs;
  TaskState state = TaskState::kWaiting;
  uint32_t missing = 0;  // inputs not sealed yet, counted per occurrence
  uint32_t depth = 0;    // 1 + the deepest pending producer of its inputs
  uint64_t charged = 0;  // to its submitter (StoreAccess::Charge), until it is over
  std::string reason;    // why it failed
  // Outputs an earlier attempt sealed before its worker died, held (StoreAccess::Hold) from
  // the start of the attempt told of them until the task is over: that attempt does not
  // make them again, so they must not be evicted meanwhile.
  std::vector<ObjectId> kept;

  // Where it runs: the dispatcher's choice and the worker table's book-keeping.
  uint32_t attempts = 0;
  SessionId worker = 0;  // where it was placed last
  int32_t device = kHostMemory;
  bool placed = false;    // queued or running on `worker`
  double duration_s = 0;  // expected; counted in its worker's pending_s while placed
  double started_at = 0;
  Choice choice;  // the placement's terms
  // What it runs with where placed: its own request, or its GPU variant's.
  ResourceRequest request;
  uint64_t input_bytes = 0;  // of its inputs, when it was last placed
  std::string variant;       // of a task placed by variant: "cpu" or "gpu", and why
  std::string variant_reason;
  // Pipelining (SchedulerOptions::pipeline): a running task may have been sent to start
  // after another running on its worker, whose resources it takes over when that one ends
  // (`after`: the one before, until then); a task has at most one such `follower`.
  TaskId after = 0;
  TaskId follower = 0;
  // Output bytes reserved for it while placed: declared, or expected of its kind
  // (OutputSizes), as of its placement.
  uint64_t reserve = 0;
  // What its memory bound reserved for it while placed: `reserve` and its inputs on disk
  // (Bounds::Placed).
  uint64_t bound_reserve = 0;
  // Running, its function waits for room for an output (the daemon's RoomWaits): it gave
  // its resources back for another task to use meanwhile, and holds none until it ends.
  bool lent = false;
  // Times a worker ended while this task was sent ahead there: it may have started (its
  // worker starts it when the task before it returns, before the daemon hears of that),
  // so a retry is told what it sealed, and these count against its retries but one.
  uint32_t unconfirmed = 0;

  ReadyKey key() const { return {spec.priority, depth, id}; }
  bool on_gpu() const { return request.gpu > 0; }
};

// Whether `a` should start before `b` by the ready queue's order, not counting submission:
// higher priority, or deeper at the same priority (tasks alike are not moved for nothing).
inline bool Outranks(const Task& a, const Task& b) {
  if (a.spec.priority != b.spec.priority) return a.spec.priority > b.spec.priority;
  return a.depth > b.depth;
}

// Tasks by how they ended, and those submitted.
struct GraphCounters {
  uint64_t submitted = 0;
  uint64_t completed = 0;  // done with their outputs
  uint64_t failed = 0;     // by their function, their inputs or their workers' deaths
  uint64_t cancelled = 0;
};

class TaskGraph {
 public:
  // `ready` is told of each task whose inputs have all been sealed (its state still
  // kWaiting); `over`, of each task as it ends (Finish: done, failed or cancelled). Neither
  // may call back into the graph.
  TaskGraph(StoreAccess& store, size_t finished_kept, std::function<void(Task&)> ready,
            std::function<void(const Task&)> over = {});
  ~TaskGraph();
  TaskGraph(const TaskGraph&) = delete;
  TaskGraph& operator=(const TaskGraph&) = delete;

  // Adds `tasks` from `submitter`, all or none (Scheduler::Submit's contract), charging the
  // daemon memory they take to the submitter. `runnable` says whether some worker could
  // ever run a task. Each task admitted waits for its inputs, is ready at once, or fails
  // with an input that failed.
  Result<std::vector<std::vector<ObjectId>>> Add(
      SessionId submitter, std::span<const TaskSpec> tasks,
      const std::function<bool(const TaskSpec&)>& runnable);

  // The task is over: its outputs sealed as failed unless it is done, its inputs let go of,
  // the tasks waiting for its outputs told (those it did not seal fail them, at Settle), and
  // it is kept among the finished (`task` is not valid after). It must be neither in a
  // ready queue nor placed. `reason` is cut to kMaxFailureMessage.
  void Finish(Task& task, TaskState state, std::string_view reason);
  // Fails the tasks waiting for outputs that will not come, until none is left.
  void Settle();

  // Deletes `id` (StoreAccess::Delete) once no pending task reads or makes it; false, doing
  // nothing, when none does now (the caller deletes it itself). For the outputs of tasks
  // whose readers have all been submitted, given up by their submitter; the caller checks
  // that it may delete them.
  bool DeleteAfterTasks(const ObjectId& id);

  // Store events (ObjectEvents): whether they changed anything.
  bool OnSealed(const ObjectId& id, bool failed);
  bool OnFreed(const ObjectId& id);

  // An attempt after the first of `task` starts: the outputs earlier ones sealed are held
  // for it (Task::kept) rather than made again; their indices.
  std::vector<uint32_t> KeepSealedOutputs(Task& task);

  Task* Find(TaskId id);
  const Task* Find(TaskId id) const;
  Task& at(TaskId id) { return *Find(id); }
  // The pending task making `id`, or nullptr.
  Task* ProducerOf(const ObjectId& id);
  const Task* ProducerOf(const ObjectId& id) const;
  // Whether a pending task reads `id`.
  bool IsRead(const ObjectId& id) const;
  // Whether nobody wants `id` any more: it is to be deleted once it goes (DeleteAfterTasks)
  // and no pending task reads it (a graph given up, its readers cancelled).
  bool Unwanted(const ObjectId& id) const {
    auto it = nodes_.find(id);
    return it != nodes_.end() && it->second.deleted && it->second.consumers == 0;
  }
  // Whether a finished task still kept made `id`.
  bool MadeByFinished(const ObjectId& id) const { return finished_outputs_.contains(id); }

  const std::unordered_map<TaskId, std::unique_ptr<Task>>& pending() const { return tasks_; }
  const std::deque<std::unique_ptr<Task>>& finished() const { return finished_; }
  const GraphCounters& counters() const { return counters_; }
  // Objects pending tasks read or make (the graph's memory, for tests).
  size_t nodes() const { return nodes_.size(); }

 private:
  struct Node {
    TaskId producer = 0;          // the pending task making it, 0 if none
    uint32_t consumers = 0;       // pending tasks reading it, per occurrence
    std::vector<TaskId> waiting;  // of those, the ones waiting for its seal
    bool held = false;            // the graph holds a reference (StoreAccess::Hold)
    bool deleted = false;         // to be deleted when it goes (DeleteAfterTasks)
  };

  // Checks a batch: the order to admit it in (producers before consumers), or why not.
  Result<std::vector<size_t>> Validate(std::span<const TaskSpec> tasks,
                                       const std::vector<std::vector<ObjectId>>& outputs,
                                       const std::function<bool(const TaskSpec&)>& runnable) const;
  std::vector<ObjectId> DeriveOutputs(TaskId task, uint32_t count) const;
  void Admit(Task& task);
  // `id` is sealed: the graph holds it for its consumers, and those waiting for it have one
  // input fewer to wait for, unless a pending task makes it (they wait for that task).
  void Sealed(const ObjectId& id);
  // `id` will never be sealed with bytes: the tasks waiting for it fail with `reason`.
  void InputFailed(const ObjectId& id, const std::string& reason);
  void LetGoOfInputs(Task& task);
  // `it` is read and made by no pending task: the graph lets go of it.
  void Erase(std::unordered_map<ObjectId, Node>::iterator it);
  void LetGoOfKept(Task& task);
  void Retire(Task& task);

  StoreAccess& store_;
  const size_t finished_kept_;
  const std::function<void(Task&)> ready_;
  const std::function<void(const Task&)> over_;
  const ObjectId nonce_;  // derived output ids: unique to this daemon
  TaskId next_task_ = 1;
  std::unordered_map<TaskId, std::unique_ptr<Task>> tasks_;  // pending
  std::deque<std::unique_ptr<Task>> finished_;               // kept, oldest first
  std::unordered_map<ObjectId, TaskId> finished_outputs_;    // of the tasks in finished_
  // Outputs of tasks that ended without them, and the reason their readers fail with.
  std::deque<std::pair<ObjectId, std::string>> failures_;
  std::unordered_map<ObjectId, Node> nodes_;
  GraphCounters counters_;
};

}  // namespace depot::scheduler
