// The dispatcher on its own, over a task graph and a worker table, against a fake store and
// fake workers: the ready queue's order, tasks set aside for want of a worker, room for
// outputs, prefetches, the choice between variants, and what a round looks at.
#include "scheduler/dispatcher.h"

#include <gtest/gtest.h>

#include <deque>
#include <limits>
#include <string>
#include <vector>

#include "scheduler_fakes.h"

namespace depot::scheduler {
namespace {

class DispatcherTest : public ::testing::Test {
 protected:
  DispatcherTest()
      : graph_(store_, 16, [this](Task& t) { dispatcher_.MakeReady(t); }),
        table_(graph_, link_, {.window = 2, .pipeline = false, .clock = [this] { return now_; }}),
        dispatcher_(graph_, table_, store_, durations_,
                    {.measure_bandwidths = false, .random_placement = false}) {}

  void AddWorker(SessionId id, double cpu, std::vector<int32_t> gpus = {},
                 std::vector<std::string> gpu_functions = {}) {
    Status s = table_.Add(id, {.name = "w" + std::to_string(id),
                               .capacity = {.cpu = cpu, .gpus = std::move(gpus)},
                               .functions = {"f"},
                               .gpu_functions = std::move(gpu_functions)});
    ASSERT_TRUE(s.ok()) << s.ToString();
    dispatcher_.Unstall();
  }
  Task& Submit(TaskSpec spec) {
    auto out = graph_.Add(100, std::span(&spec, 1), [](const TaskSpec&) { return true; });
    EXPECT_TRUE(out.ok()) << out.status().ToString();
    return *graph_.ProducerOf(out.value()[0][0]);
  }
  // One round, and what it sent.
  std::vector<Sent> Round() {
    dispatcher_.Round();
    table_.Flush();
    return link_.Take();
  }

  double now_ = 0;
  FakeStore store_;
  FakeLink link_;
  DurationModel durations_;
  TaskGraph graph_;
  WorkerTable table_;
  Dispatcher dispatcher_;
};

TEST_F(DispatcherTest, ReadyTasksGoByPriorityThenDepthThenSubmission) {
  // A consumer made ready after its producer finished keeps its depth: it goes before a
  // task submitted earlier at depth 0, so that data is consumed before more is made.
  Task& producer = Submit({.function = "f"});
  const ObjectId made = producer.outputs[0];
  const TaskId consumer = Submit({.function = "f", .inputs = {made}}).id;
  const TaskId early = Submit({.function = "f"}).id;
  const TaskId urgent = Submit({.function = "f", .priority = 5}).id;
  dispatcher_.Forget(producer);
  store_.Seal(made, 10);
  graph_.Finish(producer, TaskState::kDone, "");
  EXPECT_EQ(dispatcher_.ready(), 3u);

  AddWorker(1, 1);
  auto sent = Round();
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].task, urgent);
  Worker& w = *table_.Find(1);
  EXPECT_EQ(std::vector<TaskId>(w.queue.begin(), w.queue.end()),
            (std::vector<TaskId>{consumer, early}));
  EXPECT_EQ(dispatcher_.ready(), 0u);
  EXPECT_EQ(dispatcher_.counters().placements, 3u);
}

// A consumer made ready while every window is full of producers takes the place of the last
// of them, and starts before the others queued there: data is consumed before more is made
// (the producers otherwise fill the store first: dask/distributed#7449's product).
TEST_F(DispatcherTest, AConsumerMadeReadyTakesTheQueuedPlaceOfAProducer) {
  AddWorker(1, 1);
  Task& first = Submit({.function = "f"});
  const ObjectId made = first.outputs[0];
  const TaskId consumer = Submit({.function = "f", .inputs = {made}}).id;
  std::vector<TaskId> producers;
  for (int i = 0; i < 3; ++i) producers.push_back(Submit({.function = "f"}).id);
  auto sent = Round();
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].task, first.id);
  Worker& w = *table_.Find(1);
  EXPECT_EQ(std::vector<TaskId>(w.queue.begin(), w.queue.end()),
            (std::vector<TaskId>{producers[0], producers[1]}));
  EXPECT_EQ(dispatcher_.ready(), 1u);

  store_.Seal(made, 10);
  table_.Unplace(first);
  graph_.Finish(first, TaskState::kDone, "");
  sent = Round();
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].task, consumer) << "it starts on the freed CPU, ahead of those queued";
  EXPECT_EQ(dispatcher_.counters().preemptions, 1u);
  EXPECT_EQ(std::vector<TaskId>(w.queue.begin(), w.queue.end()),
            (std::vector<TaskId>{producers[0], producers[1]}))
      << "the last queued went back to wait, and came back to the window, in order";
  EXPECT_EQ(graph_.at(producers[2]).state, TaskState::kReady);

  // Tasks alike (the producers left, all at depth 0) are not moved for nothing.
  EXPECT_TRUE(Round().empty());
  EXPECT_EQ(dispatcher_.counters().preemptions, 1u);
}

