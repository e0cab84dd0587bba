// depot-example-worker: attaches to a depotd as a worker and runs these functions.
//
//   noop        seals each output, empty
//   sum         output 0: the sum of input 0 read as float64 values (8 bytes, a float64)
//   copy        output k: the bytes of input k (on the task's GPU for a GPU task)
//   twin        as copy, registered as two variants, one for host memory and one for GPUs:
//               the scheduler chooses where each task runs by the copies its inputs need
//   fill        output 0: as many bytes as the inline arguments say (decimal), float64 ones
//   add         output 0: the element-wise sum of its inputs, float64 arrays of one size
//   fail        fails, with the inline arguments as its message
//   stall_once  as copy, except that its first attempt puts its first output at once (in
//               host memory, when it has an input) and then never finishes: it waits until
//               the worker is killed, so that the task is run again elsewhere (fault tests)
//
//   depot-example-worker --socket /tmp/d.sock --cpus 2 --gpus 0,1
#include <CLI/CLI.hpp>

#include <atomic>
#include <csignal>
#include <cstring>
#include <iostream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "depot/worker.h"

#if DEPOT_EXAMPLE_WORKER_CUDA
#include "depot/ipc/cuda_driver.h"
#endif

namespace {

using depot::Result;
using depot::Status;
using depot::TaskContext;

Status Noop(TaskContext& task) {
  for (size_t k = 0; k < task.outputs().size(); ++k) DEPOT_RETURN_NOT_OK(task.Put(k, {}));
  return Status::OK();
}

Status Sum(TaskContext& task) {
  if (task.inputs().size() != 1 || task.outputs().size() != 1) {
    return Status::InvalidArgument("sum takes one input and makes one output");
  }
  DEPOT_ASSIGN_OR_RETURN(auto inputs, task.Inputs());
  const std::span<const std::byte> bytes = inputs[0].data();
  double total = 0;
  for (size_t i = 0; i + sizeof(double) <= bytes.size(); i += sizeof(double)) {
    double value;
    std::memcpy(&value, bytes.data() + i, sizeof value);
    total += value;
  }
  return task.Put(0, std::as_bytes(std::span(&total, 1)));
}

// Copies `size` bytes between two addresses of the task's GPU.
Status CopyOnDevice(const depot::DeviceBuffer& from, const depot::MutableDeviceBuffer& to) {
  if (to.simulated()) {
    if (from.size() != 0) {
      std::memcpy(reinterpret_cast<void*>(to.device_ptr()),
                  reinterpret_cast<const void*>(from.device_ptr()), from.size());
    }
    return Status::OK();
  }
#if DEPOT_EXAMPLE_WORKER_CUDA
  using depot::ipc::CudaDriver;
  DEPOT_ASSIGN_OR_RETURN(const CudaDriver* driver, CudaDriver::Load());
  CUdevice device = 0;
  DEPOT_RETURN_NOT_OK(driver->Check(driver->DeviceGet(&device, to.device()), "cuDeviceGet"));
  DEPOT_ASSIGN_OR_RETURN(auto context, depot::ipc::CudaPrimaryContext::Retain(*driver, device));
  DEPOT_ASSIGN_OR_RETURN(auto scope, depot::ipc::CudaContextScope::Enter(*driver, context->get()));
  DEPOT_RETURN_NOT_OK(driver->Check(
      driver->MemcpyDtoDAsync(to.device_ptr(), from.device_ptr(), from.size(), nullptr),
      "cuMemcpyDtoDAsync"));
  return driver->Check(driver->StreamSynchronize(nullptr), "cuStreamSynchronize");
#else
  return Status::InvalidArgument("this build has no CUDA: it copies on simulated GPUs only");
#endif
}

Status CopyOnHost(TaskContext& task) {
  if (task.inputs().size() != task.outputs().size()) {
    return Status::InvalidArgument("copy makes one output per input");
  }
  DEPOT_ASSIGN_OR_RETURN(auto inputs, task.Inputs());
  for (size_t k = 0; k < inputs.size(); ++k) {
    DEPOT_RETURN_NOT_OK(task.Put(k, inputs[k].data()));
  }
  return Status::OK();
}

Status CopyOnGpu(TaskContext& task) {
  if (task.inputs().size() != task.outputs().size()) {
    return Status::InvalidArgument("copy makes one output per input");
  }
  if (task.device() == depot::Client::kHostMemory) {
    return Status::Internal("the GPU variant was sent a task to run on host memory");
  }
  depot::Client& client = task.client();
  DEPOT_ASSIGN_OR_RETURN(auto inputs, task.DeviceInputs());
  for (size_t k = 0; k < inputs.size(); ++k) {
    if (task.sealed(k)) continue;  // made by an earlier attempt
    DEPOT_ASSIGN_OR_RETURN(
        auto out, client.CreateOnDevice(task.outputs()[k], inputs[k].size(), task.device()));
    DEPOT_RETURN_NOT_OK(CopyOnDevice(inputs[k], out));
    DEPOT_RETURN_NOT_OK(client.Seal(task.outputs()[k], /*stream=*/0));
  }
  return Status::OK();
}

Status Copy(TaskContext& task) {
  return task.device() == depot::Client::kHostMemory ? CopyOnHost(task) : CopyOnGpu(task);
}

Status Fill(TaskContext& task) {
  uint64_t bytes = 0;
  try {
    bytes = std::stoull(std::string(task.args()));
  } catch (const std::exception&) {
    return Status::InvalidArgument("fill wants its size in bytes as its arguments");
  }
  if (task.sealed(0)) return Status::OK();  // made by an earlier attempt
  DEPOT_ASSIGN_OR_RETURN(auto out, task.client().Create(task.outputs()[0], bytes));
  const double one = 1.0;
  for (uint64_t i = 0; i + sizeof one <= bytes; i += sizeof one) {
    std::memcpy(out.ptr() + i, &one, sizeof one);
  }
  return task.client().Seal(task.outputs()[0]);
}

Status Add(TaskContext& task) {
  DEPOT_ASSIGN_OR_RETURN(auto inputs, task.Inputs());
  if (inputs.empty()) return Status::InvalidArgument("add needs inputs");
  if (task.sealed(0)) return Status::OK();  // made by an earlier attempt
  const size_t size = inputs[0].size();
  for (const depot::Buffer& in : inputs) {
    if (in.size() != size) return Status::InvalidArgument("add needs inputs of one size");
  }
  DEPOT_ASSIGN_OR_RETURN(auto out, task.client().Create(task.outputs()[0], size));
  const size_t n = size / sizeof(double);
  auto* sum = reinterpret_cast<double*>(out.ptr());
  std::memcpy(sum, inputs[0].data().data(), n * sizeof(double));
  for (size_t k = 1; k < inputs.size(); ++k) {
    const auto* add = reinterpret_cast<const double*>(inputs[k].data().data());
    for (size_t i = 0; i < n; ++i) sum[i] += add[i];
  }
  return task.client().Seal(task.outputs()[0]);
}

Status Fail(TaskContext& task) {
  return Status::InvalidArgument(task.args().empty() ? "fail was asked to fail"
                                                     : std::string(task.args()));
}

Status StallOnce(TaskContext& task) {
  if (task.attempt() == 1) {
    if (!task.inputs().empty()) {
      DEPOT_ASSIGN_OR_RETURN(depot::Buffer first, task.client().Get(task.inputs()[0]));
      DEPOT_RETURN_NOT_OK(task.client().Put(task.outputs()[0], first.data()));
    }
    std::cerr << "depot-example-worker: task " << task.task() << " stalls (first attempt)"
              << std::endl;
    for (;;) ::pause();  // until this process is killed
  }
  return Copy(task);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"depot-example-worker: runs noop, sum, copy, twin, fill, add, fail and stall_once",
               "depot-example-worker"};
  depot::WorkerOptions options;
  options.name = "depot-example-worker";
  app.add_option("--socket", options.socket_path, "the daemon's socket (default: as depotctl)")
      ->option_text("PATH");
  app.add_option("--cpus", options.cpus, "CPU slots (default 1)")->option_text("N");
  app.add_option("--gpus", options.gpus, "GPU ordinals offered, e.g. 0,1")
      ->delimiter(',')
      ->option_text("LIST");
  std::vector<std::string> resources;
  app.add_option("--resource", resources, "a custom resource, NAME=AMOUNT (repeatable)")
      ->option_text("NAME=AMOUNT");
  app.add_option("--name", options.name, "shown by depotctl workers");
  CLI11_PARSE(app, argc, argv);
  for (const std::string& r : resources) {
    const auto eq = r.find('=');
    try {
      if (eq == std::string::npos) throw std::invalid_argument(r);
      options.resources[r.substr(0, eq)] = std::stod(r.substr(eq + 1));
    } catch (const std::exception&) {
      std::cerr << "depot-example-worker: --resource wants NAME=AMOUNT, not '" << r << "'\n";
      return 2;
    }
  }

  auto worker = depot::Worker::Connect(options);
  if (!worker.ok()) {
    std::cerr << "depot-example-worker: " << worker.status().ToString() << "\n";
    return 1;
  }
  (*worker)->Register("noop", Noop);
  (*worker)->Register("sum", Sum);
  (*worker)->Register("copy", Copy);
  (*worker)->Register("twin", CopyOnHost, CopyOnGpu);
  (*worker)->Register("fill", Fill);
  (*worker)->Register("add", Add);
  (*worker)->Register("fail", Fail);
  (*worker)->Register("stall_once", StallOnce);

  // SIGINT and SIGTERM drain the worker: it finishes what it runs, then exits.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  std::atomic<bool> ended_already{false};
  std::thread stopper([&] {
    int signal = 0;
    sigwait(&stop_signals, &signal);
    if (!ended_already.load()) (*worker)->Stop();
  });
  Status ended = (*worker)->Run();
  ended_already.store(true);
  pthread_kill(stopper.native_handle(), SIGTERM);  // wakes its sigwait, if still there
  stopper.join();
  if (!ended.ok()) {
    std::cerr << "depot-example-worker: " << ended.ToString() << "\n";
    return 1;
  }
  return 0;
}
