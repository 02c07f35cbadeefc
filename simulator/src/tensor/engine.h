// The board's tensor engine: executes validated op parameter blocks on
// tensors already resolved to host pointers. Internal to the simulator.
//
// Results are deterministic and independent of the number of threads: every
// output element is computed by one thread with the same arithmetic in the
// same order, whatever the partition of the work.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "cpu_share.h"
#include "isa.h"
#include "packed_cache.h"
#include "tpuhal/fw/decode.h"

namespace tpuhal::sim::tensor {

// A tensor in host memory: element (i0..ik) at data + sum(i*strides)*esize.
struct View {
  std::byte* data = nullptr;
  fw::DType dtype = fw::DType::kNone;
  std::uint32_t rank = 0;
  std::uint64_t shape[fw::kMaxRank] = {};
  std::uint64_t strides[fw::kMaxRank] = {};
  std::uint32_t esize = 0;

  bool present() const { return dtype != fw::DType::kNone; }
  std::uint64_t elements() const {
    std::uint64_t n = 1;
    for (std::uint32_t i = 0; i < rank; ++i) n *= shape[i];
    return n;
  }
  bool contiguous() const {
    std::uint64_t step = 1;
    for (std::uint32_t i = rank; i-- > 0;) {
      if (shape[i] > 1 && strides[i] != step) return false;
      step *= shape[i];
    }
    return true;
  }
  std::byte* at(std::uint64_t linear_offset_elements) const { return data + linear_offset_elements * esize; }
};

// Parallel loops on the engine's threads. They run as OpenMP regions, the
// same threads oneDNN's kernels use, so that the two never compete for the
// board's cores. The team is as large as the CPU the threads get allows
// (CpuShare), or one thread for a small op: begin_op() sets it for the op
// that starts.
class WorkerPool {
 public:
  explicit WorkerPool(unsigned threads);
  // The team for the op that starts now: CpuShare::team, or one thread
  // for an op estimated (`work_ns`) to take less than kSerialBelowNs on
  // one (TPUHAL_SIM_SERIAL_BELOW_NS, read when the pool is made, replaces
  // it; 0: every op may use the whole team). Waking a second thread and
  // meeting it at the barrier costs a few microseconds on a virtual
  // machine: a 576-byte table lookup took 0.6 us on one thread and 4.8 us
  // on two. A 301,056-element multiplication alone took 26 us on one and
  // 18 us on two. Whole networks on a 2-core VM (docs/simulator.md) ran
  // faster at 100 us than at 0, 10 or 30 (MobileNetV3-Small int8 1.5
  // times as fast as at 0, ResNet-50 no slower), and faster still at 50
  // us: the estimates run about twice the kernels' real time (a depthwise
  // convolution of 7x7x576 with 5x5 taps, 20 us on one thread, was
  // estimated at 53 us). Against 100 us, EfficientNet-B0 int8 at batch 1
  // took 3.9 against 4.8 ms a run, MobileNetV3-Small fp32 1.25 against
  // 1.46 ms and ShuffleNetV2 fp32 1.04 against 1.09 ms.
  static constexpr std::uint64_t kSerialBelowNs = 50'000;
  // `streaming`: the op is one of an int8 network's streaming loops
  // (quantisation, table lookups, the quantized adds, multiplications and
  // global pools, byte copies and transposes), which split into even runs
  // that a spinning thread takes at once. While the pool's threads still
  // spin from its last region (kSpinMs), the bound for those is
  // kSerialBelowNs / kStreamingShare (2.5 us); asleep, a thread costs tens of microseconds to wake and then
  // holds a core spinning, and the whole bound holds. So at batch 8, where
  // the integer convolutions keep the team awake, an int8 network runs its
  // gates, adds and pools on the team; at batch 1 they stay on one
  // thread. On the 2-core VM (`tpuhal profile`, MobileNetV3-Small int8):
  // at batch 8 a 113 KB quantized add took 6.2 us on one thread and 4.2 us
  // on two, and the network 4.1 ms a run with the one bound, 3.5 ms so; at
  // batch 1, woken for it, a 200 KB table lookup took 21.8 us on two and
  // 3.5 us on one. Float networks' maps are not counted: so counted, they
  // were no faster (ShuffleNetV2 fp32 at batch 8 5.3 against 5.5 ms a
  // run, MobileNetV3-Small fp32 at batch 1 1.29 against 1.21 ms, within
  // the VM's noise). Nor are products and convolutions, which gain far
  // later: a 3x3 int8 convolution of 6.4 us on one thread took 10.4 us
  // on two.
  static constexpr std::uint64_t kStreamingShare = 20;
  unsigned begin_op(std::uint64_t work_ns, bool streaming = false);
  // The same at a given time (base::monotonic_ns's clock), for tests.
  unsigned begin_op_at(std::uint64_t now_ns, std::uint64_t work_ns, bool streaming);
  // How long OpenMP's workers spin after a region before they sleep, in
  // ms: begin_op() sets it for the teams its thread forks, where the user
  // has not said (KMP_BLOCKTIME, OMP_WAIT_POLICY) and the runtime is LLVM's
  // libomp (a clang build's; oneDNN's regions run on it too). libomp's own
  // default, 200 ms, has a worker hold its core between the engine's ops,
  // where a neighbour, or the engine's thread running a small op, wanted
  // it. On a 2-core VM beside one busy process at nice 19, EfficientNet-B0
  // int8 took 15 ms a run in most processes at 200, 20 or 5 ms, and 4.1 to
  // 5.8 ms at 1 ms. Quiet, 1 ms ran as fast as 200 (EfficientNet-B0 fp32
  // 7.3 ms, int8 4.0 ms; ResNet-50 fp32 30 ms), where sleeping at once (0)
  // made them 1.1 to 1.4 times slower.
  static constexpr int kSpinMs = 1;
  // The threads the current op runs on, and the most it may.
  unsigned threads() const { return team_; }
  unsigned max_threads() const { return share_.max_threads(); }
  const CpuShare& share() const { return share_; }
  // Calls fn(begin, end) over [0, n) split into contiguous parts, one per
  // thread of the team, each at least `grain` items (work too small to
  // share runs on the calling thread: a parallel region costs a barrier).
  // Returns when all are done; an exception a part throws is rethrown
  // here (the first, if several), after every part has ended.
  void parallel_for(std::uint64_t n, const std::function<void(std::uint64_t, std::uint64_t)>& fn,
                    std::uint64_t grain = 1);

