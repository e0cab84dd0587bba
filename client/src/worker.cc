#include "depot/worker.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "connection.h"
#include "depot/ipc/protocol.h"
#include "depot/ipc/units.h"
#include "parts.h"

namespace depot {

using internal::Decode;
using internal::Reply;
using internal::RequestMessage;

namespace {

// A function that ran in less than this, lately, counts as short: its completion may wait
// for the next short task of the batch, to go to the daemon with it.
constexpr int64_t kShortTaskNs = 20'000;
// The most completions held back so, and for how long.
constexpr size_t kMaxHeldCompletions = 64;
constexpr auto kMaxHoldTime = std::chrono::microseconds(100);
// What a completion adds to its message besides its outputs and its message: its task id,
// flags and list pointers, counted generously.
constexpr size_t kCompletionBytes = 64;
// The most of a failure message a completion carries: what the daemon keeps of it, and at
// most half of what a message may carry, so that one completion always fits in one frame.
constexpr size_t kMaxMessageBytes = 4096;

using Clock = std::chrono::steady_clock;

}  // namespace

bool TaskContext::sealed(size_t output) const {
  return std::ranges::find(sealed_, output) != sealed_.end();
}

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

Status TaskContext::CheckNew(size_t output) const {
  if (output >= outputs_.size()) {
    return Status::InvalidArgument("task " + std::to_string(task_) + " has " +
                                   std::to_string(outputs_.size()) + " outputs, not an output " +
                                   std::to_string(output));
  }
  const auto index = static_cast<uint32_t>(output);
  if (std::ranges::any_of(values_, [&](const Value& v) { return v.index == index; }) ||
      std::ranges::any_of(created_, [&](const Created& c) { return c.index == index; })) {
    return Status::AlreadyExists("output " + std::to_string(output) + " of task " +
                                 std::to_string(task_) + " was made already");
  }
  return Status::OK();
}

bool TaskContext::Carries(uint64_t bytes) const {
  return bytes <= ipc::kMaxInlineOutputBytes && inline_bytes_ + bytes <= inline_budget_;
}

Status TaskContext::Put(size_t output, std::span<const std::byte> data,
                        std::span<const std::byte> metadata) {
  if (output < outputs_.size() && sealed(output)) return Status::OK();
  DEPOT_RETURN_NOT_OK(CheckNew(output));
  const size_t bytes = data.size() + metadata.size();
  if (!Carries(bytes)) {
    DEPOT_ASSIGN_OR_RETURN(MutableBuffer buffer, Create(output, data.size(), metadata));
    if (!data.empty()) internal::CopyBytes(buffer.ptr(), data.data(), data.size(), copy_threads_);
    return Status::OK();
  }
  inline_bytes_ += bytes;
  values_.push_back(
      {.index = static_cast<uint32_t>(output),
       .data = std::string(reinterpret_cast<const char*>(data.data()), data.size()),
       .metadata = std::string(reinterpret_cast<const char*>(metadata.data()), metadata.size())});
  return Status::OK();
}

Status TaskContext::PutParts(size_t output, uint64_t data_size, std::span<const PutPart> parts,
                             std::span<const std::byte> metadata) {
  DEPOT_RETURN_NOT_OK(CheckParts(parts, data_size));
  if (internal::IsOnePart(parts, data_size) ||
      data_size + metadata.size() <= ipc::kMaxInlineOutputBytes) {
    std::vector<std::byte> scratch;
    return Put(output, internal::JoinParts(parts, data_size, &scratch), metadata);
  }
  if (output < outputs_.size() && sealed(output)) return Status::OK();
  DEPOT_ASSIGN_OR_RETURN(MutableBuffer buffer, Create(output, data_size, metadata));
  internal::FillParts(buffer.ptr(), parts, data_size, copy_threads_);
  return Status::OK();
}

Status TaskContext::PutPartsMany(std::span<const OutputParts> outputs) {
  std::vector<size_t> named;  // the outputs of the batch checked so far
  named.reserve(outputs.size());
  for (const OutputParts& o : outputs) {
    DEPOT_RETURN_NOT_OK(CheckParts(o.parts, o.data_size));
    if (o.output < outputs_.size() && sealed(o.output)) continue;
    DEPOT_RETURN_NOT_OK(CheckNew(o.output));
    if (std::ranges::find(named, o.output) != named.end()) {
      return Status::AlreadyExists("output " + std::to_string(o.output) + " of task " +
                                   std::to_string(task_) + " is named twice in one batch");
    }
    named.push_back(o.output);
  }
  // Those the completion has room for go in it, as PutParts would send them; the others
  // are created together.
  std::vector<const OutputParts*> large;
  std::vector<CreateItem> items;
  for (const OutputParts& o : outputs) {
    if (o.output < outputs_.size() && sealed(o.output)) continue;
    if (Carries(o.data_size + o.metadata.size())) {
      DEPOT_RETURN_NOT_OK(PutParts(o.output, o.data_size, o.parts, o.metadata));
      continue;
    }
    large.push_back(&o);
    items.push_back(
        {.id = outputs_[o.output], .data_size = o.data_size, .options = {.metadata = o.metadata}});
  }
  std::vector<Result<MutableBuffer>> made = client_.CreateMany(items);
  // Those created are filled even when another create failed: what was made is whole, as
  // after PutParts calls one by one, whether the function then fails or goes on.
  Status first;
  for (size_t k = 0; k < made.size(); ++k) {
    if (!made[k].ok()) {
      if (first.ok()) first = made[k].status();
      continue;
    }
    internal::FillParts(made[k]->ptr(), large[k]->parts, large[k]->data_size, copy_threads_);
    created_.push_back({.index = static_cast<uint32_t>(large[k]->output), .buffer = *made[k]});
  }
  return first;
}

Result<MutableBuffer> TaskContext::Create(size_t output, uint64_t data_size,
                                          std::span<const std::byte> metadata) {
  DEPOT_RETURN_NOT_OK(CheckNew(output));
  if (sealed(output)) {
    return Status::AlreadySealed("output " + std::to_string(output) + " of task " +
                                 std::to_string(task_) + " was sealed by an earlier attempt");
  }
  DEPOT_ASSIGN_OR_RETURN(MutableBuffer buffer,
                         client_.Create(outputs_[output], data_size, {.metadata = metadata}));
  created_.push_back({.index = static_cast<uint32_t>(output), .buffer = buffer});
  return buffer;
}

Status TaskContext::Abort(size_t output) {
  auto it = std::ranges::find_if(created_, [&](const Created& c) { return c.index == output; });
  if (it == created_.end()) {
    return Status::InvalidArgument("output " + std::to_string(output) + " of task " +
                                   std::to_string(task_) + " was not created by Create");
  }
  // Aborted before its last handle here goes: that handle's release would abort it first.
  Status st = client_.Abort(outputs_[output]);
  created_.erase(it);
  return st;
}

// The threads that run tasks and read the daemon's pushes (Worker::Serve), and the
// completions they report.
struct Worker::Pool {
  struct Job {
    uint64_t task = 0;
    uint32_t attempt = 1;
    int device = Client::kHostMemory;
    std::string function;
    std::vector<ObjectId> inputs;
    std::string args;
    std::vector<ObjectId> outputs;
    std::vector<uint32_t> sealed;
    uint64_t after = 0;  // a task to run after (Assignment.after)
  };
  struct Done {
    uint64_t task = 0;
    Status status;
    std::vector<TaskContext::Value> values;     // empty unless it succeeded
    std::vector<TaskContext::Created> created;  // for the daemon to seal; empty unless it succeeded
    size_t bytes = 0;                           // of the values (and the indices to seal)
  };

