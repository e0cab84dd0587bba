// Tasks end to end: a real depotd with simulated GPUs, real worker processes
// (depot-example-worker), and clients submitting through the library.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "child_process.h"
#include "daemon.h"
#include "depot/client.h"
#include "depot/ipc/protocol.h"
#include "depot/worker.h"
#include "depotctl_json.h"
#include "test_support.h"

#ifndef DEPOT_EXAMPLE_WORKER_PATH
#error "DEPOT_EXAMPLE_WORKER_PATH must name depot-example-worker (set by tests/CMakeLists.txt)"
#endif

namespace depot::testing {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;
constexpr uint64_t kMiB = 1u << 20;
// Far above what any wait here needs (10x and more), so that a busy machine does not fail.
constexpr auto kPatience = std::chrono::seconds(30);

class TaskTest : public ::testing::Test {
 protected:
  explicit TaskTest(std::vector<std::string> more_flags = {}) : daemon_(Flags(more_flags)) {}

  // The defaults, and `more`, which may give --memory instead.
  static std::vector<std::string> Flags(const std::vector<std::string>& more) {
    std::vector<std::string> flags{"--simulate-gpus", "2:64MiB"};
    if (std::find(more.begin(), more.end(), "--memory") == more.end()) {
      flags.insert(flags.end(), {"--memory", "256MiB"});
    }
    flags.insert(flags.end(), more.begin(), more.end());
    return flags;
  }

  void SetUp() override {
    ASSERT_TRUE(daemon_.ok()) << daemon_.error();
    auto client = Client::Connect(daemon_.socket_path());
    ASSERT_TRUE(client.ok()) << client.status().ToString();
    client_.emplace(std::move(client).value());
  }

  // Starts a worker process with `flags` (--cpus, --gpus...) and waits until it is attached.
  ChildProcess StartWorker(std::vector<std::string> flags) {
    std::vector<std::string> argv{DEPOT_EXAMPLE_WORKER_PATH, "--socket", daemon_.socket_path()};
    argv.insert(argv.end(), flags.begin(), flags.end());
    const size_t before = WorkerCount();
    ChildProcess child = ChildProcess::Start([argv] {
      std::vector<char*> args;
      for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      ::execv(args[0], args.data());
      return 127;
    });
    EXPECT_TRUE(Eventually([&] { return WorkerCount() > before; })) << "no worker attached";
    return child;
  }

  size_t WorkerCount() {
    auto workers = client_->Workers();
    EXPECT_TRUE(workers.ok()) << workers.status().ToString();
    return workers.ok() ? workers->size() : 0;
  }

  Result<TaskInfo> TaskOf(const ObjectId& output) {
    DEPOT_ASSIGN_OR_RETURN(auto tasks, client_->Tasks());
    for (const TaskInfo& t : tasks) {
      for (const ObjectId& o : t.outputs) {
        if (o == output) return t;
      }
    }
    return Status::NotFound("no task makes " + output.Hex());
  }

  // Puts `count` float64 values 1, 2, ... into a new object.
  ObjectId PutArray(size_t count) {
    std::vector<double> values(count);
    for (size_t i = 0; i < count; ++i) values[i] = static_cast<double>(i + 1);
    const ObjectId id = ObjectId::Random();
    EXPECT_OK(client_->Put(id, std::as_bytes(std::span(values))));
    return id;
  }

  // Creates an object of `size` seeded bytes on simulated GPU `device`.
  ObjectId PutOnDevice(int device, size_t size, uint64_t seed) {
    const ObjectId id = ObjectId::Random();
    auto buffer = client_->CreateOnDevice(id, size, device);
    EXPECT_TRUE(buffer.ok()) << buffer.status().ToString();
    if (!buffer.ok()) return id;
    const auto bytes = SeededBytes(size, seed);
    std::memcpy(reinterpret_cast<void*>(buffer->device_ptr()), bytes.data(), size);
    EXPECT_OK(client_->Seal(id));
    return id;
  }

  TestDaemon daemon_;
  std::optional<Client> client_;
};

TEST_F(TaskTest, ACpuTaskRunsOnAWorkerAndItsOutputIsReadWithGet) {
  ChildProcess worker = StartWorker({"--cpus", "2"});
  const ObjectId array = PutArray(1000);
  ASSERT_OK_AND_ASSIGN(auto outputs, client_->Submit({.function = "sum", .inputs = {array}}));
  ASSERT_EQ(outputs.size(), 1u);
  ASSERT_OK_AND_ASSIGN(Buffer result, client_->Get(outputs[0], kPatience));
  ASSERT_EQ(result.size(), sizeof(double));
  double total;
  std::memcpy(&total, result.data().data(), sizeof total);
  EXPECT_EQ(total, 1000.0 * 1001 / 2);

  // The output is sealed a moment before the worker's completion reaches the daemon.
  ASSERT_TRUE(Eventually([&] {
    auto t = TaskOf(outputs[0]);
    return t.ok() && t->state == TaskState::kDone;
  }));
  ASSERT_OK_AND_ASSIGN(TaskInfo task, TaskOf(outputs[0]));
  EXPECT_EQ(task.device, -1);
  ASSERT_OK_AND_ASSIGN(StoreStatus status, client_->GetStatus());
  EXPECT_EQ(status.scheduler.completed, 1u);
  EXPECT_EQ(status.scheduler.workers, 1u);
  ASSERT_OK_AND_ASSIGN(std::string metrics, client_->Metrics());
  for (const char* line :
       {"depot_workers 1\n", "depot_tasks_total{event=\"done\"} 1\n",
        "depot_placement_duration_seconds_count 1\n", "depot_requests_total{type=\"submit\"} 1\n",
        "depot_task_input_bytes_total{where=\"local\"} 8000\n"}) {
    EXPECT_NE(metrics.find(line), std::string::npos) << line << " is not in\n" << metrics;
  }
}

// The bandwidths placement starts from: timed at start-up (here memcpy between simulated
// GPUs' memory and host memory), the defaults without the probe until a copy is measured,
// and exactly what the flags say when they are given.
TEST_F(TaskTest, CopyBandwidthsAreTimedAtStartUpUnlessSetOrTurnedOff) {
  const auto bandwidths = [](TestDaemon& daemon) -> Result<SchedulerStatus> {
    if (!daemon.ok()) return Status::Internal(daemon.error());
    DEPOT_ASSIGN_OR_RETURN(Client client, Client::Connect(daemon.socket_path()));
    DEPOT_ASSIGN_OR_RETURN(StoreStatus status, client.GetStatus());
    return status.scheduler;
  };
  TestDaemon unprobed({"--simulate-gpus", "2:64MiB", "--bandwidth-probe", "0"});
  ASSERT_OK_AND_ASSIGN(SchedulerStatus assumed, bandwidths(unprobed));
  EXPECT_TRUE(assumed.bandwidths_measured) << "measured on copies as they happen";
  EXPECT_EQ(assumed.host_to_gpu, 10e9) << "the default, until a copy is measured";
  EXPECT_EQ(assumed.gpu_to_gpu, 20e9);

  // The probe runs off the daemon's loop, while it serves.
  ASSERT_TRUE(Eventually([&] { return daemon_.Log().find("copies timed") != std::string::npos; }))
      << daemon_.Log();
  ASSERT_OK_AND_ASSIGN(StoreStatus status, client_->GetStatus());
  EXPECT_TRUE(status.scheduler.bandwidths_measured);
  EXPECT_GT(status.scheduler.host_to_gpu, 0);
  EXPECT_NE(status.scheduler.host_to_gpu, assumed.host_to_gpu) << "timed at start-up";
  EXPECT_NE(status.scheduler.gpu_to_host, assumed.gpu_to_host);
  EXPECT_NE(status.scheduler.gpu_to_gpu, assumed.gpu_to_gpu);
  for (const GpuInfo& gpu : status.gpus) {
    EXPECT_EQ(gpu.reserved_bytes, 0u) << "the probe takes nothing of the pools";
  }
  EXPECT_EQ(status.replicas_made, 0u) << "the probe makes no replica";

  TestDaemon fixed({"--simulate-gpus", "2:64MiB", "--host-gpu-bandwidth", "3e9"});
  ASSERT_OK_AND_ASSIGN(SchedulerStatus set, bandwidths(fixed));
  EXPECT_FALSE(set.bandwidths_measured);
  EXPECT_EQ(set.host_to_gpu, 3e9);
  EXPECT_EQ(set.gpu_to_gpu, 20e9);
  EXPECT_EQ(fixed.Log().find("copies timed"), std::string::npos) << "set bandwidths are kept";
}

TEST_F(TaskTest, AGpuTaskRunsOnTheSimulatedDeviceHoldingItsInput) {
  ChildProcess worker = StartWorker({"--cpus", "1", "--gpus", "0,1"});
  const ObjectId input = PutOnDevice(1, 4 * kMiB, 7);
  TaskRequest copy{.function = "copy", .inputs = {input}, .cpu = 0, .gpu = 1};
  ASSERT_OK_AND_ASSIGN(auto outputs, client_->Submit(copy));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer out, client_->GetOnDevice(outputs[0], 1, kPatience));
  EXPECT_TRUE(SameBytes({reinterpret_cast<const std::byte*>(out.device_ptr()), out.size()},
                        SeededBytes(4 * kMiB, 7)));
  ASSERT_OK_AND_ASSIGN(TaskInfo task, TaskOf(outputs[0]));
  EXPECT_EQ(task.device, 1);
  EXPECT_EQ(task.local_bytes, 4 * kMiB);
  EXPECT_EQ(task.moved_bytes, 0u);
  ASSERT_OK_AND_ASSIGN(StoreStatus status, client_->GetStatus());
  EXPECT_EQ(status.replicas_made, 0u);
}

