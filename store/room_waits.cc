#include "store/room_waits.h"

#include <algorithm>
#include <utility>
#include <vector>

namespace depot::store {

RoomWaits::RoomWaits(boost::asio::io_context& loop, std::function<size_t()> started_tasks,
                     std::function<void(ClientId, const ObjectId&)> waiting,
                     std::function<std::string(uint64_t)> describe)
    : started_tasks_(std::move(started_tasks)),
      waiting_(std::move(waiting)),
      describe_(std::move(describe)),
      timer_(loop) {}

void RoomWaits::Park(ClientId creator, uint64_t task, const ObjectId& id, Status why, Retry retry,
                     Fail fail, bool again) {
  waits_.push_back({creator, task, id, std::move(why), std::move(retry), std::move(fail)});
  if (!again) {
    ++waited_;
    waiting_(creator, id);  // may start tasks: looked at below
  }
  Check();
}

bool RoomWaits::Waiting(const ObjectId& id) const {
  return std::any_of(waits_.begin(), waits_.end(), [&](const Wait& w) { return w.id == id; });
}

bool RoomWaits::TaskWaits(uint64_t task) const {
  return std::any_of(waits_.begin(), waits_.end(), [&](const Wait& w) { return w.task == task; });
}

void RoomWaits::LendAgain() {
  std::vector<std::pair<ClientId, ObjectId>> waiting;
  for (const Wait& w : waits_) waiting.emplace_back(w.creator, w.id);
  for (const auto& [creator, id] : waiting) waiting_(creator, id);  // lends at most once
}

void RoomWaits::Freed() {
  if (waits_.empty()) return;
  // Each comes back to Park, at the end and in the same order, if it still finds no room.
  std::deque<Wait> tried = std::exchange(waits_, {});
  const size_t before = tried.size();
  for (Wait& w : tried) w.retry();
  // Room was made for one: the grace period starts again, if nothing else runs. A free
  // that let no wait go (another client's small object) is no sign that more will come.
  if (timing_ && waits_.size() < before) {
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
  // One wait a task (DataRequests refuses a second), so waits count waiting tasks.
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
  newest.fail(Status::OutOfMemory("no room for an output of " + describe_(newest.task) +
                                  " while every task that runs waits for room too (nothing "
                                  "freed for " +
                                  std::to_string(kGrace.count()) +
                                  " ms): " + newest.why.message()));
  Check();
}

}  // namespace depot::store
