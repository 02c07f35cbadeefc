// The board clock of the CUDA shim: two kernels that read the GPU's global
// timer (%globaltimer, nanoseconds) in stream order. One writes it where a
// Batch::timestamp command says; the other records when a fence value was
// reached, into the queue's stamp slots, before the stream writes the
// timeline word. CUDA events cannot do either: they time intervals between
// themselves and write nothing into memory a stream or the host reads.
//
// The kernels are PTX, compiled by the driver for whatever GPU it finds when
// the device opens: each is a handful of instructions, and %globaltimer has
// no CUDA C spelling but inline PTX anyway.
#include <string>

#include "device_impl.h"

namespace tpuhal::cuda {
namespace {

// tpuhal_stamp(u64* at): *at = %globaltimer.
// tpuhal_fence_stamp(StampSlot* slot, u64 value): the slot's value word to
// 0, the time, then the value, each store made visible to the host (and
// other devices) before the next (membar.sys), so that a reader that sees
// `value` before and after reading the time has the time written for it
// (CudaQueue::timestamp_ns).
constexpr char kClockPtx[] =
    ".version 7.0\n"
    ".target sm_50\n"
    ".address_size 64\n"
    "\n"
    ".visible .entry tpuhal_stamp(.param .u64 at)\n"
    "{\n"
    "\t.reg .b64 %rd<4>;\n"
    "\tld.param.u64 %rd1, [at];\n"
    "\tcvta.to.global.u64 %rd2, %rd1;\n"
    "\tmov.u64 %rd3, %globaltimer;\n"
    "\tst.volatile.global.u64 [%rd2], %rd3;\n"
    "\tmembar.sys;\n"
    "\tret;\n"
    "}\n"
    "\n"
    ".visible .entry tpuhal_fence_stamp(.param .u64 slot, .param .u64 value)\n"
    "{\n"
    "\t.reg .b64 %rd<6>;\n"
    "\tld.param.u64 %rd1, [slot];\n"
    "\tcvta.to.global.u64 %rd2, %rd1;\n"
    "\tld.param.u64 %rd3, [value];\n"
    "\tmov.u64 %rd4, 0;\n"
    "\tst.volatile.global.u64 [%rd2], %rd4;\n"
    "\tmembar.sys;\n"
    "\tmov.u64 %rd5, %globaltimer;\n"
    "\tst.volatile.global.u64 [%rd2+8], %rd5;\n"
    "\tmembar.sys;\n"
    "\tst.volatile.global.u64 [%rd2], %rd3;\n"
    "\tmembar.sys;\n"
    "\tret;\n"
    "}\n";

}  // namespace

std::unique_ptr<Clock> Clock::load(const Api& api, std::string* why) {
  auto c = std::unique_ptr<Clock>(new Clock(api));
  auto failed = [&](const char* call, CUresult r) {
    *why = std::string(call) + ": " + describe(api, r);
    return nullptr;
  };
  if (CUresult r = api.cuModuleLoadData(&c->module_, kClockPtx); r != CUDA_SUCCESS) {
    c->module_ = nullptr;
    return failed("cuModuleLoadData (the clock kernels' PTX)", r);
  }
  if (CUresult r = api.cuModuleGetFunction(&c->stamp_, c->module_, "tpuhal_stamp"); r != CUDA_SUCCESS)
    return failed("cuModuleGetFunction tpuhal_stamp", r);
  if (CUresult r = api.cuModuleGetFunction(&c->fence_stamp_, c->module_, "tpuhal_fence_stamp"); r != CUDA_SUCCESS)
    return failed("cuModuleGetFunction tpuhal_fence_stamp", r);
  return c;
}

Clock::~Clock() {
  if (module_) api_.cuModuleUnload(module_);
}

CUresult Clock::stamp(CUstream stream, CUdeviceptr at) const {
  void* params[] = {&at};
  return api_.cuLaunchKernel(stamp_, 1, 1, 1, 1, 1, 1, 0, stream, params, nullptr);
}

CUresult Clock::fence_stamp(CUstream stream, CUdeviceptr slot, std::uint64_t value) const {
  void* params[] = {&slot, &value};
  return api_.cuLaunchKernel(fence_stamp_, 1, 1, 1, 1, 1, 1, 0, stream, params, nullptr);
}

}  // namespace tpuhal::cuda
