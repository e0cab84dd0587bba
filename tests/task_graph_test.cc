// The task graph on its own, against a fake store: admission and validation, readiness, the
// graph's references, and failure cascades. Nothing is placed: tasks found ready are only
// recorded, as the dispatcher would queue them.
#include "scheduler/task_graph.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "scheduler_fakes.h"

namespace depot::scheduler {
namespace {

class TaskGraphTest : public ::testing::Test {
 protected:
  static constexpr size_t kKept = 8;

  TaskGraphTest()
      : graph_(store_, kKept, [this](Task& task) {
          task.state = TaskState::kReady;
          ready_.push_back(task.id);
        }) {}

  static TaskSpec Spec(std::vector<ObjectId> inputs = {}) {
    return TaskSpec{.function = "f", .inputs = std::move(inputs)};
  }
  // Adds one task; its outputs.
  std::vector<ObjectId> Add(const TaskSpec& spec) {
    auto out = graph_.Add(100, std::span(&spec, 1), runnable_);
    EXPECT_TRUE(out.ok()) << out.status().ToString();
    return out.ok() ? out.value()[0] : std::vector<ObjectId>{};
  }
  Status AddStatus(const std::vector<TaskSpec>& specs) {
    return graph_.Add(100, specs, runnable_).status();
  }
  // The pending task making `output`.
  Task& Producer(const ObjectId& output) {
    Task* t = graph_.ProducerOf(output);
    EXPECT_NE(t, nullptr);
    return *t;
  }
  // Runs `task` as a worker would: seals its outputs (the store tells the graph), then the
  // task is done.
  void Run(Task& task) {
    for (const ObjectId& o : task.outputs) store_.Seal(o, 1024);
    store_.Deliver(events_);
    graph_.Finish(task, TaskState::kDone, "");
    graph_.Settle();
  }
  const Task* Finished(const ObjectId& output) const {
    for (const auto& t : graph_.finished()) {
      for (const ObjectId& o : t->outputs) {
        if (o == output) return t.get();
      }
    }
    return nullptr;
  }

  // The store's events go to the graph, as Scheduler's ObjectEvents pass them on.
  struct Events final : ObjectEvents {
    explicit Events(TaskGraph& g) : graph(g) {}
    void OnSealed(const ObjectId& id, bool failed) override { graph.OnSealed(id, failed); }
    void OnFreed(const ObjectId& id) override { graph.OnFreed(id); }
    void OnMemory(const ObjectId&, bool) override {}  // the graph keeps no bounds
    TaskGraph& graph;
  };

