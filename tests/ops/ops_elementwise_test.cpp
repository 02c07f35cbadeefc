// The elementwise ops: binary and unary maps, activations, casts between
// every pair of dtypes, transposes.
#include <array>

#include "ops_reference.hpp"

namespace tpuhal::ops_test {
namespace {

TEST_P(Ops, ElementwiseBinaryOpsBroadcastAndRoundAsF32) {
  for (DType dt : {DType::F32, DType::F16, DType::BF16})
    for (Bin op : {Bin::Add, Bin::Sub, Bin::Mul, Bin::Div, Bin::Max, Bin::Min, Bin::Mod, Bin::Fmod})
      for (const auto& [as, bs, ys] : kBroadcasts) {
        const Host a = with_specials(rng_, rand(dt, as, -8, 8), dt);
        const Host b = with_specials(rng_, rand(dt, bs, -8, 8), dt);
        const Tensor y = lab().output(dt, ys);
        const Host got = lab().run(bin_op(op, lab().upload(a), lab().upload(b), y), y);
        std::vector<double> want;
        for_each_index(ys, [&](const Shape& idx, std::int64_t) {
          want.push_back(float_bin(op, bcast_at(a, idx), bcast_at(b, idx), dt));
        });
        expect_exact(
            std::string(bin_name(op)) + " " + to_string(dt) + " " + dims(as) + " and " + dims(bs) + " -> " + dims(ys),
            got, want);
      }
}

TEST_P(Ops, ElementwiseIntegerOpsWrapAndDivideTowardZero) {
  for (DType dt : {DType::I8, DType::U8, DType::I32})
    for (Bin op : {Bin::Add, Bin::Sub, Bin::Mul, Bin::Div, Bin::Max, Bin::Min, Bin::Mod, Bin::Fmod})
      for (const auto& [as, bs, ys] : kBroadcasts) {
        Host a = with_specials(rng_, rand_int(rng_, dt, as), dt);
        Host b = with_specials(rng_, rand_int(rng_, dt, bs), dt);
        if (op == Bin::Div || op == Bin::Mod || op == Bin::Fmod)
          for (auto& v : b.v)
            if (rng_.coin(0.2)) v = rng_.coin() ? 0.0 : (dt == DType::U8 ? 1.0 : -1.0);  // x / 0 and MIN / -1
        const Tensor y = lab().output(dt, ys);
        const Host got = lab().run(bin_op(op, lab().upload(a), lab().upload(b), y), y);
        std::vector<double> want;
        for_each_index(ys, [&](const Shape& idx, std::int64_t) {
          want.push_back(int_bin(op, static_cast<std::int64_t>(bcast_at(a, idx)),
                                 static_cast<std::int64_t>(bcast_at(b, idx)), dt));
        });
        expect_exact(
            std::string(bin_name(op)) + " " + to_string(dt) + " " + dims(as) + " and " + dims(bs) + " -> " + dims(ys),
            got, want);
      }
}

TEST_P(Ops, ComparisonsGiveOneOrZeroAndANaNComparesFalse) {
  using Cmp = Op (*)(const Tensor&, const Tensor&, const Tensor&);
  const std::pair<Cmp, const char*> cmps[] = {{ops::equal, "equal"},
                                              {ops::less, "less"},
                                              {ops::less_equal, "less_equal"},
                                              {ops::greater, "greater"},
                                              {ops::greater_equal, "greater_equal"}};
  auto holds = [](int k, double u, double v) {
    return k == 0 ? u == v : k == 1 ? u < v : k == 2 ? u <= v : k == 3 ? u > v : u >= v;
  };
  for (DType dt : {DType::F32, DType::F16, DType::BF16, DType::I8, DType::U8, DType::I32})
    for (int k = 0; k < 5; ++k)
      for (const auto& [as, bs, ys] : kBroadcasts) {
        // Small whole numbers, so that equal pairs are common, then NaN,
        // infinities, signed zeros and the type's extremes.
        auto operand = [&](const Shape& s) {
          Host h = is_float(dt) ? rand(dt, s, -3, 3) : rand_int(rng_, dt, s);
          if (is_float(dt))
            for (auto& v : h.v) v = std::round(v);
          return with_specials(rng_, std::move(h), dt);
        };
        const Host a = operand(as), b = operand(bs);
        const Tensor y = lab().output(DType::U8, ys);
        const Host got = lab().run(cmps[k].first(lab().upload(a), lab().upload(b), y), y);
        std::vector<double> want;
        for_each_index(ys, [&](const Shape& idx, std::int64_t) {
          want.push_back(holds(k, bcast_at(a, idx), bcast_at(b, idx)) ? 1.0 : 0.0);
        });
        expect_exact(std::string(cmps[k].second) + " " + to_string(dt) + " " + dims(as) + " and " + dims(bs), got,
                     want);
      }
}

TEST_P(Ops, LogicOnU8TakesNonzeroAsTrue) {
  using Logic = Op (*)(const Tensor&, const Tensor&, const Tensor&);
  const std::pair<Logic, const char*> ops_[] = {
      {ops::logical_and, "logical_and"}, {ops::logical_or, "logical_or"}, {ops::logical_xor, "logical_xor"}};
  auto operand = [&](const Shape& s) {
    Host h = rand_int(rng_, DType::U8, s);
    for (auto& v : h.v)
      if (rng_.coin(0.5)) v = 0;
    return h;
  };
  for (int k = 0; k < 3; ++k)
    for (const auto& [as, bs, ys] : kBroadcasts) {
      const Host a = operand(as), b = operand(bs);
      const Tensor y = lab().output(DType::U8, ys);
      const Host got = lab().run(ops_[k].first(lab().upload(a), lab().upload(b), y), y);
      std::vector<double> want;
      for_each_index(ys, [&](const Shape& idx, std::int64_t) {
        const bool u = bcast_at(a, idx) != 0, v = bcast_at(b, idx) != 0;
        want.push_back((k == 0 ? u && v : k == 1 ? u || v : u != v) ? 1.0 : 0.0);
      });
      expect_exact(std::string(ops_[k].second) + " " + dims(as) + " and " + dims(bs), got, want);
    }
  const Host x = operand({4, 9});
  const Tensor y = lab().output(DType::U8, x.shape);
  const Host got = lab().run(ops::logical_not(lab().upload(x), y), y);
  std::vector<double> want;
  for (double v : x.v) want.push_back(v == 0 ? 1.0 : 0.0);
  expect_exact("logical_not", got, want);
}

TEST_P(Ops, ElementwiseUnaryOps) {
  // abs and neg, every dtype: exact (integers wrap: abs(-128) is -128 in i8).
  for (DType dt : {DType::F32, DType::F16, DType::BF16, DType::I8, DType::U8, DType::I32})
    for (bool neg : {false, true}) {
      const Host x = with_specials(rng_, is_float(dt) ? rand(dt, {4, 9}, -50, 50) : rand_int(rng_, dt, {4, 9}), dt);
      const Tensor y = lab().output(dt, x.shape);
      const Tensor tx = lab().upload(x);
      const Host got = lab().run(neg ? ops::neg(tx, y) : ops::abs(tx, y), y);
      std::vector<double> want;
      for (double v : x.v)
        want.push_back(is_float(dt) ? (neg ? -v : std::fabs(v))
                                    : static_cast<double>(wrap(dt, neg ? -static_cast<std::int64_t>(v)
                                                                       : std::llabs(static_cast<std::int64_t>(v)))));
      expect_exact(std::string(neg ? "neg " : "abs ") + to_string(dt), got, want);
    }
  // exp, log, sqrt, erf on floats, with their special cases.
  enum class U { Exp, Log, Sqrt, Erf };
  const auto run_u = [](U op, const Tensor& x, const Tensor& y) {
    return op == U::Exp    ? ops::exp(x, y)
           : op == U::Log  ? ops::log(x, y)
           : op == U::Sqrt ? ops::sqrt(x, y)
                           : ops::erf(x, y);
  };
  const auto u_name = [](U op) {
    return op == U::Exp ? "exp " : op == U::Log ? "log " : op == U::Sqrt ? "sqrt " : "erf ";
  };
  for (DType dt : {DType::F32, DType::F16, DType::BF16})
    for (U op : {U::Exp, U::Log, U::Sqrt, U::Erf}) {
      Host x = rand(dt, {5, 11}, op == U::Exp ? -10 : op == U::Erf ? -5 : 0, op == U::Erf ? 5 : 10);
      const std::vector<double> sp =
          op == U::Exp   ? std::vector<double>{0, -0.0, 100, -200, kInf, -kInf, kNaN, 11, 12}
          : op == U::Erf ? std::vector<double>{0, -0.0, kInf, -kInf, kNaN, 1e-6, -1e-6, 1e-30, 0.5, -0.5, 4, -4, 1e4}
                         : std::vector<double>{0, -0.0, -1, kInf, -kInf, kNaN, 1, 1e-6, 4, 1e4};
      for (std::size_t i = 0; i < sp.size(); ++i) x.v[i] = round_to(dt, sp[i]);
      const Tensor tx = lab().upload(x), y = lab().output(dt, x.shape);
      const Host got = lab().run(run_u(op, tx, y), y);
      Ref want;
      for (double v : x.v) {
        if (op == U::Sqrt) {  // correctly rounded in f32, then to the type
          want.push(round_to(dt, f32(std::sqrt(v))), 0.0);
          continue;
        }
        if (op == U::Erf) {  // in [-1, 1]: no overflow; erff is within 2 ULPs, the store adds one
          const double e = std::erf(v);
          want.push(e, 2 * ulp(DType::F32, e) + (dt != DType::F32 ? ulp(dt, e) : 0.0));
          continue;
        }
        double e = op == U::Exp ? std::exp(v) : std::log(v);
        if (std::isfinite(e) && std::fabs(e) > format_of(DType::F32).max) e = std::copysign(kInf, e);  // f32 overflow
        if (std::isfinite(e) && std::fabs(e) >= format_of(dt).max + ulp(dt, format_of(dt).max) / 2)
          e = std::copysign(kInf, e);  // overflow of the output type
        // expf / logf are within 2 ULPs; the f16 / bf16 store adds one of theirs.
        want.push(e, 2 * ulp(DType::F32, e) + (dt != DType::F32 ? ulp(dt, e) : 0.0));
      }
      expect(std::string(u_name(op)) + to_string(dt), got, want);
    }
}

// ceil, floor and round (interface 1.10): exact in every float type, with
// halves (round: to even), signed zeros, infinities, NaN and values too large
// to have a fraction.
TEST_P(Ops, ElementwiseRoundingMaps) {
  const std::vector<double> sp = {0,   -0.0, 0.5,  -0.5, 1.5,   2.5,  -2.5, 3.5, -3.5,  0.49,    -0.51,
                                  1e6, -1e6, 1e30, kInf, -kInf, kNaN, 7,    -7,  255.5, -1024.25};
  for (DType dt : {DType::F32, DType::F16, DType::BF16})
    for (int which = 0; which < 3; ++which) {
      Host x = rand(dt, {4, 13}, -300, 300);
      for (std::size_t i = 0; i < sp.size(); ++i) x.v[i] = round_to(dt, sp[i]);
      const Tensor tx = lab().upload(x), y = lab().output(dt, x.shape);
      const Op op = which == 0 ? ops::ceil(tx, y) : which == 1 ? ops::floor(tx, y) : ops::round(tx, y);
      const Host got = lab().run(op, y);
      std::vector<double> want;
      for (double v : x.v) want.push_back(which == 0 ? std::ceil(v) : which == 1 ? std::floor(v) : std::nearbyint(v));
      expect_exact(std::string(which == 0 ? "ceil " : which == 1 ? "floor " : "round ") + to_string(dt), got, want);
    }
}

// sin to atanh (interface 1.17): within 4 f32 ULPs of the exact function of
// each input (the simulated board calls the C library's f32 function, a
// GPU CUDA's, whose documented bounds are 2 to 4 ULPs), plus one ULP of the
// dtype for the store; exact where the result is a signed zero, an infinity
// (atanh at -1 and 1, cosh and sinh past f32's range) or NaN (outside the
// domain, of an infinity or of NaN).
TEST_P(Ops, ElementwiseTrigonometricAndHyperbolicMaps) {
  struct Map {
    const char* name;
    Op (*build)(const Tensor&, const Tensor&);
    double (*f)(double);
    double lo, hi;  // where the random inputs lie
  };
  const Map maps[] = {
      {"sin", ops::sin, [](double v) { return std::sin(v); }, -10, 10},
      {"cos", ops::cos, [](double v) { return std::cos(v); }, -10, 10},
      {"tan", ops::tan, [](double v) { return std::tan(v); }, -1.5, 1.5},
      {"asin", ops::asin, [](double v) { return std::asin(v); }, -1, 1},
      {"acos", ops::acos, [](double v) { return std::acos(v); }, -1, 1},
      {"atan", ops::atan, [](double v) { return std::atan(v); }, -50, 50},
      {"sinh", ops::sinh, [](double v) { return std::sinh(v); }, -10, 10},
      {"cosh", ops::cosh, [](double v) { return std::cosh(v); }, -10, 10},
      {"asinh", ops::asinh, [](double v) { return std::asinh(v); }, -50, 50},
      {"acosh", ops::acosh, [](double v) { return std::acosh(v); }, 1, 50},
      {"atanh", ops::atanh, [](double v) { return std::atanh(v); }, -1, 1},
  };
  const std::vector<double> sp = {0, -0.0, 1, -1, 0.5, -0.5, 2, -2, 100, -100, kInf, -kInf, kNaN};
  for (DType dt : {DType::F32, DType::F16, DType::BF16})
    for (const Map& m : maps) {
      Host x = rand(dt, {3, 17}, m.lo, m.hi);
      for (std::size_t i = 0; i < sp.size(); ++i) x.v[i] = round_to(dt, sp[i]);
      const Tensor y = lab().output(dt, x.shape);
      const Host got = lab().run(m.build(lab().upload(x), y), y);
      Ref want;
      for (double v : x.v) {
        double e = m.f(v);
        if (std::isfinite(e) && std::fabs(e) > format_of(DType::F32).max) e = std::copysign(kInf, e);
        if (std::isfinite(e) && std::fabs(e) >= format_of(dt).max + ulp(dt, format_of(dt).max) / 2)
          e = std::copysign(kInf, e);
        want.push(e, 4 * ulp(DType::F32, e) + (dt != DType::F32 ? ulp(dt, e) : 0.0));
      }
      expect(std::string(m.name) + " " + to_string(dt), got, want);
    }
}

TEST_P(Ops, ElementwiseActivations) {
  for (DType dt : {DType::F32, DType::F16, DType::BF16})
    for (const ActivationParams& act : all_activations(rng_)) {
      const Host x = rand(dt, {3, 40}, -12, 12);
      const Tensor y = lab().output(dt, x.shape);
      const Host got = lab().run(ops::activation(lab().upload(x), y, act), y);
      Ref want;
      for (double v : x.v) {
        const double out = act_ref(act, v);
        want.push(out, act_eval_err(act, v, out) + (dt != DType::F32 ? ulp(dt, out) : 0.0));
      }
      expect("activation " + act_name(act) + " " + to_string(dt), got, want);
    }
  // relu() is activation(relu).
  const Host x = rand(DType::F32, {17}, -3, 3);
  const Tensor y = lab().output(DType::F32, x.shape);
  const Host got = lab().run(ops::relu(lab().upload(x), y), y);
  std::vector<double> want;
  for (double v : x.v) want.push_back(v > 0 ? v : 0.0);
  expect_exact("relu", got, want);
}

TEST_P(Ops, CastBetweenEveryPairOfDtypes) {
  const std::vector<DType> all{DType::F32, DType::F16, DType::BF16, DType::I8, DType::U8, DType::I32};
  for (DType src : all) {
    std::vector<double> vals = cast_specials(src);
    for (int i = 0; i < 40; ++i) {
      if (!is_float(src))
        vals.push_back(static_cast<double>(rng_.integer(lo_of(src), hi_of(src))));
      else if (i % 2)
        vals.push_back(rng_.uniform(-300, 300));
      else
        vals.push_back(std::ldexp(rng_.uniform(-1, 1), static_cast<int>(rng_.integer(-30, 40))));
    }
    Host x(src, {static_cast<std::int64_t>(vals.size())});
    for (std::size_t i = 0; i < vals.size(); ++i) x.v[i] = is_float(src) ? round_to(src, vals[i]) : vals[i];
    const Tensor tx = lab().upload(x);
    for (DType dst : all) {
      const Tensor y = lab().output(dst, x.shape);
      const Host got = lab().run(ops::cast(tx, y), y);
      std::vector<double> want;
      for (double v : x.v) want.push_back(cast_ref(v, src, dst));
      expect_exact(std::string("cast ") + to_string(src) + " -> " + to_string(dst), got, want);
    }
  }
}

TEST_P(Ops, CastBroadcastsItsInput) {
  const Host x = rand(DType::F32, {3, 1}, -200, 200);
  const Tensor y = lab().output(DType::I8, {2, 3, 4});
  const Host got = lab().run(ops::cast(lab().upload(x), y), y);
  std::vector<double> want;
  for_each_index(y.shape(), [&](const Shape& idx, std::int64_t) {
    want.push_back(cast_ref(bcast_at(x, idx), DType::F32, DType::I8));
  });
  expect_exact("cast f32 [3, 1] -> i8 [2, 3, 4]", got, want);
}

// A cast between f32 and f16 or bf16 of a strided view: an fp16 model's
// f32 input read in NHWC's order, its NHWC output read back in NCHW's. An
// image's 3 channels over 91x91 pixels (lines of 3 a pixel, in tiles of
// 8192 pixels and 89), 12 channels (tiles of 85 pixels and 80) and 37
// (tiles of 32 channels and 5).
TEST_P(Ops, CastOfATransposedViewBetweenF32AndHalfFloats) {
  struct Case {
    std::int64_t c, h, w;
  };
  const std::int64_t n = 2;
  for (const auto& [c, h, w] : {Case{3, 91, 91}, Case{12, 5, 33}, Case{37, 5, 33}})
    for (DType half : {DType::F16, DType::BF16})
      for (bool to_half : {true, false}) {
        const DType from = to_half ? DType::F32 : half, to = to_half ? half : DType::F32;
        // x held NCHW read as NHWC, or held NHWC read as NCHW.
        const Shape held = to_half ? Shape{n, c, h, w} : Shape{n, h, w, c};
        const Shape read = to_half ? Shape{n, h, w, c} : Shape{n, c, h, w};
        const Shape strides = to_half ? Shape{c * h * w, w, 1, h * w} : Shape{h * w * c, 1, w * c, c};
        const std::vector<std::size_t> perm =
            to_half ? std::vector<std::size_t>{0, 2, 3, 1} : std::vector<std::size_t>{0, 3, 1, 2};
        Host x = rand(from, held, -300, 300);
        x.v[3] = std::ldexp(1.0, -20);  // below f16's normal range
        const Tensor held_t = lab().upload(x);
        const Tensor view(held_t.buffer(), from, read, strides, 0);
        const Tensor y = lab().output(to, read);
        const Host got = lab().run(ops::cast(view, y), y);
        std::vector<double> want;
        for (double v : permuted(x, perm).v) want.push_back(cast_ref(v, from, to));
        expect_exact(std::string("cast of a transposed view ") + to_string(from) + " -> " + to_string(to) + ", " +
                         std::to_string(c) + " channels",
                     got, want);
      }
}

// A copy into a part of each row (a Concat's input into its channels of
// the output): rows of 1 to 65 elements of 1, 2 and 4 bytes, those of up
// to 256 bytes in whole-vector moves; what else each row held stays.
TEST_P(Ops, CopyIntoAPartOfEachRowIsExactAndLeavesTheRestOfTheRow) {
  const std::int64_t rows = 37;
  for (DType dt : {DType::U8, DType::F16, DType::F32})
    for (std::int64_t c : {1, 2, 3, 5, 7, 8, 12, 15, 16, 17, 24, 31, 33, 48, 64, 65}) {
      const std::int64_t width = 2 * c + 3, at = c + 1;  // a row: c + 1 others, the part, 2 others
      const Host x = is_float(dt) ? rand(dt, {rows, c}, -100, 100) : rand_int(rng_, dt, {rows, c});
      const Tensor whole = lab().output(dt, {rows, width});
      const Tensor part(whole.buffer(), dt, {rows, c}, {width, 1}, static_cast<std::uint64_t>(at) * size_of(dt));
      const Host got = lab().run(ops::cast(lab().upload(x), part), whole);
      const std::array<std::uint8_t, 4> fill{0xA5, 0xA5, 0xA5, 0xA5};  // what output() fills with
      const double held = load(dt, reinterpret_cast<const std::byte*>(fill.data()));
      std::vector<double> want(static_cast<std::size_t>(rows * width), held);
      for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t i = 0; i < c; ++i)
          want[static_cast<std::size_t>(r * width + at + i)] = x.v[static_cast<std::size_t>(r * c + i)];
      expect_exact("copy of [37, " + std::to_string(c) + "] " + std::string(to_string(dt)) + " into a part of each row",
                   got, want);
    }
}

TEST_P(Ops, TransposeAnyPermutationUpToRank6) {
  const std::vector<DType> all{DType::F32, DType::F16, DType::BF16, DType::I8, DType::U8, DType::I32};
  for (int trial = 0; trial < 18; ++trial) {
    const std::size_t rank = static_cast<std::size_t>(trial % 6) + 1;
    Shape s(rank);
    for (auto& d : s) d = rng_.integer(1, rank >= 5 ? 3 : 5);
    std::vector<std::size_t> perm(rank);
    std::iota(perm.begin(), perm.end(), std::size_t{0});
    std::shuffle(perm.begin(), perm.end(), rng_.engine());
    const DType dt = rng_.pick(all);
    const Host x = is_float(dt) ? rand(dt, s, -100, 100) : rand_int(rng_, dt, s);
    const Host want = permuted(x, perm);
    const Tensor y = lab().output(dt, want.shape);
    const Host got = lab().run(ops::transpose(lab().upload(x), y, perm), y);
    std::string p;
    for (auto v : perm) p += std::to_string(v);
    expect_exact("transpose " + std::string(to_string(dt)) + " " + dims(s) + " perm " + p, got, want.v);
  }
}

TEST_P(Ops, TransposeBetweenNchwAndNhwcAcrossTilesIsExact) {
  // The compiler's layout changes (NCHW <-> NHWC), which the engine copies
  // in square tiles: sizes past one tile and not a multiple of it, each
  // element type size, a batch of more than one. Lines of 2 to 4 elements
  // (an image's channels, a channel shuffle's groups: [P, G, C/G] to
  // [P, C/G, G]) go in longer tiles (8192 lines of up to 4 elements), and
  // many small planes in one call.
  struct Case {
    Shape s;
    std::vector<std::size_t> perm;
  };
  const Case cases[] = {{{2, 67, 9, 35}, {0, 2, 3, 1}}, {{2, 9, 35, 67}, {0, 3, 1, 2}}, {{1, 33, 1, 1}, {0, 2, 3, 1}},
                        {{1, 256, 7, 7}, {0, 2, 3, 1}}, {{1, 7, 7, 256}, {0, 3, 1, 2}}, {{3, 40, 65}, {0, 2, 1}},
                        {{2, 3, 50, 37}, {0, 2, 3, 1}},  // an image's three channels
                        {{37, 2, 24}, {0, 2, 1}},       {{37, 3, 24}, {0, 2, 1}},       {{19, 4, 7}, {0, 2, 1}},
                        {{11, 5, 9}, {0, 2, 1}},        {{3, 2, 700}, {0, 2, 1}},       {{2, 4, 3, 1100}, {0, 1, 3, 2}},
                        {{2, 3, 97, 91}, {0, 2, 3, 1}},  // past a tile of 8192 pixels, with a part of one
                        {{1, 4, 91, 97}, {0, 2, 3, 1}}};
  for (const Case& c : cases)
    for (DType dt : {DType::F32, DType::F16, DType::U8}) {
      const Host x = is_float(dt) ? rand(dt, c.s, -100, 100) : rand_int(rng_, dt, c.s);
      const Host want = permuted(x, c.perm);
      const Tensor y = lab().output(dt, want.shape);
      const Host got = lab().run(ops::transpose(lab().upload(x), y, c.perm), y);
      std::string p;
      for (auto v : c.perm) p += std::to_string(v);
      expect_exact("transpose " + std::string(to_string(dt)) + " " + dims(c.s) + " perm " + p, got, want.v);
    }
}

}  // namespace
}  // namespace tpuhal::ops_test
