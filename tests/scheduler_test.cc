// The scheduler on its own, against a fake store and fake workers: validation, readiness,
// placement by locality, resources, the graph's references, ordering, faults and cancels.
#include "scheduler/scheduler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <map>
#include <random>
#include <utility>

#include "scheduler_fakes.h"

namespace depot::scheduler {
namespace {

// The decisions one at a time, with tasks sent to workers only when they start: pipelining
// (tasks sent ahead, SchedulerOptions::pipeline, the daemon's default) has tests of its own
// below, and the random load runs both ways.
class SchedulerTest : public ::testing::Test {
 protected:
  explicit SchedulerTest(bool pipeline = false) : scheduler_(store_, link_, Options(pipeline)) {}

  // Time stands still (durations measure 0) unless a test moves `now_`.
  SchedulerOptions Options(bool pipeline) {
    SchedulerOptions o;
    o.window = 2;
    o.pipeline = pipeline;
    o.clock = [this] { return now_; };
    o.bounds_stuck = [this] { ++bounds_stuck_; };
    return o;
  }

  // Random submissions and completions against three workers, which run what they are sent
  // as a worker does (a task sent ahead once the one it follows has ended): what runs never
  // takes more than a worker has.
  void RandomLoad();

  void AddWorker(SessionId id, double cpu, std::vector<int32_t> gpus = {},
                 std::vector<std::string> functions = {"f"},
                 std::map<std::string, double> custom = {}) {
    WorkerSpec spec{.name = "w" + std::to_string(id),
                    .capacity = {.cpu = cpu, .gpus = std::move(gpus), .custom = std::move(custom)},
                    .functions = std::move(functions)};
    ASSERT_TRUE(scheduler_.AddWorker(id, std::move(spec)).ok());
  }

  static TaskSpec Task(std::vector<ObjectId> inputs = {}, ResourceRequest r = {}) {
    TaskSpec t;
    t.function = "f";
    t.inputs = std::move(inputs);
    t.resources = std::move(r);
    return t;
  }

  // Submits one task; its outputs.
  std::vector<ObjectId> Submit(const TaskSpec& spec, SessionId submitter = 100) {
    auto out = scheduler_.Submit(submitter, std::span(&spec, 1));
    EXPECT_TRUE(out.ok()) << out.status().ToString();
    return out.ok() ? out.value()[0] : std::vector<ObjectId>{};
  }

  // One worker of 4 CPUs, a store with room for everything and a disk tier: where a bound's
  // outputs may leave memory.
  void OneWorkerOnADiskTier() {
    AddWorker(1, 4);
    store_.room[kHostMemory] = 1000 * kMiB;
    store_.disk = true;
  }

  // A task declaring `output` bytes, in the memory bound `id` of `bytes`.
  static TaskSpec Bounded(uint64_t id, uint64_t bytes, uint64_t output) {
    TaskSpec t = Task();
    t.output_bytes = output;
    t.bound_id = id;
    t.bound_bytes = bytes;
    return t;
  }

  Status SubmitStatus(std::vector<TaskSpec> specs) {
    return scheduler_.Submit(100, specs).status();
  }

  // The worker runs `s`: seals its outputs (`bytes` each, on its device) and completes it.
  void Run(const Sent& s, uint64_t bytes = kMiB) {
    for (const ObjectId& o : s.outputs) store_.Seal(o, bytes, s.device);
    Completion c{.task = s.task};
    ASSERT_TRUE(scheduler_.Complete(s.worker, std::span(&c, 1)).ok());
    store_.Deliver(scheduler_);
  }
  void Fail(const Sent& s, std::string message) {
    Completion c{.task = s.task, .ok = false, .message = std::move(message)};
    ASSERT_TRUE(scheduler_.Complete(s.worker, std::span(&c, 1)).ok());
    store_.Deliver(scheduler_);
  }

  int bounds_stuck_ = 0;  // calls of SchedulerOptions::bounds_stuck
  FakeStore store_;
  FakeLink link_;
  double now_ = 0;
  Scheduler scheduler_;
};

const ResourceRequest kGpuOnly{.cpu = 0, .gpu = 1};

TEST(DurationModelTest, DurationsAreLearnedPerFunctionAndKindOfDevice) {
  DurationModel model;
  EXPECT_EQ(model.Expected({"f"}, kMiB).cpu.seconds, DurationModel::kUnmeasured);
  EXPECT_FALSE(model.Expected({"f"}, kMiB).cpu.measured);
  model.Record({"f"}, /*on_gpu=*/false, kMiB, 0.5);
  EXPECT_EQ(model.Expected({"f"}, kMiB).cpu.seconds, 0.5);
  EXPECT_TRUE(model.Expected({"f"}, kMiB).cpu.measured);
  EXPECT_EQ(model.Expected({"f"}, kMiB).gpu.seconds, DurationModel::kUnmeasured);
  for (int i = 0; i < 50; ++i) model.Record({"f"}, false, kMiB, 0.1);
  EXPECT_NEAR(model.Expected({"f"}, kMiB).cpu.seconds, 0.1, 1e-3);
  EXPECT_EQ(model.Expected({"g"}, kMiB).cpu.seconds, DurationModel::kUnmeasured);
}

TEST(DurationModelTest, DurationsAreLearnedPerInputSizeWithinAFactorOfFour) {
  DurationModel model;
  model.Record({"f"}, /*on_gpu=*/false, 4 * kMiB, 0.004);
  model.Record({"f"}, /*on_gpu=*/true, 4 * kMiB, 0.001);
  // The same size class: measured.
  EXPECT_TRUE(model.Expected({"f"}, 5 * kMiB).cpu.measured);
  EXPECT_EQ(model.Expected({"f"}, 5 * kMiB).cpu.seconds, 0.004);
  // Larger: in proportion to the bytes, from the nearest size measured; not measured there.
  const auto large = model.Expected({"f"}, 64 * kMiB);
  EXPECT_FALSE(large.cpu.measured);
  EXPECT_NEAR(large.cpu.seconds, 0.064, 1e-9);
  EXPECT_NEAR(large.gpu.seconds, 0.016, 1e-9);
  // Smaller: what the nearest size cost (fixed costs dominate small inputs).
  EXPECT_EQ(model.Expected({"f"}, 1024).gpu.seconds, 0.001);
  EXPECT_FALSE(model.Expected({"f"}, 1024).gpu.measured);
  // Measured at the small size, that size has its own estimate.
  model.Record({"f"}, /*on_gpu=*/true, 1000, 0.0005);
  EXPECT_EQ(model.Expected({"f"}, 1024).gpu.seconds, 0.0005);
  EXPECT_EQ(model.Expected({"f"}, 4 * kMiB).gpu.seconds, 0.001);
}

TEST(DurationModelTest, PassedOverCountsPlacementsOfTheOtherVariantSinceThisOnesLast) {
  DurationModel model;
  EXPECT_EQ(model.PassedOver({"f"}, /*on_gpu=*/true, kMiB), 0u);
  for (int i = 0; i < 3; ++i) model.Chose({"f"}, /*on_gpu=*/false, kMiB);
  EXPECT_EQ(model.PassedOver({"f"}, true, kMiB), 3u);
  EXPECT_EQ(model.PassedOver({"f"}, false, kMiB), 0u);
  EXPECT_EQ(model.PassedOver({"f"}, true, 256 * kMiB), 0u);  // another size
  model.Chose({"f"}, true, kMiB);
  EXPECT_EQ(model.PassedOver({"f"}, true, kMiB), 0u);
  EXPECT_EQ(model.PassedOver({"f"}, false, kMiB), 1u);
}

TEST(DurationModelTest, KindsOfOneFunctionAreTimedApartAndBounded) {
  DurationModel model;
  model.Record({"run", "sum-1"}, /*on_gpu=*/false, kMiB, 0.5);
  model.Record({"run", "mul-2"}, /*on_gpu=*/false, kMiB, 0.01);
  EXPECT_EQ(model.Expected({"run", "sum-1"}, kMiB).cpu.seconds, 0.5);
  EXPECT_EQ(model.Expected({"run", "mul-2"}, kMiB).cpu.seconds, 0.01);
  EXPECT_FALSE(model.Expected({"run"}, kMiB).cpu.measured);  // no kind is a kind of its own
  model.Chose({"run", "sum-1"}, /*on_gpu=*/false, kMiB);
  EXPECT_EQ(model.PassedOver({"run", "sum-1"}, true, kMiB), 1u);
  EXPECT_EQ(model.PassedOver({"run", "mul-2"}, true, kMiB), 0u);

  // A client naming a new kind for every task cannot grow the model: the least recently
  // measured kinds go first.
  for (size_t i = 0; i < 3 * DurationModel::kMaxKinds; ++i) {
    model.Record({"run", "layer-" + std::to_string(i)}, false, kMiB, 1.0);
    if (i % 16 == 0) model.Record({"run", "sum-1"}, false, kMiB, 0.5);  // kept by its use
  }
  EXPECT_EQ(model.kinds("run"), DurationModel::kMaxKinds);
  EXPECT_TRUE(model.Expected({"run", "sum-1"}, kMiB).cpu.measured);
  EXPECT_FALSE(model.Expected({"run", "mul-2"}, kMiB).cpu.measured);
  model.Forget("run");
  EXPECT_EQ(model.kinds("run"), 0u);
}

TEST_F(SchedulerTest, BadSubmissionsAreRefusedSayingWhy) {
  AddWorker(1, 2, {0});
  const ObjectId input = store_.Put(kMiB);

  TaskSpec unknown = Task();
  unknown.function = "g";
  Status s = SubmitStatus({unknown});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("no worker attached can run 'g'"), std::string::npos) << s.ToString();

