// Memory bounds of groups of tasks: a client's graph on a shared daemon that must not take
// more than so many bytes of memory at once (depot.dask's `memory=`).
//
// A task names its bound (TaskSpec.bound_id, with bound_bytes): its submitter's tasks naming
// the same id share it. What a bound counts is the outputs of its tasks stored in memory (live:
// from the completion of their task until they are freed, but for while their bytes are on disk
// only) and the outputs its placed tasks declared (TaskSpec.output_bytes, or what OutputSizes
// expects of its kind: reserved from placement until the task is unplaced, as WorkerTable
// reserves room on a device), with the inputs of theirs on disk, which their reads bring back. A
// task starts only while the bound holds its own declared output and its inputs on disk beside
// those (Fits); a task that declares nothing is not held back. When no task of a bound is placed
// and none of its ready tasks fits, nothing of the graph will free any of it: with a disk tier,
// the scheduler moves the bound's oldest outputs to disk until the first task held back fits
// (SpillFor); without one, or when nothing can leave, it fails the first such task, naming it,
// its size and the bound (Why), rather than let the graph wait for ever.
//
// All of it runs on the daemon's loop thread.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "depot/object_id.h"
#include "depot/status.h"
#include "scheduler/task.h"

namespace depot::scheduler {

class Bounds {
 public:
  // At most this many bounds a submitter has at once.
  static constexpr size_t kMaxPerSubmitter = 1024;

  // Whether `submitter` may submit `spec`: its bound's id and bytes are both 0 or both not,
  // and the bytes are those of the bound's other tasks, pending or in this batch (`batch`:
  // the bounds seen so far in it, by id). InvalidArgument, saying which, otherwise.
  Status Check(SessionId submitter, const TaskSpec& spec,
               std::map<uint64_t, uint64_t>& batch) const;

  // A task of `submitter` naming a bound was added / is over.
  void Join(SessionId submitter, const TaskSpec& spec);
  void Leave(SessionId submitter, const TaskSpec& spec);

  // Whether the task's bound holds its output of `bytes` (declared, or expected of its
  // kind: Task::reserve) and its inputs on disk (Restores) now. True without a bound, or for
  // 0 bytes (unknown) with no input on disk and no kind; a task of a kind not measured yet
  // fits only while no task of its bound is placed (it runs alone until its kind is
  // measured).
  bool Fits(SessionId submitter, const TaskSpec& spec, uint64_t bytes) const;
  // The bytes of the task's inputs that are outputs of its bound on disk only, each once:
  // reading them brings them back into memory. Not counted (0) when with the task's output
  // of `bytes` they are more than the whole bound: such a task could never start, and runs
  // as it did before its inputs went to disk.
  uint64_t Restores(SessionId submitter, const TaskSpec& spec, uint64_t bytes) const;
  // Whether no task of the bound is placed (true for none).
  bool Idle(SessionId submitter, uint64_t id) const;
  // A round held back a task of the bound, idle, at `now` (seconds): the first such moment
  // since the bound last changed (a task placed or unplaced, an output made or freed) is
  // kept. When: that moment, or infinity if it changed since (or there is no such bound).
  void HeldBack(SessionId submitter, uint64_t id, double now);
  double HeldSince(SessionId submitter, uint64_t id) const;
  // Why the task's bound cannot hold its output of `bytes`, for its failure.
  std::string Why(SessionId submitter, const TaskSpec& spec, uint64_t bytes) const;

