#include "scheduler/bounds.h"

#include <algorithm>
#include <limits>
#include <unordered_set>
#include <utility>

#include "depot/ipc/units.h"

namespace depot::scheduler {
namespace {

void Add(uint64_t& to, uint64_t bytes) {
  to = bytes > std::numeric_limits<uint64_t>::max() - to ? std::numeric_limits<uint64_t>::max()
                                                         : to + bytes;
}
void Take(uint64_t& from, uint64_t bytes) { from -= std::min(from, bytes); }

}  // namespace

Status Bounds::Check(SessionId submitter, const TaskSpec& spec,
                     std::map<uint64_t, uint64_t>& batch) const {
  if ((spec.bound_id == 0) != (spec.bound_bytes == 0)) {
    return Status::InvalidArgument(
        "a task's memory bound needs an id and a number of bytes, both "
        "above 0 (or neither)");
  }
  if (spec.bound_id == 0) return Status::OK();
  uint64_t bytes = spec.bound_bytes;
  if (auto it = bounds_.find({submitter, spec.bound_id}); it != bounds_.end()) {
    bytes = it->second.bytes;
  } else if (auto seen = batch.find(spec.bound_id); seen != batch.end()) {
    bytes = seen->second;
  } else {
    const auto count = per_submitter_.find(submitter);
    const size_t have = count == per_submitter_.end() ? 0 : count->second;
    if (have + batch.size() >= kMaxPerSubmitter) {
      return Status::InvalidArgument("a client may have " + std::to_string(kMaxPerSubmitter) +
                                     " memory bounds at once");
    }
    batch.emplace(spec.bound_id, spec.bound_bytes);
  }
  if (bytes != spec.bound_bytes) {
    return Status::InvalidArgument("memory bound " + std::to_string(spec.bound_id) + " is " +
                                   std::to_string(bytes) + " bytes, not " +
                                   std::to_string(spec.bound_bytes));
  }
  return Status::OK();
}

const Bounds::Bound* Bounds::Find(SessionId submitter, const TaskSpec& spec) const {
  if (spec.bound_id == 0) return nullptr;
  auto it = bounds_.find({submitter, spec.bound_id});
  return it == bounds_.end() ? nullptr : &it->second;
}

Bounds::Bound* Bounds::Find(SessionId submitter, const TaskSpec& spec) {
  return const_cast<Bound*>(std::as_const(*this).Find(submitter, spec));
}

void Bounds::Join(SessionId submitter, const TaskSpec& spec) {
  if (spec.bound_id == 0) return;
  auto [it, fresh] = bounds_.try_emplace({submitter, spec.bound_id});
  if (fresh) {
    it->second.bytes = spec.bound_bytes;
    ++per_submitter_[submitter];
  }
  ++it->second.tasks;
}

void Bounds::Leave(SessionId submitter, const TaskSpec& spec) {
  Bound* b = Find(submitter, spec);
  if (b == nullptr) return;
  --b->tasks;
  Tidy({submitter, spec.bound_id});
}

void Bounds::Changed(Bound& b, const Key& key) {
  b.held_since = -1;
  b.spilling = false;
  changed_.push_back(key);
}

void Bounds::Tidy(const Key& key) {
  auto it = bounds_.find(key);
  if (it == bounds_.end() || it->second.tasks > 0 || it->second.outputs > 0) return;
  bounds_.erase(it);
  auto count = per_submitter_.find(key.first);
  if (--count->second == 0) per_submitter_.erase(count);
}

bool Bounds::Fits(SessionId submitter, const TaskSpec& spec, uint64_t bytes) const {
  const Bound* b = Find(submitter, spec);
  if (b == nullptr) return true;
  // Nothing known of its size yet, but its kind will be measured: it runs alone, so that the
  // first of each kind cannot overshoot the bound unseen beside others.
  const uint64_t on_disk = Restores(submitter, spec, bytes);
  if (bytes == 0 && (on_disk == 0 || (!spec.kind.empty() && b->placed > 0))) {
    return spec.kind.empty() || b->placed == 0;
  }
  return Wanted(*b, bytes, on_disk) <= b->bytes;
}

unsigned __int128 Bounds::Wanted(const Bound& b, uint64_t bytes, uint64_t restores) {
  return static_cast<unsigned __int128>(b.live) + b.reserved + bytes + restores;
}

void Bounds::Count(Bound& b, const ObjectId& id, Output& out, bool in_memory) {
  out.in_memory = in_memory;
  if (in_memory) {
    Add(b.live, out.bytes);
    b.in_memory.emplace(out.seq, id);
  } else {
    Add(b.on_disk, out.bytes);
  }
}

void Bounds::Uncount(Bound& b, const Output& out) {
  if (out.in_memory) {
    Take(b.live, out.bytes);
    b.in_memory.erase(out.seq);
  } else {
    Take(b.on_disk, out.bytes);
  }
}

uint64_t Bounds::Restores(SessionId submitter, const TaskSpec& spec, uint64_t bytes) const {
  const Bound* b = Find(submitter, spec);
  if (b == nullptr || b->on_disk == 0) return 0;
  const uint64_t on_disk = OnDisk(*b, {submitter, spec.bound_id}, spec);
  return bytes <= b->bytes && on_disk <= b->bytes - bytes ? on_disk : 0;
}

uint64_t Bounds::OnDisk(const Bound& b, const Key& key, const TaskSpec& spec) const {
  if (b.on_disk == 0) return 0;
  uint64_t bytes = 0;
  std::unordered_set<ObjectId> counted;  // read twice, brought back once
  for (const ObjectId& id : spec.inputs) {
    auto it = made_.find(id);
    if (it != made_.end() && !it->second.in_memory && it->second.bound == key &&
        counted.insert(id).second) {
      Add(bytes, it->second.bytes);
    }
  }
  return bytes;
}

bool Bounds::Idle(SessionId submitter, uint64_t id) const {
  auto it = bounds_.find({submitter, id});
  return it == bounds_.end() || it->second.placed == 0;
}

void Bounds::HeldBack(SessionId submitter, uint64_t id, double now) {
  auto it = bounds_.find({submitter, id});
  if (it != bounds_.end() && it->second.held_since < 0) it->second.held_since = now;
}

double Bounds::HeldSince(SessionId submitter, uint64_t id) const {
  auto it = bounds_.find({submitter, id});
  if (it == bounds_.end() || it->second.held_since < 0) {
    return std::numeric_limits<double>::infinity();
  }
  return it->second.held_since;
}

std::string Bounds::Why(SessionId submitter, const TaskSpec& spec, uint64_t bytes) const {
  const Bound* b = Find(submitter, spec);
  if (b == nullptr) return "";
  const char* whose = spec.output_bytes > 0 ? "its declared output of " : "its expected output of ";
  if (spec.bound_waits) {
    return whose + ipc::FormatSize(bytes) + " is larger than its group's memory bound of " +
           ipc::FormatSize(b->bytes);
  }
  return whose + ipc::FormatSize(bytes) + " does not fit its graph's memory bound of " +
         ipc::FormatSize(b->bytes) + " beside the " + ipc::FormatSize(b->live) +
         " of the graph's results still stored in memory" +
         (b->on_disk > 0 ? " (and " + ipc::FormatSize(b->on_disk) + " on disk)" : "") +
         ", no task of the graph runs that could free any, and " +
         (b->in_memory.empty() ? "none of them is in memory to move to disk"
                               : "none of those in memory could move to disk (no spill "
                                 "directory, or a client holds them)");
}

bool Bounds::SpillFor(SessionId submitter, const TaskSpec& spec, uint64_t bytes, size_t& looks,
                      const std::function<bool(const ObjectId&)>& spill) {
  Bound* b = Find(submitter, spec);
  if (b == nullptr) return false;
  b->spilling = false;
  const unsigned __int128 wanted = Wanted(*b, bytes, Restores(submitter, spec, bytes));
  if (wanted <= b->bytes) return false;
  unsigned __int128 missing = wanted - b->bytes;
  const std::unordered_set<ObjectId> reads(spec.inputs.begin(), spec.inputs.end());
  bool leaving = false;
  for (const auto& [seq, id] : b->in_memory) {
    if (looks == 0) break;
    --looks;
    if (reads.contains(id)) continue;
    if (!spill(id)) continue;
    leaving = true;
    const uint64_t out = made_.at(id).bytes;
    if (out >= missing) break;
    missing -= out;
  }
  b->spilling = leaving;
  return leaving;
}

bool Bounds::Spilling(SessionId submitter, uint64_t id) const {
  auto it = bounds_.find({submitter, id});
  return it != bounds_.end() && it->second.spilling;
}

uint64_t Bounds::Placed(SessionId submitter, const TaskSpec& spec, uint64_t bytes) {
  Bound* b = Find(submitter, spec);
  if (b == nullptr) return 0;
  Add(bytes, Restores(submitter, spec, bytes));
  ++b->placed;
  b->reserved += bytes;
  Changed(*b, {submitter, spec.bound_id});
  return bytes;
}

void Bounds::Unplaced(SessionId submitter, const TaskSpec& spec, uint64_t reserved) {
  if (Bound* b = Find(submitter, spec)) {
    --b->placed;
    b->reserved -= reserved;
    Changed(*b, {submitter, spec.bound_id});
  }
}

void Bounds::Made(SessionId submitter, const TaskSpec& spec, const ObjectId& id, uint64_t bytes,
                  bool in_memory) {
  Bound* b = Find(submitter, spec);
  if (b == nullptr) return;
  auto [it, fresh] = made_.try_emplace(id, Output{{submitter, spec.bound_id}, bytes, next_seq_});
  if (!fresh) return;
  ++next_seq_;
  Count(*b, id, it->second, in_memory);
  ++b->outputs;
  Changed(*b, {submitter, spec.bound_id});
}

bool Bounds::Freed(const ObjectId& id) {
  auto it = made_.find(id);
  if (it == made_.end()) return false;
  const Output out = it->second;
  made_.erase(it);
  auto b = bounds_.find(out.bound);
  Uncount(b->second, out);
  --b->second.outputs;
  Changed(b->second, out.bound);
  Tidy(out.bound);
  return true;
}

bool Bounds::Moved(const ObjectId& id, bool in_memory) {
  auto it = made_.find(id);
  if (it == made_.end() || it->second.in_memory == in_memory) return false;
  Output& out = it->second;
  Bound& b = bounds_.at(out.bound);
  Uncount(b, out);
  Count(b, id, out, in_memory);
  Changed(b, out.bound);
  return true;
}

}  // namespace depot::scheduler
