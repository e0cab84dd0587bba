// Where the store's long work runs. Checksums of large objects and copies between tiers run
// off the event loop, and their results come back to it; the store asks an Executor for
// both, so that tests can run the same work at a time they choose, on their own thread.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>

#include <functional>

namespace depot::store {

class Executor {
 public:
  // Work for off the loop; it returns what to run on the loop once it is done.
  using Work = std::function<std::function<void()>()>;

  virtual ~Executor() = default;
  // Runs `work` off the loop, then what it returns on the loop.
  virtual void Offload(Work work) = 0;
  // Runs `task` on the loop, after the current handler: for work that must not run inside
  // the change that asks for it.
  virtual void Defer(std::function<void()> task) = 0;
};

// The daemon's: the worker pool for work, the event loop for what comes back.
class WorkerPoolExecutor final : public Executor {
 public:
  WorkerPoolExecutor(boost::asio::io_context& loop, boost::asio::thread_pool& workers)
      : loop_(loop), workers_(workers) {}

  void Offload(Work work) override {
    boost::asio::post(workers_,
                      [this, work = std::move(work)] { boost::asio::post(loop_, work()); });
  }
  void Defer(std::function<void()> task) override { boost::asio::post(loop_, std::move(task)); }

 private:
  boost::asio::io_context& loop_;
  boost::asio::thread_pool& workers_;
};

}  // namespace depot::store
