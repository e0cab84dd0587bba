// How long each function takes: a running estimate per function, kind of device and size of
// input, from the durations workers' tasks took (StarPU's history-based model, its footprint
// the input bytes, in classes a factor of 4 wide).
//
// It also keeps what the choice between a function's two variants (CPU and GPU) needs: which
// variants are measured at a size, and how many placements in a row passed a variant over,
// so that the scheduler tries each variant until it is measured, and now and then after.
//
// Tasks of one function that do different work are timed apart by their kind (TaskSpec.kind):
// depot.dask runs every Dask task through one function and names each task's layer as its
// kind, so that a layer of sums and a layer of products each get their own estimates. A
// function keeps at most kMaxKinds kinds, the least recently measured going first.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <string>
#include <string_view>
#include <unordered_map>

#include "scheduler/placement.h"
#include "scheduler/task.h"

namespace depot::scheduler {

class DurationModel {
 public:
  // Until a function has run on a kind of device, it is taken to last this long there: long
  // enough that waiting behind a task costs more than a small copy, short enough that a large
  // one is still worth waiting for.
  static constexpr double kUnmeasured = 1e-3;
  static constexpr size_t kMaxKinds = 1024;  // a function's

  // What durations are kept under: a function, and a kind of its tasks (empty: none).
  struct Of {
    Of(std::string_view function, std::string_view kind = {}) : function(function), kind(kind) {}
    explicit Of(const TaskSpec& spec) : function(spec.function), kind(spec.kind) {}
    std::string_view function;
    std::string_view kind;
  };

  struct Estimate {
    double seconds = kUnmeasured;
    bool measured = false;  // at this size: else from the nearest size measured, or a guess
  };
  struct Estimates {
    Estimate cpu;
    Estimate gpu;
  };

  // The expected seconds of tasks `of` on a CPU and on a GPU for `input_bytes` of input: as
  // measured at sizes of its class (classes a factor of 4 wide); else from the nearest size
  // measured (in proportion to the bytes when they are more); else kUnmeasured.
  Estimates Expected(Of of, uint64_t input_bytes) const;
  Durations ExpectedDurations(Of of, uint64_t input_bytes) const {
    const Estimates e = Expected(of, input_bytes);
    return {.cpu = e.cpu.seconds, .gpu = e.gpu.seconds};
  }
  // A run of a task `of` on `input_bytes` took `seconds` (on a GPU when `on_gpu`).
  void Record(Of of, bool on_gpu, uint64_t input_bytes, double seconds);

  // Placements of tasks `of` at about `input_bytes` that went to the other variant since the
  // variant `on_gpu` was last chosen there.
  uint32_t PassedOver(Of of, bool on_gpu, uint64_t input_bytes) const;
  // A placement of a task `of` at about `input_bytes` chose the variant `on_gpu`.
  void Chose(Of of, bool on_gpu, uint64_t input_bytes);
  // Forgets what it knows of `function`, every kind (no worker runs it any more).
  void Forget(std::string_view function);

  // How many kinds of `function` it keeps estimates for.
  size_t kinds(std::string_view function) const;

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
  using Sizes = std::map<int, Size>;
  static Estimate Estimated(const Sizes& sizes, bool on_gpu, uint64_t bytes);
  // The sizes measured of tasks `of`: null if none.
  const Sizes* Find(Of of) const;
  // Those of tasks `of`, made if new, and counted as the function's latest kind.
  Sizes& Touch(Of of);

  struct NameHash {
    using is_transparent = void;
    size_t operator()(std::string_view name) const { return std::hash<std::string_view>{}(name); }
  };
  template <typename T>
  using ByName = std::unordered_map<std::string, T, NameHash, std::equal_to<>>;
  struct Kind {
    Sizes sizes;
    std::list<std::string>::iterator at;  // in Function::order
  };
  struct Function {
    ByName<Kind> kinds;
    std::list<std::string> order;  // least recently measured or chosen first
  };
  ByName<Function> functions_;
};

}  // namespace depot::scheduler
