// The compiler and runtime (tpuhal/rt/compile.hpp, model.hpp): small ONNX
// models built here, compiled in every precision, run on sim:0 and compared
// with a plain f32 reference computed here.
//
// Tolerances, on |got - reference| / max(1, max |reference|):
//   fp32  1e-5   the engine computes in f32 too; only summation order differs
//   fp16  5e-3   11-bit significand per stored activation, a few layers deep
//   bf16  2e-2   8-bit significand per stored activation
//   int8  1e-2   a few quantisation steps of the output's scale, calibrated
//                (minmax) on the very inputs that are checked
// (measured: fp32 3e-8, fp16 3e-4, bf16 1e-3, int8 2e-3).
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>
#include <sys/resource.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <set>

#include "run_cli.h"
#include "support/onnx_builder.hpp"
#include "tpuhal/error.hpp"
#include "tpuhal/rt/compile.hpp"
#include "tpuhal/rt/model.hpp"
#include "tpuhal/tpuhal.hpp"

namespace tpuhal::rt {

// Test names and failures show "fp16", not the enum's bytes.
void PrintTo(Precision p, std::ostream* os) { *os << to_string(p); }

namespace {

namespace fs = std::filesystem;
using Shape = std::vector<std::int64_t>;
using Vec = std::vector<float>;

using test::OnnxBuilder;

Vec random(std::size_t n, std::uint32_t seed, float lo = -1, float hi = 1) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  Vec v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// ---- The reference, in plain f32 loops ----------------------------------------------

// NCHW convolution, square kernel, symmetric pads, one group.
Vec conv(const Vec& x, const Shape& xs, const Vec& w, const Shape& ws, const Vec& b, int stride, int pad, Shape& ys) {
  const auto n = xs[0], c = xs[1], h = xs[2], wd = xs[3], m = ws[0], k = ws[2];
  const auto oh = (h + 2 * pad - k) / stride + 1, ow = (wd + 2 * pad - k) / stride + 1;
  ys = {n, m, oh, ow};
  Vec y(static_cast<std::size_t>(n * m * oh * ow));
  for (std::int64_t in = 0; in < n; ++in)
    for (std::int64_t om = 0; om < m; ++om)
      for (std::int64_t oy = 0; oy < oh; ++oy)
        for (std::int64_t ox = 0; ox < ow; ++ox) {
          float s = b.empty() ? 0.0f : b[static_cast<std::size_t>(om)];
          for (std::int64_t ic = 0; ic < c; ++ic)
            for (std::int64_t ky = 0; ky < k; ++ky)
              for (std::int64_t kx = 0; kx < k; ++kx) {
                const auto iy = oy * stride + ky - pad, ix = ox * stride + kx - pad;
                if (iy < 0 || ix < 0 || iy >= h || ix >= wd) continue;
                s += x[static_cast<std::size_t>(((in * c + ic) * h + iy) * wd + ix)] *
                     w[static_cast<std::size_t>(((om * c + ic) * k + ky) * k + kx)];
              }
          y[static_cast<std::size_t>(((in * m + om) * oh + oy) * ow + ox)] = s;
        }
  return y;
}

Vec relu(Vec x) {
  for (auto& v : x) v = std::max(v, 0.0f);
  return x;
}

// k x k pooling with stride k, no padding.
Vec pool(const Vec& x, const Shape& xs, int k, bool max, Shape& ys) {
  const auto n = xs[0], c = xs[1], oh = xs[2] / k, ow = xs[3] / k;
  ys = {n, c, oh, ow};
  Vec y(static_cast<std::size_t>(n * c * oh * ow));
  for (std::int64_t p = 0; p < n * c; ++p)
    for (std::int64_t oy = 0; oy < oh; ++oy)
      for (std::int64_t ox = 0; ox < ow; ++ox) {
        float acc = max ? -INFINITY : 0.0f;
        for (int ky = 0; ky < k; ++ky)
          for (int kx = 0; kx < k; ++kx) {
            const float v = x[static_cast<std::size_t>((p * xs[2] + oy * k + ky) * xs[3] + ox * k + kx)];
            acc = max ? std::max(acc, v) : acc + v;
          }
        y[static_cast<std::size_t>((p * oh + oy) * ow + ox)] = max ? acc : acc / static_cast<float>(k * k);
      }
  return y;
}

Vec batch_norm(Vec x, const Shape& xs, const Vec& gamma, const Vec& beta, const Vec& mean, const Vec& var, float eps) {
  const auto plane = static_cast<std::size_t>(xs[2] * xs[3]);
  for (std::size_t i = 0; i < x.size(); ++i) {
    const auto c = (i / plane) % static_cast<std::size_t>(xs[1]);
    x[i] = (x[i] - mean[c]) / std::sqrt(var[c] + eps) * gamma[c] + beta[c];
  }
  return x;
}

// y [m, n] = x [m, k] @ w^T (w [n, k]) + b
Vec gemm(const Vec& x, std::int64_t m, std::int64_t k, const Vec& w, std::int64_t n, const Vec& b) {
  Vec y(static_cast<std::size_t>(m * n));
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      float s = b[static_cast<std::size_t>(j)];
      for (std::int64_t l = 0; l < k; ++l)
        s += x[static_cast<std::size_t>(i * k + l)] * w[static_cast<std::size_t>(j * k + l)];
      y[static_cast<std::size_t>(i * n + j)] = s;
    }
  return y;
}

Vec softmax(Vec x, std::int64_t rows) {
  const auto cols = static_cast<std::size_t>(static_cast<std::int64_t>(x.size()) / rows);
  for (std::int64_t r = 0; r < rows; ++r) {
    float* p = x.data() + static_cast<std::size_t>(r) * cols;
    const float mx = *std::max_element(p, p + cols);
    float s = 0;
    for (std::size_t i = 0; i < cols; ++i) s += (p[i] = std::exp(p[i] - mx));
    for (std::size_t i = 0; i < cols; ++i) p[i] /= s;
  }
  return x;
}

// ---- The models -----------------------------------------------------------------

// A small CNN: Conv 3x3 + BatchNormalization + Relu, MaxPool, Conv 3x3 +
// Relu, AveragePool, Flatten, Gemm, Softmax. Input [batch, 1, 8, 8] (the
// batch symbolic in the model), output [batch, 10] probabilities.
struct Cnn {
  Vec w1 = random(4 * 1 * 3 * 3, 1), b1 = random(4, 2, -0.1f, 0.1f);
  Vec gamma = random(4, 3, 0.5f, 1.5f), beta = random(4, 4, -0.2f, 0.2f), mean = random(4, 5, -0.1f, 0.1f),
      var = random(4, 6, 0.5f, 1.0f);
  Vec w2 = random(6 * 4 * 3 * 3, 7, -0.5f, 0.5f), b2 = random(6, 8, -0.1f, 0.1f);
  Vec wf = random(10 * 24, 9, -0.5f, 0.5f), bf = random(10, 10, -0.1f, 0.1f);

  std::vector<std::byte> onnx() const {
    OnnxBuilder b;
    b.input("image", {-1, 1, 8, 8});
    b.init("w1", {4, 1, 3, 3}, w1);
    b.init("b1", {4}, b1);
    b.init("gamma", {4}, gamma);
    b.init("beta", {4}, beta);
    b.init("mean", {4}, mean);
    b.init("var", {4}, var);
    b.init("w2", {6, 4, 3, 3}, w2);
    b.init("b2", {6}, b2);
    b.init("wf", {10, 24}, wf);
    b.init("bf", {10}, bf);
    auto* c1 = b.node("Conv", {"image", "w1", "b1"}, "c1", "conv1");
    OnnxBuilder::ints(c1, "pads", {1, 1, 1, 1});
    OnnxBuilder::ints(c1, "kernel_shape", {3, 3});
    b.node("BatchNormalization", {"c1", "gamma", "beta", "mean", "var"}, "bn1", "bn1");
    b.node("Relu", {"bn1"}, "r1", "relu1");
    auto* p1 = b.node("MaxPool", {"r1"}, "p1", "pool1");
    OnnxBuilder::ints(p1, "kernel_shape", {2, 2});
    OnnxBuilder::ints(p1, "strides", {2, 2});
    auto* c2 = b.node("Conv", {"p1", "w2", "b2"}, "c2", "conv2");
    OnnxBuilder::ints(c2, "pads", {1, 1, 1, 1});
    b.node("Relu", {"c2"}, "r2", "relu2");
    auto* p2 = b.node("AveragePool", {"r2"}, "p2", "pool2");
    OnnxBuilder::ints(p2, "kernel_shape", {2, 2});
    OnnxBuilder::ints(p2, "strides", {2, 2});
    b.node("Dropout", {"p2"}, "d2", "dropout");
    b.node("Flatten", {"d2"}, "f", "flatten");
    auto* fc = b.node("Gemm", {"f", "wf", "bf"}, "logits", "fc");
    OnnxBuilder::integer(fc, "transB", 1);
    b.node("Softmax", {"logits"}, "probs", "softmax");
    b.output("probs");
    return b.bytes();
  }

  Vec reference(const Vec& x, std::int64_t batch) const {
    Shape s1, s2, s3, s4;
    Vec y = conv(x, {batch, 1, 8, 8}, w1, {4, 1, 3, 3}, b1, 1, 1, s1);
    y = relu(batch_norm(y, s1, gamma, beta, mean, var, 1e-5f));
    y = pool(y, s1, 2, true, s2);
    y = relu(conv(y, s2, w2, {6, 4, 3, 3}, b2, 1, 1, s3));
    y = pool(y, s3, 2, false, s4);
    return softmax(gemm(y, batch, 24, wf, 10, bf), batch);
  }
};

// Two branches added, a Relu after the Add, GlobalAveragePool, Reshape and
// a Gemm with a fused Relu (B not transposed). Input [2, 3, 4, 4], output [2, 5].
struct Residual {
  Vec wa = random(4 * 3, 11), wb = random(4 * 3 * 3 * 3, 12, -0.4f, 0.4f), bb = random(4, 13, -0.1f, 0.1f);
  Vec wg = random(4 * 5, 14), bg = random(5, 15, -0.1f, 0.1f);
  std::int64_t batch = 2;  // of the ONNX input; reference() takes 2

  std::vector<std::byte> onnx() const {
    OnnxBuilder b;
    b.input("x", {batch, 3, 4, 4});
    b.init("wa", {4, 3, 1, 1}, wa);
    b.init("wb", {4, 3, 3, 3}, wb);
    b.init("bb", {4}, bb);
    b.init("wg", {4, 5}, wg);
    b.init("bg", {5}, bg);
    b.init_i64("shape", {0, -1});
    b.node("Conv", {"x", "wa"}, "a", "branch_a");
    auto* c = b.node("Conv", {"x", "wb", "bb"}, "bcv", "branch_b");
    OnnxBuilder::ints(c, "pads", {1, 1, 1, 1});
    b.node("Add", {"a", "bcv"}, "sum", "add");
    b.node("Relu", {"sum"}, "act", "relu");
    b.node("GlobalAveragePool", {"act"}, "gap", "gap");
    b.node("Reshape", {"gap", "shape"}, "flat", "reshape");
    b.node("Identity", {"flat"}, "flat2", "identity");
    b.node("Gemm", {"flat2", "wg", "bg"}, "g", "fc");
    b.node("Relu", {"g"}, "out", "relu_out");
    b.output("out");
    return b.bytes();
  }

  Vec reference(const Vec& x) const {
    Shape s;
    const Vec a = conv(x, {2, 3, 4, 4}, wa, {4, 3, 1, 1}, {}, 1, 0, s);
    const Vec bcv = conv(x, {2, 3, 4, 4}, wb, {4, 3, 3, 3}, bb, 1, 1, s);
    Vec sum(a.size());
    for (std::size_t i = 0; i < a.size(); ++i) sum[i] = std::max(a[i] + bcv[i], 0.0f);
    Vec gap(8);
    for (std::size_t p = 0; p < 8; ++p) {
      float acc = 0;
      for (std::size_t i = 0; i < 16; ++i) acc += sum[p * 16 + i];
      gap[p] = acc / 16;
    }
    Vec wt(20);  // wg is [K=4, N=5]; gemm() takes [N, K]
    for (int k = 0; k < 4; ++k)
      for (int n = 0; n < 5; ++n) wt[static_cast<std::size_t>(n * 4 + k)] = wg[static_cast<std::size_t>(k * 5 + n)];
    return relu(gemm(gap, 2, 4, wt, 5, bg));
  }
};

// The other ops: a BatchNormalization on the input (not after a Conv),
// LeakyRelu, Transpose, Reshape, MatMul by a constant, Sigmoid, Mul, Sub
// and an opset-11 Softmax over a non-last axis (flattened from it on).
// Input [2, 3, 2, 2], outputs [2, 4] and [2, 1, 4] probabilities.
struct Misc {
  Vec gamma = random(3, 21, 0.5f, 1.5f), beta = random(3, 22), mean = random(3, 23), var = random(3, 24, 0.5f, 2);
  Vec w = random(12 * 4, 25), scale = random(4, 26, 1, 3);

