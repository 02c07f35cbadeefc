// cuBLAS for the shim's float matrix products, loaded at run time like the
// driver (libcublas.so.13 or .12; TPUHAL_CUBLAS_LIBRARY names another;
// TPUHAL_CUDA_BLAS=0 leaves it out). Without it matmul runs on the shim's
// own kernels. Internal to drivers/cuda.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "api.h"
#include "../kernels/kernel.h"
#include "tpuhal/driver/driver.hpp"
#include "tpuhal/driver/op_desc.hpp"

namespace tpuhal::cuda {

struct BlasLibrary;

class Blas {
 public:
  // Null, with `why`, where no cuBLAS can be loaded or it refuses the
  // device. Needs the device's context current.
  static std::unique_ptr<Blas> load(std::string* why);
  ~Blas();
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;

  // "cuBLAS 13.0.2 (/usr/local/cuda/lib64/libcublas.so.13)".
  const std::string& describe() const { return what_; }

  // y = alpha * op(a) @ op(b) for matmul `op`'s a and b and the given y
  // (op's own, or an f32 scratch of its shape), or a @ b for a
  // matmul_integer of i8 without zero points, where cuBLAS can take the
  // operands as they are (each matrix with a unit stride,
  // batch dimensions that collapse into one stride). Returns false,
  // queueing nothing, when it cannot; else the call's result in *r
  // (CUDA_ERROR_UNKNOWN when cuBLAS failed; `why` says how).
  bool gemm(CUstream stream, const driver::OpDesc& op, const k::Tensor& y, CUresult* r, std::string* why) const;

 private:
  Blas() = default;
  const BlasLibrary* lib_ = nullptr;
  void* handle_ = nullptr;  // cublasHandle_t
  mutable std::mutex mu_;   // the handle: one stream at a time
  std::string what_;
};

}  // namespace tpuhal::cuda
