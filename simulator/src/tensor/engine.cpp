#include "engine.h"

#include <omp.h>

#include <spdlog/spdlog.h>

#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cmath>
#include <cstring>
#include <exception>
#include <mutex>
#include <span>

#include "dnnl_state.h"
#include "tpuhal/base/log.h"
#include "tpuhal/base/wait.h"
#include "numerics.h"
#include "simd.h"

// Every op kind (fw/op_kinds.inc) has its case in TensorEngine::run.
#pragma GCC diagnostic error "-Wswitch"

namespace tpuhal::sim::tensor {

// ---- WorkerPool ----------------------------------------------------------------

// LLVM's libomp (a clang build's OpenMP runtime, which oneDNN's OpenMP
// calls bind to as well) lets a thread set how long the workers of the
// teams it forks spin after a region before they sleep. GNU libgomp has no
// such call: null there.
extern "C" void kmp_set_blocktime(int msec) __attribute__((weak));

namespace {

// Sets WorkerPool::kSpinMs for the teams the calling thread forks, where
// the user has not said (KMP_BLOCKTIME, OMP_WAIT_POLICY); once per thread.
void spin_briefly() {
  thread_local bool set = false;
  if (set) return;
  set = true;
  if (kmp_set_blocktime && !std::getenv("KMP_BLOCKTIME") && !std::getenv("OMP_WAIT_POLICY"))
    kmp_set_blocktime(WorkerPool::kSpinMs);
}

// TPUHAL_SIM_SERIAL_BELOW_NS, or kSerialBelowNs where it is unset or not a
// number.
std::uint64_t serial_below_from_env() {
  const char* v = std::getenv("TPUHAL_SIM_SERIAL_BELOW_NS");
  if (!v || !*v) return WorkerPool::kSerialBelowNs;
  char* end = nullptr;
  const unsigned long long n = std::strtoull(v, &end, 10);
  if (*end || *v == '-') {
    base::logger("sim")->warn("TPUHAL_SIM_SERIAL_BELOW_NS='{}' is not a number of nanoseconds; using {}", v,
                              WorkerPool::kSerialBelowNs);
    return WorkerPool::kSerialBelowNs;
  }
  return n;
}

}  // namespace

WorkerPool::WorkerPool(unsigned threads)
    : share_(threads, !std::getenv("TPUHAL_SIM_FIXED_THREADS") && CpuShare::available()),
      serial_below_ns_(serial_below_from_env()),
      share_team_(share_.max_threads()),
      team_(share_team_) {}

unsigned WorkerPool::begin_op(std::uint64_t work_ns, bool streaming) {
  return begin_op_at(base::monotonic_ns(), work_ns, streaming);
}

unsigned WorkerPool::begin_op_at(std::uint64_t now, std::uint64_t work_ns, bool streaming) {
  spin_briefly();
  const unsigned before = share_team_;
  share_team_ = share_.team(now);
  if (share_team_ != before && share_team_ == share_.max_threads())
    base::logger("sim")->debug("tensor engine: back to {} threads", share_team_);
  if (share_.overdue(now)) {
    // No region of the whole team read the waits for a window: this
    // thread reads its own. oneDNN's threads wait at their barriers for a
    // thread that lost its core as ours do, and this one shares the cores
    // with them.
    const double waited = CpuShare::thread_waited_since_last(now);
    if (waited < 0)
      share_.restart(now);  // its first reading, or one long ago: the next says how long it waited
    else
      sampled(waited, share_team_, now);
    share_team_ = share_.team(now);
  }
  const bool awake = streaming && now < awake_until_ns_;
  team_ = work_ns < (awake ? serial_below_ns_ / kStreamingShare : serial_below_ns_) ? 1 : share_team_;
  return team_;
}

void WorkerPool::parallel_for(std::uint64_t n, const std::function<void(std::uint64_t, std::uint64_t)>& fn,
                              std::uint64_t grain) {
  const unsigned parts = static_cast<unsigned>(std::min<std::uint64_t>(team_, n / std::max<std::uint64_t>(grain, 1)));
  if (parts <= 1) {
    if (n) fn(0, n);
    return;
  }
  // Once a window, the whole team's threads each read how long they waited
  // for a CPU (CpuShare).
  const std::uint64_t start = base::monotonic_ns();
  const bool sample = parts == team_ && share_.sample_due(start);
  std::atomic<std::uint64_t> waited_ppm{0};
  std::atomic<unsigned> read{0};
  // An exception may not leave an OpenMP region (the process would end): a
  // part's (memory for a kernel's working set, say) is kept and rethrown
  // here, where the board reports it as its out-of-memory status.
  std::mutex failed_mu;
  std::exception_ptr failed;
#pragma omp parallel num_threads(parts)
  {
    if (sample) {
      const double w = CpuShare::thread_waited_since_last(start);
      if (w >= 0) {
        waited_ppm.fetch_add(static_cast<std::uint64_t>(w * 1e6), std::memory_order_relaxed);
        read.fetch_add(1, std::memory_order_relaxed);
      }
    }
    const auto i = static_cast<std::uint64_t>(omp_get_thread_num());
    const auto t = static_cast<std::uint64_t>(omp_get_num_threads());
    const std::uint64_t begin = n * i / t, end = n * (i + 1) / t;
    if (begin < end) {
      try {
        fn(begin, end);
      } catch (...) {
        const std::lock_guard lock(failed_mu);
        if (!failed) failed = std::current_exception();
      }
    }
  }
  // Its threads spin for kSpinMs from here. Only the pool's own regions
  // count: an op oneDNN ran may not have woken the team at all (when
  // every op that had a team counted, EfficientNet-B0 int8's table
  // lookups after its convolutions took 19 us where they took 1.3 us).
  awake_until_ns_ = base::monotonic_ns() + static_cast<std::uint64_t>(kSpinMs) * 1'000'000;
  if (failed) std::rethrow_exception(failed);
  if (!sample) return;
  const unsigned got = read.load();
  if (got == 0) return;
  sampled(static_cast<double>(waited_ppm.load()) * 1e-6 / got, parts, start);
}

void WorkerPool::sampled(double waited, unsigned threads, std::uint64_t now_ns) {
  const std::uint64_t shrinks = share_.shrinks();
  share_.sampled(waited, threads, now_ns);
  if (share_.shrinks() != shrinks)
    base::logger("sim")->debug(
        "tensor engine: its {} threads waited for a CPU {:.0f}% of the time: {} thread(s) for now", threads,
        waited * 100, share_.team(now_ns));
}

// ---- TensorEngine --------------------------------------------------------------

namespace {
// oneDNN's cap must be set before its first primitive, so before the
// engine's oneDNN state is made.
unsigned capped(Isa isa, unsigned threads) {
  cap_onednn(isa);
  return threads;
}
}  // namespace

TensorEngine::TensorEngine(unsigned threads, Isa isa, const DramWrites* writes)
    : isa_(isa),
      pool_(threads),
      dnnl_(std::make_unique<DnnlState>(capped(isa, threads), writes)),
      packed_cache_(writes),
      derived_values_(writes) {}

TensorEngine::~TensorEngine() = default;

void TensorEngine::release_thread() {
  std::lock_guard lock(mu_);
  dnnl_->release_thread();
}

float activate(fw::Activation act, float alpha, float beta, float x) {
  // The common kinds inline (the same expressions as simd.cpp's loops), the
  // rest through the loops, so that each gives the same bits either way.
  if (act == fw::Activation::kNone) return x;
  if (act == fw::Activation::kRelu) return x > 0 ? x : 0.0f;
  activate_span(act, alpha, beta, &x, 1);
  return x;
}

void activate_span(fw::Activation act, float alpha, float beta, float* p, std::uint64_t n) {
  // One loop per kind, compiled for each instruction-set level (simd.h);
  // every element's arithmetic is the same at each.
  switch (act) {
    case fw::Activation::kNone: return;
    case fw::Activation::kRelu: simd::relu_f32(p, n); return;
    case fw::Activation::kClip: simd::clip_f32(p, n, alpha, beta); return;
    case fw::Activation::kLeakyRelu: simd::leaky_relu_f32(p, n, alpha); return;
    case fw::Activation::kHardSigmoid: simd::hard_sigmoid_f32(p, n, alpha, beta); return;
    case fw::Activation::kHardSwish: simd::hard_swish_f32(p, n, alpha, beta); return;
    case fw::Activation::kSigmoid: simd::sigmoid_f32(p, n); return;
    case fw::Activation::kSilu: simd::silu_f32(p, n); return;
    case fw::Activation::kTanh:
      for (std::uint64_t i = 0; i < n; ++i) p[i] = std::tanh(p[i]);
      return;
  }
}

namespace {

// Round half to even for |v| < 2^22 in the default rounding mode, in a form
// compilers vectorise: adding and removing 1.5 * 2^23 leaves v rounded
// (the build never enables -ffast-math, which could fold it away).
inline float rne(float v) {
  constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23
  v = std::min(std::max(v, -4194304.0f), 4194304.0f);
  return (v + kMagic) - kMagic;  // not folded: floating point does not reassociate
}

// Writes requantised int32 accumulators (dense, in y's row-major order):
//   y = saturate(round_half_even(acc * multiplier) + zero_y)
// with multiplier = (scale_a * scale_b) / scale_y formed in f32. The
// multiplier varies along at most one axis: element i uses
// multipliers[(i / div) % multipliers.size()]. A bias (null, or one per
// multiplier, indexed alike) is added to the accumulator first, in int32,
// wrapping.
void requantize(TensorEngine& e, std::span<const std::int32_t> acc, const View& y,
                const std::vector<float>& multipliers, std::uint64_t div, std::int32_t zero_y,
                const std::int32_t* bias = nullptr) {
  const std::int32_t lo = int_min(y.dtype), hi = int_max(y.dtype);
  const std::uint64_t period = multipliers.size();
  const bool dense = y.contiguous();
  e.pool().parallel_for(acc.size(), [&](std::uint64_t begin, std::uint64_t end) {
    // Walk the multiplier index along without dividing per element.
    std::uint64_t rem = begin % div, idx = (begin / div) % period;
    auto next = [&] {
      if (++rem == div) {
        rem = 0;
        if (++idx == period) idx = 0;
      }
    };
    auto q = [&](std::uint64_t i) {
      const std::int32_t a =
          bias ? static_cast<std::int32_t>(static_cast<std::uint32_t>(acc[i]) + static_cast<std::uint32_t>(bias[idx]))
               : acc[i];
      const float v = static_cast<float>(a) * multipliers[idx];
      const std::int32_t r = static_cast<std::int32_t>(rne(v)) + zero_y;
      return std::min(std::max(r, lo), hi);
    };
    if (dense && div == 1) {
      // Whole periods as a plain loop the compiler vectorises.
      auto* out = reinterpret_cast<std::uint8_t*>(y.data);
      std::uint64_t i = begin;
      for (; i < end && idx != 0; ++i) {
        out[i] = static_cast<std::uint8_t>(q(i));
        next();
      }
      for (; i + period <= end; i += period)
        simd::requantize_u8(&acc[i], bias, multipliers.data(), &out[i], period, zero_y, lo, hi);
      for (; i < end; ++i) {
        out[i] = static_cast<std::uint8_t>(q(i));
        next();
      }
      return;
    }
    if (dense) {
      auto* out = reinterpret_cast<std::uint8_t*>(y.data);
      for (std::uint64_t i = begin; i < end; ++i) {
        out[i] = static_cast<std::uint8_t>(q(i));
        next();
      }
      return;
    }
    const View* views[1] = {&y};
    std::uint64_t i = begin;
    for_each_index(y.shape, y.rank, views, begin, end, [&](const std::uint64_t* off) {
      store_int_wrap(y.at(off[0]), y.dtype, q(i++));
      next();
    });
  });
}

// Dense int32 accumulators for y: y's own memory when it is dense i32,
// else a scratch vector that store_acc copies into y.
struct Accumulators {
  std::int32_t* data;
  std::size_t size;
  Accumulators(TensorEngine& e, const View& y, bool direct) : size(y.elements()) {
    if (direct && y.dtype == fw::DType::kI32 && y.contiguous())
      data = reinterpret_cast<std::int32_t*>(y.data);
    else
      data = e.scratch_i32(size);  // every element gets written
  }
  std::span<const std::int32_t> span() const { return {data, size}; }
};

// Copies dense int32 accumulators into y (i32, any strides).
void store_acc(const Accumulators& acc, const View& y) {
  if (acc.data == reinterpret_cast<std::int32_t*>(y.data)) return;  // already there
  if (y.contiguous()) {
    std::memcpy(y.data, acc.data, acc.size * 4);
    return;
  }
  const View* views[1] = {&y};
  std::uint64_t i = 0;
  for_each_index(y.shape, y.rank, views, 0, y.elements(),
                 [&](const std::uint64_t* off) { store_int_wrap(y.at(off[0]), y.dtype, acc.data[i++]); });
}

// The ns per element, on one thread, of the ops whose elements cost more
// than their bytes: 4 for the maps that are a call into the C library
// (exp, log and the trigonometric and hyperbolic functions; a
// transformer's GELU, erf over 128x1024, took 535 us that way), 2 for
// softmax (a maximum and a sum in order, an exp and a division per
// element: over 4x128x128, 150 us), 1 for the board's own erf (the GELU's
// now, 130 us), 0 for the rest. By their bytes alone they came to 16 to
// 33 us, and so ran on one thread.
std::uint64_t per_element_ns(const fw::OpBlock& op, const View& y) {
  if (op.kind == fw::OpKind::kSoftmax) return 2 * y.elements();
  const auto* map = std::get_if<fw::ElementwiseAttrs>(&op.attrs);
  if (op.kind != fw::OpKind::kElementwise || !map) return 0;
  switch (static_cast<fw::ElementwiseOp>(map->op)) {
    case fw::ElementwiseOp::kErf: return y.elements();
    case fw::ElementwiseOp::kExp:
    case fw::ElementwiseOp::kLog:
    case fw::ElementwiseOp::kSin:
    case fw::ElementwiseOp::kCos:
    case fw::ElementwiseOp::kTan:
    case fw::ElementwiseOp::kAsin:
    case fw::ElementwiseOp::kAcos:
    case fw::ElementwiseOp::kAtan:
    case fw::ElementwiseOp::kSinh:
    case fw::ElementwiseOp::kCosh:
    case fw::ElementwiseOp::kAsinh:
    case fw::ElementwiseOp::kAcosh:
    case fw::ElementwiseOp::kAtanh: return 4 * y.elements();
    default: return 0;
  }
}

}  // namespace

// A rough estimate of an op's time on one host thread, in ns: its tensors'
// bytes (a broadcast dimension once) at 32 GB/s (in cache; the kernels
// stream at least that), plus its multiply-adds (convolutions and
// products; a pool's taps likewise: counted by its bytes alone,
// ShuffleNet's int8 stem max pool at batch 8, 3 MB, came to 94 us, and it
// ran on one thread for 1.3 ms) at 16 per ns in float and 64 in int8
// (plus per_element_ns for ops whose elements cost more), but
// at 16 for a depthwise convolution's (one input channel per output: no
// dot products over channels; MobileNetV3-Small's int8 depthwise layers of
// 14x14x240 with 5x5 taps ran 43 us on one thread, 27 per ns). Small ops
// are most of a small network's: MobileNetV3-Small's SE blocks and gates
// run on a few hundred bytes each. An elementwise op's f16 and bf16
// tensors count as f32's bytes unless it is the identity (a copy, a
// transpose, a cast): its arithmetic runs in f32, each element widened as it is read
// and rounded as it is written, which on one thread took as long per
// element as f32 (an SE block's gate over 8x14x14x240, a Mul by one row
// of 240 channels per image: 49 us in f32 and 66 in f16 on one thread).
// Counted at their own bytes, 1.5 MB, it stayed on one thread, 77 us
// beside f32's 28 on two.
std::uint64_t serial_estimate_ns(const fw::OpBlock& op, const View* v) {
  const auto* map = std::get_if<fw::ElementwiseAttrs>(&op.attrs);
  const bool f32_math =
      op.kind == fw::OpKind::kElementwise && map && map->op != static_cast<std::uint32_t>(fw::ElementwiseOp::kIdentity);
  std::uint64_t bytes = 0;
  for (std::uint32_t i = 0; i < op.num_tensors; ++i) {
    if (!v[i].present()) continue;
    const bool half = v[i].dtype == fw::DType::kF16 || v[i].dtype == fw::DType::kBF16;
    std::uint64_t stored = f32_math && half ? 4 : v[i].esize;  // a broadcast dimension (stride 0) is read once
    for (std::uint32_t d = 0; d < v[i].rank; ++d)
      if (v[i].strides[d] != 0) stored *= v[i].shape[d];
    bytes += stored;
  }
  const View& y = v[op.num_tensors - 1];
  std::uint64_t macs = 0;
  const fw::DType in = v[0].dtype;
  bool one_channel = false;  // a kernel of one input channel per output: no dot products
  switch (op.kind) {
    case fw::OpKind::kConv2d:
    case fw::OpKind::kConvInteger:
      if (v[1].shape[0]) macs = y.elements() * (v[1].elements() / v[1].shape[0]);
      one_channel = v[1].shape[1] == 1;
      break;
    case fw::OpKind::kConvTranspose2d:  // W [Cin, Cout / groups, kh, kw]: its taps per input element
      if (v[1].shape[0]) macs = v[0].elements() * (v[1].elements() / v[1].shape[0]);
      break;
    case fw::OpKind::kQLinearConv:
      if (v[3].shape[0]) macs = y.elements() * (v[3].elements() / v[3].shape[0]);
      one_channel = v[3].shape[1] == 1;
      break;
    case fw::OpKind::kMatMul:
    case fw::OpKind::kMatMulInteger:
    case fw::OpKind::kQLinearMatMul:
      if (v[0].rank) macs = y.elements() * v[0].shape[v[0].rank - 1];
      break;
    case fw::OpKind::kPool2d: {  // a step per tap of each output: as many as a depthwise convolution's
      const auto& a = std::get<fw::PoolAttrs>(op.attrs);
      macs = y.elements() * a.kernel[0] * a.kernel[1];
      break;
    }
    default: break;
  }
  const bool int8 = (in == fw::DType::kU8 || in == fw::DType::kI8) && !one_channel;
  return bytes / 32 + macs / (int8 ? 64 : 16) + per_element_ns(op, y);
}

namespace {

// Whether the op is one of an int8 network's streaming loops
// (WorkerPool::begin_op): a float network's maps are not.
bool streaming(fw::OpKind kind, const View* v) {
  switch (kind) {
    case fw::OpKind::kElementwise: return v[0].esize == 1;  // its byte copies, casts and transposes
    case fw::OpKind::kQuantize:
    case fw::OpKind::kDequantize:
    case fw::OpKind::kGather:
    case fw::OpKind::kQLinearAdd:
    case fw::OpKind::kQLinearMul:
    case fw::OpKind::kQLinearGlobalAvgPool: return true;
    case fw::OpKind::kMatMul:
    case fw::OpKind::kConv2d:
    case fw::OpKind::kPool2d:
    case fw::OpKind::kSoftmax:
    case fw::OpKind::kMatMulInteger:
    case fw::OpKind::kConvInteger:
    case fw::OpKind::kQLinearMatMul:
    case fw::OpKind::kQLinearConv:
    case fw::OpKind::kResize:
    case fw::OpKind::kColorConvert:
    case fw::OpKind::kTopK:
    case fw::OpKind::kConvTranspose2d:
    case fw::OpKind::kWhere:
    case fw::OpKind::kCumSum:
    case fw::OpKind::kNms:
    case fw::OpKind::kScatterElements:
    case fw::OpKind::kRoiAlign:
    case fw::OpKind::kInvalid: return false;
  }
  return false;
}

}  // namespace

fw::Problem TensorEngine::run(const fw::OpBlock& op, const View* v) {
  std::lock_guard lock(mu_);
  dnnl_->threads =
      static_cast<int>(pool_.begin_op(op.num_tensors ? serial_estimate_ns(op, v) : 0, streaming(op.kind, v)));
  // One case per kind (engine_kinds.inc) and no default.
  switch (op.kind) {
#define TPUHAL_ENGINE_KIND(Name, id, Attrs) \
  case fw::OpKind::k##Name:                 \
    return run_##id(*this, std::get<fw::Attrs>(op.attrs), v);
#include "engine_kinds.inc"
#undef TPUHAL_ENGINE_KIND
    case fw::OpKind::kInvalid: return {fw::CmdStatus::kBadArgument, fw::kFieldOpKind, 0};
  }
  return {};
}

// The integer products' entry points: accumulators, then requantisation.
fw::Problem run_matmul_integer(TensorEngine& e, const fw::QuantAttrs& /*a*/, const View* v) {
  Accumulators acc(e, v[4], true);
  matmul_integer(e, v[0], v[1], v[2].present() ? &v[2] : nullptr, v[3].present() ? &v[3] : nullptr, acc.data);
  store_acc(acc, v[4]);
  return {};
}

fw::Problem run_conv_integer(TensorEngine& e, const fw::ConvAttrs& a, const View* v) {
  // conv_integer writes y's logical order densely: direct only for NCHW
  // y already dense, which the layout-independent scratch also covers.
  Accumulators acc(e, v[4], true);
  conv_integer(e, a, v[0], v[1], v[2].present() ? &v[2] : nullptr, v[3].present() ? &v[3] : nullptr, acc.data);
  store_acc(acc, v[4]);
  return {};
}

fw::Problem run_qlinear_matmul(TensorEngine& e, const fw::QuantAttrs& /*a*/, const View* v) {
  // A, AScale, AZp, B, BScale, BZp, YScale, YZp, Y
  Accumulators acc(e, v[8], false);
  matmul_integer(e, v[0], v[3], &v[2], &v[5], acc.data);
  const View &as = v[1], &bs = v[4], &y = v[8];
  const std::uint32_t r = y.rank;
  const std::uint64_t m = y.shape[r - 2], n = y.shape[r - 1];
  const float ys = load_float(v[6].data, fw::DType::kF32);
  if (v[0].shape[r - 1] == 0) {  // K = 0: every sum is 0 and y is its zero point
    requantize(e, acc.span(), y, std::vector<float>{0.0f}, 1,
               static_cast<std::int32_t>(load_int(v[7].data, v[7].dtype)));
    return {};
  }
  // The scales are views over A [.., M, K] and B [.., K, N], constant
  // along K; the decoder allows them to vary along M and N only when
  // batch dims do not broadcast them differently, so one of three
  // patterns holds: scalar, per column, per row.
  bool batch_varies = false;
  for (std::uint32_t d = 0; d + 2 < r; ++d) batch_varies = batch_varies || as.strides[d] || bs.strides[d];
  std::vector<float> mult;
  std::uint64_t div = 1;
  if (batch_varies || (as.strides[r - 2] && bs.strides[r - 1])) {
    mult.resize(acc.size);  // general: one multiplier per element
    for (std::uint64_t i = 0; i < acc.size; ++i) {
      std::uint64_t rem = i / (m * n), ia = 0, ib = 0;
      for (std::uint32_t d = r - 2; d-- > 0;) {
        const std::uint64_t idx = rem % y.shape[d];
        rem /= y.shape[d];
        ia += idx * as.strides[d];
        ib += idx * bs.strides[d];
      }
      ia += (i / n % m) * as.strides[r - 2];
      ib += (i % n) * bs.strides[r - 1];
      mult[i] = load_float(as.at(ia), fw::DType::kF32) * load_float(bs.at(ib), fw::DType::kF32) / ys;
    }
  } else if (as.strides[r - 2]) {  // per row
    for (std::uint64_t i = 0; i < m; ++i)
      mult.push_back(load_float(as.at(i * as.strides[r - 2]), fw::DType::kF32) * load_float(bs.data, fw::DType::kF32) /
                     ys);
    div = n;
  } else {  // per column (or scalar)
    for (std::uint64_t j = 0; j < n; ++j)
      mult.push_back(load_float(as.data, fw::DType::kF32) * load_float(bs.at(j * bs.strides[r - 1]), fw::DType::kF32) /
                     ys);
  }
  requantize(e, acc.span(), y, mult, div, static_cast<std::int32_t>(load_int(v[7].data, v[7].dtype)));
  return {};
}

fw::Problem run_qlinear_conv(TensorEngine& e, const fw::ConvAttrs& a, const View* v) {
  // X, XScale, XZp, W, WScale, WZp, YScale, YZp, Bias, Y
  const View& y = v[9];
  const bool nhwc = a.layout == static_cast<std::uint32_t>(fw::Layout::kNHWC);
  const std::uint64_t c = nhwc ? y.shape[3] : y.shape[1];
  const std::uint64_t hw = nhwc ? 1 : y.shape[2] * y.shape[3];
  // The scales and zero points are views broadcast over the tensor each
  // belongs to (x's, w's or y's shape). With no input channels, x's and
  // w's are empty: there is no scale to read, and the op is refused,
  // naming x's channels.
  for (const int i : {1, 2, 4, 5})
    if (v[i].data == nullptr)
      return {fw::CmdStatus::kBadArgument, fw::tensor_field(0, fw::TensorAspect::kShape, nhwc ? 3 : 1), 0, 1};
  const float xs = load_float(v[1].data, fw::DType::kF32), ys = load_float(v[6].data, fw::DType::kF32);
  std::vector<float> mult(c);
  for (std::uint64_t o = 0; o < c; ++o) mult[o] = xs * load_float(v[4].at(o * v[4].strides[0]), fw::DType::kF32) / ys;
  const auto y_zero = static_cast<std::int32_t>(load_int(v[7].data, v[7].dtype));
  std::vector<std::int32_t> bias;
  if (v[8].present()) {
    bias.resize(c);
    for (std::uint64_t o = 0; o < c; ++o)
      bias[o] = static_cast<std::int32_t>(load_int(v[8].at(o * v[8].strides[0]), fw::DType::kI32));
  }
  const std::int32_t* b = bias.empty() ? nullptr : bias.data();
  if (qlinear_conv_depthwise(e, a, v[0], v[3], &v[2], &v[5], y, mult, b, y_zero)) return {};
  // One pass where oneDNN's fused requantisation gives the same bytes.
  if (!b && qlinear_conv_fused(e, a, v[0], v[3], &v[2], &v[5], y, mult, y_zero)) return {};
  // Without VNNI, the layers oneDNN's f32 convolution takes exactly,
  // requantised in the same pass over its sums.
  if (qlinear_conv_as_f32(e, a, v[0], v[3], &v[2], &v[5], y, mult, b, y_zero)) return {};
  Accumulators acc(e, v[9], false);
  conv_integer(e, a, v[0], v[3], &v[2], &v[5], acc.data);
  requantize(e, acc.span(), y, mult, hw, y_zero, b);
  return {};
}

// Dense f32 copy of a float view (for f16 and bf16 where oneDNN lacks them).
View widened(TensorEngine& e, const View& v, Staged slot, float* into) {
  const std::uint64_t n = v.elements();
  float* store = into ? into : e.staged(slot, n);
  if (v.contiguous() && (v.dtype == fw::DType::kBF16 || v.dtype == fw::DType::kF16)) {
    const auto* src = reinterpret_cast<const std::uint16_t*>(v.data);
    const bool bf16 = v.dtype == fw::DType::kBF16;
    e.pool().parallel_for(n, [&](std::uint64_t begin, std::uint64_t end) {
      if (bf16)
        simd::widen_bf16(src + begin, store + begin, end - begin);
      else
        simd::widen_f16(src + begin, store + begin, end - begin);
    });
  } else {
    const View* views[1] = {&v};
    std::uint64_t i = 0;
    for_each_index(v.shape, v.rank, views, 0, v.elements(),
                   [&](const std::uint64_t* off) { store[i++] = load_float(v.at(off[0]), v.dtype); });
  }
  return staged_like(e, v, slot, store);
}

View widened_weights(TensorEngine& e, const View& v, Staged slot, std::uint64_t* serial) {
  if (serial) *serial = 0;
  if (!v.contiguous()) return widened(e, v, slot);
  const std::uint64_t n = v.elements();
  const std::size_t bytes = n * v.esize;
  // The packed cache's keys: what an entry is for, then its parameters.
  constexpr std::int64_t kWidenedFloats = 0x5744;  // "WD"
  PackedCache::Key key{kWidenedFloats, static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(v.data)),
                       static_cast<std::int64_t>(n), static_cast<std::int64_t>(v.dtype)};
  if (const float* hit = e.packed_cache().find(key, v.data, bytes, serial))
    return staged_like(e, v, slot, const_cast<float*>(hit));
  if (float* kept = e.packed_cache().insert(std::move(key), v.data, bytes, n, serial)) return widened(e, v, slot, kept);
  return widened(e, v, slot);
}

