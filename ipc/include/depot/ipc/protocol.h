// What both ends of the socket agree on besides the schema: versions, limits, and the
// conversions between the schema's types and depot's.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "depot/object_id.h"
#include "depot/status.h"
#include "protocol.capnp.h"

namespace depot::ipc {

// Bumped on every incompatible change to protocol.capnp or to ObjectHeader.
inline constexpr uint32_t kProtocolVersion = 21;

// Arena segments from this index up are dedicated: each holds one object larger than a
// shared segment, and its index is never reused (wire::Segment.dedicated).
inline constexpr uint32_t kFirstDedicatedSegment = 0x8000'0000u;
inline constexpr bool IsDedicatedSegment(uint32_t segment) {
  return segment >= kFirstDedicatedSegment;
}

// The daemon's default bound on one frame. A session that sends a larger one is closed.
inline constexpr uint32_t kDefaultMaxFrameBytes = 16u << 20;
// Most ids one batched request may name.
inline constexpr uint32_t kDefaultMaxBatch = 100'000;
// Most bytes (data and metadata) of one task output carried in a completion (OutputValue).
inline constexpr uint64_t kMaxInlineOutputBytes = 64 << 10;
// Cap'n Proto traversal limit for a frame of `frame_bytes`: nothing may be read twice over.
inline uint64_t TraversalLimitWords(uint32_t frame_bytes) { return frame_bytes / 8 * 2 + 64; }

// Tier numbers on the wire (Create.device, Get.device, TierRefs.device, Location.device).
inline constexpr int32_t kHostDevice = -1;
// TierRefs.device of a group that names objects read through leases (protocol.capnp).
inline constexpr int32_t kLeasedReads = -2;

inline ObjectId FromWire(wire::Id::Reader id) {
  return ObjectId::FromWords(id.getLo(), id.getHi());
}
inline void ToWire(const ObjectId& id, wire::Id::Builder out) {
  out.setLo(id.lo());
  out.setHi(id.hi());
}

inline std::vector<ObjectId> FromWire(capnp::List<wire::Id>::Reader ids) {
  std::vector<ObjectId> out;
  out.reserve(ids.size());
  for (auto id : ids) out.push_back(FromWire(id));
  return out;
}
// Fills `out`, a list initialised to ids.size() entries.
inline void ToWire(std::span<const ObjectId> ids, capnp::List<wire::Id>::Builder out) {
  for (unsigned i = 0; i < ids.size(); ++i) ToWire(ids[i], out[i]);
}
inline std::string ToString(capnp::Text::Reader text) {
  return std::string(text.cStr(), text.size());
}

inline wire::ErrorCode ToWire(StatusCode code) { return static_cast<wire::ErrorCode>(code); }
// Unknown wire values become kInternal: a newer peer must not crash an older one.
StatusCode FromWire(wire::ErrorCode code);

// The Status a reply's error fields describe (OK when `error` is ok).
Status StatusFromReply(wire::Reply::Reader reply);

// The default socket path for this user: $XDG_RUNTIME_DIR/depot.sock when that directory
// exists, else /tmp/depot-<uid>.sock. DEPOT_SOCKET, when set, takes precedence.
std::string DefaultSocketPath();

}  // namespace depot::ipc