  EXPECT_EQ(SubmitStatus({Task({}, {.cpu = 3})}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(SubmitStatus({Task({}, {.cpu = 0, .gpu = 1.5})}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(SubmitStatus({Task({}, {.cpu = 0, .gpu = 0})}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(SubmitStatus({Task({}, {.cpu = 1, .custom = {{"ssd", 1}}})}).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(SubmitStatus({Task({}, {.cpu = std::nan("")})}).code(), StatusCode::kInvalidArgument);

  s = SubmitStatus({Task({ObjectId::Random()})});
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_NE(s.message().find("neither exists nor is the output of a task"), std::string::npos);

  TaskSpec taken = Task();
  taken.outputs = {input};
  s = SubmitStatus({taken});
  EXPECT_EQ(s.code(), StatusCode::kAlreadyExists);
  EXPECT_NE(s.message().find("exists already"), std::string::npos) << s.ToString();

  TaskSpec twice = Task();
  const ObjectId out = ObjectId::Random();
  twice.outputs = {out, out};
  EXPECT_EQ(SubmitStatus({twice}).code(), StatusCode::kAlreadyExists);

  TaskSpec big = Task();
  big.args.assign(kMaxInlineArgs + 1, 'x');
  EXPECT_EQ(SubmitStatus({big}).code(), StatusCode::kInvalidArgument);
  TaskSpec none = Task();
  none.num_outputs = 0;
  EXPECT_EQ(SubmitStatus({none}).code(), StatusCode::kInvalidArgument);

  // A refused batch leaves nothing behind, and the scheduler serves the next.
  EXPECT_EQ(scheduler_.counters().tasks_pending, 0u);
  EXPECT_TRUE(link_.Take().empty());
  Submit(Task({input}));
  EXPECT_EQ(link_.Take().size(), 1u);
}

TEST_F(SchedulerTest, ACycleThroughNamedOutputsIsRefused) {
  AddWorker(1, 1);
  const ObjectId a = ObjectId::Random(), b = ObjectId::Random();
  TaskSpec first = Task({b});
  first.outputs = {a};
  TaskSpec second = Task({a});
  second.outputs = {b};
  Status s = SubmitStatus({first, second});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("cycle"), std::string::npos) << s.ToString();
  TaskSpec self = Task({a});
  self.outputs = {a};
  EXPECT_EQ(SubmitStatus({self}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(scheduler_.counters().tasks_pending, 0u);
}

TEST_F(SchedulerTest, ABatchMayNameItsTasksInAnyOrder) {
  AddWorker(1, 1);
  const ObjectId a = ObjectId::Random();
  TaskSpec consumer = Task({a});
  TaskSpec producer = Task();
  producer.outputs = {a};
  auto out = scheduler_.Submit(100, std::vector{consumer, producer});
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  auto sent = link_.Take();
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].outputs, std::vector{a});
  Run(sent[0]);
  sent = link_.Take();
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].outputs, out.value()[0]);
}

TEST_F(SchedulerTest, ATaskWaitsForItsInputsToBeSealed) {
  AddWorker(1, 1);
  const ObjectId input = store_.Creating();
  auto outputs = Submit(Task({input}));
  ASSERT_EQ(outputs.size(), 1u);
  EXPECT_TRUE(link_.Take().empty());
  EXPECT_EQ(scheduler_.Tasks()[0].state, TaskState::kWaiting);
  EXPECT_EQ(scheduler_.Tasks()[0].inputs_missing, 1u);

  store_.Seal(input, kMiB);
  store_.Deliver(scheduler_);
  auto sent = link_.Take();
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].inputs, std::vector{input});
  EXPECT_EQ(sent[0].outputs, outputs);
  EXPECT_EQ(sent[0].device, kHostMemory);
  EXPECT_EQ(store_.HoldsOn(input), 1);
}

TEST_F(SchedulerTest, AGpuTaskRunsOnTheDeviceHoldingItsInput) {
  AddWorker(1, 1, {0});
  AddWorker(2, 1, {1});
  const ObjectId input = store_.Put(256 * kMiB, 1);
  Submit(Task({input}, kGpuOnly));
  auto sent = link_.Take();
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].worker, 2u);
  EXPECT_EQ(sent[0].device, 1);
  EXPECT_EQ(scheduler_.counters().local_bytes, 256 * kMiB);
  EXPECT_EQ(scheduler_.counters().moved_bytes, 0u);
}

TEST_F(SchedulerTest, HostInputsAreReadOnHostWhereverTheTaskRuns) {
  AddWorker(1, 1, {0});
  AddWorker(2, 1, {1});
  // A function's pickle on host (input 0) and its data on GPU 1 (input 1).
  const ObjectId function = store_.Put(4096);
  const ObjectId data = store_.Put(64 * kMiB, 1);
  TaskSpec t = Task({function, data}, kGpuOnly);
  t.host_inputs = {0};
  Submit(t);
  auto sent = link_.Take();
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].device, 1);
  EXPECT_EQ(scheduler_.counters().moved_bytes, 0u);  // the pickle is read where it is
  EXPECT_EQ(scheduler_.counters().local_bytes, 64 * kMiB + 4096);

  // Queued behind a busy GPU, only what it reads on the GPU is prefetched there.
  const ObjectId on_host = store_.Put(kMiB);
  TaskSpec queued = Task({function, on_host}, kGpuOnly);
  queued.host_inputs = {0};
  queued.affinity = Affinity::kNone;
  Submit(queued);
  Submit(queued);
  Submit(queued);
  ASSERT_FALSE(store_.prefetched.empty());
  for (const auto& [id, device] : store_.prefetched) EXPECT_NE(id, function);

  TaskSpec bad = Task({function});
  bad.host_inputs = {1};
  Status s = SubmitStatus({bad});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("host input 1 is not the index of an input"), std::string::npos)
      << s.ToString();
}

TEST_F(SchedulerTest, HardAffinityWaitsForTheDeviceHoldingTheInput) {
  AddWorker(1, 0, {0});
  AddWorker(2, 0, {1});
  const ObjectId on1 = store_.Put(kMiB, 1);
  TaskSpec hard = Task({on1}, kGpuOnly);
  hard.affinity = Affinity::kHard;
  Submit(hard);
  auto first = link_.Take();
  ASSERT_EQ(first.size(), 1u);
  ASSERT_EQ(first[0].device, 1);
  // Device 0 is idle, yet none goes there: two queue on device 1's worker, three wait.
  for (int i = 0; i < 5; ++i) Submit(hard);
  EXPECT_TRUE(link_.Take().empty());
  std::map<TaskState, int> states;
  for (const TaskInfo& t : scheduler_.Tasks()) {
    ++states[t.state];
    if (t.state == TaskState::kQueued) {
      EXPECT_EQ(t.device, 1);
    }
  }
  EXPECT_EQ(states[TaskState::kQueued], 2);
  EXPECT_EQ(states[TaskState::kReady], 3);
  for (int i = 0; i < 5; ++i) {
    Run(first[0]);
    first = link_.Take();
    ASSERT_EQ(first.size(), 1u);
    EXPECT_EQ(first[0].device, 1);
  }
  EXPECT_EQ(scheduler_.counters().moved_bytes, 0u);
}

TEST_F(SchedulerTest, SoftAffinityStartsElsewhereWhenTheDeviceHoldingTheInputIsBusy) {
  AddWorker(1, 0, {0});
  AddWorker(2, 0, {1});
  const ObjectId on1 = store_.Put(kMiB, 1);
  TaskSpec soft = Task({on1}, kGpuOnly);
  soft.affinity = Affinity::kSoft;
  Submit(soft);
  Submit(soft);
  auto sent = link_.Take();
  ASSERT_EQ(sent.size(), 2u);
  EXPECT_EQ(sent[0].device, 1);
  EXPECT_EQ(sent[1].device, 0);
  EXPECT_EQ(scheduler_.counters().moved_bytes, kMiB);
}

TEST_F(SchedulerTest, AQueuedCpuTaskStartsBesideARunningGpuTask) {
  AddWorker(1, 2, {0});
  Submit(Task({}, kGpuOnly));  // runs, holding the GPU
  Submit(Task({}, kGpuOnly));  // queued behind it
  ASSERT_EQ(link_.Take().size(), 1u);
  Submit(Task());  // two CPU slots are free: it starts at once, queued or not
  auto sent = link_.Take();
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].device, kHostMemory);
}

TEST_F(SchedulerTest, TinyResourceAmountsAreRefused) {
  AddWorker(1, 1, {0});
  EXPECT_EQ(SubmitStatus({Task({}, {.cpu = 1e-12})}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(SubmitStatus({Task({}, {.cpu = 0, .gpu = 1e-6})}).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(scheduler_.Submit(100, std::vector{Task({}, {.cpu = 1.0 / 1024})}).ok());
}

TEST_F(SchedulerTest, ManyTasksThatFindNoPlaceDoNotHoldBackOthers) {
  AddWorker(1, 1, {0});
  // Each wants only GPU 3, where its input is, and no worker has it: they never run.
  const ObjectId on3 = store_.Put(kMiB, 3);
  std::vector<TaskSpec> stuck;
  for (int i = 0; i < 300; ++i) {
    TaskSpec t = Task({on3}, kGpuOnly);
    t.affinity = Affinity::kHard;
    t.priority = 10;
    stuck.push_back(t);
  }
  ASSERT_TRUE(scheduler_.Submit(100, stuck).ok());
  Submit(Task());
  auto sent = link_.Take();
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].device, kHostMemory);
  EXPECT_NE(scheduler_.Tasks()[0].reason.find("hard affinity"), std::string::npos);
  // A worker offering GPU 3 takes them.
  AddWorker(2, 0, {3});
  sent = link_.Take();
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].device, 3);
}

TEST_F(SchedulerTest, ASendThatEndsASessionHasItsTasksPlacedElsewhereAtOnce) {
  // A link whose first send to worker 1 finds it dead, as a write to a killed process does.
  class DeadOnSend final : public WorkerLink {
   public:
    void Assign(SessionId worker, std::span<const Assignment> tasks) override {
      if (worker == 1) {
        scheduler->RemoveSession(1);
        return;
      }
      for (const Assignment& a : tasks) sent.push_back(a.task);
    }
    void Drained(SessionId) override {}
    Scheduler* scheduler = nullptr;
    std::vector<TaskId> sent;
  } link;
  FakeStore store;
  Scheduler scheduler(store, link, {});
  link.scheduler = &scheduler;
  ASSERT_TRUE(
      scheduler.AddWorker(1, {.name = "dead", .capacity = {.cpu = 1}, .functions = {"f"}}).ok());
  TaskSpec t = Task();
  ASSERT_TRUE(scheduler.Submit(100, std::span(&t, 1)).ok());
  EXPECT_TRUE(link.sent.empty());
  // The task went back to the queue when worker 1 was found dead; a new worker takes it.
  ASSERT_TRUE(
      scheduler.AddWorker(2, {.name = "alive", .capacity = {.cpu = 1}, .functions = {"f"}}).ok());
  EXPECT_EQ(link.sent.size(), 1u);
  EXPECT_EQ(scheduler.counters().retried, 1u);
}

TEST_F(SchedulerTest, AFailedTasksPartialOutputsAreAbortedAndItsReadersFailEvenWithoutRoom) {
  AddWorker(1, 1);
  TaskSpec two = Task();
  two.num_outputs = 2;
  auto out = Submit(two);
  auto reader = Submit(Task({out[1]}));
  auto sent = link_.Take();
  ASSERT_EQ(sent.size(), 1u);
  // The worker sealed output 0, was creating output 1, then failed; the store has no room
  // left to seal failed objects.
  store_.Seal(out[0], 8);
  store_.objects[out[1]] = {StoreAccess::State::kCreating, 0, 0, "", 0};
  store_.room_for_failed = false;
  Fail(sent[0], "ran out of patience");
  EXPECT_EQ(store_.aborted, (std::vector<std::pair<uint64_t, ObjectId>>{{1, out[1]}}));
  auto tasks = scheduler_.Tasks();
  const auto reader_task = std::find_if(tasks.begin(), tasks.end(),
                                        [&](const TaskInfo& t) { return t.outputs == reader; });
  ASSERT_NE(reader_task, tasks.end());
  EXPECT_EQ(reader_task->state, TaskState::kFailed);
  EXPECT_NE(reader_task->reason.find("ran out of patience"), std::string::npos);
}

