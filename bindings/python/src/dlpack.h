// The DLPack ABI (https://dmlc.github.io/dlpack/latest/), version 0.x as
// NumPy 1.22+ and most frameworks exchange it: a DLManagedTensor passed in
// a PyCapsule named "dltensor" (renamed "used_dltensor" by the consumer).
// Written from the public specification; only what tpuhal uses.
#pragma once

#include <cstdint>

extern "C" {

// Where the data is. Values are fixed by the ABI.
typedef enum {  // NOLINT(modernize-use-using): a C ABI
  kDLCPU = 1,
  kDLCUDA = 2,
  kDLCUDAHost = 3,  // pinned host memory of a CUDA device
  kDLOpenCL = 4,
  kDLVulkan = 7,
  kDLMetal = 8,
  kDLVPI = 9,
  kDLROCM = 10,
  kDLROCMHost = 11,
  kDLExtDev = 12,
  kDLCUDAManaged = 13,
  kDLOneAPI = 14,
} DLDeviceType;

typedef struct {
  DLDeviceType device_type;
  std::int32_t device_id;
} DLDevice;

typedef enum {
  kDLInt = 0,
  kDLUInt = 1,
  kDLFloat = 2,
  kDLOpaqueHandle = 3,
  kDLBfloat = 4,
  kDLComplex = 5,
  kDLBool = 6,
} DLDataTypeCode;

typedef struct {
  std::uint8_t code;    // DLDataTypeCode
  std::uint8_t bits;    // of one lane
  std::uint16_t lanes;  // 1 for scalars
} DLDataType;

typedef struct {
  void* data;  // with byte_offset: the first element
  DLDevice device;
  std::int32_t ndim;
  DLDataType dtype;
  std::int64_t* shape;    // ndim entries
  std::int64_t* strides;  // in elements; NULL: compact row-major
  std::uint64_t byte_offset;
} DLTensor;

typedef struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;  // the producer's
  // Called by the consumer when it no longer needs the tensor (may be NULL).
  void (*deleter)(struct DLManagedTensor* self);
} DLManagedTensor;

}  // extern "C"

static_assert(sizeof(DLDevice) == 8);
static_assert(sizeof(DLDataType) == 4);
static_assert(sizeof(DLTensor) == 48);
static_assert(sizeof(DLManagedTensor) == 64);
