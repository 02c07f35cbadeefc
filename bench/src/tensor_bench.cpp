// GEMM and convolution on the device's tensor engine, each beside oneDNN
// doing the same work on the same thread count in the same run.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <oneapi/dnnl/dnnl.hpp>
#include <random>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <memory>

#include "tpuhal/base/wait.h"
#include "raw_cuda.h"
#include "results.h"

namespace tpuhal::bench {
namespace {

using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

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
      case DType::F16: {  // truncated to binary16; tiny values flush to zero
        const float f = std::uniform_real_distribution<float>(-1, 1)(rng);
        std::uint32_t bits;
        std::memcpy(&bits, &f, 4);
        const std::uint32_t exp = (bits >> 23) & 0xFF;
        const auto h = static_cast<std::uint16_t>(((bits >> 16) & 0x8000) |
                                                  (exp >= 113 ? ((exp - 112) << 10) | ((bits >> 13) & 0x3FF) : 0));
        std::memcpy(&bytes[i * 2], &h, 2);
        break;
      }
      default: bytes[i] = static_cast<std::byte>(rng() & 0x7F); break;
    }
  }
}

// LLVM's libomp (a clang build's OpenMP runtime, oneDNN's too): how long
// the workers of the calling thread's teams spin after a region. Null
// under GNU libgomp, which spins briefly of its own accord.
extern "C" void kmp_set_blocktime(int msec) __attribute__((weak));

// The baseline's OpenMP workers spin after its rounds as the simulated
// engine's do after its ops (1 ms, docs/simulator.md), where the user has
// not said (KMP_BLOCKTIME, OMP_WAIT_POLICY): at libomp's default of 200
// ms they outlast the pause between the two sides and hold a core through
// the device's round, which then ran at half speed in one run of two.
void baseline_spins_like_the_engine() {
  if (kmp_set_blocktime && !std::getenv("KMP_BLOCKTIME") && !std::getenv("OMP_WAIT_POLICY")) kmp_set_blocktime(1);
}

// The device and its baseline timed in alternating rounds (so that a slow
// spell of the machine hits both): the median seconds per run of each, and
// the median of the rounds' speed ratios (device / baseline).
struct Paired {
  double dev_s, base_s, ratio;
};
template <class D, class B>
Paired time_paired(int rounds, int n, D&& dev, B&& base) {
  baseline_spins_like_the_engine();
  dev(1);
  base(1);
  std::vector<double> td, tb, ratios;
  for (int i = 0; i < rounds; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    auto t0 = base::monotonic_ns();
    dev(n);
    td.push_back(static_cast<double>(base::monotonic_ns() - t0) * 1e-9 / n);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    t0 = base::monotonic_ns();
    base(n);
    tb.push_back(static_cast<double>(base::monotonic_ns() - t0) * 1e-9 / n);
    ratios.push_back(tb.back() / td.back());
  }
  return {median(td), median(tb), median(ratios)};
}

// Runs `op` n times on `q`, back to back, and waits for the last.
void run_n(Queue& q, const Op& op, int n) {
  Fence last;
  for (int i = 0; i < n; ++i) last = q.run(op).submit();
  last.wait();
}

// The ISA oneDNN runs its kernels at in this process.
std::string onednn_isa() {
  switch (dnnl::get_effective_cpu_isa()) {
    case dnnl::cpu_isa::sse41: return "sse41";
    case dnnl::cpu_isa::avx: return "avx";
    case dnnl::cpu_isa::avx2: return "avx2";
    case dnnl::cpu_isa::avx2_vnni: return "avx2_vnni";
    case dnnl::cpu_isa::avx512_core: return "avx512";
    case dnnl::cpu_isa::avx512_core_vnni: return "avx512_vnni";
    case dnnl::cpu_isa::avx512_core_bf16: return "avx512_bf16";
    case dnnl::cpu_isa::avx512_core_amx: return "amx";
    default: return "other";
  }
}

// The level the device's tensor engine runs at, for simulated boards.
std::string isa_of(const Device& dev) {
  const std::string& isa = dev.properties().tensor_isa;
  return isa.empty() ? "-" : isa;
}

dt dnnl_dt(DType t) {
  switch (t) {
    case DType::F32: return dt::f32;
    case DType::BF16: return dt::bf16;
    case DType::F16: return dt::f16;
    case DType::I8: return dt::s8;
    case DType::U8: return dt::u8;
    case DType::I32: return dt::s32;
    default: return dt::undef;
  }
}