// The queued task that gives its place is the one on the worker whose CPU the completion
// freed: the consumer starts there at once, not behind a task running on the other worker.
TEST_F(DispatcherTest, AConsumerTakesAPlaceOnTheWorkerThatFreedItsCpu) {
  AddWorker(1, 1);
  AddWorker(2, 1);
  Task& first = Submit({.function = "f"});
  const ObjectId made = first.outputs[0];
  const TaskId consumer = Submit({.function = "f", .inputs = {made}}).id;
  for (int i = 0; i < 5; ++i) Submit({.function = "f"});
  ASSERT_EQ(Round().size(), 2u);
  const SessionId freed = first.worker;
  Worker& w = *table_.Find(freed);
  Worker& other = *table_.Find(freed == 1 ? 2 : 1);
  ASSERT_EQ(w.queue.size(), 2u);
  ASSERT_EQ(other.queue.size(), 2u);
  const std::deque<TaskId> others_queue = other.queue;
  const std::deque<TaskId> queued = w.queue;

  store_.Seal(made, 10);
  table_.Unplace(first);
  graph_.Finish(first, TaskState::kDone, "");
  auto sent = Round();
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].task, consumer);
  EXPECT_EQ(sent[0].worker, freed);
  EXPECT_EQ(other.queue, others_queue) << "the busy worker's queue is left alone";
  EXPECT_EQ(dispatcher_.counters().preemptions, 1u);
  EXPECT_EQ(w.queue, queued) << "the one that gave its place took it back behind the first";
}

// A ready task that would not be placed (its output does not fit the store's room) takes
// no queued task's place: nothing is moved for nothing, round after round.
TEST_F(DispatcherTest, AConsumerThatWouldNotFitTakesNoPlace) {
  AddWorker(1, 1);
  store_.room[kHostMemory] = 1 << 20;
  Task& first = Submit({.function = "f"});
  const ObjectId made = first.outputs[0];
  const TaskId consumer = Submit({.function = "f", .inputs = {made}, .output_bytes = 2 << 20}).id;
  for (int i = 0; i < 3; ++i) Submit({.function = "f"});
  ASSERT_EQ(Round().size(), 1u);
  store_.Seal(made, 10);
  table_.Unplace(first);
  graph_.Finish(first, TaskState::kDone, "");
  for (int i = 0; i < 3; ++i) {
    for (const Sent& s : Round()) EXPECT_NE(s.task, consumer);
  }
  EXPECT_EQ(dispatcher_.counters().preemptions, 0u);
  EXPECT_EQ(graph_.at(consumer).state, TaskState::kReady);
}

// With a window open, a ready task queues in order among those queued there: one of higher
// priority ahead of one placed earlier.
TEST_F(DispatcherTest, AWorkersQueueKeepsTheReadyOrder) {
  AddWorker(1, 1);
  Submit({.function = "f"});
  const TaskId early = Submit({.function = "f"}).id;
  ASSERT_EQ(Round().size(), 1u);
  const TaskId urgent = Submit({.function = "f", .priority = 3}).id;
  EXPECT_TRUE(Round().empty());
  Worker& w = *table_.Find(1);
  EXPECT_EQ(std::vector<TaskId>(w.queue.begin(), w.queue.end()),
            (std::vector<TaskId>{urgent, early}));
  EXPECT_EQ(dispatcher_.counters().preemptions, 0u) << "a window was open";
}

