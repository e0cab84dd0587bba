// Leases: each session's lease table (depot/ipc/lease.h), through which its client takes and
// drops references to host objects it has seen without a message, and the look the daemon
// takes in every table before it frees a host copy.
//
// A table is client input. The daemon maps it read-only, sealed against resizing, and reads
// one word per table per look; a word only ever stops the daemon from freeing one object's
// host copy for a while, as a reference of that client would, and a table names at most
// its `entries` objects at once, each no larger than its allowance (ClientAccounts'
// LeaseAllowance, set aside from the client's limits). So a client that writes nonsense
// harms only itself: it keeps at most that much in memory until its session ends, when its
// table is forgotten.
//
// Reclaim comes before every free of a host copy that a lease could name: an eviction or a
// dropped replica (Tiers::FreeHostBlock), and a deleted object's last reference going
// (ObjectStore). It marks the header kFlagReclaiming, then looks; docs/leases.md argues why a
// client that took its lease after the look always sees the mark. A copy found leased is
// kept (the store marks it Object::leased, which the eviction policy passes over and the
// tiers count as held), and looked at again every kRecheckInterval, soon after a client
// says it read it through a lease, and when a session ends, until no lease names it: then
// `ended` is called for it.
//
// Runs on the loop thread only.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "depot/ipc/framing.h"
#include "depot/ipc/lease.h"
#include "depot/status.h"
#include "store/object_table.h"

namespace depot::store {

struct LeaseCounters {
  uint64_t tables = 0;            // sessions with a lease table
  uint64_t leased_objects = 0;    // host copies kept because a lease held them at the last look
  uint64_t blocked_reclaims = 0;  // frees put off because a lease held the copy
};

class Leases {
 public:
  static constexpr std::chrono::milliseconds kRecheckInterval{20};
  // The shortest time between two looks that clients asked for (RecheckSoon).
  static constexpr std::chrono::milliseconds kMinRecheckGap{1};
  // Default entries per table: 64 KiB of shared memory per session at most, touched as used.
  static constexpr uint32_t kDefaultEntries = 8192;

  // `entries`: per table, a power of two; 0 turns leases off (Open makes no table).
  // `writable_for_tests`: the daemon maps tables read-only; tests map them writable and
  // take leases through that same mapping (MappingOf), since ThreadSanitizer tracks memory
  // by address and would not see the synchronisation through a second mapping.
  Leases(boost::asio::io_context& loop, ObjectTable& table, uint32_t entries,
         bool writable_for_tests = false);
  ~Leases();
  Leases(const Leases&) = delete;
  Leases& operator=(const Leases&) = delete;

  // Called on the loop with each object whose host copy a look no longer finds leased.
  void OnEnded(std::function<void(uint32_t slot)> ended) { ended_ = std::move(ended); }

  // The most entries a table has (--lease-entries).
  uint32_t entries() const { return entries_; }
  // Makes `client`'s table of `entries` entries (a power of two, at most entries()), whose
  // leases hold only objects of at most `max_object_bytes` bytes of data and metadata (0:
  // any), and returns the descriptor to send it (writable, not resizable), which stays open
  // until Close, so that a reply may carry it later; -1 when `entries` is 0.
  Result<int> Open(ClientId client, uint32_t entries, uint64_t max_object_bytes = 0);
  // Forgets `client`'s table, and looks again at every leased copy soon.
  void Close(ClientId client);
  // The daemon's mapping of `client`'s table; null if it has none.
  void* MappingOf(ClientId client) const;

  // Before the host copy of the object in `slot` is freed: true if no lease holds it, and
  // then no lease will be taken on the object again (in this slot generation, whatever host
  // copy it has later). False if one does: the copy must stay, and is looked at again until
  // a look finds none (OnEnded).
  bool Reclaim(uint32_t slot);
  // Looks again at the leased copies on the next turn of the loop.
  void RecheckSoon();

  LeaseCounters counters() const;

  // For the admin views (they walk tables; not for hot paths). Leases on the object in
  // `slot`, in all tables together and per client (in table order).
  uint32_t Count(uint32_t slot) const;
  std::vector<std::pair<ClientId, uint32_t>> HoldersOf(uint32_t slot) const;
  // The live objects `client`'s table leases, and how many leases on each, as a client
  // writes them (a lie shows as such).
  std::vector<std::pair<uint32_t, uint32_t>> LeasedBy(ClientId client) const;

 private:
  struct Table {
    ClientId client;
    ipc::UniqueFd fd;
    void* base;
    uint32_t entries;
    uint64_t max_object_bytes;  // 0: any size
    ipc::LeaseTableView view;
  };
  // Whether `t` may keep the object in `slot` at all: a lease on a larger object than its
  // allowance is no lease (a client that wrote it keeps nothing by it).
  bool MayKeep(const Table& t, uint32_t slot) const;
  // Leases on the object in `slot`, as it is now, in `t`.
  uint32_t CountIn(const Table& t, uint32_t slot) const;
  // Whether any table holds a lease on the object in `slot` of `generation`.
  bool AnyHolds(uint32_t slot, uint32_t generation) const;
  void Recheck();
  void ArmTimer();

  ObjectTable& table_;
  const uint32_t entries_;
  const int prot_;  // of the daemon's mappings of tables
  std::vector<Table> tables_;
  // Leased copies: slot -> generation of the object found leased.
  std::unordered_map<uint32_t, uint32_t> leased_;
  boost::asio::steady_timer timer_;
  bool timer_armed_ = false;
  bool soon_ = false;  // a recheck is posted
  std::chrono::steady_clock::time_point last_recheck_;
  std::function<void(uint32_t)> ended_;
  uint64_t blocked_reclaims_ = 0;
};

}  // namespace depot::store
