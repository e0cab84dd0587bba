#include "store/header_table.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace depot::store {

Result<std::unique_ptr<HeaderTable>> HeaderTable::Create(uint32_t slots) {
  if (slots == 0) return Status::InvalidArgument("the header table needs at least one slot");
  std::unique_ptr<HeaderTable> table(new HeaderTable());
  HeaderTable& t = *table;
  t.fd_.reset(::memfd_create("depot-headers", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!t.fd_) return Status::FromErrno("memfd_create", errno);
  const size_t bytes = static_cast<size_t>(slots) * sizeof(ipc::ObjectHeader);
  if (::ftruncate(t.fd_.get(), static_cast<off_t>(bytes)) != 0) {
    return Status::FromErrno("ftruncate of the header table", errno);
  }
  // Clients may map it but never resize it.
  (void)::fcntl(t.fd_.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, t.fd_.get(), 0);
  if (p == MAP_FAILED) return Status::FromErrno("mmap of the header table", errno);
  t.headers_ = static_cast<ipc::ObjectHeader*>(p);
  t.slots_ = slots;
  return table;
}

HeaderTable::~HeaderTable() {
  if (headers_ != nullptr)
    ::munmap(headers_, static_cast<size_t>(slots_) * sizeof(ipc::ObjectHeader));
}

uint32_t HeaderTable::Acquire() {
  uint32_t slot;
  if (!free_.empty()) {
    slot = free_.back();
    free_.pop_back();
  } else if (high_water_ < slots_) {
    slot = high_water_++;
  } else {
    return kNoSlot;
  }
  ipc::ObjectHeader& h = headers_[slot];
  const uint32_t generation = h.generation + 1;
  h.id_lo = h.id_hi = 0;
  h.data_size = h.metadata_size = h.offset = h.checksum = 0;
  h.segment = 0;
  h.flags.store(0, std::memory_order_relaxed);
  h.create_time_ns = h.access_time_ns = 0;
  h.generation = generation;
  return slot;
}

void HeaderTable::Release(uint32_t slot) {
  SetStateRefs(slot, ipc::ObjectState::kFree, 0);
  free_.push_back(slot);
}

}  // namespace depot::store
