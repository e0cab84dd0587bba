#include "device.h"

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "dlpack.h"
#include "errors.h"

#ifdef DEPOT_HAVE_CUDA
#include "depot/ipc/cuda_driver.h"
#endif

namespace nb = nanobind;
using namespace nb::literals;

namespace depot::python {
namespace {

using dlpack::DLManagedTensor;
using dlpack::DLManagedTensorVersioned;
using dlpack::DLTensor;

nb::bytes IdBytes(const ObjectId& id) {
  const auto bytes = id.Bytes();
  return nb::bytes(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

// Whether [start, start + size) lies in readable mappings of this process (/proc/self/maps,
// sorted by address): the test a simulated GPU's copy makes of its source, so that a real
// device pointer handed to a daemon with simulated GPUs is an error, not a crash.
bool ReadableHostRange(uint64_t start, uint64_t size) {
  if (size == 0) return true;
  const uint64_t end = start + size;
  if (end < start) return false;
  FILE* maps = std::fopen("/proc/self/maps", "r");
  if (maps == nullptr) return true;  // cannot tell: trust the caller
  uint64_t pos = start;
  char line[512];
  while (pos < end && std::fgets(line, sizeof line, maps) != nullptr) {
    uint64_t lo = 0;
    uint64_t hi = 0;
    char perms[8] = {};
    const bool parsed = std::sscanf(line, "%" SCNx64 "-%" SCNx64 " %7s", &lo, &hi, perms) == 3;
    // Skip the rest of a line longer than the buffer, whatever it said, before the next.
    char rest[512];
    for (const char* tail = line; std::strchr(tail, '\n') == nullptr;) {
      if (std::fgets(rest, sizeof rest, maps) == nullptr) break;
      tail = rest;
    }
    if (!parsed || hi <= pos) continue;
    if (lo > pos || perms[0] != 'r') break;
    pos = hi;
  }
  std::fclose(maps);
  return pos >= end;
}

#ifdef DEPOT_HAVE_CUDA
Status CudaCopy(int ordinal, uint64_t target, uint64_t source, uint64_t size,
                std::optional<uintptr_t> wait_stream) {
  DEPOT_ASSIGN_OR_RETURN(const ipc::CudaDriver* driver, ipc::CudaDriver::Load());
  const ipc::CudaDriver& d = *driver;
  CUdevice device = 0;
  DEPOT_RETURN_NOT_OK(d.Check(d.DeviceGet(&device, ordinal), "cuDeviceGet"));
  // The primary context (the CUDA runtime's, which CuPy and PyTorch use), current only for
  // this call; the client's importer holds it retained already, so this is cheap.
  DEPOT_ASSIGN_OR_RETURN(auto context, ipc::CudaPrimaryContext::Retain(d, device));
  DEPOT_ASSIGN_OR_RETURN(auto scope, ipc::CudaContextScope::Enter(d, context->get()));
  if (wait_stream) {
    DEPOT_RETURN_NOT_OK(d.Check(d.StreamSynchronize(reinterpret_cast<CUstream>(*wait_stream)),
                                "cuStreamSynchronize (the producer's stream)"));
  }
  // The legacy default stream: the producer was asked (__dlpack__(stream=1)) to make its
  // writes visible there.
  DEPOT_RETURN_NOT_OK(
      d.Check(d.MemcpyDtoDAsync(target, source, size, CU_STREAM_LEGACY), "cuMemcpyDtoDAsync"));
  return d.Check(d.StreamSynchronize(CU_STREAM_LEGACY), "cuStreamSynchronize");
}

// The ordinal of the GPU whose memory `pointer` is, or nullopt if the driver does not know
// it as device memory (no driver, host memory, a simulated GPU's "device pointer").
std::optional<int> PointerDevice(uint64_t pointer) {
  auto driver = ipc::CudaDriver::Load();
  if (!driver.ok()) return std::nullopt;
  int ordinal = -1;
  if ((*driver)->PointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, pointer) !=
      CUDA_SUCCESS) {
    return std::nullopt;
  }
  return ordinal;
}
#else
std::optional<int> PointerDevice(uint64_t) { return std::nullopt; }
#endif

// A producer's DLPack tensor, taken over from its capsule: the capsule is renamed
// "used_dltensor[_versioned]" at once, as the standard asks of a consumer, and the tensor's
// deleter is called by close() or when this object goes.
class DLPackImport {
 public:
  explicit DLPackImport(nb::handle capsule) {
    PyObject* c = capsule.ptr();
    if (PyCapsule_IsValid(c, dlpack::kVersionedCapsule)) {
      versioned_ = true;
      auto* m = static_cast<DLManagedTensorVersioned*>(
          PyCapsule_GetPointer(c, dlpack::kVersionedCapsule));
      if (m == nullptr) throw nb::python_error();
      if (PyCapsule_SetName(c, dlpack::kUsedVersionedCapsule) != 0) throw nb::python_error();
      managed_ = m;
      if (m->version.major != dlpack::kMajorVersion) {
        const uint32_t major = m->version.major;
        Close();
        throw nb::buffer_error(("the array's DLPack capsule is of version " +
                                std::to_string(major) + ".x; depot reads version 1")
                                   .c_str());
      }
      tensor_ = &m->dl_tensor;
      read_only_ = (m->flags & dlpack::kFlagReadOnly) != 0;
    } else if (PyCapsule_IsValid(c, dlpack::kCapsule)) {
      auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(c, dlpack::kCapsule));
      if (m == nullptr) throw nb::python_error();
      if (PyCapsule_SetName(c, dlpack::kUsedCapsule) != 0) throw nb::python_error();
      managed_ = m;
      tensor_ = &m->dl_tensor;
    } else {
      throw nb::type_error(
          "not an unused DLPack capsule (\"dltensor\" or \"dltensor_versioned\"): a capsule can "
          "be consumed only once");
    }
  }
  DLPackImport(const DLPackImport&) = delete;
  DLPackImport& operator=(const DLPackImport&) = delete;
  ~DLPackImport() { Close(); }

  // Calls the producer's deleter: the tensor's memory may go after this.
  void Close() {
    void* m = std::exchange(managed_, nullptr);
    tensor_ = nullptr;
    if (m == nullptr) return;
    if (versioned_) {
      auto* v = static_cast<DLManagedTensorVersioned*>(m);
      if (v->deleter != nullptr) v->deleter(v);
    } else {
      auto* u = static_cast<DLManagedTensor*>(m);
      if (u->deleter != nullptr) u->deleter(u);
    }
  }

  bool closed() const { return managed_ == nullptr; }
  bool versioned() const { return versioned_; }
  bool read_only() const { return read_only_; }
  uint64_t data() const { return reinterpret_cast<uint64_t>(tensor().data) + tensor().byte_offset; }
  int32_t device_type() const { return tensor().device.device_type; }
  int32_t device_id() const { return tensor().device.device_id; }
  uint8_t code() const { return tensor().dtype.code; }
  uint8_t bits() const { return tensor().dtype.bits; }
  uint16_t lanes() const { return tensor().dtype.lanes; }
  std::vector<int64_t> shape() const {
    const DLTensor& t = tensor();
    if (t.ndim > 0 && t.shape == nullptr) throw nb::value_error("DLPack tensor without a shape");
    return std::vector<int64_t>(t.shape, t.shape + std::max(t.ndim, 0));
  }
  std::optional<std::vector<int64_t>> strides() const {
    const DLTensor& t = tensor();
    if (t.strides == nullptr) return std::nullopt;
    return std::vector<int64_t>(t.strides, t.strides + std::max(t.ndim, 0));
  }

 private:
  const DLTensor& tensor() const {
    if (tensor_ == nullptr) throw nb::value_error("this DLPack tensor was released (closed)");
    return *tensor_;
  }

  void* managed_ = nullptr;  // DLManagedTensor or DLManagedTensorVersioned
  DLTensor* tensor_ = nullptr;
  bool versioned_ = false;
  bool read_only_ = false;
};

// What a capsule exported from a DeviceStoreBuffer points to: the managed tensor, and what
// keeps its memory valid (a DeviceBuffer: one store reference) and its arrays.
template <typename Managed>
struct Exported {
  Managed managed{};
  DeviceBuffer buffer;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;

