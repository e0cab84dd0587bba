// GPU objects end to end: a real depotd, real clients, and GPUs of one of two kinds.
//
// This file builds twice. gpu_test runs it against simulated GPUs (depotd --simulate-gpus),
// where the protocol, pools, replicas, spilling and crash safety run exactly as with real
// GPUs and only the copies are memcpy; it runs everywhere, CI included. gpu_cuda_test
// (DEPOT_GPU_TEST_CUDA, ctest label gpu) runs the same tests against the CUDA GPUs of the
// host, and skips each one, saying so, on a host without any. Tests that need two GPUs say
// so when the host has one.
//
// Other client processes are gpu_test_client, run as programs: this process uses CUDA in
// gpu_cuda_test, and the driver does not survive fork.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "child_process.h"
#include "daemon.h"
#include "depot/client.h"
#include "device_memory.h"
#include "store_checks.h"
#include "test_support.h"

#ifndef DEPOT_GPU_CLIENT_PATH
#error "DEPOT_GPU_CLIENT_PATH must name gpu_test_client (set by tests/CMakeLists.txt)"
#endif

namespace depot::testing {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;
constexpr uint64_t kMiB = 1u << 20;

#ifdef DEPOT_GPU_TEST_CUDA
constexpr GpuKind kKind = GpuKind::kCuda;
#else
constexpr GpuKind kKind = GpuKind::kSimulated;
#endif

class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (kKind == GpuKind::kSimulated) {
      gpus_ = 2;
      return;
    }
    auto count = CudaDeviceCount();
    if (!count.ok()) GTEST_SKIP() << "no CUDA device: skipped (" << count.status().message() << ")";
    gpus_ = *count;
  }

  // GPU 0's pool takes 16 MiB in chunks of 8 MiB, so a few objects of 6 MiB fill it; GPU 1's
  // (on a host with two) takes 32 MiB. Simulated: two GPUs of 64 MiB.
  void StartDaemon() {
    std::vector<std::string> flags = {
        "--memory", "64MiB",        "--gpu-chunk-size",
        "8MiB",     "--gpu-memory", gpus_ >= 2 ? "0:16MiB,1:32MiB" : "0:16MiB"};
    if (kKind == GpuKind::kSimulated) {
      flags.insert(flags.end(), {"--simulate-gpus", "2:64MiB"});
    }
    daemon_.emplace(flags);
    ASSERT_TRUE(daemon_->ok()) << daemon_->error();
    auto client = Client::Connect(daemon_->socket_path());
    ASSERT_TRUE(client.ok()) << client.status().ToString();
    client_.emplace(std::move(*client));
  }

  // Why a test that needs two GPUs is skipped on a host with one.
  std::string NeedsTwoGpus() const { return "needs two GPUs; this host has one"; }

  // Creates `id` on `device` filled with SeededBytes(size, seed), seals it, and drops it.
  void PutOnDevice(const ObjectId& id, uint64_t size, int device, uint64_t seed,
                   std::string_view metadata = {}) {
    CreateOptions options;
    options.metadata = AsBytes(metadata);
    ASSERT_OK_AND_ASSIGN(MutableDeviceBuffer buffer,
                         client_->CreateOnDevice(id, size, device, options));
    ASSERT_EQ(buffer.simulated(), kKind == GpuKind::kSimulated);
    ASSERT_EQ(buffer.size(), size);
    ASSERT_OK(CopyToDevice(kKind, device, buffer.device_ptr(), SeededBytes(size, seed)));
    // CopyToDevice returns once its copy is complete: no stream to wait for.
    ASSERT_OK(client_->Seal(id));
  }

  void TearDown() override {
    if (client_ && !HasFatalFailure()) ExpectObjectsOnHostMatchTheList(*client_);
  }

  StoreStatus Stats() {
    auto status = client_->GetStatus();
    EXPECT_TRUE(status.ok()) << status.status().ToString();
    return status.ok() ? *status : StoreStatus{};
  }

  // Whether the device memory of `buffer` holds SeededBytes(size, seed).
  static bool SameBytes(const DeviceBuffer& buffer, uint64_t seed) {
    auto bytes = CopyFromDevice(kKind, buffer.device(), buffer.device_ptr(), buffer.size());
    EXPECT_TRUE(bytes.ok()) << bytes.status().ToString();
    return bytes.ok() && *bytes == SeededBytes(buffer.size(), seed);
  }

  // gpu_test_client's arguments up to its command's own.
  std::vector<std::string> ClientCommand(const std::string& command) const {
    return {DEPOT_GPU_CLIENT_PATH, std::string(kKind == GpuKind::kCuda ? "cuda" : "simulated"),
            command, daemon_->socket_path()};
  }

  int gpus_ = 0;
  std::optional<TestDaemon> daemon_;
  std::optional<Client> client_;
};

// The fixture is named for the kind of GPU, so ctest tells the two builds' tests apart.
#ifdef DEPOT_GPU_TEST_CUDA
class CudaGpuTest : public GpuTest {};
#define GPU_TEST(name) TEST_F(CudaGpuTest, name)
#else
class SimulatedGpuTest : public GpuTest {};
#define GPU_TEST(name) TEST_F(SimulatedGpuTest, name)
#endif

