// conv2d: random and specific geometries, zero input channels.
#include "ops_reference.hpp"

namespace tpuhal::ops_test {
namespace {

TEST_P(Ops, Conv2dMatchesTheReferenceForRandomGeometries) {
  for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
    const int cases = dt == DType::F32 ? 14 : 7;
    for (int i = 0; i < cases; ++i) {
      const ConvCase c = random_conv(rng_);
      const Host x = rand(dt, c.xs), w = rand(dt, c.ws);
      const Shape ys = conv_out_shape(x, c.ws, c.g);
      std::optional<Host> bias;
      if (rng_.coin()) bias = rand(rng_.coin() ? dt : DType::F32, {c.ws[0]});
      const ActivationParams act = rng_.pick(all_activations(rng_));
      Conv2dOptions o = c.g.options();
      o.activation = act;
      if (bias) o.bias = lab().upload(*bias);
      const Tensor y = lab().output(dt, ys);
      const Host got = lab().run(ops::conv2d(lab().upload(x), lab().upload(w), y, o), y);
      expect("conv2d " + std::string(to_string(dt)) + " x " + dims(c.xs) + " w " + dims(c.ws) + " " + c.g.text() +
                 (bias ? " bias" : "") + " " + act_name(act),
             got, ref_conv(x, w, bias, c.g, act, dt, ys));
    }
  }
}

TEST_P(Ops, Conv2dSpecificGeometries) {
  struct Case {
    const char* name;
    Shape nchw;  // x as N, C, H, W
    Shape ws;
    ConvGeom g;
  };
  auto geom = [](std::array<std::uint32_t, 2> s, std::array<std::uint32_t, 2> d, std::array<std::uint32_t, 4> p,
                 std::uint32_t groups) {
    ConvGeom g;
    g.strides = s;
    g.dilations = d;
    g.pads = p;
    g.groups = groups;
    return g;
  };
  const std::vector<Case> cases{
      {"1x1", {2, 5, 7, 6}, {4, 5, 1, 1}, geom({1, 1}, {1, 1}, {0, 0, 0, 0}, 1)},
      {"1x1 stride 2", {1, 3, 7, 6}, {8, 3, 1, 1}, geom({2, 2}, {1, 1}, {0, 0, 0, 0}, 1)},
      {"1x1 padded past the kernel", {1, 2, 3, 4}, {3, 2, 1, 1}, geom({1, 1}, {1, 1}, {2, 1, 3, 2}, 1)},
      {"2x2 pads 3", {1, 2, 4, 4}, {2, 2, 2, 2}, geom({1, 2}, {1, 1}, {3, 0, 1, 3}, 1)},
      {"depthwise 3x3", {1, 6, 8, 8}, {6, 1, 3, 3}, geom({1, 1}, {1, 1}, {1, 1, 1, 1}, 6)},
      {"depthwise multiplier 2", {2, 4, 7, 5}, {8, 1, 3, 3}, geom({2, 1}, {1, 2}, {1, 2, 0, 1}, 4)},
      {"kernel covers the input", {1, 3, 5, 4}, {2, 3, 5, 4}, geom({1, 1}, {1, 1}, {0, 0, 0, 0}, 1)},
      {"1x1 input, padded", {1, 2, 1, 1}, {3, 2, 3, 3}, geom({1, 1}, {1, 1}, {1, 1, 1, 1}, 1)},
      {"dilated, strided, asymmetric", {1, 4, 11, 9}, {6, 2, 3, 2}, geom({2, 3}, {2, 3}, {0, 3, 2, 1}, 2)},
      // An f16 result finished (activated and narrowed) in several blocks
      // per thread.
      {"3x3 with many outputs", {1, 8, 40, 36}, {16, 8, 3, 3}, geom({1, 1}, {1, 1}, {1, 1, 1, 1}, 1)},
  };
  for (const Case& c : cases)
    for (Layout layout : {Layout::NCHW, Layout::NHWC})
      for (DType dt : {DType::F32, DType::F16}) {
        ConvGeom g = c.g;
        g.layout = layout;
        const Host x = rand(dt, img_shape(layout, c.nchw[0], c.nchw[1], c.nchw[2], c.nchw[3])), w = rand(dt, c.ws);
        const Host bias = rand(DType::F32, {c.ws[0]});
        const Shape ys = conv_out_shape(x, c.ws, g);
        ASSERT_FALSE(ys.empty()) << c.name;
        Conv2dOptions o = g.options();
        o.bias = lab().upload(bias);
        o.activation = ActivationParams::relu();
        const Tensor y = lab().output(dt, ys);
        const Host got = lab().run(ops::conv2d(lab().upload(x), lab().upload(w), y, o), y);
        expect(std::string("conv2d ") + c.name + " " + to_string(dt) + " " + g.text(), got,
               ref_conv(x, w, bias, g, o.activation, dt, ys));
      }
}

// The f16 and bf16 routes of CPUs where oneDNN has no kernel for the
// type, over more than a few rows (the capped instruction-set runs take
// them for bf16 too): a 1x1 convolution in bands of pixels (several, the
// last one short), a depthwise one a row at a time (dilated rows kept
// while later rows read them), each with x and y views of wider tensors
// (pixels at a step of their own), with and without accumulating; and 3x3
// ones in bands of output rows, each band with the padding it meets.
TEST_P(Ops, Conv2dInBandsAndRowsMatchesTheReference) {
  struct Case {
    const char* name;
    Shape x;  // N, H, W, C (NHWC)
    Shape ws;
    ConvGeom g;
    bool every;  // f16 and bf16, with and without views and accumulating; else f16, plain and both
  };
  ConvGeom pointwise, dilated, strided, padded, uneven;
  for (ConvGeom* g : {&pointwise, &dilated, &strided, &padded, &uneven}) g->layout = Layout::NHWC;
  dilated.groups = 24;
  dilated.dilations = {2, 2};
  dilated.pads = {2, 2, 2, 2};
  strided.groups = 20;
  strided.strides = {2, 2};
  strided.pads = {2, 1, 2, 2};
  padded.pads = {1, 1, 1, 1};
  uneven.strides = {2, 1};
  uneven.dilations = {2, 1};
  uneven.pads = {1, 0, 3, 1};
  const std::vector<Case> cases{
      {"1x1 in bands", {2, 40, 37, 8}, {16, 8, 1, 1}, pointwise, true},  // 1488 pixels, then 1472
      {"depthwise 3x3 dilated 2", {2, 23, 19, 24}, {24, 1, 3, 3}, dilated, true},
      {"depthwise 5x5 strided 2", {1, 17, 22, 20}, {20, 1, 5, 5}, strided, true},
      // Four bands of output rows (8, 8, 8, 6): the first in the top
      // padding, the last in the bottom's.
      {"3x3 in row bands", {1, 30, 64, 64}, {2, 64, 3, 3}, padded, false},
      // Strided and dilated rows, padding uneven, a shorter last band.
      {"3x3 strided 2 dilated 2 in row bands", {1, 50, 60, 48}, {2, 48, 3, 3}, uneven, false},
  };
  for (const Case& c : cases)
    for (DType dt : {DType::F16, DType::BF16})
      for (const bool views : {false, true})
        for (const bool accumulate : {false, true}) {
          if (!c.every && (dt != DType::F16 || views != accumulate)) continue;
          const std::string what = std::string("conv2d ") + c.name + " " + to_string(dt) + (views ? " views" : "") +
                                   (accumulate ? " accumulating" : "");
          const Host x = rand(dt, c.x), w = rand(dt, c.ws), bias = rand(DType::F32, {c.ws[0]});
          const Shape ys = conv_out_shape(x, c.ws, c.g);
          ASSERT_FALSE(ys.empty()) << what;
          const Host prior = rand(dt, ys, -2, 2);
          // A view: the first channels of a tensor 3 channels wider, whose
          // other channels must stay as they were.
          const auto place = [&](const Host& h, Host& wide) {
            Shape s = h.shape;
            s[3] += 3;
            wide = rand(dt, s);
            for (std::int64_t p = 0; p < numel(h.shape) / h.shape[3]; ++p)
              for (std::int64_t ch = 0; ch < h.shape[3]; ++ch)
                wide.v[static_cast<std::size_t>(p * s[3] + ch)] = h.v[static_cast<std::size_t>(p * h.shape[3] + ch)];
            const Tensor t = lab().upload(wide);
            return Tensor(t.buffer(), dt, h.shape, {s[1] * s[2] * s[3], s[2] * s[3], s[3], 1}, 0);
          };
          Host xwide, ywide;
          const Tensor xt = views ? place(x, xwide) : lab().upload(x);
          const Tensor yt = views ? place(prior, ywide) : accumulate ? lab().upload(prior) : lab().output(dt, ys);
          Conv2dOptions o = c.g.options();
          o.bias = lab().upload(bias);
          o.activation = ActivationParams::relu6();
          o.accumulate = accumulate;
          lab().run(ops::conv2d(xt, lab().upload(w), yt, o));
          const Ref want = ref_conv(x, w, bias, c.g, o.activation, dt, ys, accumulate ? &prior : nullptr);
          if (!views) {
            expect(what, lab().download(yt), want);
            continue;
          }
          const Host after = lab().download(Tensor(yt.buffer(), dt, ywide.shape));
          Host got(dt, ys);
          std::vector<double> gaps, gaps_before;
          const std::int64_t wide_c = ywide.shape[3];
          for (std::int64_t i = 0; i < numel(ywide.shape); ++i) {
            const std::int64_t p = i / wide_c, ch = i % wide_c;
            if (ch < ys[3]) {
              got.v[static_cast<std::size_t>(p * ys[3] + ch)] = after.v[static_cast<std::size_t>(i)];
            } else {
              gaps.push_back(after.v[static_cast<std::size_t>(i)]);
              gaps_before.push_back(ywide.v[static_cast<std::size_t>(i)]);
            }
          }
          expect(what, got, want);
          Host gap_host(dt, {static_cast<std::int64_t>(gaps.size())});
          gap_host.v = gaps;
          expect_exact(what + ": the channels beside y's", gap_host, gaps_before);
        }
  // x a broadcast view (one pixel's channels at stride 0 over N, H and W):
  // read as it says, never as dense pixels.
  for (const bool pointwise_kernel : {true, false}) {
    ConvGeom g;
    g.layout = Layout::NHWC;
    if (!pointwise_kernel) g.pads = {1, 1, 1, 1};
    const Host one = rand(DType::F16, {1, 1, 1, 8}),
               w = rand(DType::F16, {4, 8, pointwise_kernel ? 1 : 3, pointwise_kernel ? 1 : 3});
    Host x(DType::F16, {2, 6, 5, 8});
    for (std::size_t i = 0; i < x.v.size(); ++i) x.v[i] = one.v[i % 8];
    const Tensor xt(lab().upload(one).buffer(), DType::F16, {2, 6, 5, 8}, {0, 0, 0, 1}, 0);
    const Shape ys = conv_out_shape(x, w.shape, g);
    const Tensor y = lab().output(DType::F16, ys);
    expect(std::string("conv2d f16 of a broadcast x ") + (pointwise_kernel ? "1x1" : "3x3"),
           lab().run(ops::conv2d(xt, lab().upload(w), y, g.options()), y),
           ref_conv(x, w, std::nullopt, g, ActivationParams{}, DType::F16, ys));
  }
}

// Conv2dOptions::accumulate: y = act(conv + bias + y as it was), in every
// float type and layout, by each of the engine's routes: oneDNN writing y
// (its sum post-op), the engine's own depthwise loop in NCHW, a scratch
// finished afterwards (f16, an activation into bf16, a strided y).
TEST_P(Ops, Conv2dAccumulatesIntoWhatYHolds) {
  for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
    for (int i = 0; i < 8; ++i) {
      const ConvCase c = random_conv(rng_);
      const Host x = rand(dt, c.xs), w = rand(dt, c.ws);
      const Shape ys = conv_out_shape(x, c.ws, c.g);
      const Host prior = rand(dt, ys, -2, 2);
      std::optional<Host> bias;
      if (rng_.coin()) bias = rand(DType::F32, {c.ws[0]});
      Conv2dOptions o = c.g.options();
      o.activation = i % 2 ? ActivationParams::relu() : ActivationParams{};
      o.accumulate = true;
      if (bias) o.bias = lab().upload(*bias);
      const Tensor y = lab().upload(prior);
      expect("conv2d accumulating " + std::string(to_string(dt)) + " x " + dims(c.xs) + " w " + dims(c.ws) + " " +
                 c.g.text() + (bias ? " bias" : "") + " " + act_name(o.activation),
             lab().run(ops::conv2d(lab().upload(x), lab().upload(w), y, o), y),
             ref_conv(x, w, bias, c.g, o.activation, dt, ys, &prior));
    }
    // A depthwise NHWC convolution of 5 channels with a bias, strided,
    // dilated and padded unevenly: oneDNN's SSE4.1 depthwise kernel with
    // its sum post-op crashed on it (TPUHAL_MAX_ISA=sse41 runs it on the
    // engine's loops instead).
    {
      ConvGeom g;
      g.layout = Layout::NHWC;
      g.groups = 5;
      g.strides = {3, 3};
      g.dilations = {2, 1};
      g.pads = {2, 2, 1, 3};
      const Host x = rand(dt, {1, 8, 8, 5}), w = rand(dt, {5, 1, 4, 3});
      const Host bias = rand(DType::F32, {5});
      const Shape ys = conv_out_shape(x, w.shape, g);
      const Host prior = rand(dt, ys, -2, 2);
      Conv2dOptions o = g.options();
      o.accumulate = true;
      o.bias = lab().upload(bias);
      const Tensor y = lab().upload(prior);
      expect(std::string("conv2d accumulating depthwise NHWC with a bias ") + to_string(dt),
             lab().run(ops::conv2d(lab().upload(x), lab().upload(w), y, o), y),
             ref_conv(x, w, bias, g, o.activation, dt, ys, &prior));
    }
    // y in pinned host memory: read by the board through the IOMMU (on a
    // USB board, fetched from the host before the op).
    {
      ConvGeom g;
      g.layout = Layout::NHWC;
      g.pads = {1, 1, 1, 1};
      const Host x = rand(dt, {1, 5, 6, 3}), w = rand(dt, {4, 3, 3, 3});
      const Shape ys = conv_out_shape(x, w.shape, g);
      const Host prior = rand(dt, ys, -2, 2);
      Conv2dOptions o = g.options();
      o.accumulate = true;
      const Tensor y = lab().upload(prior, Memory::HostPinned);
      expect(std::string("conv2d accumulating into host memory ") + to_string(dt),
             lab().run(ops::conv2d(lab().upload(x), lab().upload(w), y, o), y),
             ref_conv(x, w, std::nullopt, g, o.activation, dt, ys, &prior));
    }
    // A depthwise 3x3 and a three-channel one in NCHW (the engine's own
    // loop; oneDNN's direct kernels), and an NHWC y with gaps between its
    // pixels (a view of a wider tensor).
    for (const bool depthwise : {true, false}) {
      ConvGeom g;
      g.pads = {1, 1, 1, 1};
      g.groups = depthwise ? 6 : 1;
      const Host x = rand(dt, {1, depthwise ? 6 : 3, 7, 8}), w = rand(dt, {6, depthwise ? 1 : 3, 3, 3});
      const Shape ys = conv_out_shape(x, w.shape, g);
      const Host prior = rand(dt, ys, -2, 2);
      Conv2dOptions o = g.options();
      o.accumulate = true;
      const Tensor y = lab().upload(prior);
      expect(std::string("conv2d accumulating ") + (depthwise ? "depthwise " : "three channels ") + to_string(dt),
             lab().run(ops::conv2d(lab().upload(x), lab().upload(w), y, o), y),
             ref_conv(x, w, std::nullopt, g, o.activation, dt, ys, &prior));
    }
    ConvGeom g;
    g.layout = Layout::NHWC;
    const Host x = rand(dt, {1, 5, 5, 4}), w = rand(dt, {3, 4, 1, 1});
    const Host wide = rand(dt, {1, 5, 5, 8}, -2, 2);
    Host prior(dt, {1, 5, 5, 3});
    for (std::int64_t p = 0; p < 25; ++p)
      for (std::int64_t ch = 0; ch < 3; ++ch)
        prior.v[static_cast<std::size_t>(p * 3 + ch)] = wide.v[static_cast<std::size_t>(p * 8 + ch)];
    const Tensor whole = lab().upload(wide);
    const Tensor y(whole.buffer(), dt, {1, 5, 5, 3}, {200, 40, 8, 1}, 0);
    Conv2dOptions o = g.options();
    o.accumulate = true;
    o.activation = ActivationParams::clip(-0.5f, 0.5f);
    lab().run(ops::conv2d(lab().upload(x), lab().upload(w), y, o));
    const Host after = lab().download(whole);
    const Ref want = ref_conv(x, w, std::nullopt, g, o.activation, dt, {1, 5, 5, 3}, &prior);
    Host in_y(dt, {1, 5, 5, 3}), gaps(dt, {1, 5, 5, 5});
    std::vector<double> gaps_before;
    for (std::int64_t p = 0; p < 25; ++p)
      for (std::int64_t ch = 0; ch < 8; ++ch) {
        const auto at = static_cast<std::size_t>(p * 8 + ch);
        if (ch < 3) {
          in_y.v[static_cast<std::size_t>(p * 3 + ch)] = after.v[at];
        } else {
          gaps.v[static_cast<std::size_t>(p * 5 + ch - 3)] = after.v[at];
          gaps_before.push_back(wide.v[at]);
        }
      }
    expect("conv2d accumulating into a strided y " + std::string(to_string(dt)), in_y, want);
    expect_exact("the gaps of a strided y " + std::string(to_string(dt)), gaps, gaps_before);
  }
}