  std::vector<std::byte> onnx() const {
    OnnxBuilder b(11);
    b.input("x", {2, 3, 2, 2});
    b.init("gamma", {3}, gamma);
    b.init("beta", {3}, beta);
    b.init("mean", {3}, mean);
    b.init("var", {3}, var);
    b.init("w", {12, 4}, w);
    b.init("scale", {4}, scale);
    b.init("half", {}, {0.5f});
    b.init_i64("flat", {2, 12});
    b.init_i64("three", {2, 1, 4});
    b.node("BatchNormalization", {"x", "gamma", "beta", "mean", "var"}, "bn", "bn");
    OnnxBuilder::real(b.node("LeakyRelu", {"bn"}, "lr", "leaky"), "alpha", 0.1f);
    OnnxBuilder::ints(b.node("Transpose", {"lr"}, "t", "nhwc"), "perm", {0, 2, 3, 1});
    b.node("Reshape", {"t", "flat"}, "f", "reshape");
    b.node("MatMul", {"f", "w"}, "m", "matmul");
    b.node("Sigmoid", {"m"}, "s", "sigmoid");
    b.node("Mul", {"s", "scale"}, "ms", "mul");
    b.node("Sub", {"ms", "half"}, "y", "sub");
    b.node("Reshape", {"y", "three"}, "y3", "reshape3");
    OnnxBuilder::integer(b.node("Softmax", {"y3"}, "p", "softmax"), "axis", 1);
    b.output("y");
    b.output("p");
    return b.bytes();
  }

  std::pair<Vec, Vec> reference(const Vec& x) const {
    Vec t(24);
    for (int n = 0; n < 2; ++n)
      for (int c = 0; c < 3; ++c)
        for (int h = 0; h < 2; ++h)
          for (int w_ = 0; w_ < 2; ++w_) {
            const auto ci = static_cast<std::size_t>(c);
            float v = (x[static_cast<std::size_t>(((n * 3 + c) * 2 + h) * 2 + w_)] - mean[ci]) /
                          std::sqrt(var[ci] + 1e-5f) * gamma[ci] +
                      beta[ci];
            v = v < 0 ? 0.1f * v : v;
            t[static_cast<std::size_t>(((n * 2 + h) * 2 + w_) * 3 + c)] = v;
          }
    Vec y(8);
    for (std::size_t n = 0; n < 2; ++n)
      for (std::size_t j = 0; j < 4; ++j) {
        float acc = 0;
        for (std::size_t k = 0; k < 12; ++k) acc += t[n * 12 + k] * w[k * 4 + j];
        y[n * 4 + j] = 1 / (1 + std::exp(-acc)) * scale[j] - 0.5f;
      }
    return {y, softmax(y, 2)};  // axis 1 of [2, 1, 4] before opset 13: over the last 4
  }
};

double max_rel_error(const Vec& got, const Vec& want) {
  double scale = 1, err = 0;
  for (float v : want) scale = std::max(scale, static_cast<double>(std::fabs(v)));
  for (std::size_t i = 0; i < got.size(); ++i) err = std::max(err, std::fabs(static_cast<double>(got[i]) - want[i]));
  return err / scale;
}

Vec run(Instance& inst, Vec x) {
  Vec y(inst.model().outputs().at(0).elements());
  inst.run({host(x)}, {host(y)});
  return y;
}

CompileOptions options(Precision p, NdArray calibration) {
  CompileOptions o;
  o.precision = p;
  o.calibration = {std::move(calibration)};
  o.method = CalibrationMethod::MinMax;
  return o;
}

double tolerance(Precision p) {
  switch (p) {
    case Precision::F32: return 1e-5;
    case Precision::F16: return 5e-3;
    case Precision::BF16: return 2e-2;
    case Precision::Int8: return 1e-2;
  }
  return 0;
}

class EveryPrecision : public ::testing::TestWithParam<Precision> {};

TEST_P(EveryPrecision, GivenASmallCnnWhenCompiledAndRunThenItMatchesTheReference) {
  const Cnn net;
  const Vec x = random(4 * 64, 100, 0, 1);
  CompileOptions o = options(GetParam(), NdArray{{4, 1, 8, 8}, x});
  o.shapes["image"] = {4, 1, 8, 8};
  const CompileResult r = compile_onnx(net.onnx(), o, "cnn.onnx");
  const auto notes = ::testing::PrintToString(r.notes);
  EXPECT_NE(notes.find("folded BatchNormalization 'bn1' into Conv 'conv1'"), std::string::npos) << notes;
  EXPECT_NE(notes.find("fused Relu 'relu1' into Conv 'conv1'"), std::string::npos) << notes;
  EXPECT_NE(notes.find("removed Dropout 'dropout'"), std::string::npos) << notes;

  Device dev = open("sim:0");
  Model m = Model::load(dev, encode(r.model) == encode(r.model) ? r.model : ModelFile{}, "cnn.tpm");
  ASSERT_EQ(m.inputs().size(), 1u);
  EXPECT_EQ(m.inputs()[0].describe(), "image f32[4, 1, 8, 8]");
  EXPECT_EQ(m.outputs()[0].describe(), "probs f32[4, 10]");
  EXPECT_EQ(m.precision(), GetParam());
  EXPECT_EQ(m.meta().at("precision"), to_string(GetParam()));
  Instance inst = m.instance();
  EXPECT_LE(max_rel_error(run(inst, x), net.reference(x, 4)), tolerance(GetParam()));
}

TEST_P(EveryPrecision, GivenAResidualModelWhenCompiledAndRunThenItMatchesTheReference) {
  const Residual net;
  const Vec x = random(2 * 3 * 16, 200);
  const CompileResult r = compile_onnx(net.onnx(), options(GetParam(), NdArray{{2, 3, 4, 4}, x}), "residual.onnx");
  Device dev = open("sim:0");
  Model m = Model::load(dev, r.model);
  Instance inst = m.instance();
  const Vec want = net.reference(x);
  // In int8, Add and the pooling run in f32 between a dequantize and a quantize.
  EXPECT_LE(max_rel_error(run(inst, x), want), tolerance(GetParam()));
}

TEST_P(EveryPrecision, GivenTheOtherOpsWhenCompiledAndRunThenTheyMatchTheReference) {
  const Misc net;
  const Vec x = random(24, 700, -2, 2);
  const CompileResult r = compile_onnx(net.onnx(), options(GetParam(), NdArray{{2, 3, 2, 2}, x}), "misc.onnx");
  EXPECT_NE(std::find(r.notes.begin(), r.notes.end(), "BatchNormalization 'bn' runs as a depthwise 1x1 Conv"),
            r.notes.end());
  Device dev = open("sim:0");
  Model m = Model::load(dev, r.model);
  ASSERT_EQ(m.outputs().size(), 2u);
  EXPECT_EQ(m.outputs()[1].describe(), "p f32[2, 1, 4]");
  Instance inst = m.instance();
  Vec xi = x, y(8), p(8);
  inst.run({host(xi)}, {host(y), host(p)});
  const auto [want_y, want_p] = net.reference(x);
  EXPECT_LE(max_rel_error(y, want_y), tolerance(GetParam()));
  EXPECT_LE(max_rel_error(p, want_p), tolerance(GetParam()));
}

INSTANTIATE_TEST_SUITE_P(Runtime, EveryPrecision,
                         ::testing::Values(Precision::F32, Precision::F16, Precision::BF16, Precision::Int8),
                         [](const auto& p) { return std::string(to_string(p.param)); });

TEST(Runtime, GivenAnInt8ModelWhenRunRepeatedlyAndOnTwoInstancesThenResultsAreIdentical) {
  const Cnn net;
  const Vec x = random(2 * 64, 300, 0, 1);
  CompileOptions o = options(Precision::Int8, NdArray{{2, 1, 8, 8}, x});
  o.shapes["image"] = {2, 1, 8, 8};
  const CompileResult r1 = compile_onnx(net.onnx(), o, "cnn.onnx");
  const CompileResult r2 = compile_onnx(net.onnx(), o, "cnn.onnx");
  EXPECT_EQ(encode(r1.model), encode(r2.model)) << "compiling twice gives the same file";
  Device dev = open("sim:0");
  Model m = Model::load(dev, r1.model);
  Instance a = m.instance(), b = m.instance();
  const Vec first = run(a, x);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(run(a, x), first);
  EXPECT_EQ(run(b, x), first);
  EXPECT_TRUE(m.meta().count("calibration"));
  EXPECT_TRUE(r1.model.has(SectionKind::Quant));
}

TEST(Runtime, GivenTwoModelsWhenRunWithTwoInstancesEachOnOneDeviceThenEachGivesItsOwnResult) {
  const Cnn cnn;
  const Residual res;
  CompileOptions o;
  o.shapes["image"] = {1, 1, 8, 8};
  Device dev = open("sim:0");
  Model m1 = Model::load(dev, compile_onnx(cnn.onnx(), o).model);
  Model m2 = Model::load(dev, compile_onnx(res.onnx(), CompileOptions{}).model);
  Instance a1 = m1.instance(), a2 = m1.instance(), b1 = m2.instance(), b2 = m2.instance();
  const Vec x1 = random(64, 400, 0, 1), x2 = random(96, 401);
  const Vec y1 = cnn.reference(x1, 1), y2 = res.reference(x2);
  for (Instance* i : {&a1, &a2}) EXPECT_LE(max_rel_error(run(*i, x1), y1), 1e-4);
  for (Instance* i : {&b1, &b2}) EXPECT_LE(max_rel_error(run(*i, x2), y2), 1e-4);
  // Device-side use: fill the input tensor, submit, read the output tensor.
  Queue q = dev.queue(Engine::Compute);
  Buffer in = dev.allocate(x1.size() * 4, Memory::HostPinned), out = dev.allocate(y1.size() * 4, Memory::HostPinned);
  std::memcpy(in.map().data(), x1.data(), x1.size() * 4);
  const Tensor& ti = a2.input_tensors()[0];
  const Tensor& to = a2.output_tensors()[0];
  q.copy(in, 0, ti.buffer(), ti.offset(), x1.size() * 4).submit().wait();
  a2.submit(q).wait();
  q.copy(to.buffer(), to.offset(), out, 0, y1.size() * 4).submit().wait();
  Vec y(y1.size());
  std::memcpy(y.data(), out.map().data(), y.size() * 4);
  EXPECT_LE(max_rel_error(y, y1), 1e-4);
  // The same in one submission of the caller's: copy in, record, copy out.
  const Vec x3 = random(64, 403, 0, 1);
  std::memcpy(in.map().data(), x3.data(), x3.size() * 4);
  std::memset(out.map().data(), 0, y1.size() * 4);
  Batch batch = q.batch();
  batch.copy(in, 0, ti.buffer(), ti.offset(), x3.size() * 4);
  a2.record(batch).copy(to.buffer(), to.offset(), out, 0, y1.size() * 4).submit().wait();
  std::memcpy(y.data(), out.map().data(), y.size() * 4);
  EXPECT_LE(max_rel_error(y, cnn.reference(x3, 1)), 1e-4);
}

TEST(Runtime, GivenMoreModelsThanTheBoardHasComputeQueuesWhenLoadedTogetherThenAllRun) {
  Device dev = open("sim:0");
  const ModelFile f = compile_onnx(Residual{}.onnx(), CompileOptions{}).model;
  std::vector<Model> models;
  for (int i = 0; i < 8; ++i) models.push_back(Model::load(dev, f));  // sim:0 has 4 compute queues
  const Vec x = random(96, 402), want = Residual{}.reference(x);
  for (auto& m : models) {
    Instance inst = m.instance();
    EXPECT_LE(max_rel_error(run(inst, x), want), 1e-5);
  }
}

TEST(Runtime, GivenTheWrongInputSizeWhenRunThenInvalidArgumentNamesTheInput) {
  Device dev = open("sim:0");
  Model m = Model::load(dev, compile_onnx(Residual{}.onnx(), CompileOptions{}).model);
  Instance inst = m.instance();
  Vec x(10), y(10);
  try {
    inst.run({host(x)}, {host(y)});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::InvalidArgument);
    EXPECT_NE(std::string(e.what()).find("input 0 ('x') is 40 bytes; x f32[2, 3, 4, 4] takes 384"), std::string::npos)
        << e.what();
  }
}

TEST(Runtime, GivenUnsupportedOpsWhenCompiledThenOneErrorListsEveryOne) {
  OnnxBuilder b;
  b.input("x", {1, 4});
  b.node("LpNormalization", {"x"}, "e", "lpnorm_1");
  b.node("Relu", {"e"}, "r", "relu");
  b.node("Det", {"r"}, "h", "det_2");
  b.output("h");
  try {
    compile_onnx(b.bytes(), CompileOptions{}, "bad.onnx");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::Unsupported);
    const std::string m = e.what();
    EXPECT_NE(m.find("2 nodes"), std::string::npos) << m;
    EXPECT_NE(m.find("'lpnorm_1' (LpNormalization)"), std::string::npos) << m;
    EXPECT_NE(m.find("'det_2' (Det)"), std::string::npos) << m;
  }
}

TEST(Runtime, GivenASymbolicBatchWithoutAShapeWhenCompiledThenTheErrorAsksForIt) {
  try {
    compile_onnx(Cnn{}.onnx(), CompileOptions{}, "cnn.onnx");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::InvalidArgument);
    EXPECT_NE(std::string(e.what()).find("input 'image' has a symbolic dimension 0 ('N')"), std::string::npos)
        << e.what();
  }
}

