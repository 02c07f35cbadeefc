// top_k (argmax, argmin), where, gather, scatter_elements and
// conv_transpose2d against the reference. top_k, where, gather and
// scatter_elements copy (or combine one pair of) elements, so they are
// checked exactly; the
// transposed convolution against the f32 sum bound (ops_reference.hpp).
#include "ops_reference.hpp"

namespace tpuhal::ops_test {
namespace {

// Indices and values of the k first elements of every lane along `axis`,
// in docs/ops.md's order: NaN first, then by value, then by index.
struct TopKRef {
  std::vector<double> indices, values;
};
TopKRef ref_top_k(const Host& x, std::size_t axis, std::int64_t k, bool largest, bool last) {
  Shape ys = x.shape;
  ys[axis] = k;
  TopKRef r;
  r.indices.resize(static_cast<std::size_t>(numel(ys)));
  r.values.resize(r.indices.size());
  Shape lane_shape = x.shape;
  lane_shape[axis] = 1;
  for_each_index(lane_shape, [&](const Shape& lane, std::int64_t) {
    std::vector<std::int64_t> order(static_cast<std::size_t>(x.shape[axis]));
    std::iota(order.begin(), order.end(), 0);
    auto value = [&](std::int64_t i) {
      Shape idx = lane;
      idx[axis] = i;
      return x.at(idx);
    };
    std::stable_sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) {
      const double va = value(a), vb = value(b);
      if (std::isnan(va) != std::isnan(vb)) return std::isnan(va);
      if (!std::isnan(va) && va != vb) return largest ? va > vb : va < vb;
      return last ? a > b : a < b;
    });
    for (std::int64_t j = 0; j < k; ++j) {
      Shape idx = lane;
      idx[axis] = j;
      std::int64_t lin = 0;
      for (std::size_t d = 0; d < ys.size(); ++d) lin = lin * ys[d] + idx[d];
      r.indices[static_cast<std::size_t>(lin)] = static_cast<double>(order[static_cast<std::size_t>(j)]);
      r.values[static_cast<std::size_t>(lin)] = value(order[static_cast<std::size_t>(j)]);
    }
  });
  return r;
}

TEST_P(Ops, TopKEveryDtypeAxisAndOrderWithTiesAndNaN) {
  for (DType dt : {DType::F32, DType::F16, DType::BF16, DType::I8, DType::U8, DType::I32})
    for (int round = 0; round < 6; ++round) {
      const auto rank = static_cast<std::size_t>(rng_.integer(1, 4));
      Shape s(rank);
      for (auto& d : s) d = rng_.integer(1, 6);
      const auto axis = static_cast<std::size_t>(rng_.integer(0, static_cast<std::int64_t>(rank) - 1));
      s[axis] = rng_.integer(1, 40);
      // Few distinct values, so that ties are common; some NaNs.
      Host x = is_float(dt) ? rand(dt, s, -4, 4) : rand_host(rng_, dt, s, -3, 5);
      for (auto& v : x.v) {
        if (is_float(dt) && rng_.coin(0.3)) v = std::round(v);
        if (is_float(dt) && rng_.coin(0.05)) v = kNaN;
      }
      const std::int64_t k = rng_.integer(1, s[axis]);
      const bool largest = rng_.coin(), last = rng_.coin(), with_values = rng_.coin(0.7);
      Shape ys = s;
      ys[axis] = k;
      const TopKRef want = ref_top_k(x, axis, k, largest, last);
      const Tensor idx = lab().output(DType::I32, ys);
      std::optional<Tensor> vals;
      if (with_values) vals = lab().output(dt, ys);
      // A negative axis half the time.
      const std::int64_t ax = rng_.coin() ? static_cast<std::int64_t>(axis) - static_cast<std::int64_t>(rank)
                                          : static_cast<std::int64_t>(axis);
      lab().run(ops::top_k(lab().upload(x), vals, idx, {ax, largest, last}));
      const std::string what = std::string("top_k ") + to_string(dt) + " x " + dims(s) + " axis " +
                               std::to_string(axis) + " k " + std::to_string(k) + (largest ? " largest" : " smallest") +
                               (last ? " last_index" : "");
      expect_exact(what + " indices", lab().download(idx), want.indices);
      if (vals) expect_exact(what + " values", lab().download(*vals), want.values);
    }
}

