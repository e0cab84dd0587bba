#include "scheduler/scheduler.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <limits>
#include <numeric>
#include <utility>

#include "depot/ipc/units.h"

namespace depot::scheduler {

namespace {

// A dispatch stops after this many ready tasks in a row found no worker: the rest wait for
// the next change (a completion, a worker, a seal) rather than cost each event a whole scan.
// Tasks of a shape that found none are passed over without counting (DispatchRound).
constexpr int kMaxMissesPerDispatch = 64;
constexpr size_t kMaxShapesPerDispatch = 64;

// What a task costs the daemon's memory besides its strings and ids, and what an id costs
// (in the task, and in the graph's index of objects).
constexpr uint64_t kTaskBytes = 512;
constexpr uint64_t kIdBytes = 96;

std::string Cut(std::string_view message) {
  return std::string(message.substr(0, kMaxFailureMessage));
}

std::string TaskName(size_t index) { return "task " + std::to_string(index) + ": "; }

// Only tasks expected to run shorter than this are sent ahead (pipelined). Sending ahead
// hides the round trip to the daemon between two tasks, which matters only when tasks are
// about as short; and a task sent ahead starts making its outputs before the daemon has let
// go of what the task before it read, which for large data raises the peak of memory in
// use. Until a function has been measured it is not short (DurationModel::kUnmeasured).
constexpr double kSendAheadBelowS = DurationModel::kUnmeasured;

// A variant passed over this many times in a row, for tasks of its function and input size,
// is chosen once more: so that its estimate follows changes, and one slow run is not its last.
constexpr uint32_t kExploreEvery = 32;

bool Finite(double x) { return std::isfinite(x); }

// 0, or from kMinResourceAmount on.
bool Amount(double x) { return Finite(x) && (x == 0 || x >= kMinResourceAmount); }

Status CheckResources(const ResourceRequest& r) {
  const std::string least = " (1/1024 at least when not 0)";
  if (!Amount(r.cpu)) return Status::InvalidArgument("CPU must be 0 or more" + least);
  if (!Amount(r.gpu) || r.gpu > 1) {
    return Status::InvalidArgument("GPU must be a share of one device, from 0 to 1" + least);
  }
  if (r.cpu == 0 && r.gpu == 0) {
    return Status::InvalidArgument("a task must ask for some CPU or GPU");
  }
  for (const auto& [name, amount] : r.custom) {
    if (name.empty() || name.size() > kMaxFunctionName) {
      return Status::InvalidArgument("a custom resource needs a name of 1 to " +
                                     std::to_string(kMaxFunctionName) + " bytes");
    }
    if (!Amount(amount)) {
      return Status::InvalidArgument("resource " + name + " must be 0 or more" + least);
    }
  }
  return Status::OK();
}

}  // namespace

std::string_view TaskStateName(TaskState state) {
  switch (state) {
    case TaskState::kWaiting:
      return "waiting";
    case TaskState::kReady:
      return "ready";
    case TaskState::kQueued:
      return "queued";
    case TaskState::kRunning:
      return "running";
    case TaskState::kDone:
      return "done";
    case TaskState::kFailed:
      return "failed";
    case TaskState::kCancelled:
      return "cancelled";
  }
  return "unknown";
}

struct Scheduler::Task {
  TaskId id = 0;
  SessionId submitter = 0;
  TaskSpec spec;
  std::vector<ObjectId> outputs;
  TaskState state = TaskState::kWaiting;
  uint32_t missing = 0;  // inputs not sealed yet, counted per occurrence
  uint32_t depth = 0;    // 1 + the deepest pending producer of its inputs
  uint32_t attempts = 0;
  SessionId worker = 0;  // where it was placed last
  int32_t device = kHostMemory;
  bool placed = false;    // queued or running on `worker`
  double duration_s = 0;  // expected; counted in its worker's pending_s while placed
  double started_at = 0;
  uint64_t charged = 0;  // to its submitter (StoreAccess::Charge), until it is over
  Choice choice;         // the placement's terms
  std::string reason;
  // Outputs an earlier attempt sealed before its worker died, held (StoreAccess::Hold) from
  // the start of the attempt told of them until the task is over: that attempt does not
  // make them again, so they must not be evicted meanwhile.
  std::vector<ObjectId> kept;
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
  // Times a worker ended while this task was sent ahead there: it may have started (its
  // worker starts it when the task before it returns, before the daemon hears of that),
  // so a retry is told what it sealed, and these count against its retries but one.
  uint32_t unconfirmed = 0;