bool apart(const View& y, const View& a) {
  if (y.elements() == 0 || a.elements() == 0) return true;
  auto span = [](const View& v) {
    std::uint64_t last = 0;
    for (std::uint32_t d = 0; d < v.rank; ++d) last += (v.shape[d] - 1) * v.strides[d];
    return std::pair{v.data, v.data + (last + 1) * v.esize};
  };
  const auto [y0, y1] = span(y);
  const auto [a0, a1] = span(a);
  return y1 <= a0 || a1 <= y0;
}

View staged_like(TensorEngine& e, const View& v, Staged slot, float* data) {
  View out = v;
  out.data = reinterpret_cast<std::byte*>(data ? data : e.staged(slot, v.elements()));
  out.dtype = fw::DType::kF32;
  out.esize = 4;
  std::uint64_t step = 1;
  for (std::uint32_t d = v.rank; d-- > 0;) {
    out.strides[d] = step;
    step *= v.shape[d];
  }
  return out;
}

void narrow_into(TensorEngine& e, const View& from, const View& to) {
  const auto* src = reinterpret_cast<const float*>(from.data);
  if (to.contiguous() && (to.dtype == fw::DType::kBF16 || to.dtype == fw::DType::kF16)) {
    auto* dst = reinterpret_cast<std::uint16_t*>(to.data);
    const bool bf16 = to.dtype == fw::DType::kBF16;
    e.pool().parallel_for(to.elements(), [&](std::uint64_t begin, std::uint64_t end) {
      if (bf16)
        simd::narrow_bf16(src + begin, dst + begin, end - begin);
      else
        simd::narrow_f16(src + begin, dst + begin, end - begin);
    });
    return;
  }
  const View* views[1] = {&to};
  std::uint64_t i = 0;
  for_each_index(to.shape, to.rank, views, 0, to.elements(),
                 [&](const std::uint64_t* off) { store_float(to.at(off[0]), to.dtype, src[i++]); });
}

}  // namespace tpuhal::sim::tensor
