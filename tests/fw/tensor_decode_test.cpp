// Tensor op parameter blocks (fw/tensor.h): valid blocks of every kind
// decode; each rule, broken, gives its documented problem.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <variant>
#include <type_traits>
#include <set>
#include <iterator>
#include <fstream>
#include <filesystem>
#include <random>
#include <vector>

#include "tpuhal/fw/decode.h"

namespace tpuhal::fw {
namespace {

using ::testing::HasSubstr;

TensorRef tensor(std::uint64_t address, DType t, std::vector<std::uint64_t> shape) {
  TensorRef r{};
  r.address = address;
  r.dtype = static_cast<std::uint32_t>(t);
  r.rank = static_cast<std::uint32_t>(shape.size());
  std::uint64_t step = 1;
  for (std::size_t i = shape.size(); i-- > 0;) {
    r.shape[i] = shape[i];
    r.strides[i] = step;
    step *= shape[i];
  }
  return r;
}

template <class Attrs>
std::vector<std::byte> block(OpKind kind, std::vector<TensorRef> tensors, const Attrs& attrs) {
  OpHeader h{};
  h.magic = kOpMagic;
  h.kind = static_cast<std::uint32_t>(kind);
  h.num_tensors = static_cast<std::uint32_t>(tensors.size());
  h.attr_bytes = sizeof(Attrs);
  std::vector<std::byte> out(sizeof h + tensors.size() * sizeof(TensorRef) + sizeof(Attrs));
  std::memcpy(out.data(), &h, sizeof h);
  std::memcpy(out.data() + sizeof h, tensors.data(), tensors.size() * sizeof(TensorRef));
  std::memcpy(out.data() + sizeof h + tensors.size() * sizeof(TensorRef), &attrs, sizeof attrs);
  return out;
}

// A valid f32 matmul: A [4, 8] @ B [8, 16] -> Y [4, 16], no C.
std::vector<std::byte> good_matmul(MatMulAttrs* out_attrs = nullptr) {
  MatMulAttrs a{};
  a.alpha = 1;
  a.beta = 1;
  if (out_attrs) *out_attrs = a;
  return block(OpKind::kMatMul,
               {tensor(0x1000, DType::kF32, {4, 8}), tensor(0x2000, DType::kF32, {8, 16}), TensorRef{},
                tensor(0x3000, DType::kF32, {4, 16})},
               a);
}

TensorRef& tensor_at(std::vector<std::byte>& b, std::size_t i) {
  return *reinterpret_cast<TensorRef*>(b.data() + sizeof(OpHeader) + i * sizeof(TensorRef));
}

template <class Attrs>
Attrs& attrs_of(std::vector<std::byte>& b, std::size_t tensors) {
  return *reinterpret_cast<Attrs*>(b.data() + sizeof(OpHeader) + tensors * sizeof(TensorRef));
}

Problem problem_of(const std::vector<std::byte>& b) {
  auto r = decode_op(b);
  EXPECT_FALSE(r.ok());
  return r.ok() ? Problem{} : r.problem();
}

TEST(FwTensorOp, AValidMatmulDecodesWithItsExtents) {
  auto b = good_matmul();
  auto r = decode_op(b);
  ASSERT_TRUE(r.ok()) << describe(r.problem(), static_cast<std::uint16_t>(Opcode::kTensorOp));
  EXPECT_EQ(r->kind, OpKind::kMatMul);
  EXPECT_EQ(r->num_tensors, 4u);
  EXPECT_EQ(r->extent[0], 4u * 8 * 4);
  EXPECT_EQ(r->extent[1], 8u * 16 * 4);
  EXPECT_EQ(r->extent[2], 0u);  // absent C
  EXPECT_EQ(r->extent[3], 4u * 16 * 4);
}

TEST(FwTensorOp, HeaderRulesAreEnforced) {
  auto b = good_matmul();
  reinterpret_cast<OpHeader*>(b.data())->magic = 0x12345678;
  EXPECT_EQ(problem_of(b).field, kFieldOpHeader);

  b = good_matmul();
  reinterpret_cast<OpHeader*>(b.data())->kind = 99;
  auto p = problem_of(b);
  EXPECT_EQ(p.field, kFieldOpKind);
  EXPECT_EQ(p.value, 99u);

  b = good_matmul();
  reinterpret_cast<OpHeader*>(b.data())->num_tensors = 3;
  EXPECT_EQ(problem_of(b).field, kFieldOpHeader);

  b = good_matmul();
  b.push_back(std::byte{0});  // a stray byte: the sizes no longer add up
  EXPECT_EQ(problem_of(b).field, kFieldOpHeader);

  std::vector<std::byte> tiny(8);
  EXPECT_EQ(problem_of(tiny).status, CmdStatus::kBadArgument);
}

// The header's flags (interface 1.18): kOpGlobal is taken and handed to
// the timing model; any other bit, and the words after the flags, are
// reserved and refused naming the header.
TEST(FwTensorOp, TheGlobalFlagIsTakenAndOtherFlagBitsAreReserved) {
  auto b = good_matmul();
  auto r = decode_op(b);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->flags, 0u);
  reinterpret_cast<OpHeader*>(b.data())->flags = kOpGlobal;
  r = decode_op(b);
  ASSERT_TRUE(r.ok()) << describe(r.problem(), static_cast<std::uint16_t>(Opcode::kTensorOp));
  EXPECT_EQ(r->flags, kOpGlobal);
  for (const std::uint32_t bit : {1u << 1, 1u << 31}) {
    reinterpret_cast<OpHeader*>(b.data())->flags = kOpGlobal | bit;
    const Problem p = problem_of(b);
    EXPECT_EQ(p.status, CmdStatus::kReservedNotZero);
    EXPECT_EQ(p.field, kFieldOpHeader);
    EXPECT_EQ(p.value, bit);
  }
  b = good_matmul();
  reinterpret_cast<OpHeader*>(b.data())->reserved0 = 5;
  EXPECT_EQ(problem_of(b).status, CmdStatus::kReservedNotZero);
  b = good_matmul();
  reinterpret_cast<OpHeader*>(b.data())->reserved1 = 7;
  EXPECT_EQ(problem_of(b).status, CmdStatus::kReservedNotZero);
}

// Every kind of op_kinds.inc has its name, tensor count and attribute size
// in the decoder: a block of that shape gets past the header and is judged
// on its tensors (here all absent, so the first required one is named).
// Reserved attribute words are zero, in every struct of every kind: each
// word of each seed's struct (fuzz/corpus/op, valid blocks of every kind)
// set, one at a time, is refused naming that word.
TEST(FwTensorOp, EveryKindRefusesANonZeroReservedAttributeWord) {
  std::set<OpKind> kinds;
  std::size_t words = 0;
  for (const auto& entry : std::filesystem::directory_iterator(TPUHAL_OP_SEEDS)) {
    std::ifstream in(entry.path(), std::ios::binary);
    const std::string raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::vector<std::byte> block(raw.size());
    std::memcpy(block.data(), raw.data(), raw.size());
    const auto good = decode_op(block);
    ASSERT_TRUE(good.ok()) << entry.path() << ": " << describe(good.problem(), 0);
    kinds.insert(good->kind);
    const std::size_t attrs = sizeof(OpHeader) + good->num_tensors * sizeof(TensorRef);
    std::visit(
        [&](const auto& at) {
          using T = std::decay_t<decltype(at)>;
          if constexpr (requires { at.reserved; }) {
            for (std::size_t w = 0; w < sizeof at.reserved / 4; ++w) {
              std::vector<std::byte> bad = block;
              const std::uint32_t one = 0x100 + static_cast<std::uint32_t>(w);
              std::memcpy(bad.data() + attrs + offsetof(T, reserved) + 4 * w, &one, 4);
              const Problem p = problem_of(bad);
              EXPECT_EQ(p.status, CmdStatus::kReservedNotZero) << entry.path() << " word " << w;
              EXPECT_EQ(p.field, attr_field(offsetof(T, reserved) + 4 * w)) << entry.path() << " word " << w;
              EXPECT_EQ(p.value, one) << entry.path();
              ++words;
            }
          }
        },
        good->attrs);
  }
  EXPECT_EQ(kinds.size(), kMaxOpKind) << "a kind has no seed in " << TPUHAL_OP_SEEDS;
  EXPECT_GT(words, 0u);
}

TEST(FwTensorOp, EveryKindOfTheTableIsKnownToTheDecoder) {
  for (std::uint32_t k = 1; k <= kMaxOpKind; ++k) {
    const OpKindInfo& info = kOpKinds[k];
    SCOPED_TRACE(info.name);
    EXPECT_STREQ(to_string(info.kind), info.name);
    EXPECT_EQ(op_tensor_count(info.kind), info.tensors);
    OpHeader h{};
    h.magic = kOpMagic;
    h.kind = k;
    h.num_tensors = info.tensors;
    h.attr_bytes = info.attr_bytes;
    std::vector<std::byte> b(sizeof h + info.tensors * sizeof(TensorRef) + info.attr_bytes);
    std::memcpy(b.data(), &h, sizeof h);
    const Problem p = problem_of(b);
    std::uint32_t first_required = 0;
    while (info.optional >> first_required & 1) ++first_required;
    EXPECT_EQ(p.field, tensor_field(first_required, TensorAspect::kDType)) << describe(p, 0);
  }
  EXPECT_STREQ(to_string(static_cast<OpKind>(kMaxOpKind + 1)), "unknown");
}

TEST(FwTensorOp, ShapesMustAgreeWithTheOp) {
  auto b = good_matmul();
  tensor_at(b, 1).shape[0] = 7;  // K mismatch
  tensor_at(b, 1).strides[0] = 16;
  auto p = problem_of(b);
  EXPECT_EQ(p.status, CmdStatus::kBadArgument);
  EXPECT_EQ(p.field, tensor_field(1, TensorAspect::kShape, 0));
  EXPECT_EQ(p.value, 7u);
  EXPECT_EQ(p.detail, 8u);
  EXPECT_THAT(describe(p, static_cast<std::uint16_t>(Opcode::kTensorOp)), HasSubstr("tensor 1 shape[0] = 7"));

  b = good_matmul();
  tensor_at(b, 0).dtype = static_cast<std::uint32_t>(DType::kI32);  // not a float matmul
  EXPECT_EQ(problem_of(b).field, tensor_field(0, TensorAspect::kDType));
}

TEST(FwTensorOp, OutputsMayNotOverlapInputsOrThemselves) {
  auto b = good_matmul();
  tensor_at(b, 3).address = 0x1000 + 16;  // lands inside A
  auto p = problem_of(b);
  EXPECT_EQ(p.field, tensor_field(3, TensorAspect::kOverlap));
  EXPECT_EQ(p.value, 0u);  // the input it overlaps
  EXPECT_THAT(describe(p, static_cast<std::uint16_t>(Opcode::kTensorOp)), HasSubstr("overlaps input tensor 0"));

  b = good_matmul();
  tensor_at(b, 3).strides[0] = 8;  // rows of 16 elements 8 apart: elements written twice
  p = problem_of(b);
  EXPECT_EQ(p.field, tensor_field(3, TensorAspect::kStride, 0));
}

TEST(FwTensorOp, TensorStructureIsValidated) {
  auto b = good_matmul();
  tensor_at(b, 0).rank = 7;
  EXPECT_EQ(problem_of(b).field, tensor_field(0, TensorAspect::kRank));

  b = good_matmul();
  tensor_at(b, 0).shape[4] = 3;  // past the rank
  EXPECT_EQ(problem_of(b).status, CmdStatus::kReservedNotZero);

  b = good_matmul();
  tensor_at(b, 0).address = UINT64_MAX - 8;  // the extent wraps
  EXPECT_EQ(problem_of(b).field, tensor_field(0, TensorAspect::kAddress));

  b = good_matmul();
  tensor_at(b, 2).address = 0x9000;  // an absent tensor with a field set
  EXPECT_EQ(problem_of(b).status, CmdStatus::kReservedNotZero);

  b = good_matmul();
  tensor_at(b, 0).dtype = 0;  // A is required
  EXPECT_EQ(problem_of(b).field, tensor_field(0, TensorAspect::kDType));
}

TEST(FwTensorOp, AttributesAreValidated) {
  auto b = good_matmul();
  attrs_of<MatMulAttrs>(b, 4).activation = 99;
  EXPECT_EQ(problem_of(b).field, attr_field(offsetof(MatMulAttrs, activation)));

  // Hard swish (interface 1.4) is the last activation; one past it is refused.
  b = good_matmul();
  attrs_of<MatMulAttrs>(b, 4).activation = static_cast<std::uint32_t>(Activation::kHardSwish);
  EXPECT_TRUE(decode_op(b).ok());
  attrs_of<MatMulAttrs>(b, 4).activation = kMaxActivation + 1;
  EXPECT_EQ(problem_of(b).field, attr_field(offsetof(MatMulAttrs, activation)));

  b = good_matmul();
  attrs_of<MatMulAttrs>(b, 4).trans_a = 2;
  EXPECT_EQ(problem_of(b).field, attr_field(offsetof(MatMulAttrs, trans_a)));

  b = good_matmul();
  attrs_of<MatMulAttrs>(b, 4).activation = static_cast<std::uint32_t>(Activation::kClip);
  attrs_of<MatMulAttrs>(b, 4).act_alpha = 6;  // min above max
  attrs_of<MatMulAttrs>(b, 4).act_beta = 0;
  EXPECT_EQ(problem_of(b).status, CmdStatus::kBadArgument);
}

// erf (1.3), ceil, floor and round (1.10), sin to atanh (1.17): floats in,
// the same dtype out, no B.
TEST(FwTensorOp, ElementwiseFloatMapsTakeFloatsOnly) {
  ElementwiseAttrs a{};
  for (ElementwiseOp op : {ElementwiseOp::kErf, ElementwiseOp::kCeil, ElementwiseOp::kFloor, ElementwiseOp::kRound,
                           ElementwiseOp::kSin, ElementwiseOp::kCos, ElementwiseOp::kTan, ElementwiseOp::kAsin,
                           ElementwiseOp::kAcos, ElementwiseOp::kAtan, ElementwiseOp::kSinh, ElementwiseOp::kCosh,
                           ElementwiseOp::kAsinh, ElementwiseOp::kAcosh, ElementwiseOp::kAtanh}) {
    SCOPED_TRACE(static_cast<int>(op));
    EXPECT_TRUE(is_float_only(op));
    a.op = static_cast<std::uint32_t>(op);
    for (DType t : {DType::kF32, DType::kF16, DType::kBF16})
      EXPECT_TRUE(
          decode_op(block(OpKind::kElementwise, {tensor(0x1000, t, {2, 8}), TensorRef{}, tensor(0x2000, t, {2, 8})}, a))
              .ok())
          << to_string(t);
    for (DType t : {DType::kI32, DType::kU8, DType::kI8}) {
      auto b = block(OpKind::kElementwise, {tensor(0x1000, t, {2, 8}), TensorRef{}, tensor(0x2000, t, {2, 8})}, a);
      EXPECT_EQ(problem_of(b).field, tensor_field(0, TensorAspect::kDType)) << to_string(t);
    }
    auto b = block(OpKind::kElementwise,
                   {tensor(0x1000, DType::kF32, {2, 8}), TensorRef{}, tensor(0x2000, DType::kF16, {2, 8})}, a);
    EXPECT_EQ(problem_of(b).field, tensor_field(2, TensorAspect::kDType));
    b = block(
        OpKind::kElementwise,
        {tensor(0x1000, DType::kF32, {2, 8}), tensor(0x3000, DType::kF32, {2, 8}), tensor(0x2000, DType::kF32, {2, 8})},
        a);
    EXPECT_EQ(problem_of(b).field, tensor_field(1, TensorAspect::kDType));
  }
  // abs and neg take every dtype.
  EXPECT_FALSE(is_float_only(ElementwiseOp::kAbs));
  a.op = kMaxElementwiseOp + 1;
  auto b = block(OpKind::kElementwise,
                 {tensor(0x1000, DType::kF32, {2, 8}), TensorRef{}, tensor(0x2000, DType::kF32, {2, 8})}, a);
  auto p = problem_of(b);
  EXPECT_EQ(p.field, attr_field(offsetof(ElementwiseAttrs, op)));
  EXPECT_EQ(p.value, kMaxElementwiseOp + 1);
}

// The activation word is for ElementwiseOp::kActivation; any other map
// with one set is refused, not run without it.
TEST(FwTensorOp, AnElementwiseActivationIsForTheActivationMapOnly) {
  ElementwiseAttrs a{};
  a.op = static_cast<std::uint32_t>(ElementwiseOp::kActivation);
  a.activation = static_cast<std::uint32_t>(Activation::kClip);
  a.alpha = 0;
  a.beta = 6;
  const auto unary = [&] {
    return block(OpKind::kElementwise,
                 {tensor(0x1000, DType::kF32, {2, 8}), TensorRef{}, tensor(0x2000, DType::kF32, {2, 8})}, a);
  };
  EXPECT_TRUE(decode_op(unary()).ok());
  a.op = static_cast<std::uint32_t>(ElementwiseOp::kNeg);
  const Problem p = problem_of(unary());
  EXPECT_EQ(p.field, attr_field(offsetof(ElementwiseAttrs, activation)));
  EXPECT_EQ(p.value, static_cast<std::uint32_t>(Activation::kClip));
}

// Comparisons (interface 1.7): A and B of one dtype, any; Y u8. Logic: u8
// in and out, Not without B.
TEST(FwTensorOp, ElementwiseComparisonsGiveU8AndLogicTakesU8) {
  EXPECT_TRUE(is_logical(ElementwiseOp::kNot) && !is_logical(ElementwiseOp::kCeil));
  EXPECT_TRUE(is_comparison(ElementwiseOp::kLess) && !is_comparison(ElementwiseOp::kRound));
  ElementwiseAttrs a{};
  auto binary = [&](DType in, DType out) {
    return block(OpKind::kElementwise,
                 {tensor(0x1000, in, {2, 8}), tensor(0x3000, in, {2, 8}), tensor(0x2000, out, {2, 8})}, a);
  };
  for (auto op : {ElementwiseOp::kEqual, ElementwiseOp::kLess, ElementwiseOp::kLessOrEqual, ElementwiseOp::kGreater,
                  ElementwiseOp::kGreaterOrEqual}) {
    a.op = static_cast<std::uint32_t>(op);
    for (DType t : {DType::kF32, DType::kF16, DType::kBF16, DType::kI8, DType::kU8, DType::kI32})
      EXPECT_TRUE(decode_op(binary(t, DType::kU8)).ok()) << a.op << " " << to_string(t);
    EXPECT_EQ(problem_of(binary(DType::kF32, DType::kF32)).field, tensor_field(2, TensorAspect::kDType)) << a.op;
    auto mixed = block(
        OpKind::kElementwise,
        {tensor(0x1000, DType::kF32, {2, 8}), tensor(0x3000, DType::kF16, {2, 8}), tensor(0x2000, DType::kU8, {2, 8})},
        a);
    EXPECT_EQ(problem_of(mixed).field, tensor_field(1, TensorAspect::kDType)) << a.op;
  }
  for (auto op : {ElementwiseOp::kAnd, ElementwiseOp::kOr, ElementwiseOp::kXor}) {
    a.op = static_cast<std::uint32_t>(op);
    EXPECT_TRUE(decode_op(binary(DType::kU8, DType::kU8)).ok()) << a.op;
    EXPECT_EQ(problem_of(binary(DType::kF32, DType::kU8)).field, tensor_field(0, TensorAspect::kDType)) << a.op;
    EXPECT_EQ(problem_of(binary(DType::kU8, DType::kI8)).field, tensor_field(2, TensorAspect::kDType)) << a.op;
  }
  a.op = static_cast<std::uint32_t>(ElementwiseOp::kNot);
  EXPECT_TRUE(decode_op(block(OpKind::kElementwise,
                              {tensor(0x1000, DType::kU8, {2, 8}), TensorRef{}, tensor(0x2000, DType::kU8, {2, 8})}, a))
                  .ok());
  EXPECT_EQ(problem_of(binary(DType::kU8, DType::kU8)).field, tensor_field(1, TensorAspect::kDType));
}

// qlinear_add (interface 1.12): bytes in and out, each its own signedness;
// every scale f32 and every zero point of its tensor's dtype, one value
// each (stride 0); A and B in Y's shape.
TEST(FwTensorOp, QLinearAddTakesBytesAndOneScaleAndZeroPointEach) {
  QuantAttrs a{};
  auto param = [](std::uint64_t address, DType t) {
    TensorRef r = tensor(address, t, {2, 8});
    r.strides[0] = r.strides[1] = 0;
    return r;
  };
  std::vector<TensorRef> t{
      tensor(0x1000, DType::kU8, {2, 8}), param(0x5000, DType::kF32), param(0x5100, DType::kU8),
      tensor(0x2000, DType::kI8, {2, 8}), param(0x5200, DType::kF32), param(0x5300, DType::kI8),
      param(0x5400, DType::kF32),         param(0x5500, DType::kU8),  tensor(0x3000, DType::kU8, {2, 8})};
  EXPECT_TRUE(decode_op(block(OpKind::kQLinearAdd, t, a)).ok());
  auto broken = [&](std::size_t i, TensorRef r) {
    auto c = t;
    c[i] = r;
    return problem_of(block(OpKind::kQLinearAdd, c, a));
  };
  EXPECT_EQ(broken(0, tensor(0x1000, DType::kF32, {2, 8})).field, tensor_field(0, TensorAspect::kDType));
  EXPECT_EQ(broken(8, tensor(0x3000, DType::kI32, {2, 8})).field, tensor_field(8, TensorAspect::kDType));
  EXPECT_EQ(broken(3, tensor(0x2000, DType::kI8, {2, 7})).field, tensor_field(3, TensorAspect::kShape, 1));
  EXPECT_EQ(broken(4, param(0x5200, DType::kF16)).field, tensor_field(4, TensorAspect::kDType));
  EXPECT_EQ(broken(5, param(0x5300, DType::kU8)).field, tensor_field(5, TensorAspect::kDType));  // not B's dtype
  EXPECT_EQ(broken(7, param(0x5500, DType::kI8)).field, tensor_field(7, TensorAspect::kDType));  // not Y's
  EXPECT_EQ(broken(6, tensor(0x5400, DType::kF32, {2, 8})).field, tensor_field(6, TensorAspect::kStride, 0));
  EXPECT_EQ(broken(2, TensorRef{}).field, tensor_field(2, TensorAspect::kDType));  // zero points are required
  a.reserved[1] = 1;
  EXPECT_EQ(problem_of(block(OpKind::kQLinearAdd, t, a)).status, CmdStatus::kReservedNotZero);
}

TEST(FwTensorOp, GatherTakesI32OrByteIndicesAndGivesXsShapeWithTheAxisReplaced) {
  GatherAttrs a{};
  a.axis = 1;
  auto gather = [&](DType idx, DType y, std::vector<std::uint64_t> ys) {
    return block(OpKind::kGather,
                 {tensor(0x1000, DType::kBF16, {3, 10, 4}), tensor(0x2000, idx, {2, 5}), tensor(0x3000, y, ys)}, a);
  };
  EXPECT_TRUE(decode_op(gather(DType::kI32, DType::kBF16, {3, 2, 5, 4})).ok());
  // Byte indices (1.12): a table lookup.
  EXPECT_TRUE(decode_op(gather(DType::kI8, DType::kBF16, {3, 2, 5, 4})).ok());
  EXPECT_TRUE(decode_op(gather(DType::kU8, DType::kBF16, {3, 2, 5, 4})).ok());
  EXPECT_EQ(problem_of(gather(DType::kF32, DType::kBF16, {3, 2, 5, 4})).field, tensor_field(1, TensorAspect::kDType));
  EXPECT_EQ(problem_of(gather(DType::kF16, DType::kBF16, {3, 2, 5, 4})).field, tensor_field(1, TensorAspect::kDType));
  EXPECT_EQ(problem_of(gather(DType::kI32, DType::kF32, {3, 2, 5, 4})).field, tensor_field(2, TensorAspect::kDType));
  EXPECT_EQ(problem_of(gather(DType::kI32, DType::kBF16, {3, 10, 4})).field, tensor_field(2, TensorAspect::kRank));
  const Problem p = problem_of(gather(DType::kI32, DType::kBF16, {3, 2, 4, 4}));
  EXPECT_EQ(p.field, tensor_field(2, TensorAspect::kShape, 2));
  EXPECT_EQ(p.value, 4u);
  EXPECT_EQ(p.detail, 5u);
  a.axis = 3;
  EXPECT_EQ(problem_of(gather(DType::kI32, DType::kBF16, {3, 2, 5, 4})).field, attr_field(offsetof(GatherAttrs, axis)));
  a.axis = 1;
  a.reserved[2] = 7;
  EXPECT_EQ(problem_of(gather(DType::kI32, DType::kBF16, {3, 2, 5, 4})).status, CmdStatus::kReservedNotZero);
  a.reserved[2] = 0;
  // A scalar index drops the axis; y's rank is at most kMaxRank.
  EXPECT_TRUE(decode_op(block(OpKind::kGather,
                              {tensor(0x1000, DType::kI32, {7}), tensor(0x2000, DType::kI32, {}),
                               tensor(0x3000, DType::kI32, {})},
                              GatherAttrs{}))
                  .ok());
  EXPECT_EQ(problem_of(block(OpKind::kGather,
                             {tensor(0x1000, DType::kF32, {2, 2, 2, 2}), tensor(0x2000, DType::kI32, {1, 1, 1, 1}),
                              tensor(0x3000, DType::kF32, {2, 1, 1, 1, 1, 2})},
                             GatherAttrs{}))
                .field,
            tensor_field(1, TensorAspect::kRank));
}

TEST(FwTensorOp, ConvolutionOutputSizeIsChecked) {
  ConvAttrs a{};
  a.groups = 1;
  a.stride[0] = a.stride[1] = 1;
  a.dilation[0] = a.dilation[1] = 1;
  a.pad[0] = a.pad[1] = a.pad[2] = a.pad[3] = 1;
  auto make = [&](std::uint64_t oh) {
    return block(OpKind::kConv2d,
                 {tensor(0x1000, DType::kF32, {1, 3, 8, 8}), tensor(0x10000, DType::kF32, {4, 3, 3, 3}), TensorRef{},
                  tensor(0x20000, DType::kF32, {1, 4, oh, 8})},
                 a);
  };
  EXPECT_TRUE(decode_op(make(8)).ok());
  auto p = problem_of(make(9));
  EXPECT_EQ(p.field, tensor_field(3, TensorAspect::kShape, 2));
  EXPECT_EQ(p.value, 9u);
  EXPECT_EQ(p.detail, 8u);
}

// ---- where the board reports each fault of the window rule (fw/window.h) ----

// Every fault of the rule is a bad argument.
template <class Attrs>
Problem problem(OpKind kind, std::vector<TensorRef> tensors, const Attrs& attrs) {
  const Problem p = problem_of(block(kind, std::move(tensors), attrs));
  EXPECT_EQ(p.status, CmdStatus::kBadArgument);
  return p;
}

ConvAttrs conv_attrs(bool nhwc) {
  ConvAttrs a{};
  a.layout = nhwc ? 1 : 0;
  a.groups = 1;
  a.stride[0] = a.stride[1] = a.dilation[0] = a.dilation[1] = 1;
  return a;
}

// A conv2d, NHWC: x [1, 6, 5, 2], w [3, 2, 3, 3], y [1, 4, 3, 3].
Problem conv(const ConvAttrs& a, std::vector<std::uint64_t> w = {3, 2, 3, 3},
             std::vector<std::uint64_t> y = {1, 4, 3, 3}) {
  return problem(OpKind::kConv2d,
                 {tensor(0x1000, DType::kF32, {1, 6, 5, 2}), tensor(0x10000, DType::kF32, w), TensorRef{},
                  tensor(0x20000, DType::kF32, y)},
                 a);
}

TEST(FwTensorOp, AConvolutionsWindowFaultsAreAttributeWordsAndDimensions) {
  ConvAttrs a = conv_attrs(true);
  a.dilation[1] = 0;
  Problem p = conv(a);
  EXPECT_EQ(p.field, attr_field(offsetof(ConvAttrs, dilation) + 4));
  EXPECT_EQ(p.value, 0u);
  EXPECT_EQ(p.detail, kMaxWindowValue);

  a = conv_attrs(true);
  a.pad[2] = kMaxWindowValue + 1;
  EXPECT_EQ(conv(a).field, attr_field(offsetof(ConvAttrs, pad) + 8));

  a = conv_attrs(true);
  a.groups = 4;
  p = conv(a);
  EXPECT_EQ(p.field, attr_field(offsetof(ConvAttrs, groups)));
  EXPECT_EQ(p.value, 4u);

  p = conv(conv_attrs(true), {3, 1, 3, 3});
  EXPECT_EQ(p.field, tensor_field(1, TensorAspect::kShape, 1));
  EXPECT_EQ(p.value, 1u);
  EXPECT_EQ(p.detail, 2u);

  // NHWC: output channels are dimension 3, the width dimension 2.
  p = conv(conv_attrs(true), {3, 2, 3, 3}, {1, 4, 3, 4});
  EXPECT_EQ(p.field, tensor_field(3, TensorAspect::kShape, 3));
  EXPECT_EQ(p.detail, 3u);
  p = conv(conv_attrs(true), {3, 2, 3, 3}, {1, 4, 2, 3});
  EXPECT_EQ(p.field, tensor_field(3, TensorAspect::kShape, 2));
  EXPECT_EQ(p.value, 2u);
  EXPECT_EQ(p.detail, 3u);
}

// ConvAttrs::accumulate (1.23): 0 or 1 on a conv2d; on the other kinds
// that take ConvAttrs, 0 (they do not accumulate).
TEST(FwTensorOp, OnlyAConv2dAccumulatesAndItsWordIsZeroOrOne) {
  ConvAttrs a = conv_attrs(true);
  a.accumulate = 2;
  Problem p = conv(a);
  EXPECT_EQ(p.field, attr_field(offsetof(ConvAttrs, accumulate)));
  EXPECT_EQ(p.value, 2u);
  EXPECT_EQ(p.detail, 1u);
  a.accumulate = 1;
  p = problem(OpKind::kConvTranspose2d,
              {tensor(0x1000, DType::kF32, {1, 6, 5, 2}), tensor(0x10000, DType::kF32, {2, 3, 3, 3}), TensorRef{},
               tensor(0x20000, DType::kF32, {1, 8, 7, 3})},
              a);
  EXPECT_EQ(p.field, attr_field(offsetof(ConvAttrs, accumulate)));
  EXPECT_EQ(p.detail, 0u);
  p = problem(OpKind::kConvInteger,
              {tensor(0x1000, DType::kU8, {1, 6, 5, 2}), tensor(0x10000, DType::kI8, {3, 2, 3, 3}), TensorRef{},
               TensorRef{}, tensor(0x20000, DType::kI32, {1, 4, 3, 3})},
              a);
  EXPECT_EQ(p.field, attr_field(offsetof(ConvAttrs, accumulate)));
  EXPECT_EQ(p.value, 1u);
}

TEST(FwTensorOp, ATransposedConvolutionsEmptyInputAndOutputPaddingAreDimensions) {
  ConvAttrs a = conv_attrs(false);
  a.stride[0] = a.stride[1] = 2;
  // x [1, 2, 3, 3], w [2, 4, 3, 3]: y from 7x7 to 8x8.
  auto transposed = [&](std::vector<std::uint64_t> x, std::vector<std::uint64_t> w, std::vector<std::uint64_t> y) {
    return problem(
        OpKind::kConvTranspose2d,
        {tensor(0x1000, DType::kF32, x), tensor(0x10000, DType::kF32, w), TensorRef{}, tensor(0x20000, DType::kF32, y)},
        a);
  };
  Problem p = transposed({1, 2, 3, 3}, {2, 4, 3, 3}, {1, 4, 9, 8});
  EXPECT_EQ(p.field, tensor_field(3, TensorAspect::kShape, 2));
  EXPECT_EQ(p.value, 9u);
  EXPECT_EQ(p.detail, 7u);
  p = transposed({1, 2, 3, 0}, {2, 4, 3, 3}, {1, 4, 7, 1});
  EXPECT_EQ(p.field, tensor_field(0, TensorAspect::kShape, 3));
  EXPECT_EQ(p.detail, 1u);
  p = transposed({1, 2, 3, 3}, {2, 4, 0, 3}, {1, 4, 7, 7});
  EXPECT_EQ(p.field, tensor_field(1, TensorAspect::kShape, 2));
}

TEST(FwTensorOp, APoolingsKernelPadsAndEmptyWindowsAreAttributeWords) {
  PoolAttrs a{};
  a.kernel[0] = a.kernel[1] = 2;
  a.stride[0] = a.stride[1] = a.dilation[0] = a.dilation[1] = 1;
  auto pool = [&](std::vector<std::uint64_t> x, std::vector<std::uint64_t> y) {
    return problem(OpKind::kPool2d, {tensor(0x1000, DType::kF32, x), tensor(0x10000, DType::kF32, y)}, a);
  };
  a.kernel[1] = 0;
  Problem p = pool({1, 1, 4, 4}, {1, 1, 3, 3});
  EXPECT_EQ(p.field, attr_field(offsetof(PoolAttrs, kernel) + 4));
  EXPECT_EQ(p.value, 0u);

  a.kernel[1] = 2;
  a.pad[3] = 2;  // right, as wide as the window: reported at the left pad's word
  p = pool({1, 1, 4, 4}, {1, 1, 3, 5});
  EXPECT_EQ(p.field, attr_field(offsetof(PoolAttrs, pad) + 4));
  EXPECT_EQ(p.value, 0u);
  EXPECT_EQ(p.detail, 2u);

  a.pad[3] = 0;
  a.kernel[0] = 2;
  a.dilation[0] = 3;
  a.pad[0] = a.pad[2] = 1;
  p = pool({1, 1, 2, 4}, {1, 1, 1, 3});
  EXPECT_EQ(p.field, attr_field(offsetof(PoolAttrs, dilation)));
  EXPECT_EQ(p.value, 3u);
  EXPECT_EQ(p.detail, 0u);  // window 0
}

TEST(FwTensorOp, WindowOutputFollowsOnnxCeilRules) {
  EXPECT_EQ(window_output(4, 3, 2, 1, 0, 0, false), 1u);
  EXPECT_EQ(window_output(4, 3, 2, 1, 0, 0, true), 2u);
  // A last window starting in the end padding is dropped.
  EXPECT_EQ(window_output(5, 2, 2, 1, 0, 1, true), 3u);
  EXPECT_EQ(window_output(2, 3, 1, 1, 0, 0, false), 0u);  // never fits
  EXPECT_EQ(window_output(7, 3, 1, 2, 2, 2, false), 7u);  // dilation 2
}

TEST(FwTensorOp, TensorOpAndCallDescriptorsDecode) {
  CommandDescriptor d{};
  d.opcode = static_cast<std::uint16_t>(Opcode::kTensorOp);
  d.args[1] = 1000;
  auto r = decode_command(d);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(command_slots(*r), 1 + 16u);  // inline: ceil(1000 / 64) more slots
  d.args[0] = 0x1000;
  EXPECT_EQ(command_slots(*decode_command(d)), 1u);  // in memory
  d.args[1] = kMaxParamBytes + 1;
  EXPECT_EQ(decode_command(d).problem().field, 1);

  CommandDescriptor c{};
  c.opcode = static_cast<std::uint16_t>(Opcode::kCall);
  c.args[0] = 0x1010;  // not 64-aligned
  c.args[1] = 4;
  EXPECT_EQ(decode_command(c).problem().status, CmdStatus::kBadAlignment);
  c.args[0] = 0x1000;
  EXPECT_TRUE(decode_command(c).ok());
  EXPECT_FALSE(engine_accepts(EngineType::kCopy, Opcode::kTensorOp));
  EXPECT_FALSE(engine_accepts(EngineType::kCopy, Opcode::kCall));
  EXPECT_TRUE(engine_accepts(EngineType::kCompute, Opcode::kTensorOp));
}

// Random bytes in a well-formed envelope: never a crash, and every problem
// is one the decoder documents.
TEST(FwTensorOp, RandomBlocksDecodeOrGiveAKnownProblem) {
  std::mt19937_64 rng(42);
  const auto base = good_matmul();
  for (int i = 0; i < 20000; ++i) {
    auto b = base;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f) b[rng() % b.size()] ^= static_cast<std::byte>(1u << (rng() % 8));
    auto r = decode_op(b);
    if (!r.ok()) {
      const auto s = r.problem().status;
      ASSERT_TRUE(s == CmdStatus::kBadArgument || s == CmdStatus::kReservedNotZero || s == CmdStatus::kBadAlignment)
          << static_cast<int>(s);
      ASSERT_FALSE(describe(r.problem(), static_cast<std::uint16_t>(Opcode::kTensorOp)).empty());
    } else {
      // Whatever decoded obeys the invariants the engine relies on.
      for (std::uint32_t t = 0; t < r->num_tensors; ++t) ASSERT_NE(r->extent[t], UINT64_MAX);
    }
  }
}

}  // namespace
}  // namespace tpuhal::fw
