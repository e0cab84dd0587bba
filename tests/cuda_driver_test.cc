// The CUDA driver loader, the CUDA device backend and the CUDA importer.
//
// On a host without an NVIDIA driver (or without a GPU) these check that everything fails
// cleanly, with messages that say why. The CudaGpu tests need a GPU and say plainly that they
// were skipped without one. The import test maps a chunk in another process, which must not
// inherit the CUDA state of this one (the driver does not survive fork): that process, the
// import helper, is forked before any test runs, so before this process initialises CUDA,
// and it receives the chunk's descriptor over a socket as a client would.
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "child_process.h"
#include "depot/ipc/cuda_driver.h"
#include "depot/ipc/framing.h"
#include "depot/ipc/gpu.h"
#include "depot/ipc/units.h"
#include "device_import.h"
#include "store/copy_probe.h"
#include "store/gpu/device_backend.h"
#include "test_support.h"

namespace depot {
namespace {

using ipc::CudaDriver;
using ipc::UniqueFd;
using store::gpu::Chunk;
using store::gpu::DeviceBackend;
using store::gpu::LoadCudaBackend;

// Sets an environment variable for its lifetime, then restores the previous value.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    ::setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_.c_str(), old_->c_str(), 1);
    } else {
      ::unsetenv(name_.c_str());
    }
  }

 private:
  std::string name_;
  std::optional<std::string> old_;
};

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// --- The import helper: another process that imports chunks as a client does. -----------

struct ImportRequest {
  uint64_t size;
  uint64_t seed;  // the chunk holds testing::SeededBytes(size, seed)
  ipc::DeviceUuid device;
};

struct ImportReply {
  bool ok;
  double first_import_ms;  // includes creating the helper's primary context
  double next_import_ms;   // the same chunk again: the cost of one more chunk
  char message[512];
};

// One message of `size` bytes over a SOCK_SEQPACKET socket, with `fd` attached if >= 0.
bool SendMessage(int socket, const void* data, size_t size, int fd) {
  iovec iov{const_cast<void*>(data), size};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  if (fd >= 0) {
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    cmsghdr* header = CMSG_FIRSTHDR(&msg);
    header->cmsg_level = SOL_SOCKET;
    header->cmsg_type = SCM_RIGHTS;
    header->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(header), &fd, sizeof(int));
  }
  return ::sendmsg(socket, &msg, MSG_NOSIGNAL) == static_cast<ssize_t>(size);
}

