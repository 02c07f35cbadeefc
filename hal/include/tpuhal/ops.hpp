// Tensors and tensor operations (docs/ops.md gives each op's exact
// semantics).
//
//   tpuhal::Tensor a(buf_a, DType::F32, {64, 128});
//   tpuhal::Tensor b(buf_b, DType::F32, {128, 32});
//   tpuhal::Tensor y(buf_y, DType::F32, {64, 32});
//   q.batch().run(tpuhal::ops::matmul(a, b, y)).submit().wait();
//
// Every op checks its operands when it is built (shapes, dtypes, buffer
// sizes, outputs overlapping inputs) and throws tpuhal::Error naming the
// operand and the value; nothing invalid reaches the device. Inputs follow
// NumPy broadcasting where the op says so.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tpuhal/export.hpp"
#include "tpuhal/types.hpp"

namespace tpuhal {

class Buffer;
class Device;
namespace detail {
struct TensorState;
class DeviceImpl;
}  // namespace detail
namespace driver {
struct OpDesc;
}

TPUHAL_API std::uint32_t size_of(DType dtype) noexcept;
inline constexpr std::size_t kMaxRank = 6;

// A view of a Buffer as an n-dimensional array (rank 0 to 6): dtype, shape,
// strides in elements (row-major when not given) and a byte offset.
class TPUHAL_API Tensor {
 public:
  Tensor();
  ~Tensor();
  Tensor(const Tensor&);
  Tensor& operator=(const Tensor&);
  Tensor(Tensor&&) noexcept;
  Tensor& operator=(Tensor&&) noexcept;

  // Throws OutOfRange if the view does not fit in the buffer, InvalidArgument
  // for a negative dimension or stride, or a rank above 6.
  Tensor(const Buffer& buffer, DType dtype, std::vector<std::int64_t> shape, std::uint64_t offset = 0);
  Tensor(const Buffer& buffer, DType dtype, std::vector<std::int64_t> shape, std::vector<std::int64_t> strides,
         std::uint64_t offset);

  const Buffer& buffer() const;
  DType dtype() const;
  const std::vector<std::int64_t>& shape() const;
  const std::vector<std::int64_t>& strides() const;
  std::uint64_t offset() const;
  std::size_t rank() const;
  std::uint64_t elements() const;
  bool contiguous() const;

  // The same elements in another shape (contiguous tensors only).
  Tensor reshape(std::vector<std::int64_t> shape) const;
  // Dimensions reordered: result dim i is this tensor's dim perm[i].
  Tensor permute(const std::vector<std::size_t>& perm) const;
  // "f32[2, 3] at offset 0 of a 24-byte device buffer"
  std::string describe() const;

 private:
  friend struct detail::TensorState;
  std::shared_ptr<const detail::TensorState> state_;
};

// Activation, Layout, ResizeMode, CoordinateMode, NearestMode, ScatterReduction and ColorFormat,
// with each value's name (to_string, parse_enum<E>, names_of<E>): generated
// from the op schema (schema/ops.py).
#include "tpuhal/op_enums.inc"

// An activation and its parameters: Clip clamps to [alpha, beta] (relu6 is
// clip(0, 6)); LeakyRelu uses alpha; HardSigmoid is clamp(alpha*x + beta, 0, 1);
// HardSwish is x * HardSigmoid(x) (ONNX's HardSwish: alpha 1/6, beta 1/2).
struct ActivationParams {
  Activation kind = Activation::None;
  float alpha = 0;
  float beta = 0;
  static ActivationParams relu() { return {Activation::Relu, 0, 0}; }
  static ActivationParams relu6() { return {Activation::Clip, 0, 6}; }
  static ActivationParams clip(float lo, float hi) { return {Activation::Clip, lo, hi}; }
  static ActivationParams sigmoid() { return {Activation::Sigmoid, 0, 0}; }
  static ActivationParams silu() { return {Activation::Silu, 0, 0}; }
  static ActivationParams leaky_relu(float a = 0.01f) { return {Activation::LeakyRelu, a, 0}; }
  static ActivationParams tanh() { return {Activation::Tanh, 0, 0}; }
  static ActivationParams hard_sigmoid(float a = 0.2f, float b = 0.5f) { return {Activation::HardSigmoid, a, b}; }
  static ActivationParams hard_swish(float a = 1.0f / 6, float b = 0.5f) { return {Activation::HardSwish, a, b}; }
};

// What an op costs, counted from its operands alone, the same on every
// device: for traces, profiles and capacity plans.
struct OpCost {
  // The board peak that bounds the op: the multiply-accumulate rate of its
  // precision, or none (memory decides its speed).
  enum class Peak : std::uint8_t { Float, Int8, Memory };
  // Operations per run: a multiply-add counts 2, a pooling window its taps,
  // any other op one per output element.
  double flops = 0;
  // Bytes of every present operand as the op sees it (each element once,
  // broadcast elements included), inputs and outputs together.
  double bytes = 0;
  Peak peak = Peak::Memory;
  DType precision = DType::F32;  // the first input's dtype

