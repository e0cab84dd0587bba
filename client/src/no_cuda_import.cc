// The CUDA importer of a client built without the CUDA toolkit's headers.
#include "device_import.h"

namespace depot::internal {

Result<std::unique_ptr<DeviceImporter>> LoadCudaImporter() {
  return Status::InvalidArgument(
      "this depot client was built without the CUDA toolkit, so it cannot map GPU objects");
}

}  // namespace depot::internal
