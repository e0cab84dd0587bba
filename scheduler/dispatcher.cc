#include "scheduler/dispatcher.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <string>
#include <utility>

#include "depot/ipc/units.h"

namespace depot::scheduler {

namespace {

// A round stops after this many ready tasks in a row found no worker. Tasks of a shape that
// found none are passed over without counting (Round).
constexpr int kMaxMissesPerRound = 64;
constexpr size_t kMaxShapesPerRound = 64;

// A task queued on a worker expected to be busy this long or longer moves to a worker left
// idle, where it starts at once (Rebalance).
constexpr double kStealAfterWaitS = 0.01;

// Ready tasks looked at, a round, for one that outranks a queued task (Preempt).
constexpr size_t kMaxPreemptLooks = 64;

// A variant passed over this many times in a row, for tasks of its function and input size,
// is chosen once more: so that its estimate follows changes, and one slow run is not its last.
constexpr uint32_t kExploreEvery = 32;

// Tasks with no affinity and the same shape ask for the same thing: where one found no
// place, the others find none either. A bound and a kind are their submitter's.
bool SameShape(const Task& a, const Task& b) {
  const TaskSpec& x = a.spec;
  const TaskSpec& y = b.spec;
  const bool own = x.bound_id != 0 || !x.kind.empty();
  return x.function == y.function && x.resources.cpu == y.resources.cpu &&
         x.resources.gpu == y.resources.gpu && x.resources.custom == y.resources.custom &&
         x.output_bytes == y.output_bytes && x.variant == y.variant && x.bound_id == y.bound_id &&
         x.kind == y.kind && (!own || a.submitter == b.submitter);
}

}  // namespace

Dispatcher::Dispatcher(TaskGraph& graph, WorkerTable& workers, StoreAccess& store,
                       DurationModel& durations, DispatcherOptions options,
                       const OutputSizes* sizes)
    : graph_(graph),
      workers_(workers),
      store_(store),
      durations_(durations),
      sizes_(sizes),
      options_(std::move(options)) {}

void Dispatcher::MakeReady(Task& task) {
  task.state = TaskState::kReady;
  task.worker = 0;
  ready_.insert(task.key());
}

void Dispatcher::Requeue(Task& task) {
  workers_.Unplace(task);
  task.device = kHostMemory;
  task.variant.clear();
  task.variant_reason.clear();
  MakeReady(task);
}

void Dispatcher::Forget(Task& task) {
  if (task.state != TaskState::kReady) return;
  ready_.erase(task.key());
  stalled_.erase(task.id);
  if (task.spec.bound_id == 0) return;
  auto it = parked_.find({task.submitter, task.spec.bound_id});
  if (it != parked_.end() && it->second.erase(task.key()) > 0) {
    --parked_count_;
    if (it->second.empty()) parked_.erase(it);
  }
}

std::set<ReadyKey>::iterator Dispatcher::Park(std::set<ReadyKey>::iterator it) {
  const Task& task = graph_.at(it->id);
  const Bounds::Key key{task.submitter, task.spec.bound_id};
  parked_[key].insert(*it);
  ++parked_count_;
  return ready_.erase(it);
}

void Dispatcher::Unpark() {
  Bounds* bounds = workers_.bounds();
  if (bounds == nullptr) return;
  for (const Bounds::Key& key : bounds->TakeChanged()) Unpark(key);
}

void Dispatcher::Unpark(const Bounds::Key& key) {
  auto it = parked_.find(key);
  if (it == parked_.end()) return;
  parked_count_ -= it->second.size();
  ready_.merge(it->second);
  parked_.erase(it);
}

void Dispatcher::Unstall() {
  for (TaskId id : std::exchange(stalled_, {})) ready_.insert(graph_.at(id).key());
}

void Dispatcher::Round() {
  PlaceReady();
  if (Rebalance()) PlaceReady();
}

bool Dispatcher::WouldFit(const Task& task) const {
  const uint64_t bytes = Expected(task);
  if (const Bounds* bounds = workers_.bounds();
      bounds != nullptr && !bounds->Fits(task.submitter, task.spec, bytes)) {
    return false;
  }
  // A GPU task's device is not known yet: only a CPU task's room is looked at.
  return bytes == 0 || task.spec.resources.gpu > 0 || HasRoom(kHostMemory, bytes);
}

bool Dispatcher::HasRoom(int32_t device, uint64_t bytes) const {
  const uint64_t room = store_.Room(device);
  const uint64_t reserved = workers_.Reserved(device);
  return room >= reserved && room - reserved >= bytes;
}

void Dispatcher::Preempt() {
  if (ready_.empty() || options_.random_placement) return;
  std::vector<Task*> moving;
  std::set<SessionId> taken;  // a place on each worker, at most, a round
  size_t looked = 0;
  for (auto it = ready_.begin(); it != ready_.end() && looked < kMaxPreemptLooks; ++it, ++looked) {
    const Task& task = graph_.at(it->id);
    // The ready queue is in order: once a task outranks no worker's last queued task, none
    // after it does (the usual case costs a look at each worker).
    bool outranks_any = false;
    for (auto& [id, w] : workers_.workers()) {
      if (!w->queue.empty() && Outranks(task, graph_.at(w->queue.back()))) outranks_any = true;
    }
    if (!outranks_any) break;
    // Only a task that would take the place: not one bound to a GPU (it waits for that
    // GPU's worker), nor one its bound or the store's room would hold back.
    if (task.spec.affinity == Affinity::kHard || !WouldFit(task)) continue;
    const std::vector<Way> ways = workers_.Ways(task.spec);
    const auto could_run = [&](const Worker& w) {
      return std::ranges::any_of(ways, [&](const Way& way) {
        return WorkerTable::CouldEverTake(w, way, task.spec.function);
      });
    };
    // The queued task to take back: on a worker whose resources a completion freed (the
    // task starts there at once), else the one it outranks most, where it could run.
    Task* last = nullptr;
    bool open = false;  // a worker that could run it has room in its window
    const auto better = [&](const Task& queued) {
      if (last == nullptr) return true;
      const bool freed = workers_.Find(queued.worker)->freed;
      const bool last_freed = workers_.Find(last->worker)->freed;
      if (freed != last_freed) return freed;
      return last->key() < queued.key();
    };
    for (auto& [id, w] : workers_.workers()) {
      if (!could_run(*w)) continue;
      if (workers_.Open(*w)) {
        open = true;
        break;
      }
      if (w->queue.empty() || taken.contains(id)) continue;
      Task& queued = graph_.at(w->queue.back());
      if (Outranks(task, queued) && better(queued)) last = &queued;
    }
    if (open || last == nullptr) continue;
    taken.insert(last->worker);
    moving.push_back(last);
    if (taken.size() == workers_.workers().size()) break;
  }
  for (Task* task : moving) {
    Requeue(*task);
    ++counters_.preemptions;
  }
}

bool Dispatcher::Rebalance() {
  if (!ready_.empty() || options_.random_placement) return false;
  std::vector<const Worker*> idle;
  for (auto& [id, w] : workers_.workers()) {
    if (!w->draining && w->running.empty() && w->queue.empty()) idle.push_back(w.get());
  }
  // Whether an idle worker could run `task`: else it would only come back where it was.
  auto could_take = [&](const Task& task) {
    for (const Way& way : workers_.Ways(task.spec)) {
      for (const Worker* v : idle) {
        if (WorkerTable::CouldEverTake(*v, way, task.spec.function)) return true;
      }
    }
    return false;
  };
  std::vector<Task*> moving;
  for (auto& [id, w] : workers_.workers()) {
    if (moving.size() >= idle.size()) break;
    if (w->queue.empty()) continue;
    const double wait = workers_.QueueWait(*w);
    if (wait < kStealAfterWaitS) continue;
    for (TaskId queued : w->queue) {
      Task& task = graph_.at(queued);
      // A task bound to its worker's GPU could only come back to it; one shorter than the
      // wait is worth a copy of its inputs.
      if (task.spec.affinity == Affinity::kHard || 2 * task.duration_s > wait ||
          !could_take(task)) {
        continue;
      }
      moving.push_back(&task);
      break;  // one a worker a round: the next one's wait is then looked at afresh
    }
  }
  for (Task* task : moving) {
    Requeue(*task);
    ++counters_.steals;
  }
  return !moving.empty();
}

std::vector<TaskId> Dispatcher::OverBound(
    const std::function<bool(SessionId, uint64_t)>& stuck_now) {
  std::vector<TaskId> out;
  const Bounds* bounds = workers_.bounds();
  if (parked_.empty() || bounds == nullptr) return out;
  std::set<Bounds::Key> stuck;
  for (const auto& [key, parked] : parked_) {
    if (stuck_now(key.first, key.second)) stuck.insert(key);
  }
  if (stuck.empty()) return out;
  std::map<std::pair<SessionId, uint64_t>, std::vector<TaskId>> held;
  std::set<std::pair<SessionId, uint64_t>> fitting;
  // The stuck bounds' tasks: those held back, and any in the ready queue (not tried yet).
  std::vector<TaskId> tasks;
  for (const ReadyKey& r : ready_) {
    const Task& t = graph_.at(r.id);
    if (stuck.contains({t.submitter, t.spec.bound_id})) tasks.push_back(r.id);
  }
  for (const Bounds::Key& key : stuck) {
    for (const ReadyKey& r : parked_.at(key)) tasks.push_back(r.id);
  }
  for (TaskId id : tasks) {
    const Task& t = graph_.at(id);
    const std::pair key{t.submitter, t.spec.bound_id};
    const uint64_t bytes = Expected(t);
    if (bounds->Fits(t.submitter, t.spec, bytes)) {
      fitting.insert(key);
    } else if (!t.spec.bound_waits) {
      held[key].push_back(t.id);
    } else if (bytes > t.spec.bound_bytes) {
      out.push_back(t.id);  // it waits for frees, but none could make it fit
    }
  }
  for (auto& [key, ids] : held) {
    if (!fitting.contains(key)) out.insert(out.end(), ids.begin(), ids.end());
  }
  // A parked task that fits now, with no change to its bound (what its kind is expected to
  // make was forgotten), goes back to the ready queue with its bound's others.
  for (const Bounds::Key& key : fitting) Unpark(key);
  return out;
}

uint64_t Dispatcher::Expected(const Task& task) const {
  return sizes_ != nullptr ? sizes_->Expected(task.submitter, task.spec) : task.spec.output_bytes;
}

void Dispatcher::PlaceReady() {
  held_at_.clear();
  Unpark();
  // Workers whose resources were freed start what they queued, but not before a ready
  // task that outranks it has had its chance at them; the rest once the ready tasks have.
  const Task* best = ready_.empty() ? nullptr : &graph_.at(ready_.begin()->id);
  for (auto& [id, w] : workers_.workers()) {
    if (w->freed) workers_.StartQueued(*w, best);
  }
  Preempt();
  size_t open = 0;
  for (auto& [id, w] : workers_.workers()) {
    if (workers_.Open(*w)) ++open;
  }
  std::vector<const Task*> unplaceable;
  int misses = 0;
  for (auto it = ready_.begin(); it != ready_.end() && open > 0 && misses < kMaxMissesPerRound;) {
    Task& task = graph_.at(it->id);
    if (task.spec.bound_id != 0) {
      // A bound that held back an output this round holds back any as large (fast: many
      // ready tasks of one graph may wait for room in its bound).
      auto held = held_at_.find({task.submitter, task.spec.bound_id});
      if (held != held_at_.end()) {
        const uint64_t bytes = Expected(task);
        if (bytes == 0 ? held->second.unknown && !task.spec.kind.empty()
                       : bytes >= held->second.least) {
          it = Park(it);
          continue;
        }
      }
    }
    const bool shaped = task.spec.affinity == Affinity::kNone;
    if (shaped && std::any_of(unplaceable.begin(), unplaceable.end(),
                              [&](const Task* t) { return SameShape(*t, task); })) {
      ++it;
      continue;
    }
    if (!PlaceOne(task)) {
      if (std::exchange(held_by_bound_, false)) {
        // Its bound, not the workers, holds it back: no miss, and no shape for others; it
        // waits out of the ready queue until the bound changes.
        it = Park(it);
        continue;
      }
      if (!CouldEverPlace(task)) {
        // Not with the workers attached: it waits aside until another attaches.
        it = ready_.erase(it);
        stalled_.insert(task.id);
        continue;
      }
      if (shaped && unplaceable.size() < kMaxShapesPerRound) unplaceable.push_back(&task);
      ++it;
      ++misses;
      continue;
    }
    it = ready_.erase(it);
    misses = 0;
    // A task that did not start took a place in its worker's window, which may now be full.
    if (task.state != TaskState::kRunning || task.after != 0) {
      if (!workers_.Open(*workers_.Find(task.worker))) --open;
    }
  }
  for (auto& [id, w] : workers_.workers()) {
    if (w->freed) workers_.StartQueued(*w);
  }
}

bool Dispatcher::PlaceOne(Task& task) {
  const auto start = std::chrono::steady_clock::now();
  const bool placed = TryPlace(task);
  const auto nanos = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start)
          .count());
  const uint64_t units = nanos / 64;
  const int bucket =
      units <= 1 ? 0 : std::min<int>(PlacementCounters::kBuckets - 1, std::bit_width(units - 1));
  ++counters_.ns_buckets[static_cast<size_t>(bucket)];
  counters_.ns_sum += nanos;
  ++counters_.tries;
  return placed;
}

