#include "store/client_accounts.h"

#include <unistd.h>

#include <algorithm>
#include <bit>

#include "depot/ipc/units.h"

namespace depot::store {

namespace {

// The share of each per-client limit set aside for what a lease table keeps.
constexpr uint64_t kLeaseShareDivisor = 4;
// Where --client-max-bytes is set, the table has no more entries than leave each leased
// object this much: leases are for small objects, whose round trip costs more than reading
// them, and a table of many entries would leave each too little.
constexpr uint64_t kMinLeasedObjectBytes = 64 << 10;

}  // namespace

LeaseAllowance AllowanceFor(const ClientLimits& limits, uint32_t max_entries, uint64_t alignment) {
  uint64_t entries = max_entries;
  if (limits.max_objects != 0) {
    entries = std::min<uint64_t>(entries, std::bit_floor(limits.max_objects / kLeaseShareDivisor));
  }
  const uint64_t byte_share = limits.max_bytes / kLeaseShareDivisor;
  if (limits.max_bytes != 0) {
    entries = std::min(entries, std::bit_floor(byte_share / kMinLeasedObjectBytes));
  }
  if (entries == 0) return {};
  LeaseAllowance a;
  a.entries = static_cast<uint32_t>(entries);
  if (limits.max_objects != 0) a.reserved_objects = a.entries;
  if (limits.max_bytes != 0) {
    // A multiple of the alignment, so that an object within it takes a block within it.
    a.max_object_bytes = byte_share / entries / alignment * alignment;
    a.reserved_bytes = a.max_object_bytes * entries;
  }
  return a;
}

ClientAccounts::ClientAccounts(ClientLimits limits, int32_t tiers)
    : limits_(limits), tiers_(tiers), daemon_uid_(::getuid()) {
  Open(kDaemonClient, daemon_uid_);
}

void ClientAccounts::Open(ClientId client, uint32_t uid) {
  Account& account = accounts_.try_emplace(client).first->second;
  account.client = client;
  account.uid = uid;
}

void ClientAccounts::Close(ClientId client) { accounts_.erase(client); }

ClientAccounts::Account* ClientAccounts::Find(ClientId client) {
  auto it = accounts_.find(client);
  return it == accounts_.end() ? nullptr : &it->second;
}

void ClientAccounts::AddRef(Account& account, uint32_t slot, int32_t tier, uint64_t bytes) {
  auto [it, inserted] = account.refs.try_emplace(RefKey(slot, tier), 0);
  if (inserted) {
    account.held_bytes += bytes;
    if (!HoldsOnAnotherTier(account, slot, tier)) account.objects++;
  }
  it->second++;
  account.references++;
}

void ClientAccounts::DropRef(Account& account, uint32_t slot, int32_t tier, uint64_t bytes) {
  auto it = account.refs.find(RefKey(slot, tier));
  account.references--;
  if (--it->second == 0) {
    account.held_bytes -= bytes;
    account.refs.erase(it);
    if (!HoldsOnAnotherTier(account, slot, tier)) account.objects--;
  }
}

uint32_t ClientAccounts::RefsOf(const Account& account, uint32_t slot, int32_t tier) const {
  auto it = account.refs.find(RefKey(slot, tier));
  return it == account.refs.end() ? 0 : it->second;
}

bool ClientAccounts::HoldsOnAnotherTier(const Account& account, uint32_t slot, int32_t tier) const {
  for (int32_t t = kHost; t < tiers_ - 1; ++t) {
    if (t != tier && account.refs.contains(RefKey(slot, t))) return true;
  }
  return false;
}

Status ClientAccounts::CheckHolding(ClientId client, const Account& account, uint64_t bytes) const {
  // What the lease table may keep is set aside; a reload may leave less than that.
  const auto set_aside = [](uint64_t reserved, const std::string& shown) {
    return reserved == 0 ? std::string() : " less " + shown + " its lease table may keep";
  };
  if (limits_.max_objects != 0) {
    const uint64_t limit = limits_.max_objects -
                           std::min<uint64_t>(limits_.max_objects, account.lease.reserved_objects);
    if (account.objects >= limit) {
      return Status::LimitExceeded(
          "client " + std::to_string(client) + " already holds " + std::to_string(account.objects) +
          " objects, its limit (--client-max-objects " + std::to_string(limits_.max_objects) +
          set_aside(account.lease.reserved_objects,
                    std::to_string(account.lease.reserved_objects)) +
          "); release some first");
    }
  }
  if (limits_.max_bytes != 0) {
    const uint64_t limit =
        limits_.max_bytes - std::min(limits_.max_bytes, account.lease.reserved_bytes);
    // held_bytes <= limit unless a reload lowered it: then nothing more fits.
    if (account.held_bytes > limit || bytes > limit - account.held_bytes) {
      return Status::LimitExceeded(
          "client " + std::to_string(client) + " holds " + ipc::FormatSize(account.held_bytes) +
          "; another " + ipc::FormatSize(bytes) + " would pass its limit of " +
          ipc::FormatSize(limit) + " (--client-max-bytes " + ipc::FormatSize(limits_.max_bytes) +
          set_aside(account.lease.reserved_bytes, ipc::FormatSize(account.lease.reserved_bytes)) +
          ")");
    }
  }
  return Status::OK();
}

Status ClientAccounts::CheckOwnMetadata(ClientId client, const Account& account,
                                        uint64_t bytes) const {
  const uint64_t limit = limits_.max_metadata_bytes;
  if (limit == 0) return Status::OK();
  const char* const kinds = " (object entries, names, GPU metadata, waiting gets)";
  if (account.metadata_bytes + bytes > limit) {
    return Status::LimitExceeded("client " + std::to_string(client) + " has the daemon keep " +
                                 ipc::FormatSize(account.metadata_bytes) + " for it" + kinds +
                                 "; another " + ipc::FormatSize(bytes) +
                                 " would pass its limit of " + ipc::FormatSize(limit) +
                                 " (--client-max-metadata)");
  }
  if (SharesMetadata(account.uid)) {
    const uint64_t of_uid = MetadataOfUid(account.uid);
    if (of_uid + bytes > limit) {
      return Status::LimitExceeded("the clients of uid " + std::to_string(account.uid) +
                                   " have the daemon keep " + ipc::FormatSize(of_uid) +
                                   " for them" + kinds + "; another " + ipc::FormatSize(bytes) +
                                   " would pass the limit of " + ipc::FormatSize(limit) +
                                   " for one uid other than the daemon's (--client-max-metadata)");
    }
  }
  return Status::OK();
}

Status ClientAccounts::CheckMetadata(ClientId client, const Account& account,
                                     uint64_t bytes) const {
  DEPOT_RETURN_NOT_OK(CheckOwnMetadata(client, account, bytes));
  if (!BudgetHasRoom(bytes)) {
    return Status::LimitExceeded(
        "the daemon keeps " + ipc::FormatSize(metadata_bytes_) +
        " for its clients (object entries, names, GPU metadata, waiting gets); another " +
        ipc::FormatSize(bytes) + " would pass its budget of " +
        ipc::FormatSize(limits_.metadata_budget) +
        " (--metadata-budget), even with every object nobody holds evicted; delete objects "
        "or start depotd with a larger budget");
  }
  return Status::OK();
}

void ClientAccounts::CountMetadata(ClientId client, int64_t bytes) {
  metadata_bytes_ += static_cast<uint64_t>(bytes);  // modulo 2^64: a negative one subtracts
  Account* account = Find(client);
  if (account == nullptr) return;
  account->metadata_bytes += static_cast<uint64_t>(bytes);
  CountUid(account->uid, bytes);
}

void ClientAccounts::CountObjectMetadata(ClientId creator, uint32_t owner, int64_t bytes) {
  metadata_bytes_ += static_cast<uint64_t>(bytes);
  if (Account* account = Find(creator)) account->metadata_bytes += static_cast<uint64_t>(bytes);
  CountUid(owner, bytes);
}

void ClientAccounts::CountUid(uint32_t uid, int64_t bytes) {
  if (!SharesMetadata(uid)) return;
  auto it = uid_metadata_.try_emplace(uid, 0).first;
  it->second += static_cast<uint64_t>(bytes);
  if (it->second == 0) uid_metadata_.erase(it);
}

uint64_t ClientAccounts::MetadataOfUid(uint32_t uid) const {
  auto it = uid_metadata_.find(uid);
  return it == uid_metadata_.end() ? 0 : it->second;
}

Status ClientAccounts::ChargeRequests(ClientId client, int64_t bytes) {
  Account* account = Find(client);
  if (account == nullptr) {
    return Status::Internal("client " + std::to_string(client) + " is not connected");
  }
  const auto more = static_cast<uint64_t>(bytes);
  if (bytes > 0 && limits_.max_metadata_bytes != 0 &&
      account->request_bytes + more > limits_.max_metadata_bytes) {
    return Status::LimitExceeded(
        "client " + std::to_string(client) + " has the daemon keep " +
        ipc::FormatSize(account->request_bytes) + " for its requests in progress; another " +
        ipc::FormatSize(more) + " would pass its limit of " +
        ipc::FormatSize(limits_.max_metadata_bytes) + " (--client-max-metadata)");
  }
  if (bytes > 0 && limits_.metadata_budget != 0 &&
      request_bytes_ + more > limits_.metadata_budget) {
    return Status::LimitExceeded("the daemon keeps " + ipc::FormatSize(request_bytes_) +
                                 " for its clients' requests in progress; another " +
                                 ipc::FormatSize(more) + " would pass its budget of " +
                                 ipc::FormatSize(limits_.metadata_budget) + " (--metadata-budget)");
  }
  account->request_bytes += more;
  request_bytes_ += more;
  return Status::OK();
}

ClientUsage ClientAccounts::UsageOf(ClientId client) const {
  auto it = accounts_.find(client);
  if (it == accounts_.end()) return {};
  return ClientUsage{it->second.objects, it->second.references, it->second.held_bytes};
}

std::vector<HolderInfo> ClientAccounts::HoldersOf(uint32_t slot) const {
  std::vector<HolderInfo> holders;
  for (const auto& [client, account] : accounts_) {
    HolderInfo holder;
    holder.client = client;
    const auto add = [&](int32_t tier) {
      if (auto it = account.refs.find(RefKey(slot, tier)); it != account.refs.end()) {
        holder.references += it->second;
        holder.tiers.emplace_back(tier, it->second);
      }
    };
    for (int32_t tier = kHost; tier < tiers_ - 1; ++tier) add(tier);
    add(kDisk);  // a reference that went to disk with a spill (the scheduler's)
    if (holder.references != 0) holders.push_back(std::move(holder));
  }
  std::sort(holders.begin(), holders.end(),
            [](const HolderInfo& a, const HolderInfo& b) { return a.client < b.client; });
  return holders;
}

}  // namespace depot::store
