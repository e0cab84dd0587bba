// The info records of the Python binding (StoreStatus, GpuInfo, ObjectInfo, ClientInfo):
// read-only properties, a repr naming every field, and to_dict(), all made from the field
// tables of client/fields/info_fields.h, so every field of the C++ struct is there.
#pragma once

#include <nanobind/nanobind.h>

namespace depot::python {

void BindInfo(nanobind::module_& m);

}  // namespace depot::python
