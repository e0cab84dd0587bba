#include "store/task_service.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "depot/ipc/protocol.h"
#include "depot/ipc/units.h"
#include "info_fields.h"
#include "store/server.h"

namespace depot::store {

namespace {

// The most tasks one `tasks` reply lists (a few MiB).
constexpr size_t kMaxTasksListed = 10'000;

using scheduler::Affinity;
using scheduler::TaskSpec;

std::map<std::string, double> CustomOf(capnp::List<wire::Resource>::Reader list) {
  std::map<std::string, double> out;
  for (auto r : list) out[ipc::ToString(r.getName())] += r.getAmount();
  return out;
}

TaskSpec SpecOf(wire::TaskSpec::Reader in) {
  TaskSpec spec;
  spec.function = ipc::ToString(in.getFunction());
  spec.inputs = ipc::FromWire(in.getInputs());
  auto args = in.getArgs();
  spec.args.assign(reinterpret_cast<const char*>(args.begin()), args.size());
  spec.outputs = ipc::FromWire(in.getOutputs());
  spec.num_outputs = in.getNumOutputs();
  spec.resources = {.cpu = in.getCpu(), .gpu = in.getGpu(), .custom = CustomOf(in.getResources())};
  switch (in.getAffinity()) {
    case wire::Affinity::SOFT:
      spec.affinity = Affinity::kSoft;
      break;
    case wire::Affinity::HARD:
      spec.affinity = Affinity::kHard;
      break;
    default:
      spec.affinity = Affinity::kNone;
  }
  spec.priority = in.getPriority();
  spec.retries = in.getRetries();
  spec.output_bytes = in.getOutputBytes();
  spec.detach = in.getDetach();
  for (uint32_t k : in.getHostInputs()) spec.host_inputs.push_back(k);
  spec.label = ipc::ToString(in.getLabel());
  spec.bound_id = in.getBoundId();
  spec.bound_bytes = in.getBoundBytes();
  spec.bound_waits = in.getBoundWaits();
  spec.kind = ipc::ToString(in.getKind());
  switch (in.getVariant()) {
    case wire::Variant::CPU:
      spec.variant = scheduler::Variant::kCpu;
      break;
    case wire::Variant::GPU:
      spec.variant = scheduler::Variant::kGpu;
      break;
    default:  // auto, or a newer client's value
      spec.variant = scheduler::Variant::kAuto;
  }
  return spec;
}

// The same states in the same order (scheduler/scheduler.h, depot/task.h).
static_assert(static_cast<uint16_t>(scheduler::TaskState::kCancelled) ==
              static_cast<uint16_t>(depot::TaskState::kCancelled));
depot::TaskState Public(scheduler::TaskState state) {
  return static_cast<depot::TaskState>(static_cast<uint16_t>(state));
}

wire::CancelOutcome ToWire(scheduler::Scheduler::CancelOutcome outcome) {
  return static_cast<wire::CancelOutcome>(static_cast<uint16_t>(outcome));
}

}  // namespace

namespace {

// Task durations are measured on the monotonic clock; a memory bound that holds its tasks
// back is looked at again a grace period later (`stuck`).
scheduler::SchedulerOptions WithHooks(scheduler::SchedulerOptions options,
                                      std::function<void()> stuck) {
  if (!options.clock) {
    options.clock = [] { return static_cast<double>(ipc::MonotonicNanos()) * 1e-9; };
  }
  options.bounds_stuck = std::move(stuck);
  return options;
}

}  // namespace

TaskService::TaskService(boost::asio::io_context& loop, Pushes& pushes, ObjectStore& store,
                         scheduler::SchedulerOptions options)
    : pushes_(pushes),
      store_(store),
      access_(store, *this),
      scheduler_(access_, *this, WithHooks(std::move(options), [this] { BoundsStuck(); })),
      bounds_timer_(loop),
      room_waits_(
          loop, [this] { return scheduler_.StartedTasks(); },
          [this](ClientId worker, const ObjectId& id) { scheduler_.LendWhileWaiting(worker, id); },
          [this](uint64_t task) { return scheduler_.Describe(task); }) {
  const scheduler::Bandwidths bw = scheduler_.bandwidths();
  spdlog::info("scheduler: places tasks {}; copies assumed at {}/s host<->GPU, {}/s GPU<->GPU{}",
               scheduler_.random_placement() ? "at random (--placement random)"
                                             : "where they would finish first",
               ipc::FormatSize(static_cast<uint64_t>(bw.host_to_gpu)),
               ipc::FormatSize(static_cast<uint64_t>(bw.gpu_to_gpu)),
               scheduler_.bandwidths_measured()
                   ? " until timed at start-up and on the store's copies"
                   : " (as set)");
}

void TaskService::RegisterWorker(const Responder& reply, const Requester& who,
                                 wire::Request::RegisterWorker::Reader request) {
  scheduler::WorkerSpec spec;
  spec.name = ipc::ToString(request.getName());
  spec.capacity.cpu = request.getCpus();
  spec.capacity.custom = CustomOf(request.getResources());
  const auto pools = store_.pools();
  for (auto uuid : request.getGpus()) {
    int32_t found = -1;
    for (size_t d = 0; d < pools.size() && found < 0; ++d) {
      const auto& mine = pools[d]->info().uuid;
      if (uuid.size() == mine.size() && std::memcmp(uuid.begin(), mine.data(), mine.size()) == 0) {
        found = static_cast<int32_t>(d);
      }
    }
    if (found < 0) {
      return reply.Error(Status::InvalidArgument(
          "a worker offers a GPU this daemon does not serve (" + std::to_string(pools.size()) +
          " GPUs); name GPUs by the UUIDs in hello's devices"));
    }
    spec.capacity.gpus.push_back(found);
  }
  for (auto f : request.getFunctions()) spec.functions.push_back(ipc::ToString(f));
  for (auto f : request.getGpuFunctions()) spec.gpu_functions.push_back(ipc::ToString(f));
  reply.Answer(scheduler_.AddWorker(who.client, std::move(spec)));
}

void TaskService::Submit(const Responder& reply, const Requester& who,
                         capnp::List<wire::TaskSpec>::Reader tasks) {
  if (tasks.size() > who.max_batch) {
    return reply.Error(Status::LimitExceeded("a submit may carry at most " +
                                             std::to_string(who.max_batch) + " tasks"));
  }
  std::vector<TaskSpec> specs;
  specs.reserve(tasks.size());
  for (auto t : tasks) specs.push_back(SpecOf(t));
  auto outputs = scheduler_.Submit(who.client, specs);
  if (!outputs.ok()) return reply.Error(outputs.status());
  capnp::MallocMessageBuilder message;
  auto r = message.initRoot<wire::Reply>();
  auto out = r.initSubmit(static_cast<unsigned>(outputs->size()));
  for (unsigned i = 0; i < out.size(); ++i) {
    const auto& ids = (*outputs)[i];
    ipc::ToWire(ids, out[i].initIds(static_cast<unsigned>(ids.size())));
  }
  reply.Send(message, r);
}

void TaskService::Complete(const Responder& reply, const Requester& who,
                           capnp::List<wire::Completion>::Reader completions) {
  std::vector<scheduler::Completion> done;
  done.reserve(completions.size());
  for (auto c : completions) {
    scheduler::Completion& d = done.emplace_back(scheduler::Completion{
        .task = c.getTask(),
        .ok = c.getOk(),
        .message = ipc::ToString(c.getMessage()).substr(0, scheduler::kMaxFailureMessage)});
    if (d.ok && c.hasOutputs()) {
      if (Status st = StoreOutputs(who.client, d.task, c.getOutputs()); !st.ok()) {
        d.ok = false;
        d.message = st.message().substr(0, scheduler::kMaxFailureMessage);
      }
    }
    if (d.ok && c.hasSeal() && !SealOutputs(who.client, d, c.getSeal())) {
      done.pop_back();  // it completes once its seals are done
    }
  }
  Status st = scheduler_.Complete(who.client, done);
  room_waits_.LendAgain();
  room_waits_.TasksChanged();
  // A worker that wants no reply learns nothing of a refusal: say it in the log.
  if (reply.rid() == 0 && !st.ok())
    spdlog::warn("session {}: complete: {}", who.client, st.message());
  reply.Answer(st);
}

Status TaskService::StoreOutputs(ClientId worker, uint64_t task,
                                 capnp::List<wire::OutputValue>::Reader values) {
  for (auto v : values) {
    // Looked up for each value: storing one answers gets, and a reply that cannot be written
    // ends that client's session, which may be this one (the task then runs elsewhere).
    const std::span<const ObjectId> outputs = scheduler_.RunningOutputs(worker, task);
    // Not running here: the scheduler refuses the completion, and nothing is stored for it.
    if (outputs.empty()) return Status::OK();
    const uint32_t index = v.getIndex();
    if (index >= outputs.size()) {
      return Status::InvalidArgument("its worker returned output " + std::to_string(index) +
                                     " of a task with " + std::to_string(outputs.size()) +
                                     " outputs");
    }
    auto data = v.getData();
    auto metadata = v.getMetadata();
    if (data.size() + metadata.size() > ipc::kMaxInlineOutputBytes) {
      return Status::InvalidArgument(
          "its worker returned output " + std::to_string(index) + " of " +
          std::to_string(data.size() + metadata.size()) + " bytes in its completion, over the " +
          std::to_string(ipc::kMaxInlineOutputBytes) + " a completion may carry");
    }
    const Status put = store_.Put(
        worker,
        CreateParams{.id = outputs[index],
                     .data_size = data.size(),
                     .metadata = std::as_bytes(std::span(metadata.begin(), metadata.size())),
                     .data = std::as_bytes(std::span(data.begin(), data.size()))});
    if (!put.ok()) {
      return Status(put.code(), "its output " + std::to_string(index) +
                                    " could not be stored: " + put.message());
    }
  }
  return Status::OK();
}

bool TaskService::SealOutputs(ClientId worker, scheduler::Completion& completion,
                              capnp::List<uint32_t>::Reader indices) {
  const std::span<const ObjectId> outputs = scheduler_.RunningOutputs(worker, completion.task);
  // Not running here: the scheduler refuses the completion, and nothing is sealed for it.
  if (outputs.empty()) return true;
  // Copied: a seal answers gets, and a reply that cannot be written ends that client's
  // session, which may be this one (the task then runs elsewhere).
  std::vector<std::pair<uint32_t, ObjectId>> sealed;
  for (uint32_t index : indices) {
    if (index >= outputs.size()) {
      completion.ok = false;
      completion.message = "its worker sealed output " + std::to_string(index) +
                           " of a task with " + std::to_string(outputs.size()) + " outputs";
      return true;
    }
    sealed.emplace_back(index, outputs[index]);
  }
  // Seals finish at once, or after a checksum off the loop; the completion goes to the
  // scheduler after the last. `left` counts one more until every seal has been started.
  struct Sealing {
    scheduler::Completion completion;
    size_t left = 0;
  };
  auto sealing = std::make_shared<Sealing>(Sealing{.completion = completion, .left = 1});
  auto finish = [this, worker, sealing] {
    const Status st = scheduler_.Complete(worker, std::span(&sealing->completion, 1));
    room_waits_.LendAgain();
    room_waits_.TasksChanged();
    if (!st.ok()) spdlog::warn("session {}: complete: {}", worker, st.message());
  };
  for (const auto& [index, id] : sealed) {
    ++sealing->left;
    store_.Seal(worker, id, [sealing, index, finish](Status st) {
      scheduler::Completion& c = sealing->completion;
      if (!st.ok() && c.ok) {
        c.ok = false;
        c.message =
            ("its output " + std::to_string(index) + " could not be sealed: " + st.message())
                .substr(0, scheduler::kMaxFailureMessage);
      }
      if (--sealing->left == 0) finish();
    });
  }
  if (--sealing->left > 0) return false;
  completion = std::move(sealing->completion);
  return true;
}

void TaskService::Cancel(const Responder& reply, const Requester& who,
                         capnp::List<wire::Id>::Reader outputs) {
  if (outputs.size() > who.max_batch) {
    return reply.Error(Status::LimitExceeded("a cancel may name at most " +
                                             std::to_string(who.max_batch) + " outputs"));
  }
  const auto outcomes = scheduler_.Cancel(ipc::FromWire(outputs));
  EndUnwantedWaits();
  capnp::MallocMessageBuilder message;
  auto r = message.initRoot<wire::Reply>();
  auto out = r.initCancel(static_cast<unsigned>(outcomes.size()));
  for (unsigned i = 0; i < out.size(); ++i) out.set(i, ToWire(outcomes[i]));
  reply.Send(message, r);
}

void TaskService::DeleteAfterTasks(const Responder& reply, const Requester& who,
                                   capnp::List<wire::Id>::Reader list) {
  if (Status st = who.CheckBatch(list.size()); !st.ok()) return reply.Error(st);
  const std::vector<ObjectId> ids = ipc::FromWire(list);
  const std::vector<bool> later = scheduler_.DeleteAfterTasks(ids);
  EndUnwantedWaits();
  std::vector<ObjectId> now;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (!later[i]) now.push_back(ids[i]);
  }
  const std::vector<StatusCode> codes = store_.Delete(now, who.only_own_objects);
  capnp::MallocMessageBuilder message;
  auto r = message.initRoot<wire::Reply>();
  auto out = r.initDeleteAfterTasks(static_cast<unsigned>(ids.size()));
  for (unsigned i = 0, k = 0; i < out.size(); ++i) {
    out.set(i, ipc::ToWire(later[i] ? StatusCode::kOk : codes[k++]));
  }
  reply.Send(message, r);
}