  // Makes sure some thread comes for the work there is (a job queued, or the reader's turn):
  // wakes a waiting thread, unless one is waking already (which, finding more work than it
  // takes, wakes the next), or starts one. Without a thread to start, the threads there are
  // take the work as they come back.
  void WakeOne(Worker& worker) {
    if (waking) return;
    if (idle > 0) {
      waking = true;
      cv.notify_one();
      return;
    }
    try {
      threads.emplace_back([&worker] { worker.Serve(); });
      waking = true;
    } catch (const std::system_error&) {
    }
  }

  // Takes jobs read from the daemon: each runs as soon as a thread takes it, or, sent to
  // follow a task this worker has not finished (queued, running or itself following
  // another), once that one's function has returned.
  void Add(std::vector<Job>& incoming) {
    for (Job& job : incoming) {
      live.insert(job.task);
      if (job.after != 0 && live.contains(job.after)) {
        // One job follows a task; should another come (the daemon sends no such thing), it
        // goes after the first rather than being lost.
        uint64_t before = job.after;
        for (auto p = parked.find(before); p != parked.end(); p = parked.find(before)) {
          before = p->second.task;
        }
        parked.emplace(before, std::move(job));
      } else {
        jobs.push_back(std::move(job));
      }
    }
    incoming.clear();
  }
  // `task`'s function has returned: the job sent to follow it goes first. Returns whether
  // there was one: then the daemon hears of `task` at once, to send the next in good time.
  bool Finished(uint64_t task) {
    live.erase(task);
    auto it = parked.find(task);
    if (it == parked.end()) return false;
    jobs.push_front(std::move(it->second));
    parked.erase(it);
    return true;
  }

