// Segments: this connection's mappings of the daemon's arena segments.
//
// The daemon sends a segment's descriptor with the first reply that names an object in it
// (Reply.newSegments), and the connection maps it on arrival. Nothing is populated ahead: a
// page is mapped when it is first touched, so a client's resident memory grows with the
// bytes it reads or writes, not with the arena. There are two kinds:
// - A shared segment is sent once per session and stays mapped for the session's life, so a
//   warm Get costs no system call. When the daemon gives an empty segment a new file (for
//   another user's objects), it sends it again with a higher generation: the new file is
//   mapped in place of the old, and the writable view of the old one is dropped.
// - A dedicated segment holds one object larger than a shared segment. Its mapping lives as
//   long as something holds it (the Holdings of that object, and the reply that carried it
//   until then), or while it is one of the last kRecentDedicated mapped, and is unmapped
//   after: the daemon sends it again with every reply that names it. An index names one file
//   for the daemon's life. The daemon keeps a large object's segment when the object goes,
//   for the next large object of its writers' class (docs/architecture.md, "Kept segments"),
//   and a mapping kept here then serves that object with its page tables filled already: a
//   put of a large object, repeated, copies at memcpy speed.
// Every object a Get returns is read through the segment's read-only view, from a
// descriptor that cannot be mapped writable: a write through a Buffer faults in the writer
// and never reaches the store. The daemon sends a segment's read-write descriptor with the
// reply to this session's first create in it; only then is a writable view mapped, and only
// MutableBuffers point into it.
//
// A read-only view keeps its descriptor, so that a Buffer can be given a private copy of its
// object (Buffer::PrivateCopy: a MAP_PRIVATE, copy-on-write view of the object's pages). That
// costs one descriptor per shared segment mapped (as many as mappings: at most 200, and a
// few with the default 1 GiB segments) and one per dedicated segment while it is mapped.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "depot/ipc/framing.h"
#include "depot/status.h"
#include "mapping.h"

namespace depot::internal {

class Segments {
 public:
  // Bytes of a segment, and what keeps them mapped: null for a shared segment (mapped for
  // the session's life).
  template <typename Byte>
  struct View {
    Byte* data = nullptr;
    std::shared_ptr<const Mapping> keep;
  };

  // Maps segment `index` of `size` bytes read-only (`writable` false) or writable, and closes
  // `fd`. A failure to map is kept and reported by the Resolves of that view; a shared view
  // announced twice in one generation keeps the first, and a read-only view of a newer
  // generation replaces both. A dedicated segment's mapping is returned (null if it failed),
  // and lives as long as that or any View of it; while it lives, a second announcement
  // shares it. A segment's read-only view is announced first. Fails only when the daemon
  // breaks the protocol (a dedicated index sent as shared or the reverse, a writable view of
  // another generation than the read-only one).
  Result<std::shared_ptr<const Mapping>> Add(uint32_t index, uint64_t size, bool writable,
                                             bool dedicated, uint32_t generation, ipc::UniqueFd fd);

  // Whether the writable view of dedicated segment `index` was mapped since the last call:
  // its pages are then worth populating in one system call (CreateOptions::prefault); a
  // view kept from before has its page tables. Thread-safe.
  bool FirstWrite(uint32_t index);

  // The address of bytes [offset, offset + size) of segment `index` in its read-only view.
  // Fails with Internal if the daemon never announced the segment (or a dedicated one is no
  // longer mapped) or the range lies outside it, and with the mapping's error if mapping the
  // segment failed. Thread-safe.
  Result<View<const std::byte>> Resolve(uint32_t index, uint64_t offset, uint64_t size) const;
  // The same bytes in a view of their own, private and writable (Mapping::PrivateView), which
  // `keep` holds: writes stay in this process. Empty for `size` 0. Fails as Resolve does, or
  // with the mmap's error. Thread-safe.
  Result<View<std::byte>> ResolvePrivate(uint32_t index, uint64_t offset, uint64_t size) const;
  // The same bytes in the segment's writable view. Fails with Internal if the daemon sent
  // none. Thread-safe.
  Result<View<std::byte>> ResolveWritable(uint32_t index, uint64_t offset, uint64_t size) const;

 private:
  struct Shared {
    bool announced = false;
    uint32_t generation = 0;  // of the file mapped (Reply.newSegments)
    Mapping readable;
    Mapping writable;  // empty until the daemon sends the segment writable
    Status error;      // why mapping the read-only view failed, if it did
    Status writable_error;
  };
  struct Dedicated {
    std::weak_ptr<const Mapping> readable;
    std::weak_ptr<const Mapping> writable;
    Status error;              // why mapping it last failed, if it did
    bool first_write = false;  // the writable view is new since FirstWrite last said so
    dev_t dev = 0;             // the file the views map
    ino_t ino = 0;
  };

  // The mapping of a view, checked to hold the range; mu_ held.
  Result<View<std::byte>> Find(uint32_t index, uint64_t offset, uint64_t size, bool writable) const;

  mutable std::mutex mu_;
  std::vector<Shared> shared_;  // indexed by segment index
  // Writable views of files the daemon replaced, revoked (Mapping::Revoke): a MutableBuffer
  // used after its abort faults here rather than writing into memory reused since. The last
  // kMaxRevoked only, so that a long session's mappings stay bounded.
  static constexpr size_t kMaxRevoked = 64;
  std::deque<Mapping> revoked_;
  std::unordered_map<uint32_t, Dedicated> dedicated_;
  // The last dedicated views mapped, kept mapped when nothing else holds them (see above).
  // Each costs address space and page tables only: the daemon gives the pages back, whoever
  // maps them, when it gives up the segment.
  static constexpr size_t kRecentDedicated = 4;
  std::deque<std::shared_ptr<const Mapping>> recent_;
  size_t prune_at_ = 64;  // dedicated_'s size at which forgotten entries are dropped
};

}  // namespace depot::internal
