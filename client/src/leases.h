// Leases: gets with no round trip. The daemon gives each session a lease table in shared
// memory (depot/ipc/lease.h); a client that has seen where a sealed host object lies takes
// a reference to it there, checked against the object's header, and drops it there, with no
// message. docs/leases.md has the protocol and why it is safe.
//
// This class keeps the table's mapping and what the connection has seen: for each id it got
// or created in a shared segment, its header slot, the slot's generation and the object's
// place. Dedicated segments are left out, since their mappings come only with a reply.
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <span>
#include <unordered_map>

#include "depot/ipc/lease.h"
#include "depot/ipc/object_header.h"
#include "depot/object_id.h"
#include "depot/status.h"
#include "mapping.h"

namespace depot::internal {

class Leases {
 public:
  // Where a sealed object lay when this connection last saw it.
  struct Seen {
    uint32_t slot = 0;
    uint32_t generation = 0;
    uint32_t segment = 0;
    uint64_t offset = 0;
    uint64_t data_size = 0;
    uint64_t metadata_size = 0;
  };
  // At most this many places are remembered; past it, an arbitrary one is forgotten.
  static constexpr size_t kMaxSeen = 1 << 16;

  // Maps the table the daemon sent, of `entries` entries, writable, whose leases hold only
  // objects of at most `max_object_bytes` of data and metadata (0: any size); larger ones
  // are never remembered, so never leased. Called once, before any other member, from the
  // handshake.
  Status Map(int fd, uint32_t entries, uint64_t max_object_bytes);
  bool enabled() const { return view_.valid(); }

  // Remembers where `id` lies. Thread-safe.
  void Remember(const ObjectId& id, const Seen& seen);
  // Takes a lease on `id`, checked against its header in `headers` (the shared header
  // table): where it lies if that worked; nullopt if nothing is known of it or the lease
  // could not be had (a place that is no longer valid is forgotten). Thread-safe.
  std::optional<Seen> Take(const ObjectId& id, std::span<const ipc::ObjectHeader> headers);
  // Drops a lease Take gave. Thread-safe.
  void Drop(uint32_t slot) const { view_.Drop(slot); }

 private:
  Mapping table_;
  ipc::LeaseTableView view_;
  uint64_t max_object_bytes_ = 0;
  std::mutex mu_;
  std::unordered_map<ObjectId, Seen> seen_;  // guarded by mu_
};

}  // namespace depot::internal
