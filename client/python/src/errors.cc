#include "errors.h"

#include <array>
#include <string>

#include "text.h"

namespace nb = nanobind;

namespace depot::python {
namespace {

constexpr size_t kCodes = static_cast<size_t>(kLastStatusCode) + 1;

// Strong references held for the life of the process (the classes live in depot._errors,
// which is never unloaded).
std::array<PyObject*, kCodes> g_types{};

}  // namespace

void RegisterErrorTypes(nb::dict types) {
  for (size_t i = 0; i < kCodes; ++i) {
    const std::string name(StatusCodeName(static_cast<StatusCode>(i)));
    if (!types.contains(name.c_str())) continue;
    nb::object type = types[name.c_str()];
    if (!PyType_Check(type.ptr()) ||
        !PyType_IsSubtype(reinterpret_cast<PyTypeObject*>(type.ptr()),
                          reinterpret_cast<PyTypeObject*>(PyExc_Exception))) {
      throw nb::type_error(("not an exception class for " + name).c_str());
    }
    Py_XDECREF(g_types[i]);
    g_types[i] = type.release().ptr();
  }
}

nb::object ErrorOf(const Status& status) {
  const auto index = static_cast<size_t>(status.code());
  PyObject* type =
      index < kCodes && g_types[index] != nullptr ? g_types[index] : PyExc_RuntimeError;
  const std::string_view code = StatusCodeName(status.code());
  return type == PyExc_RuntimeError
             ? nb::handle(type)(Text(status.ToString()))
             : nb::handle(type)(Text(status.message()), nb::str(code.data(), code.size()));
}

void Raise(const Status& status) {
  nb::object error = ErrorOf(status);
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(error.ptr())), error.ptr());
  throw nb::python_error();
}

}  // namespace depot::python