GPU_TEST(StatusNamesTheGpusAndTheirPools) {
  StartDaemon();
  ASSERT_OK_AND_ASSIGN(std::vector<GpuInfo> gpus, client_->Gpus());
  ASSERT_EQ(gpus.size(), static_cast<size_t>(gpus_));
  EXPECT_EQ(gpus[0].ordinal, 0);
  EXPECT_EQ(gpus[0].limit_bytes, 16 * kMiB);
  if (kKind == GpuKind::kSimulated) {
    EXPECT_EQ(gpus[0].name, "simulated GPU 0");
    EXPECT_TRUE(gpus[0].simulated);
    EXPECT_EQ(gpus[0].total_bytes, 64 * kMiB);
    EXPECT_EQ(Stats().gpu_backend, "simulated");
  } else {
    EXPECT_FALSE(gpus[0].simulated);
    EXPECT_EQ(gpus[0].name.find("simulated"), std::string::npos) << gpus[0].name;
    EXPECT_GT(gpus[0].total_bytes, gpus[0].limit_bytes);
    EXPECT_EQ(Stats().gpu_backend, "cuda");
  }
  if (gpus_ >= 2) {
    EXPECT_EQ(gpus[1].ordinal, 1);
    EXPECT_EQ(gpus[1].limit_bytes, 32 * kMiB);
  }
}

GPU_TEST(HostArenaIsPageLockedForCudaCopiesOnly) {
  StartDaemon();
  // A worker page-locks each segment once its pages are allocated.
  const auto deadline = Clock::now() + milliseconds(10'000);
  StoreStatus status = Stats();
  while (kKind == GpuKind::kCuda && status.arena_page_locked_bytes < status.mapped_bytes &&
         Clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(20));
    status = Stats();
  }
  // Simulated GPUs copy with memcpy: nothing to page-lock for.
  EXPECT_EQ(status.arena_page_locked_bytes, kKind == GpuKind::kCuda ? status.mapped_bytes : 0u)
      << daemon_->Log();
  EXPECT_EQ(daemon_->Log().find("is not page-locked"), std::string::npos) << daemon_->Log();
}

GPU_TEST(AnotherProcessGetsTheGpuObjectWithItsBytesAndMetadata) {
  StartDaemon();
  PutOnDevice(ObjectId::FromName("gpu/shared"), kMiB, 0, 7, "float32[262144]");
  std::vector<std::string> argv = ClientCommand("get");
  argv.insert(argv.end(), {"gpu/shared", "0", std::to_string(kMiB), "7", "float32[262144]"});
  const ProgramRun run = RunProgram(argv);
  EXPECT_EQ(run.exit_code, 0) << run.Explain();
}

GPU_TEST(ClientsOfOneProcessShareEachChunkMapping) {
  StartDaemon();
  const ObjectId id = ObjectId::FromName("gpu/two-clients");
  PutOnDevice(id, kMiB, 0, 21);
  std::optional<Client> second;
  {
    auto connected = Client::Connect(daemon_->socket_path());
    ASSERT_TRUE(connected.ok()) << connected.status().ToString();
    second.emplace(std::move(*connected));
  }
  ASSERT_OK_AND_ASSIGN(DeviceBuffer mine, client_->GetOnDevice(id, 0));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer theirs, second->GetOnDevice(id, 0));
  // The second connection found the chunk mapped by the first: the same address, no import.
  EXPECT_EQ(theirs.device_ptr(), mine.device_ptr());
  // The mapping lives as long as either connection needs it: here the second one's.
  mine = DeviceBuffer();
  client_.reset();
  EXPECT_TRUE(SameBytes(theirs, 21));
}

GPU_TEST(GetOnHostMakesAHostReplicaWithTheSameBytes) {
  StartDaemon();
  const ObjectId id = ObjectId::FromName("gpu/to-host");
  PutOnDevice(id, 3 * kMiB + 100, 0, 11, "meta");
  ASSERT_OK_AND_ASSIGN(Buffer on_host, client_->Get(id));
  const auto expected = SeededBytes(3 * kMiB + 100, 11);
  ASSERT_EQ(on_host.size(), expected.size());
  EXPECT_EQ(std::memcmp(on_host.ptr(), expected.data(), expected.size()), 0);
  EXPECT_EQ(std::string_view(reinterpret_cast<const char*>(on_host.metadata().data()),
                             on_host.metadata().size()),
            "meta");
  ASSERT_OK_AND_ASSIGN(ObjectDetails details, client_->Describe(id));
  ASSERT_EQ(details.replicas.size(), 2u);
  EXPECT_EQ(details.replicas[0].device, -1);
  EXPECT_EQ(details.replicas[0].references, 1u);
  EXPECT_EQ(details.replicas[1].device, 0);
  EXPECT_EQ(Stats().replicas_made, 1u);
}