void TaskService::Drain(const Responder& reply, const Requester& who) {
  reply.Answer(scheduler_.DrainWorker(who.client));
}

void TaskService::Workers(const Responder& reply) const {
  const auto workers = scheduler_.Workers();
  capnp::MallocMessageBuilder message;
  auto r = message.initRoot<wire::Reply>();
  auto out = r.initWorkers(static_cast<unsigned>(workers.size()));
  for (unsigned i = 0; i < out.size(); ++i) {
    const scheduler::WorkerInfo& w = workers[i];
    depot::WorkerInfo info{
        .session_id = w.id,
        .name = w.name,
        .cpus = w.capacity.cpu,
        .free_cpus = w.free_cpu,
        .gpus = {},
        .free_gpu_shares = {},
        .resources = w.capacity.custom,
        .functions = w.functions,
        .running = w.running,
        .queued = w.queued,
        .done = w.done,
        .failed = w.failed,
        .draining = w.draining,
        .attached_s = w.attached_s,
        .gpu_functions = w.gpu_functions,
    };
    for (const auto& [gpu, share] : w.free_gpu_share) {
      info.gpus.push_back(gpu);
      info.free_gpu_shares.push_back(share);
    }
    internal::ToWire(info, out[i]);
  }
  reply.Send(message, r);
}