TEST_F(SchedulerTest, SubmissionsAreChargedToTheirSubmitterUntilTheTasksAreOver) {
  AddWorker(1, 1);
  store_.charge_limit = 4096;
  TaskSpec big = Task();
  big.args.assign(8192, 'x');
  EXPECT_EQ(SubmitStatus({big}).code(), StatusCode::kLimitExceeded);
  EXPECT_EQ(store_.charged[100], 0);
  Submit(Task());
  EXPECT_GT(store_.charged[100], 0);
  auto sent = link_.Take();
  ASSERT_EQ(sent.size(), 1u);
  Run(sent[0]);
  EXPECT_EQ(store_.charged[100], 0);
}

TEST(RandomPlacementTest, RandomPlacementIgnoresWhereTheInputsAre) {
  FakeStore store;
  FakeLink link;
  SchedulerOptions options;
  options.random_placement = true;
  Scheduler scheduler(store, link, options);
  for (SessionId w : {1, 2}) {
    WorkerSpec spec{.name = "w",
                    .capacity = {.cpu = 0, .gpus = {static_cast<int32_t>(w - 1)}},
                    .functions = {"f"}};
    ASSERT_TRUE(scheduler.AddWorker(w, spec).ok());
  }
  const ObjectId on1 = store.Put(kMiB, 1);
  std::map<int32_t, int> devices;
  for (int i = 0; i < 64; ++i) {
    TaskSpec t{.function = "f", .inputs = {on1}, .resources = kGpuOnly};
    ASSERT_TRUE(scheduler.Submit(100, std::span(&t, 1)).ok());
    auto sent = link.Take();
    ASSERT_EQ(sent.size(), 1u);
    ++devices[sent[0].device];
    for (const ObjectId& o : sent[0].outputs) store.Seal(o, 1);
    Completion c{.task = sent[0].task};
    ASSERT_TRUE(scheduler.Complete(sent[0].worker, std::span(&c, 1)).ok());
    store.Deliver(scheduler);
  }
  EXPECT_GT(devices[0], 8);  // about half; by the cost model, none
  EXPECT_GT(devices[1], 8);
  EXPECT_GT(scheduler.counters().moved_bytes, 0u);
}

TEST_F(SchedulerTest, AGpuTaskHoldingNoCpuStartsWhileEveryCpuSlotIsBusy) {
  AddWorker(1, 2, {0});
  Submit(Task());
  Submit(Task());
  EXPECT_EQ(link_.Take().size(), 2u);
  Submit(Task({}, kGpuOnly));
  auto sent = link_.Take();
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].device, 0);
}

TEST_F(SchedulerTest, FourQuarterSharesShareADeviceAndAFifthWaits) {
  AddWorker(1, 0, {0});
  const ResourceRequest quarter{.cpu = 0, .gpu = 0.25};
  for (int i = 0; i < 5; ++i) Submit(Task({}, quarter));
  auto sent = link_.Take();
  ASSERT_EQ(sent.size(), 4u);
  EXPECT_EQ(scheduler_.Workers()[0].free_gpu_share[0].second, 0);
  Run(sent[1]);
  sent = link_.Take();
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].device, 0);
}

TEST_F(SchedulerTest, AChainOfTenStaysOnOneDeviceWithNothingMoved) {
  AddWorker(1, 1, {0});
  AddWorker(2, 1, {1});
  const ObjectId source = store_.Put(64 * kMiB, 1);
  std::vector<TaskSpec> chain;
  ObjectId previous = source;
  for (int i = 0; i < 10; ++i) {
    TaskSpec t = Task({previous}, kGpuOnly);
    previous = ObjectId::Random();
    t.outputs = {previous};
    chain.push_back(t);
  }
  ASSERT_TRUE(scheduler_.Submit(100, chain).ok());
  for (int i = 0; i < 10; ++i) {
    auto sent = link_.Take();
    ASSERT_EQ(sent.size(), 1u) << i;
    EXPECT_EQ(sent[0].device, 1) << i;
    Run(sent[0], 64 * kMiB);
  }
  EXPECT_EQ(scheduler_.counters().moved_bytes, 0u);
  EXPECT_EQ(scheduler_.counters().local_bytes, 10 * 64 * kMiB);
  EXPECT_TRUE(store_.prefetched.empty());
  EXPECT_EQ(store_.TotalHolds(), 0);  // intermediates let go of as the chain ran
}

TEST_F(SchedulerTest, ADiamondRunsEachTaskOnceItsInputsAreDone) {
  AddWorker(1, 4);
  const ObjectId top = ObjectId::Random(), left = ObjectId::Random(), right = ObjectId::Random(),
                 bottom = ObjectId::Random();
  TaskSpec a = Task(), b = Task({top}), c = Task({top}), d = Task({left, right});
  a.outputs = {top};
  b.outputs = {left};
  c.outputs = {right};
  d.outputs = {bottom};
  ASSERT_TRUE(scheduler_.Submit(100, std::vector{d, c, b, a}).ok());
  auto sent = link_.Take();
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].outputs[0], top);
  Run(sent[0]);
  sent = link_.Take();
  ASSERT_EQ(sent.size(), 2u);
  EXPECT_EQ(store_.HoldsOn(top), 1);
  Run(sent[0]);
  EXPECT_TRUE(link_.Take().empty());  // the bottom still waits for the other side
  Run(sent[1]);
  EXPECT_EQ(store_.HoldsOn(top), 0);
  sent = link_.Take();
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].outputs[0], bottom);
  Run(sent[0]);
  EXPECT_EQ(store_.TotalHolds(), 0);
  EXPECT_EQ(scheduler_.counters().completed, 4u);
  EXPECT_EQ(scheduler_.counters().tasks_pending, 0u);
}

// Runs every task to the end, one at a time, in the order the worker is sent them; the
// outputs of each task started, in that order.
std::vector<ObjectId> RunAll(Scheduler& scheduler, FakeStore& store, FakeLink& link) {
  std::vector<ObjectId> started;
  std::deque<Sent> pending;
  for (;;) {
    for (Sent& s : link.Take()) pending.push_back(std::move(s));
    if (pending.empty()) return started;
    Sent s = std::move(pending.front());
    pending.pop_front();
    started.push_back(s.outputs[0]);
    for (const ObjectId& o : s.outputs) store.Seal(o, kMiB);
    Completion c{.task = s.task};
    EXPECT_TRUE(scheduler.Complete(s.worker, std::span(&c, 1)).ok());
    store.Deliver(scheduler);
  }
}

TEST_F(SchedulerTest, HigherPriorityGoesFirst) {
  AddWorker(1, 1);
  // One running and two in the worker's window: the rest wait in the daemon's queue. The
  // task of higher priority takes the window's last place, and starts next.
  std::vector<ObjectId> first;
  for (int i = 0; i < 3; ++i) first.push_back(Submit(Task())[0]);
  TaskSpec high = Task();
  high.priority = 5;
  const ObjectId low_out = Submit(Task())[0];
  const ObjectId high_out = Submit(high)[0];
  auto order = RunAll(scheduler_, store_, link_);
  EXPECT_EQ(order, (std::vector{first[0], high_out, first[1], first[2], low_out}));
}

TEST_F(SchedulerTest, AmongReadyTasksOfEqualPriorityConsumersOfDataGoFirst) {
  AddWorker(1, 1);
  // A leaf, then more leaves, then a task reading the first leaf: once its input is made it
  // goes before the leaves, those waiting in the daemon and those queued on the worker.
  const ObjectId leaf0 = ObjectId::Random();
  TaskSpec l0 = Task();
  l0.outputs = {leaf0};
  std::vector<TaskSpec> batch{l0};
  for (int i = 0; i < 6; ++i) batch.push_back(Task());
  batch.push_back(Task({leaf0}));
  auto out = scheduler_.Submit(100, batch);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  auto order = RunAll(scheduler_, store_, link_);
  ASSERT_EQ(order.size(), batch.size());
  const auto join = std::find(order.begin(), order.end(), out.value()[7][0]);
  // Started: the first leaf, then the join.
  EXPECT_EQ(join - order.begin(), 1);
  EXPECT_EQ(scheduler_.counters().preemptions, 1u);
}

TEST_F(SchedulerTest, TheGraphHoldsAnInputUntilItsLastConsumerIsDone) {
  AddWorker(1, 3);
  const ObjectId shared = store_.Put(kMiB);
  Submit(Task({shared}));
  Submit(Task({shared, shared}));
  auto sent = link_.Take();
  ASSERT_EQ(sent.size(), 2u);
  EXPECT_EQ(store_.HoldsOn(shared), 1);
  Run(sent[0]);
  EXPECT_EQ(store_.HoldsOn(shared), 1);
  Run(sent[1]);
  EXPECT_EQ(store_.HoldsOn(shared), 0);
}

TEST_F(SchedulerTest, AFailedTaskSealsItsOutputsAsFailedAndItsConsumersFailWithIt) {
  AddWorker(1, 1);
  auto out = Submit(Task());
  auto downstream = Submit(Task({out[0]}));
  auto sent = link_.Take();
  ASSERT_EQ(sent.size(), 1u);
  Fail(sent[0], "division by zero");
  EXPECT_EQ(store_.objects.at(out[0]).state, StoreAccess::State::kFailed);
  EXPECT_EQ(store_.objects.at(out[0]).message, "division by zero");
  EXPECT_EQ(store_.objects.at(downstream[0]).state, StoreAccess::State::kFailed);
  EXPECT_NE(store_.objects.at(downstream[0]).message.find("failed: division by zero"),
            std::string::npos);
  EXPECT_TRUE(link_.Take().empty());
  EXPECT_EQ(scheduler_.counters().failed, 2u);
  EXPECT_EQ(scheduler_.counters().tasks_pending, 0u);
  EXPECT_EQ(scheduler_.Workers()[0].failed, 1u);

  // A task submitted on a failed object fails at once, with the reason.
  auto late = Submit(Task({out[0]}));
  EXPECT_EQ(store_.objects.at(late[0]).state, StoreAccess::State::kFailed);
}

TEST_F(SchedulerTest, AWorkerThatDiesHasItsTaskRetriedElsewhere) {
  AddWorker(1, 1);
  auto out = Submit(Task());
  auto sent = link_.Take();
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].worker, 1u);
  AddWorker(2, 1);
  scheduler_.RemoveSession(1);
  sent = link_.Take();
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].worker, 2u);
  EXPECT_EQ(sent[0].attempt, 2u);
  EXPECT_EQ(scheduler_.counters().retried, 1u);
  Run(sent[0]);
  EXPECT_EQ(store_.objects.at(out[0]).state, StoreAccess::State::kSealed);
}