  // The peak rate (operations per second) of `properties` that bounds the
  // op; 0 for Peak::Memory.
  double peak_rate(const Properties& properties) const {
    switch (peak) {
      case Peak::Float:
        return (precision == DType::F32 ? properties.peak_fp32_tflops : properties.peak_fp16_tflops) * 1e12;
      case Peak::Int8: return properties.peak_int8_tops * 1e12;
      case Peak::Memory: return 0;
    }
    return 0;
  }
};

// An operation with its operands, checked and ready to run on a queue of
// the operands' device (Batch::run). Holds its buffers alive.
class TPUHAL_API Op {
 public:
  Op();
  ~Op();
  Op(const Op&);
  Op& operator=(const Op&);
  const std::string& name() const;  // "matmul", "conv2d", ...
  Device device() const;
  // What it costs (its kind's cost class, schema/ops.py).
  OpCost cost() const;
  // Placement: whether the board runs this op on its own, reading and
  // writing device memory (DDR to DDR), rather than in a group of ops whose
  // activations may stay in its local memory (the default). It changes no
  // result: the board's timing model charges it (docs/timing.md), and a
  // board older than firmware interface 1.18 is not told. A compiler marks
  // what the board's own compiler would run alone, such as a model's
  // permute. On an empty Op, FailedPrecondition.
  Op& set_global(bool global = true);
  bool global() const;

 private:
  friend class Batch;
  friend struct OpAccess;
  std::shared_ptr<const driver::OpDesc> desc_;
  std::shared_ptr<const void> keep_;  // the operands' buffers
  std::shared_ptr<detail::DeviceImpl> device_;
};

namespace ops {

// Pads that give an output of ceil(input / stride) ("SAME_UPPER"; lower: the
// extra pad goes first) for a kernel of `kernel` with `dilation`.
TPUHAL_API std::array<std::uint32_t, 2> same_pads(std::uint32_t input, std::uint32_t kernel, std::uint32_t stride,
                                                  std::uint32_t dilation, bool lower = false);

// The builders of the kinds whose shapes a rule of their own checks: matmul,
// the convolutions and pools, activation, cast, transpose, resize and the
// colour conversions, with their options (generated from the op schema,
// schema/ops.py: BUILDERS).
#include "tpuhal/op_builders.inc"

// The elementwise maps with a builder of their own: add, sub, mul, div, max,
// min, abs, neg, exp, log, sqrt, erf, ceil, floor, round, the comparisons and
// logic (generated from the op schema, schema/ops.py).
#include "tpuhal/op_maps.inc"

// The kinds whose rules the schema gives (generated): cumsum, ...
#include "tpuhal/op_kind_builders.inc"

}  // namespace ops
}  // namespace tpuhal
