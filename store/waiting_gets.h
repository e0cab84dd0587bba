// Gets that wait: for objects not sealed yet, and for copies to the tier they ask for.
//
// The store answers what it can at once and hands the rest here: each waiting get keeps its
// ids, the results found so far, and what each id still waits for. Gets waiting for a seal
// are indexed by object id, so a seal finds its waiters at once; a timer per get turns the
// seals still missing into time-outs. Copies are waited for however long they take (they
// end, in success or failure). A wait is a get that takes nothing and is answered once
// enough of its ids are sealed; the client may cancel a get or wait of its own, which
// answers it at once.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "depot/object_id.h"
#include "depot/status.h"
#include "store/client_accounts.h"

namespace depot::store {

// Where an object's bytes are on one tier, as a get or a create hands them out.
struct Location {
  uint32_t slot = 0;
  uint32_t segment = 0;  // on a GPU: the chunk of its pool
  uint64_t offset = 0;
  uint64_t data_size = 0;
  uint64_t metadata_size = 0;
  int32_t device = kHost;
  // On a GPU: the metadata, kept in daemon memory. Valid until the store next changes.
  std::span<const std::byte> metadata;
};

struct GetResult {
  // kOk, kNotFound, kTimeout, kTaskFailed (a failed object), or why a copy to the asked tier
  // failed (kOutOfMemory, ...)
  StatusCode code = StatusCode::kOk;
  Location location;  // kOk
  // kTaskFailed: the object's message (shared with the store, so it outlives the object).
  std::shared_ptr<const std::string> failure;
};

class WaitingGets {
 public:
  using Id = uint64_t;
  using Done = std::function<void(std::vector<GetResult>)>;
  enum class Wait : uint8_t { kNone, kSeal, kCopy };

  struct Get {
    ClientId client = 0;
    uint64_t request = 0;  // the client's request id (0: none it can cancel by)
    int32_t tier = kHost;
    bool hold = true;  // a get takes a reference to each object; a prefetch takes none
    // A wait: sealed anywhere is enough, nothing is granted or copied, and it is answered
    // once `enough` ids are resolved (the others time out then).
    bool wait = false;
    size_t enough = 0;
    std::vector<ObjectId> ids;
    std::vector<GetResult> results;  // by id
    std::vector<Wait> waits;         // by id: what it still waits for
    size_t missing = 0;              // ids that still wait
    uint64_t cost = 0;               // daemon memory counted for it, against its client
    Done done;

    // Id `i` waits no more: its result is `result`.
    void Resolve(size_t i, GetResult result) {
      results[i] = std::move(result);
      waits[i] = Wait::kNone;
      --missing;
    }
    // Whether it can be answered: nothing missing, or a wait with enough ids resolved.
    bool Answerable() const { return missing == 0 || (wait && ids.size() - missing >= enough); }
  };

  // Time-outs run on `loop`; the cost of each get is counted in `accounts` while it waits.
  WaitingGets(boost::asio::io_context& loop, ClientAccounts& accounts);
  ~WaitingGets();
  WaitingGets(const WaitingGets&) = delete;
  WaitingGets& operator=(const WaitingGets&) = delete;

  // Takes a get that waits for something (missing > 0): counts its cost, indexes its seal
  // waits, and, if it has any and `timeout_ms` > 0, times them out after that long (0 or
  // less: never). Returns the id it goes by.
  Id Add(Get get, int64_t timeout_ms);
  // The get, or null once it has been answered or dropped.
  Get* Find(Id id);
  // One id of a get that waits for a seal: the get, and the id's index in it.
  using SealWaiter = std::pair<Id, uint32_t>;
  // What waits for `id` to be sealed, by get (in order), each index once; none of it is
  // indexed by `id` after. A seal costs the waiters it has, not the size of their gets.
  std::vector<SealWaiter> TakeSealWaiters(const ObjectId& id);
  // Answers the get if it is answerable, and forgets it; a wait's ids still waiting time out
  // then. `before_answer`, if set, sees each get first, and may change its results.
  void FinishIfDone(Id id);
  // Answers `client`'s get of request id `request` now, as if its time were up: whatever it
  // still waits for, seals and copies alike, times out. False if it has none waiting by
  // that id.
  bool Cancel(ClientId client, uint64_t request);
  void BeforeAnswer(std::function<void(Get&)> hook) { before_answer_ = std::move(hook); }
  // Drops every get of `client`, uncounted and unanswered (its session is gone).
  void DropClient(ClientId client);

  size_t CountOf(ClientId client) const;
  // Ids that were still unsealed when their get timed out, since the start.
  uint64_t timeouts() const { return timeouts_; }
  // Gets and waits their clients cancelled, since the start.
  uint64_t cancelled() const { return cancelled_; }

 private:
  struct Entry {
    Get get;
    std::unique_ptr<boost::asio::steady_timer> timer;
    bool indexed = true;  // its seal waits are live in by_object_
  };
  // The gets waiting for one id's seal. Entries of gets that stopped waiting (expired,
  // dropped) stay until they are half the list, then go in one pass: removing a get costs
  // amortised O(1) per id it named, however many times it named it and however many other
  // gets wait for the same id.
  struct SealWaits {
    std::vector<SealWaiter> waiters;
    size_t stale = 0;  // entries of gets no longer indexed, at most
  };
  void Expire(Id id);
  // Resolves every id still waiting as a time-out (seals, and copies too if `copies`).
  // Returns how many seal waits it ended.
  size_t TimeOut(Entry& entry, bool copies);
  // Takes the get's seal waits out of the index by object id.
  void Unindex(Entry& entry);
  bool Indexed(Id id) const;
  // Forgets the get: timer, cost, per-client list. The entry is gone after.
  Get Forget(std::unordered_map<Id, Entry>::iterator it);

  boost::asio::io_context& loop_;
  ClientAccounts& accounts_;
  std::unordered_map<Id, Entry> gets_;
  std::unordered_map<ObjectId, SealWaits> by_object_;
  std::unordered_map<ClientId, std::vector<Id>> by_client_;
  std::function<void(Get&)> before_answer_;
  Id next_ = 1;
  uint64_t timeouts_ = 0;
  uint64_t cancelled_ = 0;
};

}  // namespace depot::store