// top_k writes two tensors: both must come back where they lie in host
// memory, which a USB board reaches only through messages to the host,
// and outputs with gaps between their elements leave the gaps as they were.
TEST_P(Ops, TopKWritesItsValuesAndIndicesInHostMemory) {
  const Host x = rand(DType::F32, {3, 17}, -8, 8);
  const TopKRef want = ref_top_k(x, 1, 5, true, false);
  const Tensor vals = lab().output(DType::F32, {3, 5}, Memory::HostPinned);
  const Tensor idx = lab().output(DType::I32, {3, 5}, Memory::HostPinned);
  lab().run(ops::top_k(lab().upload(x, Memory::HostPinned), vals, idx, {1, true, false}));
  expect_exact("top_k in host memory: values", lab().download(vals), want.values);
  expect_exact("top_k in host memory: indices", lab().download(idx), want.indices);
  // Every other element of buffers filled with 0xA5 bytes.
  const Tensor vals_wide = lab().output(DType::F32, {3, 10}, Memory::HostPinned);
  const Tensor idx_wide = lab().output(DType::I32, {3, 10}, Memory::HostPinned);
  const Tensor vals_gaps(vals_wide.buffer(), DType::F32, {3, 5}, {10, 2}, 0);
  const Tensor idx_gaps(idx_wide.buffer(), DType::I32, {3, 5}, {10, 2}, 0);
  lab().run(ops::top_k(lab().upload(x, Memory::HostPinned), vals_gaps, idx_gaps, {1, true, false}));
  const auto vb = lab().bytes(vals_wide.buffer()), ib = lab().bytes(idx_wide.buffer());
  for (std::size_t e = 0; e < 30; ++e) {
    const bool gap = e % 2 == 1;
    std::uint32_t v, i;
    std::memcpy(&v, vb.data() + 4 * e, 4);
    std::memcpy(&i, ib.data() + 4 * e, 4);
    if (gap) {
      EXPECT_EQ(v, 0xA5A5A5A5u) << GetParam() << ": values' gap element " << e << " was written";
      EXPECT_EQ(i, 0xA5A5A5A5u) << GetParam() << ": indices' gap element " << e << " was written";
    } else {
      float f;
      std::memcpy(&f, &v, 4);
      EXPECT_EQ(f, want.values[e / 2]) << GetParam() << ": value " << e / 2;
      EXPECT_EQ(static_cast<double>(static_cast<std::int32_t>(i)), want.indices[e / 2])
          << GetParam() << ": index " << e / 2;
    }
  }
}

TEST_P(Ops, ArgMaxAndArgMinPickTheFirstOrLastOfEqualElements) {
  Host x(DType::F32, {2, 5});
  x.v = {1, 7, 7, -2, 7, -3, 0, -3, 5, -3};
  struct Case {
    bool max, last;
    std::vector<double> want;
  };
  for (const Case& c :
       {Case{true, false, {1, 3}}, Case{true, true, {4, 3}}, Case{false, false, {3, 0}}, Case{false, true, {3, 4}}}) {
    const Tensor idx = lab().output(DType::I32, {2, 1});
    const Tensor xt = lab().upload(x);
    lab().run(c.max ? ops::argmax(xt, idx, 1, c.last) : ops::argmin(xt, idx, 1, c.last));
    expect_exact(std::string(c.max ? "argmax" : "argmin") + (c.last ? " last" : " first"), lab().download(idx), c.want);
  }
  // Along axis 0 of a strided view (every other row of a [4, 5] tensor).
  Host big = rand(DType::F32, {4, 5}, -10, 10);
  Host rows(DType::F32, {2, 5});
  for (std::size_t i = 0; i < 10; ++i) rows.v[i] = big.v[(i / 5) * 10 + i % 5];
  const Tensor view = lab().upload_view(rows, {10, 1}, 0);
  const Tensor idx = lab().output(DType::I32, {1, 5});
  lab().run(ops::argmax(view, idx, 0));
  expect_exact("argmax of a strided view", lab().download(idx), ref_top_k(rows, 0, 1, true, false).indices);
}

TEST_P(Ops, WhereBroadcastsConditionAndBothBranches) {
  for (DType dt : {DType::F32, DType::F16, DType::I8, DType::U8, DType::I32}) {
    const Shape ys{3, 4, 5};
    for (const auto& [cs, as, bs] :
         {std::tuple{Shape{3, 4, 5}, Shape{3, 4, 5}, Shape{3, 4, 5}}, std::tuple{Shape{4, 1}, Shape{5}, Shape{3, 1, 5}},
          std::tuple{Shape{}, Shape{1, 4, 5}, Shape{}}}) {
      Host c = rand_host(rng_, DType::U8, cs, 0, 3);  // 0 is false; 1, 2, 3 true
      const Host a = is_float(dt) ? rand(dt, as, -9, 9) : rand_int(rng_, dt, as);
      const Host b = is_float(dt) ? rand(dt, bs, -9, 9) : rand_int(rng_, dt, bs);
      std::vector<double> want(static_cast<std::size_t>(numel(ys)));
      for_each_index(ys, [&](const Shape& idx, std::int64_t lin) {
        want[static_cast<std::size_t>(lin)] = bcast_at(c, idx) != 0 ? bcast_at(a, idx) : bcast_at(b, idx);
      });
      const Tensor y = lab().output(dt, ys);
      lab().run(ops::where(lab().upload(c), lab().upload(a), lab().upload(b), y));
      expect_exact(std::string("where ") + to_string(dt) + " cond " + dims(cs) + " a " + dims(as) + " b " + dims(bs),
                   lab().download(y), want);
    }
  }
}