  ReadyKey key() const { return {spec.priority, depth, id}; }
  bool on_gpu() const { return request.gpu > 0; }
  // Whether it runs on a GPU in any case (it asks for one, or for the GPU variant).
  bool asks_gpu() const { return spec.resources.gpu > 0 || spec.variant == Variant::kGpu; }
};

struct Scheduler::Worker {
  SessionId id = 0;
  std::string name;
  Capacity capacity;
  Resources resources;
  std::vector<std::string> functions;      // sorted
  std::vector<std::string> gpu_functions;  // sorted
  std::unordered_set<TaskId> running;
  std::deque<TaskId> queue;  // placed here, waiting for resources
  size_t pipelined = 0;      // of `running`, those sent ahead that have not taken over yet
  double pending_s = 0;      // expected seconds of its running and queued tasks
  uint64_t done = 0;
  uint64_t failed = 0;
  bool draining = false;
  bool freed = false;      // resources were released since its queue was last looked at
  double attached_at = 0;  // options_.clock

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
struct Scheduler::Way {
  enum class Runs : uint8_t {
    kAsIs,        // its function, as registered (on host, or on a GPU it asks for)
    kCpuVariant,  // the function's CPU variant (a worker with two, or one that runs it as is)
    kGpuVariant,  // the function's GPU variant
  };
  ResourceRequest request;
  Runs runs = Runs::kAsIs;
  bool eligible(const Worker& w, const std::string& f) const {
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
};

struct Scheduler::Plan {
  Choice choice;
  Worker* worker = nullptr;
  bool now = false;  // it starts at once (else it queues there)
  double duration_s = 0;
  const Way* way = nullptr;
};

struct Scheduler::Node {
  TaskId producer = 0;          // the pending task making it, 0 if none
  uint32_t consumers = 0;       // pending tasks reading it, per occurrence
  std::vector<TaskId> waiting;  // of those, the ones waiting for its seal
  bool held = false;            // the graph holds a reference (StoreAccess::Hold)
};

Scheduler::Scheduler(StoreAccess& store, WorkerLink& link, SchedulerOptions options)
    : store_(store), link_(link), options_(std::move(options)), nonce_(ObjectId::Random()) {
  options_.window = std::max<uint32_t>(1, options_.window);
}

Scheduler::~Scheduler() {
  for (auto& [id, node] : nodes_) {
    if (node.held) store_.Drop(id);
  }
  for (auto& [id, task] : tasks_) LetGoOfKept(*task);
}

void Scheduler::LetGoOfKept(Task& task) {
  for (const ObjectId& o : task.kept) store_.Drop(o);
  task.kept.clear();
}

Status Scheduler::AddWorker(SessionId session, WorkerSpec spec) {
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
    if (name.empty() || name.size() > kMaxFunctionName || !Finite(amount)) {
      return Status::InvalidArgument("custom resource '" + name.substr(0, kMaxFunctionName) +
                                     "' needs a name of 1 to " + std::to_string(kMaxFunctionName) +
                                     " bytes and a finite amount");
    }
  }
  if (!Finite(spec.capacity.cpu)) return Status::InvalidArgument("CPU slots must be finite");
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
  // Tasks no worker could run until now may find one.
  for (TaskId id : std::exchange(stalled_, {})) ready_.insert(tasks_.at(id)->key());
  Dispatch();
  return Status::OK();
}

Status Scheduler::DrainWorker(SessionId session) {
  auto it = workers_.find(session);
  if (it == workers_.end()) {
    return Status::NotFound("session " + std::to_string(session) + " is not a worker");
  }
  Worker& w = *it->second;
  w.draining = true;
  while (!w.queue.empty()) Requeue(*tasks_.at(w.queue.front()));
  if (w.running.empty()) {
    ForgetWorker(w);
    link_.Drained(session);
  }
  Dispatch();
  return Status::OK();
}

void Scheduler::RemoveSession(SessionId session) {
  if (auto it = workers_.find(session); it != workers_.end()) {
    Worker& w = *it->second;
    w.draining = true;
    while (!w.queue.empty()) Requeue(*tasks_.at(w.queue.front()));
    std::vector<TaskId> running(w.running.begin(), w.running.end());
    std::sort(running.begin(), running.end());
    // Tasks sent ahead that the daemon has not seen start go first, before the others
    // hand their resources over to them: back to the queue, or failed when such ends have
    // used up their retries.
    std::erase_if(running, [&](TaskId id) {
      Task& t = *tasks_.at(id);
      if (t.after == 0) return false;
      if (t.attempts + ++t.unconfirmed > t.spec.retries + 1) {
        Finish(t, TaskState::kFailed,
               "its workers ended " + std::to_string(t.attempts + t.unconfirmed) +
                   " times while it ran or was about to; no retries left");
      } else {
        Requeue(t);
      }
      return true;
    });
    for (TaskId id : running) {
      Task& t = *tasks_.at(id);
      if (t.attempts > t.spec.retries) {
        Finish(t, TaskState::kFailed,
               "its worker " + w.name + " (session " + std::to_string(session) +
                   ") ended while running it, " + std::to_string(t.attempts) +
                   (t.attempts == 1 ? " time" : " times") + "; no retries left");
      } else {
        ++counters_.retried;
        Requeue(t);
      }
    }
    ForgetWorker(w);
  }

  // As a submitter: cancel its tasks that have not started and whose outputs no other task
  // reads. Consumers are deeper than their producers, so going deepest first lets a task's
  // cancelled consumers let go of its outputs before it is looked at.
  std::vector<Task*> own;
  for (auto& [id, task] : tasks_) {
    if (task->submitter == session && task->state != TaskState::kRunning && !task->spec.detach) {
      own.push_back(&*task);
    }
  }
  std::sort(own.begin(), own.end(), [](const Task* a, const Task* b) {
    return a->depth != b->depth ? a->depth > b->depth : a->id > b->id;
  });
  for (Task* t : own) {
    const bool read_by_others = std::any_of(t->outputs.begin(), t->outputs.end(), [&](auto& o) {
      auto it = nodes_.find(o);
      return it != nodes_.end() && it->second.consumers > 0;
    });
    if (read_by_others) continue;
    Finish(*t, TaskState::kCancelled,
           "cancelled: its submitter (session " + std::to_string(session) + ") disconnected");
  }
  Dispatch();
}

Result<std::vector<std::vector<ObjectId>>> Scheduler::Submit(SessionId submitter,
                                                             std::span<const TaskSpec> tasks) {
  std::vector<std::vector<ObjectId>> outputs(tasks.size());
  for (size_t i = 0; i < tasks.size(); ++i) {
    const TaskSpec& spec = tasks[i];
    if (!spec.outputs.empty()) {
      outputs[i] = spec.outputs;
    } else if (spec.num_outputs >= 1 && spec.num_outputs <= kMaxOutputs) {
      outputs[i] = DeriveOutputs(next_task_ + i, spec.num_outputs);
    }
  }
  auto order = Validate(tasks, outputs);
  if (!order.ok()) return order.status();
  // The daemon memory the batch takes, counted against its submitter until each task is over.
  std::vector<uint64_t> costs(tasks.size());
  uint64_t total = 0;
  for (size_t i = 0; i < tasks.size(); ++i) {
    const TaskSpec& t = tasks[i];
    costs[i] = kTaskBytes + t.function.size() + t.args.size() +
               (t.inputs.size() + outputs[i].size()) * kIdBytes +
               t.host_inputs.size() * sizeof(uint32_t);
    total += costs[i];
  }
  DEPOT_RETURN_NOT_OK(store_.Charge(submitter, static_cast<int64_t>(total)));

  const TaskId first = next_task_;
  next_task_ += tasks.size();
  std::vector<Task*> made(tasks.size());
  for (size_t i = 0; i < tasks.size(); ++i) {
    auto task = std::make_unique<Task>();
    task->id = first + i;
    task->submitter = submitter;
    task->spec = tasks[i];
    task->spec.outputs.clear();
    task->request = task->spec.resources;
    task->outputs = outputs[i];
    task->charged = costs[i];
    for (const ObjectId& o : task->outputs) nodes_[o].producer = task->id;
    made[i] = task.get();
    tasks_.emplace(task->id, std::move(task));
  }
  counters_.submitted += tasks.size();
  for (size_t i : *order) Admit(*made[i]);
  Dispatch();
  return outputs;
}

Result<std::vector<size_t>> Scheduler::Validate(
    std::span<const TaskSpec> tasks, const std::vector<std::vector<ObjectId>>& outputs) const {
  std::unordered_map<ObjectId, size_t> made_by;  // output -> index in the batch
  std::vector<ObjectId> taken;                   // outputs and outside inputs, to locate
  for (size_t i = 0; i < tasks.size(); ++i) {
    const TaskSpec& spec = tasks[i];
    const std::string name = TaskName(i);
    if (spec.function.empty() || spec.function.size() > kMaxFunctionName) {
      return Status::InvalidArgument(name + "a function name must have 1 to " +
                                     std::to_string(kMaxFunctionName) + " bytes");
    }
    if (spec.args.size() > kMaxInlineArgs) {
      return Status::InvalidArgument(name + "inline arguments of " +
                                     std::to_string(spec.args.size()) + " bytes are over " +
                                     std::to_string(kMaxInlineArgs) + "; pass an object");
    }
    if (spec.inputs.size() > kMaxInputs) {
      return Status::InvalidArgument(name + std::to_string(spec.inputs.size()) +
                                     " inputs are more than " + std::to_string(kMaxInputs));
    }
    if (spec.host_inputs.size() > spec.inputs.size()) {
      return Status::InvalidArgument(name + "more host inputs than inputs");
    }
    for (uint32_t k : spec.host_inputs) {
      if (k >= spec.inputs.size()) {
        return Status::InvalidArgument(name + "host input " + std::to_string(k) +
                                       " is not the index of an input (it has " +
                                       std::to_string(spec.inputs.size()) + ")");
      }
    }
    if (outputs[i].empty() || outputs[i].size() > kMaxOutputs) {
      return Status::InvalidArgument(name + "a task has 1 to " + std::to_string(kMaxOutputs) +
                                     " outputs");
    }
    if (spec.retries > kMaxRetries) {
      return Status::InvalidArgument(name + "at most " + std::to_string(kMaxRetries) + " retries");
    }
    if (Status s = CheckResources(spec.resources); !s.ok()) {
      return Status::InvalidArgument(name + s.message());
    }
    if (spec.variant == Variant::kCpu && spec.resources.gpu > 0) {
      return Status::InvalidArgument(name + "the CPU variant asks for no GPU");
    }
    if (!SomeWorkerCouldRun(spec)) {
      return Status::InvalidArgument(name + "no worker attached can run '" + spec.function +
                                     "' with the resources it asks for");
    }
    for (const ObjectId& o : outputs[i]) {
      if (o.IsNil()) return Status::InvalidArgument(name + "the all-zero id is not an output id");
      if (!made_by.emplace(o, i).second) {
        return Status::AlreadyExists(name + "output " + o.Hex() + " is named twice");
      }
      if (auto it = nodes_.find(o); it != nodes_.end() && it->second.producer != 0) {
        return Status::AlreadyExists(name + "output " + o.Hex() + " is the output of task " +
                                     std::to_string(it->second.producer));
      }
      taken.push_back(o);
    }
  }

  // Edges within the batch, and inputs from outside it.
  std::vector<std::vector<size_t>> consumers(tasks.size());
  std::vector<uint32_t> producers(tasks.size(), 0);
  std::vector<std::pair<size_t, ObjectId>> outside;  // (task, input) to locate
  for (size_t i = 0; i < tasks.size(); ++i) {
    for (const ObjectId& in : tasks[i].inputs) {
      if (in.IsNil()) {
        return Status::InvalidArgument(TaskName(i) + "the all-zero id is not an input id");
      }
      if (auto it = made_by.find(in); it != made_by.end()) {
        consumers[it->second].push_back(i);
        ++producers[i];
        continue;
      }
      if (auto it = nodes_.find(in); it != nodes_.end() && it->second.producer != 0) continue;
      outside.emplace_back(i, in);
      taken.push_back(in);
    }
  }

  std::vector<StoreAccess::Object> found(taken.size());
  store_.Locate(taken, found);
  size_t k = 0;
  for (size_t i = 0; i < tasks.size(); ++i) {
    for (const ObjectId& o : outputs[i]) {
      if (found[k++].state != StoreAccess::State::kMissing) {
        return Status::AlreadyExists(TaskName(i) + "output " + o.Hex() + " exists already");
      }
    }
  }
  for (const auto& [i, in] : outside) {
    if (found[k++].state == StoreAccess::State::kMissing) {
      return Status::NotFound(TaskName(i) + "input " + in.Hex() +
                              " neither exists nor is the output of a task");
    }
  }

  // Producers before consumers (Kahn); what is left over is a cycle.
  std::vector<size_t> order;
  order.reserve(tasks.size());
  for (size_t i = 0; i < tasks.size(); ++i) {
    if (producers[i] == 0) order.push_back(i);
  }
  for (size_t next = 0; next < order.size(); ++next) {
    for (size_t c : consumers[order[next]]) {
      if (--producers[c] == 0) order.push_back(c);
    }
  }
  if (order.size() != tasks.size()) {
    std::string members;
    for (size_t i = 0; i < tasks.size() && members.size() < 200; ++i) {
      if (producers[i] != 0) members += (members.empty() ? "" : ", ") + std::to_string(i);
    }
    return Status::InvalidArgument("tasks " + members + " read each other's outputs in a cycle");
  }
  return order;
}

bool Scheduler::CouldEverPlace(const Task& task) const {
  auto it = runners_.find(task.spec.function);
  if (it == runners_.end()) return false;
  // Hard affinity: a way on a GPU needs a worker offering the GPU holding most of its input.
  std::optional<int32_t> favourite;
  if (task.spec.affinity == Affinity::kHard) {
    favourite = DeviceWithMostInput(InputsOf(task.spec), /*gpus_only=*/true);
  }
  for (const Way& way : Ways(task.spec)) {
    const bool needs_favourite = favourite && way.request.gpu > 0;
    for (SessionId id : it->second) {
      const Worker& w = *workers_.at(id);
      if (w.draining || !way.eligible(w, task.spec.function) ||
          !w.resources.CouldEverFit(way.request)) {
        continue;
      }
      if (!needs_favourite || std::find(w.capacity.gpus.begin(), w.capacity.gpus.end(),
                                        *favourite) != w.capacity.gpus.end()) {
        return true;
      }
    }
  }
  return false;
}

std::vector<InputView> Scheduler::InputsOf(const TaskSpec& spec) const {
  std::vector<StoreAccess::Object> found(spec.inputs.size());
  store_.Locate(spec.inputs, found);
  std::vector<InputView> inputs(found.size());
  for (size_t k = 0; k < found.size(); ++k) inputs[k] = found[k].where;
  for (uint32_t k : spec.host_inputs) inputs[k].host = true;
  return inputs;
}

bool Scheduler::SomeWorkerCouldRun(const TaskSpec& spec) const {
  auto it = runners_.find(spec.function);
  if (it == runners_.end()) return false;
  for (const Way& way : Ways(spec)) {
    if (std::any_of(it->second.begin(), it->second.end(), [&](SessionId id) {
          const Worker& w = *workers_.at(id);
          return !w.draining && way.eligible(w, spec.function) &&
                 w.resources.CouldEverFit(way.request);
        })) {
      return true;
    }
  }
  return false;
}

std::vector<Scheduler::Way> Scheduler::Ways(const TaskSpec& spec) const {
  const ResourceRequest& asked = spec.resources;
  // A GPU variant runs on one GPU, with no CPU slot, unless the task asks a share itself.
  const ResourceRequest on_gpu =
      asked.gpu > 0 ? asked : ResourceRequest{.cpu = 0, .gpu = 1, .custom = asked.custom};
  const bool has_gpu_variant = gpu_variants_.contains(spec.function);
  switch (spec.variant) {
    case Variant::kCpu:  // asks no GPU (Validate)
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

std::vector<ObjectId> Scheduler::DeriveOutputs(TaskId task, uint32_t count) const {
  // The hash of a random nonce of this daemon, the task and the index: unique for all
  // practical purposes, and not to be guessed from other tasks' ids (within one uid, clients
  // are not guarded from each other; this keeps accidents away).
  std::vector<ObjectId> ids;
  ids.reserve(count);
  struct {
    uint64_t nonce[2];
    uint64_t task;
    uint64_t index;
  } key{{nonce_.lo(), nonce_.hi()}, task, 0};
  for (uint32_t i = 0; i < count; ++i) {
    key.index = i;
    ids.push_back(
        ObjectId::FromName(std::string_view(reinterpret_cast<const char*>(&key), sizeof key)));
  }
  return ids;
}

void Scheduler::Admit(Task& task) {
  for (const ObjectId& in : task.spec.inputs) {
    Node& n = nodes_[in];
    ++n.consumers;
    if (n.producer != 0) task.depth = std::max(task.depth, tasks_.at(n.producer)->depth + 1);
  }
  std::vector<StoreAccess::Object> found(task.spec.inputs.size());
  store_.Locate(task.spec.inputs, found);
  std::string failure;
  for (size_t k = 0; k < found.size(); ++k) {
    const ObjectId& in = task.spec.inputs[k];
    Node& n = nodes_[in];
    switch (found[k].state) {
      case StoreAccess::State::kSealed:
        if (!n.held) n.held = store_.Hold(in);
        break;
      case StoreAccess::State::kFailed:
        if (failure.empty()) failure = "input " + in.Hex() + " failed: " + store_.FailureOf(in);
        break;
      case StoreAccess::State::kCreating:
      case StoreAccess::State::kMissing:
        n.waiting.push_back(task.id);
        ++task.missing;
        break;
    }
  }
  if (!failure.empty()) {
    Finish(task, TaskState::kFailed, Cut(failure));
  } else if (task.missing == 0) {
    MakeReady(task);
  }
}

void Scheduler::MakeReady(Task& task) {
  task.state = TaskState::kReady;
  task.worker = 0;
  ready_.insert(task.key());
}

void Scheduler::Requeue(Task& task) {
  Unplace(task);
  task.device = kHostMemory;
  task.variant.clear();
  task.variant_reason.clear();
  MakeReady(task);
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
    Settle();
    DispatchRound();
    Flush();
  } while (dispatch_again_);
  dispatching_ = false;
}

void Scheduler::DispatchRound() {
  size_t open = 0;
  for (auto& [id, w] : workers_) {
    if (w->freed) StartQueued(*w);
    if (!w->draining && Waiting(*w) < options_.window) ++open;
  }
  // Tasks with no affinity that ask for what a task that found no place asked for find none
  // either: they are passed over without a look, and without counting as misses.
  std::vector<const TaskSpec*> unplaceable;
  const auto same_shape = [](const TaskSpec& a, const TaskSpec& b) {
    return a.function == b.function && a.resources.cpu == b.resources.cpu &&
           a.resources.gpu == b.resources.gpu && a.resources.custom == b.resources.custom &&
           a.output_bytes == b.output_bytes && a.variant == b.variant;
  };
  int misses = 0;
  for (auto it = ready_.begin();
       it != ready_.end() && open > 0 && misses < kMaxMissesPerDispatch;) {
    Task& task = *tasks_.at(it->id);
    const bool shaped = task.spec.affinity == Affinity::kNone;
    if (shaped && std::any_of(unplaceable.begin(), unplaceable.end(),
                              [&](const TaskSpec* s) { return same_shape(*s, task.spec); })) {
      ++it;
      continue;
    }
    if (!PlaceOne(task)) {
      if (!CouldEverPlace(task)) {
        // Not with the workers attached: it waits aside until another attaches.
        it = ready_.erase(it);
        stalled_.insert(task.id);
        continue;
      }
      if (shaped && unplaceable.size() < kMaxShapesPerDispatch) unplaceable.push_back(&task.spec);
      ++it;
      ++misses;
      continue;
    }
    it = ready_.erase(it);
    misses = 0;
    const Worker& w = *workers_.at(task.worker);
    if (task.state != TaskState::kRunning || task.after != 0) {
      if (Waiting(w) == options_.window) --open;
    }
  }
}

bool Scheduler::PlaceOne(Task& task) {
  const auto start = std::chrono::steady_clock::now();
  const bool placed = TryPlace(task);
  const auto nanos = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start)
          .count());
  const uint64_t units = nanos / 64;
  const int bucket = units <= 1 ? 0
                                : std::min<int>(SchedulerCounters::kPlacementBuckets - 1,
                                                std::bit_width(units - 1));
  ++counters_.placement_ns_buckets[static_cast<size_t>(bucket)];
  counters_.placement_ns_sum += nanos;
  ++counters_.placement_tries;
  return placed;
}

bool Scheduler::TryPlace(Task& task) {
  auto runners = runners_.find(task.spec.function);
  if (runners == runners_.end()) return false;

  const std::vector<InputView> inputs = InputsOf(task.spec);
  task.input_bytes = 0;
  for (const InputView& in : inputs) task.input_bytes += in.bytes;
  // Devices without room for the outputs are left out of every view.
  std::map<int32_t, bool> roomy;
  const std::function<bool(int32_t)> has_room = [&](int32_t device) {
    if (task.spec.output_bytes == 0) return true;
    auto [it, fresh] = roomy.emplace(device, false);
    if (fresh) it->second = store_.Room(device) >= task.spec.output_bytes;
    return it->second;
  };

  const std::vector<Way> ways = Ways(task.spec);
  std::optional<Plan> plans[2];
  for (size_t i = 0; i < ways.size(); ++i) {
    plans[i] = PlanWay(task, ways[i], runners->second, inputs, has_room);
  }
  const Plan* plan = nullptr;
  if (ways.size() == 2 && plans[0] && plans[1]) {
    plan = &ChooseVariant(task, *plans[0], *plans[1]);
  } else {
    plan = plans[0] ? &*plans[0] : plans[1] ? &*plans[1] : nullptr;
    if (plan == nullptr) return false;
    if (ways.size() == 2) {
      const bool gpu = plan->way->runs == Way::Runs::kGpuVariant;
      task.variant = gpu ? "gpu" : "cpu";
      task.variant_reason =
          std::string("the ") + (gpu ? "CPU" : "GPU") + " variant found no place now";
      durations_.Chose(task.spec.function, gpu, task.input_bytes);
    }
  }
  if (ways.size() == 1) {
    task.variant.clear();
    task.variant_reason.clear();
  }

  const Choice& choice = plan->choice;
  Worker& w = *plan->worker;
  task.request = plan->way->request;
  task.choice = choice;
  task.worker = w.id;
  task.device = choice.device;
  task.placed = true;
  task.duration_s = plan->duration_s;
  w.pending_s += task.duration_s;
  ++counters_.placements;
  counters_.local_bytes += choice.local_bytes;
  counters_.moved_bytes += choice.moved_bytes;
  if (plan->now && w.running.size() < kMaxRunningPerWorker &&
      w.resources.Reserve(task.request, task.device)) {
    Start(w, task);
    return true;
  }
  task.state = TaskState::kQueued;
  w.queue.push_back(task.id);
  StartQueued(w);  // it may fit beside what runs there (a CPU task beside a GPU one)
  if (task.state == TaskState::kRunning && task.after == 0) return true;
  if (choice.moved_bytes > 0) {
    // Each input to where the task reads it: its device, or host memory for host inputs.
    std::vector<ObjectId> missing, to_host;
    for (size_t k = 0; k < inputs.size(); ++k) {
      const int32_t where = inputs[k].host ? kHostMemory : task.device;
      if ((inputs[k].tiers & (uint64_t{1} << (where + 1))) != 0) continue;
      (where == task.device ? missing : to_host).push_back(task.spec.inputs[k]);
    }
    counters_.prefetches += missing.size() + to_host.size();
    if (!missing.empty()) store_.Prefetch(missing, task.device);
    if (!to_host.empty()) store_.Prefetch(to_host, kHostMemory);
  }
  return true;
}

std::optional<Scheduler::Plan> Scheduler::PlanWay(const Task& task, const Way& way,
                                                  std::span<const SessionId> runners,
                                                  std::span<const InputView> inputs,
                                                  const std::function<bool(int32_t)>& has_room) {
  const ResourceRequest& request = way.request;
  const bool on_gpu = request.gpu > 0;
  if (!on_gpu && !has_room(kHostMemory)) return std::nullopt;

  // Each worker with room in its window is seen twice when busy: with what is free now (the
  // task starts at once) and as it will be once idle (the task queues there).
  struct Candidate {
    Worker* worker;
    bool now;
  };
  std::vector<Candidate> candidates;
  std::vector<WorkerView> views;
  for (SessionId id : runners) {
    Worker& w = *workers_.at(id);
    if (w.draining || Waiting(w) >= options_.window) continue;
    if (w.running.size() >= kMaxRunningPerWorker) continue;
    if (!way.eligible(w, task.spec.function)) continue;
    const bool idle = w.running.empty() && w.queue.empty();
    if (w.queue.empty()) {
      candidates.push_back({&w, true});
      views.push_back(w.resources.View(0));
    }
    if (!idle && w.resources.CouldEverFit(request)) {
      candidates.push_back({&w, false});
      views.push_back(w.resources.IdleView(QueueWait(w)));
    }
  }
  for (WorkerView& v : views) {
    std::erase_if(v.gpus, [&](const WorkerView::Gpu& g) { return !has_room(g.device); });
  }
  // Soft affinity takes the favourite device when the task can start there now; otherwise
  // the cost model chooses (queueing there included), as without affinity.
  Affinity affinity = task.spec.affinity;
  if (affinity == Affinity::kSoft && on_gpu) {
    const auto favourite = DeviceWithMostInput(inputs, /*gpus_only=*/true);
    bool free_now = false;
    for (size_t i = 0; i < views.size() && favourite && !free_now; ++i) {
      if (!candidates[i].now) continue;
      for (const WorkerView::Gpu& g : views[i].gpus) {
        free_now |= g.device == *favourite && g.free_share + kResourceEpsilon >= request.gpu;
      }
    }
    if (!free_now) affinity = Affinity::kNone;
  }
  const Durations expected = durations_.ExpectedDurations(task.spec.function, task.input_bytes);
  Durations durations = expected;
  Bandwidths bandwidths = this->bandwidths();
  if (options_.random_placement) {
    // Every cost zeroed, over the candidates in random order: Place takes the first that fits.
    constexpr double kFree = std::numeric_limits<double>::infinity();
    bandwidths = {kFree, kFree, kFree};
    durations = {.cpu = 0, .gpu = 0};
    affinity = Affinity::kNone;
    std::vector<size_t> order(views.size());
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), random_);
    std::vector<Candidate> shuffled_candidates;
    std::vector<WorkerView> shuffled_views;
    for (size_t i : order) {
      shuffled_candidates.push_back(candidates[i]);
      shuffled_views.push_back(std::move(views[i]));
      shuffled_views.back().queue_wait_s = 0;
      std::shuffle(shuffled_views.back().gpus.begin(), shuffled_views.back().gpus.end(), random_);
    }
    candidates = std::move(shuffled_candidates);
    views = std::move(shuffled_views);
  }
  auto choice = Place(request, affinity, inputs, views, durations, bandwidths);
  if (!choice) return std::nullopt;
  return Plan{.choice = *choice,
              .worker = candidates[choice->worker].worker,
              .now = candidates[choice->worker].now,
              .duration_s = on_gpu ? expected.gpu : expected.cpu,
              .way = &way};
}

