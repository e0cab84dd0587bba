// The daemon's task requests: the scheduler (scheduler/) on the loop beside the store, its
// requests decoded and answered for sessions, and the assignments it pushes to workers.
//
// The scheduler sees the store through SchedulerStore; this class connects the two and the
// network. A session that ends is removed from the store first (its references released,
// its partial outputs aborted), then from the scheduler (its tasks retried or cancelled).
#pragma once

#include <capnp/message.h>
#include <boost/asio/steady_timer.hpp>

#include <cstdint>
#include <string>

#include "depot/task.h"
#include "protocol.capnp.h"
#include "scheduler/scheduler.h"
#include "store/data_requests.h"
#include "store/object_store.h"
#include "store/requester.h"
#include "store/responder.h"
#include "store/room_waits.h"
#include "store/scheduler_store.h"

namespace depot::store {

// Where the daemon's pushes go (replies with id 0: a worker's assignments): the session of
// that id, if it is still connected. The Server finds it.
class Pushes {
 public:
  virtual ~Pushes() = default;
  virtual void Push(ClientId session, capnp::MessageBuilder& message,
                    wire::Reply::Builder reply) = 0;
};

class TaskService final : public DataRequests::OutputRoom,
                          private scheduler::WorkerLink,
                          private scheduler::ObjectEvents {
 public:
  TaskService(boost::asio::io_context& loop, Pushes& pushes, ObjectStore& store,
              scheduler::SchedulerOptions options);
  TaskService(const TaskService&) = delete;
  TaskService& operator=(const TaskService&) = delete;

  // One handler per request: each answers through `reply` (an error for bad input, naming
  // what was wrong), or, for completions with id 0, only logs what it refuses.
  void RegisterWorker(const Responder& reply, const Requester& who,
                      wire::Request::RegisterWorker::Reader request);
  void Submit(const Responder& reply, const Requester& who,
              capnp::List<wire::TaskSpec>::Reader tasks);
  void Complete(const Responder& reply, const Requester& who,
                capnp::List<wire::Completion>::Reader completions);
  void Cancel(const Responder& reply, const Requester& who, capnp::List<wire::Id>::Reader outputs);
  // Deletes each object once no pending task reads or makes it; at once, as `delete` does,
  // those no pending task reads or makes now.
  void DeleteAfterTasks(const Responder& reply, const Requester& who,
                        capnp::List<wire::Id>::Reader ids);
  void Drain(const Responder& reply, const Requester& who);
  void Workers(const Responder& reply) const;
  void Tasks(const Responder& reply) const;
  // The scheduler's part of the status reply.
  SchedulerStatus Totals() const;
  // The session has gone (after the store removed it as a client).
  void SessionClosed(uint64_t session);

  const scheduler::Scheduler& scheduler() const { return scheduler_; }
  // The scheduler's counters, with the waits for room of outputs.
  scheduler::SchedulerCounters counters() const;
  // Where workers' creates of outputs wait for room (DataRequests::WaitForRoomOfOutputs).
  RoomWaits& room_waits() override { return room_waits_; }
  uint64_t MakesNow(ClientId worker, const ObjectId& id) const override {
    return scheduler_.MakesNow(worker, id);
  }
  bool Unwanted(const ObjectId& id) const override { return scheduler_.Unwanted(id); }

 private:
  // Stores the small outputs a worker sent with its completion of `task`, as its puts would
  // have; the first that cannot be stored (a bad index, too large, an id taken, no room)
  // fails the task, with why. Nothing, if the task is not running on the worker.
  Status StoreOutputs(ClientId worker, uint64_t task,
                      capnp::List<wire::OutputValue>::Reader values);
  // Seals the outputs a worker created and listed in its completion of `task`, as its seal
  // requests would have; the first that cannot be sealed (a bad index, not its own, sealed
  // already) fails the task, with why. Returns true when `completion` is ready for the
  // scheduler now; false when a seal runs on (a checksum off the loop), and the completion
  // goes to the scheduler once it is done. Nothing, if the task is not running on the worker.
  bool SealOutputs(ClientId worker, scheduler::Completion& completion,
                   capnp::List<uint32_t>::Reader indices);
  // scheduler::WorkerLink: sends `tasks` to `worker`'s session as one assign message.
  void Assign(scheduler::SessionId worker, std::span<const scheduler::Assignment> tasks) override;
  void Drained(scheduler::SessionId worker) override;
  // scheduler::ObjectEvents, passed on to the scheduler.
  void OnSealed(const ObjectId& id, bool failed) override { scheduler_.OnSealed(id, failed); }
  void OnFreed(const ObjectId& id) override {
    scheduler_.OnFreed(id);
    room_waits_.Freed();
  }
  void OnMemory(const ObjectId& id, bool in_memory) override {
    scheduler_.OnMemory(id, in_memory);
    if (!in_memory) room_waits_.Freed();  // its host memory is free now
  }

  // Fails the waits for room of outputs nobody wants any more (a graph given up).
  void EndUnwantedWaits();
  // A memory bound held a task back (SchedulerOptions::bounds_stuck): its graph's tasks that
  // cannot fit fail RoomWaits::kGrace later if nothing of it runs or was freed by then.
  void BoundsStuck();

  Pushes& pushes_;
  ObjectStore& store_;
  SchedulerStore access_;
  scheduler::Scheduler scheduler_;
  boost::asio::steady_timer bounds_timer_;
  bool bounds_timer_armed_ = false;
  RoomWaits room_waits_;
};

}  // namespace depot::store
