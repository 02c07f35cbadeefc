// Every op kind of the HAL's table (hal/include/tpuhal/driver/op_kinds.inc)
// through each layer it crosses, one test per kind named after it: built by
// the HAL's builders into an OpDesc of that kind, encoded by the TPU
// driver, decoded by the firmware interface's validator as the firmware
// kind of the same name, and executed by the simulated board's tensor
// engine. A new line in the tables without one of its pieces fails here
// (or does not build), naming the kind (docs/adding-an-op.md).
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "encode.h"  // drivers/tpu/src
#include "impl.hpp"  // hal/src: OpAccess
#include "tpuhal/driver/op_desc.hpp"
#include "tpuhal/fw/decode.h"
#include "tpuhal/fw/version.h"
#include "tpuhal/tpuhal.hpp"

// A kind added to the table without its sample below does not build.
#pragma GCC diagnostic error "-Wswitch"

namespace tpuhal {
namespace {

using namespace std::chrono_literals;
using driver::OpKind;
using Shape = std::vector<std::int64_t>;

class OpKinds : public ::testing::TestWithParam<OpKind> {
 protected:
  void SetUp() override {
    dev_ = open("sim:tiny");
    WaitPolicy p = dev_.wait_policy();
    p.timeout = 20s;
    dev_.set_wait_policy(p);
    q_ = dev_.queue(Engine::Compute);
  }

  // A tensor whose elements all hold `value` (floats) or `value` as an
  // integer of its dtype.
  Tensor input(DType t, const Shape& shape, double value) {
    std::uint64_t n = 1;
    for (auto d : shape) n *= static_cast<std::uint64_t>(d);
    const std::uint32_t es = size_of(t);
    Buffer buf = dev_.allocate(std::max<std::uint64_t>(n * es, 64));
    std::uint32_t pattern = 0;
    switch (t) {
      case DType::F32: {
        const float f = static_cast<float>(value);
        std::memcpy(&pattern, &f, 4);
        break;
      }
      case DType::F16: pattern = value == 1 ? 0x3C00 : 0; break;
      case DType::BF16: pattern = value == 1 ? 0x3F80 : 0; break;
      case DType::I8:
      case DType::U8:
      case DType::I32: pattern = static_cast<std::uint32_t>(static_cast<std::int64_t>(value)); break;
    }
    q_.fill(buf, 0, buf.size() / es * es, pattern, es).submit().wait();
    return Tensor(buf, t, shape);
  }

  // An output whose bytes are all 0xA5 until the op writes it.
  Tensor output(DType t, const Shape& shape) {
    Tensor y = input(t, shape, 0);
    q_.fill(y.buffer(), 0, y.buffer().size(), 0xA5).submit().wait();
    return y;
  }

  // One small valid op of kind `k`, and its output.
  std::pair<Op, Tensor> sample(OpKind k) {
    switch (k) {
      // The kinds with shape rules of their own, and the kinds with rules:
      // their samples come from the schema.
#include "op_builder_samples.inc"
#include "op_kind_samples.inc"
    }
    ADD_FAILURE() << "no sample op of kind " << static_cast<int>(k);
    return {};
  }