TEST_F(DispatcherTest, ATaskNoWorkerCouldEverRunIsSetAsideUntilOneAttaches) {
  AddWorker(1, 1, {0});
  const ObjectId on_gpu1 = store_.Put(1 << 20, 1);
  Task& task = Submit({.function = "f",
                       .inputs = {on_gpu1},
                       .resources = {.cpu = 0, .gpu = 1},
                       .affinity = Affinity::kHard});
  EXPECT_TRUE(Round().empty());
  EXPECT_TRUE(dispatcher_.Stalled(task.id));
  EXPECT_EQ(dispatcher_.ready(), 0u);
  // Set aside, it costs later rounds nothing.
  const uint64_t tries = dispatcher_.counters().tries;
  Round();
  EXPECT_EQ(dispatcher_.counters().tries, tries);

  AddWorker(2, 0, {1});
  auto sent = Round();
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].worker, 2u);
  EXPECT_EQ(sent[0].device, 1);
  EXPECT_FALSE(dispatcher_.Stalled(task.id));
  EXPECT_EQ(dispatcher_.counters().local_bytes, 1u << 20);
}

TEST_F(DispatcherTest, DevicesWithoutRoomForTheOutputsAreLeftOut) {
  AddWorker(1, 1, {0, 1});
  store_.room[0] = 1000;
  store_.room[kHostMemory] = 1000;
  Submit({.function = "f", .resources = {.cpu = 0, .gpu = 1}, .output_bytes = 4096});
  auto sent = Round();
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].device, 1);

  // A CPU task whose outputs do not fit in host memory waits, though CPU is free.
  Task& waits = Submit({.function = "f", .output_bytes = 4096});
  EXPECT_TRUE(Round().empty());
  EXPECT_EQ(waits.state, TaskState::kReady);
  EXPECT_FALSE(dispatcher_.Stalled(waits.id));
  store_.room[kHostMemory] = 1 << 20;
  EXPECT_EQ(Round().size(), 1u);
}

// A declared size is a hint: when no placed task could end and free room, the first ready
// task starts whatever it declared (its create then meets the store's own check), so that a
// declaration too large, or a store filled by others, never holds a graph up for good.
TEST_F(DispatcherTest, ADeclaredOutputWithoutRoomStartsWhenNothingElseCouldFreeAny) {
  AddWorker(1, 4);
  store_.room[kHostMemory] = 1000;
  Task& first = Submit({.function = "f", .output_bytes = 4096});
  Task& second = Submit({.function = "f", .output_bytes = 4096});
  auto sent = Round();
  ASSERT_EQ(sent.size(), 1u) << "one starts: then it may free room for the other";
  EXPECT_EQ(sent[0].task, first.id);
  EXPECT_EQ(second.state, TaskState::kReady);
  EXPECT_TRUE(Round().empty()) << "the other waits while the first runs";

  // The first waits for room itself (it lent what it held): nothing placed could free any.
  ASSERT_TRUE(table_.Lend(first));
  sent = Round();
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].task, second.id);
}

// Declarations are summed exactly: huge ones (a hostile client may declare 2**64 - 1 each)
// neither wrap the reservation nor make room appear for others.
TEST_F(DispatcherTest, HugeDeclaredOutputsDoNotWrapTheReservation) {
  AddWorker(1, 4);
  store_.room[kHostMemory] = 1 << 20;
  constexpr uint64_t kMost = std::numeric_limits<uint64_t>::max();
  Task& huge = Submit({.function = "f", .output_bytes = kMost});
  EXPECT_EQ(Round().size(), 1u) << "nothing else runs: it starts all the same";
  Task& another = Submit({.function = "f", .output_bytes = kMost});
  ASSERT_TRUE(table_.Lend(huge));
  EXPECT_EQ(Round().size(), 1u);
  EXPECT_EQ(table_.Reserved(kHostMemory), kMost) << "2 * (2**64 - 1), saturated for the view";
  Task& small = Submit({.function = "f", .output_bytes = 4096});
  EXPECT_TRUE(Round().empty()) << "the sum did not wrap to a small number";
  EXPECT_EQ(small.state, TaskState::kReady);
  for (Task* t : {&huge, &another}) {
    dispatcher_.Forget(*t);
    table_.Unplace(*t);
    graph_.Finish(*t, TaskState::kDone, "");
  }
  EXPECT_EQ(table_.Reserved(kHostMemory), 0u);
  EXPECT_EQ(Round().size(), 1u);
}

