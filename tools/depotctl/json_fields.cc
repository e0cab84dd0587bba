#include "json_fields.h"

namespace depot::ctl {

const char* VerifyStateName(VerifyState state) {
  switch (state) {
    case VerifyState::kOk:
      return "ok";
    case VerifyState::kMismatch:
      return "mismatch";
    case VerifyState::kNoChecksum:
      return "no_checksum";
    case VerifyState::kNotFound:
      return "not_found";
    case VerifyState::kNotSealed:
      return "not_sealed";
    case VerifyState::kNotOnHost:
      return "not_on_host";
  }
  return "unknown";
}

std::string JsonValue(const std::map<std::string, double>& resources) {
  JsonObject json;
  for (const auto& [name, amount] : resources) json.Real(name, amount);
  return json.str();
}

}  // namespace depot::ctl
