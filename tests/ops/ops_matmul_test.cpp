// matmul: random shapes, empty and zero-sized dimensions, broadcast batches,
// transposes, alpha, beta and C, every fused activation, strided views and
// host memory.
#include "ops_reference.hpp"

namespace tpuhal::ops_test {
namespace {

TEST_P(Ops, MatMulMatchesTheReferenceForRandomShapes) {
  struct Dims {
    std::int64_t m, n, k;
  };
  for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
    const std::vector<DType> outs =
        dt == DType::F32 ? std::vector<DType>{DType::F32} : std::vector<DType>{dt, DType::F32};
    for (DType yt : outs) {
      std::vector<Dims> cases{{1, 1, 1}, {1, 17, 1}, {7, 1, 40}, {1, 1, 300}};
      for (int i = 0; i < 3; ++i) cases.push_back({rng_.integer(1, 33), rng_.integer(1, 33), rng_.integer(1, 70)});
      for (const Dims& d : cases) {
        MatMulSpec s;
        s.y = yt;
        check_matmul("random", rand(dt, {d.m, d.k}), rand(dt, {d.k, d.n}), s);
      }
    }
  }
}

// A bf16 product of fewer than 16 rows (a squeeze-and-excitation block's,
// a classifier's) runs on the engine's own kernels even on a CPU that
// multiplies bf16 in hardware (docs/ops.md, Determinism): each element one
// chain of multiply-adds in k order from 0, fused where the level has FMA,
// else each product rounded before it is added; the bits of every other
// level. On boards that name their engine's instruction set (simulated ones).
// Element [i, j] of a [m, k] by [k, n] product as the engine's float
// kernels compute it: one chain of multiply-adds in k order from 0, fused
// where the level has FMA, else each product rounded before it is added.
float product_chain(const Host& a, const Host& b, std::int64_t i, std::int64_t j, bool fma) {
  const std::int64_t k = a.shape[1], n = b.shape[1];
  float want = 0.0f;
  for (std::int64_t kk = 0; kk < k; ++kk) {
    const auto x = static_cast<float>(a.v[static_cast<std::size_t>(i * k + kk)]);
    const auto w = static_cast<float>(b.v[static_cast<std::size_t>(kk * n + j)]);
    if (fma) {
      want = std::fma(x, w, want);
    } else {
      volatile float product = x * w;  // rounded on its own
      want = want + product;
    }
  }
  return want;
}

TEST_P(Ops, MatMulOfFewBf16RowsIsOneMultiplyAddChainPerElement) {
  const std::string isa = lab().dev.properties().tensor_isa;
  if (isa.empty()) GTEST_SKIP() << GetParam() << " does not name its tensor engine's instruction set";
  const bool fma = isa != "sse2" && isa != "sse41";
  for (const std::int64_t m : {std::int64_t{1}, std::int64_t{15}}) {
    const std::int64_t k = 300, n = 70;
    const Host a = rand(DType::BF16, {m, k}, -2, 2), b = rand(DType::BF16, {k, n}, -2, 2);
    const Tensor y = lab().output(DType::F32, {m, n});
    const Host got = lab().run(ops::matmul(lab().upload(a), lab().upload(b), y), y);
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j) {
        const float want = product_chain(a, b, i, j, fma);
        const auto have = static_cast<float>(got.v[static_cast<std::size_t>(i * n + j)]);
        ASSERT_EQ(std::memcmp(&have, &want, 4), 0)
            << m << " rows at " << isa << ", [" << i << ", " << j << "]: " << have << " against " << want;
      }
  }
}