// The outputs a placed task will make count against the room before they exist: many
// producers placed at once cannot together overshoot what the store has.
TEST_F(DispatcherTest, TheOutputsOfPlacedTasksCountAgainstTheRoom) {
  AddWorker(1, 8);
  store_.room[kHostMemory] = 10'000;
  std::vector<TaskId> tasks;
  for (int i = 0; i < 4; ++i) tasks.push_back(Submit({.function = "f", .output_bytes = 4096}).id);
  auto sent = Round();
  ASSERT_EQ(sent.size(), 2u) << "two outputs of 4096 fit in 10,000, a third does not";
  EXPECT_EQ(table_.Reserved(kHostMemory), 2u * 4096);
  EXPECT_EQ(dispatcher_.ready(), 2u);

  // One ends: its reservation goes with it (its output, now stored, is the store's to
  // count), and the next one starts.
  Task& first = graph_.at(sent[0].task);
  dispatcher_.Forget(first);
  table_.Unplace(first);
  graph_.Finish(first, TaskState::kDone, "");
  EXPECT_EQ(table_.Reserved(kHostMemory), 4096u);
  sent = Round();
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(table_.Reserved(kHostMemory), 2u * 4096);
  // A task that declares nothing is not held back by what others reserved.
  Submit({.function = "f"});
  EXPECT_EQ(Round().size(), 1u);
}

// Work stealing: once the ready tasks have run out, a worker left idle takes a task queued
// behind a long wait on another (here a task running far past its estimate); behind a
// short wait, or bound to its worker's GPU, a queued task stays.
TEST_F(DispatcherTest, AnIdleWorkerTakesATaskQueuedBehindAStraggler) {
  AddWorker(1, 1, {0});
  const TaskId straggler = Submit({.function = "f"}).id;
  const TaskId behind = Submit({.function = "f"}).id;
  Submit({.function = "f", .resources = {.cpu = 0, .gpu = 1}});  // holds the GPU
  const ObjectId on_gpu0 = store_.Put(1 << 20, 0);
  const TaskId bound = Submit({.function = "f",
                               .inputs = {on_gpu0},
                               .resources = {.cpu = 0, .gpu = 1},
                               .affinity = Affinity::kHard})
                           .id;
  auto sent = Round();
  ASSERT_EQ(sent.size(), 2u);  // the straggler on the CPU, the other on the GPU
  EXPECT_EQ(graph_.at(behind).state, TaskState::kQueued);
  EXPECT_EQ(graph_.at(bound).state, TaskState::kQueued);
  EXPECT_EQ(graph_.at(straggler).state, TaskState::kRunning);

  // A second worker attaches while the wait is short (estimates of 1 ms): nothing moves.
  AddWorker(2, 1, {1});
  EXPECT_TRUE(Round().empty());
  EXPECT_EQ(dispatcher_.counters().steals, 0u);

  // A second later, the tasks there have run far past their estimates: the CPU task moves
  // to the idle worker and starts; the one bound to GPU 0 stays.
  now_ = 1.0;
  sent = Round();
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].task, behind);
  EXPECT_EQ(sent[0].worker, 2u);
  EXPECT_EQ(dispatcher_.counters().steals, 1u);
  EXPECT_EQ(graph_.at(bound).state, TaskState::kQueued);
  EXPECT_EQ(graph_.at(bound).worker, 1u);
  // Nothing else to take: later rounds move nothing.
  EXPECT_TRUE(Round().empty());
  EXPECT_EQ(dispatcher_.counters().steals, 1u);
}

TEST_F(DispatcherTest, TasksOfAShapeThatFoundNoPlaceArePassedOverInARound) {
  AddWorker(1, 4);
  Submit({.function = "f"});
  EXPECT_EQ(Round().size(), 1u);  // runs, and may free room
  store_.room[kHostMemory] = 0;
  for (int i = 0; i < 10; ++i) Submit({.function = "f", .output_bytes = 100});
  const uint64_t tries = dispatcher_.counters().tries;
  EXPECT_TRUE(Round().empty());
  EXPECT_EQ(dispatcher_.counters().tries, tries + 1);  // one looked at; nine of its shape not
  EXPECT_EQ(dispatcher_.ready(), 10u);
}