// A function with a CPU and a GPU variant (the example worker's twin): each task runs where
// it is expected to finish first, counting its copies.
TEST_F(TaskTest, ATaskWithTwoVariantsRunsTheOneWhereItsInputAlreadyIs) {
  ChildProcess worker = StartWorker({"--cpus", "1", "--gpus", "0"});
  // Neither variant measured: 1 KiB in host memory is read there (the GPU variant would
  // copy it first).
  const std::vector<std::byte> bytes = SeededBytes(1024, 4);
  const ObjectId on_host = ObjectId::FromName("twin/small");
  ASSERT_OK(client_->Put(on_host, bytes));
  ASSERT_OK_AND_ASSIGN(auto small, client_->Submit({.function = "twin", .inputs = {on_host}}));
  ASSERT_OK_AND_ASSIGN(Buffer copied, client_->Get(small[0], kPatience));
  EXPECT_TRUE(SameBytes(copied.data(), bytes));
  ASSERT_OK_AND_ASSIGN(TaskInfo task, TaskOf(small[0]));
  EXPECT_EQ(task.device, -1);
  EXPECT_EQ(task.variant, "cpu");

  // 16 MiB on GPU 0 stays there: the CPU variant, measured only at 1 KiB, is expected to
  // take 16,384 times as long here (in proportion to the bytes), after copying them out.
  const ObjectId on_gpu = PutOnDevice(0, 16 * kMiB, 3);
  ASSERT_OK_AND_ASSIGN(auto large, client_->Submit({.function = "twin", .inputs = {on_gpu}}));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer out, client_->GetOnDevice(large[0], 0, kPatience));
  EXPECT_TRUE(SameBytes({reinterpret_cast<const std::byte*>(out.device_ptr()), out.size()},
                        SeededBytes(16 * kMiB, 3)));
  ASSERT_OK_AND_ASSIGN(task, TaskOf(large[0]));
  EXPECT_EQ(task.device, 0);
  EXPECT_EQ(task.variant, "gpu");
  EXPECT_NE(task.variant_reason.find("expected to finish first: gpu"), std::string::npos)
      << task.variant_reason;
  EXPECT_EQ(task.moved_bytes, 0u);

  // Pinned, it runs where it is told, whatever the copies cost.
  ASSERT_OK_AND_ASSIGN(
      auto pinned,
      client_->Submit({.function = "twin", .inputs = {on_host}, .variant = Variant::kGpu}));
  ASSERT_OK(client_->Get(pinned[0], kPatience).status());
  ASSERT_OK_AND_ASSIGN(task, TaskOf(pinned[0]));
  EXPECT_EQ(task.device, 0);
  EXPECT_EQ(task.variant, "");

  // depotctl shows both.
  const auto depotctl = [&](std::vector<std::string> args) {
    args.insert(args.begin(), {DEPOTCTL_PATH, "--socket", daemon_.socket_path()});
    return RunProgram(args);
  };
  ProgramRun workers = depotctl({"workers"});
  EXPECT_NE(workers.out.find("twin(cpu,gpu)"), std::string::npos) << workers.Explain();
  ProgramRun tasks = depotctl({"tasks"});
  EXPECT_NE(tasks.out.find("VARIANT"), std::string::npos) << tasks.Explain();
  EXPECT_NE(tasks.out.find("expected to finish first: gpu"), std::string::npos) << tasks.out;
  ProgramRun json = depotctl({"tasks", "--json"});
  EXPECT_NE(json.out.find("\"variant\": \"cpu\""), std::string::npos) << json.out;
  ProgramRun bad = depotctl({"submit", "twin", "--variant", "fpga"});
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("--variant is auto, cpu or gpu"), std::string::npos) << bad.Explain();
}

// Hard affinity: the task waits for the device holding its input, never runs elsewhere, and
// says why while no worker offers that device; soft affinity takes a free device at once.
// Placement weighs a copy against a queue, both estimated. Copies timed at start-up, on a busy
// machine, can make a 2 MiB peer copy look slower than waiting behind a task that has not
// been measured yet, so these tests place with the assumed bandwidths (until a copy is timed:
// none is before the choices they check).
class UntimedCopiesTaskTest : public TaskTest {
 protected:
  UntimedCopiesTaskTest() : TaskTest({"--bandwidth-probe", "0"}) {}
};

TEST_F(UntimedCopiesTaskTest, AHardAffinityTaskRunsOnlyOnTheDeviceHoldingItsInput) {
  ChildProcess on_gpu0 = StartWorker({"--cpus", "1", "--gpus", "0"});
  ChildProcess on_gpu1 = StartWorker({"--cpus", "1", "--gpus", "1"});
  // GPU 1 is busy for good: stall_once never finishes its first attempt.
  const ObjectId input = PutOnDevice(1, 2 * kMiB, 31);
  ASSERT_OK_AND_ASSIGN(auto busy, client_->Submit({.function = "stall_once",
                                                   .inputs = {input},
                                                   .cpu = 0,
                                                   .gpu = 1,
                                                   .affinity = Affinity::kHard,
                                                   .retries = 0}));
  ASSERT_TRUE(Eventually([&] {
    auto t = TaskOf(busy[0]);
    return t.ok() && t->state == TaskState::kRunning && t->device == 1;
  }));
  // Each reads an input of its own, on GPU 1 only: a copy made for one is no place for the
  // other.
  const ObjectId other = PutOnDevice(1, 2 * kMiB, 32);
  ASSERT_OK_AND_ASSIGN(auto soft, client_->Submit({.function = "copy",
                                                   .inputs = {other},
                                                   .cpu = 0,
                                                   .gpu = 1,
                                                   .affinity = Affinity::kSoft}));
  ASSERT_OK_AND_ASSIGN(auto hard, client_->Submit({.function = "copy",
                                                   .inputs = {input},
                                                   .cpu = 0,
                                                   .gpu = 1,
                                                   .affinity = Affinity::kHard}));

  // The soft one ran on GPU 0, free all along; the hard one waits on GPU 1's worker.
  ASSERT_OK_AND_ASSIGN(Buffer soft_out, client_->Get(soft[0], kPatience));
  EXPECT_TRUE(SameBytes(soft_out.data(), SeededBytes(2 * kMiB, 32)));
  ASSERT_OK_AND_ASSIGN(TaskInfo soft_task, TaskOf(soft[0]));
  EXPECT_EQ(soft_task.device, 0);
  EXPECT_EQ(soft_task.moved_bytes, 2 * kMiB);
  ASSERT_OK_AND_ASSIGN(TaskInfo waiting, TaskOf(hard[0]));
  EXPECT_NE(waiting.state, TaskState::kRunning);
  EXPECT_NE(waiting.state, TaskState::kDone);
  EXPECT_EQ(waiting.attempts, 0u);

  // With GPU 1's worker gone, nothing can run it: it waits aside and says why.
  ASSERT_TRUE(on_gpu1.Kill(SIGKILL));
  EXPECT_EQ(on_gpu1.Wait(), 128 + SIGKILL);
  ASSERT_TRUE(Eventually([&] {
    auto t = TaskOf(hard[0]);
    return t.ok() && t->state == TaskState::kReady && !t->reason.empty();
  }));
  ASSERT_OK_AND_ASSIGN(TaskInfo aside, TaskOf(hard[0]));
  EXPECT_EQ(aside.attempts, 0u) << "GPU 0 was free, and it did not run there";
  EXPECT_NE(aside.reason.find("GPU"), std::string::npos) << aside.reason;

  // A worker offering GPU 1 again runs it there, reading its input in place.
  ChildProcess again = StartWorker({"--cpus", "1", "--gpus", "1"});
  ASSERT_OK_AND_ASSIGN(DeviceBuffer out, client_->GetOnDevice(hard[0], 1, kPatience));
  EXPECT_TRUE(SameBytes({reinterpret_cast<const std::byte*>(out.device_ptr()), out.size()},
                        SeededBytes(2 * kMiB, 31)));
  ASSERT_OK_AND_ASSIGN(TaskInfo ran, TaskOf(hard[0]));
  EXPECT_EQ(ran.device, 1);
  EXPECT_EQ(ran.moved_bytes, 0u);
  EXPECT_EQ(ran.local_bytes, 2 * kMiB);
}