// Batches that share B (its batch dimensions broadcast) and lie one after
// another in A are one product of all their rows (a transformer's
// [sequence, 1, d] x [d, 3d]): every element still the chain of its own
// row, bit for bit, with the batch dimensions dense, one of them 1, or A a
// view whose batches are not one after another.
TEST_P(Ops, MatMulOfBatchesSharingBIsOneMultiplyAddChainPerElement) {
  const std::string isa = lab().dev.properties().tensor_isa;
  if (isa.empty()) GTEST_SKIP() << GetParam() << " does not name its tensor engine's instruction set";
  const bool fma = isa != "sse2" && isa != "sse41";
  const std::int64_t k = 70, n = 50;
  const Host b = rand(DType::F32, {k, n}, -2, 2);
  const Tensor tb = lab().upload(b);
  for (const Shape& batch : {Shape{40}, Shape{2, 5}, Shape{4, 1, 3}}) {
    for (const std::int64_t m : {std::int64_t{1}, std::int64_t{3}}) {
      for (const bool gapped : {false, true}) {
        Shape as = batch;
        as.insert(as.end(), {m, k});
        const Host a = rand(DType::F32, as, -2, 2);
        std::int64_t count = 1;
        for (std::int64_t d : batch) count *= d;
        // Gapped: each batch's rows dense, the batches k + 3 elements further apart.
        Shape strides(as.size());
        strides[as.size() - 1] = 1;
        strides[as.size() - 2] = k;
        std::int64_t step = m * k + (gapped ? k + 3 : 0);
        for (std::size_t d = batch.size(); d-- > 0;) {
          strides[d] = step;
          step *= batch[d];
        }
        const Tensor ta = lab().upload_view(a, strides, 0);
        Shape ys = batch;
        ys.insert(ys.end(), {m, n});
        const Tensor y = lab().output(DType::F32, ys);
        const Host got = lab().run(ops::matmul(ta, tb, y), y);
        for (std::int64_t bi = 0; bi < count; ++bi) {
          Host rows(DType::F32, {m, k});
          std::copy_n(a.v.begin() + bi * m * k, m * k, rows.v.begin());
          for (std::int64_t i = 0; i < m; ++i)
            for (std::int64_t j = 0; j < n; ++j) {
              const float want = product_chain(rows, b, i, j, fma);
              const auto have = static_cast<float>(got.v[static_cast<std::size_t>((bi * m + i) * n + j)]);
              ASSERT_EQ(std::memcmp(&have, &want, 4), 0) << dims(as) << (gapped ? " gapped" : "") << " at " << isa
                                                         << ", batch " << bi << " [" << i << ", " << j << "]";
            }
        }
      }
    }
  }
}

// A Linear layer's weights, past the second-level cache, are kept by the
// engine in the layout its product reads once it has seen them unchanged
// (docs/ops.md, Determinism): weights rewritten in place between runs are
// taken as they now are, by the board (a copy, an op) or by the host
// (host-visible device memory, pinned host memory), and every run gives
// the same chains as the product read in place, the last panel's columns
// (300 is no multiple of any level's panel) as well.
TEST_P(Ops, MatMulTakesWeightsRewrittenInPlace) {
  const std::string isa = lab().dev.properties().tensor_isa;
  if (isa.empty()) GTEST_SKIP() << GetParam() << " does not name its tensor engine's instruction set";
  const bool fma = isa != "sse2" && isa != "sse41";
  for (Lab::Rewrite how : Lab::kRewrites) {
    const std::optional<Memory> memory = lab().rewrite_memory(how);
    if (!memory) continue;
    // One row and two (read in place), 8 (few rows, B's panels in turn) and
    // 40 (the blocked product): B kept in the layout each reads.
    const std::vector<std::int64_t> rows =
        how == Lab::Rewrite::kCopy ? std::vector<std::int64_t>{2, 8, 40} : std::vector<std::int64_t>{1};
    for (DType dt : {DType::F32, DType::F16, DType::BF16})
      for (const std::int64_t m : rows) {
        // bf16 products of 16 rows or more may run on oneDNN (above).
        if (dt == DType::BF16 && m >= 16) continue;
        const std::int64_t k = 512, n = 300;  // 300 KB in halves
        const Host a = rand(dt, {m, k}, -2, 2), w1 = rand(dt, {k, n}, -2, 2), w2 = rand(dt, {k, n}, -2, 2);
        // Device memory as a model's weights have it: 64 KiB chunks of their
        // own, which no other buffer's writes share (runtime/src/model.cpp).
        const Tensor at = lab().upload(a);
        Tensor w = lab().upload(w1, *memory);
        if (*memory == Memory::Device) {
          constexpr std::uint64_t kChunk = std::uint64_t{64} << 10;
          AllocOptions chunks;
          chunks.alignment = kChunk;
          w = Tensor(lab().dev.allocate((Lab::bytes_for(dt, w1.shape) + kChunk - 1) / kChunk * kChunk, *memory, chunks),
                     dt, w1.shape);
          lab().rewrite(Lab::Rewrite::kCopy, w, w1);
        }
        int run = 0;
        const Host* last = &w1;
        for (const Host* now : {&w1, &w1, &w1, &w2, &w2, &w2, &w1, &w1}) {
          ++run;
          // Unchanged weights: the second run keeps a copy, the third reads it.
          if (now != last) lab().rewrite(how, w, *now);
          last = now;
          const Tensor y = lab().output(DType::F32, {m, n});
          const Host got = lab().run(ops::matmul(at, w, y), y);
          for (std::int64_t i = 0; i < m; ++i)
            for (std::int64_t j = 0; j < n; ++j) {
              const float want = product_chain(a, *now, i, j, fma);
              const auto have = static_cast<float>(got.v[static_cast<std::size_t>(i * n + j)]);
              ASSERT_EQ(std::memcmp(&have, &want, 4), 0)
                  << m << " rows, " << to_string(dt) << " weights rewritten by " << Lab::rewritten_by(how) << ", run "
                  << run << " at " << isa << ", [" << i << ", " << j << "]: " << have << " against " << want;
            }
        }
      }
  }
}

