// How long each function takes: a running estimate per function, kind of device and size of
// input, from the durations workers' tasks took (StarPU's history-based model, its footprint
// the input bytes, in classes a factor of 4 wide).
//
// It also keeps what the choice between a function's two variants (CPU and GPU) needs: which
// variants are measured at a size, and how many placements in a row passed a variant over,
// so that the scheduler tries each variant until it is measured, and now and then after.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
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

  struct Estimate {
    double seconds = kUnmeasured;
    bool measured = false;  // at this size: else from the nearest size measured, or a guess
  };
  struct Estimates {
    Estimate cpu;
    Estimate gpu;
  };

  // The expected seconds of `function` on a CPU and on a GPU for `input_bytes` of input: as
  // measured at sizes of its class (classes a factor of 4 wide); else from the nearest size
  // measured (in proportion to the bytes when they are more); else kUnmeasured.
  Estimates Expected(std::string_view function, uint64_t input_bytes) const;
  Durations ExpectedDurations(std::string_view function, uint64_t input_bytes) const {
    const Estimates e = Expected(function, input_bytes);
    return {.cpu = e.cpu.seconds, .gpu = e.gpu.seconds};
  }
  // A run of `function` on `input_bytes` took `seconds` (on a GPU when `on_gpu`).
  void Record(std::string_view function, bool on_gpu, uint64_t input_bytes, double seconds);

  // Placements of `function` at about `input_bytes` that went to the other variant since the
  // variant `on_gpu` was last chosen there.
  uint32_t PassedOver(std::string_view function, bool on_gpu, uint64_t input_bytes) const;
  // A placement of `function` at about `input_bytes` chose the variant `on_gpu`.
  void Chose(std::string_view function, bool on_gpu, uint64_t input_bytes);
  // Forgets what it knows of `function` (no worker runs it any more).
  void Forget(std::string_view function);

 private:
  // Each new duration weighs this much against the history.
  static constexpr double kWeight = 0.2;

  struct Variant {
    double seconds = -1;  // negative: not measured yet
    double bytes = 0;     // the mean input bytes of the runs measured
    uint32_t passed_over = 0;
  };
  struct Size {
    Variant cpu;
    Variant gpu;
    Variant& of(bool on_gpu) { return on_gpu ? gpu : cpu; }
    const Variant& of(bool on_gpu) const { return on_gpu ? gpu : cpu; }
  };
  // Sizes whose bit widths halve to the same number share a class (a factor of 4 wide).
  static int SizeClass(uint64_t bytes);
  static Estimate Estimated(const std::map<int, Size>& sizes, bool on_gpu, uint64_t bytes);
  Size& At(std::string_view function, uint64_t bytes);

  struct NameHash {
    using is_transparent = void;
    size_t operator()(std::string_view name) const { return std::hash<std::string_view>{}(name); }
  };
  std::unordered_map<std::string, std::map<int, Size>, NameHash, std::equal_to<>> functions_;
};

}  // namespace depot::scheduler
