// Fakes of what the scheduler's parts talk to, for their tests: the store as the scheduler
// sees it (StoreAccess) and workers (WorkerLink). No daemon, no sockets.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "scheduler/store_access.h"
#include "scheduler/worker_table.h"

namespace depot::scheduler {

constexpr uint64_t kMiB = 1 << 20;
constexpr uint64_t Bit(int32_t device) { return uint64_t{1} << (device + 1); }

// The store as the scheduler sees it: objects with a state, a size and tiers; events queued
// until Deliver (the real store delivers them after the change, too).
class FakeStore final : public StoreAccess {
 public:
  struct Entry {
    State state = State::kMissing;
    uint64_t bytes = 0;
    uint64_t tiers = 0;
    std::string message;
    int holds = 0;
  };

  void Locate(std::span<const ObjectId> ids, std::span<Object> out) const override {
    for (size_t i = 0; i < ids.size(); ++i) {
      auto it = objects.find(ids[i]);
      out[i] = it == objects.end() ? Object{}
                                   : Object{it->second.state, {it->second.bytes, it->second.tiers}};
    }
  }
  std::string FailureOf(const ObjectId& id) const override {
    auto it = objects.find(id);
    return it == objects.end() ? "" : it->second.message;
  }
  void Prefetch(std::span<const ObjectId> ids, int32_t device) override {
    for (const ObjectId& id : ids) prefetched.emplace_back(id, device);
  }
  bool Hold(const ObjectId& id) override {
    auto it = objects.find(id);
    if (it == objects.end() || it->second.state == State::kMissing ||
        it->second.state == State::kCreating) {
      return false;
    }
    ++it->second.holds;
    return true;
  }
  void Drop(const ObjectId& id) override {
    auto it = objects.find(id);
    ASSERT_NE(it, objects.end());
    ASSERT_GT(it->second.holds, 0) << id.Hex();
    --it->second.holds;
  }
  void SealFailed(std::span<const ObjectId> ids, std::string_view message) override {
    if (!room_for_failed) return;  // a store with no slot left makes none
    for (const ObjectId& id : ids) {
      if (objects.contains(id)) continue;
      objects[id] = {State::kFailed, 0, Bit(kHostMemory), std::string(message), 0};
      events.push_back([this, id](ObjectEvents& e) { e.OnSealed(id, true); });
    }
  }
  Bandwidths CopyBandwidths(const Bandwidths& assumed) const override { return assumed; }
  void Delete(const ObjectId& id) override {
    deleted.push_back(id);
    auto it = objects.find(id);
    if (it == objects.end() || it->second.state == State::kCreating) return;
    EXPECT_EQ(it->second.holds, 0) << "the graph deletes what it no longer holds";
    objects.erase(it);
  }
  void AbortCreating(uint64_t creator, std::span<const ObjectId> ids) override {
    for (const ObjectId& id : ids) {
      auto it = objects.find(id);
      if (it != objects.end() && it->second.state == State::kCreating) {
        aborted.emplace_back(creator, id);
        objects.erase(it);
      }
    }
  }
  Status Charge(uint64_t session, int64_t bytes) override {
    if (bytes > 0 && charged[session] + bytes > charge_limit) {
      return Status::LimitExceeded("over the test's limit");
    }
    charged[session] += bytes;
    return Status::OK();
  }
  uint64_t Room(int32_t device) const override {
    auto it = room.find(device);
    return it == room.end() ? UINT64_MAX : it->second;
  }
  bool CanSpill() const override { return disk; }
  // With a disk, a sealed object not in `kept` starts leaving memory: LeaveMemory ends that.
  bool Spill(const ObjectId& id) override {
    ++spill_asks;
    auto it = objects.find(id);
    if (!disk || it == objects.end() || it->second.state != State::kSealed || kept.contains(id)) {
      return false;
    }
    spilled.push_back(id);
    return true;
  }

  // What clients and workers do to the store.
  ObjectId Put(uint64_t bytes, int32_t device = kHostMemory) {
    ObjectId id = ObjectId::Random();
    objects[id] = {State::kSealed, bytes, Bit(device), "", 0};
    return id;
  }
  ObjectId Creating() {
    ObjectId id = ObjectId::Random();
    objects[id] = {State::kCreating, 0, 0, "", 0};
    return id;
  }
  void Seal(const ObjectId& id, uint64_t bytes, int32_t device = kHostMemory) {
    objects[id] = {State::kSealed, bytes, Bit(device), "", objects[id].holds};
    events.push_back([id](ObjectEvents& e) { e.OnSealed(id, false); });
  }
  void Free(const ObjectId& id) {
    objects.erase(id);
    events.push_back([id](ObjectEvents& e) { e.OnFreed(id); });
  }
  // The object's last copy in memory went to disk (false), or a copy came back (true).
  void Moved(const ObjectId& id, bool in_memory) {
    events.push_back([id, in_memory](ObjectEvents& e) { e.OnMemory(id, in_memory); });
  }
  void Deliver(ObjectEvents& to) {
    while (!events.empty()) {
      auto event = std::move(events.front());
      events.pop_front();
      event(to);
    }
  }
  int HoldsOn(const ObjectId& id) const {
    auto it = objects.find(id);
    return it == objects.end() ? 0 : it->second.holds;
  }
  int TotalHolds() const {
    int n = 0;
    for (const auto& [id, e] : objects) n += e.holds;
    return n;
  }

  std::map<ObjectId, Entry> objects;
  std::deque<std::function<void(ObjectEvents&)>> events;
  std::vector<std::pair<ObjectId, int32_t>> prefetched;
  std::map<int32_t, uint64_t> room;
  std::vector<std::pair<uint64_t, ObjectId>> aborted;
  std::vector<ObjectId> deleted;
  bool disk = false;              // CanSpill
  std::vector<ObjectId> spilled;  // Spill's, in order
  std::set<ObjectId> kept;        // Spill refuses these
  size_t spill_asks = 0;          // calls of Spill
  std::map<uint64_t, int64_t> charged;
  int64_t charge_limit = INT64_MAX;
  bool room_for_failed = true;
};

// One assignment, copied out of the scheduler's message.
struct Sent {
  SessionId worker;
  TaskId task;
  uint32_t attempt;
  int32_t device;
  std::string function;
  std::vector<ObjectId> inputs;
  std::vector<ObjectId> outputs;
  ResourceRequest resources;
  std::vector<uint32_t> sealed;
  TaskId after = 0;
  bool worker_full = false;
};

class FakeLink final : public WorkerLink {
 public:
  void Assign(SessionId worker, std::span<const Assignment> tasks) override {
    ++messages;
    for (const Assignment& a : tasks) {
      sent.push_back({worker, a.task, a.attempt, a.device, a.spec->function, a.spec->inputs,
                      std::vector<ObjectId>(a.outputs.begin(), a.outputs.end()), a.spec->resources,
                      a.sealed, a.after, a.worker_full});
    }
  }
  void Drained(SessionId worker) override { drained.push_back(worker); }
  // The assignments not taken yet, oldest first.
  std::vector<Sent> Take() { return std::exchange(sent, {}); }

  std::vector<Sent> sent;
  std::vector<SessionId> drained;
  int messages = 0;
};

}  // namespace depot::scheduler
