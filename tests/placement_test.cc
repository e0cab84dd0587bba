// Placement on its own: where a task goes, given where its inputs are and what workers have.
#include "scheduler/placement.h"

#include <gtest/gtest.h>

namespace depot::scheduler {
namespace {

constexpr uint64_t kHost = 1;  // tiers bit of host memory
constexpr uint64_t Gpu(int k) { return uint64_t{1} << (k + 1); }
constexpr uint64_t kMiB = 1 << 20;

// A worker with `cpu` free slots and a whole free share of each GPU in `gpus`.
WorkerView Worker(double cpu, std::vector<int32_t> gpus = {}, double wait_s = 0) {
  WorkerView w;
  w.free_cpu = cpu;
  for (int32_t d : gpus) w.gpus.push_back({d, 1.0});
  w.queue_wait_s = wait_s;
  return w;
}

const ResourceRequest kGpuTask{.cpu = 0, .gpu = 1};
const Durations kBoth{.cpu = 0.010, .gpu = 0.001};
const Bandwidths kBw{};

TEST(PlacementTest, AGpuTaskGoesToTheDeviceHoldingItsInput) {
  const std::vector<InputView> inputs{{256 * kMiB, Gpu(1)}};
  const std::vector<WorkerView> workers{Worker(1, {0}), Worker(1, {1})};
  auto c = Place(kGpuTask, Affinity::kNone, inputs, workers, kBoth, kBw);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->worker, 1u);
  EXPECT_EQ(c->device, 1);
  EXPECT_EQ(c->transfer_s, 0);
  EXPECT_EQ(c->local_bytes, 256 * kMiB);
  EXPECT_EQ(c->moved_bytes, 0u);
}

TEST(PlacementTest, ABusyHolderLosesToAnIdleDeviceWhenTheCopyIsShorterThanTheWait) {
  const std::vector<InputView> inputs{{1 * kMiB, Gpu(1)}};
  // Moving 1 MiB peer to peer takes about 50 µs; the holder is busy for a second.
  const std::vector<WorkerView> workers{Worker(1, {0}), Worker(1, {1}, 1.0)};
  auto c = Place(kGpuTask, Affinity::kNone, inputs, workers, kBoth, kBw);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->device, 0);
  EXPECT_EQ(c->moved_bytes, kMiB);
  EXPECT_NEAR(c->transfer_s, static_cast<double>(kMiB) / kBw.gpu_to_gpu, 1e-12);
}

TEST(PlacementTest, TransfersCostWhatTheirPathCosts) {
  const std::vector<InputView> on_host{{kMiB, kHost}};
  const std::vector<InputView> on_gpu0{{kMiB, Gpu(0)}};
  const double mib = static_cast<double>(kMiB);
  EXPECT_DOUBLE_EQ(TransferTo(1, on_host, kBw).seconds, mib / kBw.host_to_gpu);
  EXPECT_DOUBLE_EQ(TransferTo(1, on_gpu0, kBw).seconds, mib / kBw.gpu_to_gpu);
  EXPECT_DOUBLE_EQ(TransferTo(kHostMemory, on_gpu0, kBw).seconds, mib / kBw.gpu_to_host);
  EXPECT_DOUBLE_EQ(TransferTo(kHostMemory, on_host, kBw).seconds, 0);
}

TEST(PlacementTest, AGpuTaskThatHoldsNoCpuStartsWhileEveryCpuSlotIsBusy) {
  const std::vector<WorkerView> workers{Worker(0, {0})};
  EXPECT_TRUE(Place(kGpuTask, Affinity::kNone, {}, workers, kBoth, kBw).has_value());
  const ResourceRequest with_cpu{.cpu = 1, .gpu = 1};
  EXPECT_FALSE(Place(with_cpu, Affinity::kNone, {}, workers, kBoth, kBw).has_value());
}

TEST(PlacementTest, FractionalSharesFitOnlyWhereThatMuchIsFree) {
  WorkerView w = Worker(0);
  w.gpus.push_back({0, 0.25});
  const std::vector<WorkerView> workers{w};
  const ResourceRequest quarter{.cpu = 0, .gpu = 0.25};
  EXPECT_TRUE(Place(quarter, Affinity::kNone, {}, workers, kBoth, kBw).has_value());
  const ResourceRequest third{.cpu = 0, .gpu = 0.34};
  EXPECT_FALSE(Place(third, Affinity::kNone, {}, workers, kBoth, kBw).has_value());
}