TEST_F(DispatcherTest, AQueuedTaskHasItsInputsPrefetchedWhereItWillReadThem) {
  AddWorker(1, 0, {0});
  Submit({.function = "f", .resources = {.cpu = 0, .gpu = 1}});  // holds the GPU
  const ObjectId data = store_.Put(1 << 20, kHostMemory);
  const ObjectId pickle = store_.Put(4096, 1);
  Submit({.function = "f",
          .inputs = {pickle, data},
          .resources = {.cpu = 0, .gpu = 1},
          .host_inputs = {0}});
  auto sent = Round();
  ASSERT_EQ(sent.size(), 1u);  // the second queues behind the first
  EXPECT_EQ(store_.prefetched,
            (std::vector<std::pair<ObjectId, int32_t>>{{data, 0}, {pickle, kHostMemory}}));
  EXPECT_EQ(dispatcher_.counters().prefetches, 2u);
}

TEST_F(DispatcherTest, TheVariantExpectedToFinishFirstIsChosenAndTheOtherExploredNowAndThen) {
  std::vector<int32_t> gpus;
  for (int32_t d = 0; d < 40; ++d) gpus.push_back(d);
  AddWorker(1, 64, gpus, {"f"});
  durations_.Record({"f"}, /*on_gpu=*/false, 0, 1.0);
  durations_.Record({"f"}, /*on_gpu=*/true, 0, 0.001);
  std::vector<Task*> tasks;
  for (int i = 0; i < 33; ++i) tasks.push_back(&Submit({.function = "f"}));
  auto sent = Round();
  ASSERT_EQ(sent.size(), 33u);
  for (int i = 0; i < 32; ++i) {
    EXPECT_EQ(tasks[i]->variant, "gpu") << i;
    EXPECT_EQ(tasks[i]->variant_reason.rfind("expected to finish first: gpu", 0), 0u)
        << tasks[i]->variant_reason;
    EXPECT_GE(sent[i].device, 0);
  }
  EXPECT_EQ(tasks[32]->variant, "cpu");
  EXPECT_EQ(tasks[32]->variant_reason.rfind("exploring: cpu not run for the last 32", 0), 0u)
      << tasks[32]->variant_reason;
  EXPECT_EQ(sent[32].device, kHostMemory);
}

TEST_F(DispatcherTest, EachKindOfAFunctionGetsTheVariantFastestForIt) {
  // depot.dask runs every Dask task through one function: a layer of products may be faster
  // on a GPU while a layer of small sums is faster on a CPU.
  AddWorker(1, 8, {0, 1, 2, 3}, {"f"});
  durations_.Record({"f", "product"}, /*on_gpu=*/false, 0, 1.0);
  durations_.Record({"f", "product"}, /*on_gpu=*/true, 0, 0.001);
  durations_.Record({"f", "sum"}, /*on_gpu=*/false, 0, 0.001);
  durations_.Record({"f", "sum"}, /*on_gpu=*/true, 0, 1.0);
  Task& product = Submit({.function = "f", .kind = "product"});
  Task& sum = Submit({.function = "f", .kind = "sum"});
  auto sent = Round();
  ASSERT_EQ(sent.size(), 2u);
  EXPECT_EQ(product.variant, "gpu") << product.variant_reason;
  EXPECT_EQ(sum.variant, "cpu") << sum.variant_reason;
}

TEST_F(DispatcherTest, ARequeuedTaskIsPlacedAfresh) {
  AddWorker(1, 1, {0}, {"f"});
  durations_.Record({"f"}, false, 0, 1.0);
  durations_.Record({"f"}, true, 0, 0.001);
  Task& task = Submit({.function = "f"});
  ASSERT_EQ(Round().size(), 1u);
  EXPECT_EQ(task.variant, "gpu");
  dispatcher_.Requeue(task);  // its worker ended, say
  EXPECT_EQ(task.state, TaskState::kReady);
  EXPECT_EQ(task.device, kHostMemory);
  EXPECT_TRUE(task.variant.empty());
  EXPECT_EQ(table_.Find(1)->resources.free_share(0), 1);
  auto sent = Round();
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].device, 0);
}

}  // namespace
}  // namespace depot::scheduler