 private:
  // Gives CpuShare a reading of `threads` threads' wait, and logs a shrink.
  void sampled(double waited, unsigned threads, std::uint64_t now_ns);

  CpuShare share_;
  std::uint64_t serial_below_ns_;
  unsigned share_team_;  // what CpuShare allows
  unsigned team_;
  std::uint64_t awake_until_ns_ = 0;  // the team's threads spin until then (parallel_for's last region)
};

struct DnnlState;  // oneDNN engine and stream

// The engine's staging buffers (TensorEngine::staged), one per role.
enum class Staged : std::uint8_t { kX, kW, kBias, kY, kCount };

class TensorEngine {
 public:
  // `isa`: the level the engine's own kernels run at (isa_from_env()); it
  // caps oneDNN too when this is the process's first engine. `writes`: the
  // board's DRAM write log, by which kept weights are known unchanged
  // without comparing them (dram_writes.h); null: always compared.
  TensorEngine(unsigned threads, Isa isa, const DramWrites* writes = nullptr);
  ~TensorEngine();
  // The threads the current op runs on (the team), and the most it may.
  unsigned threads() const { return pool_.threads(); }
  unsigned max_threads() const { return pool_.max_threads(); }
  Isa isa() const { return isa_; }

  // Runs one op. `views` has op.num_tensors entries in the op's order.
  // Returns a problem (kBadArgument) only for conditions the decoder cannot
  // see; memory safety was settled when the views were resolved.
  fw::Problem run(const fw::OpBlock& op, const View* views);

