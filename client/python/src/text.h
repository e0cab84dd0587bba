// Text that comes from the daemon, and through it from other clients (a client's name, an
// object's name, a worker's functions, a task's label or failure message), as a Python str.
//
// None of it is trusted to be UTF-8: the daemon passes on what clients and workers sent, and
// a process's command is whatever it named itself. Bytes that are not UTF-8 become U+FFFD,
// so that one client's bad bytes cannot make another client's call raise.
#pragma once

#include <nanobind/nanobind.h>

#include <string_view>

namespace depot::python {

inline nanobind::str Text(std::string_view text) {
  PyObject* s = PyUnicode_DecodeUTF8(text.data(), static_cast<Py_ssize_t>(text.size()), "replace");
  if (s == nullptr) throw nanobind::python_error();
  return nanobind::steal<nanobind::str>(s);
}

}  // namespace depot::python