// y = x indexed along `axis` by idx (negative indices from the end), y's
// elements in row-major order.
std::vector<double> ref_gather(const Host& x, const Host& idx, std::size_t axis) {
  Shape ys(x.shape.begin(), x.shape.begin() + static_cast<std::ptrdiff_t>(axis));
  ys.insert(ys.end(), idx.shape.begin(), idx.shape.end());
  ys.insert(ys.end(), x.shape.begin() + static_cast<std::ptrdiff_t>(axis) + 1, x.shape.end());
  std::vector<double> want(static_cast<std::size_t>(numel(ys)));
  for_each_index(ys, [&](const Shape& yi, std::int64_t lin) {
    Shape ii(yi.begin() + static_cast<std::ptrdiff_t>(axis),
             yi.begin() + static_cast<std::ptrdiff_t>(axis + idx.shape.size()));
    auto i = static_cast<std::int64_t>(idx.at(ii));
    if (i < 0) i += x.shape[axis];
    Shape xi(yi.begin(), yi.begin() + static_cast<std::ptrdiff_t>(axis));
    xi.push_back(i);
    xi.insert(xi.end(), yi.begin() + static_cast<std::ptrdiff_t>(axis + idx.shape.size()), yi.end());
    want[static_cast<std::size_t>(lin)] = x.at(xi);
  });
  return want;
}

TEST_P(Ops, GatherEveryDtypeAxisAndIndexRankWithNegativeIndices) {
  for (DType dt : {DType::F32, DType::F16, DType::BF16, DType::I8, DType::U8, DType::I32})
    for (int round = 0; round < 6; ++round) {
      const auto rank = static_cast<std::size_t>(rng_.integer(1, 4));
      Shape s(rank);
      for (auto& d : s) d = rng_.integer(1, 5);
      const auto axis = static_cast<std::size_t>(rng_.integer(0, static_cast<std::int64_t>(rank) - 1));
      s[axis] = rng_.integer(1, 12);
      // Indices of rank 0 to 2 (y's rank at most 6), repeats allowed.
      Shape is(
          static_cast<std::size_t>(rng_.integer(0, std::min<std::int64_t>(2, 7 - static_cast<std::int64_t>(rank)))));
      for (auto& d : is) d = rng_.integer(1, 4);
      // i32, u8 (from 0: a u8 index is never negative) and i8 indices in turn.
      const DType it_dt = round % 3 == 0 ? DType::I32 : round % 3 == 1 ? DType::U8 : DType::I8;
      Host idx(it_dt, is);
      for (auto& v : idx.v) v = static_cast<double>(rng_.integer(it_dt == DType::U8 ? 0 : -s[axis], s[axis] - 1));
      const Host x = is_float(dt) ? rand(dt, s, -9, 9) : rand_int(rng_, dt, s);
      Shape ys(s.begin(), s.begin() + static_cast<std::ptrdiff_t>(axis));
      ys.insert(ys.end(), is.begin(), is.end());
      ys.insert(ys.end(), s.begin() + static_cast<std::ptrdiff_t>(axis) + 1, s.end());
      const Tensor y = lab().output(dt, ys);
      // x and the indices transposed in memory (strided views) every other
      // round.
      auto column_major = [](const Shape& shape) {
        Shape st(shape.size());
        std::int64_t step = 1;
        for (std::size_t d = 0; d < shape.size(); ++d) st[d] = step, step *= shape[d];
        return st;
      };
      Tensor xt = lab().upload(x), it = lab().upload(idx);
      if (round % 2) {
        xt = lab().upload_view(x, column_major(s), 3);
        it = lab().upload_view(idx, column_major(is), 1);
      }
      const std::int64_t ax = rng_.coin() ? static_cast<std::int64_t>(axis) - static_cast<std::int64_t>(rank)
                                          : static_cast<std::int64_t>(axis);
      lab().run(ops::gather(xt, it, y, ax));
      expect_exact(std::string("gather ") + to_string(dt) + " x " + dims(s) + " axis " + std::to_string(axis) +
                       " indices " + to_string(it_dt) + dims(is) + (round % 2 ? " (x strided)" : ""),
                   lab().download(y), ref_gather(x, idx, axis));
    }
}

