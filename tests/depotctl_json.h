// What depotctl_test and task_test check of depotctl's JSON: that it comes from the info
// structs' field tables (tools/depotctl/json_fields.h), every field with the value the client
// reads.
#pragma once

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <type_traits>

#include "info_fields.h"
#include "json_fields.h"

namespace depot::testing {

// Whether depotctl's JSON `json` has every field of T's table that is on the wire, as its
// table names it, with the value of `read` (a record the client read around depotctl's run;
// `again`, the same read after it). Not compared: values that changed between the two reads,
// and `shown_apart`, fields depotctl shows differently (commands.cc says how). Nested records
// and lists of records are looked for field by field. `folded`: fields depotctl shows within
// another one (a worker's free_gpu_shares, in its gpus), not looked for at all.
template <internal::Info T>
void ExpectJsonHasEveryField(const std::string& json, const T& read, const T& again,
                             const std::set<std::string>& shown_apart,
                             const std::set<std::string>& folded = {}) {
  internal::ForEachField<T>([&](const auto& f) {
    if constexpr (std::decay_t<decltype(f)>::kOnWire) {
      using V = typename std::decay_t<decltype(f)>::Value;
      if (folded.count(f.name)) return;
      const std::string key = ctl::JsonString(f.name) + ": ";
      EXPECT_NE(json.find(key), std::string::npos) << "no " << key << "in " << json;
      if (shown_apart.count(f.name)) return;
      if constexpr (internal::Info<V>) {
        ExpectJsonHasEveryField(json, read.*f.member, again.*f.member, shown_apart, folded);
      } else if constexpr (requires { internal::InfoFields<typename V::value_type>::kName; }) {
        const V& list = read.*f.member;
        if (list.size() != (again.*f.member).size()) return;
        for (size_t i = 0; i < list.size(); ++i) {
          ExpectJsonHasEveryField(json, list[i], (again.*f.member)[i], shown_apart, folded);
        }
      } else {
        const std::string value = ctl::JsonValue(read.*f.member);
        if (value != ctl::JsonValue(again.*f.member)) return;
        EXPECT_NE(json.find(key + value), std::string::npos) << key << value << " not in " << json;
      }
    }
  });
}

}  // namespace depot::testing
