#include "tasks.h"

#include <nanobind/stl/map.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <string>
#include <tuple>
#include <utility>

#include "buffers.h"
#include "depot/worker.h"
#include "errors.h"
#include "gil.h"
#include "ids.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace depot::python {
namespace {

std::vector<ObjectId> ToIds(nb::handle list) {
  std::vector<ObjectId> ids;
  for (nb::handle b : list) ids.push_back(ToId(nb::cast<nb::bytes>(b)));
  return ids;
}

nb::list IdList(std::span<const ObjectId> ids) {
  nb::list out;
  for (const ObjectId& id : ids) out.append(IdBytes(id));
  return out;
}

Affinity AffinityOf(const std::string& name) {
  if (name == "none") return Affinity::kNone;
  if (name == "soft") return Affinity::kSoft;
  if (name == "hard") return Affinity::kHard;
  throw nb::value_error(("affinity is 'none', 'soft' or 'hard', not '" + name + "'").c_str());
}

Variant VariantOf(const std::string& name) {
  if (name == "auto") return Variant::kAuto;
  if (name == "cpu") return Variant::kCpu;
  if (name == "gpu") return Variant::kGpu;
  throw nb::value_error(("variant is None, 'cpu' or 'gpu', not '" + name + "'").c_str());
}

TaskRequest RequestOf(nb::dict d) {
  TaskRequest r;
  for (auto [key, value] : d) {
    const std::string k = nb::cast<std::string>(key);
    if (k == "function") {
      r.function = nb::cast<std::string>(value);
    } else if (k == "inputs") {
      r.inputs = ToIds(value);
    } else if (k == "args") {
      const nb::bytes args = nb::cast<nb::bytes>(value);
      r.args.assign(args.c_str(), args.size());
    } else if (k == "outputs") {
      r.outputs = ToIds(value);
    } else if (k == "num_outputs") {
      r.num_outputs = nb::cast<uint32_t>(value);
    } else if (k == "cpu") {
      r.cpu = nb::cast<double>(value);
    } else if (k == "gpu") {
      r.gpu = nb::cast<double>(value);
    } else if (k == "resources") {
      r.resources = nb::cast<std::map<std::string, double>>(value);
    } else if (k == "affinity") {
      r.affinity = AffinityOf(nb::cast<std::string>(value));
    } else if (k == "priority") {
      r.priority = nb::cast<int32_t>(value);
    } else if (k == "retries") {
      r.retries = nb::cast<uint32_t>(value);
    } else if (k == "output_bytes") {
      r.output_bytes = nb::cast<uint64_t>(value);
    } else if (k == "detach") {
      r.detach = nb::cast<bool>(value);
    } else if (k == "host_inputs") {
      r.host_inputs = nb::cast<std::vector<uint32_t>>(value);
    } else if (k == "variant") {
      r.variant = VariantOf(nb::cast<std::string>(value));
    } else if (k == "label") {
      r.label = nb::cast<std::string>(value);
    } else if (k == "bound_id") {
      r.bound_id = nb::cast<uint64_t>(value);
    } else if (k == "bound_bytes") {
      r.bound_bytes = nb::cast<uint64_t>(value);
    } else if (k == "bound_waits") {
      r.bound_waits = nb::cast<bool>(value);
    } else if (k == "kind") {
      r.kind = nb::cast<std::string>(value);
    } else {
      throw nb::value_error(("a task has no field '" + k + "'").c_str());
    }
  }
  return r;
}

// A task while its function runs: what _depot.Worker passes to the Python callable. It
// points into the worker's TaskContext, so it answers only during that call (after, every
// use raises).
class TaskView {
 public:
  explicit TaskView(TaskContext* task) : task_(task) {}
  void End() { task_ = nullptr; }

