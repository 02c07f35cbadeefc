// The driver-side description of a tensor op: what the HAL hands a backend
// after checking every operand (hal/src/ops.cpp).
//
// Conventions every backend can rely on:
// - Tensors come in a fixed order per kind (the table below); absent
//   optional ones have buffer == nullptr.
// - Broadcasting is already expressed with strides: an input broadcast
//   along a dimension has stride 0 there, and inputs of elementwise-style
//   ops (and the scales and zero points of quantized ops) have exactly the
//   shape of the tensor they apply to.
// - The output (always the last tensor) has no zero strides and overlaps no
//   input.
//
//   MatMul         A, B, C (opt), Y
//   Conv2d         X, W, Bias (opt), Y
//   Pool2d         X, Y
//   Elementwise    A, B (binary ops only), Y
//   Softmax        X, Y
//   Quantize       X, Scale, ZeroPoint (opt), Y
//   Dequantize     X, Scale, ZeroPoint (opt), Y
//   MatMulInteger  A, B, AZeroPoint (opt), BZeroPoint (opt), Y
//   ConvInteger    X, W, XZeroPoint (opt), WZeroPoint (opt), Y
//   QLinearMatMul  A, AScale, AZeroPoint, B, BScale, BZeroPoint, YScale, YZeroPoint, Y
//   QLinearConv    X, XScale, XZeroPoint, W, WScale, WZeroPoint, YScale, YZeroPoint, Bias (opt), Y
//   Resize         X, Y
//   ColorConvert   Luma, Chroma U (or UV), Chroma V (opt), Y
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "tpuhal/ops.hpp"
#include "tpuhal/types.hpp"

namespace tpuhal::driver {

class BufferBackend;

struct TensorArg {
  BufferBackend* buffer = nullptr;  // nullptr: an absent optional tensor
  std::uint64_t offset = 0;         // bytes into the buffer
  DType dtype = DType::F32;
  std::uint32_t rank = 0;
  std::array<std::uint64_t, kMaxRank> shape{};
  std::array<std::uint64_t, kMaxRank> strides{};  // elements
  bool present() const noexcept { return buffer != nullptr; }
};

enum class OpKind : std::uint8_t {
  MatMul, Conv2d, Pool2d, Elementwise, Softmax, Quantize, Dequantize, MatMulInteger,
  ConvInteger, QLinearMatMul, QLinearConv, Resize, ColorConvert,
};

enum class ElementwiseOp : std::uint8_t {
  Identity, Add, Sub, Mul, Div, Max, Min, Activation, Abs, Neg, Exp, Log, Sqrt,
};

struct MatMulAttrs {
  bool transpose_a = false, transpose_b = false;
  float alpha = 1, beta = 1;
  ActivationParams activation;
};
struct ConvAttrs {
  Layout layout = Layout::NCHW;
  std::uint32_t groups = 1;
  std::array<std::uint32_t, 2> strides{1, 1}, dilations{1, 1};
  std::array<std::uint32_t, 4> pads{};
  ActivationParams activation;
};
struct PoolAttrs {
  bool max = true;
  Layout layout = Layout::NCHW;
  std::array<std::uint32_t, 2> kernel{1, 1}, strides{1, 1}, dilations{1, 1};
  std::array<std::uint32_t, 4> pads{};
  bool ceil_mode = false, count_include_pad = false;
};
struct ElementwiseAttrs {
  ElementwiseOp op = ElementwiseOp::Identity;
  ActivationParams activation;  // for ElementwiseOp::Activation
};
struct SoftmaxAttrs {
  std::uint32_t axis = 0;
  bool log = false;
};
struct NoAttrs {};
struct ResizeAttrs {
  ResizeMode mode = ResizeMode::Nearest;
  CoordinateMode coordinate = CoordinateMode::HalfPixel;
  NearestMode nearest = NearestMode::RoundPreferFloor;
  Layout layout = Layout::NCHW;
  std::array<float, 2> scales{1, 1};
};
struct ColorConvertAttrs {
  ColorFormat format = ColorFormat::NV12;
  std::array<float, 3> mean{}, scale{};
};

struct OpDesc {
  OpKind kind = OpKind::MatMul;
  std::string name;  // for messages: "matmul", "qlinear_conv", ...
  std::vector<TensorArg> tensors;
  std::variant<NoAttrs, MatMulAttrs, ConvAttrs, PoolAttrs, ElementwiseAttrs, SoftmaxAttrs,
               ResizeAttrs, ColorConvertAttrs>
      attrs;
};

}  // namespace tpuhal::driver
