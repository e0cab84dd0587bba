// The Python objects that own a store reference and export the object's bytes through the
// buffer protocol, so memoryview, numpy.frombuffer and pickle's out-of-band buffers view the
// store's shared memory with no copy.
//
// Lifetime: every memoryview or ndarray made from one of these holds a strong reference to
// it (Py_buffer.obj), so the C++ handle, and with it the daemon's reference, is dropped only
// when the last view is garbage collected.
#pragma once

#include <nanobind/nanobind.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "depot/buffer.h"
#include "depot/client.h"

namespace depot::python {

// A sealed object's bytes: read-only (a request for a writable buffer fails with BufferError).
struct StoreBuffer {
  Buffer buffer;
};

// A private copy of a sealed object's bytes (Buffer::PrivateCopy): writable, copy-on-write;
// writes stay in this process.
struct PrivateStoreBuffer {
  PrivateBuffer buffer;
};

// The bytes of an object this process is creating: writable, until sealed by contract.
struct WritableBuffer {
  MutableBuffer buffer;
};

// A contiguous read-only view of a Python buffer (bytes, memoryview, ndarray, PickleBuffer),
// released on destruction. Held across GIL releases: the exporter stays alive meanwhile.
class ReadView {
 public:
  explicit ReadView(nanobind::handle obj) {
    if (PyObject_GetBuffer(obj.ptr(), &view_, PyBUF_ANY_CONTIGUOUS) != 0) {
      throw nanobind::python_error();
    }
  }
  ReadView(const ReadView&) = delete;
  ReadView& operator=(const ReadView&) = delete;
  ~ReadView() { PyBuffer_Release(&view_); }
  std::span<const std::byte> bytes() const {
    return {static_cast<const std::byte*>(view_.buf), static_cast<size_t>(view_.len)};
  }

 private:
  Py_buffer view_{};
};

// The bytes of a Python bytes object, valid while it lives.
inline std::span<const std::byte> BytesOf(const nanobind::bytes& b) {
  return {reinterpret_cast<const std::byte*>(b.c_str()), b.size()};
}

// A value's parts as depot::Client::PutParts takes them, over views of the Python buffers,
// which stay exported while the GIL is released.
struct Parts {
  std::vector<std::unique_ptr<ReadView>> views;
  std::vector<PutPart> parts;
};

// The parts of a value: `buffers` at `offsets`, one each.
Parts ViewParts(nanobind::list buffers, const std::vector<uint64_t>& offsets);

void BindBuffers(nanobind::module_& m);

}  // namespace depot::python