// What a worker sealed before it died is kept: the retry is told, and the graph holds it
// until the retry is over, so that it is not evicted meanwhile (the retry will not make it).
TEST_F(SchedulerTest, OutputsAnEarlierAttemptSealedAreHeldUntilTheRetryIsOver) {
  AddWorker(1, 1);
  TaskSpec two = Task();
  two.num_outputs = 2;
  auto out = Submit(two);
  ASSERT_EQ(link_.Take().size(), 1u);
  store_.Seal(out[1], kMiB);
  store_.Deliver(scheduler_);
  AddWorker(2, 1);
  scheduler_.RemoveSession(1);
  auto sent = link_.Take();
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].attempt, 2u);
  EXPECT_EQ(sent[0].sealed, std::vector<uint32_t>{1});
  EXPECT_EQ(store_.HoldsOn(out[1]), 1);
  EXPECT_EQ(store_.HoldsOn(out[0]), 0);
  store_.Seal(out[0], kMiB);
  Completion c{.task = sent[0].task};
  ASSERT_TRUE(scheduler_.Complete(2, std::span(&c, 1)).ok());
  store_.Deliver(scheduler_);
  EXPECT_EQ(store_.TotalHolds(), 0) << "nothing reads the outputs: the graph lets go";
  EXPECT_EQ(scheduler_.counters().completed, 1u);
}

TEST_F(SchedulerTest, ATaskWhoseWorkersKeepDyingFailsWithTheReason) {
  AddWorker(1, 1);
  TaskSpec t = Task();
  t.retries = 1;
  auto out = Submit(t);
  ASSERT_EQ(link_.Take().size(), 1u);
  AddWorker(2, 1);
  scheduler_.RemoveSession(1);
  ASSERT_EQ(link_.Take().size(), 1u);
  scheduler_.RemoveSession(2);
  const auto& failed = store_.objects.at(out[0]);
  EXPECT_EQ(failed.state, StoreAccess::State::kFailed);
  EXPECT_NE(failed.message.find("ended while running it, 2 times"), std::string::npos)
      << failed.message;
}

TEST_F(SchedulerTest, ATaskThatNoWorkerLeftCanRunWaitsAndSaysWhy) {
  AddWorker(1, 1);
  Submit(Task());
  Submit(Task());
  ASSERT_EQ(link_.Take().size(), 1u);
  ASSERT_TRUE(scheduler_.DrainWorker(1).ok());
  auto tasks = scheduler_.Tasks();
  ASSERT_EQ(tasks.size(), 2u);
  EXPECT_EQ(tasks[1].state, TaskState::kReady);
  EXPECT_NE(tasks[1].reason.find("no worker attached can run 'f'"), std::string::npos);
  AddWorker(2, 1);
  auto sent = link_.Take();
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].worker, 2u);
}

TEST_F(SchedulerTest, ADrainingWorkerFinishesWhatItRunsThenLeaves) {
  AddWorker(1, 1);
  Submit(Task());
  auto sent = link_.Take();
  ASSERT_TRUE(scheduler_.DrainWorker(1).ok());
  EXPECT_EQ(scheduler_.Workers().size(), 1u);
  EXPECT_TRUE(link_.drained.empty());
  Run(sent[0]);
  EXPECT_TRUE(scheduler_.Workers().empty());
  EXPECT_EQ(link_.drained, std::vector<SessionId>{1});
  EXPECT_EQ(scheduler_.counters().completed, 1u);
}

TEST_F(SchedulerTest, ASubmitterThatLeavesCancelsWhatNobodyElseReads) {
  AddWorker(1, 1);
  auto running = Submit(Task(), 100);
  auto mine = Submit(Task(), 100);
  auto read_by_other = Submit(Task(), 100);
  auto other = Submit(Task({read_by_other[0]}), 200);
  ASSERT_EQ(link_.Take().size(), 1u);
  scheduler_.RemoveSession(100);
  store_.Deliver(scheduler_);
  EXPECT_EQ(store_.objects.at(mine[0]).state, StoreAccess::State::kFailed);
  EXPECT_NE(store_.objects.at(mine[0]).message.find("submitter"), std::string::npos);
  EXPECT_FALSE(store_.objects.contains(read_by_other[0]));  // still to run, for session 200
  EXPECT_FALSE(store_.objects.contains(running[0]));        // running: it finishes
  EXPECT_EQ(scheduler_.counters().cancelled, 1u);
  EXPECT_EQ(scheduler_.counters().tasks_pending, 3u);
  (void)other;
}

TEST_F(SchedulerTest, ADetachedTaskOutlivesItsSubmitter) {
  AddWorker(1, 1);
  Submit(Task(), 100);  // runs
  TaskSpec detached = Task();
  detached.detach = true;
  auto out = Submit(detached, 100);
  scheduler_.RemoveSession(100);
  EXPECT_EQ(scheduler_.counters().cancelled, 0u);
  auto sent = link_.Take();
  ASSERT_EQ(sent.size(), 1u);
  Run(sent[0]);
  sent = link_.Take();
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].outputs, out);
}

TEST_F(SchedulerTest, CancelByOutputId) {
  AddWorker(1, 1);
  auto running = Submit(Task());
  auto waiting = Submit(Task());
  auto sent = link_.Take();
  std::vector<ObjectId> ids{running[0], waiting[0], ObjectId::Random()};
  auto outcomes = scheduler_.Cancel(ids);
  EXPECT_EQ(outcomes,
            (std::vector{Scheduler::CancelOutcome::kRunning, Scheduler::CancelOutcome::kCancelled,
                         Scheduler::CancelOutcome::kUnknown}));
  EXPECT_EQ(store_.objects.at(waiting[0]).message, "cancelled");
  Run(sent[0]);
  EXPECT_EQ(scheduler_.Cancel(std::span(running)),
            std::vector{Scheduler::CancelOutcome::kFinished});
}

TEST_F(SchedulerTest, CompletionsOfTasksNotRunningOnTheWorkerAreRefused) {
  AddWorker(1, 1);
  AddWorker(2, 1);
  Submit(Task());
  auto sent = link_.Take();
  ASSERT_EQ(sent.size(), 1u);
  const SessionId other = sent[0].worker == 1 ? 2 : 1;
  Completion c{.task = sent[0].task};
  EXPECT_EQ(scheduler_.Complete(other, std::span(&c, 1)).code(), StatusCode::kInvalidArgument);
  Completion bogus{.task = 12345};
  EXPECT_EQ(scheduler_.Complete(sent[0].worker, std::span(&bogus, 1)).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(scheduler_.Complete(999, std::span(&c, 1)).code(), StatusCode::kInvalidArgument);
  // Success without sealing the outputs fails the task instead.
  EXPECT_TRUE(scheduler_.Complete(sent[0].worker, std::span(&c, 1)).ok());
  EXPECT_EQ(scheduler_.counters().failed, 1u);
}

TEST_F(SchedulerTest, AQueuedTaskHasItsInputsPrefetchedToItsDevice) {
  AddWorker(1, 0, {0});
  const ObjectId host_input = store_.Put(8 * kMiB);
  Submit(Task({}, kGpuOnly));  // busy
  ASSERT_EQ(link_.Take().size(), 1u);
  Submit(Task({host_input}, kGpuOnly));
  EXPECT_TRUE(link_.Take().empty());
  ASSERT_EQ(store_.prefetched.size(), 1u);
  EXPECT_EQ(store_.prefetched[0], std::make_pair(host_input, 0));
}

TEST_F(SchedulerTest, AGpuTaskStartsOnlyWhereItsOutputsFit) {
  AddWorker(1, 0, {0, 1});
  store_.room[0] = 10 * kMiB;
  store_.room[1] = 100 * kMiB;
  const ObjectId on0 = store_.Put(kMiB, 0);
  TaskSpec t = Task({on0}, kGpuOnly);
  t.output_bytes = 50 * kMiB;
  Submit(t);
  auto sent = link_.Take();
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].device, 1);
}

// A graph's memory bound on a shared daemon: its tasks start only while the bound holds the
// outputs of its tasks still stored, those its placed tasks declared and their own.
TEST_F(SchedulerTest, ATasksBoundHoldsWhatItsGraphStoredAndDeclared) {
  AddWorker(1, 4);
  store_.room[kHostMemory] = 1000 * kMiB;  // the store itself has room for everything
  auto bounded = [](uint64_t bytes) { return Bounded(7, 10 * kMiB, bytes); };
  const ObjectId a = Submit(bounded(4 * kMiB))[0];
  const ObjectId b = Submit(bounded(4 * kMiB))[0];
  Submit(bounded(4 * kMiB));
  auto sent = link_.Take();
  ASSERT_EQ(sent.size(), 2u) << "4 + 4 MiB fit 10 MiB; a third does not, though CPU is free";
  // Another client's bound of the same id is its own, and its task of the same shape as the
  // one held back is not passed over for it.
  Submit(bounded(4 * kMiB), /*submitter=*/200);
  ASSERT_EQ(link_.Take().size(), 1u);

  // Done, an output counts as stored until freed: still no room for the third.
  Run(sent[0], 4 * kMiB);
  EXPECT_TRUE(link_.Take().empty());
  store_.Free(a);
  store_.Deliver(scheduler_);
  auto third = link_.Take();
  ASSERT_EQ(third.size(), 1u) << "freed: room for it";
  Run(sent[1], 4 * kMiB);
  Run(third[0], 4 * kMiB);
  store_.Free(b);
  store_.Deliver(scheduler_);

  // A task declaring nothing is not held back.
  Submit(bounded(0));
  EXPECT_EQ(link_.Take().size(), 1u);
}

// When nothing of a graph runs and none of its ready tasks fits its bound, nothing of it will
// free any: those tasks fail, naming themselves, their size and the bound.
TEST_F(SchedulerTest, ATaskItsIdleBoundCannotHoldFailsSayingWhy) {
  AddWorker(1, 4);
  store_.room[kHostMemory] = 1000 * kMiB;
  TaskSpec big = Bounded(3, 10 * kMiB, 12 * kMiB);
  big.label = "('big', 0)";
  const ObjectId out = Submit(big)[0];
  big.label = "('big', 2)";
  const ObjectId second = Submit(big)[0];  // held back too (passed over in a round: as large)
  EXPECT_TRUE(link_.Take().empty());
  // The daemon looks again a grace period later (a task's inputs are freed a moment after
  // it ends), and fails what still cannot fit once it has been so for the whole period.
  EXPECT_GE(bounds_stuck_, 1);
  StoreAccess::Object found;
  now_ = 0.4;
  scheduler_.FailStuckBounds(0.5);
  store_.Locate(std::span(&out, 1), std::span(&found, 1));
  EXPECT_EQ(found.state, StoreAccess::State::kMissing) << "held back for 0.4 s only";
  now_ = 0.6;
  scheduler_.FailStuckBounds(0.5);
  store_.Locate(std::span(&out, 1), std::span(&found, 1));
  ASSERT_EQ(found.state, StoreAccess::State::kFailed);
  const std::string why = store_.objects[out].message;
  for (const char* part : {"task 1 (('big', 0)): its declared output of 12.0 MiB",
                           "memory bound of 10.0 MiB", "no task of the graph runs"}) {
    EXPECT_NE(why.find(part), std::string::npos) << why;
  }
  EXPECT_NE(store_.objects[second].message.find("task 2 (('big', 2)): its declared output of "
                                                "12.0 MiB"),
            std::string::npos)
      << store_.objects[second].message;
  // A task of the bound that runs keeps the others waiting, not failing: it may free room.
  TaskSpec fits = big;
  fits.output_bytes = 2 * kMiB;
  fits.label = "fits";
  Submit(fits);
  EXPECT_EQ(link_.Take().size(), 1u);
  big.label = "('big', 1)";
  const ObjectId waits = Submit(big)[0];
  now_ = 10;
  scheduler_.FailStuckBounds(0.5);
  store_.Locate(std::span(&waits, 1), std::span(&found, 1));
  EXPECT_EQ(found.state, StoreAccess::State::kMissing) << "it waits";
}

