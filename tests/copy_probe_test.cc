// The start-up probe of copy bandwidths, against simulated devices (whose copies are memcpy):
// what it times, what it cuts, and that it leaves no memory behind. On real GPUs it runs in
// cuda_driver_test (label gpu).
#include "store/copy_probe.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "test_support.h"

namespace depot::store {
namespace {

constexpr uint64_t kMiB = 1 << 20;

// This process's open descriptors and memory mappings.
size_t OpenDescriptors() {
  size_t n = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    ++n;
  }
  return n;
}
// Mappings of memfds (the probe's host memory, simulated chunks); a sanitizer's own mappings
// are anonymous.
size_t MemfdMappings() {
  std::ifstream maps("/proc/self/maps");
  size_t n = 0;
  for (std::string line; std::getline(maps, line);) {
    if (line.find("/memfd:") != std::string::npos) ++n;
  }
  return n;
}

TEST(CopyProbeTest, TimesCopiesBetweenHostMemoryAndEachGpuAndBetweenTwo) {
  auto backend = gpu::MakeSimulatedBackend(2, 64 * kMiB);
  ASSERT_OK_AND_ASSIGN(CopyRates rates, ProbeCopyRates(*backend, 64 * kMiB));
  EXPECT_GT(rates.host_to_gpu, 0);
  EXPECT_GT(rates.gpu_to_host, 0);
  EXPECT_GT(rates.gpu_to_gpu, 0);
}

TEST(CopyProbeTest, OneGpuHasNoRateBetweenGpus) {
  auto backend = gpu::MakeSimulatedBackend(1, 64 * kMiB);
  ASSERT_OK_AND_ASSIGN(CopyRates rates, ProbeCopyRates(*backend, 64 * kMiB));
  EXPECT_GT(rates.host_to_gpu, 0);
  EXPECT_GT(rates.gpu_to_host, 0);
  EXPECT_EQ(rates.gpu_to_gpu, 0) << "assumed until a copy between GPUs is measured";
}

TEST(CopyProbeTest, TimesNothingWhereAMebibyteIsMoreThanAnEighthOfAGpu) {
  auto backend = gpu::MakeSimulatedBackend(2, 6 * kMiB);
  ASSERT_OK_AND_ASSIGN(CopyRates rates, ProbeCopyRates(*backend, 64 * kMiB));
  EXPECT_EQ(rates.host_to_gpu, 0);
  EXPECT_EQ(rates.gpu_to_host, 0);
  EXPECT_EQ(rates.gpu_to_gpu, 0);
}

TEST(CopyProbeTest, TimesNothingWithoutGpusOrWithNoBytes) {
  auto none = gpu::MakeSimulatedBackend(0, 64 * kMiB);
  ASSERT_OK_AND_ASSIGN(CopyRates rates, ProbeCopyRates(*none, 64 * kMiB));
  EXPECT_EQ(rates.host_to_gpu, 0);
  auto two = gpu::MakeSimulatedBackend(2, 64 * kMiB);
  ASSERT_OK_AND_ASSIGN(rates, ProbeCopyRates(*two, 0));
  EXPECT_EQ(rates.host_to_gpu, 0);
  EXPECT_EQ(rates.gpu_to_gpu, 0);
}

TEST(CopyProbeTest, GivesBackItsChunksAndHostMemory) {
  auto backend = gpu::MakeSimulatedBackend(2, 64 * kMiB);
  ASSERT_OK(ProbeCopyRates(*backend, 2 * kMiB).status());  // whatever the first one sets up
  const size_t descriptors = OpenDescriptors();
  const size_t mappings = MemfdMappings();
  for (int i = 0; i < 20; ++i) ASSERT_OK(ProbeCopyRates(*backend, 2 * kMiB).status());
  EXPECT_EQ(OpenDescriptors(), descriptors) << "a simulated chunk is a memfd";
  EXPECT_EQ(MemfdMappings(), mappings);
}

}  // namespace
}  // namespace depot::store
