// Client's task calls (depot/task.h): submit, cancel, and the scheduler's views.
#include <utility>

#include "connection.h"
#include "depot/client.h"
#include "depot/ipc/protocol.h"
#include "depot/task.h"
#include "info_fields.h"

namespace depot {

using internal::CheckBatch;
using internal::Decode;
using internal::Reply;
using internal::RequestMessage;
using internal::UnexpectedReply;

namespace {

void ToWire(const std::map<std::string, double>& resources,
            capnp::List<wire::Resource>::Builder out) {
  unsigned i = 0;
  for (const auto& [name, amount] : resources) {
    out[i].setName(name);
    out[i].setAmount(amount);
    ++i;
  }
}

void ToWire(const TaskRequest& t, wire::TaskSpec::Builder out) {
  out.setFunction(t.function);
  ipc::ToWire(t.inputs, out.initInputs(static_cast<unsigned>(t.inputs.size())));
  out.setArgs(
      capnp::Data::Reader(reinterpret_cast<const capnp::byte*>(t.args.data()), t.args.size()));
  ipc::ToWire(t.outputs, out.initOutputs(static_cast<unsigned>(t.outputs.size())));
  out.setNumOutputs(t.num_outputs);
  out.setCpu(t.cpu);
  out.setGpu(t.gpu);
  ToWire(t.resources, out.initResources(static_cast<unsigned>(t.resources.size())));
  out.setAffinity(t.affinity == Affinity::kHard   ? wire::Affinity::HARD
                  : t.affinity == Affinity::kSoft ? wire::Affinity::SOFT
                                                  : wire::Affinity::NONE);
  out.setPriority(t.priority);
  out.setRetries(t.retries);
  out.setOutputBytes(t.output_bytes);
  out.setDetach(t.detach);
  auto host_inputs = out.initHostInputs(static_cast<unsigned>(t.host_inputs.size()));
  for (unsigned i = 0; i < host_inputs.size(); ++i) host_inputs.set(i, t.host_inputs[i]);
  out.setVariant(t.variant == Variant::kCpu   ? wire::Variant::CPU
                 : t.variant == Variant::kGpu ? wire::Variant::GPU
                                              : wire::Variant::AUTO);
  out.setLabel(t.label);
  out.setBoundId(t.bound_id);
  out.setBoundBytes(t.bound_bytes);
  out.setBoundWaits(t.bound_waits);
  out.setKind(t.kind);
}

}  // namespace

const char* TaskStateName(TaskState state) {
  static constexpr const char* kNames[] = {"waiting", "ready",  "queued",   "running",
                                           "done",    "failed", "cancelled"};
  const auto i = static_cast<size_t>(state);
  return i < std::size(kNames) ? kNames[i] : "unknown";
}

Result<std::vector<std::vector<ObjectId>>> Client::Submit(std::span<const TaskRequest> tasks) {
  DEPOT_RETURN_NOT_OK(CheckBatch(tasks.size(), *conn_, "a submit"));
  RequestMessage request;
  auto list = request.root().initSubmit(static_cast<unsigned>(tasks.size()));
  for (unsigned i = 0; i < tasks.size(); ++i) ToWire(tasks[i], list[i]);
  Reply reply;
  DEPOT_RETURN_NOT_OK(conn_->Call(request, &reply));
  return Decode([&]() -> Result<std::vector<std::vector<ObjectId>>> {
    auto r = reply.get();
    if (!r.isSubmit() || r.getSubmit().size() != tasks.size()) return UnexpectedReply("submit");
    std::vector<std::vector<ObjectId>> outputs;
    outputs.reserve(tasks.size());
    for (auto t : r.getSubmit()) outputs.push_back(ipc::FromWire(t.getIds()));
    return outputs;
  });
}

Result<std::vector<ObjectId>> Client::Submit(const TaskRequest& task) {
  DEPOT_ASSIGN_OR_RETURN(auto outputs, Submit(std::span(&task, 1)));
  return std::move(outputs[0]);
}

Result<std::vector<CancelOutcome>> Client::Cancel(std::span<const ObjectId> outputs) {
  DEPOT_RETURN_NOT_OK(CheckBatch(outputs.size(), *conn_, "a cancel"));
  RequestMessage request;
  ipc::ToWire(outputs, request.root().initCancel(static_cast<unsigned>(outputs.size())));
  Reply reply;
  DEPOT_RETURN_NOT_OK(conn_->Call(request, &reply));
  return Decode([&]() -> Result<std::vector<CancelOutcome>> {
    auto r = reply.get();
    if (!r.isCancel() || r.getCancel().size() != outputs.size()) return UnexpectedReply("cancel");
    std::vector<CancelOutcome> out;
    for (auto o : r.getCancel()) out.push_back(static_cast<CancelOutcome>(o));
    return out;
  });
}

Result<std::vector<WorkerInfo>> Client::Workers() {
  RequestMessage request;
  request.root().setWorkers();
  Reply reply;
  DEPOT_RETURN_NOT_OK(conn_->Call(request, &reply));
  return Decode([&]() -> Result<std::vector<WorkerInfo>> {
    auto r = reply.get();
    if (!r.isWorkers()) return UnexpectedReply("workers");
    std::vector<WorkerInfo> out;
    internal::ReadWire(r.getWorkers(), out);
    return out;
  });
}

Result<std::vector<TaskInfo>> Client::Tasks() {
  RequestMessage request;
  request.root().setTasks();
  Reply reply;
  DEPOT_RETURN_NOT_OK(conn_->Call(request, &reply));
  return Decode([&]() -> Result<std::vector<TaskInfo>> {
    auto r = reply.get();
    if (!r.isTasks()) return UnexpectedReply("tasks");
    std::vector<TaskInfo> out;
    internal::ReadWire(r.getTasks(), out);
    return out;
  });
}

}  // namespace depot
