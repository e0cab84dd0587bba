#include "info.h"

#include <nanobind/stl/map.h>
#include <nanobind/stl/string.h>

#include <map>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "depot/client.h"
#include "depot/ipc/gpu.h"
#include "info_fields.h"
#include "text.h"

namespace nb = nanobind;

namespace depot::python {
namespace {

using internal::Info;
using internal::InfoFields;

template <typename V>
struct IsVector : std::false_type {};
template <typename V>
struct IsVector<std::vector<V>> : std::true_type {};

template <typename V>
struct IsMap : std::false_type {};
template <typename K, typename V>
struct IsMap<std::map<K, V>> : std::true_type {};

// A field's value as its property returns it: ids and GPU uuids as bytes, an object's state
// as "creating" or "sealed" and a task's as "waiting", "running", ..., nested records as
// records, lists as lists, maps (a worker's resources) as dicts.
template <typename V>
nb::object PropertyValue(const V& v) {
  if constexpr (std::is_same_v<V, ObjectId>) {
    const auto bytes = v.Bytes();
    return nb::bytes(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  } else if constexpr (std::is_same_v<V, ipc::DeviceUuid>) {
    return nb::bytes(reinterpret_cast<const char*>(v.data()), v.size());
  } else if constexpr (std::is_same_v<V, ObjectState>) {
    return nb::str(v == ObjectState::kSealed ? "sealed" : "creating");
  } else if constexpr (std::is_same_v<V, TaskState>) {
    return nb::str(TaskStateName(v));
  } else if constexpr (std::is_same_v<V, std::string>) {
    return Text(v);
  } else if constexpr (IsVector<V>::value) {
    nb::list out;
    for (const auto& element : v) out.append(PropertyValue(element));
    return out;
  } else if constexpr (IsMap<V>::value) {
    nb::dict out;
    for (const auto& [key, value] : v) out[PropertyValue(key)] = PropertyValue(value);
    return out;
  } else {
    return nb::cast(v, nb::rv_policy::copy);  // numbers, bools; records
  }
}

// The Python type of PropertyValue's result, for the property's signature in the stubs
// (depot/_depot.pyi).
template <typename V>
std::string PropertyType() {
  if constexpr (std::is_same_v<V, ObjectId> || std::is_same_v<V, ipc::DeviceUuid>) {
    return "bytes";
  } else if constexpr (std::is_same_v<V, ObjectState> || std::is_same_v<V, TaskState> ||
                       std::is_same_v<V, std::string>) {
    return "str";
  } else if constexpr (std::is_same_v<V, bool>) {
    return "bool";
  } else if constexpr (std::is_integral_v<V>) {
    return "int";
  } else if constexpr (std::is_floating_point_v<V>) {
    return "float";
  } else if constexpr (IsVector<V>::value) {
    return "list[" + PropertyType<typename V::value_type>() + "]";
  } else if constexpr (IsMap<V>::value) {
    return "dict[" + PropertyType<typename V::key_type>() + ", " +
           PropertyType<typename V::mapped_type>() + "]";
  } else {
    static_assert(Info<V>, "a field of a type PropertyType cannot name");
    return InfoFields<V>::kName;
  }
}

template <Info T>
nb::dict ToDict(const T& record);

// The same in to_dict(), which holds only plain values, ready for json.dumps: ids as their
// 32-character hex and GPU uuids as nvidia-smi prints them (as depotctl shows both), nested
// records as dicts.
template <typename V>
nb::object PlainValue(const V& v) {
  if constexpr (std::is_same_v<V, ObjectId>) {
    return nb::str(v.Hex().c_str());
  } else if constexpr (std::is_same_v<V, ipc::DeviceUuid>) {
    return nb::str(ipc::FormatUuid(v).c_str());
  } else if constexpr (Info<V>) {
    return ToDict(v);
  } else if constexpr (IsVector<V>::value) {
    nb::list out;
    for (const auto& element : v) out.append(PlainValue(element));
    return out;
  } else {
    return PropertyValue(v);
  }
}

template <Info T>
std::string Repr(const T& record);

// The same in a repr: ids and uuids as to_dict() has them but unquoted, the rest as Python
// shows the property's value.
template <typename V>
std::string ReprValue(const V& v) {
  if constexpr (std::is_same_v<V, ObjectId>) {
    return v.Hex();
  } else if constexpr (std::is_same_v<V, ipc::DeviceUuid>) {
    return ipc::FormatUuid(v);
  } else if constexpr (Info<V>) {
    return Repr(v);
  } else if constexpr (IsVector<V>::value) {
    std::string out = "[";
    for (const auto& element : v) {
      if (out.size() > 1) out += ", ";
      out += ReprValue(element);
    }
    return out + "]";
  } else {
    return nb::repr(PropertyValue(v)).c_str();
  }
}

// StoreStatus(daemon_version='0.1.0', pid=1234, ...): every field, in the table's order.
template <Info T>
std::string Repr(const T& record) {
  std::string out = std::string(InfoFields<T>::kName) + "(";
  bool first = true;
  internal::ForEachField<T>([&](const auto& field) {
    if (!first) out += ", ";
    first = false;
    out += field.name;
    out += '=';
    out += ReprValue(record.*field.member);
  });
  return out + ")";
}

template <Info T>
nb::dict ToDict(const T& record) {
  nb::dict out;
  internal::ForEachField<T>(
      [&](const auto& field) { out[field.name] = PlainValue(record.*field.member); });
  return out;
}

// The property of field I of T, with its type in its signature.
template <Info T, size_t I>
void DefineProperty(nb::class_<T>& cls) {
  constexpr auto field = std::get<I>(InfoFields<T>::kFields);
  using Value = typename decltype(field)::Value;
  const std::string signature =
      "def " + std::string(field.name) + "(self) -> " + PropertyType<Value>();
  cls.def_prop_ro(
      field.name,
      [](const T& record) {
        return PropertyValue(record.*std::get<I>(InfoFields<T>::kFields).member);
      },
      nb::for_getter(nb::sig(signature.c_str())));
}

template <Info T, size_t... I>
void DefineProperties(nb::class_<T>& cls, std::index_sequence<I...>) {
  (DefineProperty<T, I>(cls), ...);
}

// The class of T: a read-only property per field, __repr__, to_dict(), and _fields (the
// fields' names, in order).
template <Info T>
nb::class_<T> BindRecord(nb::module_& m, const char* doc) {
  nb::class_<T> cls(m, InfoFields<T>::kName, doc);
  DefineProperties(cls, std::make_index_sequence<internal::kFieldCount<T>>());
  cls.def("__repr__", &Repr<T>);
  cls.def("to_dict", &ToDict<T>,
          "Every field, as plain values (ids and GPU uuids as hex strings, nested records as "
          "dicts), ready for json.dumps.");
  nb::list names;
  internal::ForEachField<T>([&](const auto& field) { names.append(nb::str(field.name)); });
  cls.attr("_fields") = nb::tuple(names);
  return cls;
}

}  // namespace

void BindInfo(nb::module_& m) {
  BindRecord<GpuInfo>(m, "A GPU the daemon serves, and its pool.");
  // `sealed` is older than `state`, and kept.
  BindRecord<ObjectInfo>(m, "What the daemon knows of one object (Client.list).")
      .def_prop_ro("sealed", [](const ObjectInfo& o) { return o.state == ObjectState::kSealed; });
  BindRecord<SchedulerStatus>(m, "The scheduler's totals (StoreStatus.scheduler).");
  BindRecord<Setting>(m, "A setting the daemon runs with (StoreStatus.settings).");
  BindRecord<DiskStatus>(m, "The disk tier: spilled objects and their I/O (StoreStatus.disk).");
  BindRecord<StoreStatus>(m, "The daemon's capacity, usage and counters.");
  BindRecord<ClientInfo>(m, "A client connected to the daemon.");
  BindRecord<ObjectPlacement>(m, "Where an object's bytes are (Client.locate).");
  BindRecord<WorkerInfo>(m, "A worker attached to the daemon's scheduler (Client.workers).");
  BindRecord<TaskInfo>(m,
                       "A task the daemon's scheduler holds, and why it runs where it does "
                       "(Client.tasks).");
}

}  // namespace depot::python