// One CPU slot, held by a task until the test lets it go; tasks submitted meanwhile, in one
// batch, then run highest priority first.
TEST_F(TaskTest, ReadyTasksRunHighestPriorityFirst) {
  ASSERT_OK_AND_ASSIGN(auto worker,
                       Worker::Connect({.socket_path = daemon_.socket_path(), .cpus = 1}));
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  std::vector<std::string> ran;
  worker->Register("gate", [&](TaskContext& task) -> Status {
    std::unique_lock lock(mu);
    if (!cv.wait_for(lock, kPatience, [&] { return open; })) {
      return Status::Internal("the gate was never opened");
    }
    return task.Put(0, {});
  });
  worker->Register("record", [&](TaskContext& task) -> Status {
    {
      std::lock_guard lock(mu);
      ran.emplace_back(task.args());
    }
    return task.Put(0, {});
  });
  std::thread runner([&] { EXPECT_OK(worker->Run()); });
  ASSERT_TRUE(Eventually([&] { return WorkerCount() == 1; }));

  ASSERT_OK_AND_ASSIGN(auto gate, client_->Submit({.function = "gate"}));
  ASSERT_TRUE(Eventually([&] {
    auto t = TaskOf(gate[0]);
    return t.ok() && t->state == TaskState::kRunning;
  }));
  const std::vector<int32_t> priorities{0, 7, -3, 2, 9, 2, -8, 4};
  std::vector<TaskRequest> batch;
  for (int32_t p : priorities) {
    batch.push_back({.function = "record", .args = std::to_string(p), .priority = p});
  }
  ASSERT_OK_AND_ASSIGN(auto outputs, client_->Submit(batch));
  {
    std::lock_guard lock(mu);
    open = true;
  }
  cv.notify_all();
  std::vector<ObjectId> all;
  for (const auto& out : outputs) all.push_back(out[0]);
  ASSERT_OK(client_->Get(all, kPatience).status());
  std::vector<std::string> expected;
  std::vector<int32_t> sorted = priorities;
  std::ranges::sort(sorted, std::greater<>());
  for (int32_t p : sorted) expected.push_back(std::to_string(p));
  {
    std::lock_guard lock(mu);
    EXPECT_EQ(ran, expected);
  }
  worker->Stop();
  runner.join();
}

TEST_F(TaskTest, AChainOfTenGpuTasksStaysOnOneDeviceAndMakesNoReplica) {
  ChildProcess worker = StartWorker({"--cpus", "1", "--gpus", "0,1"});
  const ObjectId source = PutOnDevice(0, 2 * kMiB, 11);
  std::vector<TaskRequest> chain;
  ObjectId previous = source;
  for (int i = 0; i < 10; ++i) {
    const ObjectId next = ObjectId::Random();
    chain.push_back({.function = "copy",
                     .inputs = {previous},
                     .outputs = {next},
                     .cpu = 0,
                     .gpu = 1,
                     .affinity = Affinity::kSoft});
    previous = next;
  }
  ASSERT_OK(client_->Submit(chain).status());
  ASSERT_OK_AND_ASSIGN(DeviceBuffer last, client_->GetOnDevice(previous, 0, kPatience));
  EXPECT_TRUE(SameBytes({reinterpret_cast<const std::byte*>(last.device_ptr()), last.size()},
                        SeededBytes(2 * kMiB, 11)));
  ASSERT_TRUE(Eventually([&] {
    auto status = client_->GetStatus();
    return status.ok() && status->scheduler.completed == 10;
  }));
  ASSERT_OK_AND_ASSIGN(StoreStatus status, client_->GetStatus());
  EXPECT_EQ(status.replicas_made, 0u);
  EXPECT_EQ(status.scheduler.moved_bytes, 0u);
  EXPECT_EQ(status.scheduler.local_bytes, 10 * 2 * kMiB);
}

TEST_F(TaskTest, FourQuarterGpuSharesShareADeviceAndAFifthWaits) {
  ChildProcess worker = StartWorker({"--cpus", "1", "--gpus", "0"});
  // stall_once never finishes a first attempt: what runs stays running.
  std::vector<ObjectId> outputs;
  for (int i = 0; i < 5; ++i) {
    ASSERT_OK_AND_ASSIGN(auto out,
                         client_->Submit({.function = "stall_once", .cpu = 0, .gpu = 0.25}));
    outputs.push_back(out[0]);
  }
  const auto running = [&] {
    int n = 0;
    auto tasks = client_->Tasks();
    for (const TaskInfo& t : tasks.ok() ? *tasks : std::vector<TaskInfo>{}) {
      if (t.state == TaskState::kRunning) {
        EXPECT_EQ(t.device, 0);
        ++n;
      }
    }
    return n;
  };
  ASSERT_TRUE(Eventually([&] { return running() == 4; }));
  ASSERT_OK_AND_ASSIGN(TaskInfo fifth, TaskOf(outputs[4]));
  EXPECT_NE(fifth.state, TaskState::kRunning);
  ASSERT_OK_AND_ASSIGN(auto workers, client_->Workers());
  ASSERT_EQ(workers.size(), 1u);
  ASSERT_EQ(workers[0].free_gpu_shares.size(), 1u);
  EXPECT_NEAR(workers[0].free_gpu_shares[0], 0, 1e-9);
  EXPECT_EQ(workers[0].free_cpus, 1);
  EXPECT_EQ(running(), 4);
}

TEST_F(TaskTest, AGpuTaskHoldingNoCpuStartsWhileEveryCpuSlotIsBusy) {
  ChildProcess worker = StartWorker({"--cpus", "1", "--gpus", "0"});
  ASSERT_OK_AND_ASSIGN(auto busy, client_->Submit({.function = "stall_once"}));
  ASSERT_TRUE(Eventually([&] {
    auto t = TaskOf(busy[0]);
    return t.ok() && t->state == TaskState::kRunning;
  }));
  const ObjectId input = PutOnDevice(0, kMiB, 3);
  ASSERT_OK_AND_ASSIGN(
      auto outputs, client_->Submit({.function = "copy", .inputs = {input}, .cpu = 0, .gpu = 1}));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer out, client_->GetOnDevice(outputs[0], 0, kPatience));
  EXPECT_EQ(out.size(), kMiB);
}

// A worker told that a push filled it reads nothing more until a task ends: half a CPU left
// is room, and the second half-CPU task starts beside one that never ends.
TEST_F(TaskTest, TwoHalfCpuTasksRunTogetherOnAOneCpuWorker) {
  ChildProcess worker = StartWorker({"--cpus", "1"});
  ASSERT_OK_AND_ASSIGN(auto busy, client_->Submit({.function = "stall_once", .cpu = 0.5}));
  ASSERT_TRUE(Eventually([&] {
    auto t = TaskOf(busy[0]);
    return t.ok() && t->state == TaskState::kRunning;
  }));
  const ObjectId input = PutArray(1000);
  ASSERT_OK_AND_ASSIGN(auto outputs,
                       client_->Submit({.function = "copy", .inputs = {input}, .cpu = 0.5}));
  ASSERT_OK_AND_ASSIGN(Buffer out, client_->Get(outputs[0], kPatience));
  EXPECT_EQ(out.size(), 1000 * sizeof(double));
  ASSERT_OK_AND_ASSIGN(auto workers, client_->Workers());
  ASSERT_EQ(workers.size(), 1u);
  EXPECT_NEAR(workers[0].free_cpus, 0.5, 1e-9) << "the stalled task holds its half";
}

