// The DLPack ABI (https://dmlc.github.io/dlpack/latest/c_api.html), version 1.0: the structs
// the Python binding exchanges with other libraries through "dltensor" and
// "dltensor_versioned" capsules. Declared here rather than taken from a dlpack.h so the build
// needs nothing more; the layout is the ABI, fixed by the standard.
#pragma once

#include <cstdint>

namespace depot::python::dlpack {

enum DeviceType : int32_t {
  kDLCPU = 1,
  kDLCUDA = 2,
  kDLCUDAHost = 3,
  kDLROCM = 10,
  kDLCUDAManaged = 13,
};

enum TypeCode : uint8_t {
  kDLInt = 0,
  kDLUInt = 1,
  kDLFloat = 2,
  kDLOpaqueHandle = 3,
  kDLBfloat = 4,
  kDLComplex = 5,
  kDLBool = 6,
};

struct DLPackVersion {
  uint32_t major;
  uint32_t minor;
};

struct DLDevice {
  int32_t device_type;
  int32_t device_id;
};

struct DLDataType {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};

struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;  // in elements; null: C order
  uint64_t byte_offset;
};

// DLPack before 1.0: the "dltensor" capsule.
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor* self);
};

inline constexpr uint64_t kFlagReadOnly = 1ULL << 0;
inline constexpr uint64_t kFlagIsCopied = 1ULL << 1;

// DLPack 1.0: the "dltensor_versioned" capsule.
struct DLManagedTensorVersioned {
  DLPackVersion version;
  void* manager_ctx;
  void (*deleter)(DLManagedTensorVersioned* self);
  uint64_t flags;
  DLTensor dl_tensor;
};

inline constexpr uint32_t kMajorVersion = 1;
inline constexpr uint32_t kMinorVersion = 0;

inline constexpr const char* kCapsule = "dltensor";
inline constexpr const char* kUsedCapsule = "used_dltensor";
inline constexpr const char* kVersionedCapsule = "dltensor_versioned";
inline constexpr const char* kUsedVersionedCapsule = "used_dltensor_versioned";

}  // namespace depot::python::dlpack
