// Long work on the loop thread, cut into slices that take turns with everything else.
//
// The daemon's loop is one thread, so a request that walks 300,000 objects in one go holds up
// every other client's requests for milliseconds. Such work is given here as a function that
// does one bounded slice (some tens of microseconds) per call and says whether it is done.
// One slice of one job runs per pass of the loop, the jobs taking turns, and the loop polls
// its sockets between slices: a request that arrives meanwhile waits for about one slice,
// however many long jobs are running.
#pragma once

#include <boost/asio/io_context.hpp>

#include <deque>
#include <functional>

namespace depot::store {

class SliceQueue {
 public:
  // One slice of a job's work; returns true when the job is done.
  using Slice = std::function<bool()>;

  explicit SliceQueue(boost::asio::io_context& loop) : loop_(loop) {}
  SliceQueue(const SliceQueue&) = delete;
  SliceQueue& operator=(const SliceQueue&) = delete;

  // Queues a job; its first slice runs on a later pass of the loop, never inside this call.
  void Run(Slice job);

 private:
  void Schedule();
  void RunOne();

  boost::asio::io_context& loop_;
  std::deque<Slice> jobs_;
  bool scheduled_ = false;
};

}  // namespace depot::store
