#include "store/handoff_deadlines.h"

namespace depot::store {

void HandoffDeadlines::Add(const Key& key, uint64_t deadline_ns) {
  auto& mine = by_group_[key.group];
  if (mine.empty() || deadline_ns < mine.begin()->first) {
    if (!mine.empty()) heads_.erase({mine.begin()->first, key.group});
    heads_.emplace(deadline_ns, key.group);
  }
  mine.emplace(deadline_ns, key);
  by_key_[key].insert(deadline_ns);
  ++size_;
}

void HandoffDeadlines::Claimed(const Key& key) {
  const auto it = by_key_.find(key);
  if (it == by_key_.end()) return;
  it->second.erase(it->second.begin());
  if (it->second.empty()) by_key_.erase(it);
}

uint64_t HandoffDeadlines::ForgetGroup(ClientId group) {
  const auto mine = by_group_.find(group);
  if (mine == by_group_.end()) return 0;
  heads_.erase({mine->second.begin()->first, group});
  const size_t count = mine->second.size();
  by_group_.erase(mine);
  size_ -= count;
  auto first = by_key_.lower_bound(Key{group, 0, INT32_MIN});
  auto last = first;
  while (last != by_key_.end() && last->first.group == group) ++last;
  by_key_.erase(first, last);
  return count * kBytes;
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
    // equal one, which is as good.
    const auto it = by_key_.find(key);
    if (it == by_key_.end()) continue;
    const auto found = it->second.find(deadline);
    if (found == it->second.end()) continue;
    it->second.erase(found);
    if (it->second.empty()) by_key_.erase(it);
    due.push_back(key);
  }
  return due;
}

}  // namespace depot::store
