// The same bits for any engine thread count, and the same integer results
// at every instruction-set level.
#include <tuple>

#include "ops_reference.hpp"

namespace tpuhal::ops_test {
namespace {

// ---- determinism across engine thread counts ----------------------------------------------------------------------

TEST(OpsDeterminism, ResultsAreBitIdenticalWhateverTheEngineThreadCount) {
  // Two boards of the same profile: the engine reads TPUHAL_SIM_THREADS
  // once, when it starts (the first op), and uses min(that, the profile's 8
  // cores, this machine's cores) threads. Every op may use them all, however
  // small (TPUHAL_SIM_SERIAL_BELOW_NS=0): these cases are small.
  const TempDir dir("tpuhal-ops");
  std::vector<std::unique_ptr<Lab>> labs;
  ::setenv("TPUHAL_SIM_SERIAL_BELOW_NS", "0", 1);
  for (const char* threads : {"1", "8"}) labs.push_back(fresh_lab(dir, "TPUHAL_SIM_THREADS", threads));
  ::unsetenv("TPUHAL_SIM_SERIAL_BELOW_NS");

  Rng rng;
  const std::uint64_t seed = test_seed();
  rng.seed(seed);
  // Builds the op on a lab from the same host data and returns its output bytes.
  using Build = std::function<Op(Lab&, const std::vector<Tensor>&, const Tensor&)>;
  struct Case {
    std::string name;
    std::vector<Host> inputs;
    DType ydt;
    Shape ys;
    Build build;
  };
  auto R = [&](DType t, Shape s) {
    return is_float(t) ? rand_host(rng, t, std::move(s), -1, 1) : rand_int(rng, t, std::move(s));
  };
  std::vector<Case> cases;
  cases.push_back({"matmul f32 8x8, K 8192",
                   {R(DType::F32, {8, 8192}), R(DType::F32, {8192, 8})},
                   DType::F32,
                   {8, 8},
                   [](Lab&, const std::vector<Tensor>& in, const Tensor& y) { return ops::matmul(in[0], in[1], y); }});
  cases.push_back({"matmul f32 64x96x80 with c and silu",
                   {R(DType::F32, {64, 80}), R(DType::F32, {80, 96}), R(DType::F32, {96})},
                   DType::F32,
                   {64, 96},
                   [](Lab&, const std::vector<Tensor>& in, const Tensor& y) {
                     MatMulOptions o;
                     o.c = in[2];
                     o.alpha = 0.5f;
                     o.activation = ActivationParams::silu();
                     return ops::matmul(in[0], in[1], y, o);
                   }});
  cases.push_back({"matmul bf16 batched",
                   {R(DType::BF16, {3, 48, 200}), R(DType::BF16, {200, 40})},
                   DType::BF16,
                   {3, 48, 40},
                   [](Lab&, const std::vector<Tensor>& in, const Tensor& y) { return ops::matmul(in[0], in[1], y); }});
  cases.push_back({"matmul f16 -> f32",
                   {R(DType::F16, {33, 300}), R(DType::F16, {300, 17})},
                   DType::F32,
                   {33, 17},
                   [](Lab&, const std::vector<Tensor>& in, const Tensor& y) { return ops::matmul(in[0], in[1], y); }});
  cases.push_back({"conv2d f32 NCHW",
                   {R(DType::F32, {2, 8, 20, 20}), R(DType::F32, {16, 8, 3, 3}), R(DType::F32, {16})},
                   DType::F32,
                   {2, 16, 20, 20},
                   [](Lab&, const std::vector<Tensor>& in, const Tensor& y) {
                     Conv2dOptions o;
                     o.pads = {1, 1, 1, 1};
                     o.bias = in[2];
                     return ops::conv2d(in[0], in[1], y, o);
                   }});
  cases.push_back({"conv_transpose2d f32 stride 2 with bias",
                   {R(DType::F32, {2, 8, 9, 9}), R(DType::F32, {8, 6, 4, 4}), R(DType::F32, {6})},
                   DType::F32,
                   {2, 6, 18, 18},
                   [](Lab&, const std::vector<Tensor>& in, const Tensor& y) {
                     Conv2dOptions o;
                     o.strides = {2, 2};
                     o.pads = {1, 1, 1, 1};
                     o.bias = in[2];
                     return ops::conv_transpose2d(in[0], in[1], y, o);
                   }});
  cases.push_back({"top_k f32 over 4096 lanes",
                   {R(DType::F32, {64, 300, 64})},
                   DType::I32,
                   {64, 5, 64},
                   [](Lab&, const std::vector<Tensor>& in, const Tensor& y) {
                     return ops::top_k(in[0], std::nullopt, y, {1, true, false});
                   }});
  cases.push_back({"conv2d f16 NHWC depthwise",
                   {R(DType::F16, {1, 16, 16, 12}), R(DType::F16, {12, 1, 3, 3})},
                   DType::F16,
                   {1, 8, 8, 12},
                   [](Lab&, const std::vector<Tensor>& in, const Tensor& y) {
                     Conv2dOptions o;
                     o.layout = Layout::NHWC;
                     o.groups = 12;
                     o.strides = {2, 2};
                     o.pads = {1, 1, 0, 0};
                     o.activation = ActivationParams::relu6();
                     return ops::conv2d(in[0], in[1], y, o);
                   }});
  // A 1x1 convolution of f16 in bands of pixels, the last one short.
  cases.push_back({"conv2d f16 NHWC 1x1 in bands",
                   {R(DType::F16, {2, 40, 37, 8}), R(DType::F16, {16, 8, 1, 1}), R(DType::F32, {16})},
                   DType::F16,
                   {2, 40, 37, 16},
                   [](Lab&, const std::vector<Tensor>& in, const Tensor& y) {
                     Conv2dOptions o;
                     o.layout = Layout::NHWC;
                     o.bias = in[2];
                     o.activation = ActivationParams::relu();
                     return ops::conv2d(in[0], in[1], y, o);
                   }});
  cases.push_back({"softmax f32 rows",
                   {R(DType::F32, {64, 300})},
                   DType::F32,
                   {64, 300},
                   [](Lab&, const std::vector<Tensor>& in, const Tensor& y) { return ops::softmax(in[0], y, -1); }});
  cases.push_back(
      {"log_softmax f32 axis 0",
       {R(DType::F32, {300, 64})},
       DType::F32,
       {300, 64},
       [](Lab&, const std::vector<Tensor>& in, const Tensor& y) { return ops::softmax(in[0], y, 0, true); }});
  Host qs(DType::F32, {}), qz(DType::U8, {});
  qs.v = {0.01};
  qz.v = {128};
  Host qsy(DType::F32, {});
  qsy.v = {0.37};
  cases.push_back({"qlinear_matmul u8",
                   {R(DType::U8, {64, 512}), qs, qz, R(DType::U8, {512, 32}), qs, qz, qsy, qz},
                   DType::U8,
                   {64, 32},
                   [](Lab&, const std::vector<Tensor>& in, const Tensor& y) {
                     return ops::qlinear_matmul(in[0], in[1], in[2], in[3], in[4], in[5], in[6], in[7], y);
                   }});
  cases.push_back({"qlinear_conv u8 NHWC",
                   {R(DType::U8, {1, 12, 12, 16}), qs, qz, R(DType::U8, {32, 16, 3, 3}), qs, qz, qsy, qz},
                   DType::U8,
                   {1, 12, 12, 32},
                   [](Lab&, const std::vector<Tensor>& in, const Tensor& y) {
                     Conv2dOptions o;
                     o.layout = Layout::NHWC;
                     o.pads = {1, 1, 1, 1};
                     return ops::qlinear_conv(in[0], in[1], in[2], in[3], in[4], in[5], in[6], in[7], y, o);
                   }});
  // qlinear_mul: an SE gate's rows taken in groups, a long single row
  // split across the threads, one value per row.
  const auto qmul = [](Lab&, const std::vector<Tensor>& in, const Tensor& y) {
    return ops::qlinear_mul(in[0], in[1], in[2], in[3], in[4], in[5], in[6], in[7], y);
  };
  for (const auto& [name, as, bs] :
       {std::tuple<const char*, Shape, Shape>{"qlinear_mul u8 SE gate", {2, 7, 7, 576}, {2, 1, 1, 576}},
        {"qlinear_mul u8 one long row", {1, 1, 1, 9000}, {1, 1, 1, 9000}},
        {"qlinear_mul u8 one value per row", {2, 5, 7, 3}, {2, 5, 7, 1}}})
    cases.push_back({name, {R(DType::U8, as), qs, qz, R(DType::U8, bs), qs, qz, qsy, qz}, DType::U8, as, qmul});
  cases.push_back(
      {"matmul_integer i8 K 20000",
       {R(DType::I8, {16, 20000}), R(DType::I8, {20000, 16})},
       DType::I32,
       {16, 16},
       [](Lab&, const std::vector<Tensor>& in, const Tensor& y) { return ops::matmul_integer(in[0], in[1], y); }});
  cases.push_back({"avg_pool2d f32",
                   {R(DType::F32, {2, 16, 20, 20})},
                   DType::F32,
                   {2, 16, 10, 10},
                   [](Lab&, const std::vector<Tensor>& in, const Tensor& y) {
                     Pool2dOptions o;
                     o.kernel = {3, 3};
                     o.strides = {2, 2};
                     o.pads = {1, 1, 0, 0};
                     return ops::avg_pool2d(in[0], y, o);
                   }});
  cases.push_back({"resize linear f32",
                   {R(DType::F32, {2, 8, 17, 13})},
                   DType::F32,
                   {2, 8, 40, 30},
                   [](Lab&, const std::vector<Tensor>& in, const Tensor& y) {
                     ResizeOptions o;
                     o.mode = ResizeMode::Linear;
                     return ops::resize(in[0], y, o);
                   }});
  for (const Case& c : cases) {
    std::vector<std::vector<std::byte>> results;
    for (auto& l : labs) {
      std::vector<Tensor> in;
      for (const Host& h : c.inputs) in.push_back(l->upload(h));
      const Tensor y = l->output(c.ydt, c.ys);
      l->run(c.build(*l, in, y));
      results.push_back(l->bytes(y.buffer()));
      // The same op again on the same board gives the same bits too.
      l->run(c.build(*l, in, y));
      EXPECT_EQ(l->bytes(y.buffer()), results.back()) << c.name << ": a second run differs (seed " << seed << ")";
    }
    ASSERT_EQ(results[0].size(), results[1].size());
    std::size_t first = results[0].size();
    for (std::size_t i = 0; i < results[0].size() && first == results[0].size(); ++i)
      if (results[0][i] != results[1][i]) first = i;
    EXPECT_EQ(first, results[0].size()) << c.name << ": 1 thread and "
                                        << "8 threads differ from byte " << first << " (seed " << seed << ")";
  }
}

// ---- the same integer results at every instruction-set level ------------------------------------------------------

TEST(OpsIsa, IntegerOpsAreBitIdenticalAtEveryInstructionSetLevel) {
  const TempDir dir("tpuhal-isa");
#if defined(__x86_64__)
  const char* levels[] = {"sse2", "sse41", "avx2", "avx512", "avx512_vnni"};
#elif defined(__aarch64__)
  const char* levels[] = {"generic", "neon"};
#else
  const char* levels[] = {"generic"};
#endif
  // One board per level this CPU has (a cap above it gives the CPU's level).
  std::vector<std::unique_ptr<Lab>> labs;
  std::vector<std::string> names;
  for (const char* level : levels) {
    auto lab = fresh_lab(dir, "TPUHAL_MAX_ISA", level);
    const std::string have = lab->dev.properties().tensor_isa;
    if (std::find(names.begin(), names.end(), have) != names.end()) continue;
    ASSERT_EQ(have, level) << "a board capped at " << level << " runs at " << have;
    names.push_back(have);
    labs.push_back(std::move(lab));
  }
  ASSERT_FALSE(labs.empty());

  Rng rng;
  const std::uint64_t seed = test_seed();
  rng.seed(seed);
  using Build = std::function<Op(const std::vector<Tensor>&, const Tensor&)>;
  struct Case {
    std::string name;
    std::vector<Host> inputs;
    DType ydt;
    Shape ys;
    Build build;
  };
  auto I = [&](DType t, Shape s) { return rand_int(rng, t, std::move(s)); };
  auto scalar = [](DType t, double v) {
    Host h(t, {});
    h.v = {v};
    return h;
  };
  std::vector<Case> cases;
  // Full-range operands and zero points: products and sums as large as
  // int8 gets, sums past 2^24 and wrapping past 2^31.
  cases.push_back({"matmul_integer u8 x i8, row and column zero points, K 3001",
                   {I(DType::U8, {37, 3001}), I(DType::I8, {3001, 45}), I(DType::U8, {37}), I(DType::I8, {45})},
                   DType::I32,
                   {37, 45},
                   [](const std::vector<Tensor>& in, const Tensor& y) {
                     return ops::matmul_integer(in[0], in[1], y, in[2], in[3]);
                   }});
  cases.push_back(
      {"matmul_integer i8 x u8 batched, K 70000",
       {I(DType::I8, {2, 3, 70000}), I(DType::U8, {70000, 5}), scalar(DType::I8, -128), scalar(DType::U8, 0)},
       DType::I32,
       {2, 3, 5},
       [](const std::vector<Tensor>& in, const Tensor& y) {
         return ops::matmul_integer(in[0], in[1], y, in[2], in[3]);
       }});
  cases.push_back(
      {"conv_integer u8 x u8 NCHW groups 2, pads, per-channel zero points",
       {I(DType::U8, {2, 8, 13, 11}), I(DType::U8, {6, 4, 3, 3}), scalar(DType::U8, 131), I(DType::U8, {6})},
       DType::I32,
       {2, 6, 7, 5},
       [](const std::vector<Tensor>& in, const Tensor& y) {
         Conv2dOptions o;
         o.groups = 2;
         o.strides = {2, 2};
         o.pads = {1, 1, 1, 0};
         return ops::conv_integer(in[0], in[1], y, in[2], in[3], o);
       }});
  cases.push_back(
      {"conv_integer i8 x i8 NHWC dilated",
       {I(DType::I8, {1, 12, 12, 40}), I(DType::I8, {24, 40, 3, 3}), scalar(DType::I8, -3), scalar(DType::I8, 5)},
       DType::I32,
       {1, 10, 10, 24},
       [](const std::vector<Tensor>& in, const Tensor& y) {
         Conv2dOptions o;
         o.layout = Layout::NHWC;
         o.dilations = {2, 2};
         o.pads = {1, 1, 1, 1};
         return ops::conv_integer(in[0], in[1], y, in[2], in[3], o);
       }});
  Host qs = scalar(DType::F32, 0.013), qsy = scalar(DType::F32, 0.41);
  cases.push_back({"qlinear_matmul u8 x u8",
                   {I(DType::U8, {64, 700}), qs, scalar(DType::U8, 128), I(DType::U8, {700, 48}), qs,
                    scalar(DType::U8, 3), qsy, scalar(DType::U8, 100)},
                   DType::U8,
                   {64, 48},
                   [](const std::vector<Tensor>& in, const Tensor& y) {
                     return ops::qlinear_matmul(in[0], in[1], in[2], in[3], in[4], in[5], in[6], in[7], y);
                   }});
  Host ws(DType::F32, {32});
  for (int i = 0; i < 32; ++i) ws.v.push_back(0.001 + 0.0003 * i);
  cases.push_back(
      {"qlinear_conv u8 x i8 NHWC per-channel scales and bias",
       {I(DType::U8, {2, 14, 14, 64}), scalar(DType::F32, 0.02), scalar(DType::U8, 128), I(DType::I8, {32, 64, 3, 3}),
        ws, scalar(DType::I8, 0), qsy, scalar(DType::U8, 120), I(DType::I32, {32})},
       DType::U8,
       {2, 14, 14, 32},
       [](const std::vector<Tensor>& in, const Tensor& y) {
         Conv2dOptions o;
         o.layout = Layout::NHWC;
         o.pads = {1, 1, 1, 1};
         o.bias = in[8];
         return ops::qlinear_conv(in[0], in[1], in[2], in[3], in[4], in[5], in[6], in[7], y, o);
       }});
  // Layers of at most 256 taps an output that expand (a first layer, a
  // 1x1), which levels without VNNI run as oneDNN's f32 convolution of the
  // same integers: the largest sums 256 taps reach, and per-channel weight
  // zero points.
  Host x255(DType::U8, {1, 6, 6, 256}), w255(DType::U8, {258, 256, 1, 1}), wz255(DType::U8, {258});
  std::fill(x255.v.begin(), x255.v.end(), 255.0);
  for (std::size_t i = 0; i < w255.v.size(); ++i) w255.v[i] = (i / 256) % 2 ? 0.0 : 255.0;
  for (std::size_t i = 0; i < wz255.v.size(); ++i) wz255.v[i] = i % 2 ? 255.0 : 0.0;
  // A bias of up to 11 levels either way once requantised (below).
  Host small_bias(DType::I32, {258});
  for (std::size_t i = 0; i < small_bias.v.size(); ++i) small_bias.v[i] = static_cast<double>(i % 7) * 5e5 - 1.5e6;
  cases.push_back({"conv_integer u8 x u8 NHWC 1x1, 256 taps of 255 * 255",
                   {x255, w255, scalar(DType::U8, 0), wz255},
                   DType::I32,
                   {1, 6, 6, 258},
                   [](const std::vector<Tensor>& in, const Tensor& y) {
                     Conv2dOptions o;
                     o.layout = Layout::NHWC;
                     return ops::conv_integer(in[0], in[1], y, in[2], in[3], o);
                   }});
  // Requantised to within the output's range: 256 * 255 * 255 times
  // 0.02 * 1.5e-4 / 0.41, about 122 levels either side of 128.
  cases.push_back({"qlinear_conv u8 x u8 NHWC 1x1, 256 taps of 255 * 255",
                   {x255, scalar(DType::F32, 0.02), scalar(DType::U8, 0), w255, scalar(DType::F32, 1.5e-4), wz255, qsy,
                    scalar(DType::U8, 128), small_bias},
                   DType::U8,
                   {1, 6, 6, 258},
                   [](const std::vector<Tensor>& in, const Tensor& y) {
                     Conv2dOptions o;
                     o.layout = Layout::NHWC;
                     o.bias = in[8];
                     return ops::qlinear_conv(in[0], in[1], in[2], in[3], in[4], in[5], in[6], in[7], y, o);
                   }});
  cases.push_back({"qlinear_conv i8 x i8 NHWC first layer, per-channel zero points",
                   {I(DType::I8, {2, 19, 19, 3}), scalar(DType::F32, 0.02), scalar(DType::I8, -7),
                    I(DType::I8, {32, 3, 3, 3}), ws, I(DType::I8, {32}), qsy, scalar(DType::I8, 3)},
                   DType::I8,
                   {2, 10, 10, 32},
                   [](const std::vector<Tensor>& in, const Tensor& y) {
                     Conv2dOptions o;
                     o.layout = Layout::NHWC;
                     o.strides = {2, 2};
                     o.pads = {1, 1, 1, 1};
                     return ops::qlinear_conv(in[0], in[1], in[2], in[3], in[4], in[5], in[6], in[7], y, o);
                   }});
  cases.push_back(
      {"conv_integer u8 x i8 NCHW 1x1 expanding",
       {I(DType::U8, {2, 24, 9, 9}), I(DType::I8, {144, 24, 1, 1}), scalar(DType::U8, 128), I(DType::I8, {144})},
       DType::I32,
       {2, 144, 9, 9},
       [](const std::vector<Tensor>& in, const Tensor& y) {
         return ops::conv_integer(in[0], in[1], y, in[2], in[3], Conv2dOptions{});
       }});
  cases.push_back({"qlinear_conv u8 x i8 NCHW depthwise",
                   {I(DType::U8, {1, 32, 17, 17}), scalar(DType::F32, 0.02), scalar(DType::U8, 7),
                    I(DType::I8, {32, 1, 3, 3}), ws, scalar(DType::I8, 0), qsy, scalar(DType::U8, 120)},
                   DType::U8,
                   {1, 32, 9, 9},
                   [](const std::vector<Tensor>& in, const Tensor& y) {
                     Conv2dOptions o;
                     o.groups = 32;
                     o.strides = {2, 2};
                     o.pads = {1, 1, 1, 1};
                     return ops::qlinear_conv(in[0], in[1], in[2], in[3], in[4], in[5], in[6], in[7], y, o);
                   }});
  cases.push_back({"qlinear_add u8 + i8 -> u8, a length with a tail",
                   {I(DType::U8, {3, 1001}), scalar(DType::F32, 0.013), scalar(DType::U8, 128), I(DType::I8, {3, 1001}),
                    scalar(DType::F32, 0.125), scalar(DType::I8, -5), qsy, scalar(DType::U8, 100)},
                   DType::U8,
                   {3, 1001},
                   [](const std::vector<Tensor>& in, const Tensor& y) {
                     return ops::qlinear_add(in[0], in[1], in[2], in[3], in[4], in[5], in[6], in[7], y);
                   }});
  cases.push_back(
      {"qlinear_mul u8 x i8 -> u8, an SE gate",
       {I(DType::U8, {2, 9, 9, 40}), scalar(DType::F32, 0.013), scalar(DType::U8, 128), I(DType::I8, {2, 1, 1, 40}),
        scalar(DType::F32, 0.125), scalar(DType::I8, -5), qsy, scalar(DType::U8, 100)},
       DType::U8,
       {2, 9, 9, 40},
       [](const std::vector<Tensor>& in, const Tensor& y) {
         return ops::qlinear_mul(in[0], in[1], in[2], in[3], in[4], in[5], in[6], in[7], y);
       }});
  for (const Case& c : cases) {
    std::vector<std::vector<std::byte>> results;
    for (auto& l : labs) {
      std::vector<Tensor> in;
      for (const Host& h : c.inputs) in.push_back(l->upload(h));
      const Tensor y = l->output(c.ydt, c.ys);
      l->run(c.build(in, y));
      results.push_back(l->bytes(y.buffer()));
    }
    for (std::size_t i = 1; i < results.size(); ++i) {
      std::size_t first = results[0].size();
      for (std::size_t b = 0; b < results[0].size() && first == results[0].size(); ++b)
        if (results[0][b] != results[i][b]) first = b;
      EXPECT_EQ(first, results[0].size()) << c.name << ": " << names[0] << " and " << names[i] << " differ from byte "
                                          << first << " (seed " << seed << ")";
    }
  }
}

}  // namespace
}  // namespace tpuhal::ops_test