GPU_TEST(AGetOfSeveralIdsReportsTheOneWhoseCopyToHostFindsNoRoom) {
  StartDaemon();
  const ObjectId on_gpu = ObjectId::FromName("gpu/no-room-on-host");
  PutOnDevice(on_gpu, 6 * kMiB, 0, 12);
  const ObjectId on_host = ObjectId::FromName("gpu/small-on-host");
  ASSERT_OK(client_->Put(on_host, SeededBytes(4096, 13)));
  ASSERT_OK_AND_ASSIGN(Buffer kept, client_->Get(on_host));  // not evicted by what follows
  // Host memory full of objects this client holds: nothing can be evicted to make room.
  std::vector<MutableBuffer> filler;
  for (int i = 0; i < 64; ++i) {
    auto made = client_->Create(ObjectId::FromName("gpu/filler/" + std::to_string(i)), 4 * kMiB);
    if (!made.ok()) break;
    filler.push_back(std::move(*made));
  }
  ASSERT_FALSE(filler.empty());
  const std::vector<ObjectId> ids = {on_host, on_gpu};
  auto got = client_->Get(ids);
  ASSERT_FALSE(got.ok()) << "a failed copy to host memory looked like an object not sealed yet";
  EXPECT_EQ(got.status().code(), StatusCode::kOutOfMemory) << got.status().ToString();
  EXPECT_NE(got.status().message().find(on_gpu.Hex()), std::string::npos)
      << got.status().ToString();
  // Once there is room (dropping unsealed objects aborts them; the releases go out ahead of
  // the next request), the same get has both.
  filler.clear();
  ASSERT_OK_AND_ASSIGN(auto both, client_->Get(ids));
  ASSERT_EQ(both.size(), 2u);
  EXPECT_TRUE(both[0]) << "the object in host memory";
  EXPECT_TRUE(both[1]) << "the object on the GPU";
}

GPU_TEST(AGetOnAGpuOfSeveralIdsReportsTheOneWhoseCopyThereFindsNoRoom) {
  StartDaemon();
  const ObjectId small = ObjectId::FromName("gpu/small-on-gpu");
  PutOnDevice(small, 4096, 0, 21);
  const ObjectId big = ObjectId::FromName("gpu/big-on-host");
  ASSERT_OK(client_->Put(big, SeededBytes(6 * kMiB, 22)));
  // GPU 0's pool full of objects this client is creating: nothing there can make room.
  std::vector<MutableDeviceBuffer> filler;
  for (int i = 0; i < 2; ++i) {
    ASSERT_OK_AND_ASSIGN(filler.emplace_back(),
                         client_->CreateOnDevice(
                             ObjectId::FromName("gpu/filler/" + std::to_string(i)), 6 * kMiB, 0));
  }
  // As Get reports a failed copy to host memory: the error of that object, naming it and
  // the tier, not an empty entry.
  const std::vector<ObjectId> ids = {small, big};
  auto got = client_->GetOnDevice(ids, 0);
  ASSERT_FALSE(got.ok()) << "a failed copy to the GPU looked like an object not sealed yet";
  EXPECT_EQ(got.status().code(), StatusCode::kOutOfMemory) << got.status().ToString();
  EXPECT_NE(got.status().message().find(big.Hex() + " on GPU 0"), std::string::npos)
      << got.status().ToString();
  EXPECT_STATUS(client_->GetOnDevice(big, 0).status(), StatusCode::kOutOfMemory);
  // Once there is room (dropping unsealed objects aborts them), the same get has both.
  filler.clear();
  ASSERT_OK_AND_ASSIGN(auto both, client_->GetOnDevice(ids, 0));
  ASSERT_EQ(both.size(), 2u);
  ASSERT_TRUE(both[0]) << "the object already on the GPU";
  ASSERT_TRUE(both[1]) << "the object copied there";
  EXPECT_TRUE(SameBytes(both[0], 21));
  EXPECT_TRUE(SameBytes(both[1], 22));
}

GPU_TEST(MissingAndLateObjectsAreNotThereAlikeInHostMemoryAndOnAGpu) {
  StartDaemon();
  const ObjectId missing = ObjectId::FromName("gpu/missing");
  const auto late = std::chrono::milliseconds(20);
  EXPECT_STATUS(client_->Get(missing).status(), StatusCode::kNotFound);
  EXPECT_STATUS(client_->GetOnDevice(missing, 0).status(), StatusCode::kNotFound);
  EXPECT_STATUS(client_->Get(missing, late).status(), StatusCode::kTimeout);
  EXPECT_STATUS(client_->GetOnDevice(missing, 0, late).status(), StatusCode::kTimeout);
  const ObjectId present = ObjectId::FromName("gpu/present");
  PutOnDevice(present, 4096, 0, 23);
  const std::vector<ObjectId> ids = {present, missing};
  for (auto timeout : {std::chrono::milliseconds(0), late}) {
    ASSERT_OK_AND_ASSIGN(auto on_host, client_->Get(ids, timeout));
    ASSERT_OK_AND_ASSIGN(auto on_gpu, client_->GetOnDevice(ids, 0, timeout));
    ASSERT_EQ(on_host.size(), 2u);
    ASSERT_EQ(on_gpu.size(), 2u);
    EXPECT_TRUE(on_host[0] && on_gpu[0]);
    EXPECT_FALSE(on_host[1] || on_gpu[1]);
  }
}