  std::mutex mu;
  std::condition_variable cv;  // work for a waiting thread: a job, the reader's turn, the end
  std::deque<Job> jobs;
  std::unordered_set<uint64_t> live;         // tasks received and not finished
  std::unordered_map<uint64_t, Job> parked;  // jobs sent to follow another, by that task
  std::vector<std::thread> threads;
  size_t idle = 0;       // threads waiting on cv
  bool waking = false;   // a thread was woken or started and has not looked for work yet
  bool reading = false;  // a thread reads the daemon's pushes
  // The daemon's last push left nothing free on this worker for another task to start on
  // (Assignment.workerFull): nobody reads beside the running jobs, whose calls to the
  // daemon then read their own replies (a reader beside them would take each reply and wake
  // its caller: two scheduler wake-ups for one on the path of every call, which on a busy
  // machine cost more than the call). The thread whose job ends reads next.
  bool full = false;
  uint64_t freed = 0;  // jobs that ended with no job sent to follow them, ever
  // Pushes the hook announced (read by running jobs' calls) since the last read took every
  // one read by then: someone must come and take them.
  uint64_t announced = 0;
  bool ended = false;        // no job comes any more: drained, or the connection ended
  Status end;                // why, for Run
  size_t inline_budget = 0;  // bytes of outputs (and messages) one completion message may carry

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
    : client_(std::move(client)), options_(std::move(options)), pool_(std::make_unique<Pool>()) {
  // A message of completions stays well inside the daemon's frame limit.
  pool_->inline_budget = client_.conn_->max_frame_bytes() / 8;
}

// Run joins every thread it started before it returns.
Worker::~Worker() = default;

void Worker::Register(std::string name, Function function) {
  Register(std::move(name), std::move(function), nullptr);
}

void Worker::Register(std::string name, Function cpu, Function gpu) {
  Registered& entry = functions_[std::move(name)];
  entry.function = std::move(cpu);
  entry.gpu_function = std::move(gpu);
  entry.ns.store(-1);
  entry.gpu_ns.store(-1);
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
    std::vector<const std::string*> names, gpu_names;
    for (const auto& [name, entry] : functions_) {
      if (entry.function) names.push_back(&name);
      if (entry.gpu_function) gpu_names.push_back(&name);
    }
    auto functions = reg.initFunctions(static_cast<unsigned>(names.size()));
    for (unsigned i = 0; i < names.size(); ++i) functions.set(i, *names[i]);
    auto gpu_functions = reg.initGpuFunctions(static_cast<unsigned>(gpu_names.size()));
    for (unsigned i = 0; i < gpu_names.size(); ++i) gpu_functions.set(i, *gpu_names[i]);
    Reply reply;
    DEPOT_RETURN_NOT_OK(conn.Call(request, &reply));
  }
  // A Stop before the registration found no worker to drain: drain now.
  if (stop_requested_.load()) Stop();

