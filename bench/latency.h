// Latencies: the time of each single operation, for the median and tail that Google
// Benchmark's per-run mean hides (one slow wake-up can move a mean of microseconds).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

namespace depot::bench {

class Latencies {
 public:
  using Clock = std::chrono::steady_clock;

  // Starts timing; each Lap() then records the time since the previous Lap (or Start), so a
  // loop pays one clock read per operation.
  void Start() { last_ = Clock::now(); }
  void Lap() {
    const auto now = Clock::now();
    ns_.push_back(static_cast<double>((now - last_).count()));
    last_ = now;
  }
  void Reserve(size_t n) { ns_.reserve(ns_.size() + n); }
  void Add(double ns) { ns_.push_back(ns); }
  void Append(const Latencies& other) { ns_.insert(ns_.end(), other.ns_.begin(), other.ns_.end()); }

  // Files the latencies of one run of a benchmark. Google Benchmark first runs a benchmark
  // with growing iteration counts to find how many fill its minimum time, then repeats it
  // with that count: a run longer than the previous one replaces all filed so far.
  void AddRun(const Latencies& run) {
    if (run.count() > last_run_) ns_.clear();
    Append(run);
    last_run_ = run.count();
  }

  size_t count() const { return ns_.size(); }
  // The q-quantile (0.5: median) in nanoseconds; 0 when empty.
  double Quantile(double q) const {
    if (ns_.empty()) return 0;
    std::vector<double> sorted = ns_;
    const size_t k = std::min(sorted.size() - 1, static_cast<size_t>(q * sorted.size()));
    std::nth_element(sorted.begin(), sorted.begin() + static_cast<std::ptrdiff_t>(k), sorted.end());
    return sorted[k];
  }
  double Median() const { return Quantile(0.5); }
  double Mean() const {
    double sum = 0;
    for (double ns : ns_) sum += ns;
    return ns_.empty() ? 0 : sum / static_cast<double>(ns_.size());
  }

 private:
  std::vector<double> ns_;
  Clock::time_point last_;
  size_t last_run_ = 0;
};

}  // namespace depot::bench
