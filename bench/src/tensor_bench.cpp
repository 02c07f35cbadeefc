// GEMM and convolution on the device's tensor engine, each beside oneDNN
// doing the same work on the same thread count in the same run.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <oneapi/dnnl/dnnl.hpp>
#include <random>
#include <thread>

#include "tpuhal/base/wait.h"
#include "tpuhal/bench/bench.h"

namespace tpuhal::bench {
namespace {

using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// The threads the simulated engine computes with: the board's cores, bounded
// by this machine's and by TPUHAL_SIM_THREADS (the same rule the simulator
// applies; docs/ops.md).
int engine_threads(const Device& dev) {
  unsigned t = std::max(1u, dev.properties().tensor_cores);
  if (const char* env = std::getenv("TPUHAL_SIM_THREADS")) {
    const long n = std::strtol(env, nullptr, 10);
    if (n >= 1) return static_cast<int>(std::min(t, static_cast<unsigned>(n)));
  }
  return static_cast<int>(std::min(t, std::max(1u, std::thread::hardware_concurrency())));
}

void fill_random(std::span<std::byte> bytes, DType t, std::uint32_t seed) {
  std::mt19937 rng(seed);
  const std::size_t n = bytes.size() / size_of(t);
  for (std::size_t i = 0; i < n; ++i) {
    switch (t) {
      case DType::F32: {
        const float f = std::uniform_real_distribution<float>(-1, 1)(rng);
        std::memcpy(&bytes[i * 4], &f, 4);
        break;
      }
      case DType::BF16: {
        const float f = std::uniform_real_distribution<float>(-1, 1)(rng);
        std::uint32_t bits;
        std::memcpy(&bits, &f, 4);
        const auto h = static_cast<std::uint16_t>(bits >> 16);
        std::memcpy(&bytes[i * 2], &h, 2);
        break;
      }
      default:
        bytes[i] = static_cast<std::byte>(rng() & 0x7F);
        break;
    }
  }
}

// Seconds per run of `batch(n)`, which runs the work n times back to back
// (the device: n submissions, then one wait): the median over `rounds`
// after a warm-up round.
template <class F>
double time_median(int rounds, int n, F&& batch) {
  batch(1);
  std::vector<double> t;
  for (int i = 0; i < rounds; ++i) {
    // Let the other side's threads (OpenMP workers spin a while after a
    // parallel region) go idle first, so neither measurement pays for the
    // other's.
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    const auto t0 = base::monotonic_ns();
    batch(n);
    t.push_back(static_cast<double>(base::monotonic_ns() - t0) * 1e-9 / n);
  }
  return median(std::move(t));
}

// Runs `op` n times on `q`, back to back, and waits for the last.
void run_n(Queue& q, const Op& op, int n) {
  Fence last;
  for (int i = 0; i < n; ++i) last = q.run(op).submit();
  last.wait();
}

void emit(std::vector<Result>& out, Result r, const Options& o) {
  r.ratio = r.baseline > 0 ? r.value / r.baseline : 0;
  if (o.on_result) o.on_result(r);
  out.push_back(std::move(r));
}

}  // namespace

std::vector<Result> run_gemm(Device& dev, const Options& o) {
  std::vector<Result> out;
  if (!dev.properties().caps.tensor) return out;
  const int threads = engine_threads(dev);
  Queue q = dev.queue(Engine::Compute);
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(eng);
  struct Type {
    const char* name;
    DType in, out;
    dt din, dout;
  };
  const Type types[] = {{"f32", DType::F32, DType::F32, dt::f32, dt::f32},
                        {"bf16", DType::BF16, DType::F32, dt::bf16, dt::f32},
                        {"int8", DType::I8, DType::I32, dt::s8, dt::s32}};
  for (std::int64_t n : {std::int64_t{1024}, std::int64_t{2048}}) {
    if (o.quick && n > 1024) continue;
    for (const Type& t : types) {
      const std::uint64_t in_bytes = static_cast<std::uint64_t>(n * n) * size_of(t.in);
      const std::uint64_t out_bytes = static_cast<std::uint64_t>(n * n) * size_of(t.out);
      // Device side: A, B, Y in device memory, filled through pinned staging.
      Buffer ha = dev.allocate(in_bytes, Memory::HostPinned), hb = dev.allocate(in_bytes, Memory::HostPinned);
      fill_random(ha.map(), t.in, 1);
      fill_random(hb.map(), t.in, 2);
      Buffer a = dev.allocate(in_bytes), b = dev.allocate(in_bytes), y = dev.allocate(out_bytes);
      q.copy(ha, a).copy(hb, b).submit().wait();
      const Tensor ta(a, t.in, {n, n}), tb(b, t.in, {n, n}), ty(y, t.out, {n, n});
      const Op op = t.in == DType::I8 ? ops::matmul_integer(ta, tb, ty) : ops::matmul(ta, tb, ty);
      const int rounds = o.quick ? 1 : 5, per = n > 1024 ? 2 : 8;
      const double dev_s = time_median(rounds, per, [&](int k) { run_n(q, op, k); });

      // oneDNN alone on the same data, same threads.
      omp_set_num_threads(threads);
      const dnnl::memory::desc ad({n, n}, t.din, tag::ab), bd({n, n}, t.din, tag::ab), yd({n, n}, t.dout, tag::ab);
      dnnl::matmul prim(dnnl::matmul::primitive_desc(dnnl::matmul::desc(ad, bd, yd), eng));
      std::vector<std::byte> yhost(out_bytes);
      dnnl::memory am(ad, eng, ha.map().data()), bm(bd, eng, hb.map().data()), ym(yd, eng, yhost.data());
      const double ref_s = time_median(rounds, per, [&](int k) {
        for (int i = 0; i < k; ++i) prim.execute(stream, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, ym}});
        stream.wait();
      });
      const double flops = 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n);
      Result r;
      r.bench = "gemm";
      r.params = {{"size", std::to_string(n)}, {"dtype", t.name}, {"threads", std::to_string(threads)}};
      r.value = flops / dev_s / 1e9;
      r.unit = t.in == DType::I8 ? "GOPS" : "GFLOPS";
      r.baseline = flops / ref_s / 1e9;
      r.baseline_name = "oneDNN";
      emit(out, std::move(r), o);
    }
  }
  return out;
}