  uint64_t task() const { return context().task(); }
  uint32_t attempt() const { return context().attempt(); }
  int device() const { return context().device(); }
  nb::list inputs() const { return IdList(context().inputs()); }
  nb::list outputs() const { return IdList(context().outputs()); }
  nb::bytes args() const {
    const std::string_view a = context().args();
    return nb::bytes(a.data(), a.size());
  }
  bool sealed(size_t output) const { return context().sealed(output); }
  // Output `output`: `data` (any contiguous buffer) and `metadata`, as TaskContext::Put.
  void Put(size_t output, nb::handle data, nb::bytes metadata) {
    TaskContext& task = context();
    const ReadView view(data);
    Status st;
    {
      ReleaseGil release;
      st = task.Put(output, view.bytes(), BytesOf(metadata));
    }
    RaiseIfError(st);
  }
  // Output `output` given as parts: `parts` at `offsets` of `size` bytes, as
  // TaskContext::PutParts.
  void PutParts(size_t output, nb::list parts, const std::vector<uint64_t>& offsets, uint64_t size,
                nb::bytes metadata) {
    TaskContext& task = context();
    const Parts viewed = ViewParts(parts, offsets);
    Status st;
    {
      ReleaseGil release;
      st = task.PutParts(output, size, viewed.parts, BytesOf(metadata));
    }
    RaiseIfError(st);
  }
  // Several outputs given as parts, each a tuple (output, parts, offsets, size,
  // metadata): those not carried by the completion are created in one round trip
  // (TaskContext::PutPartsMany).
  void PutPartsMany(nb::list outputs) {
    TaskContext& task = context();
    std::vector<Parts> viewed;
    std::vector<nb::bytes> metadata;
    std::vector<TaskContext::OutputParts> batch;
    viewed.reserve(outputs.size());
    metadata.reserve(outputs.size());
    batch.reserve(outputs.size());
    for (nb::handle item : outputs) {
      auto [output, parts, offsets, size, meta] =
          nb::cast<std::tuple<size_t, nb::list, std::vector<uint64_t>, uint64_t, nb::bytes>>(item);
      viewed.push_back(ViewParts(parts, offsets));
      metadata.push_back(std::move(meta));
      batch.push_back({.output = output,
                       .data_size = size,
                       .parts = viewed.back().parts,
                       .metadata = BytesOf(metadata.back())});
    }
    Status st;
    {
      ReleaseGil release;
      st = task.PutPartsMany(batch);
    }
    RaiseIfError(st);
  }
  // Output `output`'s writable memory, `size` bytes, sealed with the task's completion
  // (TaskContext::Create).
  WritableBuffer Create(size_t output, uint64_t size, nb::bytes metadata) {
    TaskContext& task = context();
    Result<MutableBuffer> r = [&] {
      ReleaseGil release;
      return task.Create(output, size, BytesOf(metadata));
    }();
    return WritableBuffer{ValueOrRaise(std::move(r))};
  }
  void Abort(size_t output) {
    TaskContext& task = context();
    Status st;
    {
      ReleaseGil release;
      st = task.Abort(output);
    }
    RaiseIfError(st);
  }

 private:
  TaskContext& context() const {
    if (task_ == nullptr) throw nb::value_error("the task is over: its context is gone");
    return *task_;
  }
  TaskContext* task_;
};

// A depot::Worker whose functions are Python callables: each gets a TaskView and returns
// None (done) or a string (the task failed with it as its message).
class PyWorker {
 public:
  PyWorker(const std::string& socket_path, const std::string& name, double cpus,
           std::vector<int> gpus, std::map<std::string, double> resources) {
    WorkerOptions options{.socket_path = socket_path,
                          .name = name,
                          .cpus = cpus,
                          .gpus = std::move(gpus),
                          .resources = std::move(resources)};
    Result<std::unique_ptr<Worker>> worker = [&] {
      ReleaseGil release;
      return Worker::Connect(std::move(options));
    }();
    worker_ = ValueOrRaise(std::move(worker));
  }
  ~PyWorker() {
    // The functions hold Python callables: they go with the GIL held (it is, here).
    worker_.reset();
  }

  // `cpu` runs tasks as registered (or on host memory, with a GPU variant), `gpu` those on a
  // GPU; either may be None.
  void Register(const std::string& name, nb::object cpu, nb::object gpu) {
    worker_->Register(name, Wrap(std::move(cpu)), Wrap(std::move(gpu)));
  }

  void Run() {
    Status st;
    {
      ReleaseGil release;
      st = worker_->Run();
    }
    RaiseIfError(st);
  }

