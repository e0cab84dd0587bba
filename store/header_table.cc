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
  t.slots_ = slots;
  t.fd_.reset(::memfd_create("depot-headers", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!t.fd_) return Status::FromErrno("memfd_create", errno);
  if (::ftruncate(t.fd_.get(), static_cast<off_t>(t.bytes())) != 0) {
    return Status::FromErrno("ftruncate of the header table", errno);
  }
  void* shared = ::mmap(nullptr, t.bytes(), PROT_READ | PROT_WRITE, MAP_SHARED, t.fd_.get(), 0);
  if (shared == MAP_FAILED) return Status::FromErrno("mmap of the header table", errno);
  t.shared_ = static_cast<ipc::ObjectHeader*>(shared);
  // F_SEAL_FUTURE_WRITE keeps the mapping above writable and refuses every later writable
  // shared mapping, write() and mprotect to writable, through any descriptor of this file,
  // re-opened ones included. An O_RDONLY re-open alone would not do: a client could open
  // /proc/self/fd/N read-write again, since a memfd's inode allows it.
  if (::fcntl(t.fd_.get(), F_ADD_SEALS,
              F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL) != 0) {
    return Status::FromErrno("sealing the header table against writes (needs Linux 5.1)", errno);
  }
  void* own = ::mmap(nullptr, t.bytes(), PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (own == MAP_FAILED) return Status::FromErrno("mmap of the private header table", errno);
  t.private_ = static_cast<ipc::ObjectHeader*>(own);
  return table;
}

HeaderTable::~HeaderTable() {
  if (shared_ != nullptr) ::munmap(shared_, bytes());
  if (private_ != nullptr) ::munmap(private_, bytes());
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
  ipc::ObjectHeader& h = private_[slot];
  const uint32_t generation = h.generation.load(std::memory_order_relaxed) + 1;
  h.id_lo = h.id_hi = 0;
  h.data_size = h.metadata_size = h.offset = h.checksum = 0;
  h.segment = 0;
  h.flags.store(0, std::memory_order_relaxed);
  h.create_time_ns = h.access_time_ns = 0;
  h.generation.store(generation, std::memory_order_relaxed);
  h.tiers.store(0, std::memory_order_relaxed);
  return slot;
}

void HeaderTable::Release(uint32_t slot) {
  SetStateRefs(slot, ipc::ObjectState::kFree, 0);
  free_.push_back(slot);
}

void HeaderTable::Publish(uint32_t slot) {
  const ipc::ObjectHeader& from = private_[slot];
  ipc::ObjectHeader& to = shared_[slot];
  to.id_lo = from.id_lo;
  to.id_hi = from.id_hi;
  to.data_size = from.data_size;
  to.metadata_size = from.metadata_size;
  to.offset = from.offset;
  to.segment = from.segment;
  to.checksum = from.checksum;
  to.create_time_ns = from.create_time_ns;
  to.access_time_ns = from.access_time_ns;
  to.generation.store(from.generation.load(std::memory_order_relaxed), std::memory_order_relaxed);
  to.tiers.store(from.tiers.load(std::memory_order_relaxed), std::memory_order_release);
  // Sequentially consistent: a lease scan's reads (LeaseTableView::Holds) come after it.
  to.flags.store(from.flags.load(std::memory_order_relaxed), std::memory_order_seq_cst);
  to.state_refs.store(from.state_refs.load(std::memory_order_relaxed), std::memory_order_release);
}

}  // namespace depot::store
