// A worker: a process that runs tasks for the daemon's scheduler (depot/task.h).
//
//   DEPOT_ASSIGN_OR_RETURN(auto worker, depot::Worker::Connect({.cpus = 4, .gpus = {0}}));
//   worker->Register("sum", [](depot::TaskContext& task) -> depot::Status {
//     DEPOT_ASSIGN_OR_RETURN(auto inputs, task.Inputs());
//     double total = ...;  // read inputs[0].data()
//     return task.Put(0, bytes_of(total));
//   });
//   return worker->Run();
//
// A worker registers its resources (CPU slots, GPUs, custom ones) and its functions; the
// daemon sends it tasks as they fit those resources, over the worker's own connection. A
// function reads its inputs, makes each of its outputs (TaskContext::Put, PutParts or
// Create, which the daemon seals with the task's completion; or the Client's Create/Seal,
// CreateOnDevice... with the task's output ids), and returns OK, or an error whose message
// becomes the task's failure: a get of its outputs then answers TaskFailed with it. The
// outputs it created but did not seal are aborted. If the worker dies, the
// daemon runs its tasks again elsewhere (up to their retries), keeping the outputs it had
// sealed (TaskContext::sealed).
//
// Tasks run on a pool of threads, each task on one thread from start to end. The thread
// that reads a batch of assignments runs the first itself, with no hand-off, and wakes one
// other thread to read on or to take the next; completions of short tasks run back to back
// go to the daemon together, so a function must not wait for what another task makes
// unless it is one of its inputs (its completion, with small outputs, may be held back
// while this one runs). A failure message goes to the daemon cut to 4 KiB.
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

  // Whether an earlier attempt of this task sealed `output` before its worker died: the
  // object stays as it was, and this attempt must not make it again (Put skips it).
  bool sealed(size_t output) const;

  // The inputs in host memory, in order (copied there from a GPU where they are not).
  Result<std::vector<Buffer>> Inputs();
  // The inputs on the task's GPU, in order; InvalidArgument for a CPU task.
  Result<std::vector<DeviceBuffer>> DeviceInputs();

  // Stores output `output` (an index into outputs()) in host memory with these bytes, as
  // Client::Put would. Up to 64 KiB (ipc::kMaxInlineOutputBytes) of data and metadata, the
  // bytes are copied and travel to the daemon with the task's completion: no round trip
  // now, and the daemon stores them before it counts the task done (a value it cannot
  // store fails the task, with why). Larger values are created at once (one round trip)
  // and copied in, and the daemon seals them with the completion, as Create's outputs.
  // Either way an output is sealed only once the function has returned: a get of it from
  // inside the function waits (for its timeout).
  // OK without doing anything for an output an earlier attempt sealed; InvalidArgument for
  // an index out of range, AlreadyExists for an output put or created twice.
  Status Put(size_t output, std::span<const std::byte> data,
             std::span<const std::byte> metadata = {});
  // Put of an output given as parts (Client::PutParts): InvalidArgument for parts that
  // CheckParts refuses.
  Status PutParts(size_t output, uint64_t data_size, std::span<const PutPart> parts,
                  std::span<const std::byte> metadata = {});
  // One output of PutPartsMany, as PutParts takes it.
  struct OutputParts {
    size_t output = 0;
    uint64_t data_size = 0;
    std::span<const PutPart> parts;
    std::span<const std::byte> metadata;
  };
  // PutParts of several outputs, those that the completion cannot carry created in one
  // round trip (Client::CreateMany) rather than one each: a task with many outputs waits
  // for the daemon once. Checks every item first (its parts, its index, an output named
  // twice) and makes none if one is wrong; then returns the first create's error, if any,
  // having filled the outputs it did create (aborted with the task if it fails, as
  // Create's are).
  Status PutPartsMany(std::span<const OutputParts> outputs);
  // Output `output` in host memory, `data_size` bytes, to fill in place: the daemon seals it
  // with the task's completion when the function returns OK (no round trip for the seal),
  // and it is aborted when the function fails. The buffer must not be written after the
  // function returns. Errors as Put's, and as Client::Create's; for an output an earlier
  // attempt sealed, AlreadySealed (check sealed() first).
  Result<MutableBuffer> Create(size_t output, uint64_t data_size,
                               std::span<const std::byte> metadata = {});
  // Drops output `output` made by Create and not sealed: it may then be put again.
  // InvalidArgument for an output this task did not create.
  Status Abort(size_t output);

 private:
  friend class Worker;
  // An output carried by the completion.
  struct Value {
    uint32_t index;
    std::string data;
    std::string metadata;
  };
  // An output created and filled here, for the daemon to seal with the completion.
  struct Created {
    uint32_t index;
    MutableBuffer buffer;  // the creator's reference, held until the completion is sent
  };
  // InvalidArgument for an index out of range, AlreadyExists for an output made already.
  Status CheckNew(size_t output) const;
  // Whether the completion carries an output of `bytes` (data and metadata): small enough,
  // and room left in it (Put, PutPartsMany).
  bool Carries(uint64_t bytes) const;
  TaskContext(Client& client, uint64_t task, uint32_t attempt, int device, size_t inline_budget,
              unsigned copy_threads)
      : client_(client),
        task_(task),
        attempt_(attempt),
        device_(device),
        inline_budget_(inline_budget),
        copy_threads_(copy_threads) {}

  Client& client_;
  uint64_t task_;
  uint32_t attempt_;
  int device_;
  std::vector<ObjectId> inputs_;
  std::string args_;
  std::vector<ObjectId> outputs_;
  std::vector<uint32_t> sealed_;
  std::vector<Value> values_;
  std::vector<Created> created_;
  size_t inline_budget_;  // bytes the completion may carry in all
  size_t inline_bytes_ = 0;
  unsigned copy_threads_;  // for outputs of 16 MiB or more (ConnectOptions::copy_threads)
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
  // It runs every task of that name sent here, on host memory or on a GPU as the task asks.
  void Register(std::string name, Function function);
  // Registers two variants under one name: `cpu` runs the tasks placed on host memory, `gpu`
  // those placed on one of this worker's GPUs (TaskContext::device()). The scheduler chooses
  // per task, by which it expects to finish first counting the copies its inputs need
  // (TaskRequest::variant). Either may be empty: that variant is not offered here.
  void Register(std::string name, Function cpu, Function gpu);

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

  struct Registered {
    Function function;      // as is, or the CPU variant
    Function gpu_function;  // the GPU variant, if any
    // How long each ran lately, a moving average; -1 until it has run.
    std::atomic<int64_t> ns{-1};
    std::atomic<int64_t> gpu_ns{-1};
  };
  // The loop each of the pool's threads runs (Run's own too): take a job, read the daemon's
  // pushes, or wait; until the daemon has drained the worker or the connection ends.
  void Serve();

  Client client_;
  WorkerOptions options_;
  std::map<std::string, Registered> functions_;
  std::unique_ptr<Pool> pool_;
  std::atomic<bool> stop_requested_{false};
};

}  // namespace depot