// Byte indices into a table (interface 1.12): every u8 into 256 entries,
// i8 ones as two's complement (-1 the last entry) into 256 and 300 entries,
// dense (the engine's lookup loop) and strided; a u8 index past a short
// table fails as any index outside the axis does.
TEST_P(Ops, GatherByByteIndicesIsATableLookup) {
  for (const std::int64_t entries : {256, 300})
    for (DType it_dt : {DType::U8, DType::I8})
      for (const bool strided : {false, true}) {
        if (it_dt == DType::U8 && entries != 256) continue;
        const Host table = rand_int(rng_, DType::U8, {entries});
        const Host idx = rand_int(rng_, it_dt, {3, 701});
        const Tensor y = lab().output(DType::U8, {3, 701});
        const Tensor ti = strided ? lab().upload_view(idx, {1, 3}, 2) : lab().upload(idx);
        lab().run(ops::gather(lab().upload(table), ti, y));
        expect_exact("gather u8[" + std::to_string(entries) + "] by " + to_string(it_dt) + (strided ? " strided" : ""),
                     lab().download(y), ref_gather(table, idx, 0));
      }
  Host idx(DType::U8, {2});
  idx.v = {3, 200};
  const Tensor y = lab().output(DType::F32, {2});
  const Op op = ops::gather(lab().upload(rand(DType::F32, {10})), lab().upload(idx), y);
  const std::string msg = message_of([&] { lab().q.run(op).submit().wait(); });
  lab().q = Queue();
  lab().q = lab().dev.queue(Engine::Compute);
  EXPECT_THAT(msg, HasSubstr("holds the index 200, outside [-10, 10)"));
}

// An index outside the axis fails the op when it runs, names the index and
// the axis's length, and leaves y unwritten; a new queue goes on (a board
// may have only one compute queue: the failed one is released first).
TEST_P(Ops, GatherIndexOutsideTheAxisFailsTheOpAndWritesNothing) {
  Host x(DType::F32, {5, 3});
  for (std::size_t i = 0; i < x.size(); ++i) x.v[i] = static_cast<double>(i);
  for (const std::int32_t bad : {5, -6, 1 << 30}) {
    Host idx(DType::I32, {3});
    idx.v = {1, static_cast<double>(bad), 0};
    const Tensor y = lab().output(DType::F32, {3, 3});
    const Op op = ops::gather(lab().upload(x), lab().upload(idx), y);
    const std::string msg = message_of([&] { lab().q.run(op).submit().wait(); });
    lab().q = Queue();
    lab().q = lab().dev.queue(Engine::Compute);
    EXPECT_THAT(msg, HasSubstr("failed at command 1 of 1 (gather, ring position"));
    EXPECT_THAT(msg, HasSubstr("holds the index " + std::to_string(bad) + ", outside [-5, 5)"));
    const auto raw = lab().bytes(y.buffer());
    EXPECT_TRUE(std::all_of(raw.begin(), raw.begin() + 36, [](std::byte b) { return b == std::byte{0xA5}; }))
        << "y was written by a gather that failed";
  }
  // Indices broadcast (stride 0) along their first dimension.
  Host idx(DType::I32, {2, 2});
  idx.v = {-1, 2, -1, 2};
  const Tensor y = lab().output(DType::F32, {5, 2, 2});
  lab().run(ops::gather(lab().upload(x), lab().upload_view(idx, {0, 1}, 0), y, 1));
  expect_exact("gather of broadcast indices after failed ones", lab().download(y),
               {2, 2, 2, 2, 5, 5, 5, 5, 8, 8, 8, 8, 11, 11, 11, 11, 14, 14, 14, 14});
}

