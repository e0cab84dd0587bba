// Errors as values: Status and Result<T>.
//
// Every call in depot's public API that can fail returns a Status (no value) or a
// Result<T> (a value or the Status that explains why there is none). Exceptions never
// cross the API. A Status carries a code a program can branch on and a message a person
// can act on; messages that come from the daemon are passed through unchanged.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace depot {

// The codes are also the wire codes of the protocol: values are stable.
enum class StatusCode : uint8_t {
  kOk = 0,
  kInvalidArgument = 1,    // the request itself is wrong (bad size, bad name, bad flag)
  kNotFound = 2,           // no such object
  kAlreadyExists = 3,      // an object with this id exists already
  kNotSealed = 4,          // the object is still being created
  kAlreadySealed = 5,      // the object was sealed already
  kNotHeld = 6,            // the caller holds no reference to / does not own the object
  kOutOfMemory = 7,        // the store cannot fit the object, even after eviction
  kTimeout = 8,            // the wait ran out
  kLimitExceeded = 9,      // a per-client limit or a message size bound was hit
  kProtocolMismatch = 10,  // client and daemon speak different protocol versions
  kConnectionFailed = 11,  // could not reach the daemon
  kDisconnected = 12,      // the connection broke while a request was in flight
  kIoError = 13,           // a system call failed (the message names it and errno)
  kInternal = 14,          // a bug in depot; the message says where
  kPermissionDenied = 15,  // the caller's uid may not do this (to this object)
  kTaskFailed = 16,        // the object is the output of a task that failed; the message is why
};
inline constexpr StatusCode kLastStatusCode = StatusCode::kTaskFailed;

// Returns the code's name, e.g. "NotFound".
std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  // The OK status. Cheap: no allocation.
  Status() noexcept = default;
  Status(StatusCode code, std::string message);

  Status(const Status& other);
  Status& operator=(const Status& other);
  Status(Status&&) noexcept = default;
  Status& operator=(Status&&) noexcept = default;

  static Status OK() { return Status(); }
  static Status InvalidArgument(std::string msg) {
    return {StatusCode::kInvalidArgument, std::move(msg)};
  }
  static Status NotFound(std::string msg) { return {StatusCode::kNotFound, std::move(msg)}; }
  static Status AlreadyExists(std::string msg) {
    return {StatusCode::kAlreadyExists, std::move(msg)};
  }
  static Status NotSealed(std::string msg) { return {StatusCode::kNotSealed, std::move(msg)}; }
  static Status AlreadySealed(std::string msg) {
    return {StatusCode::kAlreadySealed, std::move(msg)};
  }
  static Status NotHeld(std::string msg) { return {StatusCode::kNotHeld, std::move(msg)}; }
  static Status OutOfMemory(std::string msg) { return {StatusCode::kOutOfMemory, std::move(msg)}; }
  static Status Timeout(std::string msg) { return {StatusCode::kTimeout, std::move(msg)}; }
  static Status LimitExceeded(std::string msg) {
    return {StatusCode::kLimitExceeded, std::move(msg)};
  }
  static Status ProtocolMismatch(std::string msg) {
    return {StatusCode::kProtocolMismatch, std::move(msg)};
  }
  static Status ConnectionFailed(std::string msg) {
    return {StatusCode::kConnectionFailed, std::move(msg)};
  }
  static Status Disconnected(std::string msg) {
    return {StatusCode::kDisconnected, std::move(msg)};
  }
  static Status IoError(std::string msg) { return {StatusCode::kIoError, std::move(msg)}; }
  static Status Internal(std::string msg) { return {StatusCode::kInternal, std::move(msg)}; }
  static Status PermissionDenied(std::string msg) {
    return {StatusCode::kPermissionDenied, std::move(msg)};
  }
  static Status TaskFailed(std::string msg) { return {StatusCode::kTaskFailed, std::move(msg)}; }
  // An IoError whose message is "<what>: <strerror(err)>".
  static Status FromErrno(std::string_view what, int err);

  bool ok() const { return state_ == nullptr; }
  StatusCode code() const { return state_ ? state_->code : StatusCode::kOk; }
  // The message; empty for OK.
  const std::string& message() const;
  // "OK", or "<CodeName>: <message>".
  std::string ToString() const;

  bool Is(StatusCode c) const { return code() == c; }

 private:
  struct State {
    StatusCode code;
    std::string message;
  };
  std::unique_ptr<State> state_;
};

// A value of type T, or the Status that explains why there is none. Constructing a Result
// from an OK Status is a programming error and yields an Internal error instead.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}        // NOLINT(google-explicit-constructor)
  Result(Status status) : v_(std::move(status)) {  // NOLINT(google-explicit-constructor)
    if (std::get<Status>(v_).ok()) {
      v_ = Status::Internal("Result constructed from an OK status without a value");
    }
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  // The error; OK when there is a value.
  Status status() const { return ok() ? Status::OK() : std::get<Status>(v_); }

  // Access to the value. Calling these on an error Result is a programming error.
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace depot

#define DEPOT_CONCAT_IMPL(a, b) a##b
#define DEPOT_CONCAT(a, b) DEPOT_CONCAT_IMPL(a, b)

// Returns the Status of `expr` from the enclosing function if it is not OK.
#define DEPOT_RETURN_NOT_OK(expr)          \
  do {                                     \
    ::depot::Status _depot_st = (expr);    \
    if (!_depot_st.ok()) return _depot_st; \
  } while (false)

#define DEPOT_ASSIGN_OR_RETURN_IMPL(tmp, lhs, rexpr) \
  auto tmp = (rexpr);                                \
  if (!tmp.ok()) return tmp.status();                \
  lhs = std::move(tmp).value()

// Evaluates `rexpr` (a Result<T>); on error returns its Status from the enclosing
// function, otherwise assigns (or declares, with `auto x`) `lhs` from the value.
#define DEPOT_ASSIGN_OR_RETURN(lhs, rexpr) \
  DEPOT_ASSIGN_OR_RETURN_IMPL(DEPOT_CONCAT(_depot_result_, __LINE__), lhs, rexpr)
