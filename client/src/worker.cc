#include "depot/worker.h"

#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <system_error>
#include <thread>
#include <utility>

#include "connection.h"
#include "depot/ipc/protocol.h"

namespace depot {

using internal::Decode;
using internal::Reply;
using internal::RequestMessage;

Result<std::vector<Buffer>> TaskContext::Inputs() {
  DEPOT_ASSIGN_OR_RETURN(auto buffers, client_.Get(inputs_));
  for (size_t i = 0; i < buffers.size(); ++i) {
    if (!buffers[i]) return Status::NotFound("input " + inputs_[i].Hex() + " is gone");
  }
  return buffers;
}

Result<std::vector<DeviceBuffer>> TaskContext::DeviceInputs() {
  if (device_ == Client::kHostMemory) {
    return Status::InvalidArgument("task " + std::to_string(task_) + " runs on no GPU");
  }
  return client_.GetOnDevice(inputs_, device_);
}

// The threads that run tasks, one per task running, and the completions they report.
struct Worker::Pool {
  struct Job {
    uint64_t task = 0;
    uint32_t attempt = 1;
    int device = Client::kHostMemory;
    std::string function;
    std::vector<ObjectId> inputs;
    std::string args;
    std::vector<ObjectId> outputs;
  };
  struct Done {
    uint64_t task = 0;
    Status status;
  };

  std::mutex mu;
  std::condition_variable cv;  // jobs queued, or quitting
  std::deque<Job> jobs;
  std::vector<std::thread> threads;
  size_t idle = 0;
  bool quitting = false;