// y[n, o, r, c] = bias[o] + sum over the taps (ci, a, b) of its group with
// r = ih * stride - pad_top + a * dilation (likewise c) of x * w.
Ref ref_conv_transpose(const Host& x, const Host& w, const std::optional<Host>& bias, const ConvGeom& g,
                       const ActivationParams& act, DType ydt, const Shape& ys) {
  const Img d = img_dims(x, g.layout);
  const Img o = img_dims(Host(ydt, ys), g.layout);
  const std::int64_t cin_g = d.c / g.groups, cout_g = w.shape[1], kh = w.shape[2], kw = w.shape[3];
  std::vector<double> acc(static_cast<std::size_t>(numel(ys))), mag(acc.size());
  for (std::int64_t n = 0; n < d.n; ++n)
    for (std::int64_t ci = 0; ci < d.c; ++ci)
      for (std::int64_t ih = 0; ih < d.h; ++ih)
        for (std::int64_t iw = 0; iw < d.w; ++iw)
          for (std::int64_t ol = 0; ol < cout_g; ++ol)
            for (std::int64_t a = 0; a < kh; ++a)
              for (std::int64_t b = 0; b < kw; ++b) {
                const std::int64_t r = ih * g.strides[0] - g.pads[0] + a * g.dilations[0];
                const std::int64_t c = iw * g.strides[1] - g.pads[1] + b * g.dilations[1];
                if (r < 0 || r >= o.h || c < 0 || c >= o.w) continue;
                const std::int64_t oc = (ci / cin_g) * cout_g + ol;
                const double p = img_at(x, g.layout, n, ci, ih, iw) *
                                 w.v[static_cast<std::size_t>(((ci * cout_g + ol) * kh + a) * kw + b)];
                const auto at = static_cast<std::size_t>(img_index(ys, g.layout, n, oc, r, c));
                acc[at] += p;
                mag[at] += std::fabs(p);
              }
  Ref ref;
  const std::int64_t taps = cin_g * kh * kw;
  for_each_output(ys, g.layout, [&](std::int64_t, std::int64_t oc, std::int64_t, std::int64_t, std::int64_t lin) {
    const auto i = static_cast<std::size_t>(lin);
    const double bv = bias ? bias->v[static_cast<std::size_t>(oc)] : 0.0;
    const double v = acc[i] + bv;
    const double err = (mag[i] + std::fabs(bv)) * kU * static_cast<double>(taps + 3) + 1e-30;
    const double out = act_ref(act, v);
    ref.push(out, act_lipschitz(act) * err + act_eval_err(act, v, out) + (ydt != DType::F32 ? ulp(ydt, out) : 0.0));
  });
  return ref;
}

TEST_P(Ops, ConvTransposeEveryGeometryDtypeAndLayout) {
  for (int round = 0; round < 24; ++round) {
    const DType dt = rng_.pick(std::vector<DType>{DType::F32, DType::F32, DType::F16, DType::BF16});
    ConvGeom g;
    g.layout = rng_.coin() ? Layout::NCHW : Layout::NHWC;
    g.groups = static_cast<std::uint32_t>(rng_.pick(std::vector<std::int64_t>{1, 1, 2, 3}));
    for (int k = 0; k < 2; ++k) {
      g.strides[k] = static_cast<std::uint32_t>(rng_.integer(1, 3));
      g.dilations[k] = static_cast<std::uint32_t>(rng_.integer(1, 2));
    }
    const std::int64_t n = rng_.integer(1, 2), cin = g.groups * rng_.integer(1, 3), cout_g = rng_.integer(1, 3);
    const std::int64_t h = rng_.integer(1, 6), wd = rng_.integer(1, 6), kh = rng_.integer(1, 3),
                       kw = rng_.integer(1, 4);
    const std::array<std::int64_t, 2> in{h, wd}, ks{kh, kw};
    std::array<std::int64_t, 2> out{};
    for (int k = 0; k < 2; ++k) {
      const std::int64_t full = (in[k] - 1) * g.strides[k] + (ks[k] - 1) * g.dilations[k] + 1;
      // Pads that leave at least one row, then an output padding.
      const std::int64_t p0 = rng_.integer(0, (full - 1) / 2), p1 = rng_.integer(0, (full - 1) / 2);
      g.pads[k] = static_cast<std::uint32_t>(p0);
      g.pads[k + 2] = static_cast<std::uint32_t>(p1);
      out[k] = full - p0 - p1 + rng_.integer(0, std::max(g.strides[k], g.dilations[k]) - 1);
    }
    const Host x = rand(dt, img_shape(g.layout, n, cin, h, wd), -2, 2);
    const Host w = rand(dt, {cin, cout_g, kh, kw}, -1, 1);
    std::optional<Host> bias;
    if (rng_.coin()) bias = rand(DType::F32, {cout_g * g.groups}, -1, 1);
    const ActivationParams act = rng_.coin() ? ActivationParams{} : rng_.pick(all_activations(rng_));
    const Shape ys = img_shape(g.layout, n, cout_g * g.groups, out[0], out[1]);
    Conv2dOptions o = g.options();
    o.activation = act;
    if (bias) o.bias = lab().upload(*bias);
    const Tensor y = lab().output(dt, ys);
    const Host got = lab().run(ops::conv_transpose2d(lab().upload(x), lab().upload(w), y, o), y);
    expect(std::string("conv_transpose2d ") + to_string(dt) + " x " + dims(x.shape) + " w " + dims(w.shape) + " y " +
               dims(ys) + " " + g.text() + (bias ? " bias " : " ") + act_name(act),
           got, ref_conv_transpose(x, w, bias, g, act, dt, ys));
  }
}

