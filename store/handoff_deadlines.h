// The deadlines of handoffs that expire (ObjectStore::Handoff with a time to live): a group
// that nobody claims from for that long gives the reference back, so that a receiver that
// never comes (a message lost, a queue never read) leaks nothing for longer than that, even
// while the group's processes live on.
//
// References are counted, not named: a claim takes the group's reference that would expire
// first, and one whose handoff had no deadline only when none would. Each deadline is
// charged to the group's account as daemon memory (kBytes), until it expires or the group
// ends.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <tuple>
#include <vector>

#include "store/object_table.h"

namespace depot::store {

class HandoffDeadlines {
 public:
  // What one deadline costs the daemon: an entry in each of the two maps below.
  static constexpr uint64_t kBytes = 160;

  // A group's references to an object on a tier.
  struct Key {
    ClientId group = 0;
    uint32_t slot = 0;
    int32_t tier = 0;
    auto operator<=>(const Key&) const = default;
  };

  // The group took one more reference of `key`, to be given back at `deadline_ns`
  // (MonotonicNanos) unless claimed first.
  void Add(const Key& key, uint64_t deadline_ns);
  // A claim took one of the group's references of `key`: the one that expires first, if any.
  void Claimed(const Key& key);
  // Forgets every deadline of `group`, which ended (its references go with it). Returns the
  // bytes they were charged.
  uint64_t ForgetGroup(ClientId group);
  // Removes the deadlines due at `now_ns`. Returns the references to give back (a key once
  // per reference), and adds to *freed_bytes what each removed deadline was charged.
  std::vector<Key> Expire(uint64_t now_ns, std::map<ClientId, uint64_t>* freed_bytes);

  // The earliest deadline still to come, 0 if none.
  uint64_t next() const { return by_time_.empty() ? 0 : by_time_.begin()->first; }
  size_t size() const { return by_time_.size(); }

 private:
  // Every deadline, in time order, until it is due or its group ends; one a claim took
  // stays here (charged) until then, and is then found gone from by_key_.
  std::multimap<uint64_t, Key> by_time_;
  // The deadlines of each key's references not claimed yet.
  std::map<Key, std::multiset<uint64_t>> by_key_;
  // How many of by_time_'s entries each group has: a session's end (every client's end
  // calls ForgetGroup) costs nothing where its account has none.
  std::map<ClientId, uint64_t> per_group_;
};

}  // namespace depot::store
