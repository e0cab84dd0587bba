#include "store/handoff_deadlines.h"

#include <algorithm>
#include <utility>

namespace depot::store {

void HandoffDeadlines::AddDue(const Key& key, uint64_t deadline_ns) {
  auto& mine = by_group_[key.group];
  if (mine.empty() || deadline_ns < mine.begin()->first) {
    if (!mine.empty()) heads_.erase({mine.begin()->first, key.group});
    heads_.emplace(deadline_ns, key.group);
  }
  mine.emplace(deadline_ns, key);
  ++size_;
}

void HandoffDeadlines::Add(const Key& key, uint64_t deadline_ns, ClientId sender,
                           uint64_t grace_ns) {
  if (deadline_ns != kNever) AddDue(key, deadline_ns);
  by_key_[key].insert(Entry{deadline_ns, sender});
  if (sender != 0) {
    graces_[sender].emplace(std::pair(key, deadline_ns), grace_ns);
    ++graced_count_;
  }
}

uint64_t HandoffDeadlines::Ungrace(const Key& key, const Entry& entry) {
  if (entry.sender == 0) return 0;
  const auto mine = graces_.find(entry.sender);
  if (mine == graces_.end()) return 0;
  const auto it = mine->second.find(std::pair(key, entry.deadline_ns));
  if (it == mine->second.end()) return 0;
  mine->second.erase(it);
  if (mine->second.empty()) graces_.erase(mine);
  --graced_count_;
  return kBytes;
}

uint64_t HandoffDeadlines::Claimed(const Key& key) {
  const auto it = by_key_.find(key);
  if (it == by_key_.end()) return 0;
  const Entry taken = *it->second.begin();
  it->second.erase(it->second.begin());
  if (it->second.empty()) by_key_.erase(it);
  return Ungrace(key, taken);
}

bool HandoffDeadlines::SenderEnded(ClientId sender, uint64_t ended_ns, size_t max) {
  const auto mine = graces_.find(sender);
  if (mine == graces_.end()) return false;
  auto& graces = mine->second;
  for (size_t done = 0; done < max && !graces.empty(); ++done) {
    const auto first = graces.begin();
    const auto [key, deadline] = first->first;
    const uint64_t due = std::min(deadline, ended_ns + first->second);
    graces.erase(first);
    --graced_count_;
    // Still waiting: a claim, an expiry or the group's end takes a grace off here with its
    // reference (Ungrace), so its entry is there.
    const auto it = by_key_.find(key);
    if (it == by_key_.end()) continue;
    const auto entry = it->second.find(Entry{deadline, sender});
    if (entry == it->second.end()) continue;
    it->second.erase(entry);
    // Its grace's charge passes to the deadline made of it; one it had already stays
    // charged until it comes due, as a claimed one's does.
    AddDue(key, due);
    it->second.insert(Entry{due, 0});
  }
  if (!graces.empty()) return true;
  graces_.erase(mine);
  return false;
}

uint64_t HandoffDeadlines::ForgetGroup(ClientId group) {
  uint64_t charged = 0;
  if (const auto mine = by_group_.find(group); mine != by_group_.end()) {
    heads_.erase({mine->second.begin()->first, group});
    size_ -= mine->second.size();
    charged += mine->second.size() * kBytes;
    by_group_.erase(mine);
  }
  auto first = by_key_.lower_bound(Key{group, 0, INT32_MIN});
  auto last = first;
  for (; last != by_key_.end() && last->first.group == group; ++last) {
    for (const Entry& entry : last->second) charged += Ungrace(last->first, entry);
  }
  by_key_.erase(first, last);
  return charged;
}

std::vector<HandoffDeadlines::Key> HandoffDeadlines::Expire(
    uint64_t now_ns, std::map<ClientId, uint64_t>* freed_bytes, size_t max) {
  std::vector<Key> due;
  for (size_t removed = 0; removed < max && !heads_.empty() && heads_.begin()->first <= now_ns;
       ++removed) {
    // The earliest deadline of all: its group's first.
    const ClientId group = heads_.begin()->second;
    heads_.erase(heads_.begin());
    const auto mine = by_group_.find(group);
    const auto [deadline, key] = *mine->second.begin();
    mine->second.erase(mine->second.begin());
    if (mine->second.empty()) {
      by_group_.erase(mine);
    } else {
      heads_.emplace(mine->second.begin()->first, group);
    }
    --size_;
    (*freed_bytes)[group] += kBytes;
    // Still a reference of the group's, unless a claim took it: the same deadline, or an
    // equal one, which is as good (of any sender: the first, none, if several).
    const auto it = by_key_.find(key);
    if (it == by_key_.end()) continue;
    const auto found = it->second.lower_bound(Entry{deadline, 0});
    if (found == it->second.end() || found->deadline_ns != deadline) continue;
    const Entry entry = *found;
    it->second.erase(found);
    if (it->second.empty()) by_key_.erase(it);
    (*freed_bytes)[group] += Ungrace(key, entry);
    due.push_back(key);
  }
  return due;
}

}  // namespace depot::store