GPU_TEST(DroppedBuffersOfBothTiersGoBackInOneQueue) {
  StartDaemon();
  std::vector<ObjectId> ids;
  for (uint64_t i = 0; i < 16; ++i) {
    ids.push_back(ObjectId::FromName("gpu/queued/" + std::to_string(i)));
    PutOnDevice(ids.back(), 4096, 0, i);
  }
  const auto releases = [&]() -> uint64_t {
    auto metrics = client_->Metrics();
    EXPECT_TRUE(metrics.ok()) << metrics.status().ToString();
    const std::string key = "depot_requests_total{type=\"release\"} ";
    const size_t at = metrics.ok() ? metrics->find(key) : std::string::npos;
    EXPECT_NE(at, std::string::npos);
    return at == std::string::npos ? 0 : std::stoull(metrics->substr(at + key.size()));
  };
  const uint64_t before = releases();  // the creators' releases went ahead of it
  {
    ASSERT_OK_AND_ASSIGN(auto on_gpu, client_->GetOnDevice(ids, 0));
    ASSERT_OK_AND_ASSIGN(auto on_host, client_->Get(ids));
  }
  // 32 references, host and GPU, in one release frame ahead of the next request (two if
  // the flusher's round ended while they were being dropped).
  const uint64_t sent = releases() - before;
  EXPECT_GE(sent, 1u);
  EXPECT_LE(sent, 2u);
  for (const ObjectId& id : ids) {
    ASSERT_OK_AND_ASSIGN(ObjectDetails details, client_->Describe(id));
    EXPECT_TRUE(details.holders.empty()) << id.Hex() << " is still held";
  }
}

GPU_TEST(PrefetchMakesTheCopyAheadSoTheGetMakesNone) {
  StartDaemon();
  const ObjectId id = ObjectId::FromName("gpu/prefetched");
  PutOnDevice(id, 2 * kMiB, 0, 21);  // on GPU 0 only
  ASSERT_OK(client_->Prefetch(std::span(&id, 1), Client::kHostMemory));
  const uint64_t made = Stats().replicas_made;
  EXPECT_EQ(made, 1u);
  ASSERT_OK_AND_ASSIGN(ObjectDetails details, client_->Describe(id));
  ASSERT_EQ(details.replicas.size(), 2u);
  EXPECT_EQ(details.replicas[0].device, -1);
  EXPECT_EQ(details.replicas[0].references, 0u) << "a prefetch holds nothing";
  ASSERT_OK_AND_ASSIGN(Buffer on_host, client_->Get(id));
  EXPECT_EQ(Stats().replicas_made, made) << "the get made a copy after all";
  const auto expected = SeededBytes(2 * kMiB, 21);
  EXPECT_EQ(std::memcmp(on_host.ptr(), expected.data(), expected.size()), 0);
  if (gpus_ >= 2) {
    ASSERT_OK(client_->Prefetch(std::span(&id, 1), 1));
    EXPECT_EQ(Stats().replicas_made, made + 1);
    ASSERT_OK_AND_ASSIGN(DeviceBuffer on1, client_->GetOnDevice(id, 1));
    EXPECT_EQ(Stats().replicas_made, made + 1) << "the get on GPU 1 made a copy after all";
    EXPECT_TRUE(SameBytes(on1, 21));
  }
  // An object that does not exist is named; the others are still copied.
  const ObjectId missing = ObjectId::FromName("gpu/never-put");
  const ObjectId host_only = ObjectId::FromName("gpu/prefetch-from-host");
  ASSERT_OK(client_->Put(host_only, SeededBytes(4096, 22)));
  const std::vector<ObjectId> both = {missing, host_only};
  Status st = client_->Prefetch(both, 0);
  EXPECT_EQ(st.code(), StatusCode::kNotFound) << st.ToString();
  EXPECT_NE(st.message().find(missing.Hex()), std::string::npos) << st.ToString();
  ASSERT_OK_AND_ASSIGN(ObjectDetails copied, client_->Describe(host_only));
  EXPECT_EQ(copied.info.gpus, std::vector<uint32_t>{0});
  EXPECT_EQ(client_->Prefetch(std::span(&id, 1), 7).code(), StatusCode::kInvalidArgument);
}