  // Drops what the calling thread made (oneDNN primitives must die on
  // their maker's thread). A command processor calls it when it stops.
  void release_thread();

  WorkerPool& pool() { return pool_; }
  DnnlState& dnnl() { return *dnnl_; }
  // Scratch memory kept across ops (the engine runs one op at a time), so
  // that ops do not fault fresh pages in every time. Contents undefined.
  std::int32_t* scratch_i32(std::size_t n) {
    if (scratch_.size() < n) scratch_.resize(n);
    return scratch_.data();
  }
  // f32 staging of an op's operands and result (widened f16 operands, a
  // convolution's f32 result before it narrows): one buffer per slot, kept
  // like the scratch above; a kernel writes every element before reading.
  float* staged(Staged slot, std::size_t n) {
    auto& v = staged_[static_cast<std::size_t>(slot)];
    if (v.size() < n) v.resize(n);
    return v.data();
  }
  // Likewise for the GEMMs' packed operands (not the same memory).
  float* scratch_f32(std::size_t n) {
    if (packed_.size() < n) packed_.resize(n);
    return packed_.data();
  }
  std::int32_t* scratch_packed_i32(std::size_t n) {
    if (packed_.size() < n) packed_.resize(n);
    return reinterpret_cast<std::int32_t*>(packed_.data());
  }
  // Packed weights kept from op to op, and values computed from weights
  // (packed_cache.h).
  PackedCache& packed_cache() { return packed_cache_; }
  DerivedValues& derived_values() { return derived_values_; }

