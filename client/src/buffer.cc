// Buffer and MutableBuffer: views of a Holding.
#include "depot/buffer.h"

#include "holding.h"

namespace depot {

namespace {
constexpr ObjectId kNilId;
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

const ObjectId& MutableBuffer::id() const { return holding_ ? holding_->id : kNilId; }

std::span<std::byte> MutableBuffer::data() const {
  if (!holding_) return {};
  return {holding_->data, holding_->data_size};
}

std::span<const std::byte> MutableBuffer::metadata() const {
  if (!holding_) return {};
  return {holding_->data + holding_->data_size, holding_->metadata_size};
}

BufferLocation MutableBuffer::location() const {
  return holding_ ? holding_->location : BufferLocation{};
}

}  // namespace depot