GPU_TEST(LocateSaysWhereObjectsAreAndAsksTheDaemonOnlyForThoseNotHeld) {
  StartDaemon();
  const ObjectId on_host = ObjectId::FromName("gpu/locate-host");
  const ObjectId on_gpu = ObjectId::FromName("gpu/locate-gpu");
  const ObjectId missing = ObjectId::FromName("gpu/locate-missing");
  const std::string meta = "meta";
  ASSERT_OK(
      client_->Put(on_host, SeededBytes(4096, 31), {.metadata = std::as_bytes(std::span(meta))}));
  PutOnDevice(on_gpu, 2 * kMiB, 0, 32);
  ASSERT_OK_AND_ASSIGN(Buffer held, client_->Get(on_host));

  // Held: read from the header table. The status calls around it are the only requests.
  const uint64_t before = Stats().requests;
  ASSERT_OK_AND_ASSIGN(auto local, client_->Locate(std::span(&on_host, 1)));
  EXPECT_EQ(Stats().requests, before + 1) << "a locate of a held object asked the daemon";
  ASSERT_EQ(local.size(), 1u);
  EXPECT_TRUE(local[0].found);
  EXPECT_TRUE(local[0].on_host);
  EXPECT_TRUE(local[0].gpus.empty());
  EXPECT_EQ(local[0].data_size, 4096u);
  EXPECT_EQ(local[0].metadata_size, 4u);

  // Not held: one request answers them all.
  const std::vector<ObjectId> ids = {on_gpu, missing, on_host};
  ASSERT_OK_AND_ASSIGN(auto where, client_->Locate(ids));
  ASSERT_EQ(where.size(), 3u);
  EXPECT_EQ(where[0].id, on_gpu);
  EXPECT_TRUE(where[0].found);
  EXPECT_FALSE(where[0].on_host);
  EXPECT_EQ(where[0].gpus, std::vector<int>{0});
  EXPECT_EQ(where[0].data_size, 2 * kMiB);
  EXPECT_FALSE(where[1].found);
  EXPECT_TRUE(where[2].on_host);

  // A copy to host memory shows at once, held or not.
  ASSERT_OK(client_->Prefetch(std::span(&on_gpu, 1), Client::kHostMemory));
  ASSERT_OK_AND_ASSIGN(where, client_->Locate(std::span(&on_gpu, 1)));
  EXPECT_TRUE(where[0].on_host);
  EXPECT_EQ(where[0].gpus, std::vector<int>{0});
  ASSERT_OK_AND_ASSIGN(Buffer copy, client_->Get(on_gpu));
  ASSERT_OK(client_->Prefetch(std::span(&on_host, 1), 0));
  ASSERT_OK_AND_ASSIGN(local, client_->Locate(std::span(&on_host, 1)));
  EXPECT_EQ(local[0].gpus, std::vector<int>{0}) << "the header table did not show the new copy";
}

GPU_TEST(GetOnAnotherGpuMakesAReplicaWithTheSameBytes) {
  if (gpus_ < 2) GTEST_SKIP() << NeedsTwoGpus();
  StartDaemon();
  const ObjectId id = ObjectId::FromName("gpu/replicated");
  PutOnDevice(id, 3 * kMiB + 100, 0, 11, "meta");
  ASSERT_OK_AND_ASSIGN(DeviceBuffer on1, client_->GetOnDevice(id, 1));
  EXPECT_EQ(on1.device(), 1);
  EXPECT_TRUE(SameBytes(on1, 11));
  EXPECT_EQ(on1.metadata().size(), 4u);
  ASSERT_OK_AND_ASSIGN(ObjectDetails details, client_->Describe(id));
  ASSERT_EQ(details.replicas.size(), 2u);
  EXPECT_EQ(details.replicas[0].device, 0);
  EXPECT_EQ(details.replicas[1].device, 1);
  EXPECT_EQ(details.replicas[1].references, 1u);
  EXPECT_EQ(Stats().replicas_made, 1u);
}

GPU_TEST(HostObjectGoesToAGpuOnGet) {
  StartDaemon();
  const ObjectId id = ObjectId::FromName("gpu/from-host");
  ASSERT_OK(client_->Put(id, SeededBytes(2 * kMiB, 3), {.metadata = AsBytes("m")}));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer on0, client_->GetOnDevice(id, 0));
  EXPECT_TRUE(SameBytes(on0, 3));
  EXPECT_EQ(on0.metadata().size(), 1u);
}

GPU_TEST(FullPoolSpillsTheLeastRecentlyUsedObjectAndGetBringsItBack) {
  StartDaemon();
  const ObjectId a = ObjectId::FromName("gpu/a"), b = ObjectId::FromName("gpu/b"),
                 c = ObjectId::FromName("gpu/c");
  PutOnDevice(a, 6 * kMiB, 0, 1);
  PutOnDevice(b, 6 * kMiB, 0, 2);
  // 16 MiB pool in 8 MiB chunks: one 6 MiB object per chunk, so c needs a's or b's room.
  PutOnDevice(c, 6 * kMiB, 0, 3);
  StoreStatus status = Stats();
  EXPECT_EQ(status.spills, 1u);
  EXPECT_EQ(status.spilled_bytes, 6 * kMiB);
  ASSERT_OK_AND_ASSIGN(ObjectDetails spilled, client_->Describe(a));
  ASSERT_EQ(spilled.replicas.size(), 1u);
  EXPECT_EQ(spilled.replicas[0].device, -1) << "a, least recently used, went to host memory";
  EXPECT_TRUE(spilled.info.on_host);
  // Its id stays valid: a get on the GPU brings it back (spilling b to make room).
  ASSERT_OK_AND_ASSIGN(DeviceBuffer back, client_->GetOnDevice(a, 0));
  EXPECT_TRUE(SameBytes(back, 1));
  EXPECT_EQ(Stats().spills, 2u);
  ASSERT_OK_AND_ASSIGN(Buffer b_on_host, client_->Get(b));
  const auto expected = SeededBytes(6 * kMiB, 2);
  EXPECT_EQ(std::memcmp(b_on_host.ptr(), expected.data(), expected.size()), 0);
}

