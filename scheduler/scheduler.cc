#include "scheduler/scheduler.h"

#include <algorithm>
#include <utility>

namespace depot::scheduler {

Scheduler::Scheduler(StoreAccess& store, WorkerLink& link, SchedulerOptions options)
    : store_(store),
      link_(link),
      options_(std::move(options)),
      graph_(
          store, options_.finished_kept, [this](Task& task) { dispatcher_.MakeReady(task); },
          [this](const Task& task) { bounds_.Leave(task.submitter, task.spec); }),
      workers_(graph_, link,
               {.window = options_.window,
                .pipeline = options_.pipeline,
                .clock = options_.clock,
                .bounds = &bounds_}),
      dispatcher_(graph_, workers_, store, durations_,
                  {.bandwidths = options_.bandwidths,
                   .measure_bandwidths = options_.measure_bandwidths,
                   .random_placement = options_.random_placement},
                  &output_sizes_) {}

Scheduler::~Scheduler() = default;

Status Scheduler::AddWorker(SessionId session, WorkerSpec spec) {
  DEPOT_RETURN_NOT_OK(workers_.Add(session, std::move(spec)));
  // Tasks no worker could run until now may find one.
  dispatcher_.Unstall();
  Dispatch();
  return Status::OK();
}

Status Scheduler::DrainWorker(SessionId session) {
  Worker* w = workers_.Find(session);
  if (w == nullptr) {
    return Status::NotFound("session " + std::to_string(session) + " is not a worker");
  }
  w->draining = true;
  while (!w->queue.empty()) dispatcher_.Requeue(graph_.at(w->queue.front()));
  if (w->running.empty()) {
    Forget(*w);
    link_.Drained(session);
  }
  Dispatch();
  return Status::OK();
}

void Scheduler::RemoveSession(SessionId session) {
  if (Worker* w = workers_.Find(session)) WorkerEnded(*w);
  SubmitterEnded(session);
  Dispatch();
}

void Scheduler::WorkerEnded(Worker& w) {
  w.draining = true;
  while (!w.queue.empty()) dispatcher_.Requeue(graph_.at(w.queue.front()));
  std::vector<TaskId> running(w.running.begin(), w.running.end());
  std::sort(running.begin(), running.end());
  // Tasks sent ahead that the daemon has not seen start go first, before the others hand
  // their resources over to them: back to the queue, or failed when such ends have used up
  // their retries.
  std::erase_if(running, [&](TaskId id) {
    Task& t = graph_.at(id);
    if (t.after == 0) return false;
    if (t.attempts + ++t.unconfirmed > t.spec.retries + 1) {
      Finish(t, TaskState::kFailed,
             "its workers ended " + std::to_string(t.attempts + t.unconfirmed) +
                 " times while it ran or was about to; no retries left");
    } else {
      dispatcher_.Requeue(t);
    }
    return true;
  });
  for (TaskId id : running) {
    Task& t = graph_.at(id);
    if (t.attempts > t.spec.retries) {
      Finish(t, TaskState::kFailed,
             "its worker " + w.name + " (session " + std::to_string(w.id) +
                 ") ended while running it, " + std::to_string(t.attempts) +
                 (t.attempts == 1 ? " time" : " times") + "; no retries left");
    } else {
      ++retried_;
      dispatcher_.Requeue(t);
    }
  }
  Forget(w);
}

void Scheduler::SubmitterEnded(SessionId session) {
  output_sizes_.Forget(session);
  // Its tasks that have not started and whose outputs no other task reads. Consumers are
  // deeper than their producers, so going deepest first lets a task's cancelled consumers
  // let go of its outputs before it is looked at.
  std::vector<Task*> own;
  for (const auto& [id, task] : graph_.pending()) {
    if (task->submitter == session && task->state != TaskState::kRunning && !task->spec.detach) {
      own.push_back(&*task);
    }
  }
  std::sort(own.begin(), own.end(), [](const Task* a, const Task* b) {
    return a->depth != b->depth ? a->depth > b->depth : a->id > b->id;
  });
  for (Task* t : own) {
    if (std::any_of(t->outputs.begin(), t->outputs.end(),
                    [&](const ObjectId& o) { return graph_.IsRead(o); })) {
      continue;
    }
    Finish(*t, TaskState::kCancelled,
           "cancelled: its submitter (session " + std::to_string(session) + ") disconnected");
  }
}

void Scheduler::Forget(Worker& worker) {
  // A function no worker runs any more takes its measurements with it: what the daemon
  // keeps is bounded by what the workers attached register.
  for (const std::string& f : workers_.Remove(worker)) durations_.Forget(f);
}

Result<std::vector<std::vector<ObjectId>>> Scheduler::Submit(SessionId submitter,
                                                             std::span<const TaskSpec> tasks) {
  std::map<uint64_t, uint64_t> bounds;  // those this batch names, by id
  for (size_t i = 0; i < tasks.size(); ++i) {
    if (Status s = bounds_.Check(submitter, tasks[i], bounds); !s.ok()) {
      return Status::InvalidArgument("task " + std::to_string(i) + ": " + s.message());
    }
  }
  // Joined first: a task may end inside Add (an input that failed), leaving its bound.
  for (const TaskSpec& t : tasks) bounds_.Join(submitter, t);
  auto outputs = graph_.Add(submitter, tasks,
                            [&](const TaskSpec& spec) { return workers_.CouldEverRun(spec); });
  if (!outputs.ok()) {
    for (const TaskSpec& t : tasks) bounds_.Leave(submitter, t);
    return outputs;
  }
  Dispatch();
  return outputs;
}

void Scheduler::Finish(Task& task, TaskState state, std::string_view reason) {
  dispatcher_.Forget(task);
  workers_.Unplace(task);
  graph_.Finish(task, state, reason);
}

void Scheduler::Dispatch() {
  // Sending may end a session (a write to a dead worker fails), which comes back here: the
  // tasks it gives back are placed by another round.
  if (dispatching_) {
    dispatch_again_ = true;
    return;
  }
  dispatching_ = true;
  do {
    dispatch_again_ = false;
    graph_.Settle();
    dispatcher_.Round();
    workers_.Flush();
  } while (dispatch_again_);
  dispatching_ = false;
  const auto& held = dispatcher_.held_back();
  if (held.empty()) return;
  const double now = workers_.Now();
  const bool can_spill = store_.CanSpill();
  size_t looks = Bounds::kSpillLooks;  // over every bound this round
  for (const auto& [key, tasks] : held) {
    if (!bounds_.Idle(key.first, key.second)) continue;
    // Nothing of the graph runs that could free room in its bound: with a disk tier, its
    // oldest outputs in memory leave for disk until the first task it holds back fits.
    if (can_spill) {
      const Task& first = graph_.at(tasks.begin()->id);
      bounds_.SpillFor(first.submitter, first.spec, dispatcher_.Expected(first), looks,
                       [this](const ObjectId& id) { return store_.Spill(id); });
    }
    bounds_.HeldBack(key.first, key.second, now);
  }
  if (options_.bounds_stuck) options_.bounds_stuck();
}

void Scheduler::FailStuckBounds(double grace_s) {
  Dispatch();  // afresh: what was freed since may have let the tasks start
  const double now = workers_.Now();
  std::vector<TaskId> stuck = dispatcher_.OverBound([&](SessionId submitter, uint64_t id) {
    return bounds_.Idle(submitter, id) && !bounds_.Spilling(submitter, id) &&
           bounds_.HeldSince(submitter, id) <= now - grace_s;
  });
  for (TaskId id : stuck) {
    Task& t = graph_.at(id);
    Finish(t, TaskState::kFailed,
           Describe(id) + ": " + bounds_.Why(t.submitter, t.spec, dispatcher_.Expected(t)));
  }
  Dispatch();  // what failed, and held tasks that fit now, change what can be placed
}

Status Scheduler::Complete(SessionId worker, std::span<const Completion> completions) {
  Worker* w = workers_.Find(worker);
  if (w == nullptr) {
    return Status::InvalidArgument("session " + std::to_string(worker) + " is not a worker");
  }
  Status result;
  const double now = workers_.Now();
  for (const Completion& c : completions) {
    Task* task = graph_.Find(c.task);
    if (task == nullptr || task->state != TaskState::kRunning || task->worker != worker) {
      if (result.ok()) {
        result = Status::InvalidArgument("task " + std::to_string(c.task) +
                                         " is not running on this worker");
      }
      continue;
    }
    // One sent ahead and reported before the task it followed: its start is not known.
    // Only runs that succeeded are measured: a variant that fails fast must not look fast.
    if (task->after == 0 && c.ok) {
      durations_.Record(DurationModel::Of(task->spec), task->on_gpu(), task->input_bytes,
                        now - task->started_at);
    }
    std::string failure;
    std::vector<StoreAccess::Object> found;
    if (!c.ok) {
      failure = c.message;
    } else {
      found.resize(task->outputs.size());
      store_.Locate(task->outputs, found);
      for (size_t k = 0; k < found.size() && failure.empty(); ++k) {
        if (found[k].state != StoreAccess::State::kSealed) {
          failure = "its worker reported success without sealing output " + task->outputs[k].Hex();
        }
      }
    }
    if (!failure.empty() || !c.ok) {
      ++w->failed;
      store_.AbortCreating(worker, task->outputs);
      Finish(*task, TaskState::kFailed, failure);
      continue;
    }
    ++w->done;
    uint64_t made = 0;
    for (size_t k = 0; k < found.size(); ++k) {
      // Spilled already (for room, before this completion came), an output is on disk only:
      // Locate names no tier for it.
      bounds_.Made(task->submitter, task->spec, task->outputs[k], found[k].where.bytes,
                   /*in_memory=*/found[k].where.tiers != 0);
      made += found[k].where.bytes;
    }
    output_sizes_.Record(task->submitter, task->spec.kind, made);
    Finish(*task, TaskState::kDone, "");
  }
  if (w->draining) {
    if (w->running.empty()) {
      Forget(*w);
      link_.Drained(worker);
    }
  }
  // What its worker queued starts in the round, after any ready task that outranks it (a
  // consumer of what just completed) has had its chance at the freed resources.
  Dispatch();
  return result;
}

std::span<const ObjectId> Scheduler::RunningOutputs(SessionId worker, TaskId task) const {
  const Task* t = graph_.Find(task);
  if (t == nullptr || t->state != TaskState::kRunning || t->worker != worker) return {};
  return t->outputs;
}

TaskId Scheduler::MakesNow(SessionId worker, const ObjectId& id) const {
  const Task* t = graph_.ProducerOf(id);
  const bool now =
      t != nullptr && t->state == TaskState::kRunning && t->worker == worker && t->after == 0;
  return now ? t->id : 0;
}

void Scheduler::LendWhileWaiting(SessionId worker, const ObjectId& id) {
  if (MakesNow(worker, id) == 0) return;
  Task& task = *graph_.ProducerOf(id);
  if (!workers_.Lend(task)) return;
  // What was queued there goes back among the ready tasks: the slot lent is for the ready
  // task that comes first (consumers of data before producers of more, as ready tasks are
  // ordered), not for the producer queued next, which would wait for room too.
  Worker& w = *workers_.Find(worker);
  const std::vector<TaskId> queued(w.queue.begin(), w.queue.end());
  for (TaskId id : queued) dispatcher_.Requeue(graph_.at(id));
  Dispatch();
}

std::string Scheduler::Describe(TaskId id) const {
  std::string out = "task " + std::to_string(id);
  if (const Task* t = graph_.Find(id)) {
    out += t->spec.label.empty() ? " of '" + t->spec.function + "'" : " (" + t->spec.label + ")";
  }
  return out;
}

size_t Scheduler::StartedTasks() const {
  size_t n = 0;
  for (const auto& [id, w] : workers_.workers()) n += w->running.size() - w->pipelined;
  return n;
}

std::vector<Scheduler::CancelOutcome> Scheduler::Cancel(std::span<const ObjectId> outputs) {
  std::vector<CancelOutcome> outcomes;
  outcomes.reserve(outputs.size());
  for (const ObjectId& id : outputs) {
    if (Task* task = graph_.ProducerOf(id)) {
      if (task->state == TaskState::kRunning) {
        outcomes.push_back(CancelOutcome::kRunning);
        continue;
      }
      Finish(*task, TaskState::kCancelled, "cancelled");
      outcomes.push_back(CancelOutcome::kCancelled);
      continue;
    }
    outcomes.push_back(graph_.MadeByFinished(id) ? CancelOutcome::kFinished
                                                 : CancelOutcome::kUnknown);
  }
  Dispatch();
  return outcomes;
}

std::vector<bool> Scheduler::DeleteAfterTasks(std::span<const ObjectId> ids) {
  std::vector<bool> later;
  later.reserve(ids.size());
  for (const ObjectId& id : ids) later.push_back(graph_.DeleteAfterTasks(id));
  return later;
}

void Scheduler::OnSealed(const ObjectId& id, bool failed) {
  if (graph_.OnSealed(id, failed)) Dispatch();
}

void Scheduler::OnFreed(const ObjectId& id) {
  // Room in a bound lets its tasks start; an input gone fails its readers.
  const bool room = bounds_.Freed(id);
  if (graph_.OnFreed(id) || room) Dispatch();
}

void Scheduler::OnMemory(const ObjectId& id, bool in_memory) {
  // An output of a bound left memory (room for its tasks) or came back into it.
  if (bounds_.Moved(id, in_memory)) Dispatch();
}

std::vector<WorkerInfo> Scheduler::Workers() const { return workers_.Info(); }

TaskInfo Scheduler::Describe(const Task& t) const {
  // A task sent ahead waits on its worker for the one before it: queued, as people see it.
  const bool ahead = t.state == TaskState::kRunning && t.after != 0;
  TaskInfo info{.id = t.id,
                .function = t.spec.function,
                .state = ahead ? TaskState::kQueued : t.state,
                .submitter = t.submitter,
                .worker = t.worker,
                .device = t.device,
                .outputs = t.outputs,
                .priority = t.spec.priority,
                .attempts = t.attempts,
                .inputs_missing = t.missing,
                .local_bytes = t.choice.local_bytes,
                .moved_bytes = t.choice.moved_bytes,
                .wait_s = t.choice.finish_s - t.choice.transfer_s - t.duration_s,
                .transfer_s = t.choice.transfer_s,
                .duration_s = t.duration_s,
                .reason = t.reason,
                .variant = t.variant,
                .variant_reason = t.variant_reason,
                .label = t.spec.label};
  if (ahead) {
    info.reason = "sent to its worker, to start when task " + std::to_string(t.after) + " ends";
  } else if (t.state == TaskState::kReady) {
    const uint64_t bytes = dispatcher_.Expected(t);
    if (!workers_.CouldEverRun(t.spec)) {
      info.reason =
          "no worker attached can run '" + t.spec.function + "' with the resources it asks for";
    } else if (!bounds_.Fits(t.submitter, t.spec, bytes)) {
      info.reason = "its graph's memory bound has no room for the " + std::to_string(bytes) +
                    " output bytes it declared (or its kind made) now";
    } else if (dispatcher_.Stalled(t.id)) {
      info.reason = "no worker attached offers the GPU holding its inputs (hard affinity)";
    } else {
      info.reason = bytes == 0 ? "no worker has room for it now"
                               : "no worker has room for it now, or the store none for the " +
                                     std::to_string(bytes) +
                                     " output bytes it declared (or its kind made) beside those of "
                                     "the tasks placed before it";
    }
  }
  return info;
}

std::vector<TaskInfo> Scheduler::Tasks(size_t limit) const {
  std::vector<const Task*> pending;
  for (const auto& [id, t] : graph_.pending()) pending.push_back(&*t);
  std::sort(pending.begin(), pending.end(), [](auto* a, auto* b) { return a->id < b->id; });
  std::vector<TaskInfo> out;
  for (const Task* t : pending) {
    if (out.size() == limit) return out;
    out.push_back(Describe(*t));
  }
  for (const auto& t : graph_.finished()) {
    if (out.size() == limit) return out;
    out.push_back(Describe(*t));
  }
  return out;
}

SchedulerCounters Scheduler::counters() const {
  const GraphCounters& g = graph_.counters();
  const PlacementCounters& p = dispatcher_.counters();
  return {.submitted = g.submitted,
          .completed = g.completed,
          .failed = g.failed,
          .cancelled = g.cancelled,
          .retried = retried_,
          .placements = p.placements,
          .local_bytes = p.local_bytes,
          .moved_bytes = p.moved_bytes,
          .prefetches = p.prefetches,
          .steals = p.steals,
          .preemptions = p.preemptions,
          .workers = workers_.workers().size(),
          .tasks_pending = graph_.pending().size(),
          .placement_ns_buckets = p.ns_buckets,
          .placement_ns_sum = p.ns_sum,
          .placement_tries = p.tries};
}

}  // namespace depot::scheduler