void TaskService::Tasks(const Responder& reply) const {
  // A bounded reply: the first pending tasks, then the last finished ones.
  const auto tasks = scheduler_.Tasks(kMaxTasksListed);
  capnp::MallocMessageBuilder message;
  auto r = message.initRoot<wire::Reply>();
  auto out = r.initTasks(static_cast<unsigned>(tasks.size()));
  for (unsigned i = 0; i < out.size(); ++i) {
    const scheduler::TaskInfo& t = tasks[i];
    internal::ToWire(depot::TaskInfo{.task = t.id,
                                     .function = t.function,
                                     .state = Public(t.state),
                                     .submitter = t.submitter,
                                     .worker = t.worker,
                                     .device = t.device,
                                     .outputs = t.outputs,
                                     .priority = t.priority,
                                     .attempts = t.attempts,
                                     .inputs_missing = t.inputs_missing,
                                     .local_bytes = t.local_bytes,
                                     .moved_bytes = t.moved_bytes,
                                     .wait_s = t.wait_s,
                                     .transfer_s = t.transfer_s,
                                     .duration_s = t.duration_s,
                                     .reason = t.reason,
                                     .variant = t.variant,
                                     .variant_reason = t.variant_reason,
                                     .label = t.label},
                     out[i]);
  }
  reply.Send(message, r);
}