// With a disk tier, a bound that holds back a task while nothing of its graph runs moves its
// oldest outputs in memory to disk (not the task's own inputs) until the task fits; an output
// on disk counts against the bound again for the task that reads it (its read brings it
// back), and what comes back into memory counts as stored again.
TEST_F(SchedulerTest, AnIdleBoundMovesItsOldestOutputsToDiskUntilItsHeldTaskFits) {
  OneWorkerOnADiskTier();
  const ObjectId a = Submit(Bounded(7, 10 * kMiB, 4 * kMiB))[0];
  const ObjectId b = Submit(Bounded(7, 10 * kMiB, 4 * kMiB))[0];
  auto sent = link_.Take();
  ASSERT_EQ(sent.size(), 2u);
  Run(sent[0], 4 * kMiB);
  Run(sent[1], 4 * kMiB);
  // 8 MiB stored: a third output of 4 MiB needs 2 MiB to leave; the oldest output goes.
  const ObjectId c = Submit(Bounded(7, 10 * kMiB, 4 * kMiB))[0];
  EXPECT_TRUE(link_.Take().empty());
  EXPECT_EQ(store_.spilled, std::vector<ObjectId>{a});
  now_ = 10;
  scheduler_.FailStuckBounds(0.5);
  StoreAccess::Object found;
  store_.Locate(std::span(&c, 1), std::span(&found, 1));
  EXPECT_EQ(found.state, StoreAccess::State::kMissing) << "not stuck while its output leaves";
  store_.Moved(a, /*in_memory=*/false);
  store_.Deliver(scheduler_);
  auto third = link_.Take();
  ASSERT_EQ(third.size(), 1u) << "a on disk: room for c";

  // A reader of a (on disk) counts a as well as its own output: 4 + 4 beside b and c's 8.
  TaskSpec reader = Bounded(7, 10 * kMiB, 4 * kMiB);
  reader.inputs = {a, a};  // read twice, brought back once
  Submit(reader);
  EXPECT_TRUE(link_.Take().empty()) << "c runs: it may free room, nothing moves yet";
  store_.spilled.clear();
  Run(third[0], 4 * kMiB);
  EXPECT_EQ(store_.spilled, (std::vector<ObjectId>{b, c})) << "6 MiB must leave, oldest first";
  EXPECT_TRUE(link_.Take().empty());
  store_.Moved(b, false);
  store_.Moved(c, false);
  store_.Deliver(scheduler_);
  auto reads = link_.Take();
  ASSERT_EQ(reads.size(), 1u);
  // Its read brings a back into memory: stored again, beside the reservation of the reader.
  store_.Moved(a, true);
  store_.Deliver(scheduler_);
  Submit(Bounded(7, 10 * kMiB, 4 * kMiB));
  EXPECT_TRUE(link_.Take().empty()) << "4 + 8 reserved + 4 > 10";
  store_.spilled.clear();
  Run(reads[0], 4 * kMiB);  // idle again: a (in memory, the oldest) leaves for disk
  EXPECT_EQ(store_.spilled, std::vector<ObjectId>{a});
}

// An output that cannot leave memory (a client holds it) makes no room: the task held back
// fails once nothing of the graph has moved for the grace period, saying so.
TEST_F(SchedulerTest, ABoundWhoseOutputsCannotLeaveMemoryFailsItsHeldTaskSayingWhy) {
  OneWorkerOnADiskTier();
  const ObjectId held = Submit(Bounded(5, 6 * kMiB, 4 * kMiB))[0];
  store_.kept.insert(held);
  Run(link_.Take().at(0), 4 * kMiB);
  const ObjectId waits = Submit(Bounded(5, 6 * kMiB, 4 * kMiB))[0];
  EXPECT_TRUE(link_.Take().empty());
  EXPECT_TRUE(store_.spilled.empty());
  now_ = 1;
  scheduler_.FailStuckBounds(0.5);
  StoreAccess::Object found;
  store_.Locate(std::span(&waits, 1), std::span(&found, 1));
  ASSERT_EQ(found.state, StoreAccess::State::kFailed);
  const std::string why = store_.objects[waits].message;
  EXPECT_NE(why.find("beside the 4.00 MiB of the graph's results still stored in memory, no "
                     "task of the graph runs that could free any, and none of those in memory "
                     "could move to disk"),
            std::string::npos)
      << why;
}

// Spills that stop leaving (the disk failed, or a client took a reference to the copy in
// memory) leave the bound stuck, as before: its held task fails once nothing of it has moved
// for the grace period, rather than waiting for ever on spills that will not come.
TEST_F(SchedulerTest, ABoundWhoseSpillsStopLeavingFailsItsHeldTaskAfterAll) {
  OneWorkerOnADiskTier();
  const ObjectId a = Submit(Bounded(8, 6 * kMiB, 4 * kMiB))[0];
  Run(link_.Take().at(0), 4 * kMiB);
  const ObjectId waits = Submit(Bounded(8, 6 * kMiB, 4 * kMiB))[0];
  EXPECT_EQ(store_.spilled, std::vector<ObjectId>{a});
  now_ = 10;
  scheduler_.FailStuckBounds(0.5);
  StoreAccess::Object found;
  store_.Locate(std::span(&waits, 1), std::span(&found, 1));
  EXPECT_EQ(found.state, StoreAccess::State::kMissing) << "a is leaving";
  store_.kept.insert(a);  // its spill failed: it stays, and cannot leave now
  now_ = 20;
  scheduler_.FailStuckBounds(0.5);
  store_.Locate(std::span(&waits, 1), std::span(&found, 1));
  EXPECT_EQ(found.state, StoreAccess::State::kFailed);
}

// A task its bound holds back because its inputs on disk would come back beside its output
// does not hold back the bound's other tasks as large: they may read nothing from disk.
TEST_F(SchedulerTest, ATaskHeldBackForItsInputsOnDiskHoldsBackNoOtherAsLarge) {
  OneWorkerOnADiskTier();
  const ObjectId a = Submit(Bounded(6, 10 * kMiB, 4 * kMiB))[0];
  Run(link_.Take().at(0), 4 * kMiB);
  store_.Moved(a, /*in_memory=*/false);  // spilled under the store's own pressure
  store_.Deliver(scheduler_);
  Submit(Bounded(6, 10 * kMiB, 4 * kMiB));
  Run(link_.Take().at(0), 4 * kMiB);  // 4 MiB in memory, 4 on disk
  // In one batch, the reader of a first: it needs 4 + 4 beside the 4 in memory, and waits;
  // the other needs 4, and starts.
  TaskSpec reader = Bounded(6, 10 * kMiB, 4 * kMiB);
  reader.inputs = {a};
  const std::vector<TaskSpec> batch = {reader, Bounded(6, 10 * kMiB, 4 * kMiB)};
  auto submitted = scheduler_.Submit(100, batch);
  ASSERT_TRUE(submitted.ok()) << submitted.status().ToString();
  auto sent = link_.Take();
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].outputs, submitted.value()[1]) << "the one that reads nothing from disk";
  EXPECT_TRUE(store_.spilled.empty()) << "a task of the bound runs: nothing needs to leave";
}

// A client that holds thousands of a graph's outputs (they cannot leave memory) costs each
// dispatch round a bounded look at them (Bounds::kSpillLooks, over all bounds), and the task
// held back fails as stuck.
TEST_F(SchedulerTest, ABoundsSpillsAskAboutABoundedNumberOfOutputsARound) {
  OneWorkerOnADiskTier();
  constexpr size_t kOutputs = Bounds::kSpillLooks + 500;
  constexpr uint64_t kBound = kOutputs * 1024 + 1024;
  std::vector<ObjectId> outputs;
  for (size_t i = 0; i < kOutputs; ++i) {
    outputs.push_back(Submit(Bounded(3, kBound, 1024))[0]);
    store_.kept.insert(outputs.back());
    for (const Sent& s : link_.Take()) Run(s, 1024);
  }
  ASSERT_EQ(scheduler_.counters().tasks_pending, 0u);
  const ObjectId held = Submit(Bounded(3, kBound, 4096))[0];
  EXPECT_TRUE(link_.Take().empty());
  EXPECT_LE(store_.spill_asks, Bounds::kSpillLooks) << "one round's looks";
  EXPECT_GT(store_.spill_asks, 0u);
  EXPECT_TRUE(store_.spilled.empty());
  now_ = 10;
  scheduler_.FailStuckBounds(0.5);
  StoreAccess::Object found;
  store_.Locate(std::span(&held, 1), std::span(&found, 1));
  EXPECT_EQ(found.state, StoreAccess::State::kFailed);
}

// An output spilled before its task's completion came counts as on disk from the start. An
// output on disk counts for its reader's room only where it could ever fit: a reader whose
// inputs on disk and output are more than the whole bound runs as it did before they went
// to disk.
TEST_F(SchedulerTest, InputsOnDiskCountForTheirReaderOnlyWhereTheyCouldFit) {
  OneWorkerOnADiskTier();
  const ObjectId a = Submit(Bounded(9, 8 * kMiB, 6 * kMiB))[0];
  const ObjectId b = Submit(Bounded(9, 8 * kMiB, 2 * kMiB))[0];
  auto sent = link_.Take();
  ASSERT_EQ(sent.size(), 2u);
  Run(sent[0], 6 * kMiB);
  for (const ObjectId& o : sent[1].outputs) store_.Seal(o, 2 * kMiB);
  store_.objects[b].tiers = 0;  // spilled for room before its completion came
  Completion done{.task = sent[1].task};
  ASSERT_TRUE(scheduler_.Complete(sent[1].worker, std::span(&done, 1)).ok());
  store_.Deliver(scheduler_);
  const ObjectId c = Submit(Bounded(9, 8 * kMiB, 2 * kMiB))[0];
  auto third = link_.Take();
  ASSERT_EQ(third.size(), 1u) << "6 MiB in memory and b's 2 on disk: room for 2 more";
  Run(third[0], 2 * kMiB);
  store_.Moved(a, false);  // 2 MiB in memory (c), 8 on disk (a, b)
  store_.Deliver(scheduler_);

  TaskSpec reads_all = Bounded(9, 8 * kMiB, kMiB);
  reads_all.inputs = {a, b};  // 8 on disk and its own 1 MiB: more than the bound
  Submit(reads_all);
  auto all = link_.Take();
  ASSERT_EQ(all.size(), 1u) << "it could never fit: its 1 MiB beside c's 2 is what counts";
  store_.spilled.clear();
  TaskSpec reads_disk = Bounded(9, 8 * kMiB, 0);
  reads_disk.inputs = {a, b};  // 8 on disk: the whole bound, once c leaves
  Submit(reads_disk);
  EXPECT_TRUE(link_.Take().empty());
  Run(all[0], 0);  // its output is left out of the bound's count: 0 bytes
  EXPECT_EQ(store_.spilled, std::vector<ObjectId>{c}) << "idle: c leaves for its room";
  store_.Moved(c, false);
  store_.Deliver(scheduler_);
  EXPECT_EQ(link_.Take().size(), 1u);
}