// oneDNN's matrix product of n x n operands of type `din`, or of f32 where
// it has no kernel (or only its reference one) for `din` on this CPU; on
// data of its own.
struct Baseline {
  std::string name;
  std::shared_ptr<std::vector<std::byte>> a, b, y;
  dnnl::matmul prim;
  std::unordered_map<int, dnnl::memory> args;
  void run(dnnl::stream& s) const { prim.execute(s, args); }
};

Baseline baseline_matmul(const dnnl::engine& eng, std::int64_t n, dt din, dt dout) {
  auto make = [&](dt i, dt out) {
    const dnnl::memory::desc ad({n, n}, i, tag::ab), bd({n, n}, i, tag::ab), yd({n, n}, out, tag::ab);
    return dnnl::matmul::primitive_desc(dnnl::matmul::desc(ad, bd, yd), eng);
  };
  Baseline base;
  std::string prec = din == dt::s8 ? "int8" : din == dt::bf16 ? "bf16" : din == dt::f16 ? "f16" : "f32";
  dnnl::matmul::primitive_desc pd;
  try {
    pd = make(din, dout);
    if (din != dt::f32 && std::string_view(pd.impl_info_str()).starts_with("ref"))
      throw dnnl::error(dnnl_unimplemented, "ref");
  } catch (const dnnl::error&) {
    din = dout = dt::f32;
    prec = "f32";
    pd = make(din, dout);
  }
  base.name = "oneDNN " + prec + " " + onednn_isa();
  const auto size = [&](dt d) { return static_cast<std::size_t>(n * n) * dnnl::memory::data_type_size(d); };
  base.a = std::make_shared<std::vector<std::byte>>(size(din));
  base.b = std::make_shared<std::vector<std::byte>>(size(din));
  base.y = std::make_shared<std::vector<std::byte>>(size(dout));
  const DType ht = din == dt::s8 ? DType::I8 : din == dt::bf16 ? DType::BF16 : din == dt::f16 ? DType::F16 : DType::F32;
  fill_random(*base.a, ht, 1);
  fill_random(*base.b, ht, 2);
  base.prim = dnnl::matmul(pd);
  base.args = {{DNNL_ARG_SRC, dnnl::memory(pd.src_desc(), eng, base.a->data())},
               {DNNL_ARG_WEIGHTS, dnnl::memory(pd.weights_desc(), eng, base.b->data())},
               {DNNL_ARG_DST, dnnl::memory(pd.dst_desc(), eng, base.y->data())}};
  return base;
}
// n x n operands of random data (the same every run) for a product of
// `in` into `out`, in device memory filled through pinned staging, and the
// op: matmul, or matmul_integer for int8.
struct GemmOperands {
  Buffer ha, hb, a, b, y;
  Op op;
};
GemmOperands gemm_operands(Device& dev, Queue& q, std::int64_t n, DType in, DType out) {
  const std::uint64_t in_bytes = static_cast<std::uint64_t>(n * n) * size_of(in);
  const std::uint64_t out_bytes = static_cast<std::uint64_t>(n * n) * size_of(out);
  GemmOperands g;
  g.ha = dev.allocate(in_bytes, Memory::HostPinned);
  g.hb = dev.allocate(in_bytes, Memory::HostPinned);
  fill_random(g.ha.map(), in, 1);
  fill_random(g.hb.map(), in, 2);
  g.a = dev.allocate(in_bytes);
  g.b = dev.allocate(in_bytes);
  g.y = dev.allocate(out_bytes);
  q.copy(g.ha, g.a).copy(g.hb, g.b).submit().wait();
  const Tensor ta(g.a, in, {n, n}), tb(g.b, in, {n, n}), ty(g.y, out, {n, n});
  g.op = in == DType::I8 ? ops::matmul_integer(ta, tb, ty) : ops::matmul(ta, tb, ty);
  return g;
}