const Scheduler::Plan& Scheduler::ChooseVariant(Task& task, const Plan& cpu, const Plan& gpu) {
  const std::string& f = task.spec.function;
  if (options_.random_placement) {
    const bool on_gpu = (random_() & 1) != 0;
    task.variant = on_gpu ? "gpu" : "cpu";
    task.variant_reason = "random placement";
    return on_gpu ? gpu : cpu;
  }
  const DurationModel::Estimates estimates = durations_.Expected(f, task.input_bytes);
  const bool gpu_faster = gpu.choice.finish_s < cpu.choice.finish_s;
  const Plan& best = gpu_faster ? gpu : cpu;
  const Plan& other = gpu_faster ? cpu : gpu;
  const DurationModel::Estimate& other_estimate = gpu_faster ? estimates.cpu : estimates.gpu;
  const uint32_t passed_over = durations_.PassedOver(f, !gpu_faster, task.input_bytes);
  const char* best_name = gpu_faster ? "gpu" : "cpu";
  const char* other_name = gpu_faster ? "cpu" : "gpu";
  auto terms = [](const char* name, const Plan& p) {
    return std::string(name) + " " + ipc::FormatSeconds(p.choice.finish_s) + " (" +
           ipc::FormatSeconds(p.choice.transfer_s) + " moving " +
           std::to_string(p.choice.moved_bytes) + " B, " + ipc::FormatSeconds(p.duration_s) +
           " running)";
  };
  const Plan* chosen = &best;
  if (!other_estimate.measured && passed_over > 0) {
    chosen = &other;
    task.variant_reason = std::string("exploring: ") + other_name +
                          " not measured at this input size yet; " + terms(best_name, best) +
                          " against " + terms(other_name, other);
  } else if (passed_over >= kExploreEvery) {
    chosen = &other;
    task.variant_reason = std::string("exploring: ") + other_name + " not run for the last " +
                          std::to_string(passed_over) + " tasks of this input size; " +
                          terms(best_name, best) + " against " + terms(other_name, other);
  } else {
    task.variant_reason = "expected to finish first: " + terms(best_name, best) + " against " +
                          terms(other_name, other);
  }
  const bool on_gpu = chosen == &gpu;
  task.variant = on_gpu ? "gpu" : "cpu";
  durations_.Chose(f, on_gpu, task.input_bytes);
  return *chosen;
}

