#include "store/metrics.h"

#include <bit>
#include <cinttypes>
#include <cstdio>

#include "store/object_store.h"

namespace depot::store {

namespace {

constexpr const char* kTypeNames[] = {
    "hello",  "create",       "put",      "seal",   "abort",           "get",     "release",
    "delete", "contains",     "list",     "status", "metrics",         "clients", "object_info",
    "verify", "evict",        "prefetch", "locate", "register_worker", "submit",  "complete",
    "cancel", "drain_worker", "workers",  "tasks",  "handoff",         "wait",    "cancel_wait",
    "delete_after_tasks"};
static_assert(std::size(kTypeNames) == static_cast<size_t>(RequestType::kCount));

// Upper bound of bucket i, in seconds: 2^i microseconds.
double BucketBound(int i) { return static_cast<double>(uint64_t{1} << i) * 1e-6; }

class Writer {
 public:
  void Help(const char* name, const char* type, const char* help) {
    Line("# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
  }
  template <typename... Args>
  void Line(const char* format, Args... args) {
    char buf[512];
    const int n = std::snprintf(buf, sizeof(buf), format, args...);
    if (n > 0) out_.append(buf, static_cast<size_t>(std::min<int>(n, sizeof(buf) - 1)));
  }
  void Value(const char* name, uint64_t v) { Line("%s %" PRIu64 "\n", name, v); }
  std::string Take() { return std::move(out_); }

 private:
  std::string out_;
};

}  // namespace

void Metrics::Observe(RequestType type, uint64_t nanos) {
  if (!enabled_) return;
  const auto t = static_cast<size_t>(type);
  ++requests_[t];
  Histogram& h = latency_[t];
  const uint64_t micros = nanos / 1000;
  // Bucket i holds (2^(i-1), 2^i] µs; bucket 0 everything up to 1 µs.
  const int bucket = micros <= 1 ? 0 : std::min<int>(kBuckets - 1, std::bit_width(micros - 1));
  ++h.buckets[static_cast<size_t>(bucket)];
  ++h.count;
  h.sum_ns += nanos;
}

void Metrics::CountError(StatusCode code) {
  const auto c = static_cast<size_t>(code);
  if (enabled_ && c < errors_.size()) ++errors_[c];
}

std::string Metrics::Render(const ObjectStore& store, uint32_t clients, uint64_t uptime_ns,
                            const scheduler::SchedulerCounters& tasks) const {
  Writer w;
  const Arena& arena = store.arena();
  const StoreCounters& c = store.counters();

  w.Help("depot_up", "gauge", "1 while the daemon serves requests.");
  w.Value("depot_up", 1);
  w.Help("depot_uptime_seconds", "gauge", "Seconds since the daemon started.");
  w.Line("depot_uptime_seconds %.3f\n", static_cast<double>(uptime_ns) / 1e9);
  w.Help("depot_metrics_enabled", "gauge",
         "0 when started with --no-metrics: request counters stay 0.");
  w.Value("depot_metrics_enabled", enabled_ ? 1 : 0);

  // Memory by tier: the host arena, then each GPU's pool (tier="gpuK", K as in `status`).
  const auto pools = store.pools();
  const auto each_gpu = [&](const char* name, auto value) {
    for (uint32_t d = 0; d < pools.size(); ++d) {
      w.Line("%s{tier=\"gpu%u\"} %" PRIu64 "\n", name, d, static_cast<uint64_t>(value(d)));
    }
  };
  w.Help("depot_capacity_bytes", "gauge",
         "What a tier may take: the host arena (--memory), a GPU pool's limit (--gpu-memory).");
  w.Line("depot_capacity_bytes{tier=\"host\"} %" PRIu64 "\n", arena.capacity());
  each_gpu("depot_capacity_bytes", [&](uint32_t d) { return pools[d]->limit(); });
  w.Help("depot_mapped_bytes", "gauge",
         "Bytes in arena segments, or GPU pool chunks, created so far.");
  w.Line("depot_mapped_bytes{tier=\"host\"} %" PRIu64 "\n", arena.mapped_bytes());
  each_gpu("depot_mapped_bytes", [&](uint32_t d) { return pools[d]->reserved_bytes(); });
  w.Help("depot_used_bytes", "gauge", "Bytes allocated to objects.");
  w.Line("depot_used_bytes{tier=\"host\"} %" PRIu64 "\n", arena.used_bytes());
  each_gpu("depot_used_bytes", [&](uint32_t d) { return pools[d]->used_bytes(); });
  w.Help("depot_held_bytes", "gauge",
         "Bytes of objects referenced or being created (not evictable, not spillable).");
  w.Line("depot_held_bytes{tier=\"host\"} %" PRIu64 "\n", c.held_bytes);
  each_gpu("depot_held_bytes", [&](uint32_t d) { return store.device_usage(d).held_bytes; });
  w.Help("depot_pinned_bytes", "gauge", "Bytes of pinned objects.");
  w.Line("depot_pinned_bytes{tier=\"host\"} %" PRIu64 "\n", c.pinned_bytes);
  w.Help("depot_page_locked_bytes", "gauge",
         "Host arena bytes page-locked (registered with the CUDA driver) for GPU copies.");
  w.Line("depot_page_locked_bytes{tier=\"host\"} %" PRIu64 "\n", arena.page_locked_bytes());
  // Not depot_replicas: Prometheus parsers name the family of depot_replicas_total so.
  w.Help("depot_tier_objects", "gauge",
         "Objects with a copy on each tier, copies being made included.");
  w.Line("depot_tier_objects{tier=\"host\"} %" PRIu64 "\n", store.ObjectsOnHost());
  each_gpu("depot_tier_objects", [&](uint32_t d) { return store.device_usage(d).replicas; });
  w.Help("depot_objects", "gauge", "Objects in the store, by state.");
  w.Line("depot_objects{state=\"sealed\"} %" PRIu64 "\n", c.objects_sealed);
  w.Line("depot_objects{state=\"creating\"} %" PRIu64 "\n", c.objects_creating);
  w.Help("depot_clients", "gauge", "Connected client sessions.");
  w.Value("depot_clients", clients);

  w.Help("depot_evictions_total", "counter", "Objects evicted under memory pressure.");
  w.Value("depot_evictions_total", c.evictions);
  w.Help("depot_evicted_bytes_total", "counter", "Bytes evicted under memory pressure.");
  w.Value("depot_evicted_bytes_total", c.evicted_bytes);
  w.Help("depot_bytes_in_total", "counter",
         "Bytes of objects created, by tier (on GPUs: data only; metadata stays on host).");
  w.Line("depot_bytes_in_total{tier=\"host\"} %" PRIu64 "\n", c.bytes_in);
  each_gpu("depot_bytes_in_total", [&](uint32_t d) { return store.device_usage(d).bytes_in; });
  w.Help("depot_bytes_out_total", "counter", "Bytes of objects handed out by gets, by tier.");
  w.Line("depot_bytes_out_total{tier=\"host\"} %" PRIu64 "\n", c.bytes_out);
  each_gpu("depot_bytes_out_total", [&](uint32_t d) { return store.device_usage(d).bytes_out; });
  w.Help("depot_replicas_total", "counter",
         "Copies between tiers: made for a get on another tier, dropped to make room on a GPU.");
  w.Line("depot_replicas_total{event=\"made\"} %" PRIu64 "\n", c.replicas_made);
  w.Line("depot_replicas_total{event=\"dropped\"} %" PRIu64 "\n", c.replicas_dropped);
  w.Help("depot_spills_total", "counter", "Objects moved from a full GPU pool to host memory.");
  w.Value("depot_spills_total", c.spills);
  w.Help("depot_spilled_bytes_total", "counter", "Bytes moved from full GPU pools to host memory.");
  w.Value("depot_spilled_bytes_total", c.spilled_bytes);
  if (const DiskPool* disk = store.disk()) {
    const TierCounters& t = store.tier_counters();
    w.Help("depot_disk_bytes", "gauge",
           "The spill directory: bytes allocated to objects (used), of its files (files), and "
           "its limit (limit).");
    w.Line("depot_disk_bytes{kind=\"used\"} %" PRIu64 "\n", disk->used_bytes());
    w.Line("depot_disk_bytes{kind=\"files\"} %" PRIu64 "\n", disk->file_bytes());
    w.Line("depot_disk_bytes{kind=\"limit\"} %" PRIu64 "\n", disk->capacity());
    w.Help("depot_disk_objects", "gauge", "Objects with a copy in the spill directory.");
    w.Value("depot_disk_objects", store.ObjectsOnDisk());
    w.Help("depot_disk_objects_total", "counter",
           "Objects spilled to disk, restored from it, dropped from it for good (the spill "
           "limit reached), and spills and restores that failed.");
    w.Line("depot_disk_objects_total{event=\"spilled\"} %" PRIu64 "\n", t.disk_spills);
    w.Line("depot_disk_objects_total{event=\"restored\"} %" PRIu64 "\n", t.disk_restores);
    w.Line("depot_disk_objects_total{event=\"dropped\"} %" PRIu64 "\n", t.disk_drops);
    w.Line("depot_disk_objects_total{event=\"spill_failed\"} %" PRIu64 "\n", t.disk_spill_failures);
    w.Line("depot_disk_objects_total{event=\"restore_failed\"} %" PRIu64 "\n",
           t.disk_restore_failures);
    w.Help("depot_disk_io_bytes_total", "counter", "Bytes written by spills and read by restores.");
    w.Line("depot_disk_io_bytes_total{op=\"write\"} %" PRIu64 "\n", t.disk_spilled_bytes);
    w.Line("depot_disk_io_bytes_total{op=\"read\"} %" PRIu64 "\n", t.disk_restored_bytes);
    w.Help("depot_disk_io_seconds_total", "counter",
           "Seconds during which spill writes (restore reads) were under way (bytes / seconds: "
           "throughput).");
    w.Line("depot_disk_io_seconds_total{op=\"write\"} %.6f\n", t.disk_spill_seconds);
    w.Line("depot_disk_io_seconds_total{op=\"read\"} %.6f\n", t.disk_restore_seconds);
  }
  w.Help("depot_get_objects_total", "counter",
         "Objects asked for by gets: found at once (hit), waited for (wait), never sealed in time "
         "(timeout).");
  w.Line("depot_get_objects_total{result=\"hit\"} %" PRIu64 "\n", c.get_hits);
  w.Line("depot_get_objects_total{result=\"wait\"} %" PRIu64 "\n", c.get_waits);
  w.Line("depot_get_objects_total{result=\"timeout\"} %" PRIu64 "\n", c.get_timeouts);
  const LeaseCounters leases = store.lease_counters();
  w.Help("depot_leased_reads_total", "counter",
         "Objects read through clients' lease tables, with no round trip (also hits above), as "
         "clients report them.");
  w.Value("depot_leased_reads_total", c.leased_reads);
  w.Help("depot_lease_tables", "gauge", "Sessions with a lease table.");
  w.Value("depot_lease_tables", leases.tables);
  w.Help("depot_leased_objects", "gauge",
         "Host copies kept because a lease held them when the daemon last looked.");
  w.Value("depot_leased_objects", leases.leased_objects);
  w.Help("depot_lease_blocked_frees_total", "counter",
         "Frees of host copies put off because a client's lease held them.");
  w.Value("depot_lease_blocked_frees_total", leases.blocked_reclaims);
  w.Help("depot_sessions_total", "counter",
         "Client sessions: opened, closed, and closed for breaking the protocol.");
  w.Line("depot_sessions_total{event=\"opened\"} %" PRIu64 "\n", sessions_opened_);
  w.Line("depot_sessions_total{event=\"closed\"} %" PRIu64 "\n", sessions_closed_);
  w.Line("depot_sessions_total{event=\"protocol_error\"} %" PRIu64 "\n", sessions_failed_);

  w.Help("depot_workers", "gauge", "Workers attached to the scheduler.");
  w.Value("depot_workers", tasks.workers);
  w.Help("depot_tasks_pending", "gauge", "Tasks waiting, ready, queued on a worker or running.");
  w.Value("depot_tasks_pending", tasks.tasks_pending);
  w.Help("depot_tasks_total", "counter",
         "Tasks submitted, and those over: done, failed, cancelled; and runs retried after their "
         "worker died.");
  w.Line("depot_tasks_total{event=\"submitted\"} %" PRIu64 "\n", tasks.submitted);
  w.Line("depot_tasks_total{event=\"done\"} %" PRIu64 "\n", tasks.completed);
  w.Line("depot_tasks_total{event=\"failed\"} %" PRIu64 "\n", tasks.failed);
  w.Line("depot_tasks_total{event=\"cancelled\"} %" PRIu64 "\n", tasks.cancelled);
  w.Line("depot_tasks_total{event=\"retried\"} %" PRIu64 "\n", tasks.retried);
  w.Help("depot_task_input_bytes_total", "counter",
         "Input bytes of placed tasks: already where they run (local), or to be copied there.");
  w.Line("depot_task_input_bytes_total{where=\"local\"} %" PRIu64 "\n", tasks.local_bytes);
  w.Line("depot_task_input_bytes_total{where=\"moved\"} %" PRIu64 "\n", tasks.moved_bytes);
  w.Help("depot_task_prefetches_total", "counter",
         "Inputs copied ahead of a task queued on a worker.");
  w.Value("depot_task_prefetches_total", tasks.prefetches);
  w.Help("depot_placement_duration_seconds", "histogram",
         "Time to place one ready task (choose its worker and device), placed or not.");
  {
    uint64_t cumulative = 0;
    for (int i = 0; i < scheduler::SchedulerCounters::kPlacementBuckets; ++i) {
      cumulative += tasks.placement_ns_buckets[static_cast<size_t>(i)];
      w.Line("depot_placement_duration_seconds_bucket{le=\"%g\"} %" PRIu64 "\n",
             static_cast<double>(uint64_t{64} << i) * 1e-9, cumulative);
    }
    w.Line("depot_placement_duration_seconds_bucket{le=\"+Inf\"} %" PRIu64 "\n",
           tasks.placement_tries);
    w.Line("depot_placement_duration_seconds_sum %.9f\n",
           static_cast<double>(tasks.placement_ns_sum) / 1e9);
    w.Line("depot_placement_duration_seconds_count %" PRIu64 "\n", tasks.placement_tries);
  }

  w.Help("depot_errors_total", "counter", "Requests answered with an error, by error code.");
  for (size_t code = 1; code < errors_.size(); ++code) {
    if (errors_[code] == 0) continue;
    w.Line("depot_errors_total{code=\"%s\"} %" PRIu64 "\n",
           std::string(StatusCodeName(static_cast<StatusCode>(code))).c_str(), errors_[code]);
  }

  w.Help("depot_requests_total", "counter", "Requests handled, by type.");
  for (size_t t = 0; t < requests_.size(); ++t) {
    w.Line("depot_requests_total{type=\"%s\"} %" PRIu64 "\n", kTypeNames[t], requests_[t]);
  }
  w.Help("depot_request_duration_seconds", "histogram",
         "Time from a request's arrival to its reply (gets include their wait).");
  for (size_t t = 0; t < latency_.size(); ++t) {
    const Histogram& h = latency_[t];
    if (h.count == 0) continue;
    uint64_t cumulative = 0;
    for (int i = 0; i < kBuckets; ++i) {
      cumulative += h.buckets[static_cast<size_t>(i)];
      w.Line("depot_request_duration_seconds_bucket{type=\"%s\",le=\"%g\"} %" PRIu64 "\n",
             kTypeNames[t], BucketBound(i), cumulative);
    }
    w.Line("depot_request_duration_seconds_bucket{type=\"%s\",le=\"+Inf\"} %" PRIu64 "\n",
           kTypeNames[t], h.count);
    w.Line("depot_request_duration_seconds_sum{type=\"%s\"} %.9f\n", kTypeNames[t],
           static_cast<double>(h.sum_ns) / 1e9);
    w.Line("depot_request_duration_seconds_count{type=\"%s\"} %" PRIu64 "\n", kTypeNames[t],
           h.count);
  }
  return w.Take();
}

}  // namespace depot::store
