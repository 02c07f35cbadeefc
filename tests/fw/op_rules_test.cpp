// The board's checks of the kinds whose rules the op schema gives
// (schema/ops.py: rule; firmware_iface/src/op_rules.inc): for each such
// kind, its sample block decodes, every dtype its rule takes decodes, an
// optional tensor may be absent (and a required one may not), and each rule
// broken, one at a time, is refused naming the tensor's aspect or the
// attribute word and the offending value. The rules come from the
// schema (tests/fw/op_rules.inc); what the board does with them is the
// decoder's code.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <ostream>
#include <string>
#include <vector>

#include "tpuhal/fw/decode.h"

namespace tpuhal::fw {
namespace {

enum class Rule {
  kDTypeIn,
  kSameDType,
  kSameShape,
  kAxis,
  kBool,
  kRank,
  kDim,
  kRange,
  kCount,
  kOptional,
  kScalar,
  kStrideZero,
  kEnum,
  kWithin,
  kKAlong,
  kOutput
};

struct RuleOf {
  Rule rule;
  std::uint32_t a, b;    // see op_rules.inc
  float lo = 0, hi = 0;  // kRange; kCount: lo
  std::uint32_t d = 0;   // kWithin: the dimension (not the axis); kKAlong: the axis
};

struct TensorOf {
  DType dtype;
  std::vector<std::uint64_t> shape;
};

struct RuledKind {
  const char* name;
  OpKind kind;
  std::size_t attr_bytes;
  std::vector<TensorOf> tensors;
  std::vector<std::uint32_t> words;
  std::vector<RuleOf> rules;
};

// gtest prints a parameter by its name.
void PrintTo(const RuledKind& k, std::ostream* os) { *os << k.name; }

const std::vector<RuledKind>& ruled_kinds() {
  static const std::vector<RuledKind> kinds{
#include "op_rules.inc"
  };
  return kinds;
}

// A block of the kind: tensors contiguous, 64 KiB apart; attribute words,
// then zero reserved words.
struct Block {
  OpHeader header{};
  std::vector<TensorRef> tensors;
  std::vector<std::uint32_t> attrs;

  explicit Block(const RuledKind& k) {
    header.magic = kOpMagic;
    header.kind = static_cast<std::uint32_t>(k.kind);
    header.num_tensors = static_cast<std::uint32_t>(k.tensors.size());
    header.attr_bytes = static_cast<std::uint32_t>(k.attr_bytes);
    for (std::size_t i = 0; i < k.tensors.size(); ++i) {
      TensorRef t{};
      t.address = 0x10000 * (i + 1);
      t.dtype = static_cast<std::uint32_t>(k.tensors[i].dtype);
      set_shape(t, k.tensors[i].shape);
      tensors.push_back(t);
    }
    attrs.assign(k.attr_bytes / 4, 0);
    std::copy(k.words.begin(), k.words.end(), attrs.begin());
    for (const auto& r : k.rules) {
      if (r.rule == Rule::kScalar)  // one value over its target's shape
        std::fill(std::begin(tensors[r.a].strides), std::end(tensors[r.a].strides), 0);
      if (r.rule == Rule::kStrideZero) tensors[r.a].strides[r.b] = 0;  // repeating along dimension b
    }
  }

  static void set_shape(TensorRef& t, const std::vector<std::uint64_t>& shape) {
    t.rank = static_cast<std::uint32_t>(shape.size());
    std::uint64_t step = 1;
    for (std::uint32_t d = kMaxRank; d-- > 0;) {
      t.shape[d] = d < shape.size() ? shape[d] : 0;
      t.strides[d] = d < shape.size() ? step : 0;
      if (d < shape.size()) step *= std::max<std::uint64_t>(shape[d], 1);  // an empty tensor stays dense
    }
  }