bool Dispatcher::TryPlace(Task& task) {
  const std::span<const SessionId> runners = workers_.Runners(task.spec.function);
  if (runners.empty()) return false;
  // Its output: declared, or expected of its kind; reserved where it is placed.
  task.reserve = Expected(task);
  if (const Bounds* bounds = workers_.bounds();
      bounds != nullptr && !bounds->Fits(task.submitter, task.spec, task.reserve)) {
    // An output of unknown size held back (its kind not measured yet) holds back every other
    // such one; one of known size every one as large. Not so one held back for its inputs on
    // disk as well: another as large may have none.
    if (bounds->Restores(task.submitter, task.spec, task.reserve) == 0) {
      Held& held = held_at_[{task.submitter, task.spec.bound_id}];
      if (task.reserve == 0) {
        held.unknown = true;
      } else {
        held.least = std::min(held.least, task.reserve);
      }
    }
    held_by_bound_ = true;
    return false;
  }

  const std::vector<InputView> inputs = InputsOf(task.spec);
  task.input_bytes = 0;
  for (const InputView& in : inputs) task.input_bytes += in.bytes;
  // Devices without room for the outputs, beside those the tasks placed there will make,
  // are left out of every view, while some placed task may still end and free room.
  std::map<int32_t, bool> roomy;
  bool any_room = true;  // false: room left every device out
  const std::function<bool(int32_t)> has_room = [&](int32_t device) {
    if (task.reserve == 0 || !any_room) return true;
    auto [it, fresh] = roomy.emplace(device, false);
    if (fresh) it->second = HasRoom(device, task.reserve);
    return it->second;
  };

  const std::vector<Way> ways = workers_.Ways(task.spec);
  std::optional<Plan> plans[2];
  const auto plan_ways = [&] {
    for (size_t i = 0; i < ways.size(); ++i) {
      plans[i] = PlanWay(task, ways[i], runners, inputs, has_room);
    }
  };
  plan_ways();
  if (!plans[0] && !plans[1] && task.reserve > 0 &&
      std::ranges::none_of(roomy, [](const auto& d) { return d.second; }) &&
      workers_.NoneMoving()) {
    any_room = false;
    plan_ways();
  }
  const Plan* plan = nullptr;
  if (ways.size() == 2 && plans[0] && plans[1]) {
    plan = &ChooseVariant(task, *plans[0], *plans[1]);
  } else {
    plan = plans[0] ? &*plans[0] : plans[1] ? &*plans[1] : nullptr;
    if (plan == nullptr) return false;
    if (ways.size() == 2) {
      const bool gpu = plan->way->runs == Way::Runs::kGpuVariant;
      task.variant = gpu ? "gpu" : "cpu";
      task.variant_reason =
          std::string("the ") + (gpu ? "CPU" : "GPU") + " variant found no place now";
      durations_.Chose(DurationModel::Of(task.spec), gpu, task.input_bytes);
    }
  }
  if (ways.size() == 1) {
    task.variant.clear();
    task.variant_reason.clear();
  }

  const Choice& choice = plan->choice;
  task.request = plan->way->request;
  task.choice = choice;
  task.device = choice.device;
  task.duration_s = plan->duration_s;
  ++counters_.placements;
  counters_.local_bytes += choice.local_bytes;
  counters_.moved_bytes += choice.moved_bytes;
  if (!workers_.Place(*plan->worker, task, plan->now) && choice.moved_bytes > 0) {
    Prefetch(task, inputs);
  }
  return true;
}

