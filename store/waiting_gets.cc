#include "store/waiting_gets.h"

#include <algorithm>
#include <chrono>

namespace depot::store {

WaitingGets::WaitingGets(boost::asio::io_context& loop, ClientAccounts& accounts)
    : loop_(loop), accounts_(accounts) {}

WaitingGets::~WaitingGets() {
  for (auto& [id, entry] : gets_) entry.timer->cancel();
}

WaitingGets::Id WaitingGets::Add(Get get, int64_t timeout_ms) {
  const Id id = next_++;
  accounts_.CountMetadata(get.client, static_cast<int64_t>(get.cost));
  bool waits_for_seal = false;
  for (size_t i = 0; i < get.ids.size(); ++i) {
    if (get.waits[i] != Wait::kSeal) continue;
    by_object_[get.ids[i]].waiters.emplace_back(id, static_cast<uint32_t>(i));
    waits_for_seal = true;
  }
  by_client_[get.client].push_back(id);
  Entry& entry = gets_[id];
  entry.get = std::move(get);
  entry.timer = std::make_unique<boost::asio::steady_timer>(loop_);
  if (timeout_ms > 0 && waits_for_seal) {
    entry.timer->expires_after(std::chrono::milliseconds(timeout_ms));
    entry.timer->async_wait([this, id](const boost::system::error_code& ec) {
      if (!ec) Expire(id);
    });
  }
  return id;
}

WaitingGets::Get* WaitingGets::Find(Id id) {
  auto it = gets_.find(id);
  return it == gets_.end() ? nullptr : &it->second.get;
}

std::vector<WaitingGets::SealWaiter> WaitingGets::TakeSealWaiters(const ObjectId& id) {
  auto it = by_object_.find(id);
  if (it == by_object_.end()) return {};
  std::vector<SealWaiter> waiters = std::move(it->second.waiters);
  by_object_.erase(it);
  std::erase_if(waiters, [this](const SealWaiter& w) { return !Indexed(w.first); });
  std::sort(waiters.begin(), waiters.end());
  return waiters;
}

bool WaitingGets::Indexed(Id id) const {
  auto it = gets_.find(id);
  return it != gets_.end() && it->second.indexed;
}

void WaitingGets::Unindex(Entry& entry) {
  entry.indexed = false;
  const Get& get = entry.get;
  for (size_t i = 0; i < get.ids.size(); ++i) {
    if (get.waits[i] != Wait::kSeal) continue;
    auto w = by_object_.find(get.ids[i]);
    if (w == by_object_.end()) continue;
    SealWaits& list = w->second;
    // Counted once per index; a pass may already have removed this get's entries, which
    // only brings the next pass forward.
    if (++list.stale * 2 < list.waiters.size()) continue;
    std::erase_if(list.waiters, [this](const SealWaiter& s) { return !Indexed(s.first); });
    list.stale = 0;
    if (list.waiters.empty()) by_object_.erase(w);
  }
}

WaitingGets::Get WaitingGets::Forget(std::unordered_map<Id, Entry>::iterator it) {
  const Id id = it->first;
  Get get = std::move(it->second.get);
  it->second.timer->cancel();
  gets_.erase(it);
  accounts_.CountMetadata(get.client, -static_cast<int64_t>(get.cost));
  auto c = by_client_.find(get.client);
  std::erase(c->second, id);
  if (c->second.empty()) by_client_.erase(c);
  return get;
}

size_t WaitingGets::TimeOut(Entry& entry, bool copies) {
  if (entry.indexed) Unindex(entry);
  Get& get = entry.get;
  size_t sealed_waits = 0;
  for (size_t i = 0; i < get.ids.size(); ++i) {
    if (get.waits[i] == Wait::kNone || (get.waits[i] == Wait::kCopy && !copies)) continue;
    sealed_waits += get.waits[i] == Wait::kSeal;
    get.Resolve(i, GetResult{StatusCode::kTimeout, {}});
  }
  return sealed_waits;
}

void WaitingGets::Expire(Id id) {
  auto it = gets_.find(id);
  if (it == gets_.end()) return;
  // Ids still waiting for a seal time out; copies under way are waited for (they end).
  timeouts_ += TimeOut(it->second, /*copies=*/false);
  FinishIfDone(id);
}

bool WaitingGets::Cancel(ClientId client, uint64_t request) {
  if (request == 0) return false;
  auto c = by_client_.find(client);
  if (c == by_client_.end()) return false;
  for (Id id : c->second) {
    auto it = gets_.find(id);
    if (it->second.get.request != request) continue;
    // A copy that ends later finds no get (Find) and answers nobody.
    TimeOut(it->second, /*copies=*/true);
    cancelled_++;
    FinishIfDone(id);
    return true;
  }
  return false;
}

void WaitingGets::FinishIfDone(Id id) {
  auto it = gets_.find(id);
  if (it == gets_.end() || !it->second.get.Answerable()) return;
  // A wait answered with ids still waiting: they time out now.
  if (it->second.get.missing != 0) TimeOut(it->second, /*copies=*/true);
  Get get = Forget(it);
  if (before_answer_) before_answer_(get);
  get.done(std::move(get.results));
}

void WaitingGets::DropClient(ClientId client) {
  auto c = by_client_.find(client);
  if (c == by_client_.end()) return;
  const std::vector<Id> ids = c->second;
  for (Id id : ids) {
    auto it = gets_.find(id);
    if (it->second.indexed) Unindex(it->second);
    Forget(it);
  }
}

size_t WaitingGets::CountOf(ClientId client) const {
  auto c = by_client_.find(client);
  return c == by_client_.end() ? 0 : c->second.size();
}

}  // namespace depot::store