TEST(Runtime, GivenADamagedGraphSectionWhenLoadedThenInvalidArgumentNamesWhat) {
  const ModelFile good = compile_onnx(Residual{}.onnx(), CompileOptions{}).model;
  Device dev = open("sim:0");
  auto with_graph = [&](const std::string& graph) {
    ModelFile f;
    for (const auto& s : good.sections()) {
      if (s.kind == SectionKind::Graph) {
        std::vector<std::byte> b(graph.size());
        std::memcpy(b.data(), graph.data(), graph.size());
        f.add(s.kind, b);
      } else {
        f.add(s.kind, s.bytes, s.optional);
      }
    }
    return f;
  };
  const auto g = good.get(SectionKind::Graph);
  const std::string text(reinterpret_cast<const char*>(g.data()), g.size());
  auto error = [&](const std::string& graph) {
    try {
      Model::load(dev, with_graph(graph), "net.tpm");
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::InvalidArgument) << e.what();
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error(text.substr(0, text.size() / 2)).find("net.tpm: the graph section is damaged: not a JSON object"),
            std::string::npos);
  const nlohmann::json graph = nlohmann::json::parse(text);
  // The first convolution (branch_a's; the input's transpose to NHWC
  // comes before it).
  std::size_t conv = 0;
  while (graph["ops"][conv]["op"] != "conv2d") ++conv;
  const std::string at = "op " + std::to_string(conv) + " (";
  auto edited = [&](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json j = graph;
    edit(j);
    return error(j.dump());
  };
  EXPECT_NE(edited([](auto& j) {
              j["tensors"][0]["offset"] = 1u << 30;
            }).find("tensor 0 (384 bytes at offset 1073741824) lies outside the arena"),
            std::string::npos);
  EXPECT_NE(edited([](auto& j) { j["tensors"][1]["shape"] = "[1]"; }).find("tensor 1.shape is not an array"),
            std::string::npos);
  // branch_b: branch_a, with the Add fused into it, runs at the Add's place.
  const std::string unknown = edited([&](auto& j) { j["ops"][conv]["op"] = "conv9d"; });
  EXPECT_NE(unknown.find(at + "conv9d, node 'branch_b'): unknown op 'conv9d' (this runtime is tpuhal "),
            std::string::npos)
      << unknown;
  EXPECT_NE(unknown.find("a model compiled by a newer tpuhal needs that version's runtime"), std::string::npos)
      << unknown;
  // Every builder the schema gives the model file is read, the ones the
  // compiler does not write too: the convolution's operands do not fit them,
  // and their own checks say so.
  for (const char* op : {"relu", "activation", "cast", "conv_integer", "conv_transpose2d", "nv12_to_rgb", "i420_to_rgb",
                         "max_pool2d", "avg_pool2d", "resize", "matmul", "transpose", "qlinear_conv"}) {
    const std::string e = edited([&](auto& j) { j["ops"][conv]["op"] = op; });
    EXPECT_NE(e.find(at + op + ", node 'branch_b'): "), std::string::npos) << e;
    EXPECT_EQ(e.find("unknown op"), std::string::npos) << e;
  }
  EXPECT_NE(edited([&](auto& j) {
              j["ops"][conv]["operands"]["x"] = 9999;
            }).find("op " + std::to_string(conv) + " operand x names no tensor"),
            std::string::npos);
  EXPECT_NE(edited([&](auto& j) { j["ops"][conv]["attrs"].erase("pads"); }).find("attribute 'pads' is missing"),
            std::string::npos);
  EXPECT_NE(edited([&](auto& j) {
              j["ops"][conv]["attrs"]["layout"] = "nwhc";
            }).find("attribute 'layout' has an unknown value 'nwhc'"),
            std::string::npos);
  EXPECT_NE(edited([&](auto& j) {
              j["ops"][conv]["global"] = 1;
            }).find("op " + std::to_string(conv) + ".global is not true or false"),
            std::string::npos);
  // The ops' own checks catch what is well-formed but does not fit.
  auto weights_shape = [&](auto& j) {
    j["tensors"][j["ops"][conv]["operands"]["w"].template get<int>()]["shape"][1] = 2;
  };
  EXPECT_NE(
      edited(weights_shape).find("net.tpm: the graph section is damaged: " + at + "conv2d, node 'branch_b'): conv2d: "),
      std::string::npos)
      << edited(weights_shape);
  EXPECT_NE(edited([](auto& j) {
              j["tensors"][0]["shape"][0] = 1;
            }).find("input 0 does not have the shape of x f32[2, 3, 4, 4]"),
            std::string::npos);
  // An input that is a view with the same bytes in another order: the
  // caller's row-major array would be read transposed.
  const std::string strided = edited([](auto& j) {
    j["tensors"][j["inputs"][0].template get<int>()]["strides"] = {1, 2, 6, 24};
  });
  EXPECT_NE(strided.find("net.tpm: the graph section is damaged: an entry of inputs (tensor 0) is a strided view; "
                         "inputs and outputs are whole row-major tensors"),
            std::string::npos)
      << strided;
  const std::string strided_out = edited([](auto& j) {
    auto& t = j["tensors"][j["outputs"][0].template get<int>()];
    const std::size_t rank = t["shape"].size();
    std::vector<std::int64_t> strides(rank, 1);  // every axis on the same elements
    t["strides"] = strides;
  });
  EXPECT_NE(strided_out.find("an entry of outputs (tensor "), std::string::npos) << strided_out;
  EXPECT_NE(strided_out.find(") is a strided view"), std::string::npos) << strided_out;
}

TEST(Runtime, GivenACorruptedOrNewerFileWhenLoadedThenTheErrorSaysWhich) {
  const fs::path dir = fs::temp_directory_path() / ("tpuhal_rt_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const ModelFile good = compile_onnx(Residual{}.onnx(), CompileOptions{}).model;
  std::vector<std::byte> bytes = encode(good);
  Device dev = open("sim:0");
  auto load_bytes = [&](const std::vector<std::byte>& b) -> Error {
    const fs::path p = dir / "net.tpm";
    {
      std::ofstream out(p, std::ios::binary | std::ios::trunc);
      out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
    }
    try {
      Model::load(dev, p);
    } catch (const Error& e) {
      return e;
    }
    return Error(Status::Ok, "no error");
  };
  auto corrupted = bytes;
  corrupted[corrupted.size() - 70] ^= std::byte{0x10};
  Error e = load_bytes(corrupted);
  EXPECT_EQ(e.status(), Status::InvalidArgument);
  EXPECT_NE(std::string(e.what()).find("checksum"), std::string::npos) << e.what();
  auto newer = bytes;
  newer[8] = std::byte{static_cast<unsigned char>(kModelFormatVersion + 1)};
  e = load_bytes(newer);
  EXPECT_EQ(e.status(), Status::VersionMismatch) << e.what();
  EXPECT_EQ(load_bytes(bytes).status(), Status::Ok);
  fs::remove_all(dir);
}

TEST(Runtime, GivenReportWhenCompiledInInt8ThenEveryLayerHasAnErrorAgainstFp32) {
  const Residual net;
  CompileOptions o = options(Precision::Int8, NdArray{{4, 3, 4, 4}, random(4 * 48, 500)});
  o.report = true;
  o.method = CalibrationMethod::Percentile;
  o.percentile = 99.9;
  const CompileResult r = compile_onnx(net.onnx(), o, "residual.onnx");
  // Nodes after fusion: branch_a, branch_b, add, relu, gap, reshape, fc
  // (+relu_out). In int8 the Add's sum is never held: its qlinear_add
  // writes the Relu's output, so the Add has no row of its own.
  ASSERT_EQ(r.report.size(), 6u);
  EXPECT_EQ(r.report.front().node, "branch_a");
  EXPECT_TRUE(std::none_of(r.report.begin(), r.report.end(), [](const auto& e) { return e.node == "add"; }));
  EXPECT_TRUE(std::any_of(r.report.begin(), r.report.end(), [](const auto& e) { return e.node == "relu"; }));
  EXPECT_EQ(r.report.back().node, "fc");
  EXPECT_EQ(r.report.back().output, "out");
  for (const auto& e : r.report) {
    EXPECT_GT(e.rms, 0) << e.node;
    EXPECT_LT(e.rel_rms, 0.1) << e.node;
    EXPECT_GT(e.snr_db, 20) << e.node;
  }
  ASSERT_TRUE(r.model.has(SectionKind::Report));
  const auto rep = r.model.get(SectionKind::Report);
  EXPECT_NE(std::string(reinterpret_cast<const char*>(rep.data()), rep.size()).find("\"node\": \"branch_b\""),
            std::string::npos);
  EXPECT_EQ(Model::load(*std::make_unique<Device>(open("sim:0")), r.model).meta().at("calibration"), "percentile:99.9");
}

TEST(Runtime, GivenACompiledModelWhenProfiledThenEveryLayerIsTimedAndNamedAsTheReportNamesIt) {
  const Residual net;
  CompileOptions o = options(Precision::F32, NdArray{{2, 3, 4, 4}, random(2 * 48, 520)});
  const CompileResult r = compile_onnx(net.onnx(), o, "residual.onnx");
  Device dev = open("sim:0");
  ASSERT_TRUE(dev.properties().caps.timestamps);
  Model m = Model::load(dev, r.model);
  Instance inst = m.instance();
  run(inst, random(2 * 48, 521));
  const Profile p = inst.profile(5);
  EXPECT_EQ(p.iterations, 5u);
  // The ONNX nodes left after fusion (the report's names), in order: the
  // Add and the Relu after it fused into branch_a, which accumulates into
  // branch_b's output at the Add's place; the Relu after the Gemm fused.
  std::vector<std::string> nodes;
  for (const auto& l : p.layers)
    if (!l.node.empty()) nodes.push_back(l.node);
  EXPECT_EQ(nodes, (std::vector<std::string>{"branch_b", "branch_a", "gap", "fc"}));
  double share = 0;
  std::uint64_t sum = 0;
  for (const auto& l : p.layers) {
    EXPECT_GT(l.device_ns, 0u) << l.node;
    share += l.share;
    sum += l.device_ns;
    if (l.node == "branch_b") {
      // 2 * [2, 4, 4, 4] outputs * 3*3*3 taps, on an f32 peak.
      EXPECT_EQ(l.ops, "conv2d");
      EXPECT_EQ(l.shape, "f32[2, 4, 4, 4]");
      EXPECT_DOUBLE_EQ(l.flops, 2.0 * 128 * 27);
      EXPECT_DOUBLE_EQ(l.peak, dev.properties().peak_fp32_tflops * 1e12);
      EXPECT_DOUBLE_EQ(l.achieved, l.flops / (static_cast<double>(l.device_ns) * 1e-9));
    }
    if (l.node == "gap") {
      EXPECT_EQ(l.peak, 0.0) << "a pooling has no compute peak";
    }
  }
  EXPECT_NEAR(share, 1.0, 1e-9);
  // Means over the same runs (the middle 3 of 5): the layers add up to the
  // run, to within the rounding of each layer's mean.
  EXPECT_EQ(p.runs_kept, 3u);
  EXPECT_GT(p.device_ns, 0u);
  EXPECT_LE(std::max(sum, p.device_ns) - std::min(sum, p.device_ns), p.layers.size());
  EXPECT_GT(p.run_ns, 0u);
  // A modelled board's time and the host's are different clocks: no overhead
  // is their difference.
  EXPECT_EQ(p.modelled, dev.properties().caps.modelled_time);
  EXPECT_EQ(p.host_overhead_ns, !p.modelled && p.run_ns > p.device_ns ? p.run_ns - p.device_ns : 0);
  // Profiling leaves the instance as it was: a run still gives the reference.
  const Vec x = random(2 * 48, 522);
  EXPECT_LE(max_rel_error(run(inst, x), net.reference(x)), tolerance(Precision::F32));
}

TEST(Runtime, GivenAModelledBoardWhenAModelIsProfiledThenEachLayerTakesExactlyItsModelledTime) {
  const Residual net;
  const CompileResult r =
      compile_onnx(net.onnx(), options(Precision::F32, NdArray{{2, 3, 4, 4}, random(2 * 48, 530)}), "residual.onnx");
  Device dev = open("sim:bm1684x");
  ASSERT_TRUE(dev.properties().caps.modelled_time);
  Model m = Model::load(dev, r.model);
  Instance inst = m.instance();
  run(inst, random(2 * 48, 531));
  const auto modelled = inst.modelled();
  ASSERT_TRUE(modelled.has_value());
  // The same figures from the ops alone and from the board's stamps, run
  // after run: the board's clock is the model's, whatever the host did.
  const Profile a = inst.profile(3), b = inst.profile(2);
  ASSERT_EQ(a.layers.size(), modelled->layers.size());
  ASSERT_EQ(b.layers.size(), modelled->layers.size());
  std::uint64_t sum = 0;
  for (std::size_t i = 0; i < a.layers.size(); ++i) {
    SCOPED_TRACE(a.layers[i].node);
    EXPECT_EQ(a.layers[i].node, modelled->layers[i].node);
    EXPECT_EQ(a.layers[i].device_ns, modelled->layers[i].ns);
    EXPECT_EQ(b.layers[i].device_ns, modelled->layers[i].ns);
    EXPECT_EQ(a.layers[i].bound, to_string(modelled->layers[i].bound));
    sum += modelled->layers[i].ns;
  }
  EXPECT_EQ(modelled->ns, sum);
  EXPECT_EQ(a.device_ns, modelled->ns);
  EXPECT_TRUE(a.modelled);
  EXPECT_EQ(a.host_overhead_ns, 0u);
  EXPECT_GT(modelled->input_copy_ns, 0u);
  EXPECT_GT(modelled->output_copy_ns, 0u);
}

TEST(Runtime, GivenTheCliWhenItPlansStreamsThenTheBindingUnitAndTheTimelineAgree) {
  const fs::path dir = fs::temp_directory_path() / ("tpuhal_rt_plan_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const Residual net;
  write_model_file(
      dir / "r.tpm",
      compile_onnx(net.onnx(), options(Precision::F32, NdArray{{2, 3, 4, 4}, random(96, 532)}), "r").model);
  const std::string model = (dir / "r.tpm").string();
  auto r = test::run("plan " + model + " --stream 1920x1080@25:h264 -d sim:bm1684x --json");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out.substr(r.out.find('{')));
  // A tiny network: the video unit binds, at 32 streams of 1080p25 (the
  // BM1684X's published decode capacity, I frame every 50).
  EXPECT_EQ(j["bound_by"], "video unit");
  EXPECT_EQ(j["streams"], 32);
  EXPECT_GT(j["utilisation"]["video"].get<double>(), 0.95);
  EXPECT_LE(j["utilisation"]["video"].get<double>(), 1.0);
  // On the board's timeline every frame meets its deadline at 32 streams,
  // and with one more some do not.
  EXPECT_EQ(j["timeline"]["planned"]["late"], 0);
  EXPECT_GT(j["timeline"]["planned"]["frames"].get<int>(), 0);
  EXPECT_GT(j["timeline"]["one_more"]["late"].get<int>(), 0);
  r = test::run("plan " + model + " --stream 1920x1080@25:h264 -d sim:bm1684x");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("streams one board serves: 32 (bound by the video unit)"), std::string::npos) << r.out;
  // Bad input: a stream it cannot read, a board without a model.
  r = test::run("plan " + model + " --stream 1920x1080:h264 -d sim:bm1684x");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("WIDTHxHEIGHT@FPS:CODEC"), std::string::npos) << r.out;
  r = test::run("plan " + model + " --stream 1920x1080@25:h264 -d sim:bm1684x", "TPUHAL_SIM_CLOCK=bogus");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("TPUHAL_SIM_CLOCK"), std::string::npos) << r.out;
  fs::remove_all(dir);
}

