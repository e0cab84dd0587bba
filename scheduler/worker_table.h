// The worker table: the worker processes attached, what each runs and has free, and the
// tasks placed on each.
//
// A worker runs as many tasks as its resources fit (resources.h: never oversubscribed) and
// keeps a short queue, its window, of tasks placed on it and waiting for their resources; the
// rest wait in the daemon (dispatcher.h) so that each placement sees fresh locality. Tasks
// are sent to a worker (WorkerLink) when they start, batched until Flush. With pipelining,
// a short task queued on a busy worker is sent ahead, to start on the resources of a task of
// its shape running there when that one returns, with no round trip to the daemon between.
//
// It chooses nothing: the dispatcher says where a task goes (Place); the table starts it,
// queues it, or sends it ahead, and gives back what it held when it leaves (Unplace). All of
// it runs on the daemon's loop thread.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "depot/object_id.h"
#include "depot/status.h"
#include "scheduler/bounds.h"
#include "scheduler/placement.h"
#include "scheduler/resources.h"
#include "scheduler/task.h"
#include "scheduler/task_graph.h"

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
  // With the tasks sent with it, the worker has nothing free that a task could start on:
  // until one of them ends it gets only tasks that follow them (Resources::Exhausted).
  bool worker_full = false;
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

struct Worker {
  SessionId id = 0;
  std::string name;
  Capacity capacity;
  Resources resources;
  std::vector<std::string> functions;      // sorted
  std::vector<std::string> gpu_functions;  // sorted
  std::unordered_set<TaskId> running;
  std::deque<TaskId> queue;  // placed here, waiting for resources, in ReadyKey order
  size_t pipelined = 0;      // of `running`, those sent ahead that have not taken over yet
  size_t lent = 0;           // of `running`, those waiting for room that lent what they held
  double pending_s = 0;      // expected seconds of its running and queued tasks
  uint64_t done = 0;
  uint64_t failed = 0;
  bool draining = false;
  bool freed = false;  // resources were released since its queue was last looked at
  double attached_at = 0;

  double slots() const {
    return std::max(1.0, capacity.cpu + static_cast<double>(capacity.gpus.size()));
  }
  bool runs(const std::string& f) const {
    return std::binary_search(functions.begin(), functions.end(), f);
  }
  bool has_gpu_variant(const std::string& f) const {
    return std::binary_search(gpu_functions.begin(), gpu_functions.end(), f);
  }
};

// One way to run a task: with `request`, on the workers that `eligible` says run it so.
struct Way {
  enum class Runs : uint8_t {
    kAsIs,        // its function, as registered (on host, or on a GPU it asks for)
    kCpuVariant,  // the function's CPU variant (a worker with two, or one that runs it as is)
    kGpuVariant,  // the function's GPU variant
  };
  ResourceRequest request;
  Runs runs = Runs::kAsIs;
  bool eligible(const Worker& w, const std::string& f) const;
};

struct WorkerTableOptions {
  // Tasks a worker may have placed on it beyond those running (at least 1).
  uint32_t window = 2;
  // Whether short tasks queued on a busy worker are sent ahead (SchedulerOptions::pipeline).
  bool pipeline = true;
  // Seconds since some fixed point.
  std::function<double()> clock;
  // The memory bounds of groups of tasks, told what is placed and unplaced (none: no task
  // names one).
  Bounds* bounds = nullptr;
};

class WorkerTable {
 public:
  WorkerTable(TaskGraph& graph, WorkerLink& link, WorkerTableOptions options);
  WorkerTable(const WorkerTable&) = delete;
  WorkerTable& operator=(const WorkerTable&) = delete;

  // Attaches `session` as a worker. InvalidArgument for bad resources or a function name
  // that is empty or too long, AlreadyExists if it is a worker already.
  Status Add(SessionId session, WorkerSpec spec);
  // Detaches a worker with nothing placed on it; the functions no worker runs any more.
  std::vector<std::string> Remove(Worker& worker);
  Worker* Find(SessionId session);
  const std::map<SessionId, std::unique_ptr<Worker>>& workers() const { return workers_; }

