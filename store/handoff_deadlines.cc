#include "store/handoff_deadlines.h"

#include <algorithm>

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
    graces_[sender].emplace(key, Grace{deadline_ns, grace_ns});
    ++graced_count_;
  }
}

uint64_t HandoffDeadlines::Ungrace(const Key& key, const Entry& entry) {
  if (entry.sender == 0) return 0;
  const auto mine = graces_.find(entry.sender);
  if (mine == graces_.end()) return 0;
  auto [first, last] = mine->second.equal_range(key);
  const auto it = std::find_if(
      first, last, [&](const auto& kv) { return kv.second.deadline_ns == entry.deadline_ns; });
  if (it == last) return 0;
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

void HandoffDeadlines::SenderEnded(ClientId sender, uint64_t now_ns) {
  const auto mine = graces_.find(sender);
  if (mine == graces_.end()) return;
  graced_count_ -= mine->second.size();
  for (const auto& [key, grace] : mine->second) {
    // Waiting still: a claim, an expiry or the group's end would have taken it off here.
    const auto it = by_key_.find(key);
    if (it == by_key_.end()) continue;
    auto& entries = it->second;
    const auto entry = entries.find(Entry{grace.deadline_ns, sender});
    if (entry == entries.end()) continue;
    entries.erase(entry);
    const uint64_t due = std::min(grace.deadline_ns, now_ns + grace.grace_ns);
    // Its grace's charge passes to the deadline made of it; one it had already stays
    // charged until it comes due, as a claimed one's does.
    AddDue(key, due);
    entries.insert(Entry{due, 0});
  }
  graces_.erase(mine);
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