TEST_P(Ops, SelectionOpsRefuseBadOperandsByName) {
  auto t = [&](DType d, const Shape& s) { return lab().output(d, s); };
  EXPECT_THAT(message_of([&] {
                ops::top_k(t(DType::F32, {2, 5}), std::nullopt, t(DType::I32, {2, 6}), {1});
              }),
              HasSubstr("top_k: indices has shape [2, 6]; expected x's shape [2, 5] with k (1 to 5) along axis 1"));
  EXPECT_THAT(message_of([&] {
                ops::top_k(t(DType::F32, {2, 5}), std::nullopt, t(DType::F32, {2, 1}), {1});
              }),
              HasSubstr("top_k: indices is f32; supported: i32"));
  EXPECT_THAT(message_of([&] {
                ops::argmax(t(DType::F32, {2, 5}), t(DType::I32, {2, 2}), 1);
              }),
              HasSubstr("argmax: indices has shape [2, 2]; expected x's shape [2, 5] with 1 along axis 1"));
  EXPECT_THAT(message_of([&] {
                ops::argmin(t(DType::F32, {2, 5}), t(DType::I32, {2, 1}), 2);
              }),
              HasSubstr("argmin: axis 2 is out of range for rank 2"));
  EXPECT_THAT(message_of([&] { ops::top_k(t(DType::F32, {4}), t(DType::I8, {2}), t(DType::I32, {2}), {0}); }),
              HasSubstr("top_k: values is i8 but x is f32"));
  Tensor shared = t(DType::I32, {8});
  EXPECT_THAT(message_of([&] {
                ops::top_k(t(DType::I32, {4}), Tensor(shared.buffer(), DType::I32, {2}),
                           Tensor(shared.buffer(), DType::I32, {2}, {1}, 4), {0});
              }),
              HasSubstr("top_k: the output values overlaps indices"));
  EXPECT_THAT(message_of([&] {
                ops::top_k(t(DType::F32, {3, 4}), Tensor(shared.buffer(), DType::F32, {3, 2}, {0, 1}, 0),
                           t(DType::I32, {3, 2}), {1});
              }),
              HasSubstr("top_k: the output values has stride 0 in dimension 0"));
  EXPECT_EQ(ops::argmin(t(DType::F32, {2, 5}), t(DType::I32, {2, 1}), 1).name(), "argmin");
  EXPECT_THAT(
      message_of([&] { ops::where(t(DType::F32, {3}), t(DType::F32, {3}), t(DType::F32, {3}), t(DType::F32, {3})); }),
      HasSubstr("where: cond is f32; supported: u8"));
  EXPECT_THAT(
      message_of([&] { ops::where(t(DType::U8, {3}), t(DType::F32, {3}), t(DType::I8, {3}), t(DType::F32, {3})); }),
      HasSubstr("where: b is i8 but a is f32"));
  EXPECT_THAT(
      message_of([&] { ops::where(t(DType::U8, {4}), t(DType::F32, {3}), t(DType::F32, {3}), t(DType::F32, {3})); }),
      HasSubstr("where: cond has shape [4], which does not broadcast to [3]"));
  EXPECT_THAT(message_of([&] {
                ops::gather(t(DType::F32, {4, 3}), t(DType::F16, {2}), t(DType::F32, {2, 3}));
              }),
              HasSubstr("gather: indices is f16; supported: i32, u8, i8"));
  EXPECT_THAT(message_of([&] {
                ops::gather(t(DType::F32, {4, 3}), t(DType::I32, {2}), t(DType::F16, {2, 3}));
              }),
              HasSubstr("gather: y is f16 but x is f32"));
  EXPECT_THAT(message_of([&] {
                ops::gather(t(DType::F32, {4, 3}), t(DType::I32, {2}), t(DType::F32, {2, 3}), 2);
              }),
              HasSubstr("gather: axis 2 is out of range for rank 2"));
  EXPECT_THAT(message_of([&] {
                ops::gather(t(DType::F32, {4, 3}), t(DType::I32, {2, 2}), t(DType::F32, {4, 2, 3}), -1);
              }),
              HasSubstr("gather: y has shape [4, 2, 3]; expected [4, 2, 2]"));
  EXPECT_THAT(
      message_of([&] {
        ops::gather(t(DType::F32, {2, 2, 2, 2}), t(DType::I32, {1, 1, 1, 1}), t(DType::F32, {2, 1, 1, 1, 1, 2}));
      }),
      HasSubstr("gather: y would have rank 7 (x's rank - 1 + indices' rank); ops take up to 6"));
  Conv2dOptions o;
  o.strides = {2, 2};
  EXPECT_THAT(
      message_of([&] {
        ops::conv_transpose2d(t(DType::F32, {1, 2, 3, 3}), t(DType::F32, {2, 4, 3, 3}), t(DType::F32, {1, 4, 9, 7}), o);
      }),
      HasSubstr("conv_transpose2d: y has shape [1, 4, 9, 7]; expected [1, 4, 7, 7] (plus up to 1 output "
                "padding along H and W)"));
  EXPECT_THAT(
      message_of([&] {
        ops::conv_transpose2d(t(DType::F32, {1, 2, 3, 3}), t(DType::F32, {3, 4, 3, 3}), t(DType::F32, {1, 4, 5, 5}));
      }),
      HasSubstr("conv_transpose2d: w has shape [3, 4, 3, 3]; its dimension 0 must be the input channels, 2"));
  o.groups = 3;
  EXPECT_THAT(
      message_of([&] {
        ops::conv_transpose2d(t(DType::F32, {1, 2, 3, 3}), t(DType::F32, {2, 4, 3, 3}), t(DType::F32, {1, 4, 7, 7}), o);
      }),
      HasSubstr("conv_transpose2d: groups 3 must divide the input channels (2)"));
}