  Device dev_;
  Queue q_;
};

TEST_P(OpKinds, BuildEncodeDecodeAndRunOnTheSimulator) {
  const driver::OpKindInfo& kind = driver::op_kind_info(GetParam());
  SCOPED_TRACE(kind.name);
  auto [op, y] = sample(GetParam());

  // Built: an OpDesc of this kind, with the kind's tensors and attributes.
  const auto& desc = OpAccess::desc(op);
  ASSERT_TRUE(desc);
  EXPECT_EQ(desc->kind, GetParam());
  EXPECT_EQ(desc->tensors.size(), kind.tensors);
  EXPECT_EQ(desc->attrs.index(), kind.attrs_index);
  // The driver sends it to a board that speaks the kind's minor, no older.
  EXPECT_EQ(tpu::required_minor(*desc), kind.minor);

  // Encoded and decoded: the firmware kind of the same name, the block
  // accepted by the board's validator.
  const std::vector<std::byte> block = tpu::encode_op(*desc, fw::kInterfaceVersion.minor);
  auto decoded = fw::decode_op(block);
  ASSERT_TRUE(decoded.ok()) << fw::describe(decoded.problem(), static_cast<std::uint16_t>(fw::Opcode::kTensorOp));
  EXPECT_STREQ(fw::to_string(decoded->kind), kind.name);
  EXPECT_EQ(decoded->num_tensors, kind.tensors);

  // Run: the engine writes the output.
  q_.run(op).submit().wait();
  Buffer staging = dev_.allocate(y.buffer().size(), Memory::HostPinned);
  q_.copy(y.buffer(), staging).submit().wait();
  auto m = staging.map();
  const std::uint64_t bytes = y.elements() * size_of(y.dtype());
  std::uint64_t untouched = 0;
  for (std::uint64_t i = 0; i < bytes; ++i) untouched += m.data()[i] == std::byte{0xA5};
  EXPECT_LT(untouched, bytes) << "the engine left the output as it was";
}

// Every kind has a cost (schema/ops.py: its cost class and peak): some
// operations, the bytes of its operands, and the peak that bounds it. The
// peak is restated here, by kind, apart from the schema.
TEST_P(OpKinds, EveryKindHasACost) {
  SCOPED_TRACE(driver::to_string(GetParam()));
  auto [op, y] = sample(GetParam());
  const OpCost c = op.cost();
  EXPECT_GE(c.flops, static_cast<double>(y.elements()));
  double bytes = 0;
  for (const auto& t : OpAccess::desc(op)->tensors)
    if (t.present()) {
      double n = 1;
      for (std::uint32_t i = 0; i < t.rank; ++i) n *= static_cast<double>(t.shape[i]);
      bytes += n * size_of(t.dtype);
    }
  EXPECT_EQ(c.bytes, bytes);
  OpCost::Peak want = OpCost::Peak::Memory;
  switch (GetParam()) {
    case OpKind::MatMul:
    case OpKind::Conv2d:
    case OpKind::ConvTranspose2d: want = OpCost::Peak::Float; break;
    case OpKind::MatMulInteger:
    case OpKind::ConvInteger:
    case OpKind::QLinearMatMul:
    case OpKind::QLinearConv: want = OpCost::Peak::Int8; break;
    default: break;
  }
  EXPECT_EQ(c.peak, want);
}

// The counts of each cost class, on shapes worked by hand.
TEST_F(OpKinds, CostsCountWhatTheirClassSays) {
  const DType f = DType::F32;
  Tensor a = input(f, {8, 16}, 1), b = input(f, {16, 4}, 1), y = output(f, {8, 4});
  OpCost c = ops::matmul(a, b, y).cost();
  EXPECT_EQ(c.flops, 2.0 * 8 * 4 * 16);
  EXPECT_EQ(c.bytes, (8 * 16 + 16 * 4 + 8 * 4) * 4.0);
  EXPECT_EQ(c.peak, OpCost::Peak::Float);
  EXPECT_EQ(c.precision, f);
  Properties p;
  p.peak_fp32_tflops = 2;
  p.peak_fp16_tflops = 16;
  p.peak_int8_tops = 32;
  EXPECT_EQ(c.peak_rate(p), 2e12);
  ops::MatMulOptions t;
  t.transpose_a = true;
  EXPECT_EQ(ops::matmul(input(f, {16, 8}, 1), b, y, t).cost().flops, 2.0 * 8 * 4 * 16);

  ops::Conv2dOptions co;
  co.pads = {1, 1, 1, 1};
  Tensor x = input(f, {1, 3, 8, 8}, 1), w = input(f, {4, 3, 3, 3}, 1), cy = output(f, {1, 4, 8, 8});
  EXPECT_EQ(ops::conv2d(x, w, cy, co).cost().flops, 2.0 * (4 * 8 * 8) * (3 * 3 * 3));

  ops::Pool2dOptions po;
  po.kernel = {2, 2};
  po.strides = {2, 2};
  Tensor px = input(f, {1, 1, 4, 4}, 1), py = output(f, {1, 1, 2, 2});
  c = ops::max_pool2d(px, py, po).cost();
  EXPECT_EQ(c.flops, 4.0 * 4);
  EXPECT_EQ(c.peak, OpCost::Peak::Memory);
  EXPECT_EQ(c.peak_rate(p), 0);

  Tensor h = input(DType::F16, {8, 16}, 1), hb = input(DType::F16, {16, 4}, 1), hy = output(DType::F16, {8, 4});
  EXPECT_EQ(ops::matmul(h, hb, hy).cost().peak_rate(p), 16e12);

  const OpCost none = Op().cost();
  EXPECT_EQ(none.flops, 0);
  EXPECT_EQ(none.bytes, 0);
}

std::vector<OpKind> all_kinds() {
  std::vector<OpKind> kinds;
  for (const auto& k : driver::kOpKinds) kinds.push_back(k.kind);
  return kinds;
}

// A gather by byte indices (a table lookup) came in 1.12, after the kind:
// the driver asks that minor of the board for it, and the kind's for i32.
TEST_F(OpKinds, GatherByByteIndicesNeedsTheMinorTheyCameIn) {
  Tensor y = output(DType::F32, {2});
  for (DType t : {DType::U8, DType::I8, DType::I32}) {
    const Op op = ops::gather(input(DType::F32, {3}, 1), input(t, {2}, 1), y);
    EXPECT_EQ(tpu::required_minor(*OpAccess::desc(op)),
              t == DType::I32 ? driver::op_kind_info(OpKind::Gather).minor : fw::kMinorGatherByteIndices)
        << to_string(t);
  }
  EXPECT_GT(fw::kMinorGatherByteIndices, driver::op_kind_info(OpKind::Gather).minor);
}

INSTANTIATE_TEST_SUITE_P(Table, OpKinds, ::testing::ValuesIn(all_kinds()),
                         [](const ::testing::TestParamInfo<OpKind>& i) {
                           return std::string(driver::to_string(i.param));
                         });

}  // namespace
}  // namespace tpuhal