  // Makes room in the task's bound for its output of `bytes` and its inputs on disk, by
  // asking `spill` to move the bound's outputs in memory out of it, oldest first, but none of
  // the task's inputs, until the bytes leaving (those `spill` says are) make up what is
  // missing. Whether any is leaving, as of this call: the bound is spilling (Spilling) while
  // the last call found some leaving and nothing of the bound changed since (an output that
  // left memory, among others), and is not stuck meanwhile; a spill that failed, or a copy
  // kept in memory, is found not leaving by the next call. Each call asks about at most
  // `looks` outputs and takes those it asked about off it: the caller's budget for a round
  // over every bound (kSpillLooks), so that a client holding thousands of its bounds'
  // outputs (which cannot leave) costs each round a bounded look, and its graph fails as
  // stuck.
  static constexpr size_t kSpillLooks = 1024;
  bool SpillFor(SessionId submitter, const TaskSpec& spec, uint64_t bytes, size_t& looks,
                const std::function<bool(const ObjectId&)>& spill);
  bool Spilling(SessionId submitter, uint64_t id) const;

  // The task was placed on a worker: its output of `bytes` (Task::reserve) and its inputs on
  // disk are reserved; what that reserved, which Unplaced gives back when it is taken off.
  uint64_t Placed(SessionId submitter, const TaskSpec& spec, uint64_t bytes);
  void Unplaced(SessionId submitter, const TaskSpec& spec, uint64_t reserved);
  // Its task's output `id` of `bytes` is stored (the task completed), in memory or (spilled
  // already) on disk only; `id` was freed.
  void Made(SessionId submitter, const TaskSpec& spec, const ObjectId& id, uint64_t bytes,
            bool in_memory = true);
  // Whether `id` was a live output of a bound task (its bound has more room now).
  bool Freed(const ObjectId& id);
  // A copy of `id` came into memory, or its last one there left it for disk (in_memory
  // false): whether that changed what its bound counts.
  bool Moved(const ObjectId& id, bool in_memory);

  size_t size() const { return bounds_.size(); }

  using Key = std::pair<SessionId, uint64_t>;
  // The bounds that changed (a task placed or unplaced, an output made or freed) since the
  // last call, each at least once: where tasks it held back may fit now.
  std::vector<Key> TakeChanged() { return std::exchange(changed_, {}); }

 private:
  struct Bound {
    uint64_t bytes = 0;
    uint64_t live = 0;               // of outputs in memory
    uint64_t on_disk = 0;            // of outputs on disk only
    unsigned __int128 reserved = 0;  // summed exactly: each declaration may be 2^64 - 1
    size_t tasks = 0;                // pending
    size_t placed = 0;
    size_t outputs = 0;                      // live ones (made_ holds them)
    double held_since = -1;                  // HeldBack, until the bound changes; -1: not
    bool spilling = false;                   // SpillFor, until the bound changes
    std::map<uint64_t, ObjectId> in_memory;  // its live outputs in memory, by Output::seq
  };
  const Bound* Find(SessionId submitter, const TaskSpec& spec) const;
  // The bytes of the task's inputs that are outputs of `b` on disk only, each once.
  uint64_t OnDisk(const Bound& b, const Key& key, const TaskSpec& spec) const;
  // What `b` would hold with a task's output of `bytes` and its `restores` placed.
  static unsigned __int128 Wanted(const Bound& b, uint64_t bytes, uint64_t restores);
  Bound* Find(SessionId submitter, const TaskSpec& spec);
  // Drops a bound no pending task names and no live output counts against.
  void Tidy(const Key& key);
  // `b`, the bound `key`, changed: it is held no more, and is listed for TakeChanged.
  void Changed(Bound& b, const Key& key);

  std::map<Key, Bound> bounds_;
  std::map<SessionId, size_t> per_submitter_;
  struct Output {
    Key bound;
    uint64_t bytes;
    uint64_t seq;  // in the order they were made
    bool in_memory = true;
  };
  // Counts `out` (of `id`) in `b`, as in memory or as on disk; takes it off where it counts.
  static void Count(Bound& b, const ObjectId& id, Output& out, bool in_memory);
  static void Uncount(Bound& b, const Output& out);
  std::unordered_map<ObjectId, Output> made_;  // live outputs of bound tasks
  std::vector<Key> changed_;
  uint64_t next_seq_ = 0;
};

}  // namespace depot::scheduler