TEST_F(TaskTest, ADiamondRunsEachTaskAfterItsInputs) {
  ChildProcess worker = StartWorker({"--cpus", "2"});
  const ObjectId top = ObjectId::Random(), left = ObjectId::Random(), right = ObjectId::Random(),
                 bottom = ObjectId::Random();
  // Submitted bottom first: a batch may name its tasks in any order.
  ASSERT_OK(client_
                ->Submit(std::vector<TaskRequest>{
                    {.function = "add", .inputs = {left, right}, .outputs = {bottom}},
                    {.function = "add", .inputs = {top}, .outputs = {left}},
                    {.function = "add", .inputs = {top}, .outputs = {right}},
                    {.function = "fill", .args = "8192", .outputs = {top}}})
                .status());
  ASSERT_OK_AND_ASSIGN(Buffer result, client_->Get(bottom, kPatience));
  ASSERT_EQ(result.size(), 8192u);
  double first;
  std::memcpy(&first, result.data().data(), sizeof first);
  EXPECT_EQ(first, 2.0);
}

TEST_F(TaskTest, IntermediatesGivenUpAreDeletedOnceTheirReadersAreDoneAcrossBatches) {
  ChildProcess worker = StartWorker({"--cpus", "2"});
  const ObjectId top = ObjectId::Random(), left = ObjectId::Random(), right = ObjectId::Random(),
                 bottom = ObjectId::Random();
  // The graph in two batches; the first may have run before the second is submitted.
  ASSERT_OK(client_->Submit({.function = "fill", .args = "8192", .outputs = {top}}).status());
  ASSERT_OK(client_->Get(top, kPatience).status());
  ASSERT_OK(client_
                ->Submit(std::vector<TaskRequest>{
                    {.function = "add", .inputs = {left, right}, .outputs = {bottom}},
                    {.function = "add", .inputs = {top}, .outputs = {left}},
                    {.function = "add", .inputs = {top}, .outputs = {right}}})
                .status());
  // Every reader of the intermediates is submitted: the client gives them up. `top` is
  // sealed and read by pending tasks, `left` and `right` not made yet.
  const std::vector<ObjectId> intermediates{top, left, right};
  ASSERT_OK(client_->DeleteAfterTasks(intermediates));
  ASSERT_OK_AND_ASSIGN(Buffer result, client_->Get(bottom, kPatience));
  double first;
  std::memcpy(&first, result.data().data(), sizeof first);
  EXPECT_EQ(first, 2.0);
  const auto found = [&](const ObjectId& id) {
    auto contains = client_->Contains(id);
    EXPECT_TRUE(contains.ok()) << contains.status().ToString();
    return !contains.ok() || *contains;
  };
  // They go once the tasks reading them have completed (just after `bottom` is sealed).
  EXPECT_TRUE(
      Eventually([&] { return std::none_of(intermediates.begin(), intermediates.end(), found); }));
  EXPECT_TRUE(found(bottom));

  // What no pending task reads or makes goes at once, as with Delete; an unknown id is
  // NotFound, and the others are deleted all the same.
  const ObjectId put = PutArray(10);
  const ObjectId unknown = ObjectId::Random();
  const std::vector<ObjectId> now{unknown, put};
  EXPECT_EQ(client_->DeleteAfterTasks(now).code(), StatusCode::kNotFound);
  EXPECT_FALSE(found(put));
}

TEST_F(TaskTest, ATreeReductionOfAThousandTasksRunsInAStoreMuchSmallerThanItsIntermediates) {
  // 512 leaves and 511 sums of 16 MiB each (smaller under the sanitizers, which are slow):
  // 16 GiB of intermediates through a store of 256 MiB. Each sum's inputs are let go of as
  // soon as it is done, and sums go before further leaves (depth first).
  TestDaemon small({"--memory", "256MiB", "--segment-size", "64MiB"});
  ASSERT_TRUE(small.ok()) << small.error();
  ASSERT_OK_AND_ASSIGN(Client client, Client::Connect(small.socket_path()));
  std::vector<std::string> argv{DEPOT_EXAMPLE_WORKER_PATH, "--socket", small.socket_path(),
                                "--cpus", "2"};
  ChildProcess worker = ChildProcess::Start([argv] {
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    return 127;
  });
  ASSERT_TRUE(Eventually([&] {
    auto w = client.Workers();
    return w.ok() && w->size() == 1;
  }));
  const uint64_t bytes = (kSanitized ? 2 : 16) * kMiB;
  std::vector<TaskRequest> tasks;
  std::vector<ObjectId> level;
  for (int i = 0; i < 512; ++i) {
    level.push_back(ObjectId::Random());
    tasks.push_back({.function = "fill", .args = std::to_string(bytes), .outputs = {level.back()}});
  }
  while (level.size() > 1) {
    std::vector<ObjectId> next;
    for (size_t i = 0; i < level.size(); i += 2) {
      next.push_back(ObjectId::Random());
      tasks.push_back(
          {.function = "add", .inputs = {level[i], level[i + 1]}, .outputs = {next.back()}});
    }
    level = std::move(next);
  }
  ASSERT_EQ(tasks.size(), 1023u);
  ASSERT_OK(client.Submit(tasks).status());
  ASSERT_OK_AND_ASSIGN(Buffer result, client.Get(level[0], std::chrono::seconds(120)));
  ASSERT_EQ(result.size(), bytes);
  const auto* values = reinterpret_cast<const double*>(result.data().data());
  EXPECT_EQ(values[0], 512.0);
  EXPECT_EQ(values[bytes / sizeof(double) - 1], 512.0);
  ASSERT_OK_AND_ASSIGN(StoreStatus status, client.GetStatus());
  EXPECT_GT(status.evictions, 0u);
  EXPECT_LE(status.capacity_bytes, 256 * kMiB);
}

TEST_F(TaskTest, AFailingTaskSurfacesItsMessageThroughGet) {
  ChildProcess worker = StartWorker({});
  ASSERT_OK_AND_ASSIGN(auto outputs, client_->Submit({.function = "fail", .args = "no luck"}));
  auto result = client_->Get(outputs[0], kPatience);
  ASSERT_EQ(result.status().code(), StatusCode::kTaskFailed) << result.status().ToString();
  EXPECT_NE(result.status().message().find("no luck"), std::string::npos);
  // A task reading the failed output fails with it, at once.
  ASSERT_OK_AND_ASSIGN(auto downstream, client_->Submit({.function = "copy", .inputs = outputs}));
  auto second = client_->Get(downstream[0], kPatience);
  ASSERT_EQ(second.status().code(), StatusCode::kTaskFailed);
  EXPECT_NE(second.status().message().find("no luck"), std::string::npos);
}

TEST_F(TaskTest, AWorkerKilledMidTaskHasItsTaskRetriedElsewhereKeepingWhatItSealed) {
  ChildProcess first = StartWorker({});
  const std::vector<std::byte> a = SeededBytes(3 * kMiB + 5, 21);
  const std::vector<std::byte> b = SeededBytes(100, 22);
  const ObjectId input_a = ObjectId::Random();
  const ObjectId input_b = ObjectId::Random();
  ASSERT_OK(client_->Put(input_a, a));
  ASSERT_OK(client_->Put(input_b, b));
  // Its first attempt puts its first output, then never finishes.
  ASSERT_OK_AND_ASSIGN(
      auto outputs,
      client_->Submit({.function = "stall_once", .inputs = {input_a, input_b}, .num_outputs = 2}));
  ASSERT_OK_AND_ASSIGN(Buffer early, client_->Get(outputs[0], kPatience));
  EXPECT_TRUE(SameBytes(early.data(), a));
  ChildProcess second = StartWorker({});
  ASSERT_TRUE(first.Kill(SIGKILL));
  EXPECT_EQ(first.Wait(), 128 + SIGKILL);
  // The second attempt is told that output 0 is there, and makes only output 1.
  ASSERT_OK_AND_ASSIGN(auto out, client_->Get(outputs, kPatience));
  EXPECT_TRUE(SameBytes(out[0].data(), a));
  EXPECT_TRUE(SameBytes(out[1].data(), b));
  ASSERT_OK_AND_ASSIGN(TaskInfo task, TaskOf(outputs[0]));
  EXPECT_EQ(task.state, TaskState::kDone) << task.reason;
  EXPECT_EQ(task.attempts, 2u);
  ASSERT_OK_AND_ASSIGN(StoreStatus status, client_->GetStatus());
  EXPECT_EQ(status.scheduler.retried, 1u);
}

