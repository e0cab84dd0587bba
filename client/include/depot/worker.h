// A worker: a process that runs tasks for the daemon's scheduler (depot/task.h).
//
//   DEPOT_ASSIGN_OR_RETURN(auto worker, depot::Worker::Connect({.cpus = 4, .gpus = {0}}));
//   worker->Register("sum", [](depot::TaskContext& task) -> depot::Status {
//     DEPOT_ASSIGN_OR_RETURN(auto inputs, task.Inputs());
//     double total = ...;  // read inputs[0].data()
//     return task.client().Put(task.outputs()[0], bytes_of(total));
//   });
//   return worker->Run();
//
// A worker registers its resources (CPU slots, GPUs, custom ones) and its functions; the
// daemon sends it tasks as they fit those resources, over the worker's own connection, and
// it runs each on a thread of its own. A function reads its inputs, creates and seals each
// of its outputs (Create/Seal, Put, CreateOnDevice...) with the task's output ids, and
// returns OK, or an error whose message becomes the task's failure: a get of its outputs
// then answers TaskFailed with it. The outputs it created but did not seal are aborted.
// If the worker dies, the daemon runs its tasks again elsewhere (up to their retries).
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "depot/client.h"

namespace depot {

class TaskContext {
 public:
  uint64_t task() const { return task_; }
  // 1 for a task's first run; more when earlier workers died running it.
  uint32_t attempt() const { return attempt_; }
  // The GPU the task was given, as this process's ordinal (Client's GPU calls take it), or
  // Client::kHostMemory for a CPU task.
  int device() const { return device_; }
  std::span<const ObjectId> inputs() const { return inputs_; }
  std::string_view args() const { return args_; }
  std::span<const ObjectId> outputs() const { return outputs_; }
  Client& client() { return client_; }

  // The inputs in host memory, in order (copied there from a GPU where they are not).
  Result<std::vector<Buffer>> Inputs();
  // The inputs on the task's GPU, in order; InvalidArgument for a CPU task.
  Result<std::vector<DeviceBuffer>> DeviceInputs();

 private:
  friend class Worker;
  TaskContext(Client& client, uint64_t task, uint32_t attempt, int device)
      : client_(client), task_(task), attempt_(attempt), device_(device) {}

  Client& client_;
  uint64_t task_;
  uint32_t attempt_;
  int device_;
  std::vector<ObjectId> inputs_;
  std::string args_;
  std::vector<ObjectId> outputs_;
};

struct WorkerOptions {
  std::string socket_path;  // empty: as Client::Connect
  std::string name;         // for depotctl workers; default: this program's name
  double cpus = 1;          // CPU slots: tasks asking for CPU=1 that may run at once
  std::vector<int> gpus;    // this process's GPU ordinals it offers, each whole
  std::map<std::string, double> resources;  // custom resources, e.g. {"ssd", 1}
};

class Worker {
 public:
  using Function = std::function<Status(TaskContext&)>;

  // Connects to the daemon (as Client::Connect; the worker's Client). InvalidArgument for a
  // GPU ordinal the daemon does not serve.
  static Result<std::unique_ptr<Worker>> Connect(WorkerOptions options);
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // Registers `function` as `name`, before Run. A later registration of a name replaces it.
  void Register(std::string name, Function function);

  // Attaches to the scheduler and runs the tasks it sends until Stop (then OK, once the
  // running tasks are complete) or until the connection breaks (Disconnected). Fails at
  // once with the daemon's reason if it refuses the registration.
  Status Run();
  // Asks the daemon for no more tasks: Run returns once the running ones are complete. Before
  // Run, or while it registers, Run returns as soon as it has registered. Thread-safe; not
  // async-signal-safe (from a signal handler, use a thread that waits).
  void Stop();

  // The worker's own Client: functions use it through TaskContext::client().
  Client& client() { return client_; }

 private:
  struct Pool;
  explicit Worker(Client client, WorkerOptions options);

  Client client_;
  WorkerOptions options_;
  std::map<std::string, Function> functions_;
  std::unique_ptr<Pool> pool_;
  std::atomic<bool> stop_requested_{false};
};

}  // namespace depot
