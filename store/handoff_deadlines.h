// The deadlines of handoffs that expire (ObjectStore::Handoff with a time to live): a group
// that nobody claims from for that long gives the reference back, so that a receiver that
// never comes (a message lost, a queue never read) leaks nothing for longer than that, even
// while the group's processes live on.
//
// References are counted, not named: a claim takes the group's reference that would expire
// first, and one whose handoff had no deadline only when none would. Each deadline is
// charged to the group's account as daemon memory (kBytes), until it expires or the group
// ends. Deadlines are kept by group, so a group's end costs its own deadlines only, and
// expire in slices, so that a million due at once do not hold the loop.
#pragma once

#include <cstddef>
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
  // Removes the deadlines due at `now_ns`, in time order, at most `max` of them (next() then
  // says whether more are due). Returns the references to give back (a key once per
  // reference), and adds to *freed_bytes what each removed deadline was charged.
  std::vector<Key> Expire(uint64_t now_ns, std::map<ClientId, uint64_t>* freed_bytes,
                          size_t max = SIZE_MAX);

  // The earliest deadline still to come, 0 if none.
  uint64_t next() const { return heads_.empty() ? 0 : heads_.begin()->first; }
  size_t size() const { return size_; }

 private:
  // Every deadline of each group, in time order, until it is due or the group ends; one a
  // claim took stays here (charged) until then, and is then found gone from by_key_.
  std::map<ClientId, std::multimap<uint64_t, Key>> by_group_;
  // Each group's earliest deadline: the groups in the order their next deadline comes.
  std::set<std::pair<uint64_t, ClientId>> heads_;
  // The deadlines of each key's references not claimed yet.
  std::map<Key, std::multiset<uint64_t>> by_key_;
  size_t size_ = 0;  // deadlines in by_group_
};

}  // namespace depot::store
