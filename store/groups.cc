#include "store/groups.h"

namespace depot::store {

Status Groups::CheckKey(std::string_view key) {
  if (key.size() == kKeyBytes) return Status::OK();
  return Status::InvalidArgument("a group key is " + std::to_string(kKeyBytes) + " bytes, not " +
                                 std::to_string(key.size()));
}

Result<Groups::Joined> Groups::Join(std::string_view key, uint32_t uid, ClientId fresh) {
  DEPOT_RETURN_NOT_OK(CheckKey(key));
  auto [it, created] = groups_.try_emplace(std::string(key), Group{fresh, uid, 0});
  Group& group = it->second;
  if (group.uid != uid) {
    return Status::PermissionDenied("this group belongs to uid " + std::to_string(group.uid) +
                                    ", not " + std::to_string(uid));
  }
  ++group.members;
  return Joined{group.account, created};
}

std::optional<ClientId> Groups::Leave(std::string_view key) {
  auto it = groups_.find(std::string(key));
  if (it == groups_.end()) return std::nullopt;
  if (--it->second.members > 0) return std::nullopt;
  const ClientId account = it->second.account;
  groups_.erase(it);
  return account;
}

std::optional<uint32_t> Groups::UidOf(ClientId account) const {
  for (const auto& [key, group] : groups_) {
    if (group.account == account) return group.uid;
  }
  return std::nullopt;
}

}  // namespace depot::store