// The engine keeps what it makes of a convolution's weights (f16 and bf16
// widened, and reordered for oneDNN) while their bytes stay the same, as a
// model's do from run to run: weights rewritten in place between runs are
// taken as they now are, and unchanged ones as they were. Weights in
// device memory the host cannot map change only through the board (a copy,
// an op's output), which the board's write log sees, so their bytes are
// not compared again; weights the host can write by itself (host-visible
// device memory, pinned host memory) are compared on every run.
TEST_P(Ops, Conv2dTakesWeightsRewrittenInPlace) {
  for (Lab::Rewrite how : Lab::kRewrites) {
    const std::optional<Memory> memory = lab().rewrite_memory(how);
    if (!memory) continue;
    const char* by = Lab::rewritten_by(how);
    for (Layout layout : {Layout::NCHW, Layout::NHWC})
      for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
        ConvGeom g;
        g.layout = layout;
        g.pads = {1, 1, 1, 1};
        const Host x = rand(dt, img_shape(layout, 1, 8, 6, 6));
        const Host w1 = rand(dt, {16, 8, 3, 3}), w2 = rand(dt, {16, 8, 3, 3});
        const Tensor xt = lab().upload(x), w = lab().upload(w1, *memory);
        const Shape ys = conv_out_shape(x, w1.shape, g);
        int run = 0;
        for (const Host* now : {&w1, &w1, &w2, &w2, &w1}) {
          lab().rewrite(how, w, *now);
          const Tensor y = lab().output(dt, ys);
          expect("conv2d " + std::string(to_string(dt)) + " " + g.text() + ", weights rewritten by " + by + ", run " +
                     std::to_string(++run) + (now == &w1 ? " with the first weights" : " with the second weights"),
                 lab().run(ops::conv2d(xt, w, y, g.options()), y),
                 ref_conv(x, *now, std::nullopt, g, ActivationParams{}, dt, ys));
        }
      }
  }
}