  Pool& pool = *pool_;
  {
    std::lock_guard lock(pool.mu);
    pool.ended = false;
    pool.end = Status::OK();
  }
  // A push read by a task's own call (nobody reads beside a full worker's tasks, and a task
  // waiting for room has lent its slot to the task this push starts) wakes a thread to take
  // it.
  conn.SetPushHook([this] {
    Pool& p = *pool_;
    std::lock_guard lock(p.mu);
    ++p.announced;
    if (!p.reading && !p.ended) p.WakeOne(*this);
  });
  Serve();
  conn.SetPushHook(nullptr);
  // Every thread ends once the pool has ended and holds no job: none starts another then.
  std::vector<std::thread> threads;
  {
    std::lock_guard lock(pool.mu);
    threads = std::exchange(pool.threads, {});
  }
  for (std::thread& t : threads) t.join();
  std::lock_guard lock(pool.mu);
  return pool.end;
}

void Worker::Serve() {
  Pool& pool = *pool_;
  internal::Connection& conn = *client_.conn_;

  // Sends `batch` (with whatever other threads gathered meanwhile); whoever finds no send
  // under way sends everything gathered, a message per inline_budget bytes of outputs.
  auto report = [&](std::vector<Pool::Done>& batch) {
    std::unique_lock lock(pool.done_mu);
    for (Pool::Done& d : batch) pool.done.push_back(std::move(d));
    batch.clear();
    if (pool.sending) return;
    pool.sending = true;
    while (!pool.done.empty()) {
      std::vector<Pool::Done> gathered = std::exchange(pool.done, {});
      lock.unlock();
      for (size_t first = 0; first < gathered.size();) {
        size_t end = first;
        size_t bytes = 0;
        do {
          bytes += gathered[end++].bytes + kCompletionBytes;
        } while (end < gathered.size() &&
                 bytes + gathered[end].bytes + kCompletionBytes <= pool.inline_budget);
        RequestMessage request;
        auto list = request.root().initComplete(static_cast<unsigned>(end - first));
        for (unsigned i = 0; i < list.size(); ++i) {
          const Pool::Done& d = gathered[first + i];
          auto c = list[i];
          c.setTask(d.task);
          c.setOk(d.status.ok());
          if (!d.status.ok()) c.setMessage(d.status.message());
          if (!d.created.empty()) {
            auto seal = c.initSeal(static_cast<unsigned>(d.created.size()));
            for (unsigned k = 0; k < seal.size(); ++k) seal.set(k, d.created[k].index);
          }
          if (d.values.empty()) continue;
          auto values = c.initOutputs(static_cast<unsigned>(d.values.size()));
          for (unsigned v = 0; v < values.size(); ++v) {
            const TaskContext::Value& value = d.values[v];
            values[v].setIndex(value.index);
            values[v].setData(capnp::Data::Reader(
                reinterpret_cast<const capnp::byte*>(value.data.data()), value.data.size()));
            values[v].setMetadata(
                capnp::Data::Reader(reinterpret_cast<const capnp::byte*>(value.metadata.data()),
                                    value.metadata.size()));
          }
        }
        (void)conn.Post(request);  // a broken connection ends Run, which reports that
        // The creator's references to the outputs sealed with these completions go after
        // them: the daemon reads the seal first (a release of an unsealed object aborts it).
        for (size_t k = first; k < end; ++k) {
          for (const TaskContext::Created& c : gathered[k].created) client_.Sealed(c.buffer.id());
          gathered[k].created.clear();
        }
        first = end;
      }
      lock.lock();
    }
    pool.sending = false;
  };

  auto execute = [&](Pool::Job& job) -> Pool::Done {
    TaskContext context(client_, job.task, job.attempt, job.device, pool.inline_budget,
                        client_.conn_->copy_threads());
    context.inputs_ = std::move(job.inputs);
    context.args_ = std::move(job.args);
    context.outputs_ = std::move(job.outputs);
    context.sealed_ = std::move(job.sealed);
    Status status;
    auto it = functions_.find(job.function);
    // On a GPU, the GPU variant where there is one; else the function as registered. Each
    // has its own measure of how long it runs.
    const Function* function = nullptr;
    std::atomic<int64_t>* measured = nullptr;
    if (it != functions_.end()) {
      Registered& r = it->second;
      if (job.device != Client::kHostMemory && r.gpu_function) {
        function = &r.gpu_function;
        measured = &r.gpu_ns;
      } else if (r.function) {
        function = &r.function;
        measured = &r.ns;
      }
    }
    if (function == nullptr) {
      status = Status::InvalidArgument(
          "this worker has no function '" + job.function + "'" +
          (it != functions_.end() ? " to run on host memory (only a GPU variant)" : ""));
    } else {
      const auto start = Clock::now();
      try {
        status = (*function)(context);
      } catch (const std::exception& e) {
        status = Status::Internal(std::string("the function threw: ") + e.what());
      } catch (...) {
        status = Status::Internal("the function threw something that is not a std::exception");
      }
      const int64_t ns = std::chrono::nanoseconds(Clock::now() - start).count();
      const int64_t before = measured->load(std::memory_order_relaxed);
      measured->store(before < 0 ? ns : (3 * before + ns) / 4, std::memory_order_relaxed);
    }
    Pool::Done done{.task = job.task, .status = std::move(status)};
    if (done.status.ok()) {
      done.values = std::move(context.values_);
      done.created = std::move(context.created_);
      done.bytes = context.inline_bytes_ + sizeof(uint32_t) * done.created.size();
    } else {
      // Its outputs made here go now, not with their last handle: one the function kept (a
      // Python array) would hold them being created.
      for (const TaskContext::Created& c : context.created_) (void)client_.Abort(c.buffer.id());
      done.status =
          Status(done.status.code(),
                 std::string(ipc::CutUtf8(done.status.message(),
                                          std::min(kMaxMessageBytes, pool.inline_budget / 2))));
      done.bytes = done.status.message().size();
    }
    return done;
  };
  auto is_short = [&](const Pool::Job& job) {
    auto it = functions_.find(job.function);
    if (it == functions_.end()) return true;  // it fails at once
    const Registered& r = it->second;
    const bool gpu = job.device != Client::kHostMemory && r.gpu_function;
    const int64_t ns = (gpu ? r.gpu_ns : r.ns).load(std::memory_order_relaxed);
    return ns >= 0 && ns < kShortTaskNs;
  };

  // A push's jobs, or the end (OK once drained).
  auto decode = [&](Reply& push, std::vector<Pool::Job>& jobs,
                    bool* full) -> std::optional<Status> {
    bool drained = false;
    Status decoded = Decode([&]() -> Status {
      auto r = push.get();
      if (r.isDrained()) {
        drained = true;
        return Status::OK();
      }
      if (!r.isAssign()) return Status::Internal("the daemon pushed an unknown message");
      for (auto a : r.getAssign()) {
        *full = a.getWorkerFull();  // the same in each of a push's assignments
        const int32_t device = a.getDevice();
        auto args = a.getArgs();
        std::vector<uint32_t> sealed;
        for (uint32_t k : a.getSealed()) sealed.push_back(k);
        jobs.push_back(
            {.task = a.getTask(),
             .attempt = a.getAttempt(),
             .device = device < 0 ? Client::kHostMemory : conn.LocalOrdinal(device),
             .function = ipc::ToString(a.getFunction()),
             .inputs = ipc::FromWire(a.getInputs()),
             .args = std::string(reinterpret_cast<const char*>(args.begin()), args.size()),
             .outputs = ipc::FromWire(a.getOutputs()),
             .sealed = std::move(sealed),
             .after = a.getAfter()});
      }
      return Status::OK();
    });
    if (!decoded.ok()) return decoded;
    if (drained) return Status::OK();
    return std::nullopt;
  };
  // Takes every push read already (by the calls of running jobs) without reading the
  // socket, setting `*took` if there was one; called with the pool's lock held, so that a
  // push the hook announces after it finds `reading` false and wakes a thread.
  auto take_read = [&](std::vector<Pool::Job>& jobs, bool* full,
                       bool* took) -> std::optional<Status> {
    for (;;) {
      Reply push;
      Result<bool> taken = conn.TakePush(&push);
      if (!taken.ok()) return taken.status();
      if (!*taken) return std::nullopt;
      *took = true;
      if (std::optional<Status> end = decode(push, jobs, full)) return end;
    }
  };

  std::vector<Pool::Done> held;  // completions of short tasks, not sent yet
  Clock::time_point held_since;
  std::vector<Pool::Job> incoming;
  std::unique_lock lock(pool.mu);
  pool.waking = false;
  for (;;) {
    if (!pool.jobs.empty()) {
      Pool::Job job = std::move(pool.jobs.front());
      pool.jobs.pop_front();
      // Someone takes the next job, or reads while this thread runs one if another could
      // start beside it.
      if (!pool.jobs.empty() ||
          (!pool.reading && !pool.ended && (!pool.full || pool.announced > 0))) {
        pool.WakeOne(*this);
      }
      lock.unlock();
      // A completion held back waits for no task that may be long.
      if (!held.empty() && !is_short(job)) report(held);
      if (held.empty()) held_since = Clock::now();
      const uint64_t task = job.task;
      held.push_back(execute(job));
      lock.lock();
      const bool followed = pool.Finished(task);
      // Its resources are free again, unless the job sent to follow it takes them over: the
      // daemon may send another task at once, which someone must read.
      if (!followed) {
        pool.full = false;
        ++pool.freed;
      }
      if (followed || pool.jobs.empty() || held.size() >= kMaxHeldCompletions ||
          Clock::now() - held_since > kMaxHoldTime) {
        lock.unlock();
        report(held);
        lock.lock();
      }
      continue;
    }
    if (pool.ended) break;
    if (!pool.reading) {
      // Blocks for the next push unless the worker is full and runs a job: then its running
      // jobs' calls read, and a push one of them reads wakes a thread (the push hook) to take
      // it here.
      const bool block = !pool.full || pool.live.size() == pool.parked.size();
      pool.reading = true;
      bool full = pool.full;  // a push that assigns nothing (drained) leaves it
      bool took = false;
      const uint64_t freed_before = pool.freed;
      std::optional<Status> end;
      if (block) {
        lock.unlock();
        Reply push;
        Status st = conn.AwaitPush(&push);
        end = st.ok() ? decode(push, incoming, &full) : std::optional<Status>(st);
        took = true;
        lock.lock();
      }
      // Then, under the pool's lock, whatever else came meanwhile: every push read by now is
      // taken, and one the hook announces later finds nobody reading and wakes a thread.
      if (!end) end = take_read(incoming, &full, &took);
      pool.announced = 0;
      pool.reading = false;
      // A job that ended during the read freed resources the daemon may not have known of
      // when it said the worker was full: it is not.
      pool.full = full && pool.freed == freed_before;
      if (end) {
        incoming.clear();  // a push that did not decode whole runs nothing
        pool.ended = true;
        pool.end = std::move(*end);
        pool.cv.notify_all();
      }
      pool.Add(incoming);
      if (block || took || pool.ended) continue;
      // Nothing was waiting: this thread waits to be woken, below.
    }
    ++pool.idle;
    pool.cv.wait(lock);
    --pool.idle;
    pool.waking = false;
  }
}

}  // namespace depot
