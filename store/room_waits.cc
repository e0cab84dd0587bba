#include "store/room_waits.h"

#include <algorithm>
#include <utility>
#include <vector>

namespace depot::store {

RoomWaits::RoomWaits(boost::asio::io_context& loop, std::function<size_t()> started_tasks,
                     std::function<void(ClientId, const ObjectId&)> waiting)
    : started_tasks_(std::move(started_tasks)), waiting_(std::move(waiting)), timer_(loop) {}

void RoomWaits::Park(ClientId creator, const ObjectId& id, uint64_t bytes, Status why, Retry retry,
                     Fail fail, bool again) {
  waits_.push_back({creator, id, bytes, std::move(why), std::move(retry), std::move(fail)});
  if (!again) {
    ++waited_;
    waiting_(creator, id);  // may start tasks: looked at below
  }
  Check();
}

bool RoomWaits::Waiting(const ObjectId& id) const {
  return std::any_of(waits_.begin(), waits_.end(), [&](const Wait& w) { return w.id == id; });
}

void RoomWaits::Freed() {
  if (waits_.empty()) return;
  // Each comes back to Park, at the end and in the same order, if it still finds no room.
  std::deque<Wait> tried = std::exchange(waits_, {});
  for (Wait& w : tried) w.retry();
  // Something was freed: the grace period starts again, if nothing else runs.
  if (timing_) {
    timing_ = false;
    ++generation_;
    timer_.cancel();
  }
  Check();
}

void RoomWaits::TasksChanged() {
  if (!waits_.empty() || timing_) Check();
}

void RoomWaits::SessionEnded(ClientId creator) {
  std::erase_if(waits_, [creator](const Wait& w) { return w.creator == creator; });
  Check();
}

void RoomWaits::EndUnwanted(const std::function<bool(const ObjectId&)>& unwanted) {
  std::vector<Wait> ended;
  for (auto it = waits_.begin(); it != waits_.end();) {
    if (unwanted(it->id)) {
      ended.push_back(std::move(*it));
      it = waits_.erase(it);
    } else {
      ++it;
    }
  }
  for (Wait& w : ended) {
    w.fail(
        Status::OutOfMemory("nobody wants this output any more (its readers were cancelled "
                            "and it was given up), so it does not wait for room: " +
                            w.why.message()));
  }
  if (!ended.empty()) Check();
}

void RoomWaits::Check() {
  const bool stuck = !waits_.empty() && started_tasks_() <= waits_.size();
  if (stuck == timing_) return;
  timing_ = stuck;
  if (!stuck) {
    ++generation_;
    timer_.cancel();
    return;
  }
  timer_.expires_after(kGrace);
  // A handler already due when the timer was cancelled still runs: the generation tells.
  timer_.async_wait([this, generation = ++generation_](const boost::system::error_code& ec) {
    if (ec || !timing_ || generation != generation_) return;
    timing_ = false;
    GiveUp();
  });
}

void RoomWaits::GiveUp() {
  if (waits_.empty() || started_tasks_() > waits_.size()) return Check();
  Wait newest = std::move(waits_.back());
  waits_.pop_back();
  ++failed_;
  newest.fail(Status::OutOfMemory(
      "no room for a task's output while every task that runs waits for room too (nothing "
      "freed for " +
      std::to_string(kGrace.count()) + " ms): " + newest.why.message()));
  Check();
}

}  // namespace depot::store
