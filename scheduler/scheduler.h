// The scheduler: tasks that clients submit, the workers that run them, and where each runs.
//
// A façade over three parts, each with its own header and tests:
// - the task graph (task_graph.h): tasks, what they read and make, references the graph
//   holds, and failure cascades;
// - the worker table (worker_table.h): workers, their resources, windows and queues, and
//   pipelining;
// - the dispatcher (dispatcher.h): the ready queue and placement plans over placement.h.
// The Scheduler wires their events: a task the graph finds ready goes to the dispatcher; a
// task that ends leaves the dispatcher's queue and its worker before the graph finishes it;
// and after each change it dispatches (the graph settles failures, the dispatcher places,
// the worker table sends what started).
//
// A task waits until its inputs are sealed, then joins the ready queue. Placement puts a
// ready task on the worker and device where it would finish first. A task whose function
// fails, or whose worker died more often than its retries allow, seals its outputs as
// failed with the reason; a task reading a failed object fails with it.
//
// All of it runs on the daemon's loop thread. Store events come in through ObjectEvents.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "depot/object_id.h"
#include "depot/status.h"
#include "scheduler/bounds.h"
#include "scheduler/dispatcher.h"
#include "scheduler/durations.h"
#include "scheduler/output_sizes.h"
#include "scheduler/placement.h"
#include "scheduler/resources.h"
#include "scheduler/store_access.h"
#include "scheduler/task.h"
#include "scheduler/task_graph.h"
#include "scheduler/worker_table.h"

namespace depot::scheduler {

// What a worker reports of one task it ran.
struct Completion {
  TaskId task = 0;
  bool ok = true;
  std::string message;  // why it failed (cut to kMaxFailureMessage)
};

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
  std::string label;  // TaskSpec::label
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
  uint64_t steals = 0;         // queued tasks taken from a busy worker for an idle one
  uint64_t preemptions = 0;    // queued tasks that gave their place to one outranking them
  uint64_t workers = 0;        // attached now
  uint64_t tasks_pending = 0;  // waiting, ready, queued or running
  // How long placements took (a task placed or not): bucket i counts those of
  // (2^(i-1), 2^i] x 64 ns, bucket 0 those up to 64 ns, the last everything longer.
  static constexpr int kPlacementBuckets = PlacementCounters::kBuckets;
  std::array<uint64_t, kPlacementBuckets> placement_ns_buckets{};
  uint64_t placement_ns_sum = 0;
  uint64_t placement_tries = 0;
  // Workers' creates of task outputs that found no room (the daemon's RoomWaits fills these
  // in): waiting now, ever waited, and failed once nothing could free room.
  uint64_t room_waiting = 0;
  uint64_t room_waits = 0;
  uint64_t room_waits_failed = 0;
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
  // Called after a dispatch that held back a task for its memory bound (Bounds): the caller
  // calls FailStuckBounds a grace period later (the inputs of a task that ended are freed a
  // moment after it ends, which may make the room).
  std::function<void()> bounds_stuck;
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
  // The task making `id` if its function runs on `worker` now (started, not sent ahead to
  // follow another), else 0.
  TaskId MakesNow(SessionId worker, const ObjectId& id) const;
  // Tasks whose functions run now, on every worker (not those sent ahead).
  size_t StartedTasks() const;
  // How people know task `id` in a message: "task N" and its label (its function's name if
  // it has none).
  std::string Describe(TaskId id) const;
  // Fails the ready tasks of memory bounds that nothing can make room in any more (no task
  // of the bound is placed, none of its ready tasks fits, none of its outputs is leaving
  // memory for disk (Bounds::SpillFor), and so it has been for `grace_s` seconds with
  // nothing of the bound changing: Bounds::HeldSince), naming each, its size
  // and the bound, rather than let them wait for ever (Dispatcher::OverBound). A task that
  // waits for its submitter's frees (TaskSpec::bound_waits) fails only if its output alone
  // is larger than the bound.
  void FailStuckBounds(double grace_s);
  // The task making `id` on `worker` waits for room for it: its resources go to another
  // task meanwhile (WorkerTable::Lend), placed at once in ready order, the tasks queued on
  // that worker among the others.
  void LendWhileWaiting(SessionId worker, const ObjectId& id);
  // Whether nobody wants `id` any more (TaskGraph::Unwanted): a create of it need not wait.
  bool Unwanted(const ObjectId& id) const { return graph_.Unwanted(id); }

  enum class CancelOutcome : uint8_t { kCancelled, kRunning, kFinished, kUnknown };
  // Cancels the tasks producing `outputs` that have not started: their outputs are sealed as
  // failed ("cancelled"), which fails the tasks reading them. One outcome per id: kRunning
  // for a task already running (it finishes), kFinished for one done or failed, kUnknown for
  // an id no task of this daemon produces.
  std::vector<CancelOutcome> Cancel(std::span<const ObjectId> outputs);

  // For each of `ids`, whether it is deleted once no pending task reads or makes it (true),
  // or no pending task does now (false: the caller deletes it at once). TaskGraph's
  // DeleteAfterTasks.
  std::vector<bool> DeleteAfterTasks(std::span<const ObjectId> ids);

  // ObjectEvents.
  void OnSealed(const ObjectId& id, bool failed) override;
  void OnFreed(const ObjectId& id) override;
  void OnMemory(const ObjectId& id, bool in_memory) override;

  std::vector<WorkerInfo> Workers() const;
  // Pending tasks in id order, then the finished ones kept; at most `limit` of them.
  std::vector<TaskInfo> Tasks(size_t limit = SIZE_MAX) const;
  SchedulerCounters counters() const;
  // The bandwidths placement goes by now: measured, or as set.
  Bandwidths bandwidths() const { return dispatcher_.bandwidths(); }
  bool bandwidths_measured() const { return options_.measure_bandwidths; }
  bool random_placement() const { return options_.random_placement; }

 private:
  // The task is over (Finish): out of the ready queue and off its worker, then finished in
  // the graph.
  void Finish(Task& task, TaskState state, std::string_view reason);
  // Settles the graph's failures, places ready tasks while workers have room, and sends
  // what started, a message per worker. Again while a send changed anything.
  void Dispatch();
  // The worker is gone: the measurements of functions no worker runs any more go with it.
  void Forget(Worker& worker);
  // A worker session ended: its queued tasks go back to the ready queue, its running ones
  // too up to their retries, then fail.
  void WorkerEnded(Worker& worker);
  // A submitter's session ended: its tasks not started, and whose outputs no other task
  // reads, are cancelled.
  void SubmitterEnded(SessionId session);
  TaskInfo Describe(const Task& task) const;

  StoreAccess& store_;
  WorkerLink& link_;
  SchedulerOptions options_;
  DurationModel durations_;
  OutputSizes output_sizes_;
  Bounds bounds_;
  TaskGraph graph_;
  WorkerTable workers_;
  Dispatcher dispatcher_;
  uint64_t retried_ = 0;
  bool dispatching_ = false;
  bool dispatch_again_ = false;
};

}  // namespace depot::scheduler
