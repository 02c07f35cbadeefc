// The CUDA driver API called directly, as an application would without
// tpuhal: the baseline `tpuhal bench` puts beside the shim's own figures on
// cuda:N, measured in the same run. It loads the same library the shim does
// (TPUHAL_CUDA_LIBRARY or libcuda.so.1) but none of the shim's code.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace tpuhal::bench {

class RawCuda {
 public:
  // The baseline for the device `uri` ("cuda:N") with a pinned host buffer
  // and a device buffer of `max_bytes` each; null, with `why`, when `uri` is
  // not a CUDA device or the driver cannot give one.
  static std::unique_ptr<RawCuda> open(const std::string& uri, std::uint64_t max_bytes, std::string* why);
  ~RawCuda();
  RawCuda(const RawCuda&) = delete;
  RawCuda& operator=(const RawCuda&) = delete;

  // GB/s of `reps` cuMemcpyAsync of `bytes` on one stream (host to device
  // or back), then one cuStreamSynchronize.
  double copy_gbps(bool to_device, std::uint64_t bytes, int reps);
  // Microseconds for one empty kernel: cuLaunchKernel, cuStreamSynchronize.
  double launch_round_trip_us();
  // Millions of empty kernels per second, `n` back to back, all completed.
  double launch_rate_mps(std::uint64_t n);
  // Seconds per n x n x n matrix product through cuBLAS called directly
  // (cublasGemmEx with its default workspace and algorithm), a and b
  // uploaded from `a` and `b` (n * n elements of `in`), y of `out`: the
  // median of `rounds` rounds of `reps` back-to-back products. `in` / `out`:
  // "f32"/"f32", "f16"/"f16", "bf16"/"bf16" or "i8"/"i32". 0, with `why`,
  // where cuBLAS cannot be loaded or fails.
  double gemm_seconds(const std::string& in, const std::string& out, std::int64_t n, const void* a, const void* b,
                      int rounds, int reps, std::string* why);

 private:
  struct State;
  explicit RawCuda(std::unique_ptr<State> s);
  std::unique_ptr<State> s_;
};

}  // namespace tpuhal::bench
