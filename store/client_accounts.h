// What each client holds and what it costs: its references (per object and tier), the bytes
// of the objects they are to, the daemon memory kept on its behalf, and the limits on each.
//
// The accounts only count: the store decides when a reference is taken or dropped and tells
// them, so that the admin views (depotctl clients, show) cost no walk of the object table and
// a limit is checked in O(1).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "depot/status.h"
#include "store/object_table.h"

namespace depot::store {

// The daemon's own client id: it holds references under it to objects a verify is reading
// and to the sources of copies between tiers, so that neither goes meanwhile. Sessions are
// numbered from 1.
inline constexpr ClientId kDaemonClient = 0;
// The scheduler's task graph (SchedulerStore): the references it holds to objects that
// pending tasks need, and the creator of the failed objects it seals. Never a session's id.
inline constexpr ClientId kSchedulerClient = UINT32_MAX;

struct ClientLimits {
  uint64_t max_bytes = 0;         // bytes a client may hold (creating or referenced); 0: no limit
  uint32_t max_objects = 0;       // objects a client may hold; 0: no limit
  uint32_t max_pending_gets = 0;  // gets of one client waiting at once; 0: no limit
  // Daemon memory kept on a client's behalf (MetadataCost): the objects it created and its
  // waiting gets; 0: no limit. And the same for all clients together.
  uint64_t max_metadata_bytes = 0;
  uint64_t metadata_budget = 0;
};

// What a session's lease table may keep beyond its references (docs/leases.md, "Leases
// within the limits"). A table of `entries` entries leases at most that many objects at
// once, and the daemon honours a lease only on an object of at most `max_object_bytes`
// (data and metadata; 0: any size). With --client-max-objects or --client-max-bytes set, a
// quarter of each is set aside for the table, and references may take only the rest, so
// that what a client holds and what its leases keep together stay within its limits.
struct LeaseAllowance {
  uint32_t entries = 0;  // 0: no lease table
  uint64_t max_object_bytes = 0;
  uint32_t reserved_objects = 0;  // taken from --client-max-objects for references
  uint64_t reserved_bytes = 0;    // taken from --client-max-bytes for references
};

// The allowance of a session that opens under `limits`, with tables of at most
// `max_entries` entries (--lease-entries, a power of two) and host blocks rounded up to
// `alignment` (a power of two) bytes.
LeaseAllowance AllowanceFor(const ClientLimits& limits, uint32_t max_entries, uint64_t alignment);

// What a client holds (the admin `clients` view).
struct ClientUsage {
  uint64_t objects = 0;     // distinct objects referenced or being created
  uint64_t references = 0;  // references, all objects together
  uint64_t bytes = 0;       // allocated bytes of those objects
};

// A client's references to one object (the admin `show` view).
struct HolderInfo {
  ClientId client = 0;
  uint32_t references = 0;  // on all tiers together
  // (tier, references) for each tier it holds references on, host first.
  std::vector<std::pair<int32_t, uint32_t>> tiers;
};

class ClientAccounts {
 public:
  // `tiers`: how many tiers there are (host and the GPUs). kDaemonClient's account exists
  // from the start, with the daemon's uid.
  ClientAccounts(ClientLimits limits, int32_t tiers);

  struct Account {
    ClientId client = 0;
    uint32_t uid = 0;  // its session's, from SO_PEERCRED
    // Kept as references come and go: all its references, the distinct objects they are to,
    // and those objects' allocated bytes (per tier held).
    uint64_t references = 0;
    uint64_t objects = 0;
    uint64_t held_bytes = 0;
    uint64_t metadata_bytes = 0;                  // daemon memory for its objects and waiting gets
    uint64_t request_bytes = 0;                   // daemon memory for its requests in progress
    LeaseAllowance lease;                         // its lease table's, fixed when the table is made
    std::unordered_map<uint64_t, uint32_t> refs;  // RefKey -> references held
  };

  // A client's references are per (slot, tier): a key packs the pair (8 bits of tier).
  static uint64_t RefKey(uint32_t slot, int32_t tier) {
    return (uint64_t{slot} << 8) | static_cast<uint8_t>(tier + 1);
  }
  static uint32_t SlotOfKey(uint64_t key) { return static_cast<uint32_t>(key >> 8); }
  static int32_t TierOfKey(uint64_t key) { return static_cast<int32_t>(key & 0xff) - 1; }

