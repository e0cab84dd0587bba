// GPU objects on simulated devices (depotd --simulate-gpus): the protocol, pools, replicas,
// spilling and crash safety run exactly as with real GPUs; only the copies are memcpy, and a
// "device pointer" is a host address the test can read and write. Real GPUs are exercised
// by cuda_driver_test (ctest label gpu).
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstring>
#include <optional>
#include <vector>

#include "child_process.h"
#include "daemon.h"
#include "depot/client.h"
#include "test_support.h"

namespace depot::testing {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;
constexpr uint64_t kMiB = 1u << 20;

std::byte* HostView(uint64_t device_ptr) { return reinterpret_cast<std::byte*>(device_ptr); }

class GpuTest : public ::testing::Test {
 protected:
  // Two simulated GPUs; GPU 0's pool takes 16 MiB in chunks of 8 MiB, so a few objects of
  // 6 MiB fill it.
  void StartDaemon(std::vector<std::string> extra = {}) {
    std::vector<std::string> flags = {"--memory",         "64MiB",        "--simulate-gpus",
                                      "2:64MiB",          "--gpu-memory", "0:16MiB,1:32MiB",
                                      "--gpu-chunk-size", "8MiB"};
    flags.insert(flags.end(), extra.begin(), extra.end());
    daemon_.emplace(flags);
    ASSERT_TRUE(daemon_->ok()) << daemon_->error();
    auto client = Client::Connect(daemon_->socket_path());
    ASSERT_TRUE(client.ok()) << client.status().ToString();
    client_.emplace(std::move(*client));
  }

  // Creates `id` on `device` filled with SeededBytes(size, seed), seals it, and drops it.
  void PutOnDevice(const ObjectId& id, uint64_t size, int device, uint64_t seed,
                   std::string_view metadata = {}) {
    CreateOptions options;
    options.metadata = AsBytes(metadata);
    ASSERT_OK_AND_ASSIGN(MutableDeviceBuffer buffer,
                         client_->CreateOnDevice(id, size, device, options));
    ASSERT_TRUE(buffer.simulated());
    ASSERT_EQ(buffer.size(), size);
    const auto bytes = SeededBytes(size, seed);
    std::memcpy(HostView(buffer.device_ptr()), bytes.data(), size);
    ASSERT_OK(client_->Seal(id, /*stream=*/0));
  }

  StoreStatus Stats() {
    auto status = client_->GetStatus();
    EXPECT_TRUE(status.ok()) << status.status().ToString();
    return status.ok() ? *status : StoreStatus{};
  }

  static bool SameBytes(uint64_t device_ptr, uint64_t size, uint64_t seed) {
    const auto expected = SeededBytes(size, seed);
    return std::memcmp(HostView(device_ptr), expected.data(), size) == 0;
  }