TEST(Runtime, GivenThePlanWhenTheVideoPipelineRunsOnTheBoardsClockThenItMeetsThePlannedCountAndNotOneMore) {
  const fs::path dir = fs::temp_directory_path() / ("tpuhal_rt_plan_run_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  Residual net;
  net.batch = 1;  // the pipeline feeds one frame at a time
  write_model_file(
      dir / "r.tpm",
      compile_onnx(net.onnx(), options(Precision::F32, NdArray{{1, 3, 4, 4}, random(48, 533)}), "r").model);
  const std::string model = (dir / "r.tpm").string();
  // 360p cameras at 1000 fps: the video unit binds at 7 streams (7 x 1000
  // frames of 137 us a second), and 0.1 s of them is 100 frames a stream.
  const std::string plan = "plan " + model + " --stream 640x360@1000:h264 --seconds 0.1 -d sim:bm1684x";
  auto r = test::run(plan + " --pipeline --json");
  if (r.code != 0 && r.out.find("ffmpeg") != std::string::npos) GTEST_SKIP() << r.out;
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out.substr(r.out.find('{')));
  EXPECT_EQ(j["bound_by"], "video unit");
  const int streams = j["streams"];
  EXPECT_EQ(streams, 7);
  // The plan's own timeline and the pipeline itself, every frame decoded on
  // the codec unit and run through the network on the modelled clock,
  // agree: no frame late at the planned count, some with one stream more.
  for (const char* which : {"timeline", "pipeline"}) {
    SCOPED_TRACE(which);
    const auto& t = j[which];
    EXPECT_EQ(t["planned"]["streams"], streams);
    EXPECT_EQ(t["planned"]["frames"], streams * 100);
    EXPECT_EQ(t["planned"]["late"], 0);
    EXPECT_GT(t["planned"]["worst_latency_ms"].get<double>(), 0.1);
    EXPECT_EQ(t["one_more"]["streams"], streams + 1);
    EXPECT_EQ(t["one_more"]["frames"], (streams + 1) * 100);
    EXPECT_GT(t["one_more"]["late"].get<int>(), 0);
    EXPECT_GT(t["one_more"]["worst_latency_ms"].get<double>(), 3.0);  // past the deadline of 3 frame periods
  }
  EXPECT_FALSE(j["pipeline"]["planned"].contains("error")) << j["pipeline"];
  // Bad input: another clock asked for, a JPEG stream, a model of batch 2.
  r = test::run(plan + " --pipeline", "TPUHAL_SIM_CLOCK=model");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("TPUHAL_SIM_CLOCK=virtual"), std::string::npos) << r.out;
  r = test::run("plan " + model + " --stream 640x360@1000:jpeg -d sim:bm1684x --pipeline");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("h264 or h265"), std::string::npos) << r.out;
  const Residual two;
  write_model_file(
      dir / "r2.tpm",
      compile_onnx(two.onnx(), options(Precision::F32, NdArray{{2, 3, 4, 4}, random(96, 534)}), "r2").model);
  r = test::run("plan " + (dir / "r2.tpm").string() +
                " --stream 640x360@1000:h264 --seconds 0.1 -d sim:bm1684x --pipeline");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("batch 1"), std::string::npos) << r.out;
  fs::remove_all(dir);
}

TEST(Runtime, GivenTheCliWhenItProfilesAModelThenEveryLayerIsPrintedAndJsonParses) {
  const fs::path dir = fs::temp_directory_path() / ("tpuhal_rt_profile_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const Residual net;
  write_model_file(
      dir / "r.tpm",
      compile_onnx(net.onnx(), options(Precision::F16, NdArray{{2, 3, 4, 4}, random(96, 523)}), "r").model);
  const std::string model = (dir / "r.tpm").string();
  auto r = test::run("profile " + model + " -n 3 -d sim:0");
  EXPECT_EQ(r.code, 0) << r.out;
  // The Add and its Relu are branch_a's (a residual fused into it).
  for (const char* want :
       {"branch_a", "branch_b", "gap", "fc", "mean of the middle 3 of 3 runs", "board time of a run", "host overhead"})
    EXPECT_NE(r.out.find(want), std::string::npos) << want << " in\n" << r.out;
  r = test::run("profile " + model + " -n 2 -d sim:0 --json");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out.substr(r.out.find('{')));
  EXPECT_EQ(j["precision"], "fp16");
  EXPECT_EQ(j["iterations"], 2);
  ASSERT_TRUE(j["layers"].is_array());
  EXPECT_EQ(j["layers"][0]["node"], "");  // the input's conversion to f16 runs first
  EXPECT_EQ(j["layers"][1]["node"], "branch_b");
  // sim:0 keeps modelled time: the run's and each layer's, and what bounds it.
  EXPECT_EQ(j["board_clock"], "modelled");
  EXPECT_GT(j["modelled_ms"].get<double>(), 0.0);
  EXPECT_TRUE(j["layers"][1].contains("modelled_ms"));
  EXPECT_TRUE(j["layers"][1].contains("bound_by"));
  // --modelled runs nothing and gives the same layers.
  r = test::run("profile " + model + " -d sim:0 --modelled --json");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto mj = nlohmann::json::parse(r.out.substr(r.out.find('{')));
  EXPECT_EQ(mj["layers"].size(), j["layers"].size());
  EXPECT_DOUBLE_EQ(mj["modelled_ms"].get<double>(), j["modelled_ms"].get<double>());
  r = test::run("profile " + model + " -d sim:0 --modelled", "TPUHAL_SIM_CLOCK=host");
  EXPECT_EQ(r.code, 0) << r.out;  // the model stays available on the host's clock
  r = test::run("profile " + model + " -n 2 -d sim:0 --json", "TPUHAL_SIM_CLOCK=host");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(nlohmann::json::parse(r.out.substr(r.out.find('{')))["board_clock"], "measured");
  r = test::run("profile " + (dir / "none.tpm").string());
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("none.tpm"), std::string::npos) << r.out;
  fs::remove_all(dir);
}

// ---- Batch chosen at run time ---------------------------------------------

CompileOptions batched(Precision p, std::int64_t max_batch) {
  CompileOptions o = options(p, NdArray{{8, 1, 8, 8}, random(8 * 64, 811)});
  o.max_batch = max_batch;
  return o;
}

// Runs `n` samples of `x` (64 floats each) through `inst`.
Vec run_batch(Instance& inst, const Vec& x, std::int64_t n) {
  Vec in(x.begin(), x.begin() + n * 64), out(static_cast<std::size_t>(n) * 10);
  inst.run({host(in)}, {host(out)});
  return out;
}

TEST(Runtime, GivenAMaximumBatchWhenCompiledThenEveryBatchUpToItRunsAsItsOwnFixedCompile) {
  const Cnn net;
  const Vec x = random(4 * 64, 812);
  Device dev = open("sim:0");
  const CompileResult r = compile_onnx(net.onnx(), batched(Precision::F32, 4), "cnn.onnx");
  EXPECT_TRUE(r.model.has(SectionKind::Stages));
  Model m = Model::load(dev, r.model);
  EXPECT_EQ(m.max_batch(), 4);
  EXPECT_EQ(m.inputs().at(0).shape, (std::vector<std::int64_t>{4, 1, 8, 8}));
  Instance inst = m.instance();
  for (std::int64_t n = 1; n <= 4; ++n) {
    // The program for n samples is the one a compile for n makes: the same bits.
    CompileOptions fixed = options(Precision::F32, NdArray{{8, 1, 8, 8}, random(8 * 64, 811)});
    fixed.shapes["image"] = {n, 1, 8, 8};
    Instance alone = Model::load(dev, compile_onnx(net.onnx(), fixed).model).instance();
    const Vec want = run(alone, Vec(x.begin(), x.begin() + n * 64));
    EXPECT_EQ(run_batch(inst, x, n), want) << n << " samples";
    EXPECT_LT(max_rel_error(want, net.reference(Vec(x.begin(), x.begin() + n * 64), n)), tolerance(Precision::F32));
  }
  // Memory is planned for the largest batch; the model's own time grows with the batch.
  EXPECT_GE(m.activation_bytes(), Model::load(dev, compile_onnx(net.onnx(),
                                                                [] {
                                                                  CompileOptions o;
                                                                  o.shapes["image"] = {4, 1, 8, 8};
                                                                  return o;
                                                                }())
                                                       .model)
                                      .activation_bytes());
  const auto one = inst.modelled(1), four = inst.modelled(4);
  ASSERT_TRUE(one && four);
  EXPECT_LT(one->ns, four->ns);
}

TEST(Runtime, GivenAnInt8ModelWithAMaximumBatchWhenRunAtEachBatchThenEverySampleGetsTheSameBits) {
  const Cnn net;
  const Vec x = random(3 * 64, 813);
  Device dev = open("sim:0");
  CompileOptions o = batched(Precision::Int8, 3);
  o.calibration = {NdArray{{3, 1, 8, 8}, x}};
  Instance inst = Model::load(dev, compile_onnx(net.onnx(), o, "cnn.onnx").model).instance();
  const Vec all = run_batch(inst, x, 3);
  EXPECT_LT(max_rel_error(all, net.reference(x, 3)), tolerance(Precision::Int8));
  // One calibration for every batch: a sample's result does not depend on
  // the batch it runs in.
  for (std::int64_t n = 1; n < 3; ++n) EXPECT_EQ(run_batch(inst, x, n), Vec(all.begin(), all.begin() + n * 10)) << n;
}

TEST(Runtime, GivenAModelWithAMaximumBatchWhenRunOutsideItThenTheErrorNamesTheRangeAndTheInstanceStillRuns) {
  const Cnn net;
  Device dev = open("sim:0");
  Model m = Model::load(dev, compile_onnx(net.onnx(), batched(Precision::F32, 2), "cnn.onnx").model, "cnn.tpm");
  Instance inst = m.instance();
  auto error = [&](std::size_t in_floats, std::size_t out_floats) {
    Vec in(in_floats), out(out_floats);
    try {
      inst.run({host(in)}, {host(out)});
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::InvalidArgument) << e.what();
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(error(3 * 64, 30),
            "cnn.tpm: input 0 ('image') is 768 bytes; it takes 1 to 2 samples of f32[1, 8, 8], 256 bytes each");
  EXPECT_EQ(error(64 + 1, 10),
            "cnn.tpm: input 0 ('image') is 260 bytes; it takes 1 to 2 samples of f32[1, 8, 8], 256 bytes each");
  EXPECT_EQ(error(0, 10),
            "cnn.tpm: input 0 ('image') is 0 bytes; it takes 1 to 2 samples of f32[1, 8, 8], 256 bytes each");
  EXPECT_EQ(error(2 * 64, 10),
            "cnn.tpm: input 0 ('image') holds 2 samples and output 0 ('probs') 1; every array of a run holds the "
            "same batch");
  EXPECT_THROW(inst.profile(1, 3), Error);
  EXPECT_THROW(inst.modelled(3), Error);
  const Vec x = random(2 * 64, 814);
  EXPECT_LT(max_rel_error(run_batch(inst, x, 1), net.reference(Vec(x.begin(), x.begin() + 64), 1)), 1e-5);
}

TEST(Runtime, GivenAModelThatCannotRunSeveralBatchesWhenCompiledForAMaximumThenTheErrorSaysWhy) {
  auto error = [](const std::vector<std::byte>& onnx, std::int64_t max_batch) {
    CompileOptions o;
    o.max_batch = max_batch;
    try {
      compile_onnx(onnx, o, "m.onnx");
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::InvalidArgument) << e.what();
      return std::string(e.what());
    }
    return std::string("no error");
  };
  // The batch written into the model.
  EXPECT_NE(error(Residual{}.onnx(), 4)
                .find("input 'x' has its batch (dimension 0) fixed at 2 in the model; "
                      "compiling for several batch sizes needs it symbolic"),
            std::string::npos);
  // An output whose first dimension is not the batch.
  OnnxBuilder b;
  b.input("x", {-1, 4});
  auto* t = b.node("Transpose", {"x"}, "y", "turn");
  OnnxBuilder::ints(t, "perm", {1, 0});
  b.output("y");
  EXPECT_EQ(error(b.bytes(), 3),
            "m.onnx: output 'y' is f32[4, 3] at batch 3; compiling for several batch sizes "
            "needs every output's first dimension to be the batch");
  EXPECT_EQ(error(b.bytes(), 1),
            "m.onnx: output 'y' is f32[4, 1] at batch 1; compiling for several batch sizes "
            "needs every output's first dimension to be the batch");
  // A model whose reshape has its batch written into it: the batch that
  // cannot be compiled is named.
  OnnxBuilder r;
  r.input("x", {-1, 4});
  r.init_i64("shape", {4, 1, 4});
  r.node("Reshape", {"x", "shape"}, "y", "reshape");
  r.output("y");
  const std::string fixed = error(r.bytes(), 4);
  EXPECT_EQ(fixed.rfind("m.onnx: compiling for batches 1 to 4, at batch 1: node 'reshape' (Reshape): ", 0), 0u)
      << fixed;
  EXPECT_NE(error(Cnn{}.onnx(), 257).find("a maximum batch of 257 is above the 256"), std::string::npos);
}

