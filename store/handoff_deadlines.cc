#include "store/handoff_deadlines.h"

namespace depot::store {

void HandoffDeadlines::Add(const Key& key, uint64_t deadline_ns) {
  by_time_.emplace(deadline_ns, key);
  by_key_[key].insert(deadline_ns);
  ++per_group_[key.group];
}

void HandoffDeadlines::Claimed(const Key& key) {
  const auto it = by_key_.find(key);
  if (it == by_key_.end()) return;
  it->second.erase(it->second.begin());
  if (it->second.empty()) by_key_.erase(it);
}

uint64_t HandoffDeadlines::ForgetGroup(ClientId group) {
  if (per_group_.erase(group) == 0) return 0;
  auto first = by_key_.lower_bound(Key{group, 0, INT32_MIN});
  auto last = first;
  while (last != by_key_.end() && last->first.group == group) ++last;
  by_key_.erase(first, last);
  uint64_t bytes = 0;
  for (auto it = by_time_.begin(); it != by_time_.end();) {
    if (it->second.group == group) {
      it = by_time_.erase(it);
      bytes += kBytes;
    } else {
      ++it;
    }
  }
  return bytes;
}

std::vector<HandoffDeadlines::Key> HandoffDeadlines::Expire(
    uint64_t now_ns, std::map<ClientId, uint64_t>* freed_bytes) {
  std::vector<Key> due;
  while (!by_time_.empty() && by_time_.begin()->first <= now_ns) {
    const auto [deadline, key] = *by_time_.begin();
    by_time_.erase(by_time_.begin());
    (*freed_bytes)[key.group] += kBytes;
    if (const auto count = per_group_.find(key.group); --count->second == 0) {
      per_group_.erase(count);
    }
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
