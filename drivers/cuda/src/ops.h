// Tensor ops on the GPU (caps.tensor): the shim's kernels (drivers/cuda/
// kernels), built by nvcc into a fatbin embedded in the library and loaded
// when a device opens, and the launchers that turn an OpDesc into kernel
// launches on a stream. Internal to drivers/cuda.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "api.h"
#include "tpuhal/driver/driver.hpp"
#include "tpuhal/driver/op_desc.hpp"
#include "../kernels/kernel.h"

namespace tpuhal::cuda {

// The loaded kernel module of one device.
class Kernels {
 public:
  // Null, with `why`, where the library was built without nvcc or the
  // driver cannot load the fatbin (no code for this GPU). Needs the
  // device's context current.
  static std::unique_ptr<Kernels> load(const Api& api, std::string* why);
  ~Kernels();
  Kernels(const Kernels&) = delete;
  Kernels& operator=(const Kernels&) = delete;

  // Launches "tpuhal_k_<name>" over p.n items (none: nothing is launched).
  template <class P>
  CUresult launch(CUstream stream, const char* name, const P& p) const {
    static_assert(std::is_trivially_copyable_v<P>);
    return launch_raw(stream, name, const_cast<P*>(&p), p.n);
  }

 private:
  explicit Kernels(const Api& api) : api_(api) {}
  CUresult launch_raw(CUstream stream, const char* name, void* params, std::uint64_t n) const;
  CUresult function(const char* name, CUfunction* out) const;

  const Api& api_;
  CUmodule module_ = nullptr;
  mutable std::mutex mu_;
  mutable std::map<std::string, CUfunction, std::less<>> functions_;
};

// A TensorArg as a kernel sees it (k::Tensor).
k::Tensor tensor_of(const driver::TensorArg& t);
// Each of `op`'s tensors, in order, into the fields given.
void tensors_of(const driver::OpDesc& op, std::initializer_list<k::Tensor*> fields);

// Why the GPU cannot run `op` ("conv2d in i8"), or empty when it can.
std::string refuse_op(const driver::OpDesc& op);

// Queues `op` on `stream`: one or more kernel launches. `fault` is where
// its kernels report bad input found while it runs (kernel.h).
CUresult run_op(const Kernels& kernels, CUstream stream, const driver::OpDesc& op, const k::Fault& fault);

class Blas;

// A matmul (or matmul_integer of i8 without zero points) through cuBLAS
// (blas.h), with a matmul's c, beta and activation applied
// after by the epilogue kernel: into y itself when y is f32, else into an
// f32 scratch of y's shape from `scratch` (null: none to be had). False,
// queueing nothing, where cuBLAS cannot take the operands; the kernels then
// run it (run_linear).
bool run_matmul_on_blas(const Blas& blas, const Kernels& kernels, CUstream stream, const driver::OpDesc& op,
                        const std::function<std::uint64_t(std::uint64_t)>& scratch, CUresult* r, std::string* why);

// Each family's launcher and refusal (ops_<family>.cpp), for the kinds
// ops.cpp hands it.
CUresult run_elementwise(const Kernels& kernels, CUstream stream, const driver::OpDesc& op, const k::Fault& fault);
std::string refuse_elementwise(const driver::OpDesc& op);
CUresult run_linear(const Kernels& kernels, CUstream stream, const driver::OpDesc& op, const k::Fault& fault);
std::string refuse_linear(const driver::OpDesc& op);
CUresult run_quantized(const Kernels& kernels, CUstream stream, const driver::OpDesc& op, const k::Fault& fault);
std::string refuse_quantized(const driver::OpDesc& op);
CUresult run_selection(const Kernels& kernels, CUstream stream, const driver::OpDesc& op, const k::Fault& fault);
std::string refuse_selection(const driver::OpDesc& op);

// "conv2d in i8": the op's name and the dtype that is the matter.
std::string op_in(const driver::OpDesc& op, DType dtype);

}  // namespace tpuhal::cuda