TEST(Runtime, GivenADamagedStagesSectionWhenLoadedThenInvalidArgumentNamesTheStage) {
  const ModelFile good = compile_onnx(Cnn{}.onnx(), batched(Precision::F32, 3)).model;
  Device dev = open("sim:0");
  const auto st = good.get(SectionKind::Stages);
  const nlohmann::json stages = nlohmann::json::parse(std::string(reinterpret_cast<const char*>(st.data()), st.size()));
  auto edited = [&](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json j = stages;
    edit(j);
    const std::string text = j.dump();
    ModelFile f;
    for (const auto& s : good.sections()) {
      if (s.kind != SectionKind::Stages) {
        f.add(s.kind, s.bytes, s.optional);
        continue;
      }
      std::vector<std::byte> bytes(text.size());
      std::memcpy(bytes.data(), text.data(), text.size());
      f.add(s.kind, std::move(bytes), true);
    }
    try {
      Model::load(dev, f, "net.tpm");
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::InvalidArgument) << e.what();
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(edited([](auto&) {}), "no error");
  EXPECT_EQ(edited([](auto& j) { j["stages"].erase(1); }),
            "net.tpm: the stages section is damaged: it has 1 stages for a largest batch of 3");
  EXPECT_EQ(edited([](auto& j) { j["stages"][1]["batch"] = 1; }),
            "net.tpm: the stages section is damaged: stage 1 is for batch 1, not 2");
  EXPECT_EQ(edited([](auto& j) {
              auto& g = j["stages"][0]["graph"];
              g["tensors"][g["inputs"][0].template get<int>()]["shape"][0] = 2;
            }),
            "net.tpm: the stages section is damaged: the stage for batch 1: input 0 is not image f32[1, 1, 8, 8]");
  const std::string outside = edited([](auto& j) { j["stages"][1]["graph"]["tensors"][0]["offset"] = 1u << 30; });
  EXPECT_NE(outside.find("net.tpm: the stages section is damaged: the stage for batch 2: tensor 0 ("),
            std::string::npos)
      << outside;
  // The ops' own checks, naming the stage.
  const std::string op = edited([](auto& j) { j["stages"][0]["graph"]["ops"][0]["attrs"].erase("pads"); });
  EXPECT_NE(op.find("net.tpm: the stages section is damaged: the stage for batch 1: op 0 ("), std::string::npos) << op;
}

// ---- The host stage ----------------------------------------------------------

// x [2, 3] -> Greater(x, 0) -> NonZero -> its coordinates (int64 [2, n])
// and x's positive values by GatherND over them (f32 [n]): shapes only the
// data decide, so both run in the host stage.
std::vector<std::byte> positives_model() {
  OnnxBuilder b;
  b.input("x", {2, 3});
  b.init("zero", {}, {0.0f});
  b.init_i64("perm", {1, 0});
  b.node("Greater", {"x", "zero"}, "mask", "greater");
  b.node("NonZero", {"mask"}, "where", "nonzero");
  OnnxBuilder::ints(b.node("Transpose", {"where"}, "rows", "transpose"), "perm", {1, 0});
  b.node("GatherND", {"x", "rows"}, "values", "gather");
  b.output("where");
  b.output("values");
  return b.bytes();
}

TEST(Runtime, GivenNonZeroOnComputedValuesWhenCompiledThenItRunsInTheHostStageWithTheShapeTheDataGive) {
  const CompileResult r = compile_onnx(positives_model(), CompileOptions{}, "pos.onnx");
  EXPECT_TRUE(r.model.has(SectionKind::HostStage));
  EXPECT_TRUE(std::any_of(r.notes.begin(), r.notes.end(), [](const std::string& n) {
    return n.rfind("host stage: 3 nodes from 'nonzero' (NonZero) on", 0) == 0;
  }));
  Device dev = open("sim:0");
  Model m = Model::load(dev, r.model);
  ASSERT_NE(m.host_stage(), nullptr);
  EXPECT_EQ(m.host_stage()->outputs, (std::vector<std::string>{"where", "values"}));
  EXPECT_EQ(m.host_stage()->nodes, 3u);
  // The program gives the stage the mask it computed on the device, and x.
  ASSERT_EQ(m.outputs().size(), 2u);
  EXPECT_EQ(m.outputs()[0].name, "mask");
  EXPECT_EQ(m.outputs()[1].name, "x");
  Instance inst = m.instance();
  Vec x = {1.5f, -2.0f, 3.0f, -1.0f, 0.0f, 4.25f};
  std::vector<Result> out = inst.run({host(x)});
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].name, "where");
  EXPECT_TRUE(out[0].integer);
  EXPECT_EQ(out[0].shape, (Shape{2, 3}));
  EXPECT_EQ(out[0].ints, (std::vector<std::int64_t>{0, 0, 1, 0, 2, 2}));
  EXPECT_FALSE(out[1].integer);
  EXPECT_EQ(out[1].shape, (Shape{3}));
  EXPECT_EQ(out[1].floats, (Vec{1.5f, 3.0f, 4.25f}));
  // Other data, other shapes; none positive gives empty outputs.
  x = {-1, -1, -1, -1, -1, 7};
  out = inst.run({host(x)});
  EXPECT_EQ(out[0].shape, (Shape{2, 1}));
  EXPECT_EQ(out[1].floats, (Vec{7}));
  x.assign(6, -1.0f);
  out = inst.run({host(x)});
  EXPECT_EQ(out[0].shape, (Shape{2, 0}));
  EXPECT_EQ(out[1].shape, (Shape{0}));
  // The program's outputs stay available to run() with arrays of their own.
  Vec mask(6), same(6);
  x = {1, 0, 1, 0, 1, 0};
  inst.run({host(x)}, {host(mask), host(same)});
  EXPECT_EQ(mask, (Vec{1, 0, 1, 0, 1, 0}));
  EXPECT_EQ(same, x);
  // model-info names the program's outputs and the stage's.
  const fs::path dir = fs::temp_directory_path() / ("tpuhal_host_stage_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string file = (dir / "pos.tpm").string();
  write_model_file(file, r.model);
  const test::Output info = test::run("model-info " + file + " -d sim:0");
  ASSERT_EQ(info.code, 0) << info.out;
  EXPECT_NE(info.out.find("  program output  mask f32[2, 3]\n"), std::string::npos) << info.out;
  EXPECT_NE(info.out.find("  host stage  3 nodes on the host after the program (1 GatherND, 1 NonZero, 1 Transpose)"),
            std::string::npos)
      << info.out;
  EXPECT_NE(info.out.find("  output  values (its shape decided by the data)\n"), std::string::npos) << info.out;
  const test::Output json = test::run("model-info " + file + " -d sim:0 --json");
  ASSERT_EQ(json.code, 0) << json.out;
  EXPECT_EQ(nlohmann::json::parse(json.out.substr(json.out.find('{')))["host_stage"]["outputs"],
            (nlohmann::json{"where", "values"}));
  fs::remove_all(dir);
}

// If on a computed condition (the sum of x above 0): x * 2, else x - 1.
std::vector<std::byte> if_model() {
  OnnxBuilder b;
  b.input("x", {4});
  b.init("zero", {}, {0.0f});
  b.init("two", {}, {2.0f});
  b.init("one", {}, {1.0f});
  OnnxBuilder::integer(b.node("ReduceSum", {"x"}, "sum", "sum"), "keepdims", 0);
  b.node("Greater", {"sum", "zero"}, "cond", "positive");
  auto* n = b.node("If", {"cond"}, "y", "choose");
  auto branch = [&](const char* name, const char* op, const char* by) {
    auto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::GRAPH);
    auto* g = a->mutable_g();
    g->set_name(name);
    auto* k = g->add_node();
    k->set_op_type(op);
    k->set_name(std::string(name) + "/op");
    k->add_input("x");
    k->add_input(by);
    k->add_output(std::string(name) + "/y");
    g->add_output()->set_name(std::string(name) + "/y");
  };
  branch("then_branch", "Mul", "two");
  branch("else_branch", "Sub", "one");
  b.output("y");
  return b.bytes();
}

TEST(Runtime, GivenAnIfOnAComputedConditionWhenRunThenTheBranchTheDataChooseGivesTheOutput) {
  const CompileResult r = compile_onnx(if_model(), CompileOptions{}, "if.onnx");
  Device dev = open("sim:0");
  Instance inst = Model::load(dev, r.model).instance();
  Vec x = {1, 2, -0.5f, 3};
  auto out = inst.run({host(x)});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].floats, (Vec{2, 4, -1, 6}));
  x = {-1, 2, -0.5f, -3};
  out = inst.run({host(x)});
  EXPECT_EQ(out[0].floats, (Vec{-2, 1, -1.5f, -4}));
  // On a constant condition the branch is compiled in its place.
  onnx::ModelProto folded;
  const auto bytes = if_model();
  ASSERT_TRUE(folded.ParseFromArray(bytes.data(), static_cast<int>(bytes.size())));
  auto* g = folded.mutable_graph();
  for (auto& node : *g->mutable_node())
    if (node.op_type() == "If") node.set_input(0, "yes");
  auto* t = g->add_initializer();
  t->set_name("yes");
  t->set_data_type(onnx::TensorProto::BOOL);
  t->add_int32_data(1);
  const std::string s = folded.SerializeAsString();
  const CompileResult k = compile_onnx(std::as_bytes(std::span(s.data(), s.size())), CompileOptions{}, "if.onnx");
  EXPECT_FALSE(k.model.has(SectionKind::HostStage));
  Instance direct = Model::load(dev, k.model).instance();
  Vec y(4);
  direct.run({host(x)}, {host(y)});
  EXPECT_EQ(y, (Vec{-2, 4, -1, -6}));  // x * 2 whatever x holds
}

// Softmax(Relu(Gemm(a, w, c))) + x, and RoiAlign of a feature map `f`,
// with `a` and `f` constants (folded: what a host stage evaluates) or
// inputs (computed by the device).
std::vector<std::byte> layers_model(bool constant) {
  OnnxBuilder b;
  b.input("x", {3, 4});
  b.input("z", {3, 3, 2, 3});  // zeros: the outputs are computed, not constants
  const Vec a = random(3 * 5, 901), f = random(2 * 3 * 6 * 6, 902, 0, 2);
  if (constant) {
    b.init("a", {3, 5}, a);
    b.init("f", {2, 3, 6, 6}, f);
  } else {
    b.input("a", {3, 5});
    b.input("f", {2, 3, 6, 6});
  }
  b.init("w", {4, 5}, random(4 * 5, 903));
  b.init("c", {4}, random(4, 904));
  b.init("rois", {3, 4}, {0.5f, 0.5f, 4.0f, 5.0f, 1.0f, 0.0f, 6.0f, 2.5f, -1.0f, 2.0f, 3.0f, 7.5f});
  b.init_i64("idx", {0, 1, 1});
  OnnxBuilder::integer(b.node("Gemm", {"a", "w", "c"}, "g", "gemm"), "transB", 1);
  b.node("Relu", {"g"}, "r", "relu");
  b.node("Softmax", {"r"}, "s", "softmax");
  b.node("Add", {"s", "x"}, "y", "add");
  auto* roi = b.node("RoiAlign", {"f", "rois", "idx"}, "p", "roi_align");
  OnnxBuilder::integer(roi, "output_height", 2);
  OnnxBuilder::integer(roi, "output_width", 3);
  OnnxBuilder::integer(roi, "sampling_ratio", 2);
  b.node("Add", {"p", "z"}, "pooled", "add_zero");
  b.output("y");
  b.output("pooled");
  return b.bytes();
}

TEST(Runtime, GivenLayersOfConstantsWhenCompiledThenTheyFoldToWhatTheDeviceComputes) {
  Device dev = open("sim:0");
  const CompileResult folded = compile_onnx(layers_model(true), CompileOptions{}, "m.onnx");
  for (const char* op : {"Gemm", "Relu", "Softmax", "RoiAlign"})
    EXPECT_TRUE(std::any_of(folded.notes.begin(), folded.notes.end(), [&](const std::string& n) {
      return n.rfind(std::string("folded ") + op + " ", 0) == 0;
    })) << op;
  Vec x(12, 0.0f), z(3 * 3 * 2 * 3, 0.0f), y(12), pooled(z.size());
  Model::load(dev, folded.model).instance().run({host(x), host(z)}, {host(y), host(pooled)});
  Vec a = random(3 * 5, 901), f = random(2 * 3 * 6 * 6, 902, 0, 2), dy(12), dpooled(pooled.size());
  Model::load(dev, compile_onnx(layers_model(false), CompileOptions{}, "m.onnx").model)
      .instance()
      .run({host(x), host(z), host(a), host(f)}, {host(dy), host(dpooled)});
  EXPECT_LT(max_rel_error(y, dy), 1e-6);
  // RoiAlign's fold takes the device's steps in f32: the same bits.
  EXPECT_EQ(pooled, dpooled);
}