// The same weights in two geometries whose kernels want them in different
// layouts (NCHW and NHWC activations), rewritten in place between rounds:
// each geometry takes the weights as they now are. The floats f16 weights
// widen to may land at the address the last ones had, so what the engine
// keeps of them (oneDNN's reordered copy per layout) is named by the
// floats' serial, not their address.
TEST_P(Ops, Conv2dTakesWeightsRewrittenInPlaceInEveryGeometryItRuns) {
  for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
    const Host w1 = rand(dt, {64, 32, 3, 3}), w2 = rand(dt, {64, 32, 3, 3});
    const Tensor w = lab().upload(w1);
    int run = 0;
    for (const Host* now : {&w1, &w1, &w2, &w2, &w1}) {
      lab().q.copy(lab().upload(*now).buffer(), w.buffer()).submit().wait();
      for (Layout layout : {Layout::NCHW, Layout::NHWC}) {
        ConvGeom g;
        g.layout = layout;
        g.pads = {1, 1, 1, 1};
        const Host x = rand(dt, img_shape(layout, 1, 32, 7, 7));
        const Shape ys = conv_out_shape(x, w1.shape, g);
        const Tensor y = lab().output(dt, ys);
        expect("conv2d " + std::string(to_string(dt)) + " " + g.text() + ", round " + std::to_string(++run) +
                   (now == &w1 ? " with the first weights" : " with the second weights"),
               lab().run(ops::conv2d(lab().upload(x), w, y, g.options()), y),
               ref_conv(x, *now, std::nullopt, g, ActivationParams{}, dt, ys));
      }
    }
  }
}