  void Stop() {
    ReleaseGil release;
    worker_->Stop();
  }

  uint64_t session_id() { return worker_->client().session_id(); }

 private:
  static Worker::Function Wrap(nb::object function) {
    if (function.is_none()) return nullptr;
    auto held = std::make_shared<nb::callable>(nb::cast<nb::callable>(function));
    return [held](TaskContext& task) -> Status {
      nb::gil_scoped_acquire gil;
      auto* view = new TaskView(&task);
      nb::object context = nb::cast(view, nb::rv_policy::take_ownership);
      Status status;
      try {
        nb::object result = (*held)(context);
        if (!result.is_none()) status = Status::Internal(nb::cast<std::string>(result));
      } catch (nb::python_error& e) {
        status = Status::Internal(e.what());
      } catch (const std::exception& e) {
        status = Status::Internal(std::string("the function's wrapper failed: ") + e.what());
      }
      view->End();
      return status;
    };
  }

  std::unique_ptr<Worker> worker_;
};

std::string OutcomeName(CancelOutcome outcome) {
  switch (outcome) {
    case CancelOutcome::kCancelled:
      return "cancelled";
    case CancelOutcome::kRunning:
      return "running";
    case CancelOutcome::kFinished:
      return "finished";
    case CancelOutcome::kUnknown:
      break;
  }
  return "unknown";
}

}  // namespace

std::vector<std::vector<nb::bytes>> Submit(Client& client, nb::list tasks) {
  std::vector<TaskRequest> requests;
  for (nb::handle t : tasks) requests.push_back(RequestOf(nb::cast<nb::dict>(t)));
  Result<std::vector<std::vector<ObjectId>>> r = [&] {
    ReleaseGil release;
    return client.Submit(requests);
  }();
  std::vector<std::vector<nb::bytes>> out;
  for (const auto& outputs : ValueOrRaise(std::move(r))) {
    auto& ids = out.emplace_back();
    for (const ObjectId& id : outputs) ids.push_back(IdBytes(id));
  }
  return out;
}

std::vector<std::string> Cancel(Client& client, const std::vector<nb::bytes>& outputs) {
  std::vector<ObjectId> ids;
  for (const nb::bytes& b : outputs) ids.push_back(ToId(b));
  Result<std::vector<CancelOutcome>> r = [&] {
    ReleaseGil release;
    return client.Cancel(ids);
  }();
  std::vector<std::string> out;
  for (CancelOutcome o : ValueOrRaise(std::move(r))) out.push_back(OutcomeName(o));
  return out;
}

void BindTasks(nb::module_& m) {
  nb::class_<TaskView>(m, "TaskContext", "A task while its function runs (depot.Worker).")
      .def_prop_ro("task", &TaskView::task)
      .def_prop_ro("attempt", &TaskView::attempt)
      .def_prop_ro("device", &TaskView::device)
      .def_prop_ro("inputs", &TaskView::inputs)
      .def_prop_ro("outputs", &TaskView::outputs)
      .def_prop_ro("args", &TaskView::args)
      .def("sealed", &TaskView::sealed, "output"_a)
      .def("put", &TaskView::Put, "output"_a, "data"_a, "metadata"_a)
      .def("put_parts", &TaskView::PutParts, "output"_a, "parts"_a, "offsets"_a, "size"_a,
           "metadata"_a)
      .def("put_parts_many", &TaskView::PutPartsMany, "outputs"_a)
      .def("create", &TaskView::Create, "output"_a, "size"_a, "metadata"_a)
      .def("abort", &TaskView::Abort, "output"_a);
  nb::class_<PyWorker>(m, "Worker", "A worker process's attachment to depotd's scheduler.")
      .def(nb::init<const std::string&, const std::string&, double, std::vector<int>,
                    std::map<std::string, double>>(),
           "socket_path"_a, "name"_a, "cpus"_a, "gpus"_a, "resources"_a)
      .def("register", &PyWorker::Register, "name"_a, "cpu"_a.none(), "gpu"_a.none() = nb::none())
      .def("run", &PyWorker::Run)
      .def("stop", &PyWorker::Stop)
      .def_prop_ro("session_id", &PyWorker::session_id);
}

}  // namespace depot::python
