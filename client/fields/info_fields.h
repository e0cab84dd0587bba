// The fields of the info structs of depot/client.h and depot/task.h (StoreStatus, ObjectInfo,
// ClientInfo, ...), declared once: one table per struct of its fields in order, each with its
// name (as Python and depotctl's JSON spell it), the struct's member, and the getter of the
// Cap'n Proto reader it comes from and the setter (or init) of the builder it goes to.
//
// The daemon writes its replies through these tables (ToWire), from the client structs it
// fills; the client reads them through the same tables (FromWire); the Python binding makes
// each struct's properties, repr and to_dict from them, depotctl its JSON, and the daemon its
// metrics of the status fields that have one (ForEachMetric). So a field added to a struct,
// its table and the schema reaches every one of them with nothing else to write. A struct
// member missing from its table fails to compile (the static_asserts below); a schema field
// missing from its table, or one the daemon does not set, fails info_fields_test.
//
// Not part of the installed API: the project's own programs (depotd, depotctl, the Python
// binding, tests) reach it through the depot_info_fields target, over the public structs.
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
#include "depot/task.h"

namespace depot::internal {

// The getter and setter of a field the client fills in itself (GpuInfo::ordinal), not read
// from the wire.
struct NotOnWire {};

// The daemon's metrics (`depotctl metrics`, GET /metrics) that export a field: a Prometheus
// family (name, type, help) and the labels of the field's sample in it. Several fields share
// a family when they are one quantity per tier or per event (the host's capacity and each
// GPU's, in depot_capacity_bytes): they name the same MetricFamily, so its type and help are
// written once.
enum class MetricType { kGauge, kCounter };

struct MetricFamily {
  const char* name;
  MetricType type;
  const char* help;
};

// How a field's value is written: as it is (an integer, or seconds as a double to the µs),
// or nanoseconds as seconds to the ms.
enum class MetricUnit { kAsIs, kNanosAsSeconds };

struct Metric {
  constexpr Metric() = default;
  // A family of its own, with one sample and no labels.
  constexpr Metric(const char* metric_name, MetricType metric_type, const char* metric_help,
                   MetricUnit metric_unit = MetricUnit::kAsIs)
      : family{metric_name, metric_type, metric_help}, unit(metric_unit) {}
  // A sample of a shared family: `metric_labels` as Prometheus writes them, `tier="host"`.
  constexpr Metric(const MetricFamily& metric_family, const char* metric_labels)
      : family(metric_family), labels(metric_labels) {}

  constexpr bool exported() const { return family.name != nullptr; }

  MetricFamily family{nullptr, MetricType::kGauge, nullptr};  // no name: not exported
  const char* labels = "";
  MetricUnit unit = MetricUnit::kAsIs;
};

// One field: `name`, `Struct::*member`, and, for a field on the wire, `getter`, a member
// function of the wire reader, and `setter`, the builder's setX (a value) or initX (a struct,
// a list or an id); and `metric`, if the daemon's metrics export it (ForEachMetric).
template <typename Struct, typename Member, typename Getter = NotOnWire,
          typename Setter = NotOnWire>
struct Field {
  using Value = Member;
  static constexpr bool kOnWire = !std::is_same_v<Getter, NotOnWire>;
  static_assert(kOnWire == !std::is_same_v<Setter, NotOnWire>,
                "a field on the wire has both a getter and a setter");

  constexpr Field(const char* field_name, Member Struct::*field_member, Getter field_getter = {},
                  Setter field_setter = {}, Metric field_metric = {})
      : name(field_name),
        member(field_member),
        getter(field_getter),
        setter(field_setter),
        metric(field_metric) {}