void Dispatcher::Prefetch(const Task& task, std::span<const InputView> inputs) {
  // Each input to where the task reads it: its device, or host memory for host inputs.
  std::vector<ObjectId> missing, to_host;
  for (size_t k = 0; k < inputs.size(); ++k) {
    const int32_t where = inputs[k].host ? kHostMemory : task.device;
    if ((inputs[k].tiers & (uint64_t{1} << (where + 1))) != 0) continue;
    (where == task.device ? missing : to_host).push_back(task.spec.inputs[k]);
  }
  counters_.prefetches += missing.size() + to_host.size();
  if (!missing.empty()) store_.Prefetch(missing, task.device);
  if (!to_host.empty()) store_.Prefetch(to_host, kHostMemory);
}

std::optional<Dispatcher::Plan> Dispatcher::PlanWay(const Task& task, const Way& way,
                                                    std::span<const SessionId> runners,
                                                    std::span<const InputView> inputs,
                                                    const std::function<bool(int32_t)>& has_room) {
  const ResourceRequest& request = way.request;
  const bool on_gpu = request.gpu > 0;
  if (!on_gpu && !has_room(kHostMemory)) return std::nullopt;

  // Each worker with room in its window is seen twice when busy: with what is free now (the
  // task starts at once) and as it will be once idle (the task queues there).
  struct Candidate {
    Worker* worker;
    bool now;
  };
  std::vector<Candidate> candidates;
  std::vector<WorkerView> views;
  for (SessionId id : runners) {
    Worker& w = *workers_.Find(id);
    if (!workers_.Open(w)) continue;
    if (w.running.size() >= kMaxRunningPerWorker) continue;
    if (!way.eligible(w, task.spec.function)) continue;
    const bool idle = w.running.empty() && w.queue.empty();
    if (w.queue.empty()) {
      candidates.push_back({&w, true});
      views.push_back(w.resources.View(0));
    }
    if (!idle && w.resources.CouldEverFit(request)) {
      candidates.push_back({&w, false});
      views.push_back(w.resources.IdleView(workers_.QueueWait(w)));
    }
  }
  for (WorkerView& v : views) {
    std::erase_if(v.gpus, [&](const WorkerView::Gpu& g) { return !has_room(g.device); });
  }
  // Soft affinity takes the favourite device when the task can start there now; otherwise
  // the cost model chooses (queueing there included), as without affinity.
  Affinity affinity = task.spec.affinity;
  if (affinity == Affinity::kSoft && on_gpu) {
    const auto favourite = DeviceWithMostInput(inputs, /*gpus_only=*/true);
    bool free_now = false;
    for (size_t i = 0; i < views.size() && favourite && !free_now; ++i) {
      if (!candidates[i].now) continue;
      for (const WorkerView::Gpu& g : views[i].gpus) {
        free_now |= g.device == *favourite && g.free_share + kResourceEpsilon >= request.gpu;
      }
    }
    if (!free_now) affinity = Affinity::kNone;
  }
  const Durations expected =
      durations_.ExpectedDurations(DurationModel::Of(task.spec), task.input_bytes);
  Durations durations = expected;
  Bandwidths bandwidths = this->bandwidths();
  if (options_.random_placement) {
    // Every cost zeroed, over the candidates in random order: Place takes the first that fits.
    constexpr double kFree = std::numeric_limits<double>::infinity();
    bandwidths = {kFree, kFree, kFree};
    durations = {.cpu = 0, .gpu = 0};
    affinity = Affinity::kNone;
    std::vector<size_t> order(views.size());
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), random_);
    std::vector<Candidate> shuffled_candidates;
    std::vector<WorkerView> shuffled_views;
    for (size_t i : order) {
      shuffled_candidates.push_back(candidates[i]);
      shuffled_views.push_back(std::move(views[i]));
      shuffled_views.back().queue_wait_s = 0;
      std::shuffle(shuffled_views.back().gpus.begin(), shuffled_views.back().gpus.end(), random_);
    }
    candidates = std::move(shuffled_candidates);
    views = std::move(shuffled_views);
  }
  auto choice = Place(request, affinity, inputs, views, durations, bandwidths);
  if (!choice) return std::nullopt;
  return Plan{.choice = *choice,
              .worker = candidates[choice->worker].worker,
              .now = candidates[choice->worker].now,
              .duration_s = on_gpu ? expected.gpu : expected.cpu,
              .way = &way};
}

