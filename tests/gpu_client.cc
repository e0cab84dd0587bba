// gpu_test_client: the other process of the GPU tests (gpu_test.cc), run as a program of its
// own rather than forked, because a process that has used CUDA cannot fork one that uses it
// too. Exit status 0 means every check passed; otherwise stderr says which failed.
//
//   gpu_test_client simulated|cuda get SOCKET NAME DEVICE SIZE SEED METADATA
//     Gets NAME on DEVICE and checks that it holds SeededBytes(SIZE, SEED) and METADATA, and
//     that a second get is answered from the chunk already mapped.
//   gpu_test_client simulated|cuda hold SOCKET NAME DEVICE NEW_NAME NEW_DEVICE NEW_SIZE
//     Gets NAME on DEVICE, starts creating NEW_NAME on NEW_DEVICE, writes one byte to
//     descriptor 3, and waits to be killed.
#include <unistd.h>

#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "child_process.h"
#include "depot/client.h"
#include "device_memory.h"
#include "test_support.h"

namespace depot::testing {
namespace {

constexpr int kReadyFd = 3;

int Get(GpuKind kind, Client& client, const std::vector<std::string>& args) {
  const ObjectId id = ObjectId::FromName(args[0]);
  const int device = std::stoi(args[1]);
  const uint64_t size = std::stoull(args[2]);
  const uint64_t seed = std::stoull(args[3]);
  auto buffer = client.GetOnDevice(id, device);
  if (!buffer.ok()) return ChildFailed(3, "get: " + buffer.status().ToString());
  if (buffer->size() != size || buffer->device() != device)
    return ChildFailed(4, "wrong size/device");
  auto bytes = CopyFromDevice(kind, device, buffer->device_ptr(), size);
  if (!bytes.ok()) return ChildFailed(5, "reading the GPU: " + bytes.status().ToString());
  if (*bytes != SeededBytes(size, seed)) return ChildFailed(6, "the bytes differ");
  const auto meta = buffer->metadata();
  if (std::string_view(reinterpret_cast<const char*>(meta.data()), meta.size()) != args[4]) {
    return ChildFailed(7, "the metadata differs");
  }
  auto again = client.GetOnDevice(id, device);
  if (!again.ok() || again->device_ptr() != buffer->device_ptr()) {
    return ChildFailed(8, "a second get did not return the same device pointer");
  }
  return 0;
}

int Hold(Client& client, const std::vector<std::string>& args) {
  auto held = client.GetOnDevice(ObjectId::FromName(args[0]), std::stoi(args[1]));
  if (!held.ok()) return ChildFailed(3, "get: " + held.status().ToString());
  auto made =
      client.CreateOnDevice(ObjectId::FromName(args[2]), std::stoull(args[4]), std::stoi(args[3]));
  if (!made.ok()) return ChildFailed(4, "create: " + made.status().ToString());
  const char byte = 1;
  if (::write(kReadyFd, &byte, 1) != 1) return ChildFailed(5, "cannot signal readiness");
  for (;;) ::pause();
}

int Main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  if (args.size() < 3 || (args[0] != "simulated" && args[0] != "cuda")) {
    return ChildFailed(2, "usage: gpu_test_client simulated|cuda get|hold SOCKET ...");
  }
  const GpuKind kind = args[0] == "cuda" ? GpuKind::kCuda : GpuKind::kSimulated;
  const std::vector<std::string> rest(args.begin() + 3, args.end());
  auto client = Client::Connect(args[2]);
  if (!client.ok()) return ChildFailed(2, "connect: " + client.status().ToString());
  if (args[1] == "get" && rest.size() == 5) return Get(kind, *client, rest);
  if (args[1] == "hold" && rest.size() == 5) return Hold(*client, rest);
  return ChildFailed(2, "unknown command or wrong number of arguments: " + args[1]);
}

}  // namespace
}  // namespace depot::testing

int main(int argc, char** argv) { return depot::testing::Main(argc, argv); }
