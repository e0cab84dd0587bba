// The worker table on its own, against a fake store and fake workers: registration, the
// ways a task may run, starting and queueing within a worker's window, pipelining, and what
// is sent. The tasks come from a task graph; where each goes is said here, as the dispatcher
// would.
#include "scheduler/worker_table.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "scheduler/durations.h"
#include "scheduler_fakes.h"

namespace depot::scheduler {
namespace {

constexpr double kShort = DurationModel::kUnmeasured / 10;
constexpr double kLong = 1.0;

class WorkerTableTest : public ::testing::Test {
 protected:
  explicit WorkerTableTest(bool pipeline = false)
      : table_(graph_, link_,
               {.window = 2, .pipeline = pipeline, .clock = [this] { return now_; }}) {}

  Worker& AddWorker(SessionId id, double cpu, std::vector<int32_t> gpus = {},
                    std::vector<std::string> functions = {"f"},
                    std::vector<std::string> gpu_functions = {}) {
    Status s = table_.Add(id, {.name = "w" + std::to_string(id),
                               .capacity = {.cpu = cpu, .gpus = std::move(gpus)},
                               .functions = std::move(functions),
                               .gpu_functions = std::move(gpu_functions)});
    EXPECT_TRUE(s.ok()) << s.ToString();
    return *table_.Find(id);
  }
  // A ready task of `f` that runs with `request` on `device` for about `duration_s`.
  Task& NewTask(double duration_s = kLong, ResourceRequest request = {},
                int32_t device = kHostMemory) {
    const TaskSpec spec{.function = "f", .resources = request};
    auto out = graph_.Add(100, std::span(&spec, 1), [](const TaskSpec&) { return true; });
    EXPECT_TRUE(out.ok()) << out.status().ToString();
    Task& task = *graph_.ProducerOf(out.value()[0][0]);
    task.device = device;
    task.duration_s = duration_s;
    return task;
  }