TEST_P(Ops, MatMulWithEmptyOutputsRunsNothing) {
  // Nothing to compute: the ops complete and the queue stays healthy.
  for (const auto& [as, bs, ys] : std::vector<std::array<Shape, 3>>{{Shape{0, 4}, Shape{4, 5}, Shape{0, 5}},
                                                                    {Shape{3, 4}, Shape{4, 0}, Shape{3, 0}},
                                                                    {Shape{0, 0}, Shape{0, 0}, Shape{0, 0}},
                                                                    {Shape{2, 0, 4}, Shape{2, 4, 5}, Shape{2, 0, 5}}}) {
    for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
      const Tensor y = lab().output(dt, ys);
      lab().run(ops::matmul(lab().upload(rand(dt, as)), lab().upload(rand(dt, bs)), y));
    }
  }
  MatMulSpec s;
  check_matmul("after empty ops", rand(DType::F32, {2, 3}), rand(DType::F32, {3, 2}), s);
}

TEST_P(Ops, MatMulBatchDimensionsOfZeroBroadcastLikeNumPy) {
  // NumPy: a batch dimension of 1 broadcasts against 0 to 0
  // (np.matmul(np.ones((0, 3, 4)), np.ones((4, 5))).shape == (0, 3, 5)).
  struct Case {
    Shape as, bs, ys, wrong;
  };
  const std::vector<Case> cases{
      {{0, 3, 4}, {4, 5}, {0, 3, 5}, {1, 3, 5}},
      {{2, 1, 3, 4}, {0, 4, 5}, {2, 0, 3, 5}, {2, 1, 3, 5}},
      {{1, 3, 4}, {0, 4, 5}, {0, 3, 5}, {1, 3, 5}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE("a " + dims(c.as) + " b " + dims(c.bs));
    const Tensor a = lab().upload(rand(DType::F32, c.as)), b = lab().upload(rand(DType::F32, c.bs));
    const Tensor y = lab().output(DType::F32, c.ys);
    EXPECT_NO_THROW(lab().run(ops::matmul(a, b, y))) << "y " << dims(c.ys) << " is the broadcast shape";
    // The shape with the zero dimension taken as 1 reads elements a or b
    // do not have (past the end of their data) and must be refused.
    const Tensor wrong = lab().output(DType::F32, c.wrong);
    const Error e = error_of([&] { ops::matmul(a, b, wrong); });
    EXPECT_EQ(e.status(), Status::InvalidArgument);
    EXPECT_THAT(e.what(), HasSubstr("matmul: y has shape " + dims(c.wrong)));
  }
}

TEST_P(Ops, MatMulWithZeroInnerDimensionGivesZerosOrBetaC) {
  // K = 0: every element of y is written, with 0 (or beta * c). The cases
  // through the engine's general path (c given, or f16) come first.
  for (DType dt : {DType::F16, DType::F32, DType::BF16}) {
    MatMulSpec s;
    s.y = dt;
    s.c = rand(DType::F32, {3, 5});
    s.beta = 2.0f;
    check_matmul("K = 0 with c", rand(dt, {3, 0}), rand(dt, {0, 5}), s);
  }
  for (DType dt : {DType::F16, DType::F32, DType::BF16}) {
    MatMulSpec s;
    s.y = dt;
    check_matmul("batched K = 0", rand(dt, {2, 3, 0}), rand(dt, {0, 4}), s);
    check_matmul("K = 0", rand(dt, {3, 0}), rand(dt, {0, 5}), s);
  }
}

TEST_P(Ops, IntegerProductsWithZeroInnerDimension) {
  // matmul_integer: sums over nothing are 0; qlinear_matmul: y_zero_point.
  const Host a = rand_int(rng_, DType::U8, {3, 0}), b = rand_int(rng_, DType::I8, {0, 4});
  const Host az = rand_int(rng_, DType::U8, {3}), bz = rand_int(rng_, DType::I8, {4});
  const Tensor y = lab().output(DType::I32, {3, 4});
  expect_exact(
      "matmul_integer K = 0",
      lab().run(ops::matmul_integer(lab().upload(a), lab().upload(b), y, lab().upload(az), lab().upload(bz)), y),
      std::vector<double>(12, 0.0));
  Host sc(DType::F32, {});
  sc.v = {0.5};
  Host yz(DType::U8, {});
  yz.v = {77};
  const Tensor q = lab().output(DType::U8, {3, 4});
  expect_exact("qlinear_matmul K = 0",
               lab().run(ops::qlinear_matmul(lab().upload(a), lab().upload(sc), lab().upload(az), lab().upload(b),
                                             lab().upload(sc), lab().upload(bz), lab().upload(sc), lab().upload(yz), q),
                         q),
               std::vector<double>(12, 77.0));
}

TEST_P(Ops, MatMulBroadcastsBatchDimensions) {
  const std::vector<std::array<Shape, 2>> batches{
      {Shape{2, 1}, Shape{3}},  // a [2,1,M,K] x b [3,K,N] -> [2,3,M,N]
      {Shape{}, Shape{4}},      // a [M,K] x b [4,K,N]
      {Shape{3}, Shape{}},      // a [3,M,K] x b [K,N]
      {Shape{1}, Shape{2}},     // a [1,M,K] x b [2,K,N]
      {Shape{2, 3, 1}, Shape{1, 3, 4}},
      {Shape{2, 1, 2, 1}, Shape{3, 1, 2}},
  };
  for (const auto& [ba, bb] : batches) {
    const DType dt = rng_.pick(std::vector<DType>{DType::F32, DType::F16, DType::BF16});
    const std::int64_t m = rng_.integer(1, 9), n = rng_.integer(1, 9), k = rng_.integer(1, 12);
    Shape as = ba, bs = bb;
    as.insert(as.end(), {m, k});
    bs.insert(bs.end(), {k, n});
    MatMulSpec s;
    s.y = rng_.coin() ? dt : DType::F32;
    s.ta = rng_.coin(0.3);
    s.tb = rng_.coin(0.3);
    Host a = rand(dt, as), b = rand(dt, bs);
    if (s.ta) std::swap(a.shape[a.shape.size() - 1], a.shape[a.shape.size() - 2]);  // same values, [.., K, M]
    if (s.tb) std::swap(b.shape[b.shape.size() - 1], b.shape[b.shape.size() - 2]);
    check_matmul("batch broadcast", a, b, s);
  }
}

TEST_P(Ops, MatMulTransposesEitherOperand) {
  for (DType dt : {DType::F32, DType::F16, DType::BF16})
    for (int t = 0; t < 4; ++t) {
      MatMulSpec s;
      s.ta = t & 1;
      s.tb = t & 2;
      s.y = dt;
      const std::int64_t m = rng_.integer(1, 13), n = rng_.integer(1, 13), k = rng_.integer(1, 20);
      const Shape as = s.ta ? Shape{2, k, m} : Shape{2, m, k};
      const Shape bs = s.tb ? Shape{n, k} : Shape{k, n};
      check_matmul("transposes", rand(dt, as), rand(dt, bs), s);
    }
}

TEST_P(Ops, MatMulScalesAndAddsABroadcastC) {
  const std::int64_t m = 6, n = 7, k = 9;
  const std::vector<Shape> c_shapes{{}, {1}, {n}, {m, 1}, {m, n}, {1, n}, {2, 1, n}, {2, m, n}};
  for (DType dt : {DType::F32, DType::F16, DType::BF16})
    for (const Shape& cs : c_shapes) {
      MatMulSpec s;
      s.y = rng_.coin() ? dt : DType::F32;
      s.alpha = static_cast<float>(rng_.uniform(-2, 2));
      s.beta = rng_.coin(0.2) ? 0.0f : static_cast<float>(rng_.uniform(-2, 2));
      s.c = rand(rng_.pick(std::vector<DType>{DType::F32, DType::F16, DType::BF16}), cs, -3, 3);
      check_matmul("c broadcast", rand(dt, {2, m, k}), rand(dt, {k, n}), s);
    }
}

// y = alpha * A @ B + beta * C with C a view whose rows step by more
// than one element is read where it lies; C in y's own memory is refused,
// naming both.
TEST_P(Ops, MatMulAddsAStridedCAndRefusesCInY) {
  const std::int64_t m = 5, n = 33, k = 17;
  MatMulSpec s;
  s.alpha = 0.5f;
  s.beta = -1.25f;
  s.act = ActivationParams::relu();
  const Host a = rand(DType::F32, {m, k}), b = rand(DType::F32, {k, n}), c = rand(DType::F32, {m, n}, -3, 3);
  s.c = c;
  Shape ys;
  const Ref want = ref_matmul(a, b, s, ys);
  MatMulOptions o;
  o.alpha = s.alpha;
  o.beta = s.beta;
  o.activation = s.act;
  o.c = lab().upload_view(c, {2 * n, 2}, 3);  // every element two apart, rows 2n apart
  const Tensor y = lab().output(DType::F32, ys);
  expect("matmul with a strided c", lab().run(ops::matmul(lab().upload(a), lab().upload(b), y, o), y), want);
  const Tensor held = lab().upload(c);
  o.c = held;
  const Error e = error_of([&] { ops::matmul(lab().upload(a), lab().upload(b), held, o); });
  EXPECT_EQ(e.status(), Status::InvalidArgument);
  EXPECT_THAT(e.what(), HasSubstr("y overlaps input c"));
}

TEST_P(Ops, MatMulFusesEveryActivation) {
  for (DType dt : {DType::F32, DType::F16, DType::BF16})
    for (const ActivationParams& act : all_activations(rng_)) {
      MatMulSpec s;
      s.act = act;
      s.y = dt;
      if (rng_.coin()) {
        s.c = rand(DType::F32, {5});
        s.alpha = 0.75f;
        s.beta = -1.5f;
      }
      check_matmul("activation", rand(dt, {8, 12}, -1.5, 1.5), rand(dt, {12, 5}, -1.5, 1.5), s);
    }
}

TEST_P(Ops, MatMulReadsAndWritesStridedAndPermutedViews) {
  for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
    const std::int64_t m = rng_.integer(2, 9), n = rng_.integer(2, 9), k = rng_.integer(2, 15);
    MatMulSpec s;
    s.y = dt;
    const Host a = rand(dt, {m, k}), b = rand(dt, {k, n});
    // a stored column-major (the transpose of a [K, M] buffer), b with
    // padded rows at an offset, y written through a transposed view.
    const Tensor ta = lab().upload(permuted(a, {1, 0})).permute({1, 0});
    const Tensor tb = lab().upload_view(b, {n + 3, 1}, 5);
    const Tensor ty = lab().output(dt, {n, m}).permute({1, 0});
    check_matmul("column-major a, padded b, transposed y", a, b, s, ta, tb, ty);
    // transpose_a of a transposed view: the stored matrix is a itself.
    MatMulSpec st = s;
    st.ta = true;
    const Host at = permuted(a, {1, 0});  // [K, M], what the op transposes back
    check_matmul("transpose_a of a permuted view", at, b, st, lab().upload(a).permute({1, 0}));
    // Batched a [B, M, K] as a permutation of a stored [M, B, K], and every
    // stride of b doubled.
    const Host ab = rand(dt, {3, m, k});
    const Tensor tab = lab().upload(permuted(ab, {1, 0, 2})).permute({1, 0, 2});
    const Tensor tbs = lab().upload_view(b, {2 * n, 2}, 0);
    check_matmul("batch-permuted a, doubled strides", ab, b, s, tab, tbs);
  }
}

TEST_P(Ops, MatMulReadsAndWritesHostMemory) {
  const Host a = rand(DType::F32, {5, 6}), b = rand(DType::F32, {6, 4});
  MatMulSpec s;
  const Tensor ta = lab().upload(a, Memory::HostPinned);
  // Over a bus without a memory window (USB) host-visible device memory
  // cannot be mapped, so the second operand is plain device memory there.
  const Tensor tb =
      lab().upload(b, dev().properties().caps.host_visible_device_memory ? Memory::DeviceHostVisible : Memory::Device);
  const Tensor ty = lab().output(DType::F32, {5, 4}, Memory::HostPinned);
  check_matmul("operands in host memory", a, b, s, ta, tb, ty);
}

}  // namespace
}  // namespace tpuhal::ops_test