// Receives one message into `data` (exactly `size` bytes) and the descriptor it carries, if
// any. False at end of stream or on error.
bool ReceiveMessage(int socket, void* data, size_t size, UniqueFd* fd) {
  iovec iov{data, size};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t n;
  do {
    n = ::recvmsg(socket, &msg, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  for (cmsghdr* h = CMSG_FIRSTHDR(&msg); h != nullptr; h = CMSG_NXTHDR(&msg, h)) {
    if (h->cmsg_level == SOL_SOCKET && h->cmsg_type == SCM_RIGHTS && fd != nullptr) {
      int received = -1;
      std::memcpy(&received, CMSG_DATA(h), sizeof(int));
      fd->reset(received);
    }
  }
  return n == static_cast<ssize_t>(size);
}

double MillisecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

// The helper's side of one request: import the chunk, read it back with the driver, and
// import it once more for the timing of a chunk after the first.
ImportReply ImportAndCheck(const ImportRequest& request, UniqueFd fd,
                           std::unique_ptr<internal::DeviceImporter>& importer) {
  ImportReply reply{};
  auto fail = [&](const std::string& what) {
    std::snprintf(reply.message, sizeof(reply.message), "%s", what.c_str());
    return reply;
  };
  if (!importer) {
    auto loaded = internal::LoadCudaImporter();
    if (!loaded.ok()) return fail("LoadCudaImporter: " + loaded.status().ToString());
    importer = std::move(loaded).value();
  }
  UniqueFd again(::dup(fd.get()));
  internal::ChunkToImport chunk;
  chunk.handle = ipc::ChunkHandle::kPosixFd;
  chunk.size = request.size;
  chunk.fd = std::move(fd);
  chunk.device = request.device;
  auto start = std::chrono::steady_clock::now();
  auto imported = importer->Import(std::move(chunk));
  reply.first_import_ms = MillisecondsSince(start);
  if (!imported.ok()) return fail("Import: " + imported.status().ToString());
  if ((*imported)->size() != request.size) return fail("the imported chunk has the wrong size");

  // Read the chunk back through this process's own mapping, on the device's primary
  // context (which the import retained, so retaining it here is cheap).
  const auto visible = importer->VisibleDevices();
  int ordinal = 0;
  while (ordinal < static_cast<int>(visible.size()) && visible[ordinal] != request.device) {
    ++ordinal;
  }
  const CudaDriver& d = **CudaDriver::Load();
  CUdevice device = 0;
  CUcontext context = nullptr;
  Status st = d.Check(d.DeviceGet(&device, ordinal), "cuDeviceGet");
  if (st.ok()) st = d.Check(d.DevicePrimaryCtxRetain(&context, device), "cuDevicePrimaryCtxRetain");
  if (!st.ok()) return fail(st.ToString());
  std::vector<std::byte> bytes(request.size);
  st = d.Check(d.CtxSetCurrent(context), "cuCtxSetCurrent");
  if (st.ok()) {
    st = d.Check(d.MemcpyDtoHAsync(bytes.data(), (*imported)->address(), bytes.size(), nullptr),
                 "cuMemcpyDtoHAsync");
  }
  if (st.ok()) st = d.Check(d.StreamSynchronize(nullptr), "cuStreamSynchronize");
  d.CtxSetCurrent(nullptr);
  d.DevicePrimaryCtxRelease(device);
  if (!st.ok()) return fail(st.ToString());
  if (!testing::SameBytes(bytes, testing::SeededBytes(request.size, request.seed))) {
    return fail("the imported chunk does not hold the bytes the daemon side wrote");
  }

  internal::ChunkToImport next;
  next.handle = ipc::ChunkHandle::kPosixFd;
  next.size = request.size;
  next.fd = std::move(again);
  next.device = request.device;
  start = std::chrono::steady_clock::now();
  auto imported_again = importer->Import(std::move(next));
  reply.next_import_ms = MillisecondsSince(start);
  if (!imported_again.ok()) return fail("second Import: " + imported_again.status().ToString());
  reply.ok = true;
  return reply;
}

// The helper process: serves requests until the test process closes the socket.
int ServeImports(int socket) {
  // Loaded on the first request, so CUDA is initialised here only when a test asks.
  std::unique_ptr<internal::DeviceImporter> importer;
  for (;;) {
    ImportRequest request{};
    UniqueFd fd;
    if (!ReceiveMessage(socket, &request, sizeof(request), &fd)) return 0;
    ImportReply reply{};
    if (fd) {
      reply = ImportAndCheck(request, std::move(fd), importer);
    } else {
      std::snprintf(reply.message, sizeof(reply.message), "the request came without a chunk");
    }
    if (!SendMessage(socket, &reply, sizeof(reply), -1)) return 1;
  }
}

class ImportHelper : public ::testing::Environment {
 public:
  void SetUp() override {
    int fds[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, fds), 0);
    UniqueFd ours(fds[0]);
    UniqueFd theirs(fds[1]);
    helper_ = testing::ChildProcess::Start([&] {
      ours.reset();  // so the helper sees end of stream when this process closes its end
      return ServeImports(theirs.get());
    });
    socket_ = std::move(ours);
  }
  void TearDown() override {
    socket_.reset();
    if (helper_.running()) {
      EXPECT_EQ(helper_.Wait(), 0) << "the import helper failed";
    }
  }

  // Has the helper import `chunk_fd` and check that it holds SeededBytes(size, seed).
  ImportReply Import(const ImportRequest& request, int chunk_fd) {
    ImportReply reply{};
    if (!SendMessage(socket_.get(), &request, sizeof(request), chunk_fd)) {
      std::snprintf(reply.message, sizeof(reply.message), "cannot reach the import helper");
      return reply;
    }
    pollfd p{socket_.get(), POLLIN, 0};
    if (::poll(&p, 1, 60'000) != 1 ||
        !ReceiveMessage(socket_.get(), &reply, sizeof(reply), nullptr)) {
      std::snprintf(reply.message, sizeof(reply.message), "no reply from the import helper");
    }
    return reply;
  }

 private:
  UniqueFd socket_;
  testing::ChildProcess helper_;
};

ImportHelper* const import_helper =
    static_cast<ImportHelper*>(::testing::AddGlobalTestEnvironment(new ImportHelper));

// --- Without a driver. -----------------------------------------------------------------

TEST(CudaDriver, LoadFailureNamesTheLibrary) {
  const char* path = "/nonexistent/depot-test/libcuda.so.1";
  ScopedEnv env("DEPOT_CUDA_LIBRARY", path);
  auto driver = CudaDriver::Load();
  if (driver.ok()) {
    GTEST_SKIP() << "a CUDA driver was loaded earlier in this process, and stays loaded: "
                    "run this test on its own";
  }
  EXPECT_EQ(driver.status().code(), StatusCode::kIoError);
  EXPECT_TRUE(Contains(driver.status().message(), "cannot load the CUDA driver"))
      << driver.status().message();
  EXPECT_TRUE(Contains(driver.status().message(), path)) << driver.status().message();
  EXPECT_TRUE(Contains(driver.status().message(), "DEPOT_CUDA_LIBRARY"))
      << driver.status().message();
}

TEST(CudaDriver, LoadRejectsALibraryThatIsNotTheDriver) {
  ScopedEnv env("DEPOT_CUDA_LIBRARY", "libm.so.6");
  auto driver = CudaDriver::Load();
  if (driver.ok()) {
    GTEST_SKIP() << "a CUDA driver was loaded earlier in this process, and stays loaded: "
                    "run this test on its own";
  }
  EXPECT_TRUE(Contains(driver.status().message(), "libm.so.6 is not a CUDA driver"))
      << driver.status().message();
}

TEST(FormatUuid, PrintsTheNvidiaSmiForm) {
  ipc::DeviceUuid uuid;
  for (size_t i = 0; i < uuid.size(); ++i) uuid[i] = static_cast<uint8_t>(i * 17);
  EXPECT_EQ(ipc::FormatUuid(uuid), "GPU-00112233-4455-6677-8899-aabbccddeeff");
  uuid.fill(0);
  uuid[15] = 0xA5;
  EXPECT_EQ(ipc::FormatUuid(uuid), "GPU-00000000-0000-0000-0000-0000000000a5");
}

TEST(CudaBackend, WithoutAGpuHasNoDevicesAndSaysWhy) {
  std::string why;
  auto backend = LoadCudaBackend(&why);
  ASSERT_NE(backend, nullptr);
  if (!backend->devices().empty()) GTEST_SKIP() << "this host has a CUDA device";
  EXPECT_EQ(backend->kind(), "cuda");
  EXPECT_FALSE(why.empty());
  std::printf("LoadCudaBackend: %s\n", why.c_str());
  // A backend without devices refuses device work, and has nothing to pin host memory for.
  EXPECT_STATUS(backend->AllocateChunk(0, 2 << 20), StatusCode::kInvalidArgument);
  std::vector<std::byte> host(4096);
  EXPECT_OK(backend->RegisterHostMemory(host.data(), host.size()));
  backend->UnregisterHostMemory(host.data());
}

TEST(CudaImporter, WithoutAGpuFailsClearly) {
  auto importer = internal::LoadCudaImporter();
  if (importer.ok()) GTEST_SKIP() << "this host has a CUDA driver and device";
  const std::string message = importer.status().message();
  // "cannot load the CUDA driver (...)", or the driver's own error, e.g. from cuInit.
  EXPECT_TRUE(Contains(message, "CUDA")) << message;
}

// --- With a GPU. -----------------------------------------------------------------------

// Host memory registered with the backend, unregistered and unmapped on destruction.
class PinnedBuffer {
 public:
  PinnedBuffer(DeviceBackend& backend, size_t size) : backend_(backend), size_(size) {
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return;
    data_ = static_cast<std::byte*>(p);
    registered_ = backend_.RegisterHostMemory(data_, size_);
  }
  ~PinnedBuffer() {
    if (data_ == nullptr) return;
    if (registered_.ok()) backend_.UnregisterHostMemory(data_);
    ::munmap(data_, size_);
  }
  std::byte* data() const { return data_; }
  std::span<std::byte> bytes() const { return {data_, size_}; }
  // OK once mapped and registered.
  Status status() const { return data_ ? registered_ : Status::IoError("mmap failed"); }

 private:
  DeviceBackend& backend_;
  size_t size_;
  std::byte* data_ = nullptr;
  Status registered_;
};

// A chunk freed on destruction.
class OwnedChunk {
 public:
  OwnedChunk(DeviceBackend& backend, uint32_t device, Chunk chunk)
      : backend_(backend), device_(device), chunk_(std::move(chunk)) {}
  ~OwnedChunk() { backend_.FreeChunk(device_, chunk_); }
  const Chunk* operator->() const { return &chunk_; }

 private:
  DeviceBackend& backend_;
  uint32_t device_;
  Chunk chunk_;
};

class CudaGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    backend_ = LoadCudaBackend(&why_);
    if (backend_->devices().empty()) GTEST_SKIP() << "no CUDA device: skipped (" << why_ << ")";
    if (!why_.empty()) std::printf("LoadCudaBackend: %s\n", why_.c_str());
  }

  // At least `bytes`, rounded up to the device's granularity.
  uint64_t ChunkSize(uint32_t device, uint64_t bytes) const {
    const uint64_t g = backend_->devices()[device].granularity;
    return (bytes + g - 1) / g * g;
  }

  std::unique_ptr<OwnedChunk> Allocate(uint32_t device, uint64_t size) {
    auto chunk = backend_->AllocateChunk(device, size);
    EXPECT_TRUE(chunk.ok()) << chunk.status().ToString();
    if (!chunk.ok()) return nullptr;
    return std::make_unique<OwnedChunk>(*backend_, device, std::move(chunk).value());
  }

  std::string why_;
  std::unique_ptr<DeviceBackend> backend_;
};