  void Open(ClientId client, uint32_t uid);
  // Forgets the account. Its references must have been dropped (the store drops them).
  void Close(ClientId client);
  Account* Find(ClientId client);
  const Account* Find(ClientId client) const {
    return const_cast<ClientAccounts*>(this)->Find(client);
  }
  Account& at(ClientId client) { return accounts_.at(client); }

  // Counts one more reference of `client` to the object in `slot` on `tier`, whose replica
  // there takes `bytes`.
  void AddRef(Account& account, uint32_t slot, int32_t tier, uint64_t bytes);
  void DropRef(Account& account, uint32_t slot, int32_t tier, uint64_t bytes);
  // The references `client` holds to the object in `slot` on `tier`.
  uint32_t RefsOf(const Account& account, uint32_t slot, int32_t tier) const;

  // Whether `client` may hold one more object of `bytes`: LimitExceeded naming the limit
  // (--client-max-objects, --client-max-bytes, less what its lease table may keep) if not.
  Status CheckHolding(ClientId client, const Account& account, uint64_t bytes) const;
  // Whether the daemon may keep `bytes` more for `client`: within --client-max-metadata for
  // the client, and for all sessions of its uid together where that uid is neither root nor
  // the daemon's (another uid is one client however many sessions it opens). Then, with
  // CheckMetadata, within --metadata-budget for all clients together.
  Status CheckOwnMetadata(ClientId client, const Account& account, uint64_t bytes) const;
  Status CheckMetadata(ClientId client, const Account& account, uint64_t bytes) const;
  bool BudgetHasRoom(uint64_t bytes) const {
    return limits_.metadata_budget == 0 ||
           bytes <= limits_.metadata_budget - std::min(limits_.metadata_budget, metadata_bytes_);
  }
  // Counts `bytes` more (negative: fewer) of daemon memory for `client` (and its uid, while
  // its account is open), and in all.
  void CountMetadata(ClientId client, int64_t bytes);
  // The same for memory kept for an object, which may outlive its creator's session: its
  // uid `owner` is counted whether or not `creator`'s account is still open.
  void CountObjectMetadata(ClientId creator, uint32_t owner, int64_t bytes);
  // Daemon memory kept for the clients of `uid`, all together.
  uint64_t MetadataOfUid(uint32_t uid) const;
  // The same for memory kept for its requests in progress, which has an account of its own
  // with the same limits; fails with LimitExceeded, counting nothing, past either.
  Status ChargeRequests(ClientId client, int64_t bytes);

  uint64_t metadata_bytes() const { return metadata_bytes_; }
  uint64_t request_bytes() const { return request_bytes_; }
  const ClientLimits& limits() const { return limits_; }
  // New limits, from the next check on (a reload of the daemon's settings). What clients
  // already hold past them stays held: only what they take next is refused.
  void set_limits(const ClientLimits& limits) { limits_ = limits; }

  // What `client` holds; all zero for an unknown client.
  ClientUsage UsageOf(ClientId client) const;
  // The clients holding references to the object in `slot`, in client id order.
  std::vector<HolderInfo> HoldersOf(uint32_t slot) const;

 private:
  // Whether the account holds references to the object in `slot` on another tier.
  bool HoldsOnAnotherTier(const Account& account, uint32_t slot, int32_t tier) const;

  // Whether the sessions of `uid` share one metadata account: not root's, not the daemon's.
  bool SharesMetadata(uint32_t uid) const { return uid != 0 && uid != daemon_uid_; }
  void CountUid(uint32_t uid, int64_t bytes);

  ClientLimits limits_;
  const int32_t tiers_;
  const uint32_t daemon_uid_;
  std::unordered_map<uint32_t, uint64_t> uid_metadata_;  // of uids that SharesMetadata
  std::unordered_map<ClientId, Account> accounts_;
  uint64_t metadata_bytes_ = 0;
  uint64_t request_bytes_ = 0;
};

}  // namespace depot::store
