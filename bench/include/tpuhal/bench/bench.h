// Benchmarks: DMA bandwidth, command round trip, submission rate. Each result
// carries the machine's own floor for the same work, measured in the same
// run, and the ratio to it.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tpuhal/tpuhal.hpp"

namespace tpuhal::bench {

struct Result {
  std::string bench;                          // "dma", "round_trip", "submit_rate"
  std::map<std::string, std::string> params;  // "direction": "h2d", "bytes": "4096"
  double value = 0;
  std::string unit;     // "GB/s", "us", "Mcmd/s"
  double baseline = 0;  // the floor, in the same unit
  std::string baseline_name;
  double ratio = 0;                     // value / baseline
  std::map<std::string, double> extra;  // further figures (p99, second baseline)
};

struct Options {
  bool quick = false;  // fewer repetitions (CI smoke runs)
  // Called after each result, for progress output.
  std::function<void(const Result&)> on_result;
};

std::vector<Result> run_dma(Device& device, const Options& options);
std::vector<Result> run_submit(Device& device, const Options& options);
// GEMM 1024^3 and 2048^3 (f32, bf16 -> f32, int8 -> int32) and a 3x3
// convolution (1x56x56x64 -> 64, NHWC; f32 and QLinearConv u8/s8), each
// beside oneDNN on the same thread count; on cuda:N, gemm 4096^3 and 8192^3
// in f32, f16, bf16 and int8 beside cuBLAS called directly (raw_cuda.h).
// Nothing on devices without a tensor engine.
std::vector<Result> run_gemm(Device& device, const Options& options);
std::vector<Result> run_conv(Device& device, const Options& options);
// Aggregate decode frames per second of 1, 8 and 32 channels of 1080p H.264
// and H.265 and 192 channels of 360p H.264 (clips made with ffmpeg), beside
// libavcodec decoding the same clips on as many threads as the codec unit
// has; and the real-time 1080p30 channels that rate sustains. Nothing on
// devices without a video decoder.
std::vector<Result> run_video(Device& device, const Options& options);

// ---- The machine's floors ----
// Single-thread memcpy between two pre-faulted host buffers of up to
// `max_bytes` (huge pages where the kernel gives them, as the device's
// pinned buffers get), allocated once so that rounds measure copying only.
class MemcpyFloor {
 public:
  explicit MemcpyFloor(std::uint64_t max_bytes);
  ~MemcpyFloor();
  MemcpyFloor(const MemcpyFloor&) = delete;
  MemcpyFloor& operator=(const MemcpyFloor&) = delete;
  // GB/s of `reps` copies of `bytes` (<= max_bytes).
  double gbps(std::uint64_t bytes, int reps);

 private:
  struct Buffers;
  std::unique_ptr<Buffers> buffers_;
};
// Median round trip of a message between two threads spinning on atomics, ns.
double atomic_pingpong_ns(int iterations);
// Median round trip between two threads blocking on eventfds, ns.
double eventfd_pingpong_ns(int iterations);
// Messages per second through a single-producer single-consumer ring of
// 64-byte slots between two threads (the floor for handing commands to
// another thread), millions per second.
double spsc_rate_mps(std::uint64_t messages);

// One JSON object (no newline) for a result.
std::string to_json(const Result& r);

}  // namespace tpuhal::bench