// Y = X, then each update at its index along the axis, in the indices'
// row-major order (docs/ops.md): floats combine in f32 and round to the
// dtype at each step (a sum or product of two f32 values in double, rounded
// once to f32, is f32's), integers wrap.
std::vector<double> ref_scatter(const Host& x, const Host& idx, const Host& upd, std::size_t axis, ScatterReduction r) {
  std::vector<double> y = x.v;
  const std::int64_t dim = x.shape[axis];
  const bool fl = is_float(x.dtype);
  for_each_index(idx.shape, [&](const Shape& at, std::int64_t lin) {
    Shape to = at;
    const auto i = static_cast<std::int64_t>(idx.v[static_cast<std::size_t>(lin)]);
    to[axis] = i < 0 ? i + dim : i;
    std::int64_t off = 0;
    for (std::size_t d = 0; d < to.size(); ++d) off = off * x.shape[d] + to[d];
    double& v = y[static_cast<std::size_t>(off)];
    const double u = upd.v[static_cast<std::size_t>(lin)];
    const bool nan = std::isnan(v) || std::isnan(u);
    const auto vi = static_cast<std::int64_t>(v), ui = static_cast<std::int64_t>(u);
    switch (r) {
      case ScatterReduction::None: v = u; break;
      case ScatterReduction::Add:
        v = fl ? round_to(x.dtype, f32(v + u)) : static_cast<double>(wrap(x.dtype, vi + ui));
        break;
      case ScatterReduction::Mul:
        v = fl ? round_to(x.dtype, f32(v * u)) : static_cast<double>(wrap(x.dtype, vi * ui));
        break;
      case ScatterReduction::Max: v = nan ? std::nan("") : std::max(v, u); break;
      case ScatterReduction::Min: v = nan ? std::nan("") : std::min(v, u); break;
    }
  });
  return y;
}

TEST_P(Ops, ScatterElementsEveryDtypeAxisAndReductionWithRepeatedAndNegativeIndices) {
  for (DType dt : {DType::F32, DType::F16, DType::BF16, DType::I8, DType::U8, DType::I32})
    for (ScatterReduction r : {ScatterReduction::None, ScatterReduction::Add, ScatterReduction::Mul,
                               ScatterReduction::Max, ScatterReduction::Min})
      for (int round = 0; round < 2; ++round) {
        const auto rank = static_cast<std::size_t>(rng_.integer(1, 3));
        Shape s(rank), is(rank);
        for (auto& d : s) d = rng_.integer(1, 5);
        const auto axis = static_cast<std::size_t>(rng_.integer(0, static_cast<std::int64_t>(rank) - 1));
        // Along the axis any count (indices repeat); elsewhere at most x's.
        for (std::size_t d = 0; d < rank; ++d) is[d] = d == axis ? rng_.integer(1, 7) : rng_.integer(1, s[d]);
        Host idx(DType::I32, is);
        for (auto& v : idx.v) v = static_cast<double>(rng_.integer(-s[axis], s[axis] - 1));
        const Host x = is_float(dt) ? rand(dt, s, -2, 2) : rand_int(rng_, dt, s);
        const Host upd = is_float(dt) ? rand(dt, is, -2, 2) : rand_int(rng_, dt, is);
        const Tensor y = lab().output(dt, s);
        // x transposed in memory (a strided view) every other round.
        Shape cm(rank);
        std::int64_t step = 1;
        for (std::size_t d = 0; d < rank; ++d) cm[d] = step, step *= s[d];
        const Tensor xt = round ? lab().upload_view(x, cm, 2) : lab().upload(x);
        const std::int64_t ax = rng_.coin() ? static_cast<std::int64_t>(axis) - static_cast<std::int64_t>(rank)
                                            : static_cast<std::int64_t>(axis);
        lab().run(ops::scatter_elements(xt, lab().upload(idx), lab().upload(upd), y, ax, r));
        expect_exact(std::string("scatter_elements ") + to_string(dt) + " " + to_string(r) + " x " + dims(s) +
                         " axis " + std::to_string(axis) + " indices " + dims(is) + (round ? " (x strided)" : ""),
                     lab().download(y), ref_scatter(x, idx, upd, axis, r));
      }
}