 private:
  std::mutex mu_;  // one op at a time: the engine is shared by all queues
  Isa isa_;
  WorkerPool pool_;
  std::unique_ptr<DnnlState> dnnl_;
  std::vector<std::int32_t> scratch_;
  std::vector<float> packed_;
  std::vector<float> staged_[static_cast<std::size_t>(Staged::kCount)];
  PackedCache packed_cache_;
  DerivedValues derived_values_;
};

// A rough estimate of `op`'s time on one host thread, in ns, over its
// tensors `v`: what WorkerPool::begin_op weighs against its bound.
std::uint64_t serial_estimate_ns(const fw::OpBlock& op, const View* v);

// Kernels (one file per family); all take the engine for its pool and
// oneDNN. Each op kind's kernel is its entry point, run_<id>(e, attrs,
// views), defined in its family's file and called by TensorEngine::run
// (engine_kinds.inc, generated from the op schema); it returns the problem
// the board reports for what the decoder could not see, or {}. gather's
// refuses (kBadArgument, Indices' data field) an index outside the axis.
#define TPUHAL_ENGINE_KIND(Name, id, Attrs) fw::Problem run_##id(TensorEngine& e, const fw::Attrs& a, const View* v);
#include "engine_kinds.inc"
#undef TPUHAL_ENGINE_KIND

// Integer products write int32 accumulators, dense in the output's
// row-major order, into `acc` (sized by the caller: the output's elements).
void matmul_integer(TensorEngine& e, const View& a, const View& b, const View* az, const View* bz, std::int32_t* acc);
void conv_integer(TensorEngine& e, const fw::ConvAttrs& a, const View& x, const View& w, const View* xz, const View* wz,
                  std::int32_t* acc);
// QLinearConv in NHWC (y dense) on x86 levels without VNNI, where
// conv.cpp's integer_sums_as_f32 takes it: oneDNN's f32 convolution of the
// same integers (exact: every sum within 2^24), each position's sums
// requantised as requantize() does while in cache. `bias` is null or one
// int32 per channel. Bit-identical to conv_integer + requantize; false
// (nothing written) where it does not apply.
bool qlinear_conv_as_f32(TensorEngine& e, const fw::ConvAttrs& a, const View& x, const View& w, const View* xz,
                         const View* wz, const View& y, const std::vector<float>& multipliers, const std::int32_t* bias,
                         std::int32_t y_zero);
// QLinearConv of a depthwise convolution in NHWC (x's and y's channels
// dense; bytes in and out) on the engine's own loop, each output row's
// sums requantised as requantize() does while in cache. `bias` is null or
// one int32 per channel. Bit-identical to conv_integer + requantize on
// every level; false (nothing written) where it does not apply.
bool qlinear_conv_depthwise(TensorEngine& e, const fw::ConvAttrs& a, const View& x, const View& w, const View* xz,
                            const View* wz, const View& y, const std::vector<float>& multipliers,
                            const std::int32_t* bias, std::int32_t y_zero);
// QLinearConv with the requantisation fused into oneDNN's convolution where
// that is bit-identical to conv_integer + requantize (s8 weights without
// zero points, no bias, sums within 2^24, finite multipliers, one per
// output channel); false (nothing written) otherwise.
bool qlinear_conv_fused(TensorEngine& e, const fw::ConvAttrs& a, const View& x, const View& w, const View* xz,
                        const View* wz, const View& y, const std::vector<float>& multipliers, std::int32_t y_zero);
float activate(fw::Activation act, float alpha, float beta, float x);
// activate() over p[0, n) in place.
void activate_span(fw::Activation act, float alpha, float beta, float* p, std::uint64_t n);

// Visits every index of `shape` (row-major), calling fn(offsets) where
// offsets[t] is the element offset of index in each of `views`.
template <std::size_t N, class F>
void for_each_index(const std::uint64_t* shape, std::uint32_t rank, const View* const (&views)[N], std::uint64_t begin,
                    std::uint64_t end, F&& fn) {
  std::uint64_t idx[fw::kMaxRank] = {};
  std::uint64_t rem = begin;
  for (std::uint32_t d = rank; d-- > 0;) {
    idx[d] = rem % shape[d];
    rem /= shape[d];
  }
  std::uint64_t off[N] = {};
  for (std::size_t t = 0; t < N; ++t)
    for (std::uint32_t d = 0; d < rank; ++d) off[t] += idx[d] * views[t]->strides[d];
  for (std::uint64_t i = begin; i < end; ++i) {
    fn(off);
    for (std::uint32_t d = rank; d-- > 0;) {  // odometer step
      ++idx[d];
      for (std::size_t t = 0; t < N; ++t) off[t] += views[t]->strides[d];
      if (idx[d] < shape[d] || d == 0) break;
      for (std::size_t t = 0; t < N; ++t) off[t] -= shape[d] * views[t]->strides[d];
      idx[d] = 0;
    }
  }
}

// A dense f32 copy of a float view, in the engine's staging memory `slot`
// (TensorEngine::staged; for the precisions oneDNN has no kernel for on
// this CPU; widening is exact).
// `into`: write the floats there instead (a dense f32 tensor of v's shape).
View widened(TensorEngine& e, const View& v, Staged slot, float* into = nullptr);
// widened() for an operand a model runs with again and again (weights): the
// floats are kept in the engine's packed cache while v holds the same
// bytes, so that they are widened once per model rather than once per run,
// and stay at one address (oneDNN's reordered weights are kept under their
// address and told from later floats there by the entry's serial).
// Falls back to widened() into `slot` where v has gaps or the cache is full.
// `serial`, if given, is set to the cache entry's serial (PackedCache::find),
// or 0 where the floats are not kept: the same serial, the same floats.
View widened_weights(TensorEngine& e, const View& v, Staged slot, std::uint64_t* serial = nullptr);
// Whether the bytes two views span (first element to last) are disjoint.
bool apart(const View& y, const View& a);
// A dense f32 view of v's shape over `data`, or over staging memory `slot`.
View staged_like(TensorEngine& e, const View& v, Staged slot, float* data = nullptr);
// Dense f32 `from` (to's shape) into float view `to`, each value rounded once.
void narrow_into(TensorEngine& e, const View& from, const View& to);

}  // namespace tpuhal::sim::tensor
