// The dispatcher: the daemon's queue of ready tasks, and where each goes.
//
// Ready tasks wait in priority order, then depth first (consumers of data before producers
// of new data, so that a large graph runs in a store much smaller than the sum of its
// intermediates). A round (Round) takes them in that order while some worker's window is
// open, and plans each over every way it may run (its function as is, or its CPU or GPU
// variant: WorkerTable::Ways) with Place (placement.h): the worker and device where it would
// finish first, given where its inputs are now, the workers' queues and the function's
// measured durations. Where a task has two variants the plan expected to finish first wins,
// except that a variant passed over too often is tried again, so that its estimate follows
// changes. Inputs a queued task lacks where it will run are prefetched there. A worker's
// queue keeps the ready queue's order, and a task made ready while every window is full
// takes the place of a queued task it outranks (higher priority, or deeper: a consumer of
// data before a producer of more), which goes back to wait (Preempt). When the ready
// tasks run out while a worker sits idle, tasks queued behind a long wait elsewhere are
// placed afresh (Rebalance).
//
// A task no worker attached could ever run is set aside (stalled) until a worker attaches;
// one its memory bound holds back (bounds.h) waits aside until the bound changes (parked).
// All of it runs on the daemon's loop thread.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <span>
#include <unordered_set>
#include <vector>

#include "scheduler/durations.h"
#include "scheduler/output_sizes.h"
#include "scheduler/placement.h"
#include "scheduler/store_access.h"
#include "scheduler/task_graph.h"
#include "scheduler/worker_table.h"

namespace depot::scheduler {

struct DispatcherOptions {
  Bandwidths bandwidths;
  // Whether placement goes by the store's measured copy bandwidths (where it has measured
  // them) rather than `bandwidths` alone.
  bool measure_bandwidths = true;
  // Places each task on a worker and device chosen at random among those that fit, with no
  // regard for locality or queues: the baseline placement is measured against.
  bool random_placement = false;
};

struct PlacementCounters {
  uint64_t placements = 0;
  uint64_t local_bytes = 0;  // input bytes where placed tasks read them
  uint64_t moved_bytes = 0;  // input bytes that had to be copied there
  uint64_t prefetches = 0;   // inputs asked for ahead of a queued task
  uint64_t steals = 0;       // queued tasks taken from a busy worker to be placed afresh
  uint64_t preemptions = 0;  // queued tasks that gave their place to a ready one (Preempt)
  // How long placements took (a task placed or not): bucket i counts those of
  // (2^(i-1), 2^i] x 64 ns, bucket 0 those up to 64 ns, the last everything longer.
  static constexpr int kBuckets = 20;
  std::array<uint64_t, kBuckets> ns_buckets{};
  uint64_t ns_sum = 0;
  uint64_t tries = 0;
};

class Dispatcher {
 public:
  // `sizes`: what tasks that declare no output size are expected to make (none: nothing).
  Dispatcher(TaskGraph& graph, WorkerTable& workers, StoreAccess& store, DurationModel& durations,
             DispatcherOptions options, const OutputSizes* sizes = nullptr);
  Dispatcher(const Dispatcher&) = delete;
  Dispatcher& operator=(const Dispatcher&) = delete;

  // `task`, whose inputs are all sealed, waits for a worker.
  void MakeReady(Task& task);
  // Takes a placed task off its worker and makes it ready again, to be placed afresh.
  void Requeue(Task& task);
  // `task` leaves the ready queue (it is over).
  void Forget(Task& task);
  // A worker attached: the tasks set aside may find one.
  void Unstall();
  // Places ready tasks while some worker's window is open (workers whose resources were
  // freed start what they queued first). A round stops after a run of tasks that found no
  // place: the rest wait for the next change rather than cost each event a whole scan.
  // With no task left ready and a worker idle, a task queued behind a long wait on another
  // worker (a task running long, or stalled) is placed afresh, once a round for each idle
  // worker: work stealing, so that a straggler holds back only itself.
  void Round();

