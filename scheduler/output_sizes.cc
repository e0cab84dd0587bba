#include "scheduler/output_sizes.h"

#include <algorithm>

namespace depot::scheduler {

uint64_t OutputSizes::Expected(SessionId submitter, const TaskSpec& spec) const {
  if (spec.output_bytes > 0 || spec.kind.empty()) return spec.output_bytes;
  auto kinds = by_submitter_.find(submitter);
  if (kinds == by_submitter_.end()) return 0;
  auto it = kinds->second.most.find(spec.kind);
  return it == kinds->second.most.end() ? 0 : it->second.bytes;
}

void OutputSizes::Record(SessionId submitter, const std::string& kind, uint64_t bytes) {
  if (kind.empty()) return;
  bytes = std::max<uint64_t>(bytes, 1);  // learned: 0 means nothing is
  Kinds& kinds = by_submitter_[submitter];
  auto it = kinds.most.find(kind);
  if (it == kinds.most.end()) {
    if (kinds.most.size() == kMaxKinds) {
      kinds.most.erase(kinds.order.front());
      kinds.order.pop_front();
    }
    kinds.order.push_back(kind);
    kinds.most.emplace(kind, Kinds::Learned{bytes, std::prev(kinds.order.end())});
    return;
  }
  it->second.bytes = std::max(it->second.bytes, bytes);
  kinds.order.splice(kinds.order.end(), kinds.order, it->second.at);
}

}  // namespace depot::scheduler
