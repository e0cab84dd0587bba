// What tasks that declare no output size are expected to make, learned from the tasks of
// their kind that completed.
//
// A task may name its kind (TaskSpec.kind: depot.dask names each task's Dask layer). Tasks
// of a kind make outputs of about one size (the chunks of one layer of an array, the
// partitions of one stage of a dataframe), so a task of a kind that declares no size
// (TaskSpec.output_bytes 0) is expected to make as much as the most one of its kind made so
// far, and is placed, reserved and counted against its bound (Bounds) as if it had declared
// that. Each submitter's kinds are its own (another client cannot make a victim's tasks wait
// by reporting huge outputs of the same name), at most kMaxKinds of them (the least recently
// learned go first), and they go with its session.
//
// All of it runs on the daemon's loop thread.
#pragma once

#include <cstdint>
#include <list>
#include <string>
#include <unordered_map>

#include "scheduler/task.h"

namespace depot::scheduler {

class OutputSizes {
 public:
  static constexpr size_t kMaxKinds = 1024;  // a submitter's

  // The output bytes `submitter`'s task `spec` is expected to make: what it declared, else
  // the most a task of its kind made so far (at least 1), else 0 (unknown).
  uint64_t Expected(SessionId submitter, const TaskSpec& spec) const;
  // A task of `submitter` of `kind` completed, its outputs taking `bytes`.
  void Record(SessionId submitter, const std::string& kind, uint64_t bytes);
  // The submitter's session ended.
  void Forget(SessionId submitter) { by_submitter_.erase(submitter); }

  size_t kinds(SessionId submitter) const {
    auto it = by_submitter_.find(submitter);
    return it == by_submitter_.end() ? 0 : it->second.most.size();
  }

 private:
  struct Kinds {
    struct Learned {
      uint64_t bytes = 0;
      std::list<std::string>::iterator at;  // in `order`
    };
    std::unordered_map<std::string, Learned> most;
    std::list<std::string> order;  // least recently learned first
  };
  std::unordered_map<SessionId, Kinds> by_submitter_;
};

}  // namespace depot::scheduler
