// A worker's resource ledger on its own: reservations never oversubscribe, releases give
// back exactly what was taken.
#include "scheduler/resources.h"

#include <gtest/gtest.h>

#include <random>

namespace depot::scheduler {
namespace {

Resources Make(const Capacity& c) {
  auto r = Resources::Make(c);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return std::move(r).value();
}

TEST(ResourcesTest, BadCapacitiesAreRefusedSayingWhy) {
  EXPECT_EQ(Resources::Make({.cpu = -1}).status().code(), StatusCode::kInvalidArgument);
  auto twice = Resources::Make({.cpu = 1, .gpus = {0, 0}});
  EXPECT_EQ(twice.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(twice.status().message().find("offered twice"), std::string::npos);
  EXPECT_EQ(Resources::Make({.cpu = 1, .gpus = {-3}}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(Resources::Make({.cpu = 1, .custom = {{"ssd", -1}}}).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(ResourcesTest, FourQuarterSharesFillADeviceAndAFifthWaits) {
  Resources r = Make({.cpu = 0, .gpus = {1}});
  const ResourceRequest quarter{.cpu = 0, .gpu = 0.25};
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(r.Reserve(quarter, 1)) << i;
  EXPECT_FALSE(r.Reserve(quarter, 1));
  r.Release({quarter, 1});
  EXPECT_TRUE(r.Reserve(quarter, 1));
}

TEST(ResourcesTest, AGpuTaskWithNoCpuFitsWhenEveryCpuSlotIsTaken) {
  Resources r = Make({.cpu = 1, .gpus = {0}});
  EXPECT_TRUE(r.Reserve(ResourceRequest{}, kHostMemory));  // the one CPU slot
  EXPECT_FALSE(r.Reserve(ResourceRequest{}, kHostMemory));
  EXPECT_TRUE(r.Reserve({.cpu = 0, .gpu = 1}, 0));
  EXPECT_FALSE(r.Reserve({.cpu = 1, .gpu = 0}, 0)) << "a CPU task is placed in host memory";
  EXPECT_FALSE(r.Reserve({.cpu = 0, .gpu = 0.5}, 7)) << "not one of its GPUs";
}

TEST(ResourcesTest, ExhaustedOnlyWhenNeitherACpuNorAGpuShareIsLeftForAnyTask) {
  Resources r = Make({.cpu = 1, .gpus = {0}, .custom = {{"ssd", 1}}});
  EXPECT_FALSE(r.Exhausted());
  ASSERT_TRUE(r.Reserve({.cpu = 0.5}, kHostMemory));
  EXPECT_FALSE(r.Exhausted()) << "half a CPU is room for a task";
  ASSERT_TRUE(r.Reserve({.cpu = 0.5}, kHostMemory));
  EXPECT_FALSE(r.Exhausted()) << "a GPU task asking no CPU could start";
  ASSERT_TRUE(r.Reserve({.cpu = 0, .gpu = 1}, 0));
  EXPECT_TRUE(r.Exhausted()) << "every task asks some CPU or GPU: a custom resource is no room";
  r.Release({{.cpu = 0, .gpu = 1}, 0});
  EXPECT_FALSE(r.Exhausted());

  // Shares summed in floating point leave dust, which is no room either.
  Resources thirds = Make({.cpu = 1});
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(thirds.Reserve({.cpu = 0.1}, kHostMemory)) << i;
  EXPECT_TRUE(thirds.Exhausted());
  EXPECT_TRUE(Make({.cpu = 0}).Exhausted()) << "a worker that offers nothing";
}

TEST(ResourcesTest, CouldEverFitSaysWhichRequestsNoStateOfTheWorkerCanServe) {
  Resources r = Make({.cpu = 2, .gpus = {0}, .custom = {{"ssd", 1}}});
  EXPECT_TRUE(r.CouldEverFit({.cpu = 2}));
  EXPECT_FALSE(r.CouldEverFit({.cpu = 3}));
  EXPECT_FALSE(r.CouldEverFit({.cpu = 0, .gpu = 2}));
  EXPECT_FALSE(r.CouldEverFit({.cpu = 1, .gpu = 0, .custom = {{"tpu", 1}}}));
  EXPECT_TRUE(r.CouldEverFit({.cpu = 1, .gpu = 1, .custom = {{"ssd", 1}}}));
  EXPECT_FALSE(Make({.cpu = 4}).CouldEverFit({.cpu = 0, .gpu = 0.5}));
}

TEST(ResourcesTest, TheViewIsWhatIsFreeNow) {
  Resources r = Make({.cpu = 4, .gpus = {0, 2}, .custom = {{"ssd", 2}}});
  ASSERT_TRUE(r.Reserve({.cpu = 1, .gpu = 0.5, .custom = {{"ssd", 1}}}, 2));
  const WorkerView v = r.View(0.25);
  EXPECT_DOUBLE_EQ(v.free_cpu, 3);
  ASSERT_EQ(v.gpus.size(), 2u);
  EXPECT_EQ(v.gpus[0].device, 0);
  EXPECT_DOUBLE_EQ(v.gpus[0].free_share, 1);
  EXPECT_DOUBLE_EQ(v.gpus[1].free_share, 0.5);
  EXPECT_DOUBLE_EQ(v.free_custom.at("ssd"), 1);
  EXPECT_DOUBLE_EQ(v.queue_wait_s, 0.25);
}

TEST(ResourcesTest, RandomReservationsNeverOversubscribeAndReleasesRestoreEverything) {
  Resources r = Make({.cpu = 3, .gpus = {0, 1}, .custom = {{"ssd", 2}}});
  std::mt19937_64 rng(11);
  std::vector<Resources::Reservation> held;
  const double shares[] = {0, 0.1, 0.2, 0.25, 0.5, 1};
  for (int step = 0; step < 10'000; ++step) {
    if (!held.empty() && rng() % 2 == 0) {
      const size_t i = rng() % held.size();
      r.Release(held[i]);
      held.erase(held.begin() + static_cast<std::ptrdiff_t>(i));
    } else {
      ResourceRequest req{.cpu = static_cast<double>(rng() % 2), .gpu = shares[rng() % 6]};
      if (rng() % 4 == 0) req.custom["ssd"] = 1;
      const int32_t device = req.gpu > 0 ? static_cast<int32_t>(rng() % 2) : kHostMemory;
      if (r.Reserve(req, device)) held.push_back({req, device});
    }
    // What is held never exceeds what there is.
    double cpu = 0, ssd = 0, gpu[2] = {0, 0};
    for (const auto& h : held) {
      cpu += h.request.cpu;
      if (h.request.custom.contains("ssd")) ssd += h.request.custom.at("ssd");
      if (h.request.gpu > 0) gpu[h.device] += h.request.gpu;
    }
    ASSERT_LE(cpu, 3 + kResourceEpsilon) << "step " << step;
    ASSERT_LE(ssd, 2 + kResourceEpsilon) << "step " << step;
    ASSERT_LE(gpu[0], 1 + kResourceEpsilon) << "step " << step;
    ASSERT_LE(gpu[1], 1 + kResourceEpsilon) << "step " << step;
    ASSERT_NEAR(r.free_cpu(), 3 - cpu, 1e-6);
    ASSERT_NEAR(r.free_share(1), 1 - gpu[1], 1e-6);
  }
  for (const auto& h : held) r.Release(h);
  EXPECT_DOUBLE_EQ(r.free_cpu(), 3);
  EXPECT_NEAR(r.free_share(0), 1, 1e-9);
  EXPECT_TRUE(r.Reserve({.cpu = 3, .gpu = 1, .custom = {{"ssd", 2}}}, 0)) << "all of it is back";
}

}  // namespace
}  // namespace depot::scheduler
