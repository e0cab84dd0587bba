#include "buffers.h"

#include <cstdint>
#include <string>

#include "errors.h"
#include "gil.h"

namespace nb = nanobind;

namespace depot::python {
namespace {

template <typename T>
int GetBuffer(PyObject* exporter, Py_buffer* view, int flags, bool read_only) {
  T* self = nb::inst_ptr<T>(exporter);
  void* data = const_cast<std::byte*>(static_cast<const std::byte*>(self->buffer.ptr()));
  // An empty object has no bytes, but a buffer needs a non-null pointer.
  static char empty = 0;
  if (data == nullptr) data = &empty;
  return PyBuffer_FillInfo(view, exporter, data, static_cast<Py_ssize_t>(self->buffer.size()),
                           read_only ? 1 : 0, flags);
}

int GetStoreBuffer(PyObject* exporter, Py_buffer* view, int flags) {
  return GetBuffer<StoreBuffer>(exporter, view, flags, /*read_only=*/true);
}

int GetWritableBuffer(PyObject* exporter, Py_buffer* view, int flags) {
  return GetBuffer<WritableBuffer>(exporter, view, flags, /*read_only=*/false);
}

int GetPrivateBuffer(PyObject* exporter, Py_buffer* view, int flags) {
  return GetBuffer<PrivateStoreBuffer>(exporter, view, flags, /*read_only=*/false);
}

PyType_Slot store_buffer_slots[] = {
    {Py_bf_getbuffer, reinterpret_cast<void*>(GetStoreBuffer)},
    {0, nullptr},
};

PyType_Slot writable_buffer_slots[] = {
    {Py_bf_getbuffer, reinterpret_cast<void*>(GetWritableBuffer)},
    {0, nullptr},
};

PyType_Slot private_buffer_slots[] = {
    {Py_bf_getbuffer, reinterpret_cast<void*>(GetPrivateBuffer)},
    {0, nullptr},
};

nb::bytes IdBytes(const ObjectId& id) {
  const auto bytes = id.Bytes();
  return nb::bytes(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

// What every buffer has: its object's id, size, address and metadata.
template <typename T>
void BindBytes(nb::class_<T>& cls) {
  cls.def_prop_ro(
         "id", [](const T& b) { return IdBytes(b.buffer.id()); }, "The object's 16-byte id.")
      .def_prop_ro(
          "size", [](const T& b) { return b.buffer.size(); }, "Bytes of data.")
      .def_prop_ro(
          "address", [](const T& b) { return reinterpret_cast<uintptr_t>(b.buffer.ptr()); },
          "Address of the data in this process (inside a mapping of an arena segment).")
      .def_prop_ro(
          "metadata",
          [](const T& b) {
            const auto md = b.buffer.metadata();
            return nb::bytes(reinterpret_cast<const char*>(md.data()), md.size());
          },
          "The object's metadata blob.")
      .def("__len__", [](const T& b) { return b.buffer.size(); });
}

// What a buffer in the store's own memory has besides: where the bytes lie.
template <typename T>
void BindCommon(nb::class_<T>& cls) {
  BindBytes(cls);
  cls.def_prop_ro(
         "segment", [](const T& b) { return b.buffer.location().segment; },
         "Arena segment holding the data.")
      .def_prop_ro(
          "offset", [](const T& b) { return b.buffer.location().offset; },
          "Offset of the data in its segment.");
}

}  // namespace

Parts ViewParts(nb::list buffers, const std::vector<uint64_t>& offsets) {
  if (offsets.size() != buffers.size()) throw nb::value_error("one offset per part");
  Parts out;
  out.views.reserve(buffers.size());
  out.parts.reserve(buffers.size());
  for (size_t i = 0; i < buffers.size(); ++i) {
    out.views.push_back(std::make_unique<ReadView>(buffers[i]));
    out.parts.push_back(PutPart{offsets[i], out.views.back()->bytes()});
  }
  return out;
}

void BindBuffers(nb::module_& m) {
  // Their type slots make both buffers; the signatures say so to type checkers too (the stubs
  // derive them from typing_extensions.Buffer), so that memoryview(...) and the like check.
  nb::class_<StoreBuffer> store(m, "StoreBuffer", nb::type_slots(store_buffer_slots),
                                nb::sig("class StoreBuffer(typing_extensions.Buffer)"),
                                "A sealed object's bytes in shared memory (read-only buffer "
                                "protocol). Holds one store reference until collected.");
  BindCommon(store);
  nb::class_<PrivateStoreBuffer> own(m, "PrivateBuffer", nb::type_slots(private_buffer_slots),
                                     nb::sig("class PrivateBuffer(typing_extensions.Buffer)"),
                                     "A private copy of a sealed object's bytes (writable "
                                     "buffer protocol; StoreBuffer.private_copy). Holds one "
                                     "store reference until collected.");
  BindBytes(own);
  constexpr const char* kPopulateDoc =
      "Maps the bytes' pages into this process now, in one system call, instead of a page "
      "fault per 4 KiB as they are first read: a first full pass over a large object then "
      "runs at nearly the speed of warm memory. For objects read whole; costs a walk of the "
      "page tables when they are mapped already. Does nothing on Linux before 5.14.";
  store.def(
      "populate",
      [](const StoreBuffer& self) {
        ReleaseGil unlocked;
        self.buffer.Populate();
      },
      kPopulateDoc);
  own.def(
      "populate",
      [](const PrivateStoreBuffer& self) {
        ReleaseGil unlocked;
        self.buffer.Populate();
      },
      kPopulateDoc);
  store.def(
      "private_copy",
      [](const StoreBuffer& self) {
        return PrivateStoreBuffer{ValueOrRaise(self.buffer.PrivateCopy())};
      },
      "A copy of the bytes that this process may write (a PrivateBuffer), made lazily: a "
      "copy-on-write mapping of the object's pages, which copies a page into this process's "
      "memory when it is first written. Writes never reach the store or other processes.");
  nb::class_<WritableBuffer> writable(m, "WritableBuffer", nb::type_slots(writable_buffer_slots),
                                      nb::sig("class WritableBuffer(typing_extensions.Buffer)"),
                                      "The writable bytes of an object being created. Dropping "
                                      "it before the object is sealed aborts the object.");
  BindCommon(writable);
}

}  // namespace depot::python