// A GPU's matrix products beside cuBLAS called directly on the same data
// (raw_cuda.cpp), in alternating rounds, with the fraction of the GPU's
// dense peak for the precision.
std::vector<Result> run_gemm_gpu(Device& dev, const Options& o) {
  std::vector<Result> out;
  std::string why;
  auto raw = RawCuda::open(dev.uri(), 4096, &why);
  Queue q = dev.queue(Engine::Compute);
  struct Type {
    const char* name;
    DType in, out;
    const char *raw_in, *raw_out;
    double peak;  // TFLOPS (TOPS) of the GPU for it
  };
  const Properties& p = dev.properties();
  const Type types[] = {{"f32", DType::F32, DType::F32, "f32", "f32", p.peak_fp32_tflops},
                        {"f16", DType::F16, DType::F16, "f16", "f16", p.peak_fp16_tflops},
                        {"bf16", DType::BF16, DType::BF16, "bf16", "bf16", p.peak_fp16_tflops},
                        {"int8", DType::I8, DType::I32, "i8", "i32", p.peak_int8_tops}};
  for (std::int64_t n : {std::int64_t{1024}, std::int64_t{4096}, std::int64_t{8192}}) {
    if (o.quick != (n == 1024)) continue;
    for (const Type& t : types) {
      const GemmOperands g = gemm_operands(dev, q, n, t.in, t.out);
      const Op& op = g.op;
      const int rounds = o.quick ? 1 : 5, reps = n >= 8192 ? 4 : n >= 4096 ? 16 : 4;
      run_n(q, op, 1);
      std::vector<double> td;
      for (int r = 0; r < rounds; ++r) {
        const auto t0 = base::monotonic_ns();
        run_n(q, op, reps);
        td.push_back(static_cast<double>(base::monotonic_ns() - t0) * 1e-9 / reps);
      }
      const double dev_s = median(td);
      std::string raw_why = why;
      const double raw_s =
          raw ? raw->gemm_seconds(t.raw_in, t.raw_out, n, g.ha.map().data(), g.hb.map().data(), rounds, reps, &raw_why)
              : 0;
      const double ops_count = 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n);
      Result r;
      r.bench = "gemm";
      r.params = {{"size", std::to_string(n)}, {"dtype", t.name}, {"gpu", p.board}};
      r.value = ops_count / dev_s / 1e9;
      r.unit = t.in == DType::I8 ? "GOPS" : "GFLOPS";
      r.baseline = raw_s > 0 ? ops_count / raw_s / 1e9 : 0;
      r.baseline_name = raw_s > 0 ? std::string("cuBLAS cublasGemmEx ") + t.raw_in : "none (" + raw_why + ")";
      r.ratio = raw_s > 0 ? raw_s / dev_s : 0;
      if (t.peak > 0) r.extra["peak_fraction"] = r.value / (t.peak * 1e3);
      emit(out, std::move(r), o);
    }
  }
  return out;
}

}  // namespace