  const char* name;
  Member Struct::*member;
  Getter getter;
  Setter setter;
  Metric metric;
};

// The metric families that several fields share (the rest are declared at their field).
namespace metric {
inline constexpr MetricFamily kCapacityBytes{
    "depot_capacity_bytes", MetricType::kGauge,
    "What a tier may take: the host arena (--memory), a GPU pool's limit (--gpu-memory)."};
inline constexpr MetricFamily kMappedBytes{
    "depot_mapped_bytes", MetricType::kGauge,
    "Bytes in arena segments, or GPU pool chunks, created so far."};
inline constexpr MetricFamily kUsedBytes{"depot_used_bytes", MetricType::kGauge,
                                         "Bytes allocated to objects."};
inline constexpr MetricFamily kHeldBytes{
    "depot_held_bytes", MetricType::kGauge,
    "Bytes of objects referenced or being created (not evictable, not spillable)."};
inline constexpr MetricFamily kPinnedBytes{"depot_pinned_bytes", MetricType::kGauge,
                                           "Bytes of pinned objects."};
inline constexpr MetricFamily kPageLockedBytes{
    "depot_page_locked_bytes", MetricType::kGauge,
    "Host arena bytes page-locked (registered with the CUDA driver) for GPU copies."};
// Not depot_replicas: Prometheus parsers name the family of depot_replicas_total so.
inline constexpr MetricFamily kTierObjects{
    "depot_tier_objects", MetricType::kGauge,
    "Objects with a copy on each tier, copies being made included."};
inline constexpr MetricFamily kObjects{"depot_objects", MetricType::kGauge,
                                       "Objects in the store, by state."};
inline constexpr MetricFamily kReplicasTotal{
    "depot_replicas_total", MetricType::kCounter,
    "Copies between tiers: made for a get on another tier, dropped to make room on a GPU."};
inline constexpr MetricFamily kTasksTotal{
    "depot_tasks_total", MetricType::kCounter,
    "Tasks submitted, and those over: done, failed, cancelled; and runs retried after their "
    "worker died."};
inline constexpr MetricFamily kTaskInputBytesTotal{
    "depot_task_input_bytes_total", MetricType::kCounter,
    "Input bytes of placed tasks: already where they run (local), or to be copied there."};
inline constexpr MetricFamily kDiskBytes{
    "depot_disk_bytes", MetricType::kGauge,
    "The spill directory: bytes allocated to objects (used), of its files (files), and its "
    "limit (limit)."};
inline constexpr MetricFamily kDiskObjectsTotal{
    "depot_disk_objects_total", MetricType::kCounter,
    "Objects spilled to disk, restored from it, dropped from it for good (the spill limit "
    "reached), and spills and restores that failed."};
inline constexpr MetricFamily kDiskIoBytesTotal{"depot_disk_io_bytes_total", MetricType::kCounter,
                                                "Bytes written by spills and read by restores."};
inline constexpr MetricFamily kDiskIoCallsTotal{
    "depot_disk_io_calls_total", MetricType::kCounter,
    "Disk writes made by spills and reads made by restores (small objects share them)."};
inline constexpr MetricFamily kDiskIoSecondsTotal{
    "depot_disk_io_seconds_total", MetricType::kCounter,
    "Seconds during which spill writes (restore reads) were under way (bytes / seconds: "
    "throughput)."};
}  // namespace metric

// InfoFields<T>: T's table. kName is its name in Python, Wire its Cap'n Proto struct (R its
// reader, B its builder), kFields a tuple of Fields, in the order of the struct's members.
template <typename T>
struct InfoFields;

template <>
struct InfoFields<GpuInfo> {
  static constexpr const char* kName = "GpuInfo";
  // Its metrics' label: tier="gpuK", K its index in StoreStatus::gpus (the daemon's numbering,
  // as `status` shows it; not this process's ordinal).
  static constexpr const char* kMetricLabel = "tier";
  static constexpr const char* kMetricLabelPrefix = "gpu";
  using Wire = wire::Device;
  using R = Wire::Reader;
  using B = Wire::Builder;
  static constexpr std::tuple kFields{
      Field{"ordinal", &GpuInfo::ordinal},  // this process's: Client::GetStatus fills it in
      Field{"uuid", &GpuInfo::uuid, &R::getUuid, &B::setUuid},
      Field{"name", &GpuInfo::name, &R::getName, &B::setName},
      Field{"simulated", &GpuInfo::simulated, &R::getSimulated, &B::setSimulated},
      Field{"total_bytes", &GpuInfo::total_bytes, &R::getTotalBytes, &B::setTotalBytes},
      Field{"limit_bytes", &GpuInfo::limit_bytes, &R::getLimitBytes, &B::setLimitBytes,
            Metric{metric::kCapacityBytes, ""}},
      Field{"reserved_bytes", &GpuInfo::reserved_bytes, &R::getReservedBytes, &B::setReservedBytes,
            Metric{metric::kMappedBytes, ""}},
      Field{"used_bytes", &GpuInfo::used_bytes, &R::getUsedBytes, &B::setUsedBytes,
            Metric{metric::kUsedBytes, ""}},
      Field{"held_bytes", &GpuInfo::held_bytes, &R::getHeldBytes, &B::setHeldBytes,
            Metric{metric::kHeldBytes, ""}},
      Field{"chunks", &GpuInfo::chunks, &R::getChunks, &B::setChunks},
      Field{"replicas", &GpuInfo::replicas, &R::getReplicas, &B::setReplicas,
            Metric{metric::kTierObjects, ""}},
  };
};

template <>
struct InfoFields<ObjectInfo> {
  static constexpr const char* kName = "ObjectInfo";
  using Wire = wire::ObjectInfo;
  using R = Wire::Reader;
  using B = Wire::Builder;
  static constexpr std::tuple kFields{
      Field{"id", &ObjectInfo::id, &R::getId, &B::initId},
      Field{"name", &ObjectInfo::name, &R::getName, &B::setName},
      Field{"state", &ObjectInfo::state, &R::getState, &B::setState},
      Field{"data_size", &ObjectInfo::data_size, &R::getDataSize, &B::setDataSize},
      Field{"metadata_size", &ObjectInfo::metadata_size, &R::getMetadataSize, &B::setMetadataSize},
      Field{"ref_count", &ObjectInfo::ref_count, &R::getRefCount, &B::setRefCount},
      Field{"pinned", &ObjectInfo::pinned, &R::getPinned, &B::setPinned},
      Field{"delete_pending", &ObjectInfo::delete_pending, &R::getDeletePending,
            &B::setDeletePending},
      Field{"has_checksum", &ObjectInfo::has_checksum, &R::getHasChecksum, &B::setHasChecksum},
      Field{"checksum", &ObjectInfo::checksum, &R::getChecksum, &B::setChecksum},
      Field{"create_time_ns", &ObjectInfo::create_time_ns, &R::getCreateTimeNs,
            &B::setCreateTimeNs},
      Field{"access_time_ns", &ObjectInfo::access_time_ns, &R::getAccessTimeNs,
            &B::setAccessTimeNs},
      Field{"segment", &ObjectInfo::segment, &R::getSegment, &B::setSegment},
      Field{"offset", &ObjectInfo::offset, &R::getOffset, &B::setOffset},
      Field{"on_host", &ObjectInfo::on_host, &R::getOnHost, &B::setOnHost},
      Field{"gpus", &ObjectInfo::gpus, &R::getDevices, &B::initDevices},
      Field{"owner_uid", &ObjectInfo::owner_uid, &R::getOwnerUid, &B::setOwnerUid},
      Field{"failed", &ObjectInfo::failed, &R::getFailed, &B::setFailed},
      Field{"on_disk", &ObjectInfo::on_disk, &R::getOnDisk, &B::setOnDisk},
  };
};

template <>
struct InfoFields<SchedulerStatus> {
  static constexpr const char* kName = "SchedulerStatus";
  using Wire = wire::SchedulerStatus;
  using R = Wire::Reader;
  using B = Wire::Builder;
  static constexpr std::tuple kFields{
      Field{"workers", &SchedulerStatus::workers, &R::getWorkers, &B::setWorkers,
            Metric{"depot_workers", MetricType::kGauge, "Workers attached to the scheduler."}},
      Field{"tasks_pending", &SchedulerStatus::tasks_pending, &R::getTasksPending,
            &B::setTasksPending,
            Metric{"depot_tasks_pending", MetricType::kGauge,
                   "Tasks waiting, ready, queued on a worker or running."}},
      Field{"submitted", &SchedulerStatus::submitted, &R::getSubmitted, &B::setSubmitted,
            Metric{metric::kTasksTotal, R"(event="submitted")"}},
      Field{"completed", &SchedulerStatus::completed, &R::getCompleted, &B::setCompleted,
            Metric{metric::kTasksTotal, R"(event="done")"}},
      Field{"failed", &SchedulerStatus::failed, &R::getFailed, &B::setFailed,
            Metric{metric::kTasksTotal, R"(event="failed")"}},
      Field{"cancelled", &SchedulerStatus::cancelled, &R::getCancelled, &B::setCancelled,
            Metric{metric::kTasksTotal, R"(event="cancelled")"}},
      Field{"retried", &SchedulerStatus::retried, &R::getRetried, &B::setRetried,
            Metric{metric::kTasksTotal, R"(event="retried")"}},
      Field{"placements", &SchedulerStatus::placements, &R::getPlacements, &B::setPlacements},
      Field{"local_bytes", &SchedulerStatus::local_bytes, &R::getLocalBytes, &B::setLocalBytes,
            Metric{metric::kTaskInputBytesTotal, R"(where="local")"}},
      Field{"moved_bytes", &SchedulerStatus::moved_bytes, &R::getMovedBytes, &B::setMovedBytes,
            Metric{metric::kTaskInputBytesTotal, R"(where="moved")"}},
      Field{"prefetches", &SchedulerStatus::prefetches, &R::getPrefetches, &B::setPrefetches,
            Metric{"depot_task_prefetches_total", MetricType::kCounter,
                   "Inputs copied ahead of a task queued on a worker."}},
      Field{"steals", &SchedulerStatus::steals, &R::getSteals, &B::setSteals,
            Metric{"depot_task_steals_total", MetricType::kCounter,
                   "Tasks queued on a busy worker that were placed afresh for an idle one."}},
      Field{"preemptions", &SchedulerStatus::preemptions, &R::getPreemptions, &B::setPreemptions,
            Metric{"depot_task_preemptions_total", MetricType::kCounter,
                   "Tasks queued on a worker that gave their place to a ready task outranking "
                   "them (a consumer of data before a producer of more)."}},
      Field{"host_to_gpu", &SchedulerStatus::host_to_gpu, &R::getHostToGpu, &B::setHostToGpu},
      Field{"gpu_to_host", &SchedulerStatus::gpu_to_host, &R::getGpuToHost, &B::setGpuToHost},
      Field{"gpu_to_gpu", &SchedulerStatus::gpu_to_gpu, &R::getGpuToGpu, &B::setGpuToGpu},
      Field{"bandwidths_measured", &SchedulerStatus::bandwidths_measured, &R::getBandwidthsMeasured,
            &B::setBandwidthsMeasured},
  };
};

template <>
struct InfoFields<DiskStatus> {
  static constexpr const char* kName = "DiskStatus";
  // Without a spill directory its metrics are not exported at all (no depot_disk_* families).
  static constexpr bool DiskStatus::*kMetricsWhen = &DiskStatus::enabled;
  using Wire = wire::DiskStatus;
  using R = Wire::Reader;
  using B = Wire::Builder;
  static constexpr std::tuple kFields{
      Field{"enabled", &DiskStatus::enabled, &R::getEnabled, &B::setEnabled},
      Field{"dir", &DiskStatus::dir, &R::getDir, &B::setDir},
      Field{"limit_bytes", &DiskStatus::limit_bytes, &R::getLimitBytes, &B::setLimitBytes,
            Metric{metric::kDiskBytes, R"(kind="limit")"}},
      Field{"used_bytes", &DiskStatus::used_bytes, &R::getUsedBytes, &B::setUsedBytes,
            Metric{metric::kDiskBytes, R"(kind="used")"}},
      Field{"file_bytes", &DiskStatus::file_bytes, &R::getFileBytes, &B::setFileBytes,
            Metric{metric::kDiskBytes, R"(kind="files")"}},
      Field{"files", &DiskStatus::files, &R::getFiles, &B::setFiles},
      Field{"objects", &DiskStatus::objects, &R::getObjects, &B::setObjects,
            Metric{"depot_disk_objects", MetricType::kGauge,
                   "Objects with a copy in the spill directory."}},
      Field{"spills", &DiskStatus::spills, &R::getSpills, &B::setSpills,
            Metric{metric::kDiskObjectsTotal, R"(event="spilled")"}},
      Field{"spilled_bytes", &DiskStatus::spilled_bytes, &R::getSpilledBytes, &B::setSpilledBytes,
            Metric{metric::kDiskIoBytesTotal, R"(op="write")"}},
      Field{"spill_seconds", &DiskStatus::spill_seconds, &R::getSpillSeconds, &B::setSpillSeconds,
            Metric{metric::kDiskIoSecondsTotal, R"(op="write")"}},
      Field{"restores", &DiskStatus::restores, &R::getRestores, &B::setRestores,
            Metric{metric::kDiskObjectsTotal, R"(event="restored")"}},
      Field{"restored_bytes", &DiskStatus::restored_bytes, &R::getRestoredBytes,
            &B::setRestoredBytes, Metric{metric::kDiskIoBytesTotal, R"(op="read")"}},
      Field{"restore_seconds", &DiskStatus::restore_seconds, &R::getRestoreSeconds,
            &B::setRestoreSeconds, Metric{metric::kDiskIoSecondsTotal, R"(op="read")"}},
      Field{"drops", &DiskStatus::drops, &R::getDrops, &B::setDrops,
            Metric{metric::kDiskObjectsTotal, R"(event="dropped")"}},
      Field{"dropped_bytes", &DiskStatus::dropped_bytes, &R::getDroppedBytes, &B::setDroppedBytes},
      Field{"spill_failures", &DiskStatus::spill_failures, &R::getSpillFailures,
            &B::setSpillFailures, Metric{metric::kDiskObjectsTotal, R"(event="spill_failed")"}},
      Field{"restore_failures", &DiskStatus::restore_failures, &R::getRestoreFailures,
            &B::setRestoreFailures, Metric{metric::kDiskObjectsTotal, R"(event="restore_failed")"}},
      Field{"copies_in_flight", &DiskStatus::copies_in_flight, &R::getCopiesInFlight,
            &B::setCopiesInFlight},
      Field{"direct_io", &DiskStatus::direct_io, &R::getDirectIo, &B::setDirectIo},
      Field{"writes", &DiskStatus::writes, &R::getWrites, &B::setWrites,
            Metric{metric::kDiskIoCallsTotal, R"(op="write")"}},
      Field{"reads", &DiskStatus::reads, &R::getReads, &B::setReads,
            Metric{metric::kDiskIoCallsTotal, R"(op="read")"}},
  };
};

template <>
struct InfoFields<Setting> {
  static constexpr const char* kName = "Setting";
  using Wire = wire::Setting;
  using R = Wire::Reader;
  using B = Wire::Builder;
  static constexpr std::tuple kFields{
      Field{"name", &Setting::name, &R::getName, &B::setName},
      Field{"value", &Setting::value, &R::getValue, &B::setValue},
  };
};

template <>
struct InfoFields<StoreStatus> {
  static constexpr const char* kName = "StoreStatus";
  using Wire = wire::StoreStatus;
  using R = Wire::Reader;
  using B = Wire::Builder;
  static constexpr std::tuple kFields{
      Field{"daemon_version", &StoreStatus::daemon_version, &R::getDaemonVersion,
            &B::setDaemonVersion},
      Field{"pid", &StoreStatus::pid, &R::getPid, &B::setPid},
      Field{"uptime_ns", &StoreStatus::uptime_ns, &R::getUptimeNs, &B::setUptimeNs,
            Metric{"depot_uptime_seconds", MetricType::kGauge, "Seconds since the daemon started.",
                   MetricUnit::kNanosAsSeconds}},
      Field{"socket_path", &StoreStatus::socket_path, &R::getSocketPath, &B::setSocketPath},
      Field{"arena_backend", &StoreStatus::arena_backend, &R::getArenaBackend, &B::setArenaBackend},
      Field{"capacity_bytes", &StoreStatus::capacity_bytes, &R::getCapacityBytes,
            &B::setCapacityBytes, Metric{metric::kCapacityBytes, R"(tier="host")"}},
      Field{"mapped_bytes", &StoreStatus::mapped_bytes, &R::getMappedBytes, &B::setMappedBytes,
            Metric{metric::kMappedBytes, R"(tier="host")"}},
      Field{"used_bytes", &StoreStatus::used_bytes, &R::getUsedBytes, &B::setUsedBytes,
            Metric{metric::kUsedBytes, R"(tier="host")"}},
      Field{"held_bytes", &StoreStatus::held_bytes, &R::getHeldBytes, &B::setHeldBytes,
            Metric{metric::kHeldBytes, R"(tier="host")"}},
      Field{"pinned_bytes", &StoreStatus::pinned_bytes, &R::getPinnedBytes, &B::setPinnedBytes,
            Metric{metric::kPinnedBytes, R"(tier="host")"}},
      Field{"largest_free_block", &StoreStatus::largest_free_block, &R::getLargestFreeBlock,
            &B::setLargestFreeBlock},
      Field{"kept_bytes", &StoreStatus::kept_bytes, &R::getKeptBytes, &B::setKeptBytes,
            Metric{"depot_kept_bytes", MetricType::kGauge,
                   "Host memory of large objects gone, kept for the next ones (free for any "
                   "object)."}},
      Field{"arena_page_bytes", &StoreStatus::arena_page_bytes, &R::getArenaPageBytes,
            &B::setArenaPageBytes},
      Field{"arena_pages", &StoreStatus::arena_pages, &R::getArenaPages, &B::setArenaPages},
      Field{"segments", &StoreStatus::segments, &R::getSegments, &B::setSegments},
      Field{"objects_sealed", &StoreStatus::objects_sealed, &R::getObjectsSealed,
            &B::setObjectsSealed, Metric{metric::kObjects, R"(state="sealed")"}},
      Field{"objects_creating", &StoreStatus::objects_creating, &R::getObjectsCreating,
            &B::setObjectsCreating, Metric{metric::kObjects, R"(state="creating")"}},
      Field{"clients", &StoreStatus::clients, &R::getClients, &B::setClients,
            Metric{"depot_clients", MetricType::kGauge, "Connected client sessions."}},
      Field{"evictions", &StoreStatus::evictions, &R::getEvictions, &B::setEvictions,
            Metric{"depot_evictions_total", MetricType::kCounter,
                   "Objects evicted under memory pressure."}},
      Field{"evicted_bytes", &StoreStatus::evicted_bytes, &R::getEvictedBytes, &B::setEvictedBytes,
            Metric{"depot_evicted_bytes_total", MetricType::kCounter,
                   "Bytes evicted under memory pressure."}},
      Field{"eviction_enabled", &StoreStatus::eviction_enabled, &R::getEvictionEnabled,
            &B::setEvictionEnabled},
      Field{"header_slots", &StoreStatus::header_slots, &R::getHeaderSlots, &B::setHeaderSlots},
      Field{"requests", &StoreStatus::requests, &R::getRequests, &B::setRequests},
      Field{"gpus", &StoreStatus::gpus, &R::getDevices, &B::initDevices},
      Field{"gpu_backend", &StoreStatus::gpu_backend, &R::getDeviceBackend, &B::setDeviceBackend},
      Field{"spills", &StoreStatus::spills, &R::getSpills, &B::setSpills,
            Metric{"depot_spills_total", MetricType::kCounter,
                   "Objects moved from a full GPU pool to host memory."}},
      Field{"spilled_bytes", &StoreStatus::spilled_bytes, &R::getSpilledBytes, &B::setSpilledBytes,
            Metric{"depot_spilled_bytes_total", MetricType::kCounter,
                   "Bytes moved from full GPU pools to host memory."}},
      Field{"replicas_made", &StoreStatus::replicas_made, &R::getReplicasMade, &B::setReplicasMade,
            Metric{metric::kReplicasTotal, R"(event="made")"}},
      Field{"replicas_dropped", &StoreStatus::replicas_dropped, &R::getReplicasDropped,
            &B::setReplicasDropped, Metric{metric::kReplicasTotal, R"(event="dropped")"}},
      Field{"arena_page_locked_bytes", &StoreStatus::arena_page_locked_bytes,
            &R::getArenaPageLockedBytes, &B::setArenaPageLockedBytes,
            Metric{metric::kPageLockedBytes, R"(tier="host")"}},
      Field{"objects_on_host", &StoreStatus::objects_on_host, &R::getObjectsOnHost,
            &B::setObjectsOnHost, Metric{metric::kTierObjects, R"(tier="host")"}},
      Field{"metadata_bytes", &StoreStatus::metadata_bytes, &R::getMetadataBytes,
            &B::setMetadataBytes},
      Field{"metadata_budget_bytes", &StoreStatus::metadata_budget_bytes,
            &R::getMetadataBudgetBytes, &B::setMetadataBudgetBytes},
      Field{"request_bytes", &StoreStatus::request_bytes, &R::getRequestBytes, &B::setRequestBytes},
      Field{"scheduler", &StoreStatus::scheduler, &R::getScheduler, &B::initScheduler},
      Field{"disk", &StoreStatus::disk, &R::getDisk, &B::initDisk},
      Field{"config_file", &StoreStatus::config_file, &R::getConfigFile, &B::setConfigFile},
      Field{"settings", &StoreStatus::settings, &R::getSettings, &B::initSettings},
  };
};

template <>
struct InfoFields<ClientInfo> {
  static constexpr const char* kName = "ClientInfo";
  using Wire = wire::ClientInfo;
  using R = Wire::Reader;
  using B = Wire::Builder;
  static constexpr std::tuple kFields{
      Field{"session_id", &ClientInfo::session_id, &R::getSessionId, &B::setSessionId},
      Field{"pid", &ClientInfo::pid, &R::getPid, &B::setPid},
      Field{"uid", &ClientInfo::uid, &R::getUid, &B::setUid},
      Field{"command", &ClientInfo::command, &R::getCommand, &B::setCommand},
      Field{"client_name", &ClientInfo::client_name, &R::getClientName, &B::setClientName},
      Field{"objects_held", &ClientInfo::objects_held, &R::getObjectsHeld, &B::setObjectsHeld},
      Field{"references", &ClientInfo::references, &R::getReferences, &B::setReferences},
      Field{"bytes_held", &ClientInfo::bytes_held, &R::getBytesHeld, &B::setBytesHeld},
      Field{"requests", &ClientInfo::requests, &R::getRequests, &B::setRequests},
      Field{"connected_time_ns", &ClientInfo::connected_time_ns, &R::getConnectedTimeNs,
            &B::setConnectedTimeNs},
  };
};

template <>
struct InfoFields<TierReferences> {
  static constexpr const char* kName = "TierReferences";
  using Wire = wire::TierReferences;
  using R = Wire::Reader;
  using B = Wire::Builder;
  static constexpr std::tuple kFields{
      Field{"device", &TierReferences::device, &R::getDevice, &B::setDevice},
      Field{"references", &TierReferences::references, &R::getReferences, &B::setReferences},
  };
};

template <>
struct InfoFields<Holder> {
  static constexpr const char* kName = "Holder";
  using Wire = wire::Holder;
  using R = Wire::Reader;
  using B = Wire::Builder;
  static constexpr std::tuple kFields{
      Field{"session_id", &Holder::session_id, &R::getSessionId, &B::setSessionId},
      Field{"pid", &Holder::pid, &R::getPid, &B::setPid},
      Field{"uid", &Holder::uid, &R::getUid, &B::setUid},
      Field{"command", &Holder::command, &R::getCommand, &B::setCommand},
      Field{"client_name", &Holder::client_name, &R::getClientName, &B::setClientName},
      Field{"references", &Holder::references, &R::getReferences, &B::setReferences},
      Field{"tiers", &Holder::tiers, &R::getTiers, &B::initTiers},
  };
};

template <>
struct InfoFields<Replica> {
  static constexpr const char* kName = "Replica";
  using Wire = wire::Replica;
  using R = Wire::Reader;
  using B = Wire::Builder;
  static constexpr std::tuple kFields{
      Field{"device", &Replica::device, &R::getDevice, &B::setDevice},
      Field{"segment", &Replica::segment, &R::getSegment, &B::setSegment},
      Field{"offset", &Replica::offset, &R::getOffset, &B::setOffset},
      Field{"references", &Replica::references, &R::getReferences, &B::setReferences},
      Field{"ready", &Replica::ready, &R::getReady, &B::setReady},
  };
};

template <>
struct InfoFields<ObjectDetails> {
  static constexpr const char* kName = "ObjectDetails";
  using Wire = wire::ObjectDetails;
  using R = Wire::Reader;
  using B = Wire::Builder;
  static constexpr std::tuple kFields{
      Field{"info", &ObjectDetails::info, &R::getInfo, &B::initInfo},
      Field{"holders", &ObjectDetails::holders, &R::getHolders, &B::initHolders},
      Field{"replicas", &ObjectDetails::replicas, &R::getReplicas, &B::initReplicas},
  };
};

template <>
struct InfoFields<VerifyResult> {
  static constexpr const char* kName = "VerifyResult";
  using Wire = wire::VerifyResult;
  using R = Wire::Reader;
  using B = Wire::Builder;
  static constexpr std::tuple kFields{
      Field{"id", &VerifyResult::id, &R::getId, &B::initId},
      Field{"state", &VerifyResult::state, &R::getState, &B::setState},
      Field{"expected", &VerifyResult::expected, &R::getExpected, &B::setExpected},
      Field{"actual", &VerifyResult::actual, &R::getActual, &B::setActual},
  };
};

template <>
struct InfoFields<EvictResult> {
  static constexpr const char* kName = "EvictResult";
  using Wire = wire::EvictResult;
  using R = Wire::Reader;
  using B = Wire::Builder;
  static constexpr std::tuple kFields{
      Field{"objects", &EvictResult::objects, &R::getObjects, &B::setObjects},
      Field{"bytes", &EvictResult::bytes, &R::getBytes, &B::setBytes},
  };
};

template <>
struct InfoFields<WorkerInfo> {
  static constexpr const char* kName = "WorkerInfo";
  using Wire = wire::WorkerInfo;
  using R = Wire::Reader;
  using B = Wire::Builder;
  static constexpr std::tuple kFields{
      Field{"session_id", &WorkerInfo::session_id, &R::getSessionId, &B::setSessionId},
      Field{"name", &WorkerInfo::name, &R::getName, &B::setName},
      Field{"cpus", &WorkerInfo::cpus, &R::getCpus, &B::setCpus},
      Field{"free_cpus", &WorkerInfo::free_cpus, &R::getFreeCpus, &B::setFreeCpus},
      Field{"gpus", &WorkerInfo::gpus, &R::getGpus, &B::initGpus},
      Field{"free_gpu_shares", &WorkerInfo::free_gpu_shares, &R::getFreeGpuShares,
            &B::initFreeGpuShares},
      Field{"resources", &WorkerInfo::resources, &R::getResources, &B::initResources},
      Field{"functions", &WorkerInfo::functions, &R::getFunctions, &B::initFunctions},
      Field{"running", &WorkerInfo::running, &R::getRunning, &B::setRunning},
      Field{"queued", &WorkerInfo::queued, &R::getQueued, &B::setQueued},
      Field{"done", &WorkerInfo::done, &R::getDone, &B::setDone},
      Field{"failed", &WorkerInfo::failed, &R::getFailed, &B::setFailed},
      Field{"draining", &WorkerInfo::draining, &R::getDraining, &B::setDraining},
      Field{"attached_s", &WorkerInfo::attached_s, &R::getAttachedS, &B::setAttachedS},
      Field{"gpu_functions", &WorkerInfo::gpu_functions, &R::getGpuFunctions, &B::initGpuFunctions},
  };
};

template <>
struct InfoFields<TaskInfo> {
  static constexpr const char* kName = "TaskInfo";
  using Wire = wire::TaskInfo;
  using R = Wire::Reader;
  using B = Wire::Builder;
  static constexpr std::tuple kFields{
      Field{"task", &TaskInfo::task, &R::getTask, &B::setTask},
      Field{"function", &TaskInfo::function, &R::getFunction, &B::setFunction},
      Field{"state", &TaskInfo::state, &R::getState, &B::setState},
      Field{"submitter", &TaskInfo::submitter, &R::getSubmitter, &B::setSubmitter},
      Field{"worker", &TaskInfo::worker, &R::getWorker, &B::setWorker},
      Field{"device", &TaskInfo::device, &R::getDevice, &B::setDevice},
      Field{"outputs", &TaskInfo::outputs, &R::getOutputs, &B::initOutputs},
      Field{"priority", &TaskInfo::priority, &R::getPriority, &B::setPriority},
      Field{"attempts", &TaskInfo::attempts, &R::getAttempts, &B::setAttempts},
      Field{"inputs_missing", &TaskInfo::inputs_missing, &R::getInputsMissing,
            &B::setInputsMissing},
      Field{"local_bytes", &TaskInfo::local_bytes, &R::getLocalBytes, &B::setLocalBytes},
      Field{"moved_bytes", &TaskInfo::moved_bytes, &R::getMovedBytes, &B::setMovedBytes},
      Field{"wait_s", &TaskInfo::wait_s, &R::getWaitS, &B::setWaitS},
      Field{"transfer_s", &TaskInfo::transfer_s, &R::getTransferS, &B::setTransferS},
      Field{"duration_s", &TaskInfo::duration_s, &R::getDurationS, &B::setDurationS},
      Field{"reason", &TaskInfo::reason, &R::getReason, &B::setReason},
      Field{"variant", &TaskInfo::variant, &R::getVariant, &B::setVariant},
      Field{"variant_reason", &TaskInfo::variant_reason, &R::getVariantReason,
            &B::setVariantReason},
      Field{"label", &TaskInfo::label, &R::getLabel, &B::setLabel},
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

template <typename V>
inline constexpr bool kIsVector = false;
template <typename V>
inline constexpr bool kIsVector<std::vector<V>> = true;

template <Info T>
inline constexpr size_t kFieldCount = std::tuple_size_v<decltype(InfoFields<T>::kFields)>;

// Whether any field of T, or of a struct in it, is exported as a metric.
template <Info T>
consteval bool HasMetrics();

namespace detail {
template <typename V>
consteval bool HasMetricsIn() {
  if constexpr (Info<V>) {
    return HasMetrics<V>();
  } else if constexpr (requires { typename V::value_type; }) {
    if constexpr (Info<typename V::value_type>) return HasMetrics<typename V::value_type>();
  }
  return false;
}
}  // namespace detail

template <Info T>
consteval bool HasMetrics() {
  return std::apply(
      [](const auto&... field) {
        return ((field.metric.exported() ||
                 detail::HasMetricsIn<typename std::decay_t<decltype(field)>::Value>()) ||
                ...);
      },
      InfoFields<T>::kFields);
}

// Calls `f(metric, labels, value)` for each field of `record` that the daemon's metrics
// export (a number), in table order, and so on into the structs and lists of structs in it:
// `labels` are the field's own, after those of the list element it is in (tier="gpu0"). How
// the daemon writes its metrics, and how a test finds every one of them.
template <Info T, typename F>
void ForEachMetric(const T& record, F&& f, const std::string& outer_labels = {}) {
  if constexpr (requires { InfoFields<T>::kMetricsWhen; }) {
    if (!(record.*InfoFields<T>::kMetricsWhen)) return;
  }
  ForEachField<T>([&](const auto& field) {
    using V = typename std::decay_t<decltype(field)>::Value;
    const V& value = record.*field.member;
    if constexpr (std::is_arithmetic_v<V>) {
      if (!field.metric.exported()) return;
      std::string labels = outer_labels;
      if (*field.metric.labels != '\0') {
        labels += (labels.empty() ? "" : ",") + std::string(field.metric.labels);
      }
      f(field.metric, labels, value);
    } else if constexpr (Info<V>) {
      if constexpr (HasMetrics<V>()) ForEachMetric(value, f, outer_labels);
    } else if constexpr (kIsVector<V>) {
      using E = typename V::value_type;
      if constexpr (Info<E>) {
        if constexpr (HasMetrics<E>()) {
          // Each element's samples need a label of their own to tell them apart.
          for (size_t i = 0; i < value.size(); ++i) {
            ForEachMetric(value[i], f,
                          (outer_labels.empty() ? "" : outer_labels + ",") +
                              InfoFields<E>::kMetricLabel + "=\"" +
                              InfoFields<E>::kMetricLabelPrefix + std::to_string(i) + "\"");
          }
        }
      }
    }
  });
}

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

// Whether every field of T that has a metric is a number (a metric's value).
template <Info T>
consteval bool OnlyNumbersExported() {
  return std::apply(
      [](const auto&... field) {
        return ((!field.metric.exported() ||
                 std::is_arithmetic_v<typename std::decay_t<decltype(field)>::Value>)&&...);
      },
      InfoFields<T>::kFields);
}
}  // namespace detail

#define DEPOT_CHECK_INFO_FIELDS(T)                                  \
  static_assert(detail::MemberCount<T>() == kFieldCount<T>,         \
                "a member of " #T " is missing from InfoFields<" #T \
                "> (or the table has one too many)");               \
  static_assert(detail::OnlyNumbersExported<T>(),                   \
                "a field of InfoFields<" #T "> with a metric is not a number")
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

// Conversions from the structs' members to the wire's values, the other way.

template <typename V>
requires std::is_arithmetic_v<V> V WireValue(V value) { return value; }

inline capnp::Text::Reader WireValue(const std::string& text) {
  return capnp::Text::Reader(text.c_str(), text.size());
}

inline capnp::Data::Reader WireValue(const std::array<uint8_t, 16>& uuid) {
  return capnp::Data::Reader(uuid.data(), uuid.size());
}

inline wire::ObjectState WireValue(ObjectState state) {
  return state == ObjectState::kCreating ? wire::ObjectState::CREATING : wire::ObjectState::SEALED;
}

inline wire::VerifyState WireValue(VerifyState state) {
  switch (state) {
    case VerifyState::kOk:
      return wire::VerifyState::OK;
    case VerifyState::kMismatch:
      return wire::VerifyState::MISMATCH;
    case VerifyState::kNoChecksum:
      return wire::VerifyState::NO_CHECKSUM;
    case VerifyState::kNotSealed:
      return wire::VerifyState::NOT_SEALED;
    case VerifyState::kNotOnHost:
      return wire::VerifyState::NOT_ON_HOST;
    case VerifyState::kNotFound:
      break;
  }
  return wire::VerifyState::NOT_FOUND;
}

inline wire::TaskState WireValue(TaskState state) {
  return static_cast<wire::TaskState>(static_cast<uint16_t>(state));
}

template <Info T>
void ToWire(const T& in, typename InfoFields<T>::Wire::Builder out);

// One element of a list: a struct or an id into its builder, a value set in place.
template <typename ListBuilder, typename V>
void WriteElement(ListBuilder list, unsigned i, const V& value) {
  if constexpr (Info<V>) {
    ToWire(value, list[i]);
  } else if constexpr (std::is_same_v<V, ObjectId>) {
    ipc::ToWire(value, list[i]);
  } else {
    list.set(i, WireValue(value));
  }
}

// One member into its wire field, through the field's setter (or init).
template <typename Builder, typename Setter, typename V>
void WriteWire(Builder out, Setter setter, const V& value) {
  if constexpr (Info<V>) {
    ToWire(value, (out.*setter)());
  } else if constexpr (std::is_same_v<V, ObjectId>) {
    ipc::ToWire(value, (out.*setter)());
  } else if constexpr (kIsVector<V>) {
    auto list = (out.*setter)(static_cast<unsigned>(value.size()));
    for (unsigned i = 0; i < value.size(); ++i) WriteElement(list, i, value[i]);
  } else if constexpr (std::is_same_v<V, std::map<std::string, double>>) {
    // Custom resources: a map here, a list of (name, amount) on the wire.
    auto list = (out.*setter)(static_cast<unsigned>(value.size()));
    unsigned i = 0;
    for (const auto& [name, amount] : value) {
      list[i].setName(name);
      list[i++].setAmount(amount);
    }
  } else {
    (out.*setter)(WireValue(value));
  }
}

// A struct into its wire form, every field of its table that is on the wire: how the daemon
// writes a reply.
template <Info T>
void ToWire(const T& in, typename InfoFields<T>::Wire::Builder out) {
  ForEachField<T>([&](const auto& field) {
    if constexpr (std::decay_t<decltype(field)>::kOnWire) {
      WriteWire(out, field.setter, in.*field.member);
    }
  });
}

}  // namespace depot::internal
