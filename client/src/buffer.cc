// Buffer and MutableBuffer: views of a Holding.
#include "depot/buffer.h"
#include "depot/device_buffer.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>

#include "connection.h"
#include "holding.h"
#include "parts.h"

namespace depot {

namespace {

constexpr ObjectId kNilId;

// Maps the pages of [data, data + size) for reading: one system call for each slice, on up to
// `threads` threads for a large object (InSlices), as page tables fill at a core's pace.
void PopulateForReading(const std::byte* data, size_t size, unsigned threads) {
#ifdef MADV_POPULATE_READ
  if (size == 0) return;
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(data) / page * page;
  const uintptr_t end = reinterpret_cast<uintptr_t>(data) + size;
  // Slices start on 64 KiB boundaries from `begin`: on pages.
  internal::InSlices(end - begin, threads, [begin](uint64_t from, uint64_t len) {
    (void)::madvise(reinterpret_cast<void*>(begin + from), len, MADV_POPULATE_READ);
  });
#else
  (void)data;
  (void)size;
  (void)threads;
#endif
}

}  // namespace

const ObjectId& Buffer::id() const { return holding_ ? holding_->id : kNilId; }

std::span<const std::byte> Buffer::data() const {
  if (!holding_) return {};
  return {holding_->data, holding_->data_size};
}

std::span<const std::byte> Buffer::metadata() const {
  if (!holding_) return {};
  return {holding_->data + holding_->data_size, holding_->metadata_size};
}

BufferLocation Buffer::location() const { return holding_ ? holding_->location : BufferLocation{}; }

Result<PrivateBuffer> Buffer::PrivateCopy() const {
  if (!holding_) return Status::InvalidArgument("a private copy of an empty Buffer");
  const internal::Holding& h = *holding_;
  DEPOT_ASSIGN_OR_RETURN(auto view, h.conn->segments().ResolvePrivate(
                                        h.location.segment, h.location.offset, h.data_size));
  return PrivateBuffer(holding_, std::move(view.keep), view.data, h.data_size);
}

void Buffer::Populate() const {
  if (holding_) {
    PopulateForReading(holding_->data, holding_->data_size, holding_->conn->copy_threads());
  }
}

void PrivateBuffer::Populate() const {
  if (holding_) PopulateForReading(data_, size_, holding_->conn->copy_threads());
}

const ObjectId& PrivateBuffer::id() const { return holding_ ? holding_->id : kNilId; }

std::span<const std::byte> PrivateBuffer::metadata() const {
  if (!holding_) return {};
  return {holding_->data + holding_->data_size, holding_->metadata_size};
}

const ObjectId& MutableBuffer::id() const { return holding_ ? holding_->id : kNilId; }

std::span<std::byte> MutableBuffer::data() const {
  if (!holding_) return {};
  return {holding_->writable, holding_->data_size};
}

std::span<const std::byte> MutableBuffer::metadata() const {
  if (!holding_) return {};
  return {holding_->data + holding_->data_size, holding_->metadata_size};
}

BufferLocation MutableBuffer::location() const {
  return holding_ ? holding_->location : BufferLocation{};
}

}  // namespace depot

namespace depot {

const ObjectId& DeviceBuffer::id() const { return holding_ ? holding_->id : kNilId; }
uint64_t DeviceBuffer::device_ptr() const { return holding_ ? holding_->address : 0; }
uint64_t DeviceBuffer::size() const { return holding_ ? holding_->size : 0; }
int DeviceBuffer::device() const { return holding_ ? holding_->ordinal : -1; }
std::span<const std::byte> DeviceBuffer::metadata() const {
  return holding_ ? std::span<const std::byte>(holding_->metadata) : std::span<const std::byte>();
}
bool DeviceBuffer::simulated() const { return holding_ && holding_->simulated; }

const ObjectId& MutableDeviceBuffer::id() const { return holding_ ? holding_->id : kNilId; }
uint64_t MutableDeviceBuffer::device_ptr() const { return holding_ ? holding_->address : 0; }
uint64_t MutableDeviceBuffer::size() const { return holding_ ? holding_->size : 0; }
int MutableDeviceBuffer::device() const { return holding_ ? holding_->ordinal : -1; }
bool MutableDeviceBuffer::simulated() const { return holding_ && holding_->simulated; }

}  // namespace depot
