// Holding: one daemon reference to one object, shared by every Buffer and MutableBuffer of
// that object in one Client; and HoldingTable, which finds the live Holding of an id.
//
// Holding the same object again, or getting it again, must not cost a round trip, so a
// Client keeps exactly one daemon reference per live Holding and answers repeated Gets from
// the table.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "depot/buffer.h"
#include "depot/object_id.h"
#include "segments.h"

namespace depot::internal {

class Connection;

struct Holding {
  Holding(std::shared_ptr<Connection> conn, const ObjectId& id,
          Segments::View<const std::byte> data, Segments::View<std::byte> writable,
          uint64_t data_size, uint64_t metadata_size, const BufferLocation& location, bool sealed,
          bool leased = false)
      : conn(std::move(conn)),
        id(id),
        data(data.data),
        writable(writable.data),
        readable_mapping(std::move(data.keep)),
        writable_mapping(std::move(writable.keep)),
        data_size(data_size),
        metadata_size(metadata_size),
        location(location),
        leased(leased),
        sealed(sealed) {}
  Holding(const Holding&) = delete;
  Holding& operator=(const Holding&) = delete;
  // Gives the reference back unless the object was aborted or the connection is gone:
  // queues it on the connection, which sends it ahead of its next request, or within about
  // 1 ms (Connection::Release). For an object never sealed, that aborts it. A lease is
  // dropped in the lease table instead.
  ~Holding();

  // Keeps the socket, and with it the daemon's reference and the segment mappings, alive
  // for as long as any handle to the object exists, even after the Client is gone.
  const std::shared_ptr<Connection> conn;
  const ObjectId id;
  // The bytes in the segment's read-only view, which every Buffer reads; the metadata
  // follows the data.
  const std::byte* const data;
  // The same bytes in the writable view, for the MutableBuffers of the object's creator;
  // null in a Holding from a get.
  std::byte* const writable;
  // For an object in a dedicated segment, what keeps the segment mapped (null otherwise).
  // Members are destroyed after the destructor's body: the mapping goes after the release
  // is queued, which is safe as a dedicated segment's index names one file for the daemon's
  // life (Segments checks the file too).
  const std::shared_ptr<const Mapping> readable_mapping;
  const std::shared_ptr<const Mapping> writable_mapping;
  const uint64_t data_size;
  const uint64_t metadata_size;
  const BufferLocation location;
  // The reference is a lease in the connection's lease table (leases.h), not the daemon's.
  const bool leased;
  std::atomic<bool> sealed;
  // Set by a successful Abort: the daemon dropped the object and the reference with it.
  std::atomic<bool> aborted{false};
};

// Whether two locations name the same bytes, i.e. the same incarnation of an object.
inline bool SameLocation(const BufferLocation& a, const BufferLocation& b) {
  return a.segment == b.segment && a.offset == b.offset && a.slot == b.slot;
}

// The live Holding of each id. Thread-safe. Holdings unregister themselves when destroyed.
//
// No Holding is ever destroyed while the table's lock is held: its destructor takes the lock.
class HoldingTable {
 public:
  // The live Holding of `id`, or null.
  std::shared_ptr<Holding> Find(const ObjectId& id) const;

  // Registers `fresh`, which carries a reference the daemon just granted, unless a live
  // Holding of the same object (same id and location) exists: then returns that one, and
  // `fresh`, dropped by the caller, gives its extra reference back. A live Holding of an
  // older incarnation (deleted and created again) is replaced.
  std::shared_ptr<Holding> Adopt(std::shared_ptr<Holding> fresh);

  // Makes `holding` the one Find returns for its id, whatever was there (Create).
  void Replace(const std::shared_ptr<Holding>& holding);

  // Stops finding `id` (after Delete or Abort); its Holdings live on until dropped.
  void Forget(const ObjectId& id);
  // Unregisters `holding` if it is the registered one (its destructor).
  void Forget(const ObjectId& id, const Holding* holding);

 private:
  struct Entry {
    std::weak_ptr<Holding> weak;
    // Identifies the registered Holding after `weak` has expired (in its destructor).
    const Holding* raw;
  };
  mutable std::mutex mu_;
  std::unordered_map<ObjectId, Entry> entries_;
};

}  // namespace depot::internal

namespace depot::internal {

// One daemon reference to one GPU replica of an object. Unlike host Holdings these are not
// shared through a table: each GetOnDevice takes its own reference (GPU objects are few and
// large; a get costs a round trip but no CUDA call once the chunk is mapped).
struct DeviceHolding {
  DeviceHolding(std::shared_ptr<Connection> conn, const ObjectId& id, int32_t device, int ordinal,
                uint64_t address, uint64_t size, std::vector<std::byte> metadata, bool simulated)
      : conn(std::move(conn)),
        id(id),
        device(device),
        ordinal(ordinal),
        address(address),
        size(size),
        metadata(std::move(metadata)),
        simulated(simulated) {}
  DeviceHolding(const DeviceHolding&) = delete;
  DeviceHolding& operator=(const DeviceHolding&) = delete;
  // Gives the reference back (queued), unless the object was aborted.
  ~DeviceHolding();

  const std::shared_ptr<Connection> conn;  // keeps the chunk mappings alive too
  const ObjectId id;
  const int32_t device;  // the daemon's index
  const int ordinal;     // this process's
  const uint64_t address;
  const uint64_t size;
  const std::vector<std::byte> metadata;
  const bool simulated;
  std::atomic<bool> aborted{false};
};

}  // namespace depot::internal