void Scheduler::StartQueued(Worker& worker) {
  worker.freed = false;
  for (auto it = worker.queue.begin(); it != worker.queue.end();) {
    Task& task = *tasks_.at(*it);
    if (worker.running.size() >= kMaxRunningPerWorker) return;
    if (worker.resources.Reserve(task.request, task.device)) {
      it = worker.queue.erase(it);
      Start(worker, task);
    } else {
      ++it;
    }
  }
  Pipeline(worker);
}

void Scheduler::Pipeline(Worker& worker) {
  if (!options_.pipeline || worker.draining) return;
  for (auto it = worker.queue.begin(); it != worker.queue.end();) {
    if (worker.running.size() >= kMaxRunningPerWorker) return;
    // In queue order: a task sent ahead never overtakes one queued before it here.
    Task& task = *tasks_.at(*it);
    if (task.duration_s >= kSendAheadBelowS) return;
    // The end of the line of short tasks of its shape expected to end first: a running task
    // with nothing sent to follow it, itself short (a task sent behind a long one would wait
    // for it while other slots free up), so that what is sent ahead spreads over the
    // worker's slots instead of lining up on one.
    Task* before = nullptr;
    double soonest = std::numeric_limits<double>::infinity();
    for (TaskId id : worker.running) {
      Task& r = *tasks_.at(id);
      if (r.follower != 0 || r.duration_s >= kSendAheadBelowS || r.device != task.device ||
          r.request != task.request) {
        continue;
      }
      // Its line's head started at started_at; each task of the line runs after the last.
      double end = 0;
      const Task* t = &r;
      for (;; t = &*tasks_.at(t->after)) {
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

size_t Scheduler::Waiting(const Worker& worker) const {
  return worker.queue.size() + worker.pipelined;
}

void Scheduler::Start(Worker& worker, Task& task) {
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
  if (attempt > 1) {
    // A worker that died may have sealed some outputs before it did: those stay.
    LetGoOfKept(task);
    std::vector<StoreAccess::Object> found(task.outputs.size());
    store_.Locate(task.outputs, found);
    for (uint32_t k = 0; k < found.size(); ++k) {
      if (found[k].state == StoreAccess::State::kSealed && store_.Hold(task.outputs[k])) {
        a.sealed.push_back(k);
        task.kept.push_back(task.outputs[k]);
      }
    }
  }
}

void Scheduler::Flush() {
  // Taken first: a send may end a session, whose tasks then change state and place.
  auto outbox = std::exchange(outbox_, {});
  for (auto& [worker, assignments] : outbox) {
    // Only what still runs there: an earlier send in this loop may have ended a session.
    std::erase_if(assignments, [&, worker = worker](const Assignment& a) {
      auto it = tasks_.find(a.task);
      return it == tasks_.end() || it->second->state != TaskState::kRunning ||
             it->second->worker != worker;
    });
    if (!assignments.empty()) link_.Assign(worker, assignments);
  }
}

double Scheduler::QueueWait(const Worker& worker) const {
  return std::max(0.0, worker.pending_s) / worker.slots();
}

void Scheduler::Unplace(Task& task) {
  if (!task.placed) return;
  task.placed = false;
  Worker& w = *workers_.at(task.worker);
  if (task.state == TaskState::kRunning) {
    w.running.erase(task.id);
    if (task.after != 0) {
      // Sent ahead and not started: it held nothing. What was to follow it follows the one
      // before it instead.
      --w.pipelined;
      Task& before = *tasks_.at(task.after);
      before.follower = task.follower;
      if (task.follower != 0) tasks_.at(task.follower)->after = task.after;
    } else if (task.follower != 0) {
      // Its resources go to the task sent to follow it, which starts now on the worker.
      --w.pipelined;
      Task& next = *tasks_.at(task.follower);
      next.after = 0;
      ++next.attempts;
      next.started_at = Now();
    } else {
      w.resources.Release({task.request, task.device});
      w.freed = true;
    }
    task.after = 0;
    task.follower = 0;
  } else {
    std::erase(w.queue, task.id);
  }
  w.pending_s = std::max(0.0, w.pending_s - task.duration_s);
}

Status Scheduler::Complete(SessionId worker, std::span<const Completion> completions) {
  auto wit = workers_.find(worker);
  if (wit == workers_.end()) {
    return Status::InvalidArgument("session " + std::to_string(worker) + " is not a worker");
  }
  Worker& w = *wit->second;
  Status result;
  const double now = Now();
  for (const Completion& c : completions) {
    auto it = tasks_.find(c.task);
    if (it == tasks_.end() || it->second->state != TaskState::kRunning ||
        it->second->worker != worker) {
      if (result.ok()) {
        result = Status::InvalidArgument("task " + std::to_string(c.task) +
                                         " is not running on this worker");
      }
      continue;
    }
    Task& task = *it->second;
    // One sent ahead and reported before the task it followed: its start is not known.
    // Only runs that succeeded are measured: a variant that fails fast must not look fast.
    if (task.after == 0 && c.ok) {
      durations_.Record(task.spec.function, task.on_gpu(), task.input_bytes, now - task.started_at);
    }
    if (!c.ok) {
      ++w.failed;
      store_.AbortCreating(worker, task.outputs);
      Finish(task, TaskState::kFailed, Cut(c.message));
      continue;
    }
    std::vector<StoreAccess::Object> found(task.outputs.size());
    store_.Locate(task.outputs, found);
    std::string missing;
    for (size_t k = 0; k < found.size() && missing.empty(); ++k) {
      if (found[k].state != StoreAccess::State::kSealed) missing = task.outputs[k].Hex();
    }
    if (!missing.empty()) {
      ++w.failed;
      store_.AbortCreating(worker, task.outputs);
      Finish(task, TaskState::kFailed,
             "its worker reported success without sealing output " + missing);
      continue;
    }
    ++w.done;
    Finish(task, TaskState::kDone, "");
  }
  if (w.draining) {
    if (w.running.empty()) {
      ForgetWorker(w);
      link_.Drained(worker);
    }
  } else {
    StartQueued(w);
  }
  Dispatch();
  return result;
}

std::span<const ObjectId> Scheduler::RunningOutputs(SessionId worker, TaskId task) const {
  auto it = tasks_.find(task);
  if (it == tasks_.end() || it->second->state != TaskState::kRunning ||
      it->second->worker != worker) {
    return {};
  }
  return it->second->outputs;
}

std::vector<Scheduler::CancelOutcome> Scheduler::Cancel(std::span<const ObjectId> outputs) {
  std::vector<CancelOutcome> outcomes;
  outcomes.reserve(outputs.size());
  for (const ObjectId& id : outputs) {
    auto it = nodes_.find(id);
    if (it != nodes_.end() && it->second.producer != 0) {
      Task& task = *tasks_.at(it->second.producer);
      if (task.state == TaskState::kRunning) {
        outcomes.push_back(CancelOutcome::kRunning);
        continue;
      }
      Finish(task, TaskState::kCancelled, "cancelled");
      outcomes.push_back(CancelOutcome::kCancelled);
      continue;
    }
    outcomes.push_back(finished_outputs_.contains(id) ? CancelOutcome::kFinished
                                                      : CancelOutcome::kUnknown);
  }
  Dispatch();
  return outcomes;
}

void Scheduler::Finish(Task& task, TaskState state, std::string reason) {
  if (task.state == TaskState::kReady) {
    ready_.erase(task.key());
    stalled_.erase(task.id);
  }
  Unplace(task);
  task.state = state;
  task.reason = std::move(reason);
  if (state == TaskState::kDone) {
    ++counters_.completed;
  } else {
    ++(state == TaskState::kCancelled ? counters_.cancelled : counters_.failed);
    store_.SealFailed(task.outputs, task.reason);
  }
  LetGoOfInputs(task);
  for (const ObjectId& o : task.outputs) {
    if (auto it = nodes_.find(o); it != nodes_.end()) it->second.producer = 0;
  }
  // Consumers of a task's outputs start once the task is over, not at each output's seal:
  // until then the producer still holds its device. Outputs it sealed go to them now (a
  // done task's are all sealed: Complete checked); the others fail them, through a queue
  // (Settle) rather than recursion, and whether or not the store could seal them as failed.
  std::vector<StoreAccess::Object> found(task.outputs.size());
  if (state != TaskState::kDone) store_.Locate(task.outputs, found);
  for (size_t k = 0; k < task.outputs.size(); ++k) {
    const ObjectId& o = task.outputs[k];
    if (state == TaskState::kDone || found[k].state == StoreAccess::State::kSealed) {
      Sealed(o);
    } else {
      failures_.emplace_back(o, Cut("input " + o.Hex() + " failed: " + task.reason));
    }
    auto it = nodes_.find(o);
    if (it != nodes_.end() && it->second.consumers == 0 && it->second.waiting.empty()) {
      if (it->second.held) store_.Drop(o);
      nodes_.erase(it);
    }
  }
  LetGoOfKept(task);
  Retire(task);
}

void Scheduler::LetGoOfInputs(Task& task) {
  for (const ObjectId& in : task.spec.inputs) {
    auto it = nodes_.find(in);
    if (it == nodes_.end()) continue;
    Node& n = it->second;
    --n.consumers;
    if (task.missing > 0) std::erase(n.waiting, task.id);
    if (n.consumers == 0 && n.producer == 0) {
      if (n.held) store_.Drop(in);
      nodes_.erase(it);
    }
  }
  task.missing = 0;
}

void Scheduler::Retire(Task& task) {
  // What it no longer needs goes, and with it what its submitter was charged.
  (void)store_.Charge(task.submitter, -static_cast<int64_t>(task.charged));
  task.charged = 0;
  task.spec.args = std::string();
  task.spec.inputs = std::vector<ObjectId>();
  task.spec.host_inputs = std::vector<uint32_t>();
  for (const ObjectId& o : task.outputs) finished_outputs_[o] = task.id;
  auto it = tasks_.find(task.id);
  finished_.push_back(std::move(it->second));
  tasks_.erase(it);
  while (finished_.size() > options_.finished_kept) {
    for (const ObjectId& o : finished_.front()->outputs) {
      auto f = finished_outputs_.find(o);
      if (f != finished_outputs_.end() && f->second == finished_.front()->id) {
        finished_outputs_.erase(f);
      }
    }
    finished_.pop_front();
  }
}

void Scheduler::Settle() {
  while (!failures_.empty()) {
    auto [id, reason] = std::move(failures_.front());
    failures_.pop_front();
    InputFailed(id, reason);
  }
}

void Scheduler::ForgetWorker(Worker& worker) {
  // A function no worker runs any more takes its measurements with it: what the daemon
  // keeps is bounded by what the workers attached register.
  auto forget = [&](const std::string& f) {
    auto it = runners_.find(f);
    std::erase(it->second, worker.id);
    if (it->second.empty()) {
      runners_.erase(it);
      durations_.Forget(f);
    }
  };
  for (const std::string& f : worker.functions) forget(f);
  for (const std::string& f : worker.gpu_functions) {
    if (!worker.runs(f)) forget(f);
    auto it = gpu_variants_.find(f);
    if (--it->second == 0) gpu_variants_.erase(it);
  }
  workers_.erase(worker.id);
}

void Scheduler::OnSealed(const ObjectId& id, bool failed) {
  if (!nodes_.contains(id)) return;
  // Events come after the change: the object may have gone, or come again, since.
  StoreAccess::Object now;
  store_.Locate(std::span(&id, 1), std::span(&now, 1));
  if (now.state != (failed ? StoreAccess::State::kFailed : StoreAccess::State::kSealed)) return;
  if (failed) {
    InputFailed(id, "input " + id.Hex() + " failed: " + store_.FailureOf(id));
  } else {
    Sealed(id);
  }
  Dispatch();
}

void Scheduler::Sealed(const ObjectId& id) {
  auto it = nodes_.find(id);
  if (it == nodes_.end()) return;
  Node& n = it->second;
  if (!n.held && n.consumers > 0) n.held = store_.Hold(id);
  if (n.producer != 0) return;  // its consumers wait for the producer to finish (Finish)
  for (TaskId tid : std::exchange(n.waiting, {})) {
    Task& task = *tasks_.at(tid);
    if (--task.missing == 0) MakeReady(task);
  }
}

void Scheduler::InputFailed(const ObjectId& id, const std::string& reason) {
  auto it = nodes_.find(id);
  if (it == nodes_.end()) return;
  for (TaskId tid : std::exchange(it->second.waiting, {})) {
    auto t = tasks_.find(tid);
    if (t == tasks_.end()) continue;  // failed already: it read this input twice
    Finish(*t->second, TaskState::kFailed, Cut(reason));
  }
}

void Scheduler::OnFreed(const ObjectId& id) {
  auto it = nodes_.find(id);
  if (it == nodes_.end()) return;
  StoreAccess::Object now;
  store_.Locate(std::span(&id, 1), std::span(&now, 1));
  if (now.state != StoreAccess::State::kMissing) return;  // made again since
  Node& n = it->second;
  n.held = false;
  // An output whose producer is pending will be made again (the producer retries) or sealed
  // as failed; anything else that goes before it was sealed never comes.
  if (n.producer != 0) return;
  InputFailed(id, "input " + id.Hex() + " was deleted or aborted before it was sealed");
  Dispatch();
}

std::vector<WorkerInfo> Scheduler::Workers() const {
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
    for (int32_t d : w->capacity.gpus)
      info.free_gpu_share.emplace_back(d, w->resources.free_share(d));
    out.push_back(std::move(info));
  }
  return out;
}

std::vector<TaskInfo> Scheduler::Tasks(size_t limit) const {
  auto describe = [&](const Task& t) {
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
                  .variant_reason = t.variant_reason};
    if (ahead) {
      info.reason = "sent to its worker, to start when task " + std::to_string(t.after) + " ends";
    } else if (t.state == TaskState::kReady) {
      if (!SomeWorkerCouldRun(t.spec)) {
        info.reason =
            "no worker attached can run '" + t.spec.function + "' with the resources it asks for";
      } else if (stalled_.contains(t.id)) {
        info.reason = "no worker attached offers the GPU holding its inputs (hard affinity)";
      } else {
        info.reason = "no worker has room for it now";
      }
    }
    return info;
  };
  std::vector<const Task*> pending;
  for (const auto& [id, t] : tasks_) pending.push_back(&*t);
  std::sort(pending.begin(), pending.end(), [](auto* a, auto* b) { return a->id < b->id; });
  std::vector<TaskInfo> out;
  for (const Task* t : pending) {
    if (out.size() == limit) return out;
    out.push_back(describe(*t));
  }
  for (const auto& t : finished_) {
    if (out.size() == limit) return out;
    out.push_back(describe(*t));
  }
  return out;
}

SchedulerCounters Scheduler::counters() const {
  SchedulerCounters c = counters_;
  c.workers = workers_.size();
  c.tasks_pending = tasks_.size();
  return c;
}

}  // namespace depot::scheduler