  std::optional<TestDaemon> daemon_;
  std::optional<Client> client_;
};

TEST_F(GpuTest, DaemonWithoutGpusServesHostObjectsAndSaysWhyThereAreNone) {
  daemon_.emplace(std::vector<std::string>{"--no-gpus"});
  ASSERT_TRUE(daemon_->ok()) << daemon_->error();
  ASSERT_OK_AND_ASSIGN(Client client, Client::Connect(daemon_->socket_path()));
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

TEST_F(GpuTest, DefaultDaemonOnAHostWithoutADriverReportsZeroGpus) {
  // This is what depotd does on a machine without the NVIDIA driver: no GPUs, host objects
  // served. (On a machine with GPUs the CUDA backend serves them: skip.)
  daemon_.emplace();
  ASSERT_TRUE(daemon_->ok()) << daemon_->error();
  ASSERT_OK_AND_ASSIGN(Client client, Client::Connect(daemon_->socket_path()));
  ASSERT_OK_AND_ASSIGN(StoreStatus status, client.GetStatus());
  if (!status.gpus.empty()) GTEST_SKIP() << "this host has CUDA GPUs: nothing to check here";
  EXPECT_NE(status.gpu_backend.find("none"), std::string::npos) << status.gpu_backend;
  ASSERT_OK(client.Put(ObjectId::FromName("gpu/driverless"), AsBytes("ok")));
}

TEST_F(GpuTest, StatusNamesSimulatedGpusAndTheirPools) {
  StartDaemon();
  ASSERT_OK_AND_ASSIGN(std::vector<GpuInfo> gpus, client_->Gpus());
  ASSERT_EQ(gpus.size(), 2u);
  EXPECT_EQ(gpus[0].name, "simulated GPU 0");
  EXPECT_TRUE(gpus[0].simulated);
  EXPECT_EQ(gpus[0].ordinal, 0);
  EXPECT_EQ(gpus[1].ordinal, 1);
  EXPECT_EQ(gpus[0].limit_bytes, 16 * kMiB);
  EXPECT_EQ(gpus[1].limit_bytes, 32 * kMiB);
  EXPECT_EQ(gpus[0].total_bytes, 64 * kMiB);
  EXPECT_EQ(Stats().gpu_backend, "simulated");
}

TEST_F(GpuTest, AnotherProcessGetsTheGpuObjectWithItsBytesAndMetadata) {
  StartDaemon();
  const ObjectId id = ObjectId::FromName("gpu/shared");
  PutOnDevice(id, kMiB, 0, 7, "float32[262144]");
  const std::string socket = daemon_->socket_path();
  const int code = RunInChild([&]() -> int {
    auto client = Client::Connect(socket);
    if (!client.ok()) return ChildFailed(2, client.status().ToString());
    auto buffer = client->GetOnDevice(id, 0);
    if (!buffer.ok()) return ChildFailed(3, buffer.status().ToString());
    if (buffer->size() != kMiB || buffer->device() != 0) return ChildFailed(4, "wrong size/device");
    if (!SameBytes(buffer->device_ptr(), kMiB, 7)) return ChildFailed(5, "bytes differ");
    const auto meta = buffer->metadata();
    if (std::string_view(reinterpret_cast<const char*>(meta.data()), meta.size()) !=
        "float32[262144]") {
      return ChildFailed(6, "metadata differs");
    }
    // A second get of the same object is answered from the chunk mapped already.
    auto again = client->GetOnDevice(id, 0);
    if (!again.ok() || again->device_ptr() != buffer->device_ptr()) return ChildFailed(7, "again");
    return 0;
  });
  EXPECT_EQ(code, 0);
}

TEST_F(GpuTest, GetOnAnotherGpuAndOnHostMakesReplicasWithTheSameBytes) {
  StartDaemon();
  const ObjectId id = ObjectId::FromName("gpu/replicated");
  PutOnDevice(id, 3 * kMiB + 100, 0, 11, "meta");
  ASSERT_OK_AND_ASSIGN(DeviceBuffer on1, client_->GetOnDevice(id, 1));
  EXPECT_EQ(on1.device(), 1);
  EXPECT_TRUE(SameBytes(on1.device_ptr(), 3 * kMiB + 100, 11));
  ASSERT_OK_AND_ASSIGN(Buffer on_host, client_->Get(id));
  const auto expected = SeededBytes(3 * kMiB + 100, 11);
  ASSERT_EQ(on_host.size(), expected.size());
  EXPECT_EQ(std::memcmp(on_host.ptr(), expected.data(), expected.size()), 0);
  EXPECT_EQ(std::string_view(reinterpret_cast<const char*>(on_host.metadata().data()),
                             on_host.metadata().size()),
            "meta");
  ASSERT_OK_AND_ASSIGN(ObjectDetails details, client_->Describe(id));
  ASSERT_EQ(details.replicas.size(), 3u);
  EXPECT_EQ(details.replicas[0].device, -1);
  EXPECT_EQ(details.replicas[1].device, 0);
  EXPECT_EQ(details.replicas[2].device, 1);
  EXPECT_EQ(details.replicas[2].references, 1u);
  EXPECT_EQ(Stats().replicas_made, 2u);
}

TEST_F(GpuTest, HostObjectGoesToAGpuOnGet) {
  StartDaemon();
  const ObjectId id = ObjectId::FromName("gpu/from-host");
  const auto bytes = SeededBytes(2 * kMiB, 3);
  ASSERT_OK(client_->Put(id, bytes, {.metadata = AsBytes("m")}));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer on0, client_->GetOnDevice(id, 0));
  EXPECT_TRUE(SameBytes(on0.device_ptr(), 2 * kMiB, 3));
  EXPECT_EQ(on0.metadata().size(), 1u);
}

TEST_F(GpuTest, FullPoolSpillsTheLeastRecentlyUsedObjectAndGetBringsItBack) {
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
  EXPECT_TRUE(SameBytes(back.device_ptr(), 6 * kMiB, 1));
  EXPECT_EQ(Stats().spills, 2u);
  ASSERT_OK_AND_ASSIGN(Buffer b_on_host, client_->Get(b));
  const auto expected = SeededBytes(6 * kMiB, 2);
  EXPECT_EQ(std::memcmp(b_on_host.ptr(), expected.data(), expected.size()), 0);
}

TEST_F(GpuTest, ExtraReplicasAreDroppedBeforeAnythingSpills) {
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

TEST_F(GpuTest, PoolFullOfReferencedObjectsIsAClearOutOfMemory) {
  StartDaemon();
  ASSERT_OK_AND_ASSIGN(MutableDeviceBuffer a,
                       client_->CreateOnDevice(ObjectId::FromName("gpu/held-a"), 6 * kMiB, 0));
  ASSERT_OK_AND_ASSIGN(MutableDeviceBuffer b,
                       client_->CreateOnDevice(ObjectId::FromName("gpu/held-b"), 6 * kMiB, 0));
  auto c = client_->CreateOnDevice(ObjectId::FromName("gpu/held-c"), 6 * kMiB, 0);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kOutOfMemory);
  EXPECT_NE(c.status().message().find("simulated GPU 0"), std::string::npos)
      << c.status().message();
  EXPECT_NE(c.status().message().find("--gpu-memory"), std::string::npos) << c.status().message();
  // GPU 1 still has room.
  EXPECT_OK(client_->CreateOnDevice(ObjectId::FromName("gpu/held-c"), 6 * kMiB, 1).status());
}

TEST_F(GpuTest, KilledClientGivesBackItsGpuReferencesAndUnsealedObjects) {
  StartDaemon();
  const ObjectId sealed = ObjectId::FromName("gpu/read-by-victim");
  PutOnDevice(sealed, kMiB, 1, 5);
  const ObjectId creating = ObjectId::FromName("gpu/created-by-victim");
  const std::string socket = daemon_->socket_path();
  ReadyPipe ready;
  ChildProcess victim = ChildProcess::Start([&]() -> int {
    auto client = Client::Connect(socket);
    if (!client.ok()) return ChildFailed(2, client.status().ToString());
    auto held = client->GetOnDevice(sealed, 1);
    if (!held.ok()) return ChildFailed(3, held.status().ToString());
    auto made = client->CreateOnDevice(creating, 2 * kMiB, 0);
    if (!made.ok()) return ChildFailed(4, made.status().ToString());
    ready.Signal();
    for (;;) ::pause();
  });
  ASSERT_TRUE(ready.Wait(milliseconds(10'000))) << "the client process did not get ready";
  StoreStatus status = Stats();
  ASSERT_GT(status.gpus[0].held_bytes, 0u);
  ASSERT_GT(status.gpus[1].held_bytes, 0u);
  ASSERT_TRUE(victim.Kill(SIGKILL));
  const auto killed = Clock::now();
  while ((status.gpus[0].held_bytes != 0 || status.gpus[1].held_bytes != 0 ||
          status.objects_creating != 0) &&
         Clock::now() - killed < milliseconds(5000)) {
    status = Stats();
  }
  EXPECT_EQ(status.gpus[0].held_bytes, 0u);
  EXPECT_EQ(status.gpus[1].held_bytes, 0u);
  EXPECT_EQ(status.objects_creating, 0u);
  EXPECT_EQ(status.gpus[0].used_bytes, 0u) << "the unsealed object was aborted";
  EXPECT_STATUS(client_->Describe(creating).status(), StatusCode::kNotFound);
  EXPECT_EQ(victim.Wait(), kSignalExitBase + SIGKILL);
}

TEST_F(GpuTest, BadGpuRequestsAreClearErrors) {
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
  EXPECT_TRUE(SameBytes(buffer.device_ptr(), 16, 9));
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
  };
  for (const auto& [flags, expected] : cases) {
    std::vector<std::string> argv = {DEPOT_DAEMON_PATH, "--socket", socket, "--memory", "16MiB"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    ProgramRun run = RunProgram(argv, {}, milliseconds(10'000));
    EXPECT_NE(run.exit_code, 0) << flags.back();
    EXPECT_NE(run.err.find(expected), std::string::npos) << run.Explain();
  }
}

}  // namespace
}  // namespace depot::testing