SchedulerStatus TaskService::Totals() const {
  const scheduler::SchedulerCounters c = scheduler_.counters();
  const scheduler::Bandwidths bw = scheduler_.bandwidths();
  return {
      .workers = c.workers,
      .tasks_pending = c.tasks_pending,
      .submitted = c.submitted,
      .completed = c.completed,
      .failed = c.failed,
      .cancelled = c.cancelled,
      .retried = c.retried,
      .placements = c.placements,
      .local_bytes = c.local_bytes,
      .moved_bytes = c.moved_bytes,
      .prefetches = c.prefetches,
      .steals = c.steals,
      .preemptions = c.preemptions,
      .host_to_gpu = bw.host_to_gpu,
      .gpu_to_host = bw.gpu_to_host,
      .gpu_to_gpu = bw.gpu_to_gpu,
      .bandwidths_measured = scheduler_.bandwidths_measured(),
  };
}

void TaskService::BoundsStuck() {
  if (bounds_timer_armed_) return;
  bounds_timer_armed_ = true;
  bounds_timer_.expires_after(RoomWaits::kGrace);
  bounds_timer_.async_wait([this](const boost::system::error_code& error) {
    if (error) return;  // cancelled: the service is going
    bounds_timer_armed_ = false;
    scheduler_.FailStuckBounds(std::chrono::duration<double>(RoomWaits::kGrace).count());
  });
}

