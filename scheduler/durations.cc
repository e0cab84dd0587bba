#include "scheduler/durations.h"

#include <algorithm>
#include <bit>
#include <cstdlib>

namespace depot::scheduler {

int DurationModel::SizeClass(uint64_t bytes) { return std::bit_width(bytes) / 2; }

DurationModel::Estimate DurationModel::Estimated(const std::map<int, Size>& sizes, bool on_gpu,
                                                 uint64_t bytes) {
  const int wanted = SizeClass(bytes);
  const Variant* nearest = nullptr;
  int distance = 0;
  for (const auto& [size, entry] : sizes) {
    const Variant& v = entry.of(on_gpu);
    if (v.seconds < 0) continue;
    const int d = std::abs(size - wanted);
    if (nearest == nullptr || d < distance) {
      nearest = &v;
      distance = d;
    }
  }
  if (nearest == nullptr) return {};
  if (distance == 0) return {.seconds = nearest->seconds, .measured = true};
  // Larger inputs take longer in proportion; smaller ones are taken to cost what the
  // nearest did (fixed costs, such as a GPU kernel's launch, dominate small inputs).
  const double scale =
      nearest->bytes > 0 ? std::max(1.0, static_cast<double>(bytes) / nearest->bytes) : 1.0;
  return {.seconds = nearest->seconds * scale, .measured = false};
}

DurationModel::Estimates DurationModel::Expected(std::string_view function,
                                                 uint64_t input_bytes) const {
  auto it = functions_.find(function);
  if (it == functions_.end()) return {};
  return {.cpu = Estimated(it->second, false, input_bytes),
          .gpu = Estimated(it->second, true, input_bytes)};
}

DurationModel::Size& DurationModel::At(std::string_view function, uint64_t bytes) {
  auto it = functions_.find(function);
  if (it == functions_.end())
    it = functions_.emplace(std::string(function), std::map<int, Size>{}).first;
  return it->second[SizeClass(bytes)];
}

void DurationModel::Record(std::string_view function, bool on_gpu, uint64_t input_bytes,
                           double seconds) {
  seconds = std::max(0.0, seconds);
  const double bytes = static_cast<double>(input_bytes);
  Variant& v = At(function, input_bytes).of(on_gpu);
  if (v.seconds < 0) {
    v.seconds = seconds;
    v.bytes = bytes;
  } else {
    v.seconds += kWeight * (seconds - v.seconds);
    v.bytes += kWeight * (bytes - v.bytes);
  }
}

uint32_t DurationModel::PassedOver(std::string_view function, bool on_gpu,
                                   uint64_t input_bytes) const {
  auto it = functions_.find(function);
  if (it == functions_.end()) return 0;
  auto size = it->second.find(SizeClass(input_bytes));
  return size == it->second.end() ? 0 : size->second.of(on_gpu).passed_over;
}

void DurationModel::Forget(std::string_view function) {
  if (auto it = functions_.find(function); it != functions_.end()) functions_.erase(it);
}

void DurationModel::Chose(std::string_view function, bool on_gpu, uint64_t input_bytes) {
  Size& size = At(function, input_bytes);
  size.of(on_gpu).passed_over = 0;
  ++size.of(!on_gpu).passed_over;
}

}  // namespace depot::scheduler