// A group whose caller frees results as it goes (Client.map(memory=)): a task held back by
// its bound waits for those frees however long nothing of the group moves; only one whose
// output alone is larger than the bound fails.
TEST_F(SchedulerTest, ATaskWaitingForItsSubmittersFreesIsNotFailedWhileItCouldFit) {
  AddWorker(1, 4);
  store_.room[kHostMemory] = 1000 * kMiB;
  TaskSpec t = Bounded(5, 10 * kMiB, 6 * kMiB);
  t.bound_waits = true;
  const ObjectId first = Submit(t)[0];
  const ObjectId waits = Submit(t)[0];
  TaskSpec huge = t;
  huge.output_bytes = 11 * kMiB;
  huge.label = "huge";
  const ObjectId too_large = Submit(huge)[0];
  auto sent = link_.Take();
  ASSERT_EQ(sent.size(), 1u);
  Run(sent[0], 6 * kMiB);  // its result, held by the caller: the group is idle
  EXPECT_TRUE(link_.Take().empty());
  now_ = 100;
  scheduler_.FailStuckBounds(0.5);
  StoreAccess::Object found;
  store_.Locate(std::span(&waits, 1), std::span(&found, 1));
  EXPECT_EQ(found.state, StoreAccess::State::kMissing) << "it waits for the caller's free";
  store_.Locate(std::span(&too_large, 1), std::span(&found, 1));
  ASSERT_EQ(found.state, StoreAccess::State::kFailed);
  const std::string why = store_.objects[too_large].message;
  EXPECT_NE(why.find("task 3 (huge): its declared output of 11.0 MiB is larger than its "
                     "group's memory bound of 10.0 MiB"),
            std::string::npos)
      << why;
  // The caller frees the first result: the waiting task starts.
  store_.Free(first);
  store_.Deliver(scheduler_);
  EXPECT_EQ(link_.Take().size(), 1u);
}

// A task that declares no output size is expected to make as much as the most its kind
// made: placed and reserved as if it had declared that.
TEST_F(SchedulerTest, ATaskOfAKindIsReservedWhatItsKindMade) {
  AddWorker(1, 4);
  store_.room[kHostMemory] = 10 * kMiB;
  TaskSpec t = Task();
  t.kind = "chunk";
  Submit(t);
  auto sent = link_.Take();
  ASSERT_EQ(sent.size(), 1u) << "nothing known of its kind yet";
  Run(sent[0], 4 * kMiB);
  for (int i = 0; i < 3; ++i) Submit(t);
  EXPECT_EQ(link_.Take().size(), 2u) << "4 + 4 MiB fit 10 MiB, a third does not";
  // Another kind, or another submitter's task of this kind, is expected to make nothing.
  TaskSpec other = t;
  other.kind = "other";
  Submit(other);
  Submit(t, /*submitter=*/200);
  EXPECT_EQ(link_.Take().size(), 2u);
}

TEST(OutputSizesTest, ASubmittersKindsAreBoundedAndTheLeastRecentlyLearnedGoFirst) {
  OutputSizes sizes;
  TaskSpec spec;
  spec.kind = "k0";
  sizes.Record(1, "k0", 100);
  sizes.Record(1, "k0", 50);
  EXPECT_EQ(sizes.Expected(1, spec), 100u) << "the most its kind made";
  spec.output_bytes = 7;
  EXPECT_EQ(sizes.Expected(1, spec), 7u) << "what it declared comes first";
  spec.output_bytes = 0;
  for (size_t i = 1; i < OutputSizes::kMaxKinds; ++i) sizes.Record(1, "k" + std::to_string(i), i);
  sizes.Record(1, "k0", 10);  // learned again: the most recent now
  sizes.Record(1, "new", 1);  // one past the bound: k1 goes
  EXPECT_EQ(sizes.kinds(1), OutputSizes::kMaxKinds);
  EXPECT_EQ(sizes.Expected(1, spec), 100u);
  spec.kind = "k1";
  EXPECT_EQ(sizes.Expected(1, spec), 0u);
  sizes.Forget(1);
  EXPECT_EQ(sizes.kinds(1), 0u);
}

// Tasks held back by their bound are no misses of a round: many of them ahead in ready order
// (a higher priority, each of its own size) do not keep another client's task from a place.
TEST_F(SchedulerTest, TasksHeldBackByTheirBoundKeepNoOtherTaskFromAPlace) {
  AddWorker(1, 4);
  store_.room[kHostMemory] = 1000 * kMiB;
  TaskSpec full = Bounded(1, 10 * kMiB, 10 * kMiB);
  full.priority = 5;
  Submit(full);
  ASSERT_EQ(link_.Take().size(), 1u);
  std::vector<TaskSpec> held(200, full);
  for (size_t i = 0; i < held.size(); ++i) held[i].output_bytes = kMiB + i;
  ASSERT_TRUE(SubmitStatus(held).ok());
  EXPECT_TRUE(link_.Take().empty());
  Submit(Task(), /*submitter=*/200);
  EXPECT_EQ(link_.Take().size(), 1u);
  // Held back, they wait aside: later rounds do not look at them again while their bound
  // stays as it is (a client's thousands of waiting tasks cost other clients' events
  // nothing), and they are tried again once it changes.
  const uint64_t tries = scheduler_.counters().placement_tries;
  for (int i = 0; i < 2; ++i) Submit(Task(), /*submitter=*/200);
  EXPECT_EQ(link_.Take().size(), 2u);
  EXPECT_EQ(scheduler_.counters().placement_tries, tries + 2);
  EXPECT_EQ(scheduler_.counters().tasks_pending, 204u);
}

// Those of a bound that changes are tried again: the output that filled it is freed.
TEST_F(SchedulerTest, TasksHeldBackByTheirBoundAreTriedAgainWhenItChanges) {
  AddWorker(1, 4);
  store_.room[kHostMemory] = 1000 * kMiB;
  const TaskSpec full = Bounded(1, 10 * kMiB, 10 * kMiB);
  Submit(full);
  auto sent = link_.Take();
  ASSERT_EQ(sent.size(), 1u);
  Submit(Bounded(1, 10 * kMiB, 4 * kMiB));
  EXPECT_TRUE(link_.Take().empty());
  const uint64_t tries = scheduler_.counters().placement_tries;
  Submit(Task(), /*submitter=*/200);  // another client's event: the held task is not tried
  EXPECT_EQ(link_.Take().size(), 1u);
  EXPECT_EQ(scheduler_.counters().placement_tries, tries + 1);
  // Done, its output still fills the bound: tried once more, and held back again.
  Run(sent[0], 10 * kMiB);
  EXPECT_TRUE(link_.Take().empty());
  store_.Free(sent[0].outputs[0]);
  store_.Deliver(scheduler_);
  EXPECT_EQ(link_.Take().size(), 1u) << "freed: room for it";
}

