#include "scheduler/durations.h"

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <iterator>

namespace depot::scheduler {

int DurationModel::SizeClass(uint64_t bytes) { return std::bit_width(bytes) / 2; }

DurationModel::Estimate DurationModel::Estimated(const Sizes& sizes, bool on_gpu, uint64_t bytes) {
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

const DurationModel::Sizes* DurationModel::Find(Of of) const {
  auto f = functions_.find(of.function);
  if (f == functions_.end()) return nullptr;
  auto k = f->second.kinds.find(of.kind);
  return k == f->second.kinds.end() ? nullptr : &k->second.sizes;
}

DurationModel::Sizes& DurationModel::Touch(Of of) {
  auto f = functions_.find(of.function);
  if (f == functions_.end()) f = functions_.emplace(std::string(of.function), Function{}).first;
  Function& function = f->second;
  auto k = function.kinds.find(of.kind);
  if (k != function.kinds.end()) {
    function.order.splice(function.order.end(), function.order, k->second.at);
    return k->second.sizes;
  }
  if (function.kinds.size() >= kMaxKinds) {
    function.kinds.erase(function.order.front());
    function.order.pop_front();
  }
  function.order.emplace_back(of.kind);
  Kind& kind = function.kinds[function.order.back()];
  kind.at = std::prev(function.order.end());
  return kind.sizes;
}

DurationModel::Estimates DurationModel::Expected(Of of, uint64_t input_bytes) const {
  const Sizes* sizes = Find(of);
  if (sizes == nullptr) return {};
  return {.cpu = Estimated(*sizes, false, input_bytes),
          .gpu = Estimated(*sizes, true, input_bytes)};
}

void DurationModel::Record(Of of, bool on_gpu, uint64_t input_bytes, double seconds) {
  seconds = std::max(0.0, seconds);
  const double bytes = static_cast<double>(input_bytes);
  Variant& v = Touch(of)[SizeClass(input_bytes)].of(on_gpu);
  if (v.seconds < 0) {
    v.seconds = seconds;
    v.bytes = bytes;
  } else {
    v.seconds += kWeight * (seconds - v.seconds);
    v.bytes += kWeight * (bytes - v.bytes);
  }
}

uint32_t DurationModel::PassedOver(Of of, bool on_gpu, uint64_t input_bytes) const {
  const Sizes* sizes = Find(of);
  if (sizes == nullptr) return 0;
  auto size = sizes->find(SizeClass(input_bytes));
  return size == sizes->end() ? 0 : size->second.of(on_gpu).passed_over;
}

void DurationModel::Forget(std::string_view function) {
  if (auto it = functions_.find(function); it != functions_.end()) functions_.erase(it);
}

size_t DurationModel::kinds(std::string_view function) const {
  auto it = functions_.find(function);
  return it == functions_.end() ? 0 : it->second.kinds.size();
}

void DurationModel::Chose(Of of, bool on_gpu, uint64_t input_bytes) {
  Size& size = Touch(of)[SizeClass(input_bytes)];
  size.of(on_gpu).passed_over = 0;
  ++size.of(!on_gpu).passed_over;
}

}  // namespace depot::scheduler
