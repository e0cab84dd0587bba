#pragma once

namespace depot::store {
inline constexpr const char* kDepotVersion = DEPOT_VERSION;
}  // namespace depot::store
