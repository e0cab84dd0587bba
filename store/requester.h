// Who made a request, as its handlers need to know it: the session's account in the store,
// its group's, whose objects it may delete or hand off, and the batch limit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "depot/ipc/protocol.h"
#include "depot/object_id.h"
#include "depot/status.h"
#include "protocol.capnp.h"
#include "store/client_accounts.h"

namespace depot::store {

struct Requester {
  ClientId client = 0;
  // The group the session joined at hello (Groups): its account in the store.
  std::optional<ClientId> group;
  // The uid whose objects alone it may delete or hand off (those end an object's name): its
  // own if it is another uid that may write, none (all) if it is trusted.
  std::optional<uint32_t> only_own_objects;
  uint32_t max_batch = 0;  // most ids one request may name (--max-batch)

  // LimitExceeded, saying so, if a request naming `count` ids (`what`) is over the limit.
  Status CheckBatch(size_t count, const char* what = "objects") const {
    if (count <= max_batch) return Status::OK();
    return Status::LimitExceeded("a request may name at most " + std::to_string(max_batch) + " " +
                                 what + ", this one names " + std::to_string(count));
  }

  // The ids of a list, within the batch limit and none of them nil.
  Result<std::vector<ObjectId>> Ids(capnp::List<wire::Id>::Reader list) const {
    DEPOT_RETURN_NOT_OK(CheckBatch(list.size()));
    std::vector<ObjectId> ids;
    ids.reserve(list.size());
    for (auto id : list) {
      ids.push_back(ipc::FromWire(id));
      if (ids.back().IsNil()) {
        return Status::InvalidArgument("the nil object id (all zeros) is reserved");
      }
    }
    return ids;
  }
};

}  // namespace depot::store