TEST(Runtime, GivenADeviceLayerAfterADataDependentShapeWhenCompiledThenTheErrorNamesBoth) {
  OnnxBuilder b;
  b.input("x", {2, 3});
  b.init("zero", {}, {0.0f});
  b.node("Greater", {"x", "zero"}, "mask", "greater");
  b.node("NonZero", {"mask"}, "where", "nonzero");
  b.node("Cast", {"where"}, "f", "cast");
  OnnxBuilder::integer(b.g->mutable_node(b.g->node_size() - 1), "to", onnx::TensorProto::FLOAT);
  b.node("Sigmoid", {"f"}, "y", "sigmoid");
  b.output("y");
  try {
    compile_onnx(b.bytes(), CompileOptions{}, "m.onnx");
    FAIL() << "compiled";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::Unsupported);
    EXPECT_NE(std::string(e.what()).find("m.onnx: node 'sigmoid' (Sigmoid): it needs values known only once the "
                                         "program has run (after NonZero 'nonzero', whose output's shape depends on "
                                         "the device's data), so it would run in the host stage, where Sigmoid has "
                                         "no evaluation"),
              std::string::npos)
        << e.what();
  }
  // A host stage runs after one program: not with several batch sizes.
  OnnxBuilder batched;
  batched.input("x", {-1, 3});
  batched.init("zero", {}, {0.0f});
  batched.node("Greater", {"x", "zero"}, "mask", "greater");
  batched.node("NonZero", {"mask"}, "y", "nonzero");
  batched.output("y");
  CompileOptions o;
  o.max_batch = 2;
  try {
    compile_onnx(batched.bytes(), o, "m.onnx");
    FAIL() << "compiled";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("node 'nonzero' (NonZero) needs values the device computes to know its "
                                         "output's shape, so it runs in a host stage after the program, which "
                                         "--max-batch does not take"),
              std::string::npos)
        << e.what();
  }
}

TEST(Runtime, GivenADamagedHostStageSectionWhenLoadedThenInvalidArgumentSaysSo) {
  const ModelFile good = compile_onnx(positives_model(), CompileOptions{}, "pos.onnx").model;
  Device dev = open("sim:0");
  auto load = [&](const std::string& stage) {
    ModelFile f;
    for (const auto& s : good.sections()) {
      if (s.kind != SectionKind::HostStage) {
        f.add(s.kind, s.bytes, s.optional);
        continue;
      }
      std::vector<std::byte> bytes(stage.size());
      std::memcpy(bytes.data(), stage.data(), stage.size());
      f.add(s.kind, std::move(bytes));
    }
    try {
      Model::load(dev, f, "pos.tpm");
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::InvalidArgument) << e.what();
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const auto raw = good.get(SectionKind::HostStage);
  onnx::ModelProto stage;
  ASSERT_TRUE(stage.ParseFromArray(raw.data(), static_cast<int>(raw.size())));
  EXPECT_EQ(load(stage.SerializeAsString()), "no error");
  EXPECT_EQ(load("\xff\xff\xff"), "pos.tpm: the host stage section is damaged: it does not parse as an ONNX model");
  onnx::ModelProto renamed = stage;
  renamed.mutable_graph()->mutable_input(0)->set_name("other");
  EXPECT_EQ(load(renamed.SerializeAsString()),
            "pos.tpm: the host stage section is damaged: its input 0 is not the program's output 'mask'");
  onnx::ModelProto more = stage;
  more.mutable_graph()->add_input()->set_name("extra");
  EXPECT_EQ(load(more.SerializeAsString()),
            "pos.tpm: the host stage section is damaged: it takes 3 values; the program has 2 outputs");
  // An op the host cannot evaluate, or data that the stage refuses, fail the run and name the node.
  onnx::ModelProto relu = stage;
  relu.mutable_graph()->mutable_node(0)->set_op_type("Sigmoid");
  Model m = Model::load(dev, [&] {
    ModelFile f;
    for (const auto& s : good.sections())
      if (s.kind != SectionKind::HostStage) f.add(s.kind, s.bytes, s.optional);
    const std::string t = relu.SerializeAsString();
    std::vector<std::byte> bytes(t.size());
    std::memcpy(bytes.data(), t.data(), t.size());
    f.add(SectionKind::HostStage, std::move(bytes));
    return f;
  }());
  Instance inst = m.instance();
  Vec x(6, 1.0f);
  try {
    inst.run({host(x)});
    FAIL() << "ran";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("host stage: node 'nonzero' (Sigmoid) has no host evaluation"),
              std::string::npos)
        << e.what();
  }
}

TEST(Runtime, GivenAModelWithoutAHostStageWhenRunWholeThenItGivesTheProgramsOutputs) {
  OnnxBuilder b;
  b.input("x", {-1, 3});
  b.init("two", {}, {2.0f});
  b.node("Mul", {"x", "two"}, "y", "double");
  b.output("y");
  CompileOptions o;
  o.max_batch = 4;
  Device dev = open("sim:0");
  Model m = Model::load(dev, compile_onnx(b.bytes(), o, "m.onnx").model);
  EXPECT_EQ(m.host_stage(), nullptr);
  Instance inst = m.instance();
  Vec x = {1, 2, 3, 4, 5, 6};
  auto out = inst.run({host(x)});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].name, "y");
  EXPECT_EQ(out[0].shape, (Shape{2, 3}));  // the run's batch
  EXPECT_EQ(out[0].floats, (Vec{2, 4, 6, 8, 10, 12}));
}

TEST(Runtime, GivenTheCliWhenItCompilesForAMaximumBatchThenModelInfoAndProfileSpeakOfTheBatch) {
  const fs::path dir = fs::temp_directory_path() / ("tpuhal_rt_batch_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const auto onnx = Cnn{}.onnx();
  std::ofstream(dir / "cnn.onnx", std::ios::binary)
      .write(reinterpret_cast<const char*>(onnx.data()), static_cast<std::streamsize>(onnx.size()));
  const std::string model = (dir / "cnn.tpm").string();
  auto r = test::run("compile " + (dir / "cnn.onnx").string() + " -o " + model +
                     " --shape image=Nx1x8x8 --max-batch 3 -d sim:0");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("compiled for batches 1 to 3"), std::string::npos) << r.out;
  r = test::run("model-info " + model + " -d sim:0");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("batch   1 to 3 samples"), std::string::npos) << r.out;
  r = test::run("model-info " + model + " -d sim:0 --json");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(nlohmann::json::parse(r.out.substr(r.out.find('{')))["max_batch"], 3);
  r = test::run("profile " + model + " -n 2 -d sim:0 --batch 1 --json");
  ASSERT_EQ(r.code, 0) << r.out;
  const double one = nlohmann::json::parse(r.out.substr(r.out.find('{')))["device_ns"].get<double>();
  r = test::run("profile " + model + " -n 2 -d sim:0 --batch 3 --json");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_LT(one, nlohmann::json::parse(r.out.substr(r.out.find('{')))["device_ns"].get<double>());
  r = test::run("profile " + model + " -d sim:0 --batch 4");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("--batch 4: " + model + " runs 1 to 3 samples"), std::string::npos) << r.out;
  r = test::run("compile " + (dir / "cnn.onnx").string() + " -o " + model + " --max-batch 0");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("--max-batch 0: expected 1 or more"), std::string::npos) << r.out;
  fs::remove_all(dir);
}

TEST(Runtime, GivenTheCliWhenItCompilesADetectorThenTheModelGivesDetectionsAndOptionsAreChecked) {
  const fs::path dir = fs::temp_directory_path() / ("tpuhal_rt_detect_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  OnnxBuilder b;  // a YOLOv8-style head of 2 classes over 20 anchors: [1, 6, 20]
  b.input("head", {1, 6, 20});
  b.node("Relu", {"head"}, "output0", "relu");
  b.output("output0");
  const auto onnx = b.bytes();
  std::ofstream(dir / "head.onnx", std::ios::binary)
      .write(reinterpret_cast<const char*>(onnx.data()), static_cast<std::streamsize>(onnx.size()));
  const std::string in = (dir / "head.onnx").string(), model = (dir / "head.tpm").string();
  auto r = test::run("compile " + in + " -o " + model + " --detect yolov8 --max-boxes 5 --score 0.1 --iou 0.6");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("--detect yolov8: output 'output0' (20 boxes, 2 classes) ends in NMS on the board"),
            std::string::npos)
      << r.out;
  r = test::run("model-info " + model + " -d sim:0 --json");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto info = nlohmann::json::parse(r.out.substr(r.out.find('{')));
  EXPECT_EQ(info["outputs"][0]["name"], "detections") << info.dump();
  EXPECT_EQ(info["outputs"][0]["shape"], nlohmann::json({1, 5, 6})) << info.dump();
  r = test::run("profile " + model + " -n 1 -d sim:0 --json");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto profile = nlohmann::json::parse(r.out.substr(r.out.find('{')));
  ASSERT_FALSE(profile["layers"].empty()) << r.out;
  EXPECT_EQ(profile["layers"].back()["node"], "detect") << r.out;
  for (const auto& [args, says] : std::vector<std::pair<std::string, std::string>>{
           {"--score 0.3", "--score, --iou, --max-boxes, --agnostic and --anchors go with --detect"},
           {"--anchors 10,13", "--score, --iou, --max-boxes, --agnostic and --anchors go with --detect"},
           {"--detect yolov5 --anchors 10,x", "--anchors '10,x': expected numbers joined by commas"},
           {"--detect yolov5 --anchors 10,,13", "--anchors '10,,13': expected numbers joined by commas"},
           {"--detect yolov8 --anchors 10,13",
            "--anchors: only for --detect yolov5 of a model of one output per level"},
           {"--detect yolov9", "--detect: unknown head 'yolov9' (yolov8 or yolov5)"},
           {"--detect yolov8 --iou 2", "--detect: the IoU threshold 2 is not from 0 to 1"},
           {"--detect yolov8 --max-boxes 0", "--detect: 0 boxes; from 1 to 65536 per image"},
           {"--detect ''", "--detect takes yolov8 or yolov5"}}) {
    r = test::run("compile " + in + " -o " + model + " " + args);
    EXPECT_NE(r.code, 0) << args;
    EXPECT_NE(r.out.find(says), std::string::npos) << args << ": " << r.out;
  }
  fs::remove_all(dir);
}

TEST(Runtime, GivenAnArrayWhenWrittenAsNpyThenItReadsBack) {
  const fs::path p = fs::temp_directory_path() / ("tpuhal_rt_" + std::to_string(::getpid()) + ".npy");
  const NdArray a{{2, 3}, {1, 2, 3, 4, 5, 6.5f}};
  write_npy(p, a);
  const NdArray b = read_npy(p);
  EXPECT_EQ(b.shape, a.shape);
  EXPECT_EQ(b.values, a.values);
  fs::remove(p);
  EXPECT_THROW(read_npy(p), Error);
  // Integer arrays (token ids) read as floats, within +-2^24.
  auto write_ints = [&](const char* descr, const std::vector<std::int64_t>& v) {
    const std::string header = std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': (" +
                               std::to_string(v.size()) + ",), }\n";
    std::ofstream npy(p, std::ios::binary);
    npy.write("\x93NUMPY\x01\x00", 8);
    const char len[2] = {static_cast<char>(header.size()), 0};
    npy.write(len, 2);
    npy << header;
    for (auto x : v) {
      if (descr[2] == '8') {
        npy.write(reinterpret_cast<const char*>(&x), 8);
      } else {
        const auto w = static_cast<std::int32_t>(x);
        npy.write(reinterpret_cast<const char*>(&w), 4);
      }
    }
  };
  write_ints("<i8", {101, -1, 1 << 24});
  EXPECT_EQ(read_npy(p).values, (std::vector<float>{101, -1, 16777216}));
  write_ints("<i4", {7, 30000});
  EXPECT_EQ(read_npy(p).values, (std::vector<float>{7, 30000}));
  write_ints("<i8", {(1 << 24) + 1});
  try {
    read_npy(p);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("holds the integer 16777217; integer arrays hold values within +-2^24"),
              std::string::npos)
        << e.what();
  }
  fs::remove(p);
}