TEST_F(CudaGpu, DescribesItsDevices) {
  for (const auto& device : backend_->devices()) {
    std::printf("%s: %s, %s, granularity %s\n", ipc::FormatUuid(device.uuid).c_str(),
                device.name.c_str(), ipc::FormatSize(device.total_bytes).c_str(),
                ipc::FormatSize(device.granularity).c_str());
    EXPECT_FALSE(device.simulated);
    EXPECT_FALSE(device.name.empty());
    EXPECT_GT(device.total_bytes, 0u);
    EXPECT_GT(device.granularity, 0u);
    EXPECT_NE(device.uuid, ipc::DeviceUuid{});
  }
}

TEST_F(CudaGpu, CopiesRoundTripThroughRegisteredHostMemory) {
  const uint64_t size = ChunkSize(0, 16 << 20);
  auto chunk = Allocate(0, size);
  ASSERT_NE(chunk, nullptr);
  EXPECT_EQ((*chunk)->size, size);
  EXPECT_NE((*chunk)->address, 0u);
  if ((*chunk)->handle == ipc::ChunkHandle::kPosixFd) {
    EXPECT_TRUE((*chunk)->fd);
  } else {
    EXPECT_EQ((*chunk)->ipc_handle.size(), 64u);
  }

  PinnedBuffer host(*backend_, size);
  ASSERT_OK(host.status());
  const auto pattern = testing::SeededBytes(size, 7);
  std::memcpy(host.data(), pattern.data(), size);
  ASSERT_OK(backend_->CopyFromHost(0, host.data(), (*chunk)->address, size));
  std::memset(host.data(), 0, size);
  ASSERT_OK(backend_->CopyToHost(0, (*chunk)->address, host.data(), size));
  EXPECT_TRUE(testing::SameBytes(host.bytes(), pattern));

  // A piece in the middle, at offsets an object could have.
  std::memset(host.data(), 0, size);
  ASSERT_OK(backend_->CopyToHost(0, (*chunk)->address + 4096 + 256, host.data(), 1000));
  EXPECT_TRUE(testing::SameBytes(host.bytes().subspan(0, 1000),
                                 std::span(pattern).subspan(4096 + 256, 1000)));
}

