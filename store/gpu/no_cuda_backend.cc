// The CUDA backend of a depotd built without the CUDA toolkit's headers: no devices.
#include "store/gpu/device_backend.h"

namespace depot::store::gpu {

std::unique_ptr<DeviceBackend> LoadCudaBackend(std::string* why) {
  *why = "this depotd was built without the CUDA toolkit (no GPU support)";
  return MakeSimulatedBackend(0, 0);
}

}  // namespace depot::store::gpu
