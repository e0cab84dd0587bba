#include "depot/status.h"

#include <cstring>

namespace depot {

std::string_view StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "OK";
    case StatusCode::kInvalidArgument:
      return "InvalidArgument";
    case StatusCode::kNotFound:
      return "NotFound";
    case StatusCode::kAlreadyExists:
      return "AlreadyExists";
    case StatusCode::kNotSealed:
      return "NotSealed";
    case StatusCode::kAlreadySealed:
      return "AlreadySealed";
    case StatusCode::kNotHeld:
      return "NotHeld";
    case StatusCode::kOutOfMemory:
      return "OutOfMemory";
    case StatusCode::kTimeout:
      return "Timeout";
    case StatusCode::kLimitExceeded:
      return "LimitExceeded";
    case StatusCode::kProtocolMismatch:
      return "ProtocolMismatch";
    case StatusCode::kConnectionFailed:
      return "ConnectionFailed";
    case StatusCode::kDisconnected:
      return "Disconnected";
    case StatusCode::kIoError:
      return "IoError";
    case StatusCode::kInternal:
      return "Internal";
    case StatusCode::kPermissionDenied:
      return "PermissionDenied";
    case StatusCode::kTaskFailed:
      return "TaskFailed";
  }
  return "Unknown";
}

Status::Status(StatusCode code, std::string message) {
  if (code != StatusCode::kOk) state_ = std::make_unique<State>(State{code, std::move(message)});
}

Status::Status(const Status& other)
    : state_(other.state_ ? std::make_unique<State>(*other.state_) : nullptr) {}

Status& Status::operator=(const Status& other) {
  if (this != &other) state_ = other.state_ ? std::make_unique<State>(*other.state_) : nullptr;
  return *this;
}

Status Status::FromErrno(std::string_view what, int err) {
  return IoError(std::string(what) + ": " + std::strerror(err));
}

const std::string& Status::message() const {
  static const std::string kEmpty;
  return state_ ? state_->message : kEmpty;
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  return std::string(StatusCodeName(code())) + ": " + state_->message;
}

}  // namespace depot