const Dispatcher::Plan& Dispatcher::ChooseVariant(Task& task, const Plan& cpu, const Plan& gpu) {
  const DurationModel::Of f(task.spec);
  if (options_.random_placement) {
    const bool on_gpu = (random_() & 1) != 0;
    task.variant = on_gpu ? "gpu" : "cpu";
    task.variant_reason = "random placement";
    return on_gpu ? gpu : cpu;
  }
  const DurationModel::Estimates estimates = durations_.Expected(f, task.input_bytes);
  const bool gpu_faster = gpu.choice.finish_s < cpu.choice.finish_s;
  const Plan& best = gpu_faster ? gpu : cpu;
  const Plan& other = gpu_faster ? cpu : gpu;
  const DurationModel::Estimate& other_estimate = gpu_faster ? estimates.cpu : estimates.gpu;
  const uint32_t passed_over = durations_.PassedOver(f, !gpu_faster, task.input_bytes);
  const char* best_name = gpu_faster ? "gpu" : "cpu";
  const char* other_name = gpu_faster ? "cpu" : "gpu";
  auto terms = [](const char* name, const Plan& p) {
    return std::string(name) + " " + ipc::FormatSeconds(p.choice.finish_s) + " (" +
           ipc::FormatSeconds(p.choice.transfer_s) + " moving " +
           std::to_string(p.choice.moved_bytes) + " B, " + ipc::FormatSeconds(p.duration_s) +
           " running)";
  };
  const Plan* chosen = &best;
  if (!other_estimate.measured && passed_over > 0) {
    chosen = &other;
    task.variant_reason = std::string("exploring: ") + other_name +
                          " not measured at this input size yet; " + terms(best_name, best) +
                          " against " + terms(other_name, other);
  } else if (passed_over >= kExploreEvery) {
    chosen = &other;
    task.variant_reason = std::string("exploring: ") + other_name + " not run for the last " +
                          std::to_string(passed_over) + " tasks of this input size; " +
                          terms(best_name, best) + " against " + terms(other_name, other);
  } else {
    task.variant_reason = "expected to finish first: " + terms(best_name, best) + " against " +
                          terms(other_name, other);
  }
  const bool on_gpu = chosen == &gpu;
  task.variant = on_gpu ? "gpu" : "cpu";
  durations_.Chose(f, on_gpu, task.input_bytes);
  return *chosen;
}

std::vector<InputView> Dispatcher::InputsOf(const TaskSpec& spec) const {
  std::vector<StoreAccess::Object> found(spec.inputs.size());
  store_.Locate(spec.inputs, found);
  std::vector<InputView> inputs(found.size());
  for (size_t k = 0; k < found.size(); ++k) inputs[k] = found[k].where;
  for (uint32_t k : spec.host_inputs) inputs[k].host = true;
  return inputs;
}

bool Dispatcher::CouldEverPlace(const Task& task) const {
  // Hard affinity: a way on a GPU needs a worker offering the GPU holding most of its input.
  std::optional<int32_t> favourite;
  if (task.spec.affinity == Affinity::kHard) {
    favourite = DeviceWithMostInput(InputsOf(task.spec), /*gpus_only=*/true);
  }
  return workers_.CouldEverRun(task.spec, favourite);
}

}  // namespace depot::scheduler
