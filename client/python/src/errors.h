// Failures of the C++ client as Python exceptions of depot's hierarchy (depot/_errors.py).
#pragma once

#include <nanobind/nanobind.h>

#include "depot/status.h"

namespace depot::python {

// Records the exception class to raise for each StatusCode, as {code name: class}; the
// package calls this once at import (depot._errors registers its hierarchy).
void RegisterErrorTypes(nanobind::dict types);

// The exception `status` (not OK) is raised as: an instance of the registered class for its
// code, with the message the daemon or the client gave, and the code's name as `code`.
// Needs the GIL.
nanobind::object ErrorOf(const Status& status);

// Raises ErrorOf(status).
[[noreturn]] void Raise(const Status& status);

// Raises a value of `result`'s error, or returns its value.
template <typename T>
T ValueOrRaise(Result<T>&& result) {
  if (!result.ok()) Raise(result.status());
  return std::move(result).value();
}

inline void RaiseIfError(const Status& status) {
  if (!status.ok()) Raise(status);
}

}  // namespace depot::python
