// The fields of the info structs of depot/client.h (StoreStatus, ObjectInfo, ClientInfo, ...),
// declared once: one table per struct of its fields in order, each with its name (as Python
// spells it), the struct's member, and the getter of the Cap'n Proto reader it comes from.
//
// The client reads the daemon's replies through these tables (FromWire), and the Python
// binding makes each struct's properties, repr and to_dict from them; so a field added to a
// struct and its table reaches Python with nothing else to write. A struct member missing
// from its table fails to compile (the static_asserts below); a schema field missing from its
// table fails info_fields_test.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "depot/client.h"
#include "depot/ipc/protocol.h"

namespace depot::internal {

// The getter of a field the client fills in itself (GpuInfo::ordinal), not read from the wire.
struct NotOnWire {};

// One field: `name`, `Struct::*member`, and `getter`, a member function of the wire reader.
template <typename Struct, typename Member, typename Getter = NotOnWire>
struct Field {
  using Value = Member;
  static constexpr bool kOnWire = !std::is_same_v<Getter, NotOnWire>;

  constexpr Field(const char* field_name, Member Struct::*field_member, Getter field_getter = {})
      : name(field_name), member(field_member), getter(field_getter) {}

  const char* name;
  Member Struct::*member;
  Getter getter;
};

// InfoFields<T>: T's table. kName is its name in Python, Wire its Cap'n Proto struct, kFields
// a tuple of Fields, in the order of the struct's members.
template <typename T>
struct InfoFields;

template <>
struct InfoFields<GpuInfo> {
  static constexpr const char* kName = "GpuInfo";
  using Wire = wire::Device;
  using R = Wire::Reader;
  static constexpr std::tuple kFields{
      Field{"ordinal", &GpuInfo::ordinal},  // this process's: Client::GetStatus fills it in
      Field{"uuid", &GpuInfo::uuid, &R::getUuid},
      Field{"name", &GpuInfo::name, &R::getName},
      Field{"simulated", &GpuInfo::simulated, &R::getSimulated},
      Field{"total_bytes", &GpuInfo::total_bytes, &R::getTotalBytes},
      Field{"limit_bytes", &GpuInfo::limit_bytes, &R::getLimitBytes},
      Field{"reserved_bytes", &GpuInfo::reserved_bytes, &R::getReservedBytes},
      Field{"used_bytes", &GpuInfo::used_bytes, &R::getUsedBytes},
      Field{"held_bytes", &GpuInfo::held_bytes, &R::getHeldBytes},
      Field{"chunks", &GpuInfo::chunks, &R::getChunks},
      Field{"replicas", &GpuInfo::replicas, &R::getReplicas},
  };
};

template <>
struct InfoFields<ObjectInfo> {
  static constexpr const char* kName = "ObjectInfo";
  using Wire = wire::ObjectInfo;
  using R = Wire::Reader;
  static constexpr std::tuple kFields{
      Field{"id", &ObjectInfo::id, &R::getId},
      Field{"name", &ObjectInfo::name, &R::getName},
      Field{"state", &ObjectInfo::state, &R::getState},
      Field{"data_size", &ObjectInfo::data_size, &R::getDataSize},
      Field{"metadata_size", &ObjectInfo::metadata_size, &R::getMetadataSize},
      Field{"ref_count", &ObjectInfo::ref_count, &R::getRefCount},
      Field{"pinned", &ObjectInfo::pinned, &R::getPinned},
      Field{"delete_pending", &ObjectInfo::delete_pending, &R::getDeletePending},
      Field{"has_checksum", &ObjectInfo::has_checksum, &R::getHasChecksum},
      Field{"checksum", &ObjectInfo::checksum, &R::getChecksum},
      Field{"create_time_ns", &ObjectInfo::create_time_ns, &R::getCreateTimeNs},
      Field{"access_time_ns", &ObjectInfo::access_time_ns, &R::getAccessTimeNs},
      Field{"segment", &ObjectInfo::segment, &R::getSegment},
      Field{"offset", &ObjectInfo::offset, &R::getOffset},
      Field{"on_host", &ObjectInfo::on_host, &R::getOnHost},
      Field{"gpus", &ObjectInfo::gpus, &R::getDevices},
      Field{"owner_uid", &ObjectInfo::owner_uid, &R::getOwnerUid},
      Field{"failed", &ObjectInfo::failed, &R::getFailed},
      Field{"on_disk", &ObjectInfo::on_disk, &R::getOnDisk},
  };
};

template <>
struct InfoFields<SchedulerStatus> {
  static constexpr const char* kName = "SchedulerStatus";
  using Wire = wire::SchedulerStatus;
  using R = Wire::Reader;
  static constexpr std::tuple kFields{
      Field{"workers", &SchedulerStatus::workers, &R::getWorkers},
      Field{"tasks_pending", &SchedulerStatus::tasks_pending, &R::getTasksPending},
      Field{"submitted", &SchedulerStatus::submitted, &R::getSubmitted},
      Field{"completed", &SchedulerStatus::completed, &R::getCompleted},
      Field{"failed", &SchedulerStatus::failed, &R::getFailed},
      Field{"cancelled", &SchedulerStatus::cancelled, &R::getCancelled},
      Field{"retried", &SchedulerStatus::retried, &R::getRetried},
      Field{"placements", &SchedulerStatus::placements, &R::getPlacements},
      Field{"local_bytes", &SchedulerStatus::local_bytes, &R::getLocalBytes},
      Field{"moved_bytes", &SchedulerStatus::moved_bytes, &R::getMovedBytes},
      Field{"prefetches", &SchedulerStatus::prefetches, &R::getPrefetches},
      Field{"host_to_gpu", &SchedulerStatus::host_to_gpu, &R::getHostToGpu},
      Field{"gpu_to_host", &SchedulerStatus::gpu_to_host, &R::getGpuToHost},
      Field{"gpu_to_gpu", &SchedulerStatus::gpu_to_gpu, &R::getGpuToGpu},
      Field{"bandwidths_measured", &SchedulerStatus::bandwidths_measured,
            &R::getBandwidthsMeasured},
  };
};

template <>
struct InfoFields<DiskStatus> {
  static constexpr const char* kName = "DiskStatus";
  using Wire = wire::DiskStatus;
  using R = Wire::Reader;
  static constexpr std::tuple kFields{
      Field{"enabled", &DiskStatus::enabled, &R::getEnabled},
      Field{"dir", &DiskStatus::dir, &R::getDir},
      Field{"limit_bytes", &DiskStatus::limit_bytes, &R::getLimitBytes},
      Field{"used_bytes", &DiskStatus::used_bytes, &R::getUsedBytes},
      Field{"file_bytes", &DiskStatus::file_bytes, &R::getFileBytes},
      Field{"files", &DiskStatus::files, &R::getFiles},
      Field{"objects", &DiskStatus::objects, &R::getObjects},
      Field{"spills", &DiskStatus::spills, &R::getSpills},
      Field{"spilled_bytes", &DiskStatus::spilled_bytes, &R::getSpilledBytes},
      Field{"spill_seconds", &DiskStatus::spill_seconds, &R::getSpillSeconds},
      Field{"restores", &DiskStatus::restores, &R::getRestores},
      Field{"restored_bytes", &DiskStatus::restored_bytes, &R::getRestoredBytes},
      Field{"restore_seconds", &DiskStatus::restore_seconds, &R::getRestoreSeconds},
      Field{"drops", &DiskStatus::drops, &R::getDrops},
      Field{"dropped_bytes", &DiskStatus::dropped_bytes, &R::getDroppedBytes},
      Field{"spill_failures", &DiskStatus::spill_failures, &R::getSpillFailures},
      Field{"restore_failures", &DiskStatus::restore_failures, &R::getRestoreFailures},
      Field{"copies_in_flight", &DiskStatus::copies_in_flight, &R::getCopiesInFlight},
      Field{"direct_io", &DiskStatus::direct_io, &R::getDirectIo},
  };
};

template <>
struct InfoFields<Setting> {
  static constexpr const char* kName = "Setting";
  using Wire = wire::Setting;
  using R = Wire::Reader;
  static constexpr std::tuple kFields{
      Field{"name", &Setting::name, &R::getName},
      Field{"value", &Setting::value, &R::getValue},
  };
};

template <>
struct InfoFields<StoreStatus> {
  static constexpr const char* kName = "StoreStatus";
  using Wire = wire::StoreStatus;
  using R = Wire::Reader;
  static constexpr std::tuple kFields{
      Field{"daemon_version", &StoreStatus::daemon_version, &R::getDaemonVersion},
      Field{"pid", &StoreStatus::pid, &R::getPid},
      Field{"uptime_ns", &StoreStatus::uptime_ns, &R::getUptimeNs},
      Field{"socket_path", &StoreStatus::socket_path, &R::getSocketPath},
      Field{"arena_backend", &StoreStatus::arena_backend, &R::getArenaBackend},
      Field{"capacity_bytes", &StoreStatus::capacity_bytes, &R::getCapacityBytes},
      Field{"mapped_bytes", &StoreStatus::mapped_bytes, &R::getMappedBytes},
      Field{"used_bytes", &StoreStatus::used_bytes, &R::getUsedBytes},
      Field{"held_bytes", &StoreStatus::held_bytes, &R::getHeldBytes},
      Field{"pinned_bytes", &StoreStatus::pinned_bytes, &R::getPinnedBytes},
      Field{"largest_free_block", &StoreStatus::largest_free_block, &R::getLargestFreeBlock},
      Field{"segments", &StoreStatus::segments, &R::getSegments},
      Field{"objects_sealed", &StoreStatus::objects_sealed, &R::getObjectsSealed},
      Field{"objects_creating", &StoreStatus::objects_creating, &R::getObjectsCreating},
      Field{"clients", &StoreStatus::clients, &R::getClients},
      Field{"evictions", &StoreStatus::evictions, &R::getEvictions},
      Field{"evicted_bytes", &StoreStatus::evicted_bytes, &R::getEvictedBytes},
      Field{"eviction_enabled", &StoreStatus::eviction_enabled, &R::getEvictionEnabled},
      Field{"header_slots", &StoreStatus::header_slots, &R::getHeaderSlots},
      Field{"requests", &StoreStatus::requests, &R::getRequests},
      Field{"gpus", &StoreStatus::gpus, &R::getDevices},
      Field{"gpu_backend", &StoreStatus::gpu_backend, &R::getDeviceBackend},
      Field{"spills", &StoreStatus::spills, &R::getSpills},
      Field{"spilled_bytes", &StoreStatus::spilled_bytes, &R::getSpilledBytes},
      Field{"replicas_made", &StoreStatus::replicas_made, &R::getReplicasMade},
      Field{"replicas_dropped", &StoreStatus::replicas_dropped, &R::getReplicasDropped},
      Field{"arena_page_locked_bytes", &StoreStatus::arena_page_locked_bytes,
            &R::getArenaPageLockedBytes},
      Field{"objects_on_host", &StoreStatus::objects_on_host, &R::getObjectsOnHost},
      Field{"metadata_bytes", &StoreStatus::metadata_bytes, &R::getMetadataBytes},
      Field{"metadata_budget_bytes", &StoreStatus::metadata_budget_bytes,
            &R::getMetadataBudgetBytes},
      Field{"request_bytes", &StoreStatus::request_bytes, &R::getRequestBytes},
      Field{"scheduler", &StoreStatus::scheduler, &R::getScheduler},
      Field{"disk", &StoreStatus::disk, &R::getDisk},
      Field{"config_file", &StoreStatus::config_file, &R::getConfigFile},
      Field{"settings", &StoreStatus::settings, &R::getSettings},
  };
};

template <>
struct InfoFields<ClientInfo> {
  static constexpr const char* kName = "ClientInfo";
  using Wire = wire::ClientInfo;
  using R = Wire::Reader;
  static constexpr std::tuple kFields{
      Field{"session_id", &ClientInfo::session_id, &R::getSessionId},
      Field{"pid", &ClientInfo::pid, &R::getPid},
      Field{"uid", &ClientInfo::uid, &R::getUid},
      Field{"command", &ClientInfo::command, &R::getCommand},
      Field{"client_name", &ClientInfo::client_name, &R::getClientName},
      Field{"objects_held", &ClientInfo::objects_held, &R::getObjectsHeld},
      Field{"references", &ClientInfo::references, &R::getReferences},
      Field{"bytes_held", &ClientInfo::bytes_held, &R::getBytesHeld},
      Field{"requests", &ClientInfo::requests, &R::getRequests},
      Field{"connected_time_ns", &ClientInfo::connected_time_ns, &R::getConnectedTimeNs},
  };
};

template <>
struct InfoFields<TierReferences> {
  static constexpr const char* kName = "TierReferences";
  using Wire = wire::TierReferences;
  using R = Wire::Reader;
  static constexpr std::tuple kFields{
      Field{"device", &TierReferences::device, &R::getDevice},
      Field{"references", &TierReferences::references, &R::getReferences},
  };
};

template <>
struct InfoFields<Holder> {
  static constexpr const char* kName = "Holder";
  using Wire = wire::Holder;
  using R = Wire::Reader;
  static constexpr std::tuple kFields{
      Field{"session_id", &Holder::session_id, &R::getSessionId},
      Field{"pid", &Holder::pid, &R::getPid},
      Field{"uid", &Holder::uid, &R::getUid},
      Field{"command", &Holder::command, &R::getCommand},
      Field{"client_name", &Holder::client_name, &R::getClientName},
      Field{"references", &Holder::references, &R::getReferences},
      Field{"tiers", &Holder::tiers, &R::getTiers},
  };
};

template <>
struct InfoFields<Replica> {
  static constexpr const char* kName = "Replica";
  using Wire = wire::Replica;
  using R = Wire::Reader;
  static constexpr std::tuple kFields{
      Field{"device", &Replica::device, &R::getDevice},
      Field{"segment", &Replica::segment, &R::getSegment},
      Field{"offset", &Replica::offset, &R::getOffset},
      Field{"references", &Replica::references, &R::getReferences},
      Field{"ready", &Replica::ready, &R::getReady},
  };
};

template <>
struct InfoFields<ObjectDetails> {
  static constexpr const char* kName = "ObjectDetails";
  using Wire = wire::ObjectDetails;
  using R = Wire::Reader;
  static constexpr std::tuple kFields{
      Field{"info", &ObjectDetails::info, &R::getInfo},
      Field{"holders", &ObjectDetails::holders, &R::getHolders},
      Field{"replicas", &ObjectDetails::replicas, &R::getReplicas},
  };
};

template <>
struct InfoFields<VerifyResult> {
  static constexpr const char* kName = "VerifyResult";
  using Wire = wire::VerifyResult;
  using R = Wire::Reader;
  static constexpr std::tuple kFields{
      Field{"id", &VerifyResult::id, &R::getId},
      Field{"state", &VerifyResult::state, &R::getState},
      Field{"expected", &VerifyResult::expected, &R::getExpected},
      Field{"actual", &VerifyResult::actual, &R::getActual},
  };
};

template <>
struct InfoFields<EvictResult> {
  static constexpr const char* kName = "EvictResult";
  using Wire = wire::EvictResult;
  using R = Wire::Reader;
  static constexpr std::tuple kFields{
      Field{"objects", &EvictResult::objects, &R::getObjects},
      Field{"bytes", &EvictResult::bytes, &R::getBytes},
  };
};

template <>
struct InfoFields<WorkerInfo> {
  static constexpr const char* kName = "WorkerInfo";
  using Wire = wire::WorkerInfo;
  using R = Wire::Reader;
  static constexpr std::tuple kFields{
      Field{"session_id", &WorkerInfo::session_id, &R::getSessionId},
      Field{"name", &WorkerInfo::name, &R::getName},
      Field{"cpus", &WorkerInfo::cpus, &R::getCpus},
      Field{"free_cpus", &WorkerInfo::free_cpus, &R::getFreeCpus},
      Field{"gpus", &WorkerInfo::gpus, &R::getGpus},
      Field{"free_gpu_shares", &WorkerInfo::free_gpu_shares, &R::getFreeGpuShares},
      Field{"resources", &WorkerInfo::resources, &R::getResources},
      Field{"functions", &WorkerInfo::functions, &R::getFunctions},
      Field{"running", &WorkerInfo::running, &R::getRunning},
      Field{"queued", &WorkerInfo::queued, &R::getQueued},
      Field{"done", &WorkerInfo::done, &R::getDone},
      Field{"failed", &WorkerInfo::failed, &R::getFailed},
      Field{"draining", &WorkerInfo::draining, &R::getDraining},
      Field{"attached_s", &WorkerInfo::attached_s, &R::getAttachedS},
      Field{"gpu_functions", &WorkerInfo::gpu_functions, &R::getGpuFunctions},
  };
};

template <>
struct InfoFields<TaskInfo> {
  static constexpr const char* kName = "TaskInfo";
  using Wire = wire::TaskInfo;
  using R = Wire::Reader;
  static constexpr std::tuple kFields{
      Field{"task", &TaskInfo::task, &R::getTask},
      Field{"function", &TaskInfo::function, &R::getFunction},
      Field{"state", &TaskInfo::state, &R::getState},
      Field{"submitter", &TaskInfo::submitter, &R::getSubmitter},
      Field{"worker", &TaskInfo::worker, &R::getWorker},
      Field{"device", &TaskInfo::device, &R::getDevice},
      Field{"outputs", &TaskInfo::outputs, &R::getOutputs},
      Field{"priority", &TaskInfo::priority, &R::getPriority},
      Field{"attempts", &TaskInfo::attempts, &R::getAttempts},
      Field{"inputs_missing", &TaskInfo::inputs_missing, &R::getInputsMissing},
      Field{"local_bytes", &TaskInfo::local_bytes, &R::getLocalBytes},
      Field{"moved_bytes", &TaskInfo::moved_bytes, &R::getMovedBytes},
      Field{"wait_s", &TaskInfo::wait_s, &R::getWaitS},
      Field{"transfer_s", &TaskInfo::transfer_s, &R::getTransferS},
      Field{"duration_s", &TaskInfo::duration_s, &R::getDurationS},
      Field{"reason", &TaskInfo::reason, &R::getReason},
      Field{"variant", &TaskInfo::variant, &R::getVariant},
      Field{"variant_reason", &TaskInfo::variant_reason, &R::getVariantReason},
  };
};

// Not read from the wire as such: Client::Locate makes it from the tiers bits of a header or
// a Placement, in this process's GPU ordinals.
template <>
struct InfoFields<ObjectPlacement> {
  static constexpr const char* kName = "ObjectPlacement";
  static constexpr std::tuple kFields{
      Field{"id", &ObjectPlacement::id},
      Field{"found", &ObjectPlacement::found},
      Field{"failed", &ObjectPlacement::failed},
      Field{"on_host", &ObjectPlacement::on_host},
      Field{"gpus", &ObjectPlacement::gpus},
      Field{"data_size", &ObjectPlacement::data_size},
      Field{"metadata_size", &ObjectPlacement::metadata_size},
  };
};

template <typename T>
concept Info = requires {
  InfoFields<T>::kFields;
};

// Calls `f(field)` for each field of T, in order.
template <Info T, typename F>
constexpr void ForEachField(F&& f) {
  std::apply([&](const auto&... field) { (f(field), ...); }, InfoFields<T>::kFields);
}

template <Info T>
inline constexpr size_t kFieldCount = std::tuple_size_v<decltype(InfoFields<T>::kFields)>;

// How many members an aggregate has: the most initialisers it takes.
namespace detail {
struct AnyMember {
  template <typename T>
  operator T() const;
};
template <typename T, typename... Initialisers>
consteval size_t MemberCount() {
  if constexpr (requires { T{Initialisers{}..., AnyMember{}}; }) {
    return MemberCount<T, Initialisers..., AnyMember>();
  } else {
    return sizeof...(Initialisers);
  }
}
}  // namespace detail

#define DEPOT_CHECK_INFO_FIELDS(T)                                  \
  static_assert(detail::MemberCount<T>() == kFieldCount<T>,         \
                "a member of " #T " is missing from InfoFields<" #T \
                "> (or the table has one too many)")
DEPOT_CHECK_INFO_FIELDS(GpuInfo);
DEPOT_CHECK_INFO_FIELDS(ObjectInfo);
DEPOT_CHECK_INFO_FIELDS(SchedulerStatus);
DEPOT_CHECK_INFO_FIELDS(StoreStatus);
DEPOT_CHECK_INFO_FIELDS(ClientInfo);
DEPOT_CHECK_INFO_FIELDS(TierReferences);
DEPOT_CHECK_INFO_FIELDS(Holder);
DEPOT_CHECK_INFO_FIELDS(Replica);
DEPOT_CHECK_INFO_FIELDS(ObjectDetails);
DEPOT_CHECK_INFO_FIELDS(VerifyResult);
DEPOT_CHECK_INFO_FIELDS(EvictResult);
DEPOT_CHECK_INFO_FIELDS(ObjectPlacement);
DEPOT_CHECK_INFO_FIELDS(WorkerInfo);
DEPOT_CHECK_INFO_FIELDS(TaskInfo);
#undef DEPOT_CHECK_INFO_FIELDS

// Conversions from the wire's values to the structs' members, one per kind of value.

template <typename V>
requires std::is_arithmetic_v<V>
void ReadWire(V in, V& out) { out = in; }

inline void ReadWire(capnp::Text::Reader in, std::string& out) { out.assign(in.cStr(), in.size()); }

// A GPU's uuid: 16 bytes (fewer from a malformed reply leave the rest zero).
inline void ReadWire(capnp::Data::Reader in, std::array<uint8_t, 16>& out) {
  out = {};
  // An empty Data's begin() may be null, which memcpy must not be given even for 0 bytes.
  if (in.size() != 0) std::memcpy(out.data(), in.begin(), std::min<size_t>(in.size(), out.size()));
}

inline void ReadWire(wire::Id::Reader in, ObjectId& out) { out = ipc::FromWire(in); }

// Unknown wire values (a newer daemon's) read as the most common state.
inline void ReadWire(wire::ObjectState in, ObjectState& out) {
  out = in == wire::ObjectState::CREATING ? ObjectState::kCreating : ObjectState::kSealed;
}

inline void ReadWire(wire::VerifyState in, VerifyState& out) {
  switch (in) {
    case wire::VerifyState::OK:
      out = VerifyState::kOk;
      return;
    case wire::VerifyState::MISMATCH:
      out = VerifyState::kMismatch;
      return;
    case wire::VerifyState::NO_CHECKSUM:
      out = VerifyState::kNoChecksum;
      return;
    case wire::VerifyState::NOT_SEALED:
      out = VerifyState::kNotSealed;
      return;
    case wire::VerifyState::NOT_ON_HOST:
      out = VerifyState::kNotOnHost;
      return;
    case wire::VerifyState::NOT_FOUND:
      break;
  }
  out = VerifyState::kNotFound;
}

// The same states in the same order; unknown wire values (a newer daemon's) read as failed,
// a state this client cannot act on.
static_assert(static_cast<uint16_t>(wire::TaskState::CANCELLED) ==
              static_cast<uint16_t>(TaskState::kCancelled));
inline void ReadWire(wire::TaskState in, TaskState& out) {
  const auto value = static_cast<uint16_t>(in);
  out = value <= static_cast<uint16_t>(TaskState::kCancelled) ? static_cast<TaskState>(value)
                                                              : TaskState::kFailed;
}

// Custom resources: a list of (name, amount) on the wire, a map here.
inline void ReadWire(capnp::List<wire::Resource>::Reader in, std::map<std::string, double>& out) {
  out.clear();
  for (auto r : in) out[std::string(r.getName().cStr(), r.getName().size())] = r.getAmount();
}

template <Info T>
T FromWire(typename InfoFields<T>::Wire::Reader in);

// A nested struct (ObjectDetails::info).
template <Info T>
void ReadWire(typename InfoFields<T>::Wire::Reader in, T& out) {
  out = FromWire<T>(in);
}

// A list, element by element.
template <typename List, typename T>
requires requires(List list) {
  list.size();
  list[0u];
}
void ReadWire(List in, std::vector<T>& out) {
  out.clear();
  out.reserve(in.size());
  for (auto element : in) ReadWire(element, out.emplace_back());
}

// A struct from its wire form, every field of its table that is on the wire.
template <Info T>
T FromWire(typename InfoFields<T>::Wire::Reader in) {
  T out;
  ForEachField<T>([&](const auto& field) {
    if constexpr (std::decay_t<decltype(field)>::kOnWire) {
      ReadWire((in.*field.getter)(), out.*field.member);
    }
  });
  return out;
}

}  // namespace depot::internal
