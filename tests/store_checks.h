// Checks of the daemon's own bookkeeping that a test fixture runs when its test ends.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>

#include "depot/client.h"

namespace depot::testing {

// The daemon counts objects with a host copy as copies come and go (status, metrics); the
// count must match its object list, whatever the test created, copied, evicted or deleted.
// Copies still being made may differ for a moment: retried for up to 2 s.
inline void ExpectObjectsOnHostMatchTheList(Client& client) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  uint64_t listed = 0;
  uint64_t counted = 0;
  do {
    auto objects = client.List();
    auto status = client.GetStatus();
    ASSERT_TRUE(objects.ok()) << objects.status().ToString();
    ASSERT_TRUE(status.ok()) << status.status().ToString();
    listed = static_cast<uint64_t>(std::count_if(objects->begin(), objects->end(),
                                                 [](const ObjectInfo& o) { return o.on_host; }));
    counted = status->objects_on_host;
  } while (listed != counted && std::chrono::steady_clock::now() < deadline);
  EXPECT_EQ(counted, listed) << "objects on host: the status count and the object list disagree";
}

}  // namespace depot::testing