  // The ways a task may run: with which resources, on which workers.
  std::vector<Way> Ways(const TaskSpec& spec) const;
  // Workers registering the task's function (as is or as a variant).
  std::span<const SessionId> Runners(const std::string& function) const;
  // Whether some worker attached and not draining could ever run `spec`, idle; with `gpu`,
  // a way on a GPU needs a worker offering that one.
  bool CouldEverRun(const TaskSpec& spec, std::optional<int32_t> gpu = std::nullopt) const;
  // Whether `worker`, not draining, could ever run `function` `way`, idle.
  static bool CouldEverTake(const Worker& worker, const Way& way, const std::string& function) {
    return !worker.draining && way.eligible(worker, function) &&
           worker.resources.CouldEverFit(way.request);
  }

  // Whether `worker` may have one more task placed on it (its window is not full).
  bool Open(const Worker& worker) const {
    return !worker.draining && Waiting(worker) < options_.window;
  }
  // Tasks placed on `worker` and not started: queued in the daemon, or sent ahead.
  size_t Waiting(const Worker& worker) const { return worker.queue.size() + worker.pipelined; }
  // Seconds until `worker` could start one more task, by the expected durations of its own;
  // a running task past its expected duration counts as running as long again as it has.
  // Costs a look at each task running there.
  double QueueWait(const Worker& worker) const;

  // Places `task` on `worker`, with the request, device and duration the dispatcher set in
  // it: started at once when `now` (the dispatcher offers that only where nothing is
  // queued) and it fits, queued otherwise (and sent ahead where it can be). Whether it
  // started at once. Its output bytes (Task::reserve: declared, or expected of its kind) are
  // reserved on its device until it is unplaced.
  bool Place(Worker& worker, Task& task, bool now);
  // Output bytes declared by the tasks placed to make their outputs on `device` (queued,
  // sent ahead or running): room the store may not count as taken yet.
  uint64_t Reserved(int32_t device) const {
    auto it = reserved_.find(device);
    if (it == reserved_.end()) return 0;
    constexpr uint64_t kMost = std::numeric_limits<uint64_t>::max();
    return it->second > kMost ? kMost : static_cast<uint64_t>(it->second);
  }
  // Whether every task placed on a worker, if any, waits for room (lent what it held): none
  // will end or free anything by itself. A ready task whose declared output finds no room
  // then starts all the same (Dispatcher): a declaration never holds a graph up for good.
  bool NoneMoving() const;
  // Starts the tasks queued on `worker` that fit now, in queue order; with `unless`, only
  // until one that `unless` outranks (the worker stays marked freed then).
  void StartQueued(Worker& worker, const Task* unless = nullptr);
  // Takes a placed (queued or running) task off its worker, giving back what it held there.
  void Unplace(Task& task);
  // Sends what started since the last Flush, a message per worker, and only what still runs
  // there (a send may end a session).
  void Flush();
  // `task` (running on its worker, not sent ahead) waits for room for an output: its
  // resources go back to its worker for another task to use meanwhile (a reader of what
  // holds the room, most often), and it holds none until it ends. False, changing nothing,
  // for a task lent already, not started, or with a task sent to follow it (which would take
  // over what it holds), and on a worker with as many lent already as it has slots.
  bool Lend(Task& task);

  std::vector<WorkerInfo> Info() const;
  double Now() const { return options_.clock ? options_.clock() : 0; }
  const Bounds* bounds() const { return options_.bounds; }
  Bounds* bounds() { return options_.bounds; }

 private:
  void Start(Worker& worker, Task& task);
  // Sends the tasks queued on `worker` that can follow a task running there (Assignment's
  // `after`).
  void Pipeline(Worker& worker);

  TaskGraph& graph_;
  WorkerLink& link_;
  WorkerTableOptions options_;
  std::map<SessionId, std::unique_ptr<Worker>> workers_;
  std::unordered_map<std::string, std::vector<SessionId>> runners_;  // function -> workers
  std::unordered_map<std::string, size_t> gpu_variants_;             // function -> workers with one
  std::unordered_map<SessionId, std::vector<Assignment>> outbox_;
  // By device: Reserved, exact (declarations are each up to 2**64 - 1).
  std::map<int32_t, unsigned __int128> reserved_;
};

}  // namespace depot::scheduler