TEST_F(TaskTest, SmallOutputsTravelWithTheCompletionAndLargeOnesArePut) {
  // A worker of this process, with functions of its own.
  ASSERT_OK_AND_ASSIGN(auto worker,
                       Worker::Connect({.socket_path = daemon_.socket_path(), .cpus = 2}));
  std::atomic<int> checks_failed{0};
  worker->Register("shapes", [&](TaskContext& task) -> Status {
    const std::string small = "small";
    const std::string meta = "dtype=u8";
    const std::vector<std::byte> large = SeededBytes(ipc::kMaxInlineOutputBytes + 1, 5);
    DEPOT_RETURN_NOT_OK(
        task.Put(0, std::as_bytes(std::span(small)), std::as_bytes(std::span(meta))));
    DEPOT_RETURN_NOT_OK(task.Put(1, large));
    if (task.Put(0, {}).code() != StatusCode::kAlreadyExists) ++checks_failed;
    if (task.Put(2, {}).code() != StatusCode::kInvalidArgument) ++checks_failed;
    return Status::OK();
  });
  worker->Register("half_then_fail", [](TaskContext& task) -> Status {
    DEPOT_RETURN_NOT_OK(task.Put(0, std::as_bytes(std::span(std::string_view("unsent")))));
    return Status::Internal("failed after a put");
  });
  std::thread runner([&] { EXPECT_OK(worker->Run()); });
  ASSERT_TRUE(Eventually([&] { return WorkerCount() == 1; }));

  ASSERT_OK_AND_ASSIGN(auto outputs, client_->Submit({.function = "shapes", .num_outputs = 2}));
  ASSERT_OK_AND_ASSIGN(auto out, client_->Get(outputs, kPatience));
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(out[0].data().data()), out[0].size()),
            "small");
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(out[0].metadata().data()),
                        out[0].metadata().size()),
            "dtype=u8");
  EXPECT_TRUE(SameBytes(out[1].data(), SeededBytes(ipc::kMaxInlineOutputBytes + 1, 5)));
  EXPECT_EQ(checks_failed.load(), 0);
  // A function that fails after putting a small output: the value is never stored.
  ASSERT_OK_AND_ASSIGN(auto failed, client_->Submit({.function = "half_then_fail"}));
  auto got = client_->Get(failed[0], kPatience);
  EXPECT_EQ(got.status().code(), StatusCode::kTaskFailed) << got.status().ToString();
  EXPECT_NE(got.status().message().find("failed after a put"), std::string::npos);

  worker->Stop();
  runner.join();
}

// The value of the metric line starting `series` (a name and labels), 0 where there is none.
double MetricValue(const std::string& metrics, const std::string& series) {
  const size_t at = metrics.find("\n" + series + " ");
  if (at == std::string::npos) return 0;
  return std::stod(metrics.substr(at + series.size() + 2));
}

// A store of 8 MiB, for outputs that find no room.
class SmallStoreTaskTest : public TaskTest {
 protected:
  SmallStoreTaskTest() : TaskTest({"--memory", "8MiB"}) {}

  // Puts `size` bytes under a new id, pinned: never evicted to make room.
  ObjectId Occupy(size_t size) {
    const ObjectId id = ObjectId::Random();
    const std::vector<char> bytes(size, 'x');
    EXPECT_OK(client_->Put(id, std::as_bytes(std::span(bytes)), {.pin = true}));
    return id;
  }
  double Metric(const std::string& series) {
    auto metrics = client_->Metrics();
    EXPECT_TRUE(metrics.ok()) << metrics.status().ToString();
    return metrics.ok() ? MetricValue(*metrics, series) : -1;
  }
  // A worker of 2 CPUs running a task that never ends on one, the store filled by a pinned
  // object of 5 MiB (occupant_), and a task making 5 MiB (filled_) waiting for room on the
  // other.
  void FillWaitingBesideAStalledTask() {
    worker_.emplace(StartWorker({"--cpus", "2"}));
    ASSERT_OK_AND_ASSIGN(auto stalled, client_->Submit({.function = "stall_once"}));
    ASSERT_TRUE(Eventually([&] {
      auto t = TaskOf(stalled[0]);
      return t.ok() && t->state == TaskState::kRunning;
    }));
    occupant_ = Occupy(5 * kMiB);
    ASSERT_OK_AND_ASSIGN(filled_,
                         client_->Submit({.function = "fill", .args = std::to_string(5 * kMiB)}));
    ASSERT_TRUE(Eventually([&] { return Metric("depot_task_outputs_waiting_for_room") == 1; }))
        << "the fill's create did not wait";
  }

  std::optional<ChildProcess> worker_;
  ObjectId occupant_;
  std::vector<ObjectId> filled_;
};

// A task's output that finds no room waits for room that others free, instead of failing:
// here a stalled task runs beside it, so it waits on, until the client's object goes.
TEST_F(SmallStoreTaskTest, AnOutputWithNoRoomWaitsForRoomWhileOtherTasksRun) {
  ASSERT_NO_FATAL_FAILURE(FillWaitingBesideAStalledTask());
  ASSERT_OK(client_->Delete(occupant_));
  ASSERT_OK_AND_ASSIGN(Buffer out, client_->Get(filled_[0], kPatience));
  EXPECT_EQ(out.size(), 5 * kMiB);
  EXPECT_EQ(Metric("depot_task_outputs_waiting_for_room"), 0);
  EXPECT_EQ(Metric("depot_task_output_room_waits_total"), 1);
  EXPECT_EQ(Metric("depot_task_output_room_waits_failed_total"), 0);
}

// An output given up while it waits (its graph failed or was cancelled: nobody will read
// it) stops waiting at once, rather than take room from others once some is freed.
TEST_F(SmallStoreTaskTest, AnOutputGivenUpWhileItWaitsForRoomStopsWaiting) {
  ASSERT_NO_FATAL_FAILURE(FillWaitingBesideAStalledTask());
  ASSERT_OK(client_->DeleteAfterTasks(filled_));
  EXPECT_TRUE(Eventually([&] {
    auto tasks = client_->Tasks();
    if (!tasks.ok()) return false;
    for (const TaskInfo& t : *tasks) {
      if (t.outputs == filled_ && t.state == TaskState::kFailed) {
        EXPECT_NE(t.reason.find("nobody wants this output any more"), std::string::npos)
            << t.reason;
        return true;
      }
    }
    return false;
  }));
  EXPECT_EQ(Metric("depot_task_outputs_waiting_for_room"), 0);
  ASSERT_OK(client_->Delete(occupant_));
}

// When every task that runs waits for room and nothing is freed, nothing will be: the wait
// fails, saying why, instead of waiting forever; the daemon and the worker go on.
TEST_F(SmallStoreTaskTest, AnOutputNothingCanMakeRoomForFailsItsTaskSayingWhy) {
  ChildProcess worker = StartWorker({"--cpus", "1"});
  const ObjectId occupant = Occupy(5 * kMiB);
  ASSERT_OK_AND_ASSIGN(auto filled,
                       client_->Submit({.function = "fill", .args = std::to_string(5 * kMiB)}));
  auto got = client_->Get(filled[0], kPatience);
  ASSERT_EQ(got.status().code(), StatusCode::kTaskFailed) << got.status().ToString();
  // It names the task (its function, having no label), the output's size and the store's.
  for (const char* part : {"no room for an output of task ",
                           " of 'fill' while every task that "
                           "runs waits for room too",
                           "of 5.00 MiB", "start depotd with more --memory"}) {
    EXPECT_NE(got.status().message().find(part), std::string::npos) << got.status().message();
  }
  EXPECT_EQ(Metric("depot_task_output_room_waits_failed_total"), 1);
  // The store is as it was, and the worker takes the next task.
  ASSERT_OK(client_->Delete(occupant));
  ASSERT_OK_AND_ASSIGN(auto again,
                       client_->Submit({.function = "fill", .args = std::to_string(5 * kMiB)}));
  ASSERT_OK_AND_ASSIGN(Buffer out, client_->Get(again[0], kPatience));
  EXPECT_EQ(out.size(), 5 * kMiB);
}