TEST(Runtime, GivenTheCliWhenItCompilesInInt8ThenModelInfoDescribesTheModelAndItsReport) {
  const fs::path dir = fs::temp_directory_path() / ("tpuhal_rt_cli_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  {
    const auto onnx = Cnn{}.onnx();
    std::ofstream out(dir / "cnn.onnx", std::ios::binary);
    out.write(reinterpret_cast<const char*>(onnx.data()), static_cast<std::streamsize>(onnx.size()));
  }
  write_npy(dir / "calib.npy", NdArray{{6, 1, 8, 8}, random(6 * 64, 600, 0, 1)});
  const std::string d = dir.string();
  auto r = test::run("compile " + d + "/cnn.onnx -o " + d +
                     "/cnn.tpm --shape image=2x1x8x8 --precision int8 --calibration " + d +
                     "/calib.npy --calibration-method minmax --report");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("folded BatchNormalization 'bn1' into Conv 'conv1'"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("cnn.onnx: int8"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("conv2"), std::string::npos) << r.out;  // a line of the report
  r = test::run("model-info " + d + "/cnn.tpm --device sim:0");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("int8 model"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("input   image f32[2, 1, 8, 8]"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("calibration          minmax"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Precision report"), std::string::npos) << r.out;
  r = test::run("compile " + d + "/cnn.onnx -o " + d + "/x.tpm --precision int8");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("symbolic dimension 0 ('N')"), std::string::npos) << r.out;
  r = test::run("compile " + d + "/cnn.onnx -o " + d + "/x.tpm --shape image=2x1x8x8 --precision int8");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("int8 needs calibration data"), std::string::npos) << r.out;
  // Entropy calibration, a layer kept in fp16 by name, and one more chosen for a target SNR.
  const std::string int8 = "compile " + d + "/cnn.onnx -o " + d + "/e.tpm --shape image=2x1x8x8 --precision int8 " +
                           "--calibration " + d + "/calib.npy ";
  r = test::run(int8 + "--calibration-method entropy --keep-fp16 conv1 --target-snr 60");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("(entropy)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("mixed precision: outputs at"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("layer(s) in fp16: conv1"), std::string::npos) << r.out;
  r = test::run("model-info " + d + "/e.tpm --device sim:0");
  EXPECT_NE(r.out.find("calibration          entropy"), std::string::npos) << r.out;
  r = test::run(int8 + "--calibration-method kl");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("expected minmax, percentile[:P] or entropy"), std::string::npos) << r.out;
  r = test::run(int8 + "--keep-fp16 conv9");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("--keep-fp16 'conv9' names no layer"), std::string::npos) << r.out;
  r = test::run(int8 + "--target-snr -3");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("--target-snr"), std::string::npos) << r.out;
  fs::remove_all(dir);
}

// ---- Shape computations (what exporters write for x.view(x.size(0), -1)) --------------

// x [N, 4, 3, 3] -> Reshape(x, shape) -> Gemm(36 -> 5), where `shape` comes
// from `chain` (a function adding nodes that produce the value "shape"), or
// from a Flatten when `chain` is null.
std::vector<std::byte> shape_chain_model(void (*chain)(OnnxBuilder&)) {
  OnnxBuilder b;
  b.input("x", {-1, 4, 3, 3});
  b.init("w", {5, 36}, random(180, 41));
  b.init("bias", {5}, random(5, 42));
  if (chain) {
    chain(b);
    b.node("Reshape", {"x", "shape"}, "flat", "reshape");
  } else {
    b.node("Flatten", {"x"}, "flat", "flatten");
  }
  OnnxBuilder::integer(b.node("Gemm", {"flat", "w", "bias"}, "y", "fc"), "transB", 1);
  b.output("y");
  return b.bytes();
}

Vec run_once(std::span<const std::byte> onnx, const Vec& x, std::vector<std::string>* notes = nullptr) {
  CompileOptions o;
  o.shapes["x"] = {2, 4, 3, 3};
  auto r = compile_onnx(onnx, o);
  if (notes) *notes = r.notes;
  Device dev = open("sim:0");
  Model m = Model::load(dev, r.model);
  Instance inst = m.instance();
  Vec y(10);
  inst.run({host(const_cast<Vec&>(x))}, {host(y)});
  return y;
}

TEST(Runtime, GivenTheExportersFlattenChainWhenCompiledThenShapeOpsFoldAndMatchFlatten) {
  // Shape -> Gather(0) -> Unsqueeze -> Concat with [-1]: torch's x.view(x.size(0), -1).
  const auto chain = shape_chain_model([](OnnxBuilder& b) {
    b.node("Shape", {"x"}, "s", "shape_of_x");
    b.init_i64("zero", {0}, /*scalar=*/true);
    b.node("Gather", {"s", "zero"}, "n", "batch");
    b.init_i64("axes0", {0});
    b.node("Unsqueeze", {"n", "axes0"}, "n1", "unsqueeze");
    b.init_i64("minus1", {-1});
    OnnxBuilder::integer(b.node("Concat", {"n1", "minus1"}, "shape", "concat"), "axis", 0);
  });
  const Vec x = random(72, 43);
  std::vector<std::string> notes;
  const Vec got = run_once(chain, x, &notes);
  const Vec want = run_once(shape_chain_model(nullptr), x);
  EXPECT_EQ(got, want);
  std::string all;
  for (const auto& n : notes) all += n + "\n";
  for (const char* folded :
       {"folded Shape 'shape_of_x'", "folded Gather 'batch'", "folded Unsqueeze 'unsqueeze'", "folded Concat 'concat'"})
    EXPECT_NE(all.find(folded), std::string::npos) << all;
}

TEST(Runtime, GivenSliceCastSqueezeAndIntegerArithmeticOnShapesWhenCompiledThenTheyFold) {
  // shape = Cast(Concat(Unsqueeze(s[0]), s[1:2] * Unsqueeze(Squeeze(Unsqueeze(s[2] * s[3])))), int64)
  const auto chain = shape_chain_model([](OnnxBuilder& b) {
    b.node("Shape", {"x"}, "s", "shape_of_x");
    b.init_i64("one", {1});
    b.init_i64("two", {2});
    b.init_i64("four", {4});
    b.init_i64("zero", {0});
    b.node("Slice", {"s", "one", "two"}, "c", "channels");   // [4]
    b.node("Slice", {"s", "two", "four"}, "hw", "spatial");  // [3, 3]
    b.init_i64("i0", {0}, true);
    b.init_i64("i1", {1}, true);
    b.node("Gather", {"hw", "i0"}, "height", "height");
    b.node("Gather", {"hw", "i1"}, "width", "width");
    b.node("Mul", {"height", "width"}, "area", "area");  // 9, a scalar
    b.node("Unsqueeze", {"area", "zero"}, "area1", "area1");
    b.node("Squeeze", {"area1", "zero"}, "area0", "area0");
    b.node("Unsqueeze", {"area0", "zero"}, "area2", "area2");
    b.node("Mul", {"c", "area2"}, "features", "features");  // [36]
    b.node("Gather", {"s", "i0"}, "n", "batch");
    b.node("Unsqueeze", {"n", "zero"}, "n1", "n1");
    OnnxBuilder::integer(b.node("Concat", {"n1", "features"}, "shape_f", "concat"), "axis", 0);
    OnnxBuilder::integer(b.node("Cast", {"shape_f"}, "shape", "cast"), "to", onnx::TensorProto::INT64);
  });
  const Vec x = random(72, 44);
  EXPECT_EQ(run_once(chain, x), run_once(shape_chain_model(nullptr), x));
}

TEST(Runtime, GivenShapeOpsOnDeviceDataOrOutOfRangeWhenCompiledThenTheErrorNamesTheNode) {
  OnnxBuilder b;
  b.input("x", {2, 4});
  b.node("Relu", {"x"}, "r", "relu");
  b.init_i64("i", {1}, true);
  b.node("Range", {"r", "i", "i"}, "g", "range_rows");  // a shape op: on constants only
  b.output("g");
  try {
    compile_onnx(b.bytes(), CompileOptions{}, "g.onnx");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::Unsupported);
    EXPECT_NE(std::string(e.what()).find("node 'range_rows' (Range): input 'r' is computed on the device"),
              std::string::npos)
        << e.what();
  }
  const auto bad = shape_chain_model([](OnnxBuilder& c) {
    c.node("Shape", {"x"}, "s", "shape_of_x");
    c.init_i64("seven", {7}, true);
    c.node("Gather", {"s", "seven"}, "shape", "seventh");
  });
  try {
    CompileOptions o;
    o.shapes["x"] = {2, 4, 3, 3};
    compile_onnx(bad, o, "bad.onnx");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::InvalidArgument);
    EXPECT_NE(std::string(e.what()).find("node 'seventh' (Gather): index 7 outside [-4, 4)"), std::string::npos)
        << e.what();
  }
}

TEST(Runtime, GivenAChainOfLayersWhenCompiledThenActivationsShareMemoryByLifetime) {
  // x -> Relu -> Sigmoid -> Relu -> Tanh -> Relu -> y, 4096 floats each: the
  // input and output live throughout, the four between take turns in two
  // places, one of which the output reuses once its last user is done.
  OnnxBuilder b;
  b.input("x", {1, 4096});
  const char* ops[] = {"Relu", "Sigmoid", "Relu", "Tanh", "Relu"};
  std::string prev = "x";
  for (int i = 0; i < 5; ++i) {
    const std::string out = i == 4 ? "y" : "t" + std::to_string(i);
    b.node(ops[i], {prev}, out, "layer" + std::to_string(i));
    prev = out;
  }
  b.output("y");
  auto r = compile_onnx(b.bytes(), CompileOptions{});
  std::string notes;
  for (const auto& n : r.notes) notes += n + "\n";
  EXPECT_NE(notes.find("activation memory per instance: 49152 bytes, shared by lifetime (98304 without sharing)"),
            std::string::npos)
      << notes;
  Device dev = open("sim:0");
  Model m = Model::load(dev, r.model);
  EXPECT_EQ(m.activation_bytes(), 3u * 16384u);
  Vec x = random(4096, 45, -3, 3), y(4096);
  m.instance().run({host(x)}, {host(y)});
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float want = std::max(0.0f, std::tanh(std::max(0.0f, 1.0f / (1.0f + std::exp(-std::max(0.0f, x[i]))))));
    ASSERT_NEAR(y[i], want, 1e-5f) << "at " << i;
  }
}

// ---- Hostile models: refused with an error that names the problem ----------------------

// The most memory this process has had resident, in bytes: a refusal that
// came only after taking gigabytes shows here.
std::uint64_t peak_resident_bytes() {
  struct rusage u {};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<std::uint64_t>(u.ru_maxrss) * 1024;
}
constexpr std::uint64_t kRefusalMemory = 256u << 20;