std::vector<Result> run_gemm(Device& dev, const Options& o) {
  std::vector<Result> out;
  if (!dev.properties().caps.tensor) return out;
  if (dev.properties().driver == "cuda") return run_gemm_gpu(dev, o);
  const int threads = engine_threads(dev);
  Queue q = dev.queue(Engine::Compute);
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(eng);
  struct Type {
    const char* name;
    DType in, out;
    dt din, dout;
  };
  // Every precision on every host: where oneDNN has no kernel for one on
  // this CPU, the baseline is its f32 product (converting to f32 is exact).
  const Type types[] = {{"f32", DType::F32, DType::F32, dt::f32, dt::f32},
                        {"bf16", DType::BF16, DType::F32, dt::bf16, dt::f32},
                        {"f16", DType::F16, DType::F32, dt::f16, dt::f32},
                        {"int8", DType::I8, DType::I32, dt::s8, dt::s32}};
  for (std::int64_t n : {std::int64_t{1024}, std::int64_t{2048}}) {
    if (o.quick && n > 1024) continue;
    for (const Type& t : types) {
      const GemmOperands g = gemm_operands(dev, q, n, t.in, t.out);
      const Op& op = g.op;
      const int rounds = o.quick ? 1 : 7, per = n > 1024 ? 2 : 8;
      // oneDNN alone on data of its own (f32 where it has no kernel for this
      // precision), same threads, in rounds alternating with the device's.
      omp_set_num_threads(threads);
      const Baseline base = baseline_matmul(eng, n, t.din, t.dout);
      const Paired p = time_paired(
          rounds, per, [&](int k) { run_n(q, op, k); },
          [&](int k) {
            omp_set_num_threads(threads);
            for (int i = 0; i < k; ++i) base.run(stream);
            stream.wait();
          });
      const double dev_s = p.dev_s, ref_s = p.base_s;
      const double flops = 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n);
      Result r;
      r.bench = "gemm";
      r.params = {
          {"size", std::to_string(n)}, {"dtype", t.name}, {"threads", std::to_string(threads)}, {"isa", isa_of(dev)}};
      r.value = flops / dev_s / 1e9;
      r.unit = t.in == DType::I8 ? "GOPS" : "GFLOPS";
      r.baseline = flops / ref_s / 1e9;
      r.baseline_name = base.name;
      r.ratio = p.ratio;
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
  for (const char* name : {"f32", "bf16", "f16", "int8"}) {
    const std::string prec = name;
    const bool int8 = prec == "int8";
    const DType xt = int8 ? DType::U8 : prec == "bf16" ? DType::BF16 : prec == "f16" ? DType::F16 : DType::F32;
    const DType wt = int8 ? DType::I8 : xt;
    Buffer hx = dev.allocate(xn * size_of(xt), Memory::HostPinned),
           hw = dev.allocate(wn * size_of(wt), Memory::HostPinned);
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
    omp_set_num_threads(threads);
    const dnnl::memory::dims xdims{N, C, H, W}, wdims{O, C, K, K}, ydims{N, O, H, W};
    dt dx = int8 ? dt::u8 : prec == "bf16" ? dt::bf16 : prec == "f16" ? dt::f16 : dt::f32;
    dt dw = int8 ? dt::s8 : dx;
    dnnl::primitive_attr attr;
    if (int8) {
      std::vector<float> scales(O);
      for (std::int64_t i = 0; i < O; ++i) scales[i] = x_scale * w_scale[i] / y_scale;
      attr.set_output_scales(2, scales);
      attr.set_zero_points(DNNL_ARG_SRC, 0, {x_zero});
      attr.set_zero_points(DNNL_ARG_DST, 0, {y_zero});
    }
    auto make = [&](dt sx, dt sw) {
      const dnnl::memory::desc xd(xdims, sx, tag::nhwc), yd(ydims, sx, tag::nhwc), wd_any(wdims, sw, tag::any);
      return dnnl::convolution_forward::primitive_desc(
          dnnl::convolution_forward::desc(dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct, xd,
                                          wd_any, yd, {1, 1}, {1, 1}, {1, 1}),
          attr, eng);
    };
    std::string base_name = "oneDNN " + prec;
    dnnl::convolution_forward::primitive_desc pd;
    try {
      pd = make(dx, dw);
      if (!int8 && dx != dt::f32 && std::string_view(pd.impl_info_str()).starts_with("ref"))
        throw dnnl::error(dnnl_unimplemented, "ref");
    } catch (const dnnl::error&) {
      dx = dw = dt::f32;  // no kernel for this precision here: its f32 convolution
      base_name = "oneDNN f32";
      pd = make(dx, dw);
    }
    const auto bytes = [](dt d) { return static_cast<std::uint64_t>(dnnl::memory::data_type_size(d)); };
    std::vector<std::byte> xhost(xn * bytes(dx)), whost(wn * bytes(dw)), yhost(yn * bytes(dx));
    if (dx == dnnl_dt(xt))
      std::memcpy(xhost.data(), hx.map().data(), xhost.size());
    else
      fill_random(xhost, DType::F32, 3);
    if (dw == dnnl_dt(wt))
      std::memcpy(whost.data(), hw.map().data(), whost.size());
    else
      fill_random(whost, DType::F32, 4);
    dnnl::memory xm(pd.src_desc(), eng, xhost.data()), wuser({wdims, dw, tag::oihw}, eng, whost.data());
    dnnl::memory ym(pd.dst_desc(), eng, yhost.data());
    dnnl::memory wm(pd.weights_desc(), eng);
    dnnl::reorder(wuser, wm).execute(stream, wuser, wm);  // once: oneDNN at its best
    dnnl::convolution_forward prim(pd);
    const Paired p = time_paired(
        rounds, per, [&](int k) { run_n(q, op, k); },
        [&](int k) {
          omp_set_num_threads(threads);
          for (int i = 0; i < k; ++i)
            prim.execute(stream, {{DNNL_ARG_SRC, xm}, {DNNL_ARG_WEIGHTS, wm}, {DNNL_ARG_DST, ym}});
          stream.wait();
        });
    const double dev_s = p.dev_s, ref_s = p.base_s;
    const double ops_count = 2.0 * static_cast<double>(yn) * C * K * K;
    Result r;
    r.bench = "conv";
    r.params = {
        {"shape", "1x56x56x64->64 3x3"}, {"dtype", prec}, {"threads", std::to_string(threads)}, {"isa", isa_of(dev)}};
    r.value = ops_count / dev_s / 1e9;
    r.unit = int8 ? "GOPS" : "GFLOPS";
    r.baseline = ops_count / ref_s / 1e9;
    r.baseline_name = base_name + " " + onednn_isa();
    r.ratio = p.ratio;
    emit(out, std::move(r), o);
  }
  return out;
}

}  // namespace tpuhal::bench
