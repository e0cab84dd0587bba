#include "store/metrics.h"

#include <algorithm>
#include <bit>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <type_traits>
#include <vector>

#include "info_fields.h"

#include "store/object_store.h"

namespace depot::store {

namespace {

constexpr const char* kTypeNames[] = {"hello",
                                      "create",
                                      "put",
                                      "seal",
                                      "abort",
                                      "get",
                                      "release",
                                      "delete",
                                      "contains",
                                      "list",
                                      "status",
                                      "metrics",
                                      "clients",
                                      "object_info",
                                      "verify",
                                      "evict",
                                      "prefetch",
                                      "locate",
                                      "register_worker",
                                      "submit",
                                      "complete",
                                      "cancel",
                                      "drain_worker",
                                      "workers",
                                      "tasks",
                                      "handoff",
                                      "wait",
                                      "cancel_wait",
                                      "delete_after_tasks"};
static_assert(std::size(kTypeNames) == static_cast<size_t>(RequestType::kCount));

// A status field's value as its metric writes it: nanoseconds as seconds to the ms, other
// seconds (doubles) to the µs, counts as integers.
template <typename V>
std::string SampleValue(internal::MetricUnit unit, V value) {
  char buf[64];
  if (unit == internal::MetricUnit::kNanosAsSeconds) {
    std::snprintf(buf, sizeof(buf), "%.3f", static_cast<double>(value) / 1e9);
  } else if constexpr (std::is_floating_point_v<V>) {
    std::snprintf(buf, sizeof(buf), "%.6f", static_cast<double>(value));
  } else {
    std::snprintf(buf, sizeof(buf), "%" PRIu64, static_cast<uint64_t>(value));
  }
  return buf;
}

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
  void Text(const std::string& text) { out_ += text; }
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

std::string Metrics::Render(const StoreStatus& status, const ObjectStore& store,
                            const scheduler::SchedulerCounters& tasks) const {
  Writer w;
  const StoreCounters& c = store.counters();

  w.Help("depot_up", "gauge", "1 while the daemon serves requests.");
  w.Value("depot_up", 1);
  w.Help("depot_metrics_enabled", "gauge",
         "0 when started with --no-metrics: request counters stay 0.");
  w.Value("depot_metrics_enabled", enabled_ ? 1 : 0);

  // The status fields with a metric (info_fields.h), each family's samples together, in the
  // order of their first field.
  struct Family {
    internal::MetricFamily family;
    std::string samples;
  };
  std::vector<Family> families;
  internal::ForEachMetric(
      status, [&](const internal::Metric& metric, const std::string& labels, auto value) {
        auto it = std::find_if(families.begin(), families.end(), [&](const Family& f) {
          return std::strcmp(f.family.name, metric.family.name) == 0;
        });
        if (it == families.end()) it = families.insert(it, Family{metric.family, {}});
        it->samples += metric.family.name;
        if (!labels.empty()) it->samples += "{" + labels + "}";
        it->samples += " " + SampleValue(metric.unit, value) + "\n";
      });
  for (const Family& f : families) {
    w.Help(f.family.name, f.family.type == internal::MetricType::kCounter ? "counter" : "gauge",
           f.family.help);
    w.Text(f.samples);
  }

  // The counters that are not status fields.
  const auto pools = store.pools();
  const auto each_gpu = [&](const char* name, auto value) {
    for (uint32_t d = 0; d < pools.size(); ++d) {
      w.Line("%s{tier=\"gpu%u\"} %" PRIu64 "\n", name, d, static_cast<uint64_t>(value(d)));
    }
  };
  w.Help("depot_bytes_in_total", "counter",
         "Bytes of objects created, by tier (on GPUs: data only; metadata stays on host).");
  w.Line("depot_bytes_in_total{tier=\"host\"} %" PRIu64 "\n", c.bytes_in);
  each_gpu("depot_bytes_in_total", [&](uint32_t d) { return store.device_usage(d).bytes_in; });
  w.Help("depot_bytes_out_total", "counter", "Bytes of objects handed out by gets, by tier.");
  w.Line("depot_bytes_out_total{tier=\"host\"} %" PRIu64 "\n", c.bytes_out);
  each_gpu("depot_bytes_out_total", [&](uint32_t d) { return store.device_usage(d).bytes_out; });
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

  w.Help("depot_task_outputs_waiting_for_room", "gauge",
         "Workers' creates of task outputs waiting for room that other tasks will free.");
  w.Line("depot_task_outputs_waiting_for_room %" PRIu64 "\n", tasks.room_waiting);
  w.Help("depot_task_output_room_waits_total", "counter",
         "Workers' creates of task outputs that waited for room.");
  w.Line("depot_task_output_room_waits_total %" PRIu64 "\n", tasks.room_waits);
  w.Help("depot_task_output_room_waits_failed_total", "counter",
         "Waits for room that failed: every task that ran waited, and nothing was freed.");
  w.Line("depot_task_output_room_waits_failed_total %" PRIu64 "\n", tasks.room_waits_failed);

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