// An index outside the axis fails the op when it runs, names it and the
// axis's length, and leaves y unwritten.
TEST_P(Ops, ScatterElementsIndexOutsideTheAxisFailsTheOpAndWritesNothing) {
  const Host x = rand(DType::F32, {4, 3});
  for (const std::int32_t bad : {4, -5}) {
    Host idx(DType::I32, {2, 3});
    idx.v = {0, 1, 2, 3, static_cast<double>(bad), -1};
    const Tensor y = lab().output(DType::F32, {4, 3});
    const Op op = ops::scatter_elements(lab().upload(x), lab().upload(idx), lab().upload(rand(DType::F32, {2, 3})), y);
    const std::string msg = message_of([&] { lab().q.run(op).submit().wait(); });
    lab().q = Queue();
    lab().q = lab().dev.queue(Engine::Compute);
    EXPECT_THAT(msg, HasSubstr("failed at command 1 of 1 (scatter_elements, ring position"));
    EXPECT_THAT(msg, HasSubstr("holds the index " + std::to_string(bad) + ", outside [-4, 4)"));
    const auto raw = lab().bytes(y.buffer());
    EXPECT_TRUE(std::all_of(raw.begin(), raw.begin() + 48, [](std::byte b) { return b == std::byte{0xA5}; }))
        << "y was written by a scatter_elements that failed";
  }
}

TEST_P(Ops, ScatterElementsRefusesBadOperandsByName) {
  auto t = [&](DType d, const Shape& s) { return lab().output(d, s); };
  EXPECT_THAT(message_of([&] {
                ops::scatter_elements(t(DType::F32, {4, 3}), t(DType::I32, {2, 4}), t(DType::F32, {2, 4}),
                                      t(DType::F32, {4, 3}));
              }),
              HasSubstr("scatter_elements: indices has shape [2, 4]; expected x's rank and at most x's length [4, 3] "
                        "in every dimension but axis 0"));
  EXPECT_THAT(
      message_of([&] {
        ops::scatter_elements(t(DType::F32, {4, 3}), t(DType::I32, {2}), t(DType::F32, {2}), t(DType::F32, {4, 3}));
      }),
      HasSubstr("scatter_elements: indices has shape [2]; expected x's rank"));
  EXPECT_THAT(message_of([&] {
                ops::scatter_elements(t(DType::F32, {4, 3}), t(DType::I32, {2, 3}), t(DType::F32, {3, 2}),
                                      t(DType::F32, {4, 3}));
              }),
              HasSubstr("scatter_elements: updates has shape [3, 2]; expected [2, 3] (the shape of indices)"));
  EXPECT_THAT(message_of([&] {
                ops::scatter_elements(t(DType::F32, {4, 3}), t(DType::I8, {2, 3}), t(DType::F32, {2, 3}),
                                      t(DType::F32, {4, 3}));
              }),
              HasSubstr("scatter_elements: indices is i8; supported: i32"));
  EXPECT_THAT(message_of([&] {
                ops::scatter_elements(t(DType::F32, {4, 3}), t(DType::I32, {2, 3}), t(DType::F16, {2, 3}),
                                      t(DType::F32, {4, 3}));
              }),
              HasSubstr("scatter_elements: updates is f16 but x is f32"));
  EXPECT_THAT(message_of([&] {
                ops::scatter_elements(t(DType::F32, {4, 3}), t(DType::I32, {2, 3}), t(DType::F32, {2, 3}),
                                      t(DType::F32, {4, 3}), 2);
              }),
              HasSubstr("scatter_elements: axis 2 is out of range for rank 2"));
}

}  // namespace
}  // namespace tpuhal::ops_test
