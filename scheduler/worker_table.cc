#include "scheduler/worker_table.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "scheduler/durations.h"

namespace depot::scheduler {

namespace {

// Only tasks expected to run shorter than this are sent ahead (pipelined). Sending ahead
// hides the round trip to the daemon between two tasks, which matters only when tasks are
// about as short; and a task sent ahead starts making its outputs before the daemon has let
// go of what the task before it read, which for large data raises the peak of memory in
// use. Until a function has been measured it is not short (DurationModel::kUnmeasured).
constexpr double kSendAheadBelowS = DurationModel::kUnmeasured;

}  // namespace

bool Way::eligible(const Worker& w, const std::string& f) const {
  switch (runs) {
    case Runs::kAsIs:
      return w.runs(f) || (request.gpu > 0 && w.has_gpu_variant(f));
    case Runs::kCpuVariant:
      return w.runs(f);
    case Runs::kGpuVariant:
      return w.has_gpu_variant(f);
  }
  return false;
}

WorkerTable::WorkerTable(TaskGraph& graph, WorkerLink& link, WorkerTableOptions options)
    : graph_(graph), link_(link), options_(std::move(options)) {
  options_.window = std::max<uint32_t>(1, options_.window);
}

Status WorkerTable::Add(SessionId session, WorkerSpec spec) {
  if (workers_.contains(session)) {
    return Status::AlreadyExists("session " + std::to_string(session) + " is a worker already");
  }
  if (spec.functions.size() > kMaxWorkerFunctions ||
      spec.gpu_functions.size() > kMaxWorkerFunctions ||
      spec.capacity.custom.size() > kMaxWorkerResources ||
      spec.capacity.gpus.size() > kMaxWorkerResources) {
    return Status::InvalidArgument(
        "a worker registers at most " + std::to_string(kMaxWorkerFunctions) + " functions and " +
        std::to_string(kMaxWorkerResources) + " GPUs and custom resources");
  }
  if (spec.name.size() > kMaxWorkerName) spec.name.resize(kMaxWorkerName);
  for (const auto* names : {&spec.functions, &spec.gpu_functions}) {
    for (const std::string& f : *names) {
      if (f.empty() || f.size() > kMaxFunctionName) {
        return Status::InvalidArgument("a function name must have 1 to " +
                                       std::to_string(kMaxFunctionName) + " bytes");
      }
    }
  }
  for (const auto& [name, amount] : spec.capacity.custom) {
    if (name.empty() || name.size() > kMaxFunctionName || !std::isfinite(amount)) {
      return Status::InvalidArgument("custom resource '" + name.substr(0, kMaxFunctionName) +
                                     "' needs a name of 1 to " + std::to_string(kMaxFunctionName) +
                                     " bytes and a finite amount");
    }
  }
  if (!std::isfinite(spec.capacity.cpu)) return Status::InvalidArgument("CPU slots must be finite");
  auto resources = Resources::Make(spec.capacity);
  if (!resources.ok()) return resources.status();
  for (auto* names : {&spec.functions, &spec.gpu_functions}) {
    std::sort(names->begin(), names->end());
    names->erase(std::unique(names->begin(), names->end()), names->end());
  }
  auto worker = std::unique_ptr<Worker>(new Worker{.id = session,
                                                   .name = std::move(spec.name),
                                                   .capacity = spec.capacity,
                                                   .resources = std::move(resources).value(),
                                                   .functions = std::move(spec.functions),
                                                   .gpu_functions = std::move(spec.gpu_functions),
                                                   .attached_at = Now()});
  for (const std::string& f : worker->functions) runners_[f].push_back(session);
  for (const std::string& f : worker->gpu_functions) {
    if (!worker->runs(f)) runners_[f].push_back(session);
    ++gpu_variants_[f];
  }
  workers_.emplace(session, std::move(worker));
  return Status::OK();
}

std::vector<std::string> WorkerTable::Remove(Worker& worker) {
  std::vector<std::string> gone;
  auto forget = [&](const std::string& f) {
    auto it = runners_.find(f);
    std::erase(it->second, worker.id);
    if (it->second.empty()) {
      runners_.erase(it);
      gone.push_back(f);
    }
  };
  for (const std::string& f : worker.functions) forget(f);
  for (const std::string& f : worker.gpu_functions) {
    if (!worker.runs(f)) forget(f);
    auto it = gpu_variants_.find(f);
    if (--it->second == 0) gpu_variants_.erase(it);
  }
  workers_.erase(worker.id);
  return gone;
}

Worker* WorkerTable::Find(SessionId session) {
  auto it = workers_.find(session);
  return it == workers_.end() ? nullptr : it->second.get();
}

std::vector<Way> WorkerTable::Ways(const TaskSpec& spec) const {
  const ResourceRequest& asked = spec.resources;
  // A GPU variant runs on one GPU, with no CPU slot, unless the task asks a share itself.
  const ResourceRequest on_gpu =
      asked.gpu > 0 ? asked : ResourceRequest{.cpu = 0, .gpu = 1, .custom = asked.custom};
  const bool has_gpu_variant = gpu_variants_.contains(spec.function);
  switch (spec.variant) {
    case Variant::kCpu:  // asks no GPU (TaskGraph::Add checks)
      return {{.request = asked, .runs = Way::Runs::kCpuVariant}};
    case Variant::kGpu:
      // Where a worker has a GPU variant, only that; else a function run as is, on a GPU.
      return {
          {.request = on_gpu, .runs = has_gpu_variant ? Way::Runs::kGpuVariant : Way::Runs::kAsIs}};
    case Variant::kAuto:
      if (asked.gpu > 0 || !has_gpu_variant) break;
      return {{.request = asked, .runs = Way::Runs::kCpuVariant},
              {.request = on_gpu, .runs = Way::Runs::kGpuVariant}};
  }
  return {{.request = asked, .runs = Way::Runs::kAsIs}};
}

std::span<const SessionId> WorkerTable::Runners(const std::string& function) const {
  auto it = runners_.find(function);
  if (it == runners_.end()) return {};
  return it->second;
}

bool WorkerTable::CouldEverRun(const TaskSpec& spec, std::optional<int32_t> gpu) const {
  const std::span<const SessionId> runners = Runners(spec.function);
  for (const Way& way : Ways(spec)) {
    const bool needs_gpu = gpu && way.request.gpu > 0;
    for (SessionId id : runners) {
      const Worker& w = *workers_.at(id);
      if (!CouldEverTake(w, way, spec.function)) continue;
      if (!needs_gpu || std::find(w.capacity.gpus.begin(), w.capacity.gpus.end(), *gpu) !=
                            w.capacity.gpus.end()) {
        return true;
      }
    }
  }
  return false;
}

double WorkerTable::QueueWait(const Worker& worker) const {
  // A task that has run past its expected duration is expected to run as long again as it
  // has so far: a stalled or underestimated task makes its worker look busier the longer it
  // runs, and new tasks stop queueing behind it.
  const double now = Now();
  double overrun = 0;
  for (TaskId id : worker.running) {
    const Task* task = graph_.Find(id);
    if (task == nullptr || task->after != 0) continue;  // sent ahead: it has not started
    const double elapsed = now - task->started_at;
    if (elapsed > task->duration_s) overrun += elapsed - task->duration_s;
  }
  return (std::max(0.0, worker.pending_s) + overrun) / worker.slots();
}

bool WorkerTable::Place(Worker& worker, Task& task, bool now) {
  task.worker = worker.id;
  task.placed = true;
  worker.pending_s += task.duration_s;
  if (task.reserve > 0) reserved_[task.device] += task.reserve;
  if (options_.bounds != nullptr) {
    task.bound_reserve = options_.bounds->Placed(task.submitter, task.spec, task.reserve);
  }
  if (now && worker.running.size() < kMaxRunningPerWorker &&
      worker.resources.Reserve(task.request, task.device)) {
    Start(worker, task);
    return true;
  }
  task.state = TaskState::kQueued;
  // In the ready queue's order: a consumer of data placed after producers of new data
  // starts before them.
  const ReadyKey key = task.key();
  worker.queue.insert(std::upper_bound(worker.queue.begin(), worker.queue.end(), key,
                                       [&](const ReadyKey& k, TaskId queued) {
                                         return k < graph_.at(queued).key();
                                       }),
                      task.id);
  StartQueued(worker);  // it may fit beside what runs there (a CPU task beside a GPU one)
  return task.state == TaskState::kRunning && task.after == 0;
}

void WorkerTable::StartQueued(Worker& worker, const Task* unless) {
  worker.freed = false;
  for (auto it = worker.queue.begin(); it != worker.queue.end();) {
    Task& task = graph_.at(*it);
    if (worker.running.size() >= kMaxRunningPerWorker) return;
    if (unless != nullptr && Outranks(*unless, task)) {
      worker.freed = true;  // what is left is started once `unless` had its chance
      return;
    }
    if (worker.resources.Reserve(task.request, task.device)) {
      it = worker.queue.erase(it);
      Start(worker, task);
    } else {
      ++it;
    }
  }
  Pipeline(worker);
}

void WorkerTable::Pipeline(Worker& worker) {
  if (!options_.pipeline || worker.draining) return;
  for (auto it = worker.queue.begin(); it != worker.queue.end();) {
    if (worker.running.size() >= kMaxRunningPerWorker) return;
    // In queue order: a task sent ahead never overtakes one queued before it here.
    Task& task = graph_.at(*it);
    if (task.duration_s >= kSendAheadBelowS) return;
    // The end of the line of short tasks of its shape expected to end first: a running task
    // with nothing sent to follow it, itself short (a task sent behind a long one would wait
    // for it while other slots free up), so that what is sent ahead spreads over the
    // worker's slots instead of lining up on one.
    Task* before = nullptr;
    double soonest = std::numeric_limits<double>::infinity();
    for (TaskId id : worker.running) {
      Task& r = graph_.at(id);
      if (r.follower != 0 || r.lent || r.duration_s >= kSendAheadBelowS ||
          r.device != task.device || r.request != task.request) {
        continue;
      }
      // Its line's head started at started_at; each task of the line runs after the last.
      double end = 0;
      const Task* t = &r;
      for (;; t = &graph_.at(t->after)) {
        end += t->duration_s;
        if (t->after == 0) break;
      }
      end += t->started_at;
      if (end < soonest) {
        before = &r;
        soonest = end;
      }
    }
    if (before == nullptr) return;
    it = worker.queue.erase(it);
    before->follower = task.id;
    task.after = before->id;
    ++worker.pipelined;
    Start(worker, task);
  }
}

void WorkerTable::Start(Worker& worker, Task& task) {
  task.state = TaskState::kRunning;
  // A task sent ahead starts, and counts the attempt, when it takes over (Unplace). Runs
  // that may have started on workers that ended count for the worker's view.
  const uint32_t attempt = task.attempts + task.unconfirmed + 1;
  if (task.after == 0) task.attempts = attempt;
  task.started_at = Now();
  worker.running.insert(task.id);
  Assignment& a = outbox_[worker.id].emplace_back(Assignment{.task = task.id,
                                                             .attempt = attempt,
                                                             .device = task.device,
                                                             .spec = &task.spec,
                                                             .outputs = task.outputs,
                                                             .after = task.after});
  if (attempt > 1) a.sealed = graph_.KeepSealedOutputs(task);
}

bool WorkerTable::NoneMoving() const {
  return std::ranges::all_of(workers_, [](const auto& entry) {
    const Worker& w = *entry.second;
    return w.queue.empty() && w.running.size() == w.lent;
  });
}

void WorkerTable::Unplace(Task& task) {
  if (!task.placed) return;
  task.placed = false;
  if (options_.bounds != nullptr) {
    options_.bounds->Unplaced(task.submitter, task.spec, task.bound_reserve);
  }
  if (task.reserve > 0) {
    auto it = reserved_.find(task.device);
    it->second -= task.reserve;
    if (it->second == 0) reserved_.erase(it);
  }
  Worker& w = *workers_.at(task.worker);
  if (task.state == TaskState::kRunning) {
    w.running.erase(task.id);
    if (task.after != 0) {
      // Sent ahead and not started: it held nothing. What was to follow it follows the one
      // before it instead.
      --w.pipelined;
      Task& before = graph_.at(task.after);
      before.follower = task.follower;
      if (task.follower != 0) graph_.at(task.follower).after = task.after;
    } else if (task.follower != 0) {
      // Its resources go to the task sent to follow it, which starts now on the worker.
      --w.pipelined;
      Task& next = graph_.at(task.follower);
      next.after = 0;
      ++next.attempts;
      next.started_at = Now();
    } else {
      if (task.lent) {
        --w.lent;
      } else {
        w.resources.Release({task.request, task.device});
      }
      w.freed = true;
    }
    task.after = 0;
    task.follower = 0;
    task.lent = false;
  } else {
    std::erase(w.queue, task.id);
  }
  w.pending_s = std::max(0.0, w.pending_s - task.duration_s);
}

bool WorkerTable::Lend(Task& task) {
  if (task.state != TaskState::kRunning || task.lent || task.after != 0 || task.follower != 0) {
    return false;
  }
  Worker* w = Find(task.worker);
  // As many lent at once as it has slots: what the tasks that take their place make may
  // have to wait too, and each holds its output in the worker's own memory while it does.
  if (w == nullptr || static_cast<double>(w->lent) >= w->slots()) return false;
  w->resources.Release({task.request, task.device});
  w->freed = true;
  ++w->lent;
  task.lent = true;
  return true;
}

void WorkerTable::Flush() {
  // Taken first: a send may end a session, whose tasks then change state and place.
  auto outbox = std::exchange(outbox_, {});
  for (auto& [worker, assignments] : outbox) {
    // Only what still runs there: an earlier send in this loop may have ended a session.
    std::erase_if(assignments, [&, worker = worker](const Assignment& a) {
      const Task* task = graph_.Find(a.task);
      return task == nullptr || task->state != TaskState::kRunning || task->worker != worker;
    });
    if (assignments.empty()) continue;
    const bool full = workers_.at(worker)->resources.Exhausted();
    for (Assignment& a : assignments) a.worker_full = full;
    link_.Assign(worker, assignments);
  }
}

std::vector<WorkerInfo> WorkerTable::Info() const {
  std::vector<WorkerInfo> out;
  for (const auto& [id, w] : workers_) {
    WorkerInfo info{.id = id,
                    .name = w->name,
                    .capacity = w->capacity,
                    .free_cpu = w->resources.free_cpu(),
                    .functions = w->functions,
                    .gpu_functions = w->gpu_functions,
                    .running = w->running.size() - w->pipelined,
                    .queued = w->queue.size() + w->pipelined,
                    .done = w->done,
                    .failed = w->failed,
                    .draining = w->draining,
                    .attached_s = Now() - w->attached_at};
    for (int32_t d : w->capacity.gpus) {
      info.free_gpu_share.emplace_back(d, w->resources.free_share(d));
    }
    out.push_back(std::move(info));
  }
  return out;
}

}  // namespace depot::scheduler