TEST_F(CudaGpu, CopiesFromSeveralThreadsAtOnce) {
  // As the daemon's worker threads do: each thread its own part of one chunk.
  constexpr int kThreads = 8;
  const uint64_t part = 2 << 20;
  const uint64_t size = ChunkSize(0, kThreads * part);
  auto chunk = Allocate(0, size);
  ASSERT_NE(chunk, nullptr);
  PinnedBuffer host(*backend_, size);
  ASSERT_OK(host.status());
  const auto pattern = testing::SeededBytes(kThreads * part, 23);
  std::memcpy(host.data(), pattern.data(), pattern.size());
  std::vector<Status> results(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const uint64_t offset = t * part;
      for (int round = 0; round < 4 && results[t].ok(); ++round) {
        results[t] =
            backend_->CopyFromHost(0, host.data() + offset, (*chunk)->address + offset, part);
        if (results[t].ok()) {
          results[t] =
              backend_->CopyToHost(0, (*chunk)->address + offset, host.data() + offset, part);
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (const Status& st : results) EXPECT_OK(st);
  EXPECT_TRUE(testing::SameBytes(host.bytes().subspan(0, pattern.size()), pattern));
}

TEST_F(CudaGpu, CopiesBetweenChunksOfOneDevice) {
  const uint64_t size = ChunkSize(0, 4 << 20);
  auto a = Allocate(0, size);
  auto b = Allocate(0, size);
  ASSERT_TRUE(a && b);
  PinnedBuffer host(*backend_, size);
  ASSERT_OK(host.status());
  const auto pattern = testing::SeededBytes(size, 11);
  std::memcpy(host.data(), pattern.data(), size);
  ASSERT_OK(backend_->CopyFromHost(0, host.data(), (*a)->address, size));
  ASSERT_OK(backend_->CopyBetweenDevices(0, (*a)->address, 0, (*b)->address, size));
  std::memset(host.data(), 0, size);
  ASSERT_OK(backend_->CopyToHost(0, (*b)->address, host.data(), size));
  EXPECT_TRUE(testing::SameBytes(host.bytes(), pattern));
}

TEST_F(CudaGpu, CopiesBetweenTwoDevices) {
  if (backend_->devices().size() < 2) GTEST_SKIP() << "one CUDA device: skipped";
  // Larger than two staging pieces, and not a multiple of one, so that a copy through host
  // memory goes round its buffer more than once and ends on a partial piece.
  const uint64_t bytes = (40 << 20) + 4096;
  const uint64_t size = std::max(ChunkSize(0, bytes), ChunkSize(1, bytes));
  auto a = Allocate(0, size);
  auto b = Allocate(1, size);
  ASSERT_TRUE(a && b);
  PinnedBuffer host(*backend_, size);
  ASSERT_OK(host.status());
  const auto pattern = testing::SeededBytes(bytes, 13);
  std::memcpy(host.data(), pattern.data(), bytes);
  ASSERT_OK(backend_->CopyFromHost(0, host.data(), (*a)->address, bytes));
  ASSERT_OK(backend_->CopyBetweenDevices(0, (*a)->address, 1, (*b)->address, bytes));
  std::memset(host.data(), 0, size);
  ASSERT_OK(backend_->CopyToHost(1, (*b)->address, host.data(), bytes));
  EXPECT_TRUE(testing::SameBytes(host.bytes().subspan(0, bytes), pattern));
}

// The daemon's start-up probe on real GPUs: page-locked copies over PCIe or NVLink run at
// gigabytes per second; a rate under 1 GB/s would mean host memory that is not page-locked,
// or a broken timing.
TEST_F(CudaGpu, TheStartUpProbeTimesCopiesAtGigabytesPerSecond) {
  ASSERT_OK_AND_ASSIGN(store::CopyRates rates, store::ProbeCopyRates(*backend_, 64 << 20));
  std::printf("host->GPU %s/s, GPU->host %s/s, GPU->GPU %s/s\n",
              ipc::FormatSize(static_cast<uint64_t>(rates.host_to_gpu)).c_str(),
              ipc::FormatSize(static_cast<uint64_t>(rates.gpu_to_host)).c_str(),
              ipc::FormatSize(static_cast<uint64_t>(rates.gpu_to_gpu)).c_str());
  EXPECT_GT(rates.host_to_gpu, 1e9);
  EXPECT_GT(rates.gpu_to_host, 1e9);
  if (backend_->devices().size() >= 2) {
    EXPECT_GT(rates.gpu_to_gpu, 1e9);
  }
}

TEST_F(CudaGpu, TooLargeAChunkIsOutOfMemory) {
  const auto& device = backend_->devices()[0];
  auto chunk = backend_->AllocateChunk(0, ChunkSize(0, 2 * device.total_bytes));
  ASSERT_FALSE(chunk.ok());
  EXPECT_EQ(chunk.status().code(), StatusCode::kOutOfMemory) << chunk.status().ToString();
  EXPECT_TRUE(Contains(chunk.status().message(), device.name)) << chunk.status().message();
  std::printf("%s\n", chunk.status().message().c_str());
}

TEST_F(CudaGpu, AChunkSizeOffTheGranularityIsRejected) {
  EXPECT_STATUS(backend_->AllocateChunk(0, backend_->devices()[0].granularity + 1),
                StatusCode::kInvalidArgument);
  EXPECT_STATUS(backend_->AllocateChunk(0, 0), StatusCode::kInvalidArgument);
}

TEST_F(CudaGpu, AnotherProcessImportsTheChunk) {
  const uint64_t size = ChunkSize(0, 64 << 20);
  auto chunk = Allocate(0, size);
  ASSERT_NE(chunk, nullptr);
  if ((*chunk)->handle != ipc::ChunkHandle::kPosixFd) {
    GTEST_SKIP() << "device 0 exports legacy IPC handles, not file descriptors: skipped";
  }
  const uint64_t seed = 17;
  {
    PinnedBuffer host(*backend_, size);
    ASSERT_OK(host.status());
    const auto pattern = testing::SeededBytes(size, seed);
    std::memcpy(host.data(), pattern.data(), size);
    ASSERT_OK(backend_->CopyFromHost(0, host.data(), (*chunk)->address, size));
  }
  ImportRequest request{size, seed, backend_->devices()[0].uuid};
  const ImportReply reply = import_helper->Import(request, (*chunk)->fd.get());
  ASSERT_TRUE(reply.ok) << reply.message;
  std::printf(
      "import of a %s chunk in another process: first %.2f ms (with its CUDA context), "
      "next %.3f ms\n",
      ipc::FormatSize(size).c_str(), reply.first_import_ms, reply.next_import_ms);
  RecordProperty("first_import_us", static_cast<int>(reply.first_import_ms * 1000));
  RecordProperty("next_import_us", static_cast<int>(reply.next_import_ms * 1000));
}

TEST_F(CudaGpu, TheImporterSeesTheBackendsDevices) {
  auto importer = internal::LoadCudaImporter();
  ASSERT_OK(importer);
  const auto visible = (*importer)->VisibleDevices();
  for (const auto& device : backend_->devices()) {
    EXPECT_NE(std::find(visible.begin(), visible.end(), device.uuid), visible.end())
        << ipc::FormatUuid(device.uuid);
  }
}

TEST_F(CudaGpu, SynchronizingTheDefaultStreamNeedsACurrentContext) {
  auto importer = internal::LoadCudaImporter();
  ASSERT_OK(importer);
  const CudaDriver& d = **CudaDriver::Load();
  // A fresh thread has no current context: its "default stream" is no stream at all.
  std::thread([&] {
    EXPECT_STATUS((*importer)->SynchronizeStream(0), StatusCode::kInvalidArgument);
    CUdevice device = 0;
    CUcontext context = nullptr;
    ASSERT_OK(d.Check(d.DeviceGet(&device, 0), "cuDeviceGet"));
    ASSERT_OK(d.Check(d.DevicePrimaryCtxRetain(&context, device), "cuDevicePrimaryCtxRetain"));
    ASSERT_OK(d.Check(d.CtxSetCurrent(context), "cuCtxSetCurrent"));
    EXPECT_OK((*importer)->SynchronizeStream(0));
    CUcontext current = nullptr;
    EXPECT_OK(d.Check(d.CtxGetCurrent(&current), "cuCtxGetCurrent"));
    EXPECT_EQ(current, context) << "SynchronizeStream changed the thread's current context";
    d.CtxSetCurrent(nullptr);
    d.DevicePrimaryCtxRelease(device);
  }).join();
}

TEST_F(CudaGpu, ImportFromAGpuThisProcessCannotSeeNamesIt) {
  auto importer = internal::LoadCudaImporter();
  ASSERT_OK(importer);
  ipc::DeviceUuid unknown;
  unknown.fill(0xee);
  internal::ChunkToImport chunk;
  chunk.handle = ipc::ChunkHandle::kPosixFd;
  chunk.size = backend_->devices()[0].granularity;
  chunk.device = unknown;
  auto imported = (*importer)->Import(std::move(chunk));
  ASSERT_FALSE(imported.ok());
  EXPECT_EQ(imported.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(imported.status().message(), ipc::FormatUuid(unknown)))
      << imported.status().message();
  EXPECT_TRUE(Contains(imported.status().message(), "cannot see")) << imported.status().message();
}

}  // namespace
}  // namespace depot