TEST_F(SchedulerTest, BoundsAreCheckedAtSubmission) {
  AddWorker(1, 1);
  TaskSpec half = Task();
  half.bound_id = 1;
  EXPECT_EQ(SubmitStatus({half}).code(), StatusCode::kInvalidArgument);
  TaskSpec a = Task(), b = Task();
  a.bound_id = b.bound_id = 5;
  a.bound_bytes = kMiB;
  b.bound_bytes = 2 * kMiB;
  const Status mixed = SubmitStatus({a, b});
  EXPECT_EQ(mixed.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(mixed.message().find("task 1: memory bound 5 is 1048576 bytes"), std::string::npos)
      << mixed.ToString();
  EXPECT_TRUE(SubmitStatus({a}).ok());
  EXPECT_EQ(SubmitStatus({b}).code(), StatusCode::kInvalidArgument) << "against a pending one";
  // A client's bounds at once are bounded.
  std::vector<TaskSpec> many(Bounds::kMaxPerSubmitter);
  for (size_t i = 0; i < many.size(); ++i) many[i] = Bounded(100 + i, kMiB, 0);
  EXPECT_EQ(SubmitStatus(many).code(), StatusCode::kInvalidArgument);
}

void SchedulerTest::RandomLoad() {
  std::mt19937 rng(12345);
  AddWorker(1, 2, {0, 1}, {"f"}, {{"ssd", 1}});
  AddWorker(2, 1, {2}, {"f"});
  AddWorker(3, 3, {}, {"f"});
  const std::map<SessionId, Capacity> capacity{
      {1, {.cpu = 2, .gpus = {0, 1}, .custom = {{"ssd", 1}}}},
      {2, {.cpu = 1, .gpus = {2}}},
      {3, {.cpu = 3}}};
  std::vector<ResourceRequest> shapes{{.cpu = 1},           {.cpu = 0, .gpu = 0.25},
                                      {.cpu = 0, .gpu = 1}, {.cpu = 1, .gpu = 0.5},
                                      {.cpu = 0.5},         {.cpu = 1, .custom = {{"ssd", 1}}}};
  std::vector<Sent> running;
  std::map<TaskId, Sent> parked;  // sent ahead, by the task each follows
  // What a worker does with what it is sent.
  auto receive = [&](std::vector<Sent> sent) {
    for (Sent& s : sent) {
      const bool before_runs =
          s.after != 0 && (std::any_of(running.begin(), running.end(),
                                       [&](const Sent& r) { return r.task == s.after; }) ||
                           std::any_of(parked.begin(), parked.end(),
                                       [&](const auto& p) { return p.second.task == s.after; }));
      if (before_runs) {
        parked.emplace(s.after, std::move(s));
      } else {
        running.push_back(std::move(s));
      }
    }
  };
  auto finish = [&](const Sent& s) {
    Run(s);
    if (auto next = parked.find(s.task); next != parked.end()) {
      running.push_back(std::move(next->second));
      parked.erase(next);
    }
    receive(link_.Take());
  };
  auto check = [&] {
    std::map<SessionId, double> cpu;
    std::map<std::pair<SessionId, int32_t>, double> share;
    std::map<SessionId, double> ssd;
    for (const Sent& s : running) {
      cpu[s.worker] += s.resources.cpu;
      if (s.resources.gpu > 0) share[{s.worker, s.device}] += s.resources.gpu;
      if (s.resources.custom.contains("ssd")) ssd[s.worker] += s.resources.custom.at("ssd");
    }
    for (const auto& [w, used] : cpu) ASSERT_LE(used, capacity.at(w).cpu + kResourceEpsilon);
    for (const auto& [key, used] : share) {
      const auto& gpus = capacity.at(key.first).gpus;
      ASSERT_NE(std::find(gpus.begin(), gpus.end(), key.second), gpus.end());
      ASSERT_LE(used, 1 + kResourceEpsilon);
    }
    for (const auto& [w, used] : ssd) ASSERT_LE(used, 1 + kResourceEpsilon);
  };
  uint64_t submitted = 0;
  for (int step = 0; step < 5000; ++step) {
    if (rng() % 2 == 0) {
      Submit(Task({}, shapes[rng() % shapes.size()]));
      ++submitted;
    } else if (!running.empty()) {
      const size_t k = rng() % running.size();
      Sent s = running[k];
      running.erase(running.begin() + static_cast<std::ptrdiff_t>(k));
      finish(s);
    }
    receive(link_.Take());
    check();
  }
  while (!running.empty()) {
    Sent s = running.back();
    running.pop_back();
    finish(s);
    check();
  }
  EXPECT_TRUE(parked.empty());
  EXPECT_EQ(scheduler_.counters().completed, submitted);
  for (const WorkerInfo& w : scheduler_.Workers()) {
    EXPECT_EQ(w.free_cpu, capacity.at(w.id).cpu);
    for (const auto& [device, share] : w.free_gpu_share) EXPECT_DOUBLE_EQ(share, 1.0);
  }
}

TEST_F(SchedulerTest, ResourcesAreNeverOversubscribedUnderARandomLoad) { RandomLoad(); }

// Functions with two variants (WorkerSpec::gpu_functions): the scheduler picks per task.
class VariantTest : public SchedulerTest {
 protected:
  // A worker with a CPU slot and GPU 0, running "f" both ways.
  void AddBothWays(SessionId id) {
    WorkerSpec spec{.name = "both",
                    .capacity = {.cpu = 1, .gpus = {0}},
                    .functions = {"f"},
                    .gpu_functions = {"f"}};
    ASSERT_TRUE(scheduler_.AddWorker(id, std::move(spec)).ok());
  }
  // Runs one task of `variant` on `input`, taking `seconds`: where it ran.
  int32_t RunTimed(const ObjectId& input, Variant variant, double seconds) {
    TaskSpec t = Task({input});
    t.variant = variant;
    Submit(t);
    auto sent = link_.Take();
    EXPECT_EQ(sent.size(), 1u);
    if (sent.size() != 1) return kHostMemory - 1;
    now_ += seconds;
    Run(sent[0]);
    return sent[0].device;
  }
  // The task finished last.
  TaskInfo Last() { return scheduler_.Tasks().back(); }
  TaskInfo Of(TaskId id) {
    for (const TaskInfo& t : scheduler_.Tasks()) {
      if (t.id == id) return t;
    }
    ADD_FAILURE() << "no task " << id;
    return {};
  }
};

TEST_F(VariantTest, PinnedVariantsRunWhereTheySay) {
  AddBothWays(1);
  const ObjectId input = store_.Put(kMiB);
  EXPECT_EQ(RunTimed(input, Variant::kCpu, 0.001), kHostMemory);
  EXPECT_EQ(Last().variant, "");  // not chosen: pinned
  EXPECT_EQ(RunTimed(input, Variant::kGpu, 0.001), 0);
}

TEST_F(VariantTest, EachVariantRunsWhereItFinishesFirstCountingTheCopiesOfItsInputs) {
  AddBothWays(1);
  // 256 MiB on the GPU; both variants measured at 10 ms on it. The CPU variant would first
  // copy it all to host memory: the GPU variant wins.
  const ObjectId on_gpu = store_.Put(256 * kMiB, 0);
  RunTimed(on_gpu, Variant::kCpu, 0.010);
  RunTimed(on_gpu, Variant::kGpu, 0.010);
  EXPECT_EQ(RunTimed(on_gpu, Variant::kAuto, 0.010), 0);
  TaskInfo info = Last();
  EXPECT_EQ(info.variant, "gpu");
  EXPECT_NE(info.variant_reason.find("expected to finish first: gpu"), std::string::npos)
      << info.variant_reason;
  EXPECT_EQ(info.moved_bytes, 0u);

  // 1 KiB on host: the GPU variant costs a launch (2 ms), the CPU variant 0.1 ms.
  const ObjectId small = store_.Put(1024);
  RunTimed(small, Variant::kCpu, 0.0001);
  RunTimed(small, Variant::kGpu, 0.002);
  EXPECT_EQ(RunTimed(small, Variant::kAuto, 0.0001), kHostMemory);
  info = Last();
  EXPECT_EQ(info.variant, "cpu");
  EXPECT_NE(info.variant_reason.find("against gpu"), std::string::npos) << info.variant_reason;

  // The same small input on the GPU: no copy either way, and the CPU variant is still faster
  // by more than the copy back costs.
  const ObjectId small_on_gpu = store_.Put(1024, 0);
  EXPECT_EQ(RunTimed(small_on_gpu, Variant::kAuto, 0.0001), kHostMemory);
}

TEST_F(VariantTest, AVariantIsTriedUntilMeasuredAndThenNowAndThen) {
  AddBothWays(1);
  const ObjectId input = store_.Put(kMiB);
  // Neither measured: the first takes the best guess (the CPU, which copies nothing), the
  // next explores the GPU.
  EXPECT_EQ(RunTimed(input, Variant::kAuto, 0.001), kHostMemory);
  EXPECT_EQ(RunTimed(input, Variant::kAuto, 0.005), 0);
  EXPECT_NE(Last().variant_reason.find("exploring: gpu not measured"), std::string::npos)
      << Last().variant_reason;
  // Both measured: the CPU variant, until the GPU's has been passed over 32 times.
  for (int i = 0; i < 32; ++i) {
    ASSERT_EQ(RunTimed(input, Variant::kAuto, 0.001), kHostMemory) << i;
    EXPECT_EQ(Last().variant, "cpu");
  }
  EXPECT_EQ(RunTimed(input, Variant::kAuto, 0.005), 0);
  EXPECT_NE(Last().variant_reason.find("exploring: gpu not run for the last 32"), std::string::npos)
      << Last().variant_reason;
  EXPECT_EQ(RunTimed(input, Variant::kAuto, 0.001), kHostMemory);
}

TEST_F(VariantTest, OnlyWorkersWithAVariantRunIt) {
  // Worker 1 runs "f" on host only; worker 2 has only a GPU variant of it.
  AddWorker(1, 1, {}, {"f"});
  WorkerSpec gpu_only{.name = "gpu", .capacity = {.cpu = 1, .gpus = {0}}, .gpu_functions = {"f"}};
  ASSERT_TRUE(scheduler_.AddWorker(2, std::move(gpu_only)).ok());
  const ObjectId input = store_.Put(kMiB);
  for (int i = 0; i < 4; ++i) {
    TaskSpec t = Task({input});
    Submit(t);
    auto sent = link_.Take();
    ASSERT_EQ(sent.size(), 1u);
    // Never the CPU variant on worker 2, nor a GPU on worker 1.
    EXPECT_EQ(sent[0].worker == 2, sent[0].device == 0) << i;
    now_ += 0.001;
    Run(sent[0]);
  }
  // Pinned to the CPU: worker 1 only; were it gone, nothing could run it.
  TaskSpec cpu = Task({input});
  cpu.variant = Variant::kCpu;
  Submit(cpu);
  auto sent = link_.Take();
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].worker, 1u);
  Run(sent[0]);
  scheduler_.RemoveSession(1);
  Status s = SubmitStatus({cpu});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  // Unpinned, it runs on the GPU variant.
  EXPECT_EQ(RunTimed(input, Variant::kAuto, 0.001), 0);
}

TEST_F(VariantTest, ATaskNoWayOfWhichCouldEverBePlacedWaitsAsideSayingWhy) {
  // "f" has only a GPU variant, on GPU 0; its input is on GPU 1, which a worker offers
  // without running "f": with hard affinity, no way of the task can ever be placed.
  WorkerSpec on_gpu0{.capacity = {.cpu = 1, .gpus = {0}}, .gpu_functions = {"f"}};
  ASSERT_TRUE(scheduler_.AddWorker(1, std::move(on_gpu0)).ok());
  AddWorker(2, 1, {1}, {"g"});
  const ObjectId input = store_.Put(kMiB, 1);
  TaskSpec t = Task({input});
  t.affinity = Affinity::kHard;
  Submit(t);
  EXPECT_TRUE(link_.Take().empty());
  const std::string reason = scheduler_.Tasks().front().reason;
  EXPECT_NE(reason.find("hard affinity"), std::string::npos) << reason;
  // Others are not held back by it.
  TaskSpec other = Task({store_.Put(kMiB)});
  Submit(other);
  ASSERT_EQ(link_.Take().size(), 1u);
  // A worker with the GPU variant on GPU 1 takes it.
  WorkerSpec on_gpu1{.capacity = {.cpu = 1, .gpus = {1}}, .gpu_functions = {"f"}};
  ASSERT_TRUE(scheduler_.AddWorker(3, std::move(on_gpu1)).ok());
  auto sent = link_.Take();
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].worker, 3u);
  EXPECT_EQ(sent[0].device, 1);
}

TEST_F(VariantTest, PinningTheGpuVariantTakesOnlyWorkersWithOne) {
  AddWorker(1, 1, {0});  // runs "f" as registered, GPU 0
  WorkerSpec both{.capacity = {.cpu = 1, .gpus = {1}}, .functions = {"f"}, .gpu_functions = {"f"}};
  ASSERT_TRUE(scheduler_.AddWorker(2, std::move(both)).ok());
  const ObjectId on_gpu0 = store_.Put(kMiB, 0);  // where worker 1 is
  for (int i = 0; i < 3; ++i) {
    TaskSpec t = Task({on_gpu0});
    t.variant = Variant::kGpu;
    Submit(t);
    auto sent = link_.Take();
    ASSERT_EQ(sent.size(), 1u);
    EXPECT_EQ(sent[0].worker, 2u) << i;
    Run(sent[0]);
  }
  TaskSpec contradiction = Task({on_gpu0}, kGpuOnly);
  contradiction.variant = Variant::kCpu;
  Status s = SubmitStatus({contradiction});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("the CPU variant asks for no GPU"), std::string::npos) << s.ToString();
}