GPU_TEST(ExtraReplicasAreDroppedBeforeAnythingSpills) {
  StartDaemon();
  const ObjectId a = ObjectId::FromName("gpu/extra-a"), b = ObjectId::FromName("gpu/extra-b"),
                 c = ObjectId::FromName("gpu/extra-c");
  PutOnDevice(b, 6 * kMiB, 0, 2);
  ASSERT_OK(client_->Put(a, SeededBytes(6 * kMiB, 1)));
  { ASSERT_OK_AND_ASSIGN(DeviceBuffer copy, client_->GetOnDevice(a, 0)); }  // an extra copy
  ASSERT_OK(client_->GetStatus().status());  // the release goes ahead of this request
  PutOnDevice(c, 6 * kMiB, 0, 3);
  const StoreStatus status = Stats();
  EXPECT_EQ(status.replicas_dropped, 1u);
  EXPECT_EQ(status.spills, 0u) << "b must stay: a's GPU copy was an extra one";
}

GPU_TEST(HostPressureDropsTheHostCopyOfAGpuObjectBeforeEvictingAnything) {
  StartDaemon();  // a host arena of 64 MiB in segments of 16 MiB
  const ObjectId gpu_object = ObjectId::FromName("gpu/host-copy-dropped");
  PutOnDevice(gpu_object, 6 * kMiB, 0, 21);
  { ASSERT_OK_AND_ASSIGN(Buffer copy, client_->Get(gpu_object)); }  // a host copy, released
  ASSERT_OK_AND_ASSIGN(ObjectDetails before, client_->Describe(gpu_object));
  ASSERT_EQ(before.replicas.size(), 2u);
  // Five 3 MiB objects fill a segment: 20 fit in the arena, 18 beside the 6 MiB host copy.
  constexpr int kHostObjects = 19;
  for (int i = 0; i < kHostObjects; ++i) {
    const Status put = client_->Put(ObjectId::FromName("gpu/host-pressure/" + std::to_string(i)),
                                    SeededBytes(3 * kMiB, i));
    ASSERT_TRUE(put.ok()) << i << ": " << put.ToString();
  }
  const StoreStatus status = Stats();
  EXPECT_EQ(status.evictions, 0u) << "a host-only object went while a GPU object's copy stayed";
  EXPECT_EQ(status.objects_sealed, uint64_t{kHostObjects + 1});
  EXPECT_EQ(status.objects_on_host, uint64_t{kHostObjects});
  ASSERT_OK_AND_ASSIGN(ObjectDetails after, client_->Describe(gpu_object));
  ASSERT_EQ(after.replicas.size(), 1u);
  EXPECT_EQ(after.replicas[0].device, 0);
  ASSERT_OK_AND_ASSIGN(DeviceBuffer on0, client_->GetOnDevice(gpu_object, 0));
  EXPECT_TRUE(SameBytes(on0, 21));
}

GPU_TEST(PoolFullOfReferencedObjectsIsAClearOutOfMemory) {
  StartDaemon();
  ASSERT_OK_AND_ASSIGN(MutableDeviceBuffer a,
                       client_->CreateOnDevice(ObjectId::FromName("gpu/held-a"), 6 * kMiB, 0));
  ASSERT_OK_AND_ASSIGN(MutableDeviceBuffer b,
                       client_->CreateOnDevice(ObjectId::FromName("gpu/held-b"), 6 * kMiB, 0));
  auto c = client_->CreateOnDevice(ObjectId::FromName("gpu/held-c"), 6 * kMiB, 0);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kOutOfMemory);
  ASSERT_OK_AND_ASSIGN(std::vector<GpuInfo> gpus, client_->Gpus());
  EXPECT_NE(c.status().message().find(gpus[0].name), std::string::npos) << c.status().message();
  EXPECT_NE(c.status().message().find("--gpu-memory"), std::string::npos) << c.status().message();
  // Another GPU still has room.
  if (gpus_ >= 2) {
    EXPECT_OK(client_->CreateOnDevice(ObjectId::FromName("gpu/held-c"), 6 * kMiB, 1).status());
  }
}

