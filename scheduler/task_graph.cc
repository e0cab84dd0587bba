#include "scheduler/task_graph.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "depot/ipc/units.h"

namespace depot::scheduler {

namespace {

// What a task costs the daemon's memory besides its strings and ids, and what an id costs
// (in the task, and in the graph's index of objects).
constexpr uint64_t kTaskBytes = 512;
constexpr uint64_t kIdBytes = 96;

std::string Cut(std::string_view message) {
  return std::string(message.substr(0, kMaxFailureMessage));
}

std::string TaskName(size_t index) { return "task " + std::to_string(index) + ": "; }

// 0, or from kMinResourceAmount on.
bool Amount(double x) { return std::isfinite(x) && (x == 0 || x >= kMinResourceAmount); }

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

// Checks what one task asks for on its own (not its ids): why not, or OK.
Status CheckSpec(const TaskSpec& spec, size_t outputs) {
  if (spec.function.empty() || spec.function.size() > kMaxFunctionName) {
    return Status::InvalidArgument("a function name must have 1 to " +
                                   std::to_string(kMaxFunctionName) + " bytes");
  }
  if (spec.args.size() > kMaxInlineArgs) {
    return Status::InvalidArgument("inline arguments of " + std::to_string(spec.args.size()) +
                                   " bytes are over " + std::to_string(kMaxInlineArgs) +
                                   "; pass an object");
  }
  if (spec.kind.size() > kMaxLabel) {
    return Status::InvalidArgument("a kind of " + std::to_string(spec.kind.size()) +
                                   " bytes is over " + std::to_string(kMaxLabel));
  }
  if (spec.label.size() > kMaxLabel) {
    return Status::InvalidArgument("a label of " + std::to_string(spec.label.size()) +
                                   " bytes is over " + std::to_string(kMaxLabel));
  }
  if (!ipc::IsDisplayText(spec.label)) {
    return Status::InvalidArgument(
        "a label is UTF-8 text without control characters (it is shown to people)");
  }
  if (spec.inputs.size() > kMaxInputs) {
    return Status::InvalidArgument(std::to_string(spec.inputs.size()) + " inputs are more than " +
                                   std::to_string(kMaxInputs));
  }
  if (spec.host_inputs.size() > spec.inputs.size()) {
    return Status::InvalidArgument("more host inputs than inputs");
  }
  for (uint32_t k : spec.host_inputs) {
    if (k >= spec.inputs.size()) {
      return Status::InvalidArgument("host input " + std::to_string(k) +
                                     " is not the index of an input (it has " +
                                     std::to_string(spec.inputs.size()) + ")");
    }
  }
  if (outputs == 0 || outputs > kMaxOutputs) {
    return Status::InvalidArgument("a task has 1 to " + std::to_string(kMaxOutputs) + " outputs");
  }
  if (spec.retries > kMaxRetries) {
    return Status::InvalidArgument("at most " + std::to_string(kMaxRetries) + " retries");
  }
  DEPOT_RETURN_NOT_OK(CheckResources(spec.resources));
  if (spec.variant == Variant::kCpu && spec.resources.gpu > 0) {
    return Status::InvalidArgument("the CPU variant asks for no GPU");
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

TaskGraph::TaskGraph(StoreAccess& store, size_t finished_kept, std::function<void(Task&)> ready,
                     std::function<void(const Task&)> over)
    : store_(store),
      finished_kept_(finished_kept),
      ready_(std::move(ready)),
      over_(std::move(over)),
      nonce_(ObjectId::Random()) {}

TaskGraph::~TaskGraph() {
  for (auto& [id, node] : nodes_) {
    if (node.held) store_.Drop(id);
  }
  for (auto& [id, task] : tasks_) LetGoOfKept(*task);
}

Result<std::vector<std::vector<ObjectId>>> TaskGraph::Add(
    SessionId submitter, std::span<const TaskSpec> tasks,
    const std::function<bool(const TaskSpec&)>& runnable) {
  std::vector<std::vector<ObjectId>> outputs(tasks.size());
  for (size_t i = 0; i < tasks.size(); ++i) {
    const TaskSpec& spec = tasks[i];
    if (!spec.outputs.empty()) {
      outputs[i] = spec.outputs;
    } else if (spec.num_outputs >= 1 && spec.num_outputs <= kMaxOutputs) {
      outputs[i] = DeriveOutputs(next_task_ + i, spec.num_outputs);
    }
  }
  auto order = Validate(tasks, outputs, runnable);
  if (!order.ok()) return order.status();
  // The daemon memory the batch takes, counted against its submitter until each task is over.
  std::vector<uint64_t> costs(tasks.size());
  uint64_t total = 0;
  for (size_t i = 0; i < tasks.size(); ++i) {
    const TaskSpec& t = tasks[i];
    costs[i] = kTaskBytes + t.function.size() + t.args.size() + t.label.size() + t.kind.size() +
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
  return outputs;
}

Result<std::vector<size_t>> TaskGraph::Validate(
    std::span<const TaskSpec> tasks, const std::vector<std::vector<ObjectId>>& outputs,
    const std::function<bool(const TaskSpec&)>& runnable) const {
  std::unordered_map<ObjectId, size_t> made_by;  // output -> index in the batch
  std::vector<ObjectId> taken;                   // outputs and outside inputs, to locate
  for (size_t i = 0; i < tasks.size(); ++i) {
    const TaskSpec& spec = tasks[i];
    const std::string name = TaskName(i);
    if (Status s = CheckSpec(spec, outputs[i].size()); !s.ok()) {
      return Status::InvalidArgument(name + s.message());
    }
    if (!runnable(spec)) {
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

std::vector<ObjectId> TaskGraph::DeriveOutputs(TaskId task, uint32_t count) const {
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

void TaskGraph::Admit(Task& task) {
  for (const ObjectId& in : task.spec.inputs) {
    Node& n = nodes_[in];
    ++n.consumers;
    if (n.producer != 0) task.depth = std::max(task.depth, at(n.producer).depth + 1);
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
    Finish(task, TaskState::kFailed, failure);
  } else if (task.missing == 0) {
    ready_(task);
  }
}

void TaskGraph::Finish(Task& task, TaskState state, std::string_view reason) {
  if (over_) over_(task);
  task.state = state;
  task.reason = Cut(reason);
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
  // done task's are all sealed: Scheduler::Complete checked); the others fail them, through
  // a queue (Settle) rather than recursion, and whether or not the store could seal them as
  // failed.
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
    if (it != nodes_.end() && it->second.consumers == 0 && it->second.waiting.empty()) Erase(it);
  }
  LetGoOfKept(task);
  Retire(task);
}

void TaskGraph::LetGoOfInputs(Task& task) {
  for (const ObjectId& in : task.spec.inputs) {
    auto it = nodes_.find(in);
    if (it == nodes_.end()) continue;
    Node& n = it->second;
    --n.consumers;
    if (task.missing > 0) std::erase(n.waiting, task.id);
    if (n.consumers == 0 && n.producer == 0) Erase(it);
  }
  task.missing = 0;
}

void TaskGraph::Erase(std::unordered_map<ObjectId, Node>::iterator it) {
  const ObjectId id = it->first;
  const Node node = std::move(it->second);
  nodes_.erase(it);
  if (node.held) store_.Drop(id);
  if (node.deleted) store_.Delete(id);
}

bool TaskGraph::DeleteAfterTasks(const ObjectId& id) {
  auto it = nodes_.find(id);
  if (it == nodes_.end()) return false;
  it->second.deleted = true;
  return true;
}

void TaskGraph::LetGoOfKept(Task& task) {
  for (const ObjectId& o : task.kept) store_.Drop(o);
  task.kept.clear();
}

void TaskGraph::Retire(Task& task) {
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
  while (finished_.size() > finished_kept_) {
    for (const ObjectId& o : finished_.front()->outputs) {
      auto f = finished_outputs_.find(o);
      if (f != finished_outputs_.end() && f->second == finished_.front()->id) {
        finished_outputs_.erase(f);
      }
    }
    finished_.pop_front();
  }
}

void TaskGraph::Settle() {
  while (!failures_.empty()) {
    auto [id, reason] = std::move(failures_.front());
    failures_.pop_front();
    InputFailed(id, reason);
  }
}

std::vector<uint32_t> TaskGraph::KeepSealedOutputs(Task& task) {
  // A worker that died may have sealed some outputs before it did: those stay.
  LetGoOfKept(task);
  std::vector<StoreAccess::Object> found(task.outputs.size());
  store_.Locate(task.outputs, found);
  std::vector<uint32_t> sealed;
  for (uint32_t k = 0; k < found.size(); ++k) {
    if (found[k].state == StoreAccess::State::kSealed && store_.Hold(task.outputs[k])) {
      sealed.push_back(k);
      task.kept.push_back(task.outputs[k]);
    }
  }
  return sealed;
}

bool TaskGraph::OnSealed(const ObjectId& id, bool failed) {
  if (!nodes_.contains(id)) return false;
  // Events come after the change: the object may have gone, or come again, since.
  StoreAccess::Object now;
  store_.Locate(std::span(&id, 1), std::span(&now, 1));
  if (now.state != (failed ? StoreAccess::State::kFailed : StoreAccess::State::kSealed)) {
    return false;
  }
  if (failed) {
    InputFailed(id, "input " + id.Hex() + " failed: " + store_.FailureOf(id));
  } else {
    Sealed(id);
  }
  return true;
}

void TaskGraph::Sealed(const ObjectId& id) {
  auto it = nodes_.find(id);
  if (it == nodes_.end()) return;
  Node& n = it->second;
  if (!n.held && n.consumers > 0) n.held = store_.Hold(id);
  if (n.producer != 0) return;  // its consumers wait for the producer to finish (Finish)
  for (TaskId tid : std::exchange(n.waiting, {})) {
    Task& task = at(tid);
    if (--task.missing == 0) ready_(task);
  }
}

void TaskGraph::InputFailed(const ObjectId& id, const std::string& reason) {
  auto it = nodes_.find(id);
  if (it == nodes_.end()) return;
  // Those waiting for an input are waiting: in no ready queue, on no worker.
  for (TaskId tid : std::exchange(it->second.waiting, {})) {
    Task* task = Find(tid);
    if (task == nullptr) continue;  // failed already: it read this input twice
    Finish(*task, TaskState::kFailed, reason);
  }
}

bool TaskGraph::OnFreed(const ObjectId& id) {
  auto it = nodes_.find(id);
  if (it == nodes_.end()) return false;
  StoreAccess::Object now;
  store_.Locate(std::span(&id, 1), std::span(&now, 1));
  if (now.state != StoreAccess::State::kMissing) return false;  // made again since
  Node& n = it->second;
  n.held = false;
  // An output whose producer is pending will be made again (the producer retries) or sealed
  // as failed; anything else that goes before it was sealed never comes.
  if (n.producer != 0) return false;
  InputFailed(id, "input " + id.Hex() + " was deleted or aborted before it was sealed");
  return true;
}

Task* TaskGraph::Find(TaskId id) {
  auto it = tasks_.find(id);
  return it == tasks_.end() ? nullptr : it->second.get();
}

const Task* TaskGraph::Find(TaskId id) const {
  auto it = tasks_.find(id);
  return it == tasks_.end() ? nullptr : it->second.get();
}

Task* TaskGraph::ProducerOf(const ObjectId& id) {
  return const_cast<Task*>(std::as_const(*this).ProducerOf(id));
}

const Task* TaskGraph::ProducerOf(const ObjectId& id) const {
  auto it = nodes_.find(id);
  return it == nodes_.end() || it->second.producer == 0 ? nullptr : Find(it->second.producer);
}

bool TaskGraph::IsRead(const ObjectId& id) const {
  auto it = nodes_.find(id);
  return it != nodes_.end() && it->second.consumers > 0;
}

}  // namespace depot::scheduler
