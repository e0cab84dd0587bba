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
//
// A handoff may also be bound to its sender's session (a grace): unclaimed, its reference
// goes back that long after the sender has ended (or at its own deadline, if sooner). Until
// the sender ends such a reference waits here with the sender named and no due time of its
// own (kNever unless it has a deadline too), and a claim takes it only after every reference
// of the key with a deadline; when the sender ends, each of its references still waiting
// gets its due time (SenderEnded). A grace is charged kBytes of its own, like a deadline,
// given back when a claim takes the reference or an expiry gives it back, and passed on to
// the deadline the sender's end makes of it.
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

  // No deadline: a reference bound to its sender only, until the sender ends.
  static constexpr uint64_t kNever = UINT64_MAX;

  // What Add charges the group: kBytes for a deadline, kBytes for a grace.
  static uint64_t Cost(uint64_t deadline_ns, ClientId sender) {
    return (deadline_ns != kNever ? kBytes : 0) + (sender != 0 ? kBytes : 0);
  }

  // The group took one more reference of `key`, to be given back at `deadline_ns`
  // (MonotonicNanos; kNever: none) unless claimed first; with a `sender` (non-zero), also
  // `grace_ns` after that session ends (SenderEnded) if sooner. One of the two is given.
  void Add(const Key& key, uint64_t deadline_ns, ClientId sender = 0, uint64_t grace_ns = 0);
  // A claim took one of the group's references of `key`: the one that expires first, if any
  // (one bound to a sender's end only after those with deadlines). Returns the bytes freed
  // (a grace's charge; a deadline's stays charged until it comes due).
  uint64_t Claimed(const Key& key);
  // The session `sender` ended at `ended_ns`: each reference it handed off with a grace and
  // still waiting gets its due time, `ended_ns` plus the grace (or its own deadline, if
  // sooner), at most `max` of them (a session may hold a million graces: the caller goes on
  // later, after what else is ready). Returns whether some are left.
  bool SenderEnded(ClientId sender, uint64_t ended_ns, size_t max = SIZE_MAX);
  // Forgets every deadline and grace of `group`, which ended (its references go with it).
  // Returns the bytes they were charged.
  uint64_t ForgetGroup(ClientId group);
  // Removes the deadlines due at `now_ns`, in time order, at most `max` of them (next() then
  // says whether more are due). Returns the references to give back (a key once per
  // reference), and adds to *freed_bytes what each removed deadline was charged (and the
  // grace of a reference given back before its sender ended).
  std::vector<Key> Expire(uint64_t now_ns, std::map<ClientId, uint64_t>* freed_bytes,
                          size_t max = SIZE_MAX);

  // The earliest deadline still to come, 0 if none.
  uint64_t next() const { return heads_.empty() ? 0 : heads_.begin()->first; }
  size_t size() const { return size_; }
  // References waiting for their sender's end (graces not yet turned into deadlines).
  size_t graced() const { return graced_count_; }

 private:
  // A reference of a key: when it is due, and the sender whose end it waits for (0: none).
  struct Entry {
    uint64_t deadline_ns = kNever;
    ClientId sender = 0;
    auto operator<=>(const Entry&) const = default;
  };
  // Takes `entry` off the graces of its sender, if it has one; returns the bytes freed.
  uint64_t Ungrace(const Key& key, const Entry& entry);
  void AddDue(const Key& key, uint64_t deadline_ns);

  // Every deadline of each group, in time order, until it is due or the group ends; one a
  // claim took stays here (charged) until then, and is then found gone from by_key_.
  std::map<ClientId, std::multimap<uint64_t, Key>> by_group_;
  // Each group's earliest deadline: the groups in the order their next deadline comes.
  std::set<std::pair<uint64_t, ClientId>> heads_;
  // The deadlines (and senders) of each key's references not claimed yet.
  std::map<Key, std::multiset<Entry>> by_key_;
  size_t size_ = 0;  // deadlines in by_group_
  // Each sender's references waiting for its end: by key and deadline (equal ones are as
  // good as one another, as in by_key_), their graces.
  std::map<ClientId, std::multimap<std::pair<Key, uint64_t>, uint64_t>> graces_;
  size_t graced_count_ = 0;
};

}  // namespace depot::store