// Outputs larger than a completion carries are created by the worker and filled in place
// (TaskContext::Create), or created and copied into (Put, PutParts); the daemon seals them
// with the completion, so no task here sends a seal request of its own.
TEST_F(TaskTest, LargeOutputsAreSealedWithTheCompletionWithoutASealRequest) {
  ASSERT_OK_AND_ASSIGN(auto worker,
                       Worker::Connect({.socket_path = daemon_.socket_path(), .cpus = 2}));
  std::atomic<int> checks_failed{0};
  constexpr uint64_t kLarge = 3 * kMiB;
  worker->Register("three_ways", [&](TaskContext& task) -> Status {
    DEPOT_ASSIGN_OR_RETURN(MutableBuffer made, task.Create(0, kLarge));
    const std::vector<std::byte> bytes = SeededBytes(kLarge, 41);
    std::memcpy(made.ptr(), bytes.data(), bytes.size());
    if (task.Create(0, 1).status().code() != StatusCode::kAlreadyExists) ++checks_failed;
    if (task.Put(0, {}).code() != StatusCode::kAlreadyExists) ++checks_failed;
    if (task.Create(3, 1).status().code() != StatusCode::kInvalidArgument) ++checks_failed;
    // Two parts with a gap between them, which reads as zeros.
    const std::span<const std::byte> all(bytes);
    const PutPart parts[] = {{.offset = 0, .data = all.first(kMiB)},
                             {.offset = 2 * kMiB, .data = all.subspan(2 * kMiB)}};
    const std::string meta = "parts";
    DEPOT_RETURN_NOT_OK(task.PutParts(1, kLarge, parts, std::as_bytes(std::span(meta))));
    // Made, then dropped, then put small: what was put is what is kept.
    DEPOT_RETURN_NOT_OK(task.Create(2, kLarge).status());
    DEPOT_RETURN_NOT_OK(task.Abort(2));
    if (task.Abort(2).code() != StatusCode::kInvalidArgument) ++checks_failed;
    return task.Put(2, all.first(100));
  });
  worker->Register("create_then_fail", [](TaskContext& task) -> Status {
    DEPOT_RETURN_NOT_OK(task.Create(0, kLarge).status());
    return Status::Internal("failed after a create");
  });
  std::thread runner([&] { EXPECT_OK(worker->Run()); });
  ASSERT_TRUE(Eventually([&] { return WorkerCount() == 1; }));

  ASSERT_OK_AND_ASSIGN(auto outputs, client_->Submit({.function = "three_ways", .num_outputs = 3}));
  ASSERT_OK_AND_ASSIGN(auto out, client_->Get(outputs, kPatience));
  const std::vector<std::byte> expected = SeededBytes(kLarge, 41);
  EXPECT_TRUE(SameBytes(out[0].data(), expected));
  std::vector<std::byte> gapped = expected;
  std::fill(gapped.begin() + kMiB, gapped.begin() + 2 * kMiB, std::byte{0});
  EXPECT_TRUE(SameBytes(out[1].data(), gapped));
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(out[1].metadata().data()),
                        out[1].metadata().size()),
            "parts");
  EXPECT_TRUE(SameBytes(out[2].data(), std::span(expected).first(100)));
  EXPECT_EQ(checks_failed.load(), 0);

  // A function that fails after a create: its output is dropped, and the task fails.
  ASSERT_OK_AND_ASSIGN(auto failed, client_->Submit({.function = "create_then_fail"}));
  auto got = client_->Get(failed[0], kPatience);
  EXPECT_EQ(got.status().code(), StatusCode::kTaskFailed) << got.status().ToString();
  EXPECT_NE(got.status().message().find("failed after a create"), std::string::npos);
  ASSERT_TRUE(Eventually([&] {
    auto status = client_->GetStatus();
    return status.ok() && status->objects_creating == 0;
  }));
  ASSERT_OK_AND_ASSIGN(std::string metrics, client_->Metrics());
  EXPECT_EQ(MetricValue(metrics, "depot_requests_total{type=\"seal\"}"), 0) << metrics;
  EXPECT_GE(MetricValue(metrics, "depot_requests_total{type=\"create\"}"), 4) << metrics;

  worker->Stop();
  runner.join();
}

// Several outputs at once (TaskContext::PutPartsMany): the small ones travel with the
// completion, the large ones are created together, one round trip for all; a batch with a
// wrong item makes none of its outputs.
TEST_F(TaskTest, PutPartsManySendsSmallOutputsWithTheCompletionAndCreatesLargeOnesTogether) {
  ASSERT_OK_AND_ASSIGN(auto worker,
                       Worker::Connect({.socket_path = daemon_.socket_path(), .cpus = 1}));
  constexpr uint64_t kLarge = 1 * kMiB;
  const std::vector<std::byte> bytes = SeededBytes(kLarge, 43);
  const std::span<const std::byte> all(bytes);
  std::atomic<int> checks_failed{0};
  worker->Register("four", [&](TaskContext& task) -> Status {
    const PutPart whole[] = {{.offset = 0, .data = all}};
    const PutPart halves[] = {{.offset = 0, .data = all.first(kLarge / 2)},
                              {.offset = kLarge / 2, .data = all.subspan(kLarge / 2)}};
    const PutPart small[] = {{.offset = 0, .data = all.first(100)}};
    const std::string meta = "m";
    // Wrong batches first: an output named twice, one out of range, parts past the end.
    const TaskContext::OutputParts twice[] = {{.output = 0, .data_size = 100, .parts = small},
                                              {.output = 0, .data_size = 100, .parts = small}};
    if (task.PutPartsMany(twice).code() != StatusCode::kAlreadyExists) ++checks_failed;
    const TaskContext::OutputParts beyond[] = {{.output = 1, .data_size = 100, .parts = small},
                                               {.output = 9, .data_size = 100, .parts = small}};
    if (task.PutPartsMany(beyond).code() != StatusCode::kInvalidArgument) ++checks_failed;
    const TaskContext::OutputParts past[] = {{.output = 1, .data_size = 50, .parts = small}};
    if (task.PutPartsMany(past).code() != StatusCode::kInvalidArgument) ++checks_failed;
    const TaskContext::OutputParts batch[] = {
        {.output = 0, .data_size = kLarge, .parts = whole},
        {.output = 1, .data_size = 100, .parts = small},
        {.output = 2,
         .data_size = kLarge,
         .parts = halves,
         .metadata = std::as_bytes(std::span(meta))},
        {.output = 3, .data_size = kLarge + 100, .parts = halves}};
    DEPOT_RETURN_NOT_OK(task.PutPartsMany(batch));
    // Made now: naming one again is refused.
    if (task.PutPartsMany(std::span(batch).first(1)).code() != StatusCode::kAlreadyExists) {
      ++checks_failed;
    }
    return Status::OK();
  });
  std::thread runner([&] { EXPECT_OK(worker->Run()); });
  ASSERT_TRUE(Eventually([&] { return WorkerCount() == 1; }));
  ASSERT_OK_AND_ASSIGN(std::string before, client_->Metrics());

  ASSERT_OK_AND_ASSIGN(auto outputs, client_->Submit({.function = "four", .num_outputs = 4}));
  ASSERT_OK_AND_ASSIGN(auto out, client_->Get(outputs, kPatience));
  EXPECT_EQ(checks_failed.load(), 0);
  EXPECT_TRUE(SameBytes(out[0].data(), all));
  EXPECT_TRUE(SameBytes(out[1].data(), all.first(100)));
  EXPECT_TRUE(SameBytes(out[2].data(), all));
  EXPECT_EQ(out[2].metadata().size(), 1u);
  std::vector<std::byte> padded = bytes;
  padded.resize(kLarge + 100);  // what no part covers reads as zeros
  EXPECT_TRUE(SameBytes(out[3].data(), padded));
  ASSERT_OK_AND_ASSIGN(std::string after, client_->Metrics());
  const auto creates = [](const std::string& m) {
    return MetricValue(m, "depot_requests_total{type=\"create\"}");
  };
  EXPECT_EQ(creates(after) - creates(before), 3) << after;  // the large ones, the small inline
  EXPECT_EQ(MetricValue(after, "depot_requests_total{type=\"seal\"}"), 0) << after;

  worker->Stop();
  runner.join();
}