// Compiling `onnx` throws `status` with every one of `parts` in its message.
void expect_refused(std::span<const std::byte> onnx, Status status, const std::vector<std::string>& parts,
                    const CompileOptions& o = {}) {
  try {
    compile_onnx(onnx, o, "hostile.onnx");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), status) << e.what();
    for (const auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

TEST(Runtime, GivenAnInitializerWhoseShapeItsDataDoesNotFillWhenCompiledThenItIsRefusedBeforeAllocating) {
  // 81 bytes of model that declare 2^31 floats (8 GiB) and hold none.
  auto model = [](const std::function<void(onnx::TensorProto*)>& data) {
    OnnxBuilder b;
    b.input("x", {1});
    auto* t = b.g->add_initializer();
    t->set_name("big");
    t->set_data_type(onnx::TensorProto::FLOAT);
    t->add_dims(std::int64_t{1} << 31);
    data(t);
    b.node("Add", {"x", "big"}, "y", "add");
    b.output("y");
    return b.bytes();
  };
  const std::uint64_t before = peak_resident_bytes();
  expect_refused(model([](onnx::TensorProto*) {}), Status::InvalidArgument,
                 {"hostile.onnx: initializer 'big' holds 0 values; its shape [2147483648] needs 2147483648"});
  expect_refused(model([](onnx::TensorProto* t) { t->set_raw_data(std::string(4, '\0')); }), Status::InvalidArgument,
                 {"initializer 'big' holds 4 bytes of data; its shape [2147483648] of 4-byte elements needs "
                  "8589934592"});
  expect_refused(model([](onnx::TensorProto* t) { t->add_float_data(1.0f); }), Status::InvalidArgument,
                 {"initializer 'big' holds 1 values"});
  EXPECT_LT(peak_resident_bytes() - before, kRefusalMemory);
}

// y = Op(x, folded), where `folded` is Expand(c [1, 1], shape) of constants.
std::vector<std::byte> expand_model(const std::vector<std::int64_t>& shape) {
  OnnxBuilder b;
  b.input("x", {1, 1});
  b.init("c", {1, 1}, {2.0f});
  b.init_i64("shape", shape);
  b.node("Expand", {"c", "shape"}, "folded", "expand");
  b.node("Mul", {"x", "folded"}, "y", "mul");
  b.output("y");
  return b.bytes();
}

TEST(Runtime, GivenFoldingThatWouldMakeAHugeConstantWhenCompiledThenTheNodeAndSizeAreNamedBeforeAllocating) {
  const std::uint64_t before = peak_resident_bytes();
  // Expand of one constant element to [2^31, 4]: 32 GiB as float32.
  expect_refused(expand_model({std::int64_t{1} << 31, 4}), Status::ResourceExhausted,
                 {"node 'expand' (Expand): folded on constants it makes a constant of shape [2147483648, 4] "
                  "(34359738368 bytes as float32), above the limit of 1073741824 bytes",
                  "--max-constant-bytes"});
  // A broadcasting Add of two 128 KiB constants: [32768, 1] + [1, 32768] is 4 GiB.
  OnnxBuilder b;
  b.input("x", {1, 1});
  b.init("col", {32768, 1}, Vec(32768, 1.0f));
  b.init("row", {1, 32768}, Vec(32768, 2.0f));
  b.node("Add", {"col", "row"}, "sum", "outer_sum");
  b.node("Mul", {"x", "sum"}, "y", "mul");
  b.output("y");
  expect_refused(b.bytes(), Status::ResourceExhausted,
                 {"node 'outer_sum' (Add)", "[32768, 32768] (4294967296 bytes as float32)"});
  // Dimensions whose product overflows 64 bits, and a negative one.
  expect_refused(expand_model({std::int64_t{1} << 32, std::int64_t{1} << 32, std::int64_t{1} << 32}),
                 Status::ResourceExhausted, {"node 'expand' (Expand)", "[4294967296, 4294967296, 4294967296], above"});
  expect_refused(expand_model({-4, 1}), Status::InvalidArgument,
                 {"node 'expand' (Expand): its shape [-4, 1] has a negative entry"});
  EXPECT_LT(peak_resident_bytes() - before, kRefusalMemory);
  // The limit is the caller's: 64 KiB of folding fits the default, not 32 KiB.
  CompileOptions o;
  EXPECT_NO_THROW(compile_onnx(expand_model({128, 128}), o));
  o.max_constant_bytes = 32 << 10;
  expect_refused(expand_model({128, 128}), Status::ResourceExhausted,
                 {"[128, 128] (65536 bytes as float32), above the limit of 32768 bytes"}, o);
}

TEST(Runtime, GivenAnOutputShapeNoCompiledModelHoldsWhenCompiledThenTheNodeIsNamed) {
  // Expand of device data: nothing is folded, but no model holds the result.
  OnnxBuilder b;
  b.input("x", {1, 4});
  b.init_i64("shape", {std::int64_t{1} << 33, 4});
  b.node("Expand", {"x", "shape"}, "y", "expand");
  b.output("y");
  expect_refused(b.bytes(), Status::InvalidArgument,
                 {"node 'expand' (Expand): its output of shape [8589934592, 4] is beyond what a compiled model holds"});
}

// x [1, 2, 8, 8] -> one windowed op, `edit` setting its attributes.
std::vector<std::byte> window_model(const std::string& op, const std::function<void(onnx::NodeProto*)>& edit) {
  OnnxBuilder b;
  b.input("x", {1, 2, 8, 8});
  std::vector<std::string> in = {"x"};
  if (op == "Conv") {
    b.init("w", {3, 2, 3, 3}, random(54, 70));
    in.push_back("w");
  }
  edit(b.node(op, in, "y", "window"));
  b.output("y");
  return b.bytes();
}

struct WindowCase {
  std::string op, why;
  std::function<void(onnx::NodeProto*)> edit;
  std::string message;
};

// What the loader refuses, the compiler refuses: the ONNX attribute named.
const std::vector<WindowCase>& window_cases() {
  static const std::vector<WindowCase> cases = {
      {"Conv", "stride0",
       [](auto* n) {
         OnnxBuilder::ints(n, "strides", {0, 1});
       },
       "node 'window' (Conv): strides [0, 1] has an entry outside [1, 2147483647]"},
      {"Conv", "pads-5",
       [](auto* n) {
         OnnxBuilder::ints(n, "pads", {-5, 0, 0, 0});
       },
       "node 'window' (Conv): pads [-5, 0, 0, 0] has an entry outside [0, 65536]"},
      {"MaxPool", "kernel2^31",
       [](auto* n) {
         OnnxBuilder::ints(n, "kernel_shape", {std::int64_t{1} << 31, 1});
       },
       "node 'window' (MaxPool): kernel_shape [2147483648, 1] has an entry outside [1, 2147483647]"},
      {"MaxPool", "kernel9",
       [](auto* n) {
         OnnxBuilder::ints(n, "kernel_shape", {9, 9});
       },
       "node 'window' (MaxPool): its 9x9 window does not fit the padded 8x8 input"},
      {"AveragePool", "pads>=kernel",
       [](auto* n) {
         OnnxBuilder::ints(n, "kernel_shape", {2, 2});
         OnnxBuilder::ints(n, "pads", {2, 0, 0, 0});
       },
       "node 'window' (AveragePool): pads (2, 0) must be smaller than the window (2)"},
      {"Conv", "group-1", [](auto* n) { OnnxBuilder::integer(n, "group", -1); },
       "node 'window' (Conv): group -1 is outside [1, 2147483647]"},
      {"Conv", "strides3",
       [](auto* n) {
         OnnxBuilder::ints(n, "strides", {1, 1, 1});
       },
       "node 'window' (Conv): strides [1, 1, 1] has 3 entries; 2-D windows take 2"},
      // Dilated taps that all fall outside x: the importer lets it through,
      // the loader's own checks, run by the compiler, do not.
      {"MaxPool", "no-tap",
       [](auto* n) {
         OnnxBuilder::ints(n, "kernel_shape", {2, 2});
         OnnxBuilder::ints(n, "dilations", {9, 1});
         OnnxBuilder::ints(n, "pads", {8, 0, 8, 0});
       },
       "the compiled model would not load (checked on sim:0), so none is made; the loader says: the graph section "
       "is damaged: op 0 (max_pool2d, node 'window'): max_pool2d: window 7 down x has no tap inside x"},
  };
  return cases;
}

TEST(Runtime, GivenWindowAttributesTheLoaderRefusesWhenCompiledThenTheCompilerRefusesThemNamingTheAttribute) {
  for (const auto& c : window_cases()) {
    SCOPED_TRACE(c.op + " " + c.why);
    expect_refused(window_model(c.op, c.edit), Status::InvalidArgument, {c.message});
  }
}

TEST(Runtime, GivenTheCliWhenACompileIsRefusedThenItExitsNonZeroNamingTheProblemAndWritesNoFile) {
  const fs::path dir = fs::temp_directory_path() / ("tpuhal_rt_refused_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  auto save = [&](const std::string& name, std::span<const std::byte> onnx) {
    std::ofstream(dir / name, std::ios::binary)
        .write(reinterpret_cast<const char*>(onnx.data()), static_cast<std::streamsize>(onnx.size()));
    return (dir / name).string();
  };
  for (std::size_t i : {0, 1, 2, 7}) {  // stride 0, pads -5, kernel 2^31, the loader's own check
    const auto& c = window_cases()[i];
    const std::string model = save("window.onnx", window_model(c.op, c.edit));
    const fs::path out = dir / "window.tpm";
    const auto r = test::run("compile " + model + " -o " + out.string());
    EXPECT_EQ(r.code, 1) << r.out;
    EXPECT_NE(r.out.find("window.onnx: " + c.message), std::string::npos) << r.out;
    EXPECT_FALSE(fs::exists(out)) << c.why;
  }
  // Folding past --max-constant-bytes, and the option's own errors.
  const std::string model = save("expand.onnx", expand_model({128, 128}));
  const std::string out = (dir / "expand.tpm").string();
  auto r = test::run("compile " + model + " -o " + out + " --max-constant-bytes 32KiB");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("node 'expand' (Expand): folded on constants it makes a constant of shape [128, 128] (65536 "
                       "bytes as float32), above the limit of 32768 bytes"),
            std::string::npos)
      << r.out;
  EXPECT_FALSE(fs::exists(out));
  r = test::run("compile " + model + " -o " + out + " --max-constant-bytes lots");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("--max-constant-bytes 'lots': expected a size above 0"), std::string::npos) << r.out;
  r = test::run("compile " + model + " -o " + out + " --max-constant-bytes 64KiB");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(fs::exists(out));
  fs::remove_all(dir);
}

TEST(Runtime, GivenControlBytesInFilesWhenTheCliPrintsTheirTextThenTheyAreEscaped) {
  const fs::path dir = fs::temp_directory_path() / ("tpuhal_rt_escape_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string d = dir.string();
  // A node name with an escape sequence: compile's notes print it escaped.
  OnnxBuilder b;
  b.input("x", {1, 4});
  b.node("Identity", {"x"}, "i", "id\x1b[2J");
  b.node("Relu", {"i"}, "y", "relu");
  b.output("y");
  const auto onnx = b.bytes();
  std::ofstream(dir / "id.onnx", std::ios::binary)
      .write(reinterpret_cast<const char*>(onnx.data()), static_cast<std::streamsize>(onnx.size()));
  auto r = test::run("compile " + d + "/id.onnx -o " + d + "/id.tpm");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("removed Identity 'id\\x1b[2J'"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find('\x1b'), std::string::npos) << r.out;
  // And in errors.
  OnnxBuilder bad;
  bad.input("x", {1, 4});
  bad.node("Det", {"x"}, "y", "det\x1b[2J");
  bad.output("y");
  expect_refused(bad.bytes(), Status::Unsupported, {"'det\\x1b[2J' (Det)"});
  try {
    compile_onnx(bad.bytes(), CompileOptions{});
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).find('\x1b'), std::string::npos) << e.what();
  }
  // A .tpm whose metadata and input name hold control bytes.
  const ModelFile good = compile_onnx(onnx, CompileOptions{}).model;
  ModelFile evil;
  for (const auto& s : good.sections()) {
    std::vector<std::byte> bytes = s.bytes;
    if (s.kind == SectionKind::Meta) {
      const std::string meta = std::string("producer=\x1b]0;owned\x07\nsource=net\x9b") + "31m.onnx\nprecision=fp32\n";
      bytes.resize(meta.size());
      std::memcpy(bytes.data(), meta.data(), meta.size());
    }
    if (s.kind == SectionKind::Io) {
      std::string io(reinterpret_cast<const char*>(bytes.data()), bytes.size());
      io.replace(io.find("\"x\""), 3, "\"x\\u001b[5m\"");
      bytes.assign(reinterpret_cast<const std::byte*>(io.data()),
                   reinterpret_cast<const std::byte*>(io.data()) + io.size());
    }
    evil.add(s.kind, std::move(bytes), s.optional);
  }
  write_model_file(dir / "evil.tpm", evil);
  r = test::run("model-info " + d + "/evil.tpm --device sim:0");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("producer             \\x1b]0;owned\\x07"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("source               net\\x9b31m.onnx"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("input   x\\x1b[5m f32[1, 4]"), std::string::npos) << r.out;
  for (char c : {'\x1b', '\x07', '\x9b'}) EXPECT_EQ(r.out.find(c), std::string::npos) << r.out;
  r = test::run("model-info " + d + "/evil.tpm --device sim:0 --json");
  EXPECT_EQ(r.code, 0) << r.out;
  for (char c : {'\x1b', '\x07', '\x9b'}) EXPECT_EQ(r.out.find(c), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\\u001b]0;owned\\u0007"), std::string::npos) << r.out;
  // An .npy header with an escape sequence in its element type.
  const std::string header = "{'descr': '<f4\x1b[2J', 'fortran_order': False, 'shape': (1, 4), }\n";
  {
    std::ofstream npy(dir / "evil.npy", std::ios::binary);
    npy.write("\x93NUMPY\x01\x00", 8);
    const char len[2] = {static_cast<char>(header.size()), 0};
    npy.write(len, 2);
    npy << header << std::string(16, '\0');
  }
  try {
    read_npy(dir / "evil.npy");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("element type '<f4\\x1b[2J' is not supported"), std::string::npos) << e.what();
  }
  r = test::run("compile " + d + "/id.onnx -o " + d + "/c.tpm --report --calibration " + d + "/evil.npy");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("element type '<f4\\x1b[2J' is not supported"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find('\x1b'), std::string::npos) << r.out;
  fs::remove_all(dir);
}

TEST(Runtime, PrecisionNamesParse) {
  for (Precision p : {Precision::F32, Precision::F16, Precision::BF16, Precision::Int8})
    EXPECT_EQ(parse_precision(to_string(p)), p);
  EXPECT_THROW(parse_precision("fp8"), Error);
}

// The ops the compiler takes come from its table of handlers; the user's
// list of them is docs/runtime.md's table and `tpuhal compile --list-ops`.
// Every op of the table is named in the first column of the docs table (an
// op the docs forget fails here), and the CLI prints each one, foldable or not.
TEST(Runtime, EveryOpTheCompilerTakesIsDocumentedAndListed) {
  const std::vector<std::string> ops = supported_onnx_ops();
  const std::vector<std::string> foldable = foldable_onnx_ops();
  ASSERT_GT(ops.size(), 60u);
  ASSERT_TRUE(std::is_sorted(ops.begin(), ops.end()));
  for (const auto& f : foldable) EXPECT_TRUE(std::binary_search(ops.begin(), ops.end(), f)) << f;
  EXPECT_TRUE(std::binary_search(foldable.begin(), foldable.end(), std::string("Shape")));
  EXPECT_FALSE(std::binary_search(ops.begin(), ops.end(), std::string("Loop")));

  std::ifstream doc(TPUHAL_RUNTIME_DOC);
  ASSERT_TRUE(doc) << TPUHAL_RUNTIME_DOC;
  std::set<std::string> documented;
  bool in_table = false;
  for (std::string line; std::getline(doc, line);) {
    if (line.rfind("| ONNX op |", 0) == 0) in_table = true;
    if (!in_table) continue;
    if (line.rfind("|", 0) != 0) break;
    const std::string first = line.substr(1, line.find('|', 1) - 1);
    for (std::size_t i = 0; i < first.size();) {
      std::size_t j = i;
      while (j < first.size() && std::isalnum(static_cast<unsigned char>(first[j]))) ++j;
      if (j > i) documented.insert(first.substr(i, j - i));
      i = j + 1;
    }
  }
  for (const auto& op : ops) EXPECT_TRUE(documented.count(op)) << op << " is missing from docs/runtime.md's table";

  const test::Output r = test::run("compile --list-ops");
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string listed = "\n" + r.out;
  for (const auto& op : ops) {
    const bool folds = std::binary_search(foldable.begin(), foldable.end(), op);
    EXPECT_NE(listed.find("\n" + op + (folds ? " foldable\n" : "\n")), std::string::npos) << op;
  }
}

}  // namespace
}  // namespace tpuhal::rt