  // The memory bounds (submitter, bound id) holding back tasks now, with those tasks.
  const std::map<Bounds::Key, std::set<ReadyKey>>& held_back() const { return parked_; }
  // The ready tasks of the bounds that held back a task in the last round, that `stuck`
  // says nothing can make room in any more, and that hold none of their ready tasks; of
  // tasks that wait for their submitter's frees (TaskSpec::bound_waits), only those whose
  // output alone is larger than the bound. The held tasks of a bound with a task that fits
  // now go back to the ready queue. Costs a look at every ready task.
  std::vector<TaskId> OverBound(const std::function<bool(SessionId, uint64_t)>& stuck);

  // The output bytes `task` is expected to make now: declared, or what its kind made.
  uint64_t Expected(const Task& task) const;

  // Whether `task` is set aside for want of a worker that could ever run it.
  bool Stalled(TaskId task) const { return stalled_.contains(task); }
  // Ready tasks: waiting for a place, or held back by their bound.
  size_t ready() const { return ready_.size() + parked_count_; }
  // The bandwidths placement goes by now: measured, or as set.
  Bandwidths bandwidths() const {
    return options_.measure_bandwidths ? store_.CopyBandwidths(options_.bandwidths)
                                       : options_.bandwidths;
  }
  const DispatcherOptions& options() const { return options_; }
  const PlacementCounters& counters() const { return counters_; }

 private:
  struct Plan {
    Choice choice;
    Worker* worker = nullptr;
    bool now = false;  // it starts at once (else it queues there)
    double duration_s = 0;
    const Way* way = nullptr;
  };

  // Round's parts: placing the ready tasks (where a ready task takes the place of a queued
  // one it outranks in a full window: Preempt); and taking queued tasks from busy workers
  // when one is idle (whether any was taken).
  void PlaceReady();
  // Takes the ready task at `it`, held back by its bound, out of the ready queue; the next.
  std::set<ReadyKey>::iterator Park(std::set<ReadyKey>::iterator it);
  // Puts back the tasks of the bounds that changed since the last round / of `key`.
  void Unpark();
  void Unpark(const Bounds::Key& key);
  void Preempt();
  // Whether `task`'s output fits its bound and, for a CPU task, the store's room now.
  bool WouldFit(const Task& task) const;
  // Whether the store has room on `device` for `bytes` more beside what the tasks placed to
  // make their outputs there reserved.
  bool HasRoom(int32_t device, uint64_t bytes) const;
  bool Rebalance();
  // Places one ready task; false if no worker can take it now. Timed (PlacementCounters).
  bool PlaceOne(Task& task);
  bool TryPlace(Task& task);
  // Where `task` would run `way` best now, or nullopt.
  std::optional<Plan> PlanWay(const Task& task, const Way& way, std::span<const SessionId> runners,
                              std::span<const InputView> inputs,
                              const std::function<bool(int32_t)>& has_room);
  // Of two plans for a task with two variants, the one to take, and why.
  const Plan& ChooseVariant(Task& task, const Plan& cpu, const Plan& gpu);
  // Asks for the inputs `task`, queued, lacks where it will read them.
  void Prefetch(const Task& task, std::span<const InputView> inputs);
  // Where a task's inputs are now, those it reads on host marked (InputView::host).
  std::vector<InputView> InputsOf(const TaskSpec& spec) const;
  // Whether some worker attached could ever take the task (for hard affinity: offers the GPU
  // holding most of its input).
  bool CouldEverPlace(const Task& task) const;

  TaskGraph& graph_;
  WorkerTable& workers_;
  StoreAccess& store_;
  DurationModel& durations_;
  const OutputSizes* sizes_;
  DispatcherOptions options_;
  std::set<ReadyKey> ready_;
  std::unordered_set<TaskId> stalled_;  // ready, but for no worker attached: set aside
  // Ready tasks held back by their memory bound, by bound (submitter, bound id): out of the
  // ready queue, so that rounds do not look at them again, until the bound changes (Unpark).
  std::map<Bounds::Key, std::set<ReadyKey>> parked_;
  size_t parked_count_ = 0;
  bool held_by_bound_ = false;  // the last TryPlace's task was held back by its bound
  // This round, by bound: the least output bytes it held back, and whether it held back one
  // of unknown size (its kind not measured yet).
  struct Held {
    uint64_t least = UINT64_MAX;
    bool unknown = false;
  };
  std::map<std::pair<SessionId, uint64_t>, Held> held_at_;
  std::minstd_rand random_;  // for random_placement
  PlacementCounters counters_;
};

}  // namespace depot::scheduler