// Client::CreateMany creates each item as Create would, in one round trip, and reports each
// failure in its place without spoiling the others.
TEST_F(TaskTest, CreateManyCreatesEachItemAndReportsEachFailureInItsPlace) {
  const ObjectId taken = ObjectId::FromName("create-many-taken");
  ASSERT_OK(client_->Put(taken, std::as_bytes(std::span("x", 1))));
  const std::string meta = "meta";
  const CreateItem items[] = {
      {.id = ObjectId::FromName("create-many-a"), .data_size = 3 * kMiB},
      {.id = taken, .data_size = 10},
      {.id = ObjectId::FromName("create-many-b"),
       .data_size = 10,
       .options = {.metadata = std::as_bytes(std::span(meta))}},
      {.id = ObjectId::FromName("create-many-c"), .data_size = uint64_t{1} << 60}};
  std::vector<Result<MutableBuffer>> made = client_->CreateMany(items);
  ASSERT_EQ(made.size(), 4u);
  ASSERT_OK(made[0].status());
  EXPECT_EQ(made[0]->size(), 3 * kMiB);
  EXPECT_EQ(made[1].status().code(), StatusCode::kAlreadyExists) << made[1].status().ToString();
  ASSERT_OK(made[2].status());
  EXPECT_EQ(made[3].status().code(), StatusCode::kInvalidArgument) << made[3].status().ToString();
  std::memset(made[2]->ptr(), 7, 10);
  ASSERT_OK(client_->Seal(items[2].id));
  ASSERT_OK_AND_ASSIGN(Buffer b, client_->Get(items[2].id, kPatience));
  EXPECT_EQ(b.data()[9], std::byte{7});
  EXPECT_EQ(b.metadata().size(), meta.size());
  ASSERT_OK(client_->Abort(items[0].id));
  EXPECT_TRUE(client_->CreateMany({}).empty());
}

// Tasks sent ahead (pipelined) run one after another on a slot: a worker of two slots never
// runs more than two at once, whatever the daemon sent it ahead.
TEST_F(TaskTest, TasksSentAheadNeverRunBesideWhatTheyFollow) {
  ASSERT_OK_AND_ASSIGN(auto worker,
                       Worker::Connect({.socket_path = daemon_.socket_path(), .cpus = 2}));
  std::atomic<int> now{0};
  std::atomic<int> most{0};
  worker->Register("count", [&](TaskContext& task) -> Status {
    const int running = ++now;
    for (int seen = most.load(); running > seen && !most.compare_exchange_weak(seen, running);) {
    }
    std::this_thread::yield();
    --now;
    return task.Put(0, {});
  });
  std::thread runner([&] { EXPECT_OK(worker->Run()); });
  ASSERT_TRUE(Eventually([&] { return WorkerCount() == 1; }));
  std::vector<TaskRequest> batch(2000, TaskRequest{.function = "count"});
  ASSERT_OK_AND_ASSIGN(auto outputs, client_->Submit(batch));
  std::vector<ObjectId> all;
  for (const auto& out : outputs) all.push_back(out[0]);
  ASSERT_OK(client_->Get(all, kPatience).status());
  EXPECT_LE(most.load(), 2);
  EXPECT_GE(most.load(), 1);
  worker->Stop();
  runner.join();
}

// Failure messages of any length reach the daemon cut, alone or many to a message, and
// the worker goes on.
TEST_F(TaskTest, LongFailureMessagesAreCutAndTheWorkerGoesOn) {
  ASSERT_OK_AND_ASSIGN(auto worker,
                       Worker::Connect({.socket_path = daemon_.socket_path(), .cpus = 4}));
  worker->Register("shout", [](TaskContext& task) -> Status {
    return Status::Internal(std::string(std::stoul(std::string(task.args())), 'x'));
  });
  worker->Register("fine", [](TaskContext& task) -> Status { return task.Put(0, {}); });
  std::thread runner([&] { EXPECT_OK(worker->Run()); });
  ASSERT_TRUE(Eventually([&] { return WorkerCount() == 1; }));

  std::vector<TaskRequest> batch;
  batch.push_back({.function = "shout", .args = std::to_string(20 << 20)});
  for (int i = 0; i < 500; ++i) batch.push_back({.function = "shout", .args = "20000"});
  ASSERT_OK_AND_ASSIGN(auto outputs, client_->Submit(batch));
  for (const auto& out : outputs) {
    auto got = client_->Get(out[0], kPatience);
    ASSERT_EQ(got.status().code(), StatusCode::kTaskFailed) << got.status().ToString();
    EXPECT_GE(got.status().message().size(), 1000u);
    EXPECT_LE(got.status().message().size(), 4096u + 100) << "cut, with a few words around";
    EXPECT_NE(got.status().message().find("xxxxxxxxxx"), std::string::npos);
  }
  ASSERT_OK_AND_ASSIGN(auto fine, client_->Submit({.function = "fine"}));
  ASSERT_OK(client_->Get(fine[0], kPatience).status());
  worker->Stop();
  runner.join();
}

TEST_F(TaskTest, BadSubmissionsAreRefusedAndTheDaemonServesOthers) {
  ChildProcess worker = StartWorker({"--cpus", "1"});
  const ObjectId taken = PutArray(4);
  struct Case {
    TaskRequest task;
    StatusCode code;
    std::string says;
  };
  const std::vector<Case> cases{
      {{.function = "nobody_runs_this"}, StatusCode::kInvalidArgument, "no worker attached"},
      {{.function = "noop", .cpu = 0, .gpu = 1}, StatusCode::kInvalidArgument, "no worker"},
      {{.function = "noop", .cpu = 4}, StatusCode::kInvalidArgument, "no worker"},
      {{.function = "noop", .inputs = {ObjectId::Random()}}, StatusCode::kNotFound, "neither"},
      {{.function = "noop", .outputs = {taken}}, StatusCode::kAlreadyExists, "exists"},
      {{.function = "noop", .num_outputs = 0}, StatusCode::kInvalidArgument, "outputs"},
      {{.function = "noop", .gpu = 2}, StatusCode::kInvalidArgument, "share"},
  };
  for (const Case& c : cases) {
    auto r = client_->Submit(c.task);
    EXPECT_EQ(r.status().code(), c.code) << r.status().ToString();
    EXPECT_NE(r.status().message().find(c.says), std::string::npos) << r.status().ToString();
  }
  const ObjectId a = ObjectId::Random(), b = ObjectId::Random();
  auto cycle = client_->Submit(
      std::vector<TaskRequest>{{.function = "noop", .inputs = {b}, .outputs = {a}},
                               {.function = "noop", .inputs = {a}, .outputs = {b}}});
  EXPECT_EQ(cycle.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(cycle.status().message().find("cycle"), std::string::npos);

  ASSERT_OK_AND_ASSIGN(auto outputs, client_->Submit({.function = "noop"}));
  EXPECT_OK(client_->Get(outputs[0], kPatience).status());
}

TEST_F(TaskTest, ASubmitterThatDisconnectsHasItsWaitingTasksCancelled) {
  ChildProcess worker = StartWorker({});
  // The input is being created, so the task waits for it.
  const ObjectId input = ObjectId::Random();
  ASSERT_OK_AND_ASSIGN(MutableBuffer creating, client_->Create(input, 64));
  std::vector<ObjectId> outputs;
  {
    ASSERT_OK_AND_ASSIGN(Client submitter, Client::Connect(daemon_.socket_path()));
    ASSERT_OK_AND_ASSIGN(outputs, submitter.Submit({.function = "copy", .inputs = {input}}));
  }
  auto result = client_->Get(outputs[0], kPatience);
  EXPECT_EQ(result.status().code(), StatusCode::kTaskFailed) << result.status().ToString();
  EXPECT_NE(result.status().message().find("submitter"), std::string::npos);
  ASSERT_OK_AND_ASSIGN(TaskInfo task, TaskOf(outputs[0]));
  EXPECT_EQ(task.state, TaskState::kCancelled);
}

TEST_F(TaskTest, CancelledTasksFailTheirGets) {
  ChildProcess worker = StartWorker({});
  const ObjectId input = ObjectId::Random();
  ASSERT_OK_AND_ASSIGN(MutableBuffer creating, client_->Create(input, 64));
  ASSERT_OK_AND_ASSIGN(auto outputs, client_->Submit({.function = "copy", .inputs = {input}}));
  ASSERT_OK_AND_ASSIGN(auto outcomes, client_->Cancel(outputs));
  EXPECT_EQ(outcomes, std::vector{CancelOutcome::kCancelled});
  EXPECT_EQ(client_->Get(outputs[0], kPatience).status().code(), StatusCode::kTaskFailed);
  ASSERT_OK_AND_ASSIGN(auto unknown, client_->Cancel(std::vector{ObjectId::Random()}));
  EXPECT_EQ(unknown, std::vector{CancelOutcome::kUnknown});
}

// depotctl passes what a task's output takes: a task declaring more than the store has room
// for beside a running task's declared output waits; one declaring nothing does not.
TEST_F(TaskTest, DepotctlSubmitDeclaresOutputBytesThatWaitForRoom) {
  ChildProcess worker = StartWorker({"--cpus", "2"});
  const auto submit = [&](std::vector<std::string> args) {
    args.insert(args.begin(), {DEPOTCTL_PATH, "--socket", daemon_.socket_path(), "submit"});
    ProgramRun run = RunProgram(args);
    EXPECT_EQ(run.exit_code, 0) << run.Explain();
    return ObjectId::FromHex(run.out.substr(0, 32)).value_or(ObjectId{});
  };
  const ObjectId stalls = submit({"stall_once", "--output-bytes", "160MiB", "--kind", "big"});
  ASSERT_TRUE(Eventually([&] {
    auto task = TaskOf(stalls);
    return task.ok() && task->state == TaskState::kRunning;
  }));
  const ObjectId waits = submit({"noop", "--output-bytes", "160MiB"});
  const ObjectId runs = submit({"noop"});
  ASSERT_OK(client_->Get(runs, kPatience).status());
  ASSERT_OK_AND_ASSIGN(TaskInfo waiting, TaskOf(waits));
  EXPECT_EQ(waiting.state, TaskState::kReady);
  EXPECT_NE(waiting.reason.find("no worker has room for it now"), std::string::npos)
      << waiting.reason;

  ProgramRun bad = RunProgram({DEPOTCTL_PATH, "--socket", daemon_.socket_path(), "submit", "noop",
                               "--output-bytes", "lots"});
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("--output-bytes: 'lots' is not a size"), std::string::npos)
      << bad.Explain();
  ProgramRun long_kind = RunProgram({DEPOTCTL_PATH, "--socket", daemon_.socket_path(), "submit",
                                     "noop", "--kind", std::string(257, 'k')});
  EXPECT_EQ(long_kind.exit_code, 1);
  EXPECT_NE(long_kind.err.find("a kind of 257 bytes is over 256"), std::string::npos)
      << long_kind.Explain();
}