  // The DLPack deleter: may run in any thread, with or without the GIL (only C++ here).
  static void Delete(Managed* self) { delete static_cast<Exported*>(self->manager_ctx); }
};

// A capsule nobody consumed still owns its tensor: its destructor calls the deleter. Once
// renamed "used_..." by a consumer, the consumer owns it.
template <typename Managed>
void CapsuleDestructor(PyObject* capsule) {
  const char* name = std::is_same_v<Managed, DLManagedTensorVersioned> ? dlpack::kVersionedCapsule
                                                                       : dlpack::kCapsule;
  if (!PyCapsule_IsValid(capsule, name)) return;
  auto* m = static_cast<Managed*>(PyCapsule_GetPointer(capsule, name));
  if (m != nullptr && m->deleter != nullptr) m->deleter(m);
}

template <typename Managed>
nb::object MakeCapsule(const DeviceStoreBuffer& self, int32_t device_type,
                       std::vector<int64_t> shape, std::optional<std::vector<int64_t>> strides,
                       uint8_t code, uint8_t bits, uint16_t lanes) {
  auto exported = std::make_unique<Exported<Managed>>();
  exported->buffer = self.buffer;
  exported->shape = std::move(shape);
  if (strides) {
    if (strides->size() != exported->shape.size()) {
      throw nb::value_error("one stride per dimension");
    }
    exported->strides = std::move(*strides);
  }
  Managed& m = exported->managed;
  DLTensor& t = m.dl_tensor;
  t.data = reinterpret_cast<void*>(static_cast<uintptr_t>(self.buffer.device_ptr()));
  t.device = {device_type, self.buffer.device()};
  t.ndim = static_cast<int32_t>(exported->shape.size());
  t.dtype = {code, bits, lanes};
  t.shape = exported->shape.empty() ? nullptr : exported->shape.data();
  t.strides = strides && !exported->strides.empty() ? exported->strides.data() : nullptr;
  t.byte_offset = 0;
  m.manager_ctx = exported.get();
  m.deleter = &Exported<Managed>::Delete;
  const char* name = dlpack::kCapsule;
  if constexpr (std::is_same_v<Managed, DLManagedTensorVersioned>) {
    m.version = {dlpack::kMajorVersion, dlpack::kMinorVersion};
    // The store's objects are immutable.
    m.flags = dlpack::kFlagReadOnly;
    name = dlpack::kVersionedCapsule;
  }
  PyObject* capsule = PyCapsule_New(&m, name, &CapsuleDestructor<Managed>);
  if (capsule == nullptr) throw nb::python_error();
  exported.release();  // the capsule (then its consumer) owns it now
  return nb::steal(capsule);
}

}  // namespace

Status CopyIntoDevice(const MutableDeviceBuffer& target, uint64_t source, uint64_t size,
                      std::optional<uintptr_t> wait_stream) {
  if (size > target.size()) {
    return Status::Internal("copying " + std::to_string(size) + " bytes into an object of " +
                            std::to_string(target.size()));
  }
  if (size == 0) return Status::OK();
  if (target.simulated()) {
    if (!ReadableHostRange(source, size)) {
      return Status::InvalidArgument(
          "the array's memory is not readable host memory: the daemon's GPUs are simulated "
          "(--simulate-gpus), so a put can only copy arrays that pretend to be on a GPU from "
          "host memory, not real GPU arrays; start the daemon without --simulate-gpus");
    }
    std::memcpy(reinterpret_cast<void*>(static_cast<uintptr_t>(target.device_ptr())),
                reinterpret_cast<const void*>(static_cast<uintptr_t>(source)), size);
    return Status::OK();
  }
#ifdef DEPOT_HAVE_CUDA
  return CudaCopy(target.device(), target.device_ptr(), source, size, wait_stream);
#else
  (void)wait_stream;
  return Status::InvalidArgument(
      "this build of depot's Python binding has no CUDA support (built without the CUDA "
      "headers), so it cannot copy GPU arrays; rebuild it on a host with the CUDA toolkit's "
      "headers");
#endif
}

void BindDevice(nb::module_& m) {
  nb::class_<DeviceStoreBuffer>(m, "DeviceBuffer",
                                "A sealed object's bytes on a GPU, in the store's pool there. "
                                "Holds one store reference until it and every DLPack capsule "
                                "made from it are gone.")
      .def_prop_ro("id", [](const DeviceStoreBuffer& b) { return IdBytes(b.buffer.id()); })
      .def_prop_ro(
          "ptr", [](const DeviceStoreBuffer& b) { return b.buffer.device_ptr(); },
          "The data's device pointer in this process (a host address on a simulated GPU).")
      .def_prop_ro("size", [](const DeviceStoreBuffer& b) { return b.buffer.size(); })
      .def_prop_ro("device", [](const DeviceStoreBuffer& b) { return b.buffer.device(); })
      .def_prop_ro("simulated", [](const DeviceStoreBuffer& b) { return b.buffer.simulated(); })
      .def_prop_ro("metadata",
                   [](const DeviceStoreBuffer& b) {
                     const auto md = b.buffer.metadata();
                     return nb::bytes(reinterpret_cast<const char*>(md.data()), md.size());
                   })
      .def(
          "dlpack",
          [](const DeviceStoreBuffer& self, bool versioned, int32_t device_type,
             std::vector<int64_t> shape, std::optional<std::vector<int64_t>> strides, uint8_t code,
             uint8_t bits, uint16_t lanes) {
            return versioned ? MakeCapsule<DLManagedTensorVersioned>(
                                   self, device_type, std::move(shape), std::move(strides), code,
                                   bits, lanes)
                             : MakeCapsule<DLManagedTensor>(self, device_type, std::move(shape),
                                                            std::move(strides), code, bits, lanes);
          },
          "versioned"_a, "device_type"_a, "shape"_a, "strides"_a.none(), "code"_a, "bits"_a,
          "lanes"_a,
          "A new DLPack capsule of these bytes: \"dltensor_versioned\" (version 1.0, read-only "
          "flag set) or \"dltensor\"; strides in elements, None for C order.");

  nb::class_<DLPackImport>(m, "DLPackImport",
                           "A producer's DLPack tensor, taken from its capsule (which is "
                           "renamed used_...); close() calls the producer's deleter.")
      .def(nb::init<nb::handle>(), "capsule"_a)
      .def("close", &DLPackImport::Close)
      .def_prop_ro("closed", &DLPackImport::closed)
      .def_prop_ro("versioned", &DLPackImport::versioned)
      .def_prop_ro("read_only", &DLPackImport::read_only)
      .def_prop_ro("data", &DLPackImport::data, "The data pointer, byte_offset included.")
      .def_prop_ro("device_type", &DLPackImport::device_type)
      .def_prop_ro("device_id", &DLPackImport::device_id)
      .def_prop_ro("code", &DLPackImport::code)
      .def_prop_ro("bits", &DLPackImport::bits)
      .def_prop_ro("lanes", &DLPackImport::lanes)
      .def_prop_ro("shape", &DLPackImport::shape)
      .def_prop_ro("strides", &DLPackImport::strides, "In elements; None: C order.");

  m.def("pointer_device", &PointerDevice, "pointer"_a,
        "The ordinal of the CUDA GPU whose memory `pointer` is, or None if the driver does not "
        "know it as device memory (no driver, host memory, a simulated GPU's pointer).");

  m.attr("HAVE_CUDA") =
#ifdef DEPOT_HAVE_CUDA
      true;
#else
      false;
#endif
}

}  // namespace depot::python
