// The daemon's request counters and latency histograms, and the Prometheus text exposition
// of them together with the store's own counters and gauges: those that are status fields
// come from the status reply through its field table (info_fields.h), the rest from the
// store (StoreCounters) and the scheduler.
//
// Everything is updated on the loop thread only, so the hot path pays plain increments and,
// for latencies, two clock reads per request (about 40 ns) — and nothing when metrics are
// off (--no-metrics). Rendering happens on request (`depotctl metrics`, GET /metrics).
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "depot/client.h"
#include "depot/status.h"
#include "scheduler/scheduler.h"

namespace depot::store {

class ObjectStore;

// The request types, as the metrics name them.
enum class RequestType : uint8_t {
  kHello,
  kCreate,
  kPut,
  kSeal,
  kAbort,
  kGet,
  kRelease,
  kDelete,
  kContains,
  kList,
  kStatus,
  kMetrics,
  kClients,
  kObjectInfo,
  kVerify,
  kEvict,
  kPrefetch,
  kLocate,
  kRegisterWorker,
  kSubmit,
  kComplete,
  kCancel,
  kDrainWorker,
  kWorkers,
  kTasks,
  kHandoff,
  kWait,
  kCancelWait,
  kDeleteAfterTasks,
  kCount
};

class Metrics {
 public:
  explicit Metrics(bool enabled) : enabled_(enabled) {}

  bool enabled() const { return enabled_; }

  // The time a request of `type` took, from its arrival to its reply.
  void Observe(RequestType type, uint64_t nanos);
  void CountError(StatusCode code);
  // Requests of `type` observed, and errors of `code` counted, since the start.
  uint64_t requests(RequestType type) const { return requests_[static_cast<size_t>(type)]; }
  uint64_t errors(StatusCode code) const { return errors_[static_cast<size_t>(code)]; }
  void SessionOpened() { ++sessions_opened_; }
  void SessionClosed(bool protocol_error) {
    ++sessions_closed_;
    if (protocol_error) ++sessions_failed_;
  }

  // All counters, histograms and the store's gauges in the Prometheus text format (0.0.4):
  // the fields of `status` (the status reply, StatusOf) that their table gives a metric
  // (info_fields.h), and the counters that are not status fields, of this object, `store`
  // and the scheduler's `tasks`.
  std::string Render(const StoreStatus& status, const ObjectStore& store,
                     const scheduler::SchedulerCounters& tasks) const;

  // Latency buckets: powers of two from 1 µs to about 8.4 s.
  static constexpr int kBuckets = 24;

 private:
  struct Histogram {
    std::array<uint64_t, kBuckets> buckets{};  // counts per bucket (not cumulative)
    uint64_t count = 0;
    uint64_t sum_ns = 0;
  };

  const bool enabled_;
  std::array<uint64_t, static_cast<size_t>(RequestType::kCount)> requests_{};
  std::array<Histogram, static_cast<size_t>(RequestType::kCount)> latency_{};
  std::array<uint64_t, static_cast<size_t>(kLastStatusCode) + 1> errors_{};  // by StatusCode
  uint64_t sessions_opened_ = 0;
  uint64_t sessions_closed_ = 0;
  uint64_t sessions_failed_ = 0;
};

}  // namespace depot::store
