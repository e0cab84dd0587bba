// Buffer and MutableBuffer: handles to an object's bytes in the store's shared memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "depot/object_id.h"
#include "depot/status.h"

namespace depot {

namespace internal {
struct Holding;  // one store reference, shared by every handle to the same object
class Mapping;
}  // namespace internal

class PrivateBuffer;

// Where an object's bytes lie in the host arena.
struct BufferLocation {
  uint32_t segment = 0;  // arena segment index
  uint64_t offset = 0;   // byte offset of the data in the segment
  uint32_t slot = 0;     // the object's slot in the shared header table
};

// A read-only view of a sealed object, pointing straight into the store's memory: no copy.
//
// A Buffer is a cheap, copyable handle. All handles to one object in one Client share a
// single reference in the daemon; it is released when the last of them is destroyed (even
// after the Client itself is gone). While any handle lives, the object stays in memory
// and is never evicted, and its bytes never change. The bytes are mapped read-only: a write
// through a Buffer's pointer (casting its const away) faults with SIGSEGV. A
// default-constructed Buffer is empty. Thread-safe to copy and read from any thread.
//
// Dropping the last handle usually costs no system call: the release is queued, and reaches
// the daemon with the Client's next request (ahead of it, in the same write), or within
// about 1 ms, whichever comes first. So this Client's own later requests always see it (e.g. a
// Delete right after dropping the object's last Buffer frees it at once); other clients
// may see the object referenced for up to that long.
class Buffer {
 public:
  Buffer() = default;

  explicit operator bool() const { return holding_ != nullptr; }
  const ObjectId& id() const;
  // The object's data and metadata. Empty spans for an empty Buffer.
  std::span<const std::byte> data() const;
  std::span<const std::byte> metadata() const;
  const std::byte* ptr() const { return data().data(); }
  size_t size() const { return data().size(); }
  BufferLocation location() const;

  // A copy of the object's data that this process may write, made lazily: a private
  // (MAP_PRIVATE, copy-on-write) mapping of the object's pages. It reads the store's pages
  // until a page is first written, which copies that page (4 KiB) into this process's own
  // memory; so writes cost what they touch, and never reach the store, the object's other
  // readers or its creator. One mmap, no copy and no round trip. Where the segment's file
  // cannot be mapped so (the process's map count or memory limits), the copy is made now,
  // into anonymous memory. Fails with InvalidArgument for an empty Buffer, and with IoError
  // if no memory can be had for it.
  Result<PrivateBuffer> PrivateCopy() const;

  // Maps the data's pages into this process now (MADV_POPULATE_READ), instead of a page
  // fault per 4 KiB as they are first read: a first full pass over a large object then runs
  // at nearly the speed of warm memory. One system call, or for an object of 16 MiB or more
  // one per slice on the client's copy threads (ConnectOptions::copy_threads), since the
  // page tables fill at a core's pace. Costs a walk of the page tables (about 45 ms per GiB)
  // when they are filled already, and maps pages a partial reader would not touch: for
  // objects read whole, and read first here. Best effort: nothing on Linux before 5.14, and
  // nothing for an empty Buffer.
  void Populate() const;

 private:
  friend class Client;
  explicit Buffer(std::shared_ptr<internal::Holding> h) : holding_(std::move(h)) {}
  std::shared_ptr<internal::Holding> holding_;
};

// A private, writable copy of a sealed object's data (Buffer::PrivateCopy). Copies of the
// handle share the same private pages. It holds the object's reference as a Buffer does, so
// that the pages it has not written keep the object's bytes. The metadata is the object's,
// read-only. A default-constructed PrivateBuffer is empty. Thread-safe to copy; writes to
// the data are the caller's to order.
class PrivateBuffer {
 public:
  PrivateBuffer() = default;

  explicit operator bool() const { return holding_ != nullptr; }
  const ObjectId& id() const;
  std::span<std::byte> data() const { return {data_, size_}; }
  std::span<const std::byte> metadata() const;
  std::byte* ptr() const { return data_; }
  size_t size() const { return size_; }
  // As Buffer::Populate, for reading: the pages map the object's until first written.
  void Populate() const;

 private:
  friend class Buffer;
  PrivateBuffer(std::shared_ptr<internal::Holding> h, std::shared_ptr<const internal::Mapping> m,
                std::byte* data, size_t size)
      : holding_(std::move(h)), mapping_(std::move(m)), data_(data), size_(size) {}
  std::shared_ptr<internal::Holding> holding_;
  std::shared_ptr<const internal::Mapping> mapping_;  // the private pages; null when empty
  std::byte* data_ = nullptr;
  size_t size_ = 0;
};

// The writable data of an object this client is creating (between Create and Seal or
// Abort). The bytes are in shared memory: write them in place, then call Client::Seal.
// Writing after Seal breaks the store's promise that objects are immutable; don't. Only a
// MutableBuffer points into the writable view of the arena; a Buffer of the same object
// (after Seal) reads it through the read-only view.
//
// Like Buffer, it shares the client's reference to the object, and its release is queued
// the same way. If the last handle to an object that was never sealed goes away, the object
// is aborted (when the release reaches the daemon).
class MutableBuffer {
 public:
  MutableBuffer() = default;

  explicit operator bool() const { return holding_ != nullptr; }
  const ObjectId& id() const;
  std::span<std::byte> data() const;
  std::span<const std::byte> metadata() const;
  std::byte* ptr() const { return data().data(); }
  size_t size() const { return data().size(); }
  BufferLocation location() const;

 private:
  friend class Client;
  explicit MutableBuffer(std::shared_ptr<internal::Holding> h) : holding_(std::move(h)) {}
  std::shared_ptr<internal::Holding> holding_;
};

}  // namespace depot