  FakeStore store_;
  std::vector<TaskId> ready_;
  std::function<bool(const TaskSpec&)> runnable_ = [](const TaskSpec&) { return true; };
  TaskGraph graph_;
  Events events_{graph_};
};

TEST_F(TaskGraphTest, ATaskWhoseInputsAreSealedIsReadyAtOnceAndTheGraphHoldsThem) {
  const ObjectId a = store_.Put(10);
  const auto out = Add(Spec({a, a}));
  ASSERT_EQ(ready_.size(), 1u);
  EXPECT_EQ(graph_.at(ready_[0]).outputs, out);
  EXPECT_EQ(store_.HoldsOn(a), 1);  // one reference, however often it is read
  EXPECT_TRUE(graph_.IsRead(a));

  Run(Producer(out[0]));
  EXPECT_EQ(store_.HoldsOn(a), 0);  // its last consumer is done
  EXPECT_FALSE(graph_.IsRead(a));
  EXPECT_EQ(graph_.nodes(), 0u);
  EXPECT_EQ(graph_.counters().completed, 1u);
}

TEST_F(TaskGraphTest, ATaskWaitsUntilEachOfItsInputsIsSealed) {
  const ObjectId a = store_.Creating();
  const ObjectId b = store_.Creating();
  const auto out = Add(Spec({a, b, a}));
  EXPECT_TRUE(ready_.empty());
  EXPECT_EQ(Producer(out[0]).missing, 3u);

  store_.Seal(a, 10);
  store_.Deliver(events_);
  EXPECT_TRUE(ready_.empty());
  EXPECT_EQ(Producer(out[0]).missing, 1u);
  store_.Seal(b, 10);
  store_.Deliver(events_);
  ASSERT_EQ(ready_.size(), 1u);
  EXPECT_EQ(store_.HoldsOn(a), 1);
  EXPECT_EQ(store_.HoldsOn(b), 1);
}

TEST_F(TaskGraphTest, ConsumersWaitForTheirProducerToFinishNotForEachOutputsSeal) {
  TaskSpec producer = Spec();
  producer.num_outputs = 2;
  const auto outs = Add(producer);
  const auto consumer = Add(Spec({outs[0]}));
  ASSERT_EQ(ready_.size(), 1u);  // the producer

  // The worker seals one output while the task still runs: its consumer still waits, since
  // its producer holds the device until it is done.
  store_.Seal(outs[0], 10);
  store_.Deliver(events_);
  EXPECT_EQ(ready_.size(), 1u);
  EXPECT_EQ(Producer(consumer[0]).depth, 1u);

  Run(Producer(outs[0]));
  ASSERT_EQ(ready_.size(), 2u);
  EXPECT_EQ(graph_.at(ready_[1]).outputs, consumer);
  EXPECT_EQ(store_.HoldsOn(outs[0]), 1);  // held for the consumer
  EXPECT_EQ(store_.HoldsOn(outs[1]), 0);  // read by none: not held
}

TEST_F(TaskGraphTest, AFailureCascadesDownAChainWithItsReason) {
  std::vector<std::vector<ObjectId>> chain{Add(Spec())};
  for (int i = 0; i < 3; ++i) chain.push_back(Add(Spec({chain.back()[0]})));
  graph_.Finish(Producer(chain[0][0]), TaskState::kFailed, "boom");
  // The readers fail at Settle, one at a time, each naming the input that failed.
  EXPECT_EQ(graph_.counters().failed, 1u);
  graph_.Settle();
  EXPECT_EQ(graph_.counters().failed, 4u);
  EXPECT_TRUE(graph_.pending().empty());
  EXPECT_EQ(graph_.nodes(), 0u);
  EXPECT_EQ(store_.TotalHolds(), 0);
  for (size_t i = 0; i < chain.size(); ++i) {
    const Task* t = Finished(chain[i][0]);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->state, TaskState::kFailed);
    EXPECT_NE(t->reason.find("boom"), std::string::npos) << t->reason;
    if (i > 0) {
      EXPECT_NE(t->reason.find(chain[i - 1][0].Hex()), std::string::npos) << t->reason;
    }
    EXPECT_EQ(store_.objects.at(chain[i][0]).state, StoreAccess::State::kFailed);
  }
}

TEST_F(TaskGraphTest, AFailureCascadesDownAVeryLongChainWithoutRecursion) {
  // Deep enough that one stack frame per task would overflow the stack.
  constexpr int kLength = 50'000;
  std::vector<TaskSpec> specs(kLength, Spec());
  for (int i = 0; i < kLength; ++i) specs[i].outputs = {ObjectId::Random()};
  for (int i = 1; i < kLength; ++i) specs[i].inputs = {specs[i - 1].outputs[0]};
  ASSERT_TRUE(AddStatus(specs).ok());
  graph_.Finish(Producer(specs[0].outputs[0]), TaskState::kFailed, "boom");
  graph_.Settle();
  EXPECT_EQ(graph_.counters().failed, static_cast<uint64_t>(kLength));
  EXPECT_TRUE(graph_.pending().empty());
  EXPECT_EQ(graph_.nodes(), 0u);
  EXPECT_EQ(graph_.finished().size(), kKept);
}

TEST_F(TaskGraphTest, OutputsSealedBeforeAFailureStillReachTheirConsumers) {
  TaskSpec producer = Spec();
  producer.num_outputs = 2;
  const auto outs = Add(producer);
  const auto gets_sealed = Add(Spec({outs[0]}));
  const auto gets_failure = Add(Spec({outs[1]}));
  store_.Seal(outs[0], 10);
  store_.Deliver(events_);
  graph_.Finish(Producer(outs[0]), TaskState::kFailed, "died half way");
  graph_.Settle();
  EXPECT_NE(graph_.ProducerOf(gets_sealed[0]), nullptr);
  EXPECT_EQ(graph_.at(ready_.back()).outputs, gets_sealed);
  ASSERT_NE(Finished(gets_failure[0]), nullptr);
  EXPECT_EQ(Finished(gets_failure[0])->state, TaskState::kFailed);
}

TEST_F(TaskGraphTest, AnInputThatFailedFailsTheTaskAtOnce) {
  const ObjectId bad = store_.Creating();
  store_.objects[bad] = {StoreAccess::State::kFailed, 0, 0, "it broke", 0};
  const auto out = Add(Spec({bad}));
  EXPECT_TRUE(ready_.empty());
  ASSERT_NE(Finished(out[0]), nullptr);
  EXPECT_NE(Finished(out[0])->reason.find("it broke"), std::string::npos);
  EXPECT_EQ(store_.objects.at(out[0]).state, StoreAccess::State::kFailed);
}

TEST_F(TaskGraphTest, AnInputDeletedBeforeItsSealFailsItsReadersButAProducersOutputDoesNot) {
  const ObjectId a = store_.Creating();
  const auto reader = Add(Spec({a}));
  const auto produced = Add(Spec());
  const auto reads_output = Add(Spec({produced[0]}));

  // The worker's partial output goes (its task will retry or fail): its reader waits on.
  store_.Free(produced[0]);
  store_.Deliver(events_);
  EXPECT_NE(graph_.ProducerOf(reads_output[0]), nullptr);

  store_.Free(a);
  store_.Deliver(events_);
  ASSERT_NE(Finished(reader[0]), nullptr);
  EXPECT_NE(Finished(reader[0])->reason.find("deleted or aborted before it was sealed"),
            std::string::npos);
}

TEST_F(TaskGraphTest, ABatchIsAddedWholeOrNotAtAllAndSaysWhy) {
  const ObjectId exists = store_.Put(10);
  auto expect = [&](const std::vector<TaskSpec>& specs, StatusCode code, const std::string& text) {
    Status s = AddStatus(specs);
    EXPECT_EQ(s.code(), code) << s.ToString();
    EXPECT_NE(s.message().find(text), std::string::npos) << s.ToString();
    EXPECT_TRUE(graph_.pending().empty());
    EXPECT_EQ(graph_.nodes(), 0u);
    EXPECT_EQ(store_.charged[100], 0);
  };
  TaskSpec a = Spec(), b = Spec();
  a.outputs = {ObjectId::Random()};
  b.outputs = {ObjectId::Random()};
  a.inputs = {b.outputs[0]};
  b.inputs = {a.outputs[0]};
  expect({Spec(), a, b}, StatusCode::kInvalidArgument, "tasks 1, 2 read each other's outputs");
  TaskSpec twice = Spec();
  twice.outputs = {exists};
  expect({twice}, StatusCode::kAlreadyExists, "exists already");
  expect({Spec(), Spec({ObjectId::Random()})}, StatusCode::kNotFound,
         "task 1: input " /* ... neither exists nor is the output of a task */);
  TaskSpec no_name = Spec();
  no_name.function.clear();
  expect({no_name}, StatusCode::kInvalidArgument, "task 0: a function name must have");
  TaskSpec long_label = Spec();
  long_label.label.assign(kMaxLabel + 1, 'k');
  expect({Spec(), long_label}, StatusCode::kInvalidArgument,
         "task 1: a label of 257 bytes is over 256");
  runnable_ = [](const TaskSpec&) { return false; };
  expect({Spec()}, StatusCode::kInvalidArgument, "task 0: no worker attached can run 'f'");
  runnable_ = [](const TaskSpec&) { return true; };
  store_.charge_limit = 100;
  expect({Spec()}, StatusCode::kLimitExceeded, "");
  EXPECT_EQ(graph_.counters().submitted, 0u);
}

TEST_F(TaskGraphTest, WhatATaskCostsIsChargedToItsSubmitterUntilItIsOver) {
  const auto out = Add(Spec({store_.Put(10)}));
  EXPECT_GT(store_.charged[100], 0);
  Run(Producer(out[0]));
  EXPECT_EQ(store_.charged[100], 0);
}

TEST_F(TaskGraphTest, FinishedTasksAreKeptUpToTheBoundOldestGoingFirst) {
  std::vector<ObjectId> outputs;
  for (size_t i = 0; i < kKept + 3; ++i) {
    outputs.push_back(Add(Spec())[0]);
    Run(Producer(outputs.back()));
  }
  EXPECT_EQ(graph_.finished().size(), kKept);
  EXPECT_FALSE(graph_.MadeByFinished(outputs[0]));
  EXPECT_FALSE(graph_.MadeByFinished(outputs[2]));
  EXPECT_TRUE(graph_.MadeByFinished(outputs[3]));
  EXPECT_TRUE(graph_.MadeByFinished(outputs.back()));
}

TEST_F(TaskGraphTest, ARetryKeepsWhatAnEarlierAttemptSealedUntilItIsOver) {
  TaskSpec spec = Spec();
  spec.num_outputs = 3;
  const auto outs = Add(spec);
  store_.Seal(outs[1], 10);
  store_.Deliver(events_);
  Task& task = Producer(outs[0]);
  EXPECT_EQ(graph_.KeepSealedOutputs(task), std::vector<uint32_t>{1});
  EXPECT_EQ(store_.HoldsOn(outs[1]), 1);
  // Asked again (a third attempt), it holds each once.
  EXPECT_EQ(graph_.KeepSealedOutputs(task), std::vector<uint32_t>{1});
  EXPECT_EQ(store_.HoldsOn(outs[1]), 1);
  Run(task);
  EXPECT_EQ(store_.TotalHolds(), 0);
}

TEST_F(TaskGraphTest, AnOutputGivenUpIsDeletedOnceItsLastReaderHasFinished) {
  const auto made = Add(Spec());
  const auto first = Add(Spec({made[0]}));
  const auto second = Add(Spec({made[0], made[0]}));
  EXPECT_TRUE(graph_.DeleteAfterTasks(made[0]));  // before it is even made
  Run(Producer(made[0]));
  EXPECT_EQ(store_.HoldsOn(made[0]), 1);
  Run(Producer(first[0]));
  EXPECT_TRUE(store_.deleted.empty());
  Run(Producer(second[0]));
  EXPECT_EQ(store_.deleted, std::vector<ObjectId>{made[0]});
  EXPECT_FALSE(store_.objects.contains(made[0]));
  EXPECT_TRUE(store_.objects.contains(second[0]));  // results are the client's to delete
  EXPECT_EQ(graph_.nodes(), 0u);
}

TEST_F(TaskGraphTest, AnObjectNoPendingTaskReadsOrMakesIsLeftToTheCaller) {
  const ObjectId put = store_.Put(10);
  EXPECT_FALSE(graph_.DeleteAfterTasks(put));
  EXPECT_FALSE(graph_.DeleteAfterTasks(ObjectId::Random()));
  const auto done = Add(Spec());
  Run(Producer(done[0]));
  EXPECT_FALSE(graph_.DeleteAfterTasks(done[0]));
  EXPECT_TRUE(store_.deleted.empty());
  // An input a client put, given up while a task reads it, goes after that task.
  const auto reader = Add(Spec({put}));
  EXPECT_TRUE(graph_.DeleteAfterTasks(put));
  Run(Producer(reader[0]));
  EXPECT_EQ(store_.deleted, std::vector<ObjectId>{put});
}

TEST_F(TaskGraphTest, AnOutputGivenUpWithNoReaderGoesWhenItsProducerFinishes) {
  const auto made = Add(Spec());
  EXPECT_TRUE(graph_.DeleteAfterTasks(made[0]));
  Run(Producer(made[0]));
  EXPECT_EQ(store_.deleted, std::vector<ObjectId>{made[0]});
}

TEST_F(TaskGraphTest, FailedIntermediatesGivenUpAreDeletedToo) {
  const auto made = Add(Spec());
  const auto middle = Add(Spec({made[0]}));
  const auto last = Add(Spec({middle[0]}));
  EXPECT_TRUE(graph_.DeleteAfterTasks(made[0]));
  EXPECT_TRUE(graph_.DeleteAfterTasks(middle[0]));
  graph_.Finish(Producer(made[0]), TaskState::kFailed, "boom");
  graph_.Settle();
  EXPECT_EQ(graph_.counters().failed, 3u);
  std::sort(store_.deleted.begin(), store_.deleted.end());
  std::vector<ObjectId> expected{made[0], middle[0]};
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(store_.deleted, expected);
  // The result the client kept is there, failed, for its get to say why.
  EXPECT_EQ(store_.objects.at(last[0]).state, StoreAccess::State::kFailed);
}

TEST_F(TaskGraphTest, DerivedOutputIdsAreDistinctAcrossTasksAndIndices) {
  TaskSpec spec = Spec();
  spec.num_outputs = 4;
  auto first = Add(spec);
  auto second = Add(spec);
  std::set<ObjectId> all(first.begin(), first.end());
  all.insert(second.begin(), second.end());
  EXPECT_EQ(all.size(), 8u);
}

}  // namespace
}  // namespace depot::scheduler
