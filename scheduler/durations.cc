#include "scheduler/durations.h"

#include <algorithm>

namespace depot::scheduler {

Durations DurationModel::Expected(std::string_view function) const {
  auto it = estimates_.find(function);
  if (it == estimates_.end()) return {.cpu = kUnmeasured, .gpu = kUnmeasured};
  const Estimate& e = it->second;
  return {.cpu = e.cpu < 0 ? kUnmeasured : e.cpu, .gpu = e.gpu < 0 ? kUnmeasured : e.gpu};
}

void DurationModel::Record(std::string_view function, bool on_gpu, double seconds) {
  seconds = std::max(0.0, seconds);
  auto it = estimates_.find(function);
  if (it == estimates_.end()) it = estimates_.emplace(std::string(function), Estimate{}).first;
  Estimate& e = it->second;
  double& value = on_gpu ? e.gpu : e.cpu;
  value = value < 0 ? seconds : value + kWeight * (seconds - value);
}

}  // namespace depot::scheduler
