// Groups of sessions that hand objects to one another (Hello.group, the handoff request):
// depot.multiprocessing's process tree is one. A group is an account of the store, holding
// the references handed off in it until a member claims them, and it lives while any of its
// sessions does: when the last one goes, what nobody claimed goes with it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

#include "depot/status.h"
#include "store/object_table.h"

namespace depot::store {

class Groups {
 public:
  // A group's key: Hello.group, this many random bytes chosen by its first member.
  static constexpr size_t kKeyBytes = 16;

  // Why `key` cannot name a group (its size), or OK.
  static Status CheckKey(std::string_view key);

  // Adds a session of `uid` to the group `key`: returns the group's account, and whether the
  // group is new (its account, `fresh`, is then to be opened in the store). A group belongs
  // to the uid of its first member: another uid is refused (PermissionDenied).
  struct Joined {
    ClientId account = 0;
    bool created = false;
  };
  Result<Joined> Join(std::string_view key, uint32_t uid, ClientId fresh);
  // Takes a session out of the group `key`: returns the group's account if that was its last
  // session (the account is then to be closed in the store, which drops what it held), else
  // nothing.
  std::optional<ClientId> Leave(std::string_view key);

  // The uid of the group whose account is `account`, if one is (for the admin views: a walk).
  std::optional<uint32_t> UidOf(ClientId account) const;

 private:
  struct Group {
    ClientId account = 0;
    uint32_t uid = 0;
    uint32_t members = 0;
  };
  std::unordered_map<std::string, Group> groups_;
};

}  // namespace depot::store
