// Creates of running tasks' outputs that found no room in the store, waiting for room that
// other running tasks will free.
//
// A graph whose intermediates do not all fit at once still runs inside the store as long as
// its tasks take turns: the readers of what is there end, their inputs are deleted, and the
// room they leave takes the next output. So a worker's create of an output of a task it runs
// now does not fail for want of room: it waits here, and is tried again, oldest first, each
// time an object is freed. Any other create is answered at once (a client's put, an id no
// task of that worker makes now).
//
// Waiting ends in an error only when nothing can free room any more: every task that runs
// waits here and nothing has been freed for kGrace (a task's inputs are released by its
// worker a moment after it ends, so the end of the last other task is not proof). Then the
// newest wait fails, saying why, and its task fails with it; the graph stops with an error,
// never with the kernel's OOM killer, and the others go on if that freed room.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <string>

#include "depot/object_id.h"
#include "depot/status.h"
#include "store/object_table.h"  // ClientId

namespace depot::store {

class RoomWaits {
 public:
  static constexpr std::chrono::milliseconds kGrace{500};

  // Tries the create again: it comes back to Park if there is still no room.
  using Retry = std::function<void()>;
  // Ends the wait with an error, answering the create.
  using Fail = std::function<void(Status)>;

  // `started_tasks`: how many tasks' functions run now, on every worker. `waiting`: called
  // once a wait begins, with the creator and the id (the scheduler lends the task's
  // resources to another task meanwhile: a worker's slot that waits for room may run the
  // reader that frees it).
  // `describe`: how a message names a task (Scheduler::Describe).
  RoomWaits(boost::asio::io_context& loop, std::function<size_t()> started_tasks,
            std::function<void(ClientId, const ObjectId&)> waiting,
            std::function<std::string(uint64_t)> describe);
  RoomWaits(const RoomWaits&) = delete;
  RoomWaits& operator=(const RoomWaits&) = delete;

  // `creator`'s create of `id`, an output of `task`, found no room, for `why`: it waits.
  // `again`: it is a wait tried again (Retry) that still found none.
  void Park(ClientId creator, uint64_t task, const ObjectId& id, Status why, Retry retry, Fail fail,
            bool again);
  // An object was freed: every wait is tried again, oldest first.
  void Freed();
  // A task started or ended: whether nothing but waits runs is looked at again.
  void TasksChanged();
  // A task ended: each waiting task that could not lend its resources when it began to
  // wait (its worker had lent as many as it has slots) is offered `waiting` again.
  void LendAgain();
  // `creator`'s session has ended: its waits go, unanswered.
  void SessionEnded(ClientId creator);
  // The waits for outputs nobody wants any more (`unwanted`: a graph given up while they
  // waited) fail at once, saying so: room for them would only be taken from others.
  void EndUnwanted(const std::function<bool(const ObjectId&)>& unwanted);

  size_t size() const { return waits_.size(); }
  // Whether a create of `id` waits now; whether one of an output of `task` does.
  bool Waiting(const ObjectId& id) const;
  bool TaskWaits(uint64_t task) const;
  uint64_t waited() const { return waited_; }  // waits ever begun
  uint64_t failed() const { return failed_; }

 private:
  struct Wait {
    ClientId creator;
    uint64_t task;
    ObjectId id;
    Status why;
    Retry retry;
    Fail fail;
  };
  // Starts the grace period if nothing but waits runs, and stops it otherwise.
  void Check();
  // The grace period ended with nothing freed: the newest wait fails.
  void GiveUp();

  std::function<size_t()> started_tasks_;
  std::function<void(ClientId, const ObjectId&)> waiting_;
  std::function<std::string(uint64_t)> describe_;
  boost::asio::steady_timer timer_;
  bool timing_ = false;
  uint64_t generation_ = 0;  // of the grace period: a handler of an earlier one does nothing
  std::deque<Wait> waits_;   // oldest first
  uint64_t waited_ = 0;
  uint64_t failed_ = 0;
};

}  // namespace depot::store