std::vector<Result> run_conv(Device& dev, const Options& o) {
  std::vector<Result> out;
  if (!dev.properties().caps.tensor) return out;
  const int threads = engine_threads(dev);
  Queue q = dev.queue(Engine::Compute);
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(eng);
  // N=1, 56x56, 64 -> 64 channels, 3x3, stride 1, pad 1; NHWC activations.
  constexpr std::int64_t N = 1, H = 56, W = 56, C = 64, O = 64, K = 3;
  const std::uint64_t xn = N * H * W * C, wn = O * C * K * K, yn = N * H * W * O;
  const int rounds = o.quick ? 2 : 9, per = 40;
  for (bool int8 : {false, true}) {
    const DType xt = int8 ? DType::U8 : DType::F32, wt = int8 ? DType::I8 : DType::F32;
    Buffer hx = dev.allocate(xn * size_of(xt), Memory::HostPinned), hw = dev.allocate(wn * size_of(wt), Memory::HostPinned);
    fill_random(hx.map(), xt, 3);
    fill_random(hw.map(), wt, 4);
    Buffer x = dev.allocate(xn * size_of(xt)), w = dev.allocate(wn * size_of(wt)), y = dev.allocate(yn * size_of(xt));
    q.copy(hx, x).copy(hw, w).submit().wait();
    ops::Conv2dOptions co;
    co.layout = Layout::NHWC;
    co.pads = {1, 1, 1, 1};
    const Tensor tx(x, xt, {N, H, W, C}), tw(w, wt, {O, C, K, K}), ty(y, xt, {N, H, W, O});
    Op op;
    // int8: QLinearConv with an activation zero point and per-channel weight
    // scales, as a quantised network runs it.
    Buffer params = dev.allocate(4096, Memory::HostPinned), dparams = dev.allocate(4096);
    const float x_scale = 0.02f, y_scale = 0.05f;
    const std::uint8_t x_zero = 128, y_zero = 120;
    std::vector<float> w_scale(O);
    for (std::int64_t i = 0; i < O; ++i) w_scale[i] = 0.001f + 0.0001f * static_cast<float>(i);
    if (int8) {
      auto p = params.map();
      std::memcpy(&p[0], &x_scale, 4);
      std::memcpy(&p[4], &y_scale, 4);
      std::memcpy(&p[8], &x_zero, 1);
      std::memcpy(&p[9], &y_zero, 1);
      std::memcpy(&p[10], "\0", 1);  // weight zero point 0
      std::memcpy(&p[64], w_scale.data(), O * 4);
      q.copy(params, dparams).submit().wait();
      op = ops::qlinear_conv(tx, Tensor(dparams, DType::F32, {}, 0), Tensor(dparams, DType::U8, {}, 8), tw,
                             Tensor(dparams, DType::F32, {O}, 64), Tensor(dparams, DType::I8, {}, 10),
                             Tensor(dparams, DType::F32, {}, 4), Tensor(dparams, DType::U8, {}, 9), ty, co);
    } else {
      op = ops::conv2d(tx, tw, ty, co);
    }
    const double dev_s = time_median(rounds, per, [&](int k) { run_n(q, op, k); });

    omp_set_num_threads(threads);
    const dnnl::memory::dims xdims{N, C, H, W}, wdims{O, C, K, K}, ydims{N, O, H, W};
    const dt dx = int8 ? dt::u8 : dt::f32, dw = int8 ? dt::s8 : dt::f32;
    const dnnl::memory::desc xd(xdims, dx, tag::nhwc), yd(ydims, dx, tag::nhwc), wd_any(wdims, dw, tag::any),
        wd_user(wdims, dw, tag::oihw);
    dnnl::primitive_attr attr;
    if (int8) {
      std::vector<float> scales(O);
      for (std::int64_t i = 0; i < O; ++i) scales[i] = x_scale * w_scale[i] / y_scale;
      attr.set_output_scales(2, scales);
      attr.set_zero_points(DNNL_ARG_SRC, 0, {x_zero});
      attr.set_zero_points(DNNL_ARG_DST, 0, {y_zero});
    }
    dnnl::convolution_forward::primitive_desc pd(
        dnnl::convolution_forward::desc(dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct, xd,
                                        wd_any, yd, {1, 1}, {1, 1}, {1, 1}),
        attr, eng);
    dnnl::memory xm(xd, eng, hx.map().data()), wuser(wd_user, eng, hw.map().data());
    std::vector<std::byte> yhost(yn * size_of(xt));
    dnnl::memory ym(yd, eng, yhost.data());
    dnnl::memory wm(pd.weights_desc(), eng);
    dnnl::reorder(wuser, wm).execute(stream, wuser, wm);  // once: oneDNN at its best
    dnnl::convolution_forward prim(pd);
    const double ref_s = time_median(rounds, per, [&](int k) {
      for (int i = 0; i < k; ++i) prim.execute(stream, {{DNNL_ARG_SRC, xm}, {DNNL_ARG_WEIGHTS, wm}, {DNNL_ARG_DST, ym}});
      stream.wait();
    });
    const double ops_count = 2.0 * static_cast<double>(yn) * C * K * K;
    Result r;
    r.bench = "conv";
    r.params = {{"shape", "1x56x56x64->64 3x3"}, {"dtype", int8 ? "int8" : "f32"}, {"threads", std::to_string(threads)}};
    r.value = ops_count / dev_s / 1e9;
    r.unit = int8 ? "GOPS" : "GFLOPS";
    r.baseline = ops_count / ref_s / 1e9;
    r.baseline_name = "oneDNN";
    emit(out, std::move(r), o);
  }
  return out;
}

}  // namespace tpuhal::bench