TEST_P(Ops, ConvolutionsWithZeroInputChannels) {
  // Sums over no input channels: conv2d gives bias (then the activation),
  // conv_integer 0.
  for (Layout layout : {Layout::NCHW, Layout::NHWC}) {
    ConvGeom g;
    g.layout = layout;
    g.pads = {1, 1, 1, 1};
    const Host x = rand(DType::F32, img_shape(layout, 1, 0, 4, 4)), w = rand(DType::F32, {3, 0, 3, 3});
    const Host bias = rand(DType::F32, {3}, -2, 2);
    const Shape ys = conv_out_shape(x, w.shape, g);
    Conv2dOptions o = g.options();
    o.bias = lab().upload(bias);
    o.activation = ActivationParams::relu();
    const Tensor y = lab().output(DType::F32, ys);
    expect(std::string("conv2d with no input channels ") + g.text(),
           lab().run(ops::conv2d(lab().upload(x), lab().upload(w), y, o), y),
           ref_conv(x, w, bias, g, o.activation, DType::F32, ys));
    const Host xi = rand_int(rng_, DType::U8, img_shape(layout, 1, 0, 4, 4)),
               wi = rand_int(rng_, DType::I8, {3, 0, 3, 3});
    const Tensor yi = lab().output(DType::I32, ys);
    expect_exact(
        std::string("conv_integer with no input channels ") + g.text(),
        lab().run(ops::conv_integer(lab().upload(xi), lab().upload(wi), yi, std::nullopt, std::nullopt, g.options()),
                  yi),
        std::vector<double>(static_cast<std::size_t>(numel(ys)), 0.0));
  }
  // A 1x1 integer convolution of one position (the engine's dot products),
  // with the input's zero point and a weight zero point per channel.
  for (Layout layout : {Layout::NCHW, Layout::NHWC}) {
    ConvGeom g;
    g.layout = layout;
    const Host xi = rand_int(rng_, DType::U8, img_shape(layout, 1, 0, 1, 1)),
               wi = rand_int(rng_, DType::I8, {3, 0, 1, 1});
    const Host xz = rand_int(rng_, DType::U8, {}), wz = rand_int(rng_, DType::I8, {3});
    const Shape ys = conv_out_shape(xi, wi.shape, g);
    const Tensor yi = lab().output(DType::I32, ys);
    expect_exact(std::string("1x1 conv_integer of one position with no input channels ") + g.text(),
                 lab().run(ops::conv_integer(lab().upload(xi), lab().upload(wi), yi, lab().upload(xz), lab().upload(wz),
                                             g.options()),
                           yi),
                 std::vector<double>(static_cast<std::size_t>(numel(ys)), 0.0));
    // qlinear_conv's scales broadcast over x and w, which hold nothing: a
    // simulated board refuses the op when it runs, naming x's channels,
    // and runs the next (the CUDA shim reads the scales on the host and
    // runs it).
    const Host sc = rand(DType::F32, {}, 0.5, 1), zu = rand_int(rng_, DType::U8, {}),
               zi = rand_int(rng_, DType::I8, {});
    const Tensor yq = lab().output(DType::U8, ys);
    const Op op =
        ops::qlinear_conv(lab().upload(xi), lab().upload(sc), lab().upload(zu), lab().upload(wi), lab().upload(sc),
                          lab().upload(zi), lab().upload(sc), lab().upload(zu), yq, g.options());
    if (GetParam().rfind("cuda:", 0) == 0) {
      lab().run(op, yq);
    } else {
      const std::string msg = message_of([&] { lab().q.run(op).submit().wait(); });
      lab().q = Queue();
      lab().q = lab().dev.queue(Engine::Compute);
      EXPECT_THAT(msg, HasSubstr("failed at command 1 of 1 (qlinear_conv, ring position"));
      EXPECT_THAT(msg, HasSubstr(std::string("tensor 0 shape[") + (layout == Layout::NHWC ? "3" : "1") + "] = 0"));
    }
    expect_exact(
        std::string("conv_integer after it ") + g.text(),
        lab().run(ops::conv_integer(lab().upload(xi), lab().upload(wi), yi, std::nullopt, std::nullopt, g.options()),
                  yi),
        std::vector<double>(static_cast<std::size_t>(numel(ys)), 0.0));
  }
}

}  // namespace
}  // namespace tpuhal::ops_test