  std::vector<std::byte> bytes() const {
    std::vector<std::byte> out(sizeof header + tensors.size() * sizeof(TensorRef) + attrs.size() * 4);
    std::memcpy(out.data(), &header, sizeof header);
    std::memcpy(out.data() + sizeof header, tensors.data(), tensors.size() * sizeof(TensorRef));
    std::memcpy(out.data() + sizeof header + tensors.size() * sizeof(TensorRef), attrs.data(), attrs.size() * 4);
    return out;
  }
};

std::string text(const Problem& p) { return describe(p, static_cast<std::uint16_t>(Opcode::kTensorOp)); }

void expect_accepted(const Block& b, const std::string& what) {
  const auto bytes = b.bytes();
  auto r = decode_op(bytes);
  EXPECT_TRUE(r.ok()) << what << ": " << (r.ok() ? "" : text(r.problem()));
}

void expect_refused(const Block& b, CmdStatus status, std::uint16_t field, std::uint64_t value,
                    const std::string& what) {
  const auto bytes = b.bytes();
  auto r = decode_op(bytes);
  ASSERT_FALSE(r.ok()) << what << ": the board took it";
  EXPECT_EQ(r.problem().status, status) << what << ": " << text(r.problem());
  EXPECT_EQ(r.problem().field, field) << what << ": " << text(r.problem());
  EXPECT_EQ(r.problem().value, value) << what << ": " << text(r.problem());
}

// The tensors whose shape follows tensor i's (Rule::kSameShape).
std::vector<std::uint32_t> shape_followers(const RuledKind& k, std::uint32_t i) {
  std::vector<std::uint32_t> out;
  for (const auto& r : k.rules)
    if (r.rule == Rule::kSameShape && r.b == i) out.push_back(r.a);
  return out;
}

// The tensors whose dtype follows tensor i's (Rule::kSameDType).
std::vector<std::uint32_t> followers(const RuledKind& k, std::uint32_t i) {
  std::vector<std::uint32_t> out;
  for (const auto& r : k.rules)
    if (r.rule == Rule::kSameDType && r.b == i) out.push_back(r.a);
  return out;
}

// `good` with tensor i, and the tensors whose shape follows its, of `shape`.
Block reshaped(const RuledKind& k, const Block& good, std::uint32_t i, const std::vector<std::uint64_t>& shape) {
  Block b = good;
  Block::set_shape(b.tensors[i], shape);
  for (auto f : shape_followers(k, i)) Block::set_shape(b.tensors[f], shape);
  return b;
}

// Tensor i of `shape` but one longer along d is refused naming that
// dimension; of `shape` and one more dimension, naming its rank (tensor
// `like` sets its rank and its other lengths).
void expect_longer_and_deeper_refused(const RuledKind& k, const Block& good, std::uint32_t i, std::uint32_t like,
                                      std::vector<std::uint64_t> shape, std::uint32_t d) {
  const std::string what = "tensor " + std::to_string(i);
  shape[d] += 1;
  expect_refused(reshaped(k, good, i, shape), CmdStatus::kBadArgument, tensor_field(i, TensorAspect::kShape, d),
                 shape[d], what + " longer than tensor " + std::to_string(like) + " along " + std::to_string(d));
  shape[d] -= 1;
  shape.push_back(1);
  expect_refused(reshaped(k, good, i, shape), CmdStatus::kBadArgument, tensor_field(i, TensorAspect::kRank),
                 shape.size(), what + " of another rank than tensor " + std::to_string(like));
}

class RuledKinds : public ::testing::TestWithParam<RuledKind> {};

TEST_P(RuledKinds, TheSampleAndEveryDTypeOfTheRuleDecode) {
  const RuledKind& k = GetParam();
  const Block good(k);
  const auto bytes = good.bytes();
  auto r = decode_op(bytes);
  ASSERT_TRUE(r.ok()) << text(r.problem());
  EXPECT_EQ(r->kind, k.kind);
  for (const auto& rule : k.rules) {
    if (rule.rule != Rule::kDTypeIn) continue;
    for (std::uint32_t code = 1; code <= kMaxDType; ++code) {
      if (!(rule.b >> code & 1)) continue;
      Block b = good;
      b.tensors[rule.a].dtype = code;
      for (auto f : followers(k, rule.a)) b.tensors[f].dtype = code;
      expect_accepted(b, "tensor " + std::to_string(rule.a) + " of dtype " + to_string(static_cast<DType>(code)));
    }
  }
}

TEST_P(RuledKinds, EachRuleBrokenIsRefusedNamingItsField) {
  const RuledKind& k = GetParam();
  const Block good(k);
  std::size_t checked = 0;
  for (const auto& rule : k.rules) {
    switch (rule.rule) {
      case Rule::kDTypeIn:
        for (std::uint32_t code = 1; code <= kMaxDType; ++code) {
          if (rule.b >> code & 1) continue;
          Block b = good;
          b.tensors[rule.a].dtype = code;
          for (auto f : followers(k, rule.a)) b.tensors[f].dtype = code;
          expect_refused(b, CmdStatus::kBadArgument, tensor_field(rule.a, TensorAspect::kDType), code,
                         "tensor " + std::to_string(rule.a) + " of dtype " + to_string(static_cast<DType>(code)));
          ++checked;
        }
        break;
      case Rule::kSameDType: {
        Block b = good;
        const std::uint32_t like = good.tensors[rule.b].dtype;
        b.tensors[rule.a].dtype = like == 1 ? 2 : 1;
        expect_refused(b, CmdStatus::kBadArgument, tensor_field(rule.a, TensorAspect::kDType), b.tensors[rule.a].dtype,
                       "tensor " + std::to_string(rule.a) + " not of tensor " + std::to_string(rule.b) + "'s dtype");
        ++checked;
        break;
      }
      case Rule::kSameShape: {
        std::vector<std::uint64_t> shape = k.tensors[rule.b].shape;
        ASSERT_FALSE(shape.empty()) << "the sample's tensor " << rule.b << " has rank 0";
        Block b = good;
        shape[0] += 1;
        Block::set_shape(b.tensors[rule.a], shape);
        expect_refused(b, CmdStatus::kBadArgument, tensor_field(rule.a, TensorAspect::kShape, 0), shape[0],
                       "tensor " + std::to_string(rule.a) + " longer than tensor " + std::to_string(rule.b));
        shape.push_back(1);
        Block::set_shape(b.tensors[rule.a], shape);
        expect_refused(b, CmdStatus::kBadArgument, tensor_field(rule.a, TensorAspect::kRank), shape.size(),
                       "tensor " + std::to_string(rule.a) + " of another rank than tensor " + std::to_string(rule.b));
        checked += 2;
        break;
      }
      case Rule::kAxis: {
        const auto rank = static_cast<std::uint32_t>(k.tensors[rule.b].shape.size());
        Block b = good;
        b.attrs[rule.a] = rank - 1;
        expect_accepted(b, "attribute word " + std::to_string(rule.a) + " the last axis");
        b.attrs[rule.a] = rank;
        expect_refused(b, CmdStatus::kBadArgument, attr_field(4 * rule.a), rank,
                       "attribute word " + std::to_string(rule.a) + " an axis past the rank");
        ++checked;
        break;
      }
      case Rule::kRank: {
        std::vector<std::uint64_t> shape = k.tensors[rule.a].shape;
        ASSERT_EQ(shape.size(), rule.b) << "the sample's tensor " << rule.a << " against its rank rule";
        Block b = good;
        shape.push_back(1);
        Block::set_shape(b.tensors[rule.a], shape);
        expect_refused(b, CmdStatus::kBadArgument, tensor_field(rule.a, TensorAspect::kRank), shape.size(),
                       "tensor " + std::to_string(rule.a) + " of rank " + std::to_string(shape.size()));
        ++checked;
        break;
      }
      case Rule::kDim: {
        std::vector<std::uint64_t> shape = k.tensors[rule.a].shape;
        ASSERT_LT(rule.b, shape.size());
        Block b = good;
        shape[rule.b] += 1;
        Block::set_shape(b.tensors[rule.a], shape);
        expect_refused(b, CmdStatus::kBadArgument, tensor_field(rule.a, TensorAspect::kShape, rule.b), shape[rule.b],
                       "tensor " + std::to_string(rule.a) + "'s dimension " + std::to_string(rule.b) + " one longer");
        ++checked;
        break;
      }
      case Rule::kRange: {
        auto with = [&](float v) {
          Block b = good;
          b.attrs[rule.a] = std::bit_cast<std::uint32_t>(v);
          return b;
        };
        const std::string word = "attribute word " + std::to_string(rule.a);
        const float inside = std::isfinite(rule.lo) ? rule.lo : std::isfinite(rule.hi) ? rule.hi : 0.0f;
        expect_accepted(with(inside), word + " " + std::to_string(inside));
        std::vector<float> outside{std::nanf(""), INFINITY, -INFINITY};
        if (std::isfinite(rule.lo)) {
          expect_accepted(with(rule.lo), word + " at its low bound");
          outside.push_back(std::nextafter(rule.lo, -INFINITY));
        }
        if (std::isfinite(rule.hi)) {
          expect_accepted(with(rule.hi), word + " at its high bound");
          outside.push_back(std::nextafter(rule.hi, INFINITY));
        }
        for (float v : outside) {
          const Block b = with(v);
          expect_refused(b, CmdStatus::kBadArgument, attr_field(4 * rule.a), b.attrs[rule.a],
                         word + " " + std::to_string(v));
          ++checked;
        }
        break;
      }
      case Rule::kCount: {  // {kCount, word, hi, lo}
        auto with = [&](std::uint32_t v) {
          Block b = good;
          b.attrs[rule.a] = v;
          return b;
        };
        const std::string word = "attribute word " + std::to_string(rule.a);
        const auto lo = static_cast<std::uint32_t>(rule.lo);
        expect_accepted(with(lo), word + " at its low bound");
        expect_accepted(with(rule.b), word + " at its high bound");
        std::vector<std::uint32_t> outside{rule.b + 1, UINT32_MAX};
        if (lo > 0) outside.push_back(lo - 1);
        for (std::uint32_t v : outside) {
          expect_refused(with(v), CmdStatus::kBadArgument, attr_field(4 * rule.a), v, word + " " + std::to_string(v));
          ++checked;
        }
        break;
      }
      case Rule::kOptional: {
        // Absent, the tensor's rules do not apply; a tensor that is not
        // optional is refused absent.
        Block b = good;
        b.tensors[rule.a] = TensorRef{};
        expect_accepted(b, "tensor " + std::to_string(rule.a) + " absent");
        for (std::uint32_t i = 0; i < k.tensors.size(); ++i) {
          if (std::any_of(k.rules.begin(), k.rules.end(),
                          [&](const RuleOf& r) { return r.rule == Rule::kOptional && r.a == i; }))
            continue;
          Block without = good;
          without.tensors[i] = TensorRef{};
          expect_refused(without, CmdStatus::kBadArgument, tensor_field(i, TensorAspect::kDType), 0,
                         "required tensor " + std::to_string(i) + " absent");
          ++checked;
        }
        break;
      }
      case Rule::kScalar: {
        // Stride 0 along every dimension; the tensor's own dense strides
        // (several values) are refused at the first dimension longer than 1.
        Block b = good;
        Block::set_shape(b.tensors[rule.a], k.tensors[rule.b].shape);
        std::uint32_t d = 0;
        while (d < b.tensors[rule.a].rank && b.tensors[rule.a].shape[d] <= 1) ++d;
        ASSERT_LT(d, b.tensors[rule.a].rank) << "the sample's tensor " << rule.b << " holds one element";
        expect_refused(b, CmdStatus::kBadArgument, tensor_field(rule.a, TensorAspect::kStride, d),
                       b.tensors[rule.a].strides[d],
                       "tensor " + std::to_string(rule.a) + " of more than one value over tensor " +
                           std::to_string(rule.b) + "'s shape");
        ++checked;
        break;
      }
      case Rule::kStrideZero: {
        // A stride along the dimension it repeats along is refused; the
        // sample has more than one index there.
        Block b = good;
        ASSERT_LT(rule.b, b.tensors[rule.a].rank);
        ASSERT_GT(b.tensors[rule.a].shape[rule.b], 1u) << "the sample's tensor " << rule.a << " along " << rule.b;
        b.tensors[rule.a].strides[rule.b] = 1;
        expect_refused(b, CmdStatus::kBadArgument, tensor_field(rule.a, TensorAspect::kStride, rule.b), 1,
                       "tensor " + std::to_string(rule.a) + " not repeating along dimension " + std::to_string(rule.b));
        ++checked;
        break;
      }
      case Rule::kEnum: {
        Block b = good;
        b.attrs[rule.a] = rule.b;
        expect_accepted(b, "attribute word " + std::to_string(rule.a) + " its highest code");
        b.attrs[rule.a] = rule.b + 1;
        expect_refused(b, CmdStatus::kBadArgument, attr_field(4 * rule.a), rule.b + 1,
                       "attribute word " + std::to_string(rule.a) + " past its highest code");
        ++checked;
        break;
      }
      case Rule::kWithin: {
        // Tensor a (and what has its shape) as long as tensor b along
        // dimension d is taken; one longer, or of another rank, is refused.
        auto with = [&](const std::vector<std::uint64_t>& shape) { return reshaped(k, good, rule.a, shape); };
        std::vector<std::uint64_t> shape = k.tensors[rule.a].shape;
        ASSERT_LT(rule.d, shape.size());
        shape[rule.d] = k.tensors[rule.b].shape[rule.d];
        expect_accepted(with(shape), "tensor " + std::to_string(rule.a) + " as long as tensor " +
                                         std::to_string(rule.b) + " along " + std::to_string(rule.d));
        expect_longer_and_deeper_refused(k, good, rule.a, rule.b, shape, rule.d);
        checked += 2;
        break;
      }
      case Rule::kKAlong: {
        // Tensor a (and what has its shape) with 1 to tensor b's length
        // along the axis d is taken; 0 or one longer there, or another
        // length elsewhere, or another rank, is refused.
        auto with = [&](const std::vector<std::uint64_t>& shape) { return reshaped(k, good, rule.a, shape); };
        const std::vector<std::uint64_t>& of = k.tensors[rule.b].shape;
        ASSERT_LT(rule.d, of.size());
        std::vector<std::uint64_t> shape = of;
        for (std::uint64_t len : {std::uint64_t{1}, of[rule.d]}) {
          shape[rule.d] = len;
          expect_accepted(with(shape), "tensor " + std::to_string(rule.a) + " with " + std::to_string(len) + " along " +
                                           std::to_string(rule.d));
        }
        for (std::uint64_t len : {std::uint64_t{0}, of[rule.d] + 1}) {
          shape[rule.d] = len;
          expect_refused(
              with(shape), CmdStatus::kBadArgument, tensor_field(rule.a, TensorAspect::kShape, rule.d), len,
              "tensor " + std::to_string(rule.a) + " with " + std::to_string(len) + " along " + std::to_string(rule.d));
        }
        const std::uint32_t other = rule.d == 0 ? 1 : 0;
        ASSERT_LT(other, of.size()) << "the sample's tensor " << rule.b << " has rank 1";
        expect_longer_and_deeper_refused(k, good, rule.a, rule.b, of, other);
        checked += 4;
        break;
      }
      case Rule::kOutput: {
        // Written: at the address of any other tensor, or with an element
        // twice (stride 0 along a dimension longer than 1), it is refused
        // (over the last tensor, the output every kind has, by that one's
        // check, which comes first).
        const auto last = static_cast<std::uint32_t>(k.tensors.size() - 1);
        for (std::uint32_t j = 0; j < k.tensors.size(); ++j) {
          if (j == rule.a) continue;
          Block b = good;
          b.tensors[rule.a].address = b.tensors[j].address;
          expect_refused(b, CmdStatus::kBadArgument, tensor_field(j == last ? last : rule.a, TensorAspect::kOverlap),
                         j == last ? rule.a : j,
                         "tensor " + std::to_string(rule.a) + " over tensor " + std::to_string(j));
          ++checked;
        }
        Block b = good;
        std::uint32_t d = 0;
        while (d < b.tensors[rule.a].rank && b.tensors[rule.a].shape[d] <= 1) ++d;
        ASSERT_LT(d, b.tensors[rule.a].rank) << "the sample's tensor " << rule.a << " holds one element";
        b.tensors[rule.a].strides[d] = 0;
        expect_refused(b, CmdStatus::kBadArgument, tensor_field(rule.a, TensorAspect::kStride, d), 0,
                       "tensor " + std::to_string(rule.a) + " writing an element twice");
        ++checked;
        break;
      }
      case Rule::kBool: {
        Block b = good;
        b.attrs[rule.a] = 1;
        expect_accepted(b, "attribute word " + std::to_string(rule.a) + " 1");
        b.attrs[rule.a] = 2;
        expect_refused(b, CmdStatus::kBadArgument, attr_field(4 * rule.a), 2,
                       "attribute word " + std::to_string(rule.a) + " 2");
        ++checked;
        break;
      }
    }
  }
  // Reserved words, after the attribute words: zero on the wire.
  for (std::size_t w = k.words.size(); w < good.attrs.size(); ++w) {
    Block b = good;
    b.attrs[w] = 0x5A;
    expect_refused(b, CmdStatus::kReservedNotZero, attr_field(4 * w), 0x5A,
                   "reserved attribute word " + std::to_string(w));
    ++checked;
  }
  EXPECT_GT(checked, 0u) << "the rule of " << k.name << " refused nothing";
}

INSTANTIATE_TEST_SUITE_P(Schema, RuledKinds, ::testing::ValuesIn(ruled_kinds()),
                         [](const auto& p) { return std::string(p.param.name); });

}  // namespace
}  // namespace tpuhal::fw