  // Completions gathered while one thread sends: they go out together.
  std::mutex done_mu;
  std::vector<Done> done;
  bool sending = false;
};

Result<std::unique_ptr<Worker>> Worker::Connect(WorkerOptions options) {
  ConnectOptions connect;
  connect.client_name = options.name;
  DEPOT_ASSIGN_OR_RETURN(Client client, Client::Connect(options.socket_path, connect));
  for (int ordinal : options.gpus) {
    DEPOT_RETURN_NOT_OK(client.conn_->DaemonDevice(ordinal).status());
  }
  return std::unique_ptr<Worker>(new Worker(std::move(client), std::move(options)));
}

Worker::Worker(Client client, WorkerOptions options)
    : client_(std::move(client)), options_(std::move(options)), pool_(std::make_unique<Pool>()) {}

Worker::~Worker() {
  {
    std::lock_guard lock(pool_->mu);
    pool_->quitting = true;
  }
  pool_->cv.notify_all();
  for (std::thread& t : pool_->threads) t.join();
}

void Worker::Register(std::string name, Function function) {
  functions_[std::move(name)] = std::move(function);
}

void Worker::Stop() {
  stop_requested_.store(true);
  RequestMessage request;
  request.root().setDrainWorker();
  Reply reply;
  // A worker that is not attached (yet, or any more) has nothing to drain: Run returns on
  // its own when the connection ends.
  (void)client_.conn_->Call(request, &reply);
}

Status Worker::Run() {
  internal::Connection& conn = *client_.conn_;
  {
    RequestMessage request;
    auto reg = request.root().initRegisterWorker();
    reg.setName(options_.name);
    reg.setCpus(options_.cpus);
    auto gpus = reg.initGpus(static_cast<unsigned>(options_.gpus.size()));
    for (unsigned i = 0; i < gpus.size(); ++i) {
      DEPOT_ASSIGN_OR_RETURN(int32_t device, conn.DaemonDevice(options_.gpus[i]));
      const auto& uuid = conn.gpus()[static_cast<size_t>(device)].uuid;
      gpus.set(i,
               capnp::Data::Reader(reinterpret_cast<const capnp::byte*>(uuid.data()), uuid.size()));
    }
    auto resources = reg.initResources(static_cast<unsigned>(options_.resources.size()));
    unsigned k = 0;
    for (const auto& [name, amount] : options_.resources) {
      resources[k].setName(name);
      resources[k].setAmount(amount);
      ++k;
    }
    auto functions = reg.initFunctions(static_cast<unsigned>(functions_.size()));
    k = 0;
    for (const auto& entry : functions_) functions.set(k++, entry.first);
    Reply reply;
    DEPOT_RETURN_NOT_OK(conn.Call(request, &reply));
  }
  // A Stop before the registration found no worker to drain: drain now.
  if (stop_requested_.load()) Stop();

  Pool& pool = *pool_;
  // Reports a task's outcome; whoever finds no send under way sends everything gathered.
  auto report = [&](uint64_t task, Status status) {
    std::unique_lock lock(pool.done_mu);
    pool.done.push_back({task, std::move(status)});
    if (pool.sending) return;
    pool.sending = true;
    while (!pool.done.empty()) {
      std::vector<Pool::Done> batch = std::exchange(pool.done, {});
      lock.unlock();
      RequestMessage request;
      auto list = request.root().initComplete(static_cast<unsigned>(batch.size()));
      for (unsigned i = 0; i < batch.size(); ++i) {
        list[i].setTask(batch[i].task);
        list[i].setOk(batch[i].status.ok());
        if (!batch[i].status.ok()) list[i].setMessage(batch[i].status.message());
      }
      (void)conn.Post(request);  // a broken connection ends Run, which reports that
      lock.lock();
    }
    pool.sending = false;
  };
  auto execute = [&](Pool::Job& job) {
    TaskContext context(client_, job.task, job.attempt, job.device);
    context.inputs_ = std::move(job.inputs);
    context.args_ = std::move(job.args);
    context.outputs_ = std::move(job.outputs);
    Status status;
    auto it = functions_.find(job.function);
    if (it == functions_.end()) {
      status = Status::InvalidArgument("this worker has no function '" + job.function + "'");
    } else {
      try {
        status = it->second(context);
      } catch (const std::exception& e) {
        status = Status::Internal(std::string("the function threw: ") + e.what());
      } catch (...) {
        status = Status::Internal("the function threw something that is not a std::exception");
      }
    }
    report(job.task, std::move(status));
  };
  auto thread_main = [&] {
    std::unique_lock lock(pool.mu);
    for (;;) {
      ++pool.idle;
      pool.cv.wait(lock, [&] { return !pool.jobs.empty() || pool.quitting; });
      --pool.idle;
      if (pool.jobs.empty()) return;
      Pool::Job job = std::move(pool.jobs.front());
      pool.jobs.pop_front();
      lock.unlock();
      execute(job);
      lock.lock();
    }
  };

  Status ended;
  for (;;) {
    Reply push;
    if (Status st = conn.AwaitPush(&push); !st.ok()) {
      ended = std::move(st);
      break;
    }
    std::vector<Pool::Job> jobs;
    bool drained = false;
    Status decoded = Decode([&]() -> Status {
      auto r = push.get();
      if (r.isDrained()) {
        drained = true;
        return Status::OK();
      }
      if (!r.isAssign()) return Status::Internal("the daemon pushed an unknown message");
      for (auto a : r.getAssign()) {
        const int32_t device = a.getDevice();
        auto args = a.getArgs();
        jobs.push_back(
            {.task = a.getTask(),
             .attempt = a.getAttempt(),
             .device = device < 0 ? Client::kHostMemory : conn.LocalOrdinal(device),
             .function = ipc::ToString(a.getFunction()),
             .inputs = ipc::FromWire(a.getInputs()),
             .args = std::string(reinterpret_cast<const char*>(args.begin()), args.size()),
             .outputs = ipc::FromWire(a.getOutputs())});
      }
      return Status::OK();
    });
    if (!decoded.ok()) {
      ended = std::move(decoded);
      break;
    }
    if (drained) break;
    std::unique_lock lock(pool.mu);
    for (Pool::Job& job : jobs) {
      pool.jobs.push_back(std::move(job));
      if (pool.jobs.size() <= pool.idle) {
        pool.cv.notify_one();
        continue;
      }
      try {
        pool.threads.emplace_back(thread_main);
      } catch (const std::system_error& e) {
        // No thread for it: the task fails, and the worker goes on with the ones it has.
        Pool::Job lost = std::move(pool.jobs.back());
        pool.jobs.pop_back();
        lock.unlock();
        report(lost.task,
               Status::Internal(std::string("the worker cannot start a thread: ") + e.what()));
        lock.lock();
      }
    }
  }
  {
    std::lock_guard lock(pool.mu);
    pool.quitting = true;
  }
  pool.cv.notify_all();
  for (std::thread& t : pool.threads) t.join();
  pool.threads.clear();
  return ended;
}

}  // namespace depot