TEST(PlacementTest, CustomResourcesMustBeFree) {
  WorkerView with_ssd = Worker(1);
  with_ssd.free_custom["ssd"] = 1;
  const std::vector<WorkerView> workers{Worker(4), with_ssd};
  const ResourceRequest needs_ssd{.cpu = 1, .gpu = 0, .custom = {{"ssd", 1}}};
  auto c = Place(needs_ssd, Affinity::kNone, {}, workers, kBoth, kBw);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->worker, 1u);
  const ResourceRequest needs_two{.cpu = 1, .gpu = 0, .custom = {{"ssd", 2}}};
  EXPECT_FALSE(Place(needs_two, Affinity::kNone, {}, workers, kBoth, kBw).has_value());
}

TEST(PlacementTest, HardAffinityWaitsForTheHolderAndSoftFallsBack) {
  const std::vector<InputView> inputs{{kMiB, Gpu(1)}, {4 * kMiB, Gpu(1) | kHost}};
  WorkerView holder = Worker(1, {1});
  holder.gpus[0].free_share = 0;  // busy
  const std::vector<WorkerView> workers{Worker(1, {0}), holder};
  EXPECT_FALSE(Place(kGpuTask, Affinity::kHard, inputs, workers, kBoth, kBw).has_value());
  auto soft = Place(kGpuTask, Affinity::kSoft, inputs, workers, kBoth, kBw);
  ASSERT_TRUE(soft.has_value());
  EXPECT_EQ(soft->device, 0);
  // Free again: both take the holder, even when it is slower than an idle device.
  const std::vector<WorkerView> free_again{Worker(1, {0}), Worker(1, {1}, 1.0)};
  for (Affinity a : {Affinity::kHard, Affinity::kSoft}) {
    auto c = Place(kGpuTask, a, inputs, free_again, kBoth, kBw);
    ASSERT_TRUE(c.has_value());
    EXPECT_EQ(c->device, 1);
  }
}

TEST(PlacementTest, AffinityOfAGpuTaskIsToTheGpuHoldingMostInputNotToHostMemory) {
  // Most bytes are in host memory, the rest on GPU 1: the GPU task's affinity is to GPU 1.
  const std::vector<InputView> inputs{{8 * kMiB, kHost}, {kMiB, Gpu(1)}};
  const std::vector<WorkerView> workers{Worker(1, {0}), Worker(1, {1}, 1.0)};
  auto hard = Place(kGpuTask, Affinity::kHard, inputs, workers, kBoth, kBw);
  ASSERT_TRUE(hard.has_value());
  EXPECT_EQ(hard->device, 1);
  // Inputs in host memory only: no GPU holds any, so affinity changes nothing.
  const std::vector<InputView> host_only{{kMiB, kHost}};
  auto any = Place(kGpuTask, Affinity::kHard, host_only, workers, kBoth, kBw);
  ASSERT_TRUE(any.has_value());
  EXPECT_EQ(any->device, 0);
  EXPECT_EQ(DeviceWithMostInput(inputs, /*gpus_only=*/true), 1);
  EXPECT_EQ(DeviceWithMostInput(host_only, /*gpus_only=*/true), std::nullopt);
  // A CPU task reads in host memory wherever it runs: hard affinity still places it.
  const std::vector<InputView> on_gpu{{kMiB, Gpu(0)}};
  EXPECT_TRUE(Place(ResourceRequest{}, Affinity::kHard, on_gpu, workers, kBoth, kBw).has_value());
}

TEST(PlacementTest, ACpuTaskReadsInHostMemory) {
  const std::vector<InputView> inputs{{2 * kMiB, Gpu(0)}, {kMiB, kHost}};
  const std::vector<WorkerView> workers{Worker(1, {0})};
  auto c = Place(ResourceRequest{}, Affinity::kNone, inputs, workers, kBoth, kBw);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->device, kHostMemory);
  EXPECT_EQ(c->local_bytes, kMiB);
  EXPECT_EQ(c->moved_bytes, 2 * kMiB);
  EXPECT_DOUBLE_EQ(c->finish_s, c->transfer_s + kBoth.cpu);
}

TEST(PlacementTest, AFunctionWithNoVariantForTheDeviceKindIsNotPlaced) {
  const std::vector<WorkerView> workers{Worker(1, {0})};
  const Durations cpu_only{.cpu = 0.01, .gpu = -1};
  EXPECT_FALSE(Place(kGpuTask, Affinity::kNone, {}, workers, cpu_only, kBw).has_value());
}

TEST(PlacementTest, TheDeviceWithMostInputPrefersHostMemoryOnATie) {
  const std::vector<InputView> tie{{kMiB, kHost}, {kMiB, Gpu(2)}};
  EXPECT_EQ(DeviceWithMostInput(tie), kHostMemory);
  const std::vector<InputView> gpu_ahead{{kMiB, kHost | Gpu(2)}, {kMiB, Gpu(2)}};
  EXPECT_EQ(DeviceWithMostInput(gpu_ahead), 2);
  EXPECT_EQ(DeviceWithMostInput({}), std::nullopt);
}

}  // namespace
}  // namespace depot::scheduler