void TaskService::EndUnwantedWaits() {
  if (room_waits_.size() == 0) return;
  room_waits_.EndUnwanted([this](const ObjectId& id) { return scheduler_.Unwanted(id); });
}

scheduler::SchedulerCounters TaskService::counters() const {
  scheduler::SchedulerCounters c = scheduler_.counters();
  c.room_waiting = room_waits_.size();
  c.room_waits = room_waits_.waited();
  c.room_waits_failed = room_waits_.failed();
  return c;
}

void TaskService::SessionClosed(uint64_t session) {
  room_waits_.SessionEnded(static_cast<ClientId>(session));
  scheduler_.RemoveSession(session);
  room_waits_.LendAgain();
  room_waits_.TasksChanged();
}

void TaskService::Assign(scheduler::SessionId worker,
                         std::span<const scheduler::Assignment> tasks) {
  capnp::MallocMessageBuilder message;
  auto reply = message.initRoot<wire::Reply>();
  reply.setId(0);
  auto out = reply.initAssign(static_cast<unsigned>(tasks.size()));
  for (unsigned i = 0; i < out.size(); ++i) {
    const scheduler::Assignment& a = tasks[i];
    auto o = out[i];
    o.setTask(a.task);
    o.setAttempt(a.attempt);
    o.setDevice(a.device);
    o.setAfter(a.after);
    o.setWorkerFull(a.worker_full);
    o.setFunction(a.spec->function);
    ipc::ToWire(a.spec->inputs, o.initInputs(static_cast<unsigned>(a.spec->inputs.size())));
    o.setArgs(capnp::Data::Reader(reinterpret_cast<const capnp::byte*>(a.spec->args.data()),
                                  a.spec->args.size()));
    ipc::ToWire(a.outputs, o.initOutputs(static_cast<unsigned>(a.outputs.size())));
    if (!a.sealed.empty()) {
      auto sealed = o.initSealed(static_cast<unsigned>(a.sealed.size()));
      for (unsigned k = 0; k < sealed.size(); ++k) sealed.set(k, a.sealed[k]);
    }
  }
  // A worker that has gone gets nothing: RemoveSession takes its tasks back.
  pushes_.Push(worker, message, reply);
  room_waits_.TasksChanged();  // one that starts may free room
}

void TaskService::Drained(scheduler::SessionId worker) {
  capnp::MallocMessageBuilder message(64);
  auto reply = message.initRoot<wire::Reply>();
  reply.setId(0);
  reply.setDrained();
  pushes_.Push(worker, message, reply);
}

}  // namespace depot::store