GPU_TEST(KilledClientGivesBackItsGpuReferencesAndUnsealedObjects) {
  StartDaemon();
  const int other = gpus_ >= 2 ? 1 : 0;
  PutOnDevice(ObjectId::FromName("gpu/read-by-victim"), kMiB, other, 5);
  const ObjectId creating = ObjectId::FromName("gpu/created-by-victim");
  std::vector<std::string> argv = ClientCommand("hold");
  argv.insert(argv.end(), {"gpu/read-by-victim", std::to_string(other), "gpu/created-by-victim",
                           "0", std::to_string(2 * kMiB)});
  ReadyPipe ready;
  ChildProcess victim = ChildProcess::Start([&]() -> int {
    if (!ready.PassOnExec(3)) return ChildFailed(126, "cannot pass the ready pipe");
    std::vector<char*> args;
    for (std::string& arg : argv) args.push_back(arg.data());
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    return ChildFailed(127, "exec of " + argv[0] + " failed");
  });
  ASSERT_TRUE(ready.Wait(milliseconds(10'000))) << "the client process did not get ready";
  StoreStatus status = Stats();
  ASSERT_GT(status.gpus[0].held_bytes, 0u);
  ASSERT_GT(status.gpus[other].held_bytes, 0u);
  ASSERT_TRUE(victim.Kill(SIGKILL));
  const auto killed = Clock::now();
  const auto held = [&] {
    uint64_t bytes = 0;
    for (const GpuInfo& gpu : status.gpus) bytes += gpu.held_bytes;
    return bytes;
  };
  while ((held() != 0 || status.objects_creating != 0) &&
         Clock::now() - killed < milliseconds(5000)) {
    status = Stats();
  }
  EXPECT_EQ(held(), 0u);
  EXPECT_EQ(status.objects_creating, 0u);
  if (other != 0) {
    EXPECT_EQ(status.gpus[0].used_bytes, 0u) << "the unsealed object was aborted";
  }
  EXPECT_STATUS(client_->Describe(creating).status(), StatusCode::kNotFound);
  EXPECT_EQ(victim.Wait(), kSignalExitBase + SIGKILL);
}

GPU_TEST(MetricsCountBytesAndCopiesByTier) {
  StartDaemon();
  const ObjectId id = ObjectId::FromName("gpu/metered");
  PutOnDevice(id, kMiB, 0, 4, "meta");
  { ASSERT_OK_AND_ASSIGN(DeviceBuffer on0, client_->GetOnDevice(id, 0)); }
  { ASSERT_OK_AND_ASSIGN(Buffer on_host, client_->Get(id)); }
  ASSERT_OK_AND_ASSIGN(std::string metrics, client_->Metrics());
  const auto has = [&](const std::string& line) {
    return metrics.find("\n" + line + "\n") != std::string::npos;
  };
  EXPECT_TRUE(has("depot_capacity_bytes{tier=\"gpu0\"} " + std::to_string(16 * kMiB))) << metrics;
  // On a GPU the data is counted; the metadata stays in host memory.
  EXPECT_TRUE(has("depot_bytes_in_total{tier=\"gpu0\"} " + std::to_string(kMiB))) << metrics;
  EXPECT_TRUE(has("depot_bytes_out_total{tier=\"gpu0\"} " + std::to_string(kMiB))) << metrics;
  EXPECT_TRUE(has("depot_bytes_in_total{tier=\"host\"} 0")) << metrics;
  EXPECT_TRUE(has("depot_bytes_out_total{tier=\"host\"} " + std::to_string(kMiB + 4))) << metrics;
  EXPECT_TRUE(has("depot_replicas_total{event=\"made\"} 1")) << metrics;
  EXPECT_TRUE(has("depot_tier_objects{tier=\"gpu0\"} 1")) << metrics;
  EXPECT_TRUE(has("depot_tier_objects{tier=\"host\"} 1")) << metrics;
  EXPECT_TRUE(has("depot_spills_total 0")) << metrics;
}

GPU_TEST(BadGpuRequestsAreClearErrors) {
  StartDaemon();
  const ObjectId id = ObjectId::FromName("gpu/bad");
  auto no_such = client_->CreateOnDevice(id, 16, 5);
  ASSERT_FALSE(no_such.ok());
  EXPECT_EQ(no_such.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(no_such.status().message().find("GPU 5"), std::string::npos)
      << no_such.status().message();
  auto checksum = client_->CreateOnDevice(id, 16, 0, {.checksum = true});
  ASSERT_FALSE(checksum.ok());
  EXPECT_NE(checksum.status().message().find("checksum"), std::string::npos);
  auto too_big = client_->CreateOnDevice(id, 64 * kMiB, 0);
  ASSERT_FALSE(too_big.ok());
  EXPECT_NE(too_big.status().message().find("larger than the pool"), std::string::npos)
      << too_big.status().message();
  EXPECT_STATUS(client_->GetOnDevice(id, 0).status(), StatusCode::kNotFound);
  // The daemon and this client are fine afterwards.
  PutOnDevice(id, 16, 0, 9);
  ASSERT_OK_AND_ASSIGN(DeviceBuffer buffer, client_->GetOnDevice(id, 0));
  EXPECT_TRUE(SameBytes(buffer, 9));
}

#ifndef DEPOT_GPU_TEST_CUDA
// Daemons without GPUs, and bad GPU flags: the same on every host, so only in gpu_test.

TEST(NoGpuTest, DaemonWithoutGpusServesHostObjectsAndSaysWhyThereAreNone) {
  TestDaemon daemon({"--no-gpus"});
  ASSERT_TRUE(daemon.ok()) << daemon.error();
  ASSERT_OK_AND_ASSIGN(Client client, Client::Connect(daemon.socket_path()));
  ASSERT_OK_AND_ASSIGN(StoreStatus status, client.GetStatus());
  EXPECT_TRUE(status.gpus.empty());
  EXPECT_NE(status.gpu_backend.find("--no-gpus"), std::string::npos) << status.gpu_backend;
  const ObjectId id = ObjectId::FromName("gpu/host-only");
  ASSERT_OK(client.Put(id, AsBytes("still a store")));
  ASSERT_OK_AND_ASSIGN(Buffer buffer, client.Get(id));
  EXPECT_EQ(buffer.size(), 13u);
  auto created = client.CreateOnDevice(ObjectId::FromName("gpu/nowhere"), 16, 0);
  ASSERT_FALSE(created.ok());
  EXPECT_EQ(created.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(created.status().message().find("serves no GPUs"), std::string::npos)
      << created.status().message();
}

TEST(NoGpuTest, DefaultDaemonOnAHostWithoutADriverReportsZeroGpus) {
  // This is what depotd does on a machine without the NVIDIA driver: no GPUs, host objects
  // served. (On a machine with GPUs the CUDA backend serves them: skip.)
  TestDaemon daemon;
  ASSERT_TRUE(daemon.ok()) << daemon.error();
  ASSERT_OK_AND_ASSIGN(Client client, Client::Connect(daemon.socket_path()));
  ASSERT_OK_AND_ASSIGN(StoreStatus status, client.GetStatus());
  if (!status.gpus.empty()) GTEST_SKIP() << "this host has CUDA GPUs: nothing to check here";
  EXPECT_NE(status.gpu_backend.find("none"), std::string::npos) << status.gpu_backend;
  ASSERT_OK(client.Put(ObjectId::FromName("gpu/driverless"), AsBytes("ok")));
}

TEST(GpuFlagsTest, AReservedPoolIsMadeAtStartUpAndObjectsGoIntoIt) {
  TestDaemon daemon({"--simulate-gpus", "2:256MiB", "--gpu-memory", "200MiB", "--gpu-chunk-size",
                     "16MiB", "--gpu-reserve", "1:128MiB"});
  ASSERT_TRUE(daemon.ok()) << daemon.error();
  ASSERT_OK_AND_ASSIGN(Client client, Client::Connect(daemon.socket_path()));
  ASSERT_OK_AND_ASSIGN(StoreStatus before, client.GetStatus());
  ASSERT_EQ(before.gpus.size(), 2u);
  EXPECT_EQ(before.gpus[0].reserved_bytes, 0u) << "GPU 0 reserves nothing";
  EXPECT_EQ(before.gpus[1].chunks, 1u);
  EXPECT_EQ(before.gpus[1].reserved_bytes, 128u << 20);
  // 100 MiB, larger than a chunk (16 MiB): it goes into the reserved one, no chunk is added.
  ASSERT_OK_AND_ASSIGN(MutableDeviceBuffer put,
                       client.CreateOnDevice(ObjectId::FromName("gpu/reserved"), 100u << 20, 1));
  ASSERT_OK(client.Seal(ObjectId::FromName("gpu/reserved")));
  ASSERT_OK_AND_ASSIGN(StoreStatus after, client.GetStatus());
  EXPECT_EQ(after.gpus[1].chunks, 1u);
  EXPECT_EQ(after.gpus[1].reserved_bytes, 128u << 20);
}

TEST(GpuFlagsTest, BadGpuFlagsAreClearErrorsAtStartup) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty()) << dir.error();
  const std::string socket = dir.path() + "/depot.sock";
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--simulate-gpus", "zero"}, "--simulate-gpus 'zero'"},
      {{"--simulate-gpus", "64"}, "N from 1 to 63"},
      {{"--simulate-gpus", "2:lots"}, "--simulate-gpus"},
      {{"--simulate-gpus", "1:1KiB"}, "at least 2MiB"},
      {{"--simulate-gpus", "2", "--gpu-memory", "3:1GiB"}, "there is no GPU 3"},
      {{"--simulate-gpus", "2", "--gpu-memory", "0:150%"}, "percentage"},
      {{"--simulate-gpus", "2", "--gpu-memory", "x:1GiB"}, "DEVICE:SIZE"},
      {{"--simulate-gpus", "2", "--gpu-chunk-size", "big"}, "--gpu-chunk-size"},
      {{"--simulate-gpus", "2:64MiB", "--gpu-reserve", "1:63MiB"}, "more than its pool"},
      {{"--simulate-gpus", "2", "--gpu-reserve", "2:1GiB"}, "there is no GPU 2"},
      {{"--simulate-gpus", "2", "--gpu-reserve", "0:many"}, "--gpu-reserve"},
  };
  for (const auto& [flags, expected] : cases) {
    std::vector<std::string> argv = {DEPOT_DAEMON_PATH, "--socket", socket, "--memory", "16MiB"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    ProgramRun run = RunProgram(argv, {}, milliseconds(10'000));
    EXPECT_NE(run.exit_code, 0) << flags.back();
    EXPECT_NE(run.err.find(expected), std::string::npos) << run.Explain();
  }
}

#endif

}  // namespace
}  // namespace depot::testing
