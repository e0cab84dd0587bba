#include "store/slice_queue.h"

#include <boost/asio/post.hpp>

namespace depot::store {

void SliceQueue::Run(Slice job) {
  jobs_.push_back(std::move(job));
  Schedule();
}

void SliceQueue::Schedule() {
  if (scheduled_ || jobs_.empty()) return;
  scheduled_ = true;
  // A posted handler runs after those the loop's last poll found ready, and the loop polls
  // again before the next one: the slices of long jobs alternate with everyone's I/O.
  boost::asio::post(loop_, [this] { RunOne(); });
}

void SliceQueue::RunOne() {
  scheduled_ = false;
  if (jobs_.empty()) return;
  Slice job = std::move(jobs_.front());
  jobs_.pop_front();
  if (!job()) jobs_.push_back(std::move(job));
  Schedule();
}

}  // namespace depot::store