  FakeStore store_;
  FakeLink link_;
  TaskGraph graph_{store_, 16, [](Task& t) { t.state = TaskState::kReady; }};
  double now_ = 0;
  WorkerTable table_;
};

class PipelinedWorkerTableTest : public WorkerTableTest {
 protected:
  PipelinedWorkerTableTest() : WorkerTableTest(/*pipeline=*/true) {}
};

TEST_F(WorkerTableTest, AWorkerRegistersOnceWithNamesOfBoundedLength) {
  AddWorker(1, 1);
  EXPECT_EQ(table_.Add(1, {.capacity = {.cpu = 1}}).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(table_.Add(2, {.capacity = {.cpu = 1}, .functions = {""}}).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(
      table_.Add(2, {.capacity = {.cpu = 1}, .functions = {std::string(kMaxFunctionName + 1, 'x')}})
          .code(),
      StatusCode::kInvalidArgument);
  EXPECT_EQ(table_.Add(2, {.capacity = {.cpu = -1}}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(table_.workers().size(), 1u);
}

TEST_F(WorkerTableTest, ATaskThatFitsStartsAtOnceAndIsSentAtFlush) {
  Worker& w = AddWorker(1, 1);
  Task& task = NewTask();
  EXPECT_TRUE(table_.Place(w, task, /*now=*/true));
  EXPECT_EQ(task.state, TaskState::kRunning);
  EXPECT_EQ(task.attempts, 1u);
  EXPECT_EQ(w.resources.free_cpu(), 0);
  EXPECT_TRUE(link_.sent.empty());
  table_.Flush();
  ASSERT_EQ(link_.sent.size(), 1u);
  EXPECT_EQ(link_.sent[0].task, task.id);
  EXPECT_EQ(link_.sent[0].attempt, 1u);
  EXPECT_EQ(link_.sent[0].after, 0u);
}

TEST_F(WorkerTableTest, EachMessageSaysWhetherItLeavesItsWorkerRoomForAnotherTask) {
  Worker& w = AddWorker(1, 2);
  Task& first = NewTask();
  ASSERT_TRUE(table_.Place(w, first, true));
  table_.Flush();
  ASSERT_EQ(link_.sent.size(), 1u);
  EXPECT_FALSE(link_.sent[0].worker_full) << "a CPU is left";

  Task& second = NewTask();
  Task& third = NewTask();
  ASSERT_TRUE(table_.Place(w, second, true));
  EXPECT_FALSE(table_.Place(w, third, true));  // queued: not sent
  table_.Flush();
  ASSERT_EQ(link_.sent.size(), 2u);
  EXPECT_EQ(link_.sent[1].task, second.id);
  EXPECT_TRUE(link_.sent[1].worker_full);

  // One ends: the queued one takes its CPU, and the worker is full again.
  table_.Unplace(first);
  table_.StartQueued(w);
  table_.Flush();
  ASSERT_EQ(link_.sent.size(), 3u);
  EXPECT_EQ(link_.sent[2].task, third.id);
  EXPECT_TRUE(link_.sent[2].worker_full);
}

// A task waiting for room for an output lends its CPU to another task; at most as many are
// lent at once as the worker has slots, and a lent task gives nothing back when it ends.
TEST_F(WorkerTableTest, ATaskWaitingForRoomLendsItsResourcesOnceAndGivesNothingBackTwice) {
  Worker& w = AddWorker(1, 1);
  Task& waiting = NewTask();
  Task& next = NewTask();
  ASSERT_TRUE(table_.Place(w, waiting, true));
  EXPECT_FALSE(table_.Place(w, next, true));  // queued: no CPU
  ASSERT_TRUE(table_.Lend(waiting));
  EXPECT_FALSE(table_.Lend(waiting)) << "lent already";
  EXPECT_EQ(w.resources.free_cpu(), 1);
  table_.StartQueued(w);
  EXPECT_EQ(next.state, TaskState::kRunning);
  EXPECT_EQ(w.resources.free_cpu(), 0);
  EXPECT_FALSE(table_.Lend(next)) << "one slot, one lent";

  table_.Unplace(waiting);
  EXPECT_EQ(w.resources.free_cpu(), 0) << "the lent task held nothing";
  EXPECT_EQ(w.lent, 0u);
  table_.Unplace(next);
  EXPECT_EQ(w.resources.free_cpu(), 1);
}

TEST_F(WorkerTableTest, TasksThatDoNotFitQueueInOrderAndFillTheWindow) {
  Worker& w = AddWorker(1, 1);
  Task& running = NewTask();
  Task& first = NewTask();
  Task& second = NewTask();
  ASSERT_TRUE(table_.Place(w, running, true));
  EXPECT_TRUE(table_.Open(w));
  EXPECT_FALSE(table_.Place(w, first, true));  // no CPU left: it queues
  EXPECT_EQ(first.state, TaskState::kQueued);
  EXPECT_TRUE(table_.Open(w));
  EXPECT_FALSE(table_.Place(w, second, false));
  EXPECT_EQ(table_.Waiting(w), 2u);
  EXPECT_FALSE(table_.Open(w));  // the window of 2 is full
  EXPECT_DOUBLE_EQ(table_.QueueWait(w), 3 * kLong);

  // The running one ends: the first queued takes its CPU, the second waits on.
  table_.Unplace(running);
  EXPECT_TRUE(w.freed);
  table_.StartQueued(w);
  EXPECT_EQ(first.state, TaskState::kRunning);
  EXPECT_EQ(second.state, TaskState::kQueued);
  EXPECT_TRUE(table_.Open(w));
  EXPECT_DOUBLE_EQ(table_.QueueWait(w), 2 * kLong);
}

// A task running past its expected duration is expected to run as long again as it has:
// the longer a task stalls, the less a task queued behind it is expected to gain there.
TEST_F(WorkerTableTest, ATaskRunningPastItsEstimateMakesItsWorkersWaitGrow) {
  Worker& w = AddWorker(1, 1);
  Task& running = NewTask();
  Task& queued = NewTask();
  ASSERT_TRUE(table_.Place(w, running, true));
  EXPECT_FALSE(table_.Place(w, queued, false));
  now_ = kLong / 2;  // within its estimate: the estimates alone
  EXPECT_DOUBLE_EQ(table_.QueueWait(w), 2 * kLong);
  now_ = 5 * kLong;  // four past it: expected to run five more
  EXPECT_DOUBLE_EQ(table_.QueueWait(w), 2 * kLong + 4 * kLong);
  // Once it ends, only what is left counts.
  table_.Unplace(running);
  table_.StartQueued(w);
  EXPECT_DOUBLE_EQ(table_.QueueWait(w), kLong);
}

TEST_F(WorkerTableTest, ADrainingWorkerIsNeverOpen) {
  Worker& w = AddWorker(1, 4);
  EXPECT_TRUE(table_.Open(w));
  w.draining = true;
  EXPECT_FALSE(table_.Open(w));
}

TEST_F(WorkerTableTest, FlushSendsOnlyWhatStillRunsThereOneMessagePerWorker) {
  Worker& a = AddWorker(1, 2);
  Worker& b = AddWorker(2, 2);
  Task& t1 = NewTask();
  Task& t2 = NewTask();
  Task& gone = NewTask();
  ASSERT_TRUE(table_.Place(a, t1, true));
  ASSERT_TRUE(table_.Place(a, t2, true));
  ASSERT_TRUE(table_.Place(b, gone, true));
  // Its worker ended, say, before the send: back to the daemon's queue.
  table_.Unplace(gone);
  gone.state = TaskState::kReady;
  table_.Flush();
  EXPECT_EQ(link_.messages, 1);
  ASSERT_EQ(link_.sent.size(), 2u);
  EXPECT_EQ(link_.sent[0].worker, 1u);
  EXPECT_EQ(link_.sent[1].worker, 1u);
  EXPECT_EQ(b.resources.free_cpu(), 2);
}

TEST_F(WorkerTableTest, ARetryIsToldWhichOutputsAnEarlierAttemptSealed) {
  Worker& w = AddWorker(1, 1);
  const TaskSpec spec{.function = "f", .num_outputs = 2};
  auto out = graph_.Add(100, std::span(&spec, 1), [](const TaskSpec&) { return true; });
  ASSERT_TRUE(out.ok());
  Task& task = *graph_.ProducerOf(out.value()[0][0]);
  task.attempts = 1;  // its first worker died after sealing output 1
  store_.Seal(out.value()[0][1], 10);
  ASSERT_TRUE(table_.Place(w, task, true));
  table_.Flush();
  ASSERT_EQ(link_.sent.size(), 1u);
  EXPECT_EQ(link_.sent[0].attempt, 2u);
  EXPECT_EQ(link_.sent[0].sealed, std::vector<uint32_t>{1});
  EXPECT_EQ(store_.HoldsOn(out.value()[0][1]), 1);
}

TEST_F(WorkerTableTest, RemovingAWorkerNamesTheFunctionsNoWorkerRunsAnyMore) {
  Worker& a = AddWorker(1, 1, {}, {"f", "g"}, {"h"});
  AddWorker(2, 1, {}, {"f"});
  EXPECT_EQ(table_.Runners("f").size(), 2u);
  EXPECT_EQ(table_.Runners("h").size(), 1u);
  auto gone = table_.Remove(a);
  std::sort(gone.begin(), gone.end());
  EXPECT_EQ(gone, (std::vector<std::string>{"g", "h"}));
  EXPECT_EQ(table_.Runners("f").size(), 1u);
  EXPECT_TRUE(table_.Runners("g").empty());
  EXPECT_EQ(table_.Find(1), nullptr);
}

TEST_F(WorkerTableTest, AFunctionWithAGpuVariantRunsTwoWaysUnlessTheTaskChooses) {
  AddWorker(1, 1, {0}, {"f"}, {"f"});
  TaskSpec spec{.function = "f"};
  auto ways = table_.Ways(spec);
  ASSERT_EQ(ways.size(), 2u);
  EXPECT_EQ(ways[0].runs, Way::Runs::kCpuVariant);
  EXPECT_EQ(ways[1].runs, Way::Runs::kGpuVariant);
  EXPECT_EQ(ways[1].request.gpu, 1);
  EXPECT_EQ(ways[1].request.cpu, 0);
  spec.variant = Variant::kCpu;
  ASSERT_EQ(table_.Ways(spec).size(), 1u);
  EXPECT_EQ(table_.Ways(spec)[0].runs, Way::Runs::kCpuVariant);
  spec.variant = Variant::kAuto;
  spec.resources.gpu = 0.5;  // it asks a GPU share: the GPU variant, with that share
  ASSERT_EQ(table_.Ways(spec).size(), 1u);
  EXPECT_EQ(table_.Ways(spec)[0].request.gpu, 0.5);
  // A function with no GPU variant anywhere, asked for on a GPU, runs as is there.
  spec = {.function = "g", .variant = Variant::kGpu};
  ASSERT_EQ(table_.Ways(spec).size(), 1u);
  EXPECT_EQ(table_.Ways(spec)[0].runs, Way::Runs::kAsIs);
}

TEST_F(WorkerTableTest, CouldEverRunAsksForAnIdleWorkerThatFitsAndOffersTheGpu) {
  Worker& w = AddWorker(1, 2, {0});
  const TaskSpec gpu_task{.function = "f", .resources = {.cpu = 1, .gpu = 1}};
  EXPECT_TRUE(table_.CouldEverRun(gpu_task));
  EXPECT_TRUE(table_.CouldEverRun(gpu_task, 0));
  EXPECT_FALSE(table_.CouldEverRun(gpu_task, 1));
  EXPECT_FALSE(table_.CouldEverRun({.function = "f", .resources = {.cpu = 3}}));
  EXPECT_FALSE(table_.CouldEverRun({.function = "unknown"}));
  // Busy now changes nothing; draining does.
  ASSERT_TRUE(table_.Place(w, NewTask(kLong, {.cpu = 2}), true));
  EXPECT_TRUE(table_.CouldEverRun(gpu_task));
  w.draining = true;
  EXPECT_FALSE(table_.CouldEverRun(gpu_task));
}

TEST_F(PipelinedWorkerTableTest, AShortTaskQueuedOnABusyWorkerIsSentAheadAndTakesOver) {
  Worker& w = AddWorker(1, 1);
  Task& a = NewTask(kShort);
  Task& b = NewTask(kShort);
  ASSERT_TRUE(table_.Place(w, a, true));
  EXPECT_FALSE(table_.Place(w, b, false));
  EXPECT_EQ(b.state, TaskState::kRunning);
  EXPECT_EQ(b.after, a.id);
  EXPECT_EQ(a.follower, b.id);
  EXPECT_EQ(b.attempts, 0u);  // not started until it takes over
  EXPECT_EQ(w.pipelined, 1u);
  EXPECT_EQ(table_.Waiting(w), 1u);
  table_.Flush();
  ASSERT_EQ(link_.sent.size(), 2u);
  EXPECT_EQ(link_.sent[1].after, a.id);

  now_ = 5;
  table_.Unplace(a);  // a returned: b runs on its CPU, which stays taken
  EXPECT_EQ(b.after, 0u);
  EXPECT_EQ(b.attempts, 1u);
  EXPECT_EQ(b.started_at, 5);
  EXPECT_EQ(w.pipelined, 0u);
  EXPECT_EQ(w.resources.free_cpu(), 0);
  EXPECT_FALSE(w.freed);
  table_.Unplace(b);
  EXPECT_EQ(w.resources.free_cpu(), 1);
}

TEST_F(PipelinedWorkerTableTest, LongTasksAndTasksOfAnotherShapeAreNotSentAhead) {
  Worker& w = AddWorker(1, 2);
  Task& a = NewTask(kLong);
  Task& b = NewTask(kLong);
  ASSERT_TRUE(table_.Place(w, a, true));
  ASSERT_TRUE(table_.Place(w, NewTask(kShort, {.cpu = 1}), true));
  EXPECT_FALSE(table_.Place(w, b, false));
  EXPECT_EQ(b.state, TaskState::kQueued);  // long: it waits in the daemon
  Task& other_shape = NewTask(kShort, {.cpu = 2});
  table_.Unplace(b);
  EXPECT_FALSE(table_.Place(w, other_shape, false));
  EXPECT_EQ(other_shape.state, TaskState::kQueued);  // none running asks for 2 CPUs
}

TEST_F(PipelinedWorkerTableTest, ATaskSentAheadThatLeavesHandsItsPlaceInLineOn) {
  Worker& w = AddWorker(1, 1);
  Task& a = NewTask(kShort);
  Task& b = NewTask(kShort);
  Task& c = NewTask(kShort);
  ASSERT_TRUE(table_.Place(w, a, true));
  table_.Place(w, b, false);
  table_.Place(w, c, false);
  ASSERT_EQ(b.after, a.id);
  ASSERT_EQ(c.after, b.id);  // the end of a's line
  table_.Unplace(b);         // its worker said it could not start it, say
  EXPECT_EQ(a.follower, c.id);
  EXPECT_EQ(c.after, a.id);
  EXPECT_EQ(w.pipelined, 1u);
}

}  // namespace
}  // namespace depot::scheduler
