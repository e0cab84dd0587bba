// What the in-process tests of the store's parts share: real header table, arena and
// simulated GPU pools, with no daemon, and an Executor that runs work when the test says.
#pragma once

#include <gtest/gtest.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/thread_pool.hpp>

#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "store/arena.h"
#include "store/executor.h"
#include "store/gpu/device_backend.h"
#include "store/gpu/pool.h"
#include "store/header_table.h"

namespace depot::store::testing {

// Runs nothing until asked: Offload's work and Defer's tasks wait in order, and Drain runs
// them (work first, then what it returned, as the worker pool and the loop would).
class ManualExecutor final : public Executor {
 public:
  void Offload(Work work) override {
    queue_.push_back([this, work = std::move(work)] { queue_.push_back(work()); });
  }
  void Defer(std::function<void()> task) override { queue_.push_back(std::move(task)); }

  // Runs everything queued, and what that queues, until nothing is left; returns how many.
  size_t Drain() {
    size_t ran = 0;
    while (!queue_.empty()) {
      std::function<void()> task = std::move(queue_.front());
      queue_.pop_front();
      task();
      ++ran;
    }
    return ran;
  }
  size_t queued() const { return queue_.size(); }

 private:
  std::deque<std::function<void()>> queue_;
};

// A header table, an arena of `host_bytes` in segments of `segment_bytes`, and `gpus`
// simulated GPUs with pools of `gpu_bytes` each (the simulated granularity is 2 MiB).
struct Tiers {
  static constexpr uint64_t kMiB = 1 << 20;

  explicit Tiers(uint64_t host_bytes = 8 * kMiB, uint64_t segment_bytes = 4 * kMiB,
                 uint32_t gpus = 1, uint64_t gpu_bytes = 2 * kMiB, uint32_t slots = 1024)
      : backend(gpu::MakeSimulatedBackend(gpus, 64 * kMiB)) {
    auto table = HeaderTable::Create(slots);
    EXPECT_TRUE(table.ok()) << table.status().ToString();
    headers = std::move(table).value();
    auto made = Arena::Create(ArenaOptions{host_bytes, segment_bytes, "", {}, {}}, workers);
    EXPECT_TRUE(made.ok()) << made.status().ToString();
    arena = std::move(made).value();
    for (uint32_t d = 0; d < gpus; ++d) {
      pools.push_back(std::make_unique<gpu::DevicePool>(*backend, d, gpu_bytes, gpu_bytes));
    }
  }
  ~Tiers() { workers.join(); }

  // Waits until the workers have prepared every segment (allocated its pages): an empty
  // segment changes class only then. At most 10 s, far more than it takes.
  void WaitPrepared() const {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    for (const uint32_t segment : arena->segments_in_use()) {
      while (arena->preparing(segment) && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::yield();
      }
      EXPECT_FALSE(arena->preparing(segment)) << "segment " << segment << " is still prepared";
    }
  }

  std::vector<gpu::DevicePool*> gpu_pools() const {
    std::vector<gpu::DevicePool*> out;
    for (const auto& p : pools) out.push_back(p.get());
    return out;
  }
  // By tier: the arena, then the GPUs.
  std::vector<TierPool*> tier_pools() const {
    std::vector<TierPool*> out{arena.get()};
    for (const auto& p : pools) out.push_back(p.get());
    return out;
  }

  boost::asio::thread_pool workers{1};  // the arena's page allocation
  std::unique_ptr<gpu::DeviceBackend> backend;
  std::unique_ptr<HeaderTable> headers;
  std::unique_ptr<Arena> arena;
  std::vector<std::unique_ptr<gpu::DevicePool>> pools;
};

}  // namespace depot::store::testing
