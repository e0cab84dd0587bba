// How long each function takes: a running estimate per function and kind of device, from the
// durations workers' tasks took (StarPU's history-based model, without the input-size
// footprint: tasks of one function are taken to be alike).
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>

#include "scheduler/placement.h"

namespace depot::scheduler {

class DurationModel {
 public:
  // Until a function has run on a kind of device, it is taken to last this long there: long
  // enough that waiting behind a task costs more than a small copy, short enough that a large
  // one is still worth waiting for.
  static constexpr double kUnmeasured = 1e-3;

  // The expected seconds of `function` on a CPU and on a GPU.
  Durations Expected(std::string_view function) const;
  // A run of `function` took `seconds` (on a GPU when `on_gpu`).
  void Record(std::string_view function, bool on_gpu, double seconds);

 private:
  struct Estimate {
    double cpu = -1;  // negative: not measured yet
    double gpu = -1;
  };
  // Each new duration weighs this much against the history.
  static constexpr double kWeight = 0.2;
  struct NameHash {
    using is_transparent = void;
    size_t operator()(std::string_view name) const { return std::hash<std::string_view>{}(name); }
  };
  std::unordered_map<std::string, Estimate, NameHash, std::equal_to<>> estimates_;
};

}  // namespace depot::scheduler