TEST_F(TaskTest, DepotctlSubmitsWaitsAndShowsWorkersAndTasks) {
  ChildProcess worker = StartWorker({"--cpus", "2"});
  const auto depotctl = [&](std::vector<std::string> args) {
    args.insert(args.begin(), {DEPOTCTL_PATH, "--socket", daemon_.socket_path()});
    return RunProgram(args);
  };
  const std::vector<std::byte> bytes = SeededBytes(5000, 9);
  ASSERT_OK(client_->Put(ObjectId::FromName("ctl/input"), bytes));

  ProgramRun copy = depotctl({"submit", "copy", "ctl/input", "--wait"});
  ASSERT_EQ(copy.exit_code, 0) << copy.Explain();
  auto output = ObjectId::FromHex(copy.out.substr(0, 32));
  ASSERT_TRUE(output.has_value()) << copy.Explain();
  ASSERT_OK_AND_ASSIGN(Buffer copied, client_->Get(*output));
  EXPECT_TRUE(SameBytes(copied.data(), bytes));

  // Without --wait, depotctl leaves at once; the task still runs.
  ProgramRun detached = depotctl({"submit", "copy", "ctl/input"});
  ASSERT_EQ(detached.exit_code, 0) << detached.Explain();
  auto detached_output = ObjectId::FromHex(detached.out.substr(0, 32));
  ASSERT_TRUE(detached_output.has_value()) << detached.Explain();
  ASSERT_OK_AND_ASSIGN(Buffer copied_later, client_->Get(*detached_output, kPatience));
  EXPECT_TRUE(SameBytes(copied_later.data(), bytes));

  // A label is shown; one past 256 bytes, or with a control character, is refused.
  ProgramRun fail =
      depotctl({"submit", "fail", "--args", "bad input", "--label", "('x', 1) \xc3\xa9", "--wait"});
  EXPECT_EQ(fail.exit_code, 1) << fail.Explain();
  EXPECT_NE(fail.err.find("bad input"), std::string::npos) << fail.Explain();
  ProgramRun unknown = depotctl({"submit", "nothere"});
  EXPECT_EQ(unknown.exit_code, 1);
  EXPECT_NE(unknown.err.find("no worker attached can run 'nothere'"), std::string::npos)
      << unknown.Explain();
  ProgramRun long_label = depotctl({"submit", "noop", "--label", std::string(257, 'k')});
  EXPECT_EQ(long_label.exit_code, 1);
  EXPECT_NE(long_label.err.find("a label of 257 bytes is over 256"), std::string::npos)
      << long_label.Explain();
  // ESC, U+009B (a C1 control, UTF-8 encoded), the raw byte 0x9B (not UTF-8), a newline.
  for (const char* label : {"\x1b[2J", "\xc2\x9b", "\x9b", "line\n"}) {
    ProgramRun control = depotctl({"submit", "noop", "--label", label});
    EXPECT_EQ(control.exit_code, 1) << label;
    EXPECT_NE(control.err.find("a label is UTF-8 text without control characters"),
              std::string::npos)
        << control.Explain();
  }
  ProgramRun bad = depotctl({"submit", "noop", "--resources", "GPU=lots"});
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("--resources wants NAME=AMOUNT"), std::string::npos) << bad.Explain();

  // A task's output is sealed a moment before its worker's completion reaches the daemon.
  ASSERT_TRUE(Eventually([&] {
    auto status = client_->GetStatus();
    return status.ok() && status->scheduler.completed == 2;
  }));
  ProgramRun workers = depotctl({"workers"});
  ASSERT_EQ(workers.exit_code, 0) << workers.Explain();
  EXPECT_NE(workers.out.find("depot-example-worker"), std::string::npos) << workers.out;
  EXPECT_NE(workers.out.find("copy"), std::string::npos) << workers.out;
  ASSERT_OK_AND_ASSIGN(std::vector<WorkerInfo> workers_read, client_->Workers());
  ProgramRun workers_json = depotctl({"workers", "--json"});
  ASSERT_OK_AND_ASSIGN(std::vector<WorkerInfo> workers_again, client_->Workers());
  EXPECT_NE(workers_json.out.find("\"done\": 2"), std::string::npos) << workers_json.out;
  EXPECT_NE(workers_json.out.find("\"failed\": 1"), std::string::npos) << workers_json.out;
  // From the table, every field with the value the client reads; a worker's GPUs are objects
  // of device and free_share (task_commands.cc).
  ASSERT_EQ(workers_read.size(), 1u);
  ASSERT_EQ(workers_again.size(), 1u);
  ExpectJsonHasEveryField(workers_json.out, workers_read[0], workers_again[0], {"gpus"},
                          {"free_gpu_shares"});

  ProgramRun top = depotctl({"top", "--once"});
  ASSERT_EQ(top.exit_code, 0) << top.Explain();
  EXPECT_NE(top.out.find("workers (all 1)"), std::string::npos) << top.out;
  EXPECT_NE(top.out.find("1 workers"), std::string::npos) << top.out;

  ProgramRun tasks = depotctl({"tasks"});
  ASSERT_EQ(tasks.exit_code, 0) << tasks.Explain();
  EXPECT_NE(tasks.out.find("bad input"), std::string::npos) << tasks.out;
  EXPECT_NE(tasks.out.find("('x', 1) \xc3\xa9"), std::string::npos) << tasks.out;
  ASSERT_OK_AND_ASSIGN(std::vector<TaskInfo> tasks_read, client_->Tasks());
  ProgramRun tasks_json = depotctl({"tasks", "--json"});
  ASSERT_OK_AND_ASSIGN(std::vector<TaskInfo> tasks_again, client_->Tasks());
  EXPECT_NE(tasks_json.out.find("\"state\": \"done\""), std::string::npos) << tasks_json.out;
  EXPECT_NE(tasks_json.out.find("\"state\": \"failed\""), std::string::npos) << tasks_json.out;
  // From the table too; a task without a device (these ran on the host) shows null, not -1.
  ASSERT_FALSE(tasks_read.empty());
  ASSERT_EQ(tasks_read.size(), tasks_again.size());
  for (size_t i = 0; i < tasks_read.size(); ++i) {
    ExpectJsonHasEveryField(tasks_json.out, tasks_read[i], tasks_again[i], {"device"});
  }
  EXPECT_NE(tasks_json.out.find("\"device\": null"), std::string::npos) << tasks_json.out;
}

TEST_F(TaskTest, AWorkerStoppedBySigtermLeavesCleanly) {
  ChildProcess worker = StartWorker({});
  ASSERT_OK_AND_ASSIGN(auto outputs, client_->Submit({.function = "noop"}));
  ASSERT_OK(client_->Get(outputs[0], kPatience).status());
  ASSERT_TRUE(worker.Kill(SIGTERM));
  EXPECT_EQ(worker.Wait(), 0);
  EXPECT_EQ(WorkerCount(), 0u);
}

}  // namespace
}  // namespace depot::testing