TEST_F(VariantTest, OnlySuccessfulRunsAreMeasuredAndAFunctionNoWorkerRunsIsForgotten) {
  AddBothWays(1);
  const ObjectId input = store_.Put(kMiB);
  TaskSpec gpu = Task({input});
  gpu.variant = Variant::kGpu;
  // A GPU variant that fails at once does not look fast.
  Submit(gpu);
  auto sent = link_.Take();
  ASSERT_EQ(sent.size(), 1u);
  now_ += 1e-5;
  Fail(sent[0], "no CUDA here");
  Submit(gpu);
  sent = link_.Take();
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(Of(sent[0].task).duration_s, DurationModel::kUnmeasured);
  now_ += 0.5;
  Run(sent[0]);
  Submit(gpu);
  sent = link_.Take();
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_NEAR(Of(sent[0].task).duration_s, 0.5, 1e-9);
  Run(sent[0]);
  // Its last worker gone, "f" is forgotten: a worker that attaches later starts afresh.
  scheduler_.RemoveSession(1);
  AddBothWays(2);
  Submit(gpu);
  sent = link_.Take();
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(Of(sent[0].task).duration_s, DurationModel::kUnmeasured);
}

TEST_F(VariantTest, WorkersListTheirGpuVariants) {
  AddBothWays(1);
  auto workers = scheduler_.Workers();
  ASSERT_EQ(workers.size(), 1u);
  EXPECT_EQ(workers[0].functions, std::vector<std::string>{"f"});
  EXPECT_EQ(workers[0].gpu_functions, std::vector<std::string>{"f"});
  WorkerSpec bad{.capacity = {.cpu = 1}, .gpu_functions = {""}};
  EXPECT_EQ(scheduler_.AddWorker(2, std::move(bad)).code(), StatusCode::kInvalidArgument);
}

class PipelineTest : public SchedulerTest {
 protected:
  PipelineTest() : SchedulerTest(/*pipeline=*/true) {}

  // Adds a worker and runs one task of "f" on it, so that "f" is measured, and short: only
  // short tasks are sent ahead.
  void AddMeasuredWorker(SessionId id, double cpu, std::vector<int32_t> gpus = {}) {
    const bool on_gpu = !gpus.empty();
    AddWorker(id, cpu, std::move(gpus));
    Submit(Task({}, on_gpu ? kGpuOnly : ResourceRequest{}));
    auto sent = link_.Take();
    ASSERT_EQ(sent.size(), 1u);
    Run(sent[0]);
  }

  std::map<TaskId, TaskInfo> TasksById() {
    std::map<TaskId, TaskInfo> out;
    for (TaskInfo& t : scheduler_.Tasks()) out[t.id] = std::move(t);
    return out;
  }
};

TEST_F(PipelineTest, ResourcesAreNeverOversubscribedUnderARandomLoad) { RandomLoad(); }

TEST_F(PipelineTest, TasksQueuedOnABusyWorkerAreSentAheadToFollowWhatRunsThere) {
  AddMeasuredWorker(1, 1);
  for (int i = 0; i < 4; ++i) Submit(Task());
  auto sent = link_.Take();
  // One runs; two more (the window) are sent to follow it, one after the other; one waits.
  ASSERT_EQ(sent.size(), 3u);
  EXPECT_EQ(sent[0].after, 0u);
  EXPECT_EQ(sent[1].after, sent[0].task);
  EXPECT_EQ(sent[2].after, sent[1].task);
  auto tasks = TasksById();
  EXPECT_EQ(tasks[sent[0].task].state, TaskState::kRunning);
  EXPECT_EQ(tasks[sent[1].task].state, TaskState::kQueued) << "as people see it";
  EXPECT_NE(tasks[sent[1].task].reason.find("sent to its worker"), std::string::npos);
  EXPECT_EQ(tasks[sent[1].task].attempts, 0u);
  EXPECT_EQ(scheduler_.Workers()[0].running, 1u);
  EXPECT_EQ(scheduler_.Workers()[0].queued, 2u);
  // The first ends: the second takes over its slot, and the last is sent after the third.
  Run(sent[0]);
  auto next = link_.Take();
  ASSERT_EQ(next.size(), 1u);
  EXPECT_EQ(next[0].after, sent[2].task);
  tasks = TasksById();
  EXPECT_EQ(tasks[sent[1].task].state, TaskState::kRunning);
  EXPECT_EQ(tasks[sent[1].task].attempts, 1u);
  EXPECT_EQ(scheduler_.Workers()[0].free_cpu, 0);
  Run(sent[1]);
  Run(sent[2]);
  Run(next[0]);
  EXPECT_EQ(scheduler_.counters().completed, 5u);
  EXPECT_EQ(scheduler_.Workers()[0].free_cpu, 1);
  EXPECT_TRUE(link_.Take().empty());
}

TEST_F(PipelineTest, ATaskSentAheadMayEndBeforeTheOneItFollowed) {
  AddMeasuredWorker(1, 1);
  Submit(Task());
  Submit(Task());
  Submit(Task());
  auto sent = link_.Take();
  ASSERT_EQ(sent.size(), 3u);
  Run(sent[1]);  // reported first: the third now follows the first
  Run(sent[0]);  // its slot goes to the third
  EXPECT_EQ(TasksById()[sent[2].task].state, TaskState::kRunning);
  EXPECT_EQ(scheduler_.Workers()[0].free_cpu, 0);
  Run(sent[2]);
  EXPECT_EQ(scheduler_.Workers()[0].free_cpu, 1);
  EXPECT_EQ(scheduler_.counters().completed, 4u);
}

TEST_F(PipelineTest, OnlyATaskOfTheSameResourcesAndDeviceIsSentAhead) {
  AddMeasuredWorker(1, 2, {0});
  Submit(Task({}, kGpuOnly));  // runs, holding GPU 0
  Submit(Task({}, kGpuOnly));  // the same shape: sent ahead to follow it
  auto sent = link_.Take();
  ASSERT_EQ(sent.size(), 2u);
  EXPECT_EQ(sent[1].after, sent[0].task);
  Submit(Task({}, {.cpu = 1, .gpu = 1}));  // another shape: waits in the daemon for GPU 0
  EXPECT_TRUE(link_.Take().empty());
  EXPECT_EQ(TasksById().rbegin()->second.state, TaskState::kQueued);
  Run(sent[0]);
  EXPECT_TRUE(link_.Take().empty()) << "GPU 0 went to the task sent ahead";
  Run(sent[1]);
  auto last = link_.Take();
  ASSERT_EQ(last.size(), 1u);
  EXPECT_EQ(last[0].after, 0u);
}

TEST_F(PipelineTest, AWorkerThatDiesGivesBackWhatWasSentAheadWithoutUsingARetry) {
  AddMeasuredWorker(1, 1);
  TaskSpec once = Task();
  once.retries = 0;
  auto first = Submit(once);
  auto second = Submit(once);
  auto sent = link_.Take();
  ASSERT_EQ(sent.size(), 2u);
  ASSERT_EQ(sent[1].after, sent[0].task);
  EXPECT_EQ(scheduler_.Cancel(std::span(second)), std::vector{Scheduler::CancelOutcome::kRunning})
      << "sent: it will run";
  // The worker may have run it (it starts as soon as the first returns) and sealed its
  // output before it died.
  store_.Seal(second[0], kMiB);
  AddWorker(2, 1);
  scheduler_.RemoveSession(1);
  // The first was running: no retries left, it fails. The second goes back without using
  // its retry, and is told what it sealed.
  EXPECT_EQ(store_.objects.at(first[0]).state, StoreAccess::State::kFailed);
  auto again = link_.Take();
  ASSERT_EQ(again.size(), 1u);
  EXPECT_EQ(again[0].task, sent[1].task);
  EXPECT_EQ(again[0].worker, 2u);
  EXPECT_EQ(again[0].attempt, 2u) << "it may have run once";
  EXPECT_EQ(again[0].after, 0u);
  EXPECT_EQ(again[0].sealed, std::vector<uint32_t>{0});
  Run(again[0]);
  EXPECT_EQ(store_.objects.at(second[0]).state, StoreAccess::State::kSealed);
  EXPECT_EQ(scheduler_.counters().retried, 0u);
}

TEST_F(PipelineTest, WorkersEndingWhileATaskWasSentAheadCountAgainstItsRetriesButOne) {
  AddMeasuredWorker(1, 1);
  AddMeasuredWorker(2, 1);
  TaskSpec once = Task();
  once.retries = 0;
  Submit(Task());
  Submit(Task());
  auto victim = Submit(once);  // sent ahead on one of them
  auto sent = link_.Take();
  ASSERT_EQ(sent.size(), 3u);
  ASSERT_NE(sent[2].after, 0u);
  const SessionId first = sent[2].worker;
  scheduler_.RemoveSession(first);  // once: back to the queue, on the other worker
  auto again = link_.Take();
  const auto resent = std::find_if(again.begin(), again.end(),
                                   [&](const Sent& s) { return s.task == sent[2].task; });
  ASSERT_NE(resent, again.end());
  ASSERT_NE(resent->after, 0u) << "sent ahead there too";
  scheduler_.RemoveSession(resent->worker);  // twice: no retries left
  const auto& failed = store_.objects.at(victim[0]);
  EXPECT_EQ(failed.state, StoreAccess::State::kFailed);
  EXPECT_NE(failed.message.find("no retries left"), std::string::npos) << failed.message;
}

TEST_F(PipelineTest, TasksOfFunctionsNotKnownToBeShortAreNotSentAheadNorFollowed) {
  AddWorker(1, 1);
  Submit(Task());
  Submit(Task());
  auto sent = link_.Take();
  ASSERT_EQ(sent.size(), 1u) << "\"f\" has not run yet: not known to be short";
  Run(sent[0]);  // now it is (it took microseconds)
  auto second = link_.Take();
  ASSERT_EQ(second.size(), 1u);
  Submit(Task());
  EXPECT_TRUE(link_.Take().empty()) << "the running task was placed as not short: not followed";
  Run(second[0]);
  auto third = link_.Take();
  ASSERT_EQ(third.size(), 1u);
  EXPECT_EQ(third[0].after, 0u);
  Submit(Task());
  auto ahead = link_.Take();
  ASSERT_EQ(ahead.size(), 1u);
  EXPECT_EQ(ahead[0].after, third[0].task);
}

TEST_F(PipelineTest, ADrainingWorkerRunsWhatWasSentAheadThenLeaves) {
  AddMeasuredWorker(1, 1);
  Submit(Task());
  Submit(Task());
  Submit(Task());
  auto sent = link_.Take();
  ASSERT_EQ(sent.size(), 3u);
  ASSERT_TRUE(scheduler_.DrainWorker(1).ok());
  Run(sent[0]);
  Run(sent[1]);
  EXPECT_TRUE(link_.drained.empty());
  Run(sent[2]);
  EXPECT_EQ(link_.drained, std::vector<SessionId>{1});
}

}  // namespace
}  // namespace depot::scheduler
