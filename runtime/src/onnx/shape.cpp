// Shapes and views: Reshape (constant shape), Flatten, Unsqueeze, Squeeze
// and Cast to float on device data are views of another shape; Transpose
// is transpose; Expand and Tile copies from a view with stride 0. Shape gives the
// fixed shape; on constants each of these folds. Identity and Dropout are
// removed, Constant is a weight.
#include <algorithm>
#include <optional>

#include "onnx/attrs.hpp"
#include "onnx/importer.hpp"
#include "onnx/lowerer.hpp"

namespace tpuhal::rt::detail {
namespace {

// ---- Views: Reshape, Flatten, and Unsqueeze, Squeeze and Cast on device data

struct ReshapeAttrs {
  bool allowzero = false;
  static ReshapeAttrs read(const Attrs& a) { return {a.i("allowzero", 0) != 0}; }
};

// Reshape's output shape from its constant shape input.
std::vector<std::int64_t> reshaped(Importer& im, const Node& n, const Value& x) {
  const Value& s = im.constant(n, 1, "shape");
  if (s.ints.empty() && s.elements() != 0) im.fail_node(n, "the shape input is not an integer tensor");
  const bool allowzero = n.attr<ReshapeAttrs>().allowzero;
  const std::uint64_t total = x.elements();
  std::vector<std::int64_t> out;
  std::int64_t known = 1, infer_at = -1;
  for (std::size_t i = 0; i < s.ints.size(); ++i) {
    std::int64_t d = s.ints[i];
    if (d == 0 && !allowzero) {
      if (i >= x.shape.size())
        im.fail_node(n, "shape entry " + std::to_string(i) + " copies a dimension the input lacks");
      d = x.shape[i];
    }
    if (d == -1) {
      if (infer_at >= 0) im.fail_node(n, "two -1 entries in the shape");
      infer_at = static_cast<std::int64_t>(i);
      out.push_back(1);
      continue;
    }
    if (d < 0) im.fail_node(n, "shape entry " + std::to_string(d));
    out.push_back(d);
    known *= d;
  }
  if (infer_at >= 0) {
    if (known == 0 || total % static_cast<std::uint64_t>(known) != 0)
      im.fail_node(n, "cannot reshape " + dims_text(x.shape) + " to " + dims_text(s.ints));
    out[static_cast<std::size_t>(infer_at)] = static_cast<std::int64_t>(total) / known;
  }
  return out;
}

struct FlattenAttrs {
  std::int64_t axis = 1;
  static FlattenAttrs read(const Attrs& a) { return {a.i("axis", 1)}; }
};

std::vector<std::int64_t> flattened(Importer& im, const Node& n, const Value& x) {
  const std::int64_t given = n.attr<FlattenAttrs>().axis;
  std::int64_t axis = given;
  const auto r = static_cast<std::int64_t>(x.shape.size());
  if (axis < 0) axis += r;
  if (axis < 0 || axis > r) im.fail_node(n, "axis " + std::to_string(given) + " for rank " + std::to_string(r));
  std::int64_t outer = 1, inner = 1;  // each a product, so that an empty input keeps its other side
  for (std::int64_t i = 0; i < r; ++i) (i < axis ? outer : inner) *= x.shape[static_cast<std::size_t>(i)];
  return {outer, inner};
}

// Reshape and Flatten; a reshaped constant stays one.
Value infer_reshape(Importer& im, Node& n) {
  const Value& x = im.in(n, 0);
  Value out;
  out.shape = n.op == "Flatten" ? flattened(im, n, x) : reshaped(im, n, x);
  if (out.elements() != x.elements())
    im.fail_node(n, "cannot reshape " + dims_text(x.shape) + " to " + dims_text(out.shape));
  if (out.shape.size() > kMaxRank) im.fail(Status::Unsupported, "node '" + n.name + "': rank above 6");
  if (x.data) {
    out.data = x.data;
    out.ints = x.ints;
  }
  return out;
}

struct TransposeAttrs {
  std::vector<std::int64_t> perm;  // as given, then checked and completed by its shape rule
  static TransposeAttrs read(const Attrs& a) { return {a.ints("perm")}; }
};

// The Slices that are all that reads 4-D value `v`: each of whole groups of
// `groups` channels (NCHW axis 1, step 1) and all of every other dimension.
// Empty where anything else reads it (or it is a graph output).
std::vector<const Node*> group_slices(const Lowerer& l, const std::string& v, std::int64_t groups) {
  for (const auto& o : l.g.outputs)
    if (o.second == v) return {};
  const auto& vs = l.shape_of(v);
  std::vector<const Node*> slices;
  for (const auto& c : l.g.nodes) {
    const auto uses = std::count(c.inputs.begin(), c.inputs.end(), v);
    if (uses == 0) continue;
    if (c.op != "Slice" || uses != 1 || c.inputs[0] != v || (l.int8() && l.keep_fp16.count(c.name))) return {};
    const auto& a = c.attr<SliceAttrs>();
    const auto& cs = l.shape_of(c.output);
    if (a.lo.size() != 4 || cs.size() != 4 || cs[1] == 0 || cs[1] % groups != 0 || a.lo[1] % groups != 0) return {};
    for (std::size_t d = 0; d < 4; ++d)
      if (a.step[d] != 1 || (d != 1 && (a.lo[d] != 0 || cs[d] != vs[d]))) return {};
    slices.push_back(&c);
  }
  return slices;
}

// ShuffleNet's channel shuffle begun by Reshape `n`: Reshape [N, C, H, W]
// to [N, G, C/G, H, W], Transpose (0, 2, 1, 3, 4), Reshape back to [N, C,
// H, W], the middle values used by nothing else. Output channel c * G + g
// is input channel g * C/G + c.
struct Shuffle {
  const Node* transpose = nullptr;
  const Node* back = nullptr;  // its output is the shuffled value
  std::int64_t groups = 0, per = 0;
};

std::optional<Shuffle> shuffle_at(const Lowerer& l, const Node& n) {
  if (n.op != "Reshape") return std::nullopt;
  const auto& xs = l.shape_of(n.inputs[0]);
  const auto& rs = l.shape_of(n.output);
  if (xs.size() != 4 || rs.size() != 5 || rs[0] != xs[0] || rs[1] * rs[2] != xs[1] || rs[3] != xs[2] || rs[4] != xs[3])
    return std::nullopt;
  const Node* t = l.sole_consumer(n.output);
  if (!t || t->op != "Transpose" || t->attr<TransposeAttrs>().perm != std::vector<std::int64_t>{0, 2, 1, 3, 4})
    return std::nullopt;
  const Node* back = l.sole_consumer(t->output);
  if (!back || back->op != "Reshape" || l.shape_of(back->output) != xs) return std::nullopt;
  return Shuffle{t, back, rs[1], rs[2]};
}

// fp32, fp16 and bf16: Slice `s` (of whole groups of `groups` channels)
// read only by a Concat along channels is made in its part of the Concat's
// output, which is made now (nhwc_concat copies the other inputs in, not
// this one): returns that part viewed [pixels, channels / groups, groups]
// for the shuffle's copy, `s` held there. -1 where it is not so.
std::int64_t made_in_concat(Lowerer& l, const Node& s, std::int64_t groups) {
  const Node* c = l.sole_consumer(s.output);
  if (l.int8() || !c || c->op != "Concat" || c->attr<ConcatAttrs>().resolved != 1 ||
      std::count(c->inputs.begin(), c->inputs.end(), s.output) != 1 || l.shape_of(c->output).size() != 4)
    return -1;
  const auto& cs = l.shape_of(c->output);
  const auto& ss = l.shape_of(s.output);
  std::int64_t at = 0;  // the part's first channel
  for (std::size_t i = 0; c->inputs[i] != s.output; ++i) at += l.shape_of(c->inputs[i])[1];
  const auto it = l.reps.find(c->output);
  const std::int64_t y =
      it != l.reps.end() && it->second.primary_nhwc ? it->second.nhwc_float : l.produce_nhwc_float(c->output, cs);
  const auto offset = static_cast<std::uint64_t>(at) * size_of(l.nhwc_type);
  const auto part = l.dg().add_subview(y, to_nhwc(ss), row_major_strides(to_nhwc(cs)), offset);
  l.dg().tensors[static_cast<std::size_t>(part)].value = s.output;
  Rep r;
  r.primary = l.nhwc_type;
  r.primary_nhwc = true;
  r.nhwc_float = part;
  l.reps[s.output] = r;
  return l.dg().add_subview(y, {ss[0] * ss[2] * ss[3], ss[1] / groups, groups}, {cs[1], groups, 1}, offset);
}

// A channel shuffle of a value held NHWC, f32 (float_nhwc) or u8 (int8), is
// one strided copy within each position's channels, into NHWC. Where the
// shuffled value is read only by Slices of whole groups of channels
// (ShuffleNet's split into halves), each Slice is that copy of its
// channels alone, and the shuffled value is never made: one pass over the
// bytes, not two; a Slice that only a Concat reads (the half a unit passes
// on) is copied into its part of the Concat's output, not copied again.
// The u8 values keep their input's scale (a permutation), as a Slice's do.
bool channel_shuffle(Lowerer& l, const Node& n) {
  const std::string& x = n.inputs[0];
  const bool f32 = l.held_float_nhwc(x);
  if (n.op != "Reshape" || !(f32 || (l.int8() && !l.keep_fp16.count(n.name) && held_u8_nhwc(l.reps, x)))) return false;
  const auto sh = shuffle_at(l, n);
  if (!sh) return false;
  const auto& xs = l.shape_of(x);
  const std::int64_t pixels = xs[0] * xs[2] * xs[3];
  const Rep& r = l.reps.at(x);
  const QParams q = r.q;  // produce_nhwc replaces the output's Rep, not x's; a copy keeps it plain
  const std::int64_t src = f32 ? r.nhwc_float : r.nhwc;
  const std::uint64_t esize = f32 ? size_of(l.nhwc_type) : 1;
  // Shuffled channels [lo, lo + len) (whole groups) copied from x into
  // `to`, value v viewed [pixels, len / G, G] (made here where `to` is -1).
  auto shuffled = [&](const std::string& v, const std::string& node, std::int64_t lo, std::int64_t len,
                      std::int64_t to) {
    const auto& vs = l.shape_of(v);
    const auto from = l.dg().add_subview(src, {pixels, len / sh->groups, sh->groups}, {xs[1], 1, sh->per},
                                         static_cast<std::uint64_t>(lo / sh->groups) * esize);
    if (to < 0)
      to = l.dg().add_view(f32 ? l.produce_nhwc_float(v, vs) : l.produce_nhwc(v, vs, q),
                           {pixels, len / sh->groups, sh->groups});
    l.op("cast", node, {{"x", from}, {"y", to}});
  };
  const auto slices = group_slices(l, sh->back->output, sh->groups);
  for (const Node* s : slices)
    shuffled(s->output, s->name, s->attr<SliceAttrs>().lo[1], l.shape_of(s->output)[1],
             f32 ? made_in_concat(l, *s, sh->groups) : -1);
  if (slices.empty()) shuffled(sh->back->output, n.name, 0, xs[1], -1);
  for (const Node* s : slices) l.fused_into_producer.insert(s->name);
  l.fused_into_producer.insert(sh->transpose->name);
  l.fused_into_producer.insert(sh->back->name);
  return true;
}

void lower_view(Lowerer& l, const Node& n) {
  if (channel_shuffle(l, n)) return;
  if (!l.reps.count(n.inputs[0])) l.get(n.inputs[0], l.float_type());
  l.alias(n.output, n.inputs[0], l.shape_of(n.output));
}

struct SqueezeAttrs {
  std::vector<std::int64_t> axes;  // the attribute (before opset 13)
  static SqueezeAttrs read(const Attrs& a) { return {a.ints("axes")}; }
};

// Unsqueeze's and Squeeze's output shape.
std::vector<std::int64_t> squeezed(Importer& im, const Node& n) {
  const auto& x = im.in(n, 0).shape;
  const auto rank = static_cast<std::int64_t>(x.size());
  const auto& attr = n.attr<SqueezeAttrs>().axes;
  auto axes = im.g.opset >= 13 ? im.int_list(n, 1, "axes", attr) : attr;
  std::vector<std::int64_t> shape = x;
  if (n.op == "Unsqueeze") {
    const auto out_rank = rank + static_cast<std::int64_t>(axes.size());
    for (auto& ax : axes) ax = im.axis_of(n, ax, out_rank);
    std::sort(axes.begin(), axes.end());
    if (std::adjacent_find(axes.begin(), axes.end()) != axes.end()) im.fail_node(n, "an axis is repeated");
    for (auto ax : axes) shape.insert(shape.begin() + ax, 1);
    if (shape.size() > kMaxRank) im.fail(Status::Unsupported, "node '" + n.name + "' (Unsqueeze): rank above 6");
    return shape;
  }
  for (auto& ax : axes) ax = im.axis_of(n, ax, rank);
  std::vector<std::int64_t> kept;
  for (std::int64_t d = 0; d < rank; ++d) {
    const bool listed = std::find(axes.begin(), axes.end(), d) != axes.end();
    const auto dim = x[static_cast<std::size_t>(d)];
    if (listed && dim != 1)
      im.fail_node(n, "axis " + std::to_string(d) + " has size " + std::to_string(dim) + ", not 1");
    if (!(listed || (axes.empty() && dim == 1))) kept.push_back(dim);
  }
  return kept;
}

Value fold_squeeze(Importer& im, Node& n) {
  const Value& x = im.in(n, 0);
  const auto vals = values_of(x);
  return make_constant(squeezed(im, n), vals, is_integer(x));
}

// Device data: a view of another shape.
Value infer_squeeze(Importer& im, Node& n) {
  Value out;
  out.shape = squeezed(im, n);
  n.inputs.resize(1);
  n.op = "Reshape";
  return out;
}

struct CastAttrs {
  std::int64_t to = 0;
  static CastAttrs read(const Attrs& a) { return {a.i("to", 0)}; }
};

bool to_integer(std::int64_t to) { return to == onnx::TensorProto::INT64 || to == onnx::TensorProto::INT32; }

Value fold_cast(Importer& im, Node& n) {
  const Value& x = im.in(n, 0);
  const auto to = n.attr<CastAttrs>().to;
  const bool boolean = to == onnx::TensorProto::BOOL;
  const bool integer = to_integer(to) || boolean;
  if (!integer && to != onnx::TensorProto::FLOAT && to != onnx::TensorProto::DOUBLE)
    im.unsupported(n, "to ONNX type " + std::to_string(to) +
                          "; the compiler casts constants to float, double, int64, int32 and bool");
  std::vector<double> r = values_of(x);
  for (auto& v : r) v = boolean ? (v != 0) : integer ? std::trunc(v) : v;
  return make_constant(x.shape, r, integer);
}

// Device data: to float a view; to int32 or int64 an i32 tensor, each
// value rounded toward zero (the board's cast), as ONNX's Cast does.
Value infer_cast(Importer& im, Node& n) {
  const auto to = n.attr<CastAttrs>().to;
  if (!to_integer(to) && to != onnx::TensorProto::FLOAT && to != onnx::TensorProto::DOUBLE)
    im.unsupported(n, "to ONNX type " + std::to_string(to) +
                          " on data computed on the device; the compiler casts device data to float, double, "
                          "int64 and int32");
  Value out;
  out.shape = im.in(n, 0).shape;
  if (!to_integer(to)) {
    n.inputs.resize(1);
    n.op = "Reshape";
  }
  return out;
}

// To an integer type: i32 on the device (int64 values beyond int32's range
// saturate, the one difference from ONNX, docs/runtime.md); a value held
// as i32 already is only viewed.
void lower_cast(Lowerer& l, const Node& n) {
  if (!to_integer(n.attr<CastAttrs>().to)) return lower_view(l, n);
  const std::string& x = n.inputs[0];
  if (auto it = l.reps.find(x); it != l.reps.end() && it->second.primary == DType::I32 && !it->second.primary_nhwc)
    return l.alias(n.output, x, l.shape_of(n.output));
  // From f32 in every precision: fp16 holds integers exactly only to 2048,
  // bf16 to 256, and ids beyond them must not round first.
  const auto from = l.get(x, DType::F32);
  l.op("cast", n.name, {{"x", from}, {"y", l.produce(n.output, DType::I32, l.shape_of(n.output))}});
}

// CastLike (opset 15): Cast to the element type of its second input, which
// the compiler knows for model inputs and constants read from the model.
void expand_cast_like(Importer& im, Node& n, const onnx::NodeProto&) {
  if (!im.has(n, 1)) im.fail_node(n, "no target input");
  const int to = im.in(n, 1).onnx_type;
  if (to == 0)
    im.unsupported(n, "a target ('" + n.inputs[1] +
                          "') computed in the model; the compiler knows the element type of model inputs and "
                          "constants only");
  onnx::NodeProto p;
  Node cast = im.derived(n, "cast", "Cast", {n.inputs[0]}, n.output, p);
  auto* a = p.add_attribute();
  a->set_name("to");
  a->set_type(onnx::AttributeProto::INT);
  a->set_i(to);
  im.emit(std::move(cast), p);
}

// ---- Transpose, Expand, Shape

// Transpose's permutation, checked (reversed where none is given).
const std::vector<std::int64_t>& permutation(Importer& im, Node& n) {
  const auto& x = im.in(n, 0).shape;
  auto& perm = n.attr<TransposeAttrs>().perm;
  if (perm.empty())
    for (std::size_t i = x.size(); i-- > 0;) perm.push_back(static_cast<std::int64_t>(i));
  if (perm.size() != x.size())
    im.fail_node(n, "perm has " + std::to_string(perm.size()) + " entries for rank " + std::to_string(x.size()));
  std::vector<bool> seen(x.size());
  for (auto p : perm) {
    if (p < 0 || p >= static_cast<std::int64_t>(x.size()) || seen[static_cast<std::size_t>(p)])
      im.fail_node(n, "perm is not a permutation");
    seen[static_cast<std::size_t>(p)] = true;
  }
  return perm;
}

Value fold_transpose(Importer& im, Node& n) {
  const Value& x = im.in(n, 0);
  const auto vals = values_of(x);
  const auto perm = permutation(im, n);
  std::vector<std::int64_t> shape;
  for (auto p : perm) shape.push_back(x.shape[static_cast<std::size_t>(p)]);
  const auto in_st = row_major_strides(x.shape), out_st = row_major_strides(shape);
  std::vector<double> r(vals.size());
  for (std::uint64_t i = 0; i < r.size(); ++i) {
    std::int64_t at = 0;
    for (std::size_t d = 0; d < shape.size(); ++d)
      at += static_cast<std::int64_t>(i) / out_st[d] % shape[d] * in_st[static_cast<std::size_t>(perm[d])];
    r[i] = vals[static_cast<std::size_t>(at)];
  }
  return make_constant(shape, r, is_integer(x));
}

Value infer_transpose(Importer& im, Node& n) {
  const auto& x = im.in(n, 0).shape;
  Value out;
  for (auto p : permutation(im, n)) out.shape.push_back(x[static_cast<std::size_t>(p)]);
  return out;
}

// fp32 (float_nhwc): the permutes around a channels-last block (ConvNeXt's
// LayerNorm and Linears, Swin's) move no bytes. A value held NHWC,
// permuted (0, 2, 3, 1), is its NHWC bytes read in ONNX's order; a
// [N, H, W, C] value permuted (0, 3, 1, 2) is its own bytes held NHWC.
bool transpose_as_view(Lowerer& l, const Node& n) {
  const std::string& x = n.inputs[0];
  const auto it = l.reps.find(x);
  const DType t = l.nhwc_type;
  if (!l.float_nhwc || l.shape_of(x).size() != 4 || it == l.reps.end() || it->second.boolean || it->second.primary != t)
    return false;
  const auto& perm = n.attr<TransposeAttrs>().perm;
  const std::vector<std::int64_t> to_last{0, 2, 3, 1}, to_first{0, 3, 1, 2};
  Rep r;
  r.primary = t;
  if (perm == to_last && l.held_float_nhwc(x)) {
    r.by_dtype[t] = l.dg().add_view(it->second.nhwc_float, l.shape_of(n.output));
  } else if (perm == to_first && !it->second.primary_nhwc) {
    const auto src = l.dense(it->second.by_dtype.at(t), t, l.shape_of(x));
    r.primary_nhwc = true;
    r.nhwc_float = l.dg().add_view(src, l.shape_of(x));
  } else {
    return false;
  }
  l.dg().tensors[static_cast<std::size_t>(r.primary_tensor())].value = n.output;
  l.reps[n.output] = r;
  return true;
}

void lower_transpose(Lowerer& l, const Node& n) {
  if (transpose_as_view(l, n)) return;
  if (!l.reps.count(n.inputs[0])) l.get(n.inputs[0], l.float_type());
  l.get_nchw(n.inputs[0]);
  Rep src = l.reps.at(n.inputs[0]);
  src.primary_nhwc = false;
  src.nhwc = src.nhwc_float = -1;
  const auto x = src.by_dtype.at(src.primary);
  const auto y = l.dg().add_arena(n.output, src.primary, l.shape_of(n.output));
  Rep r = src;
  r.by_dtype = {{src.primary, y}};
  l.reps[n.output] = r;
  // A model's permute that moves bytes runs on its own, DDR to DDR, as
  // TPU-MLIR runs Permute on the BM1684X; tpuhal's own layout changes stay
  // in their group (docs/timing.md).
  const auto i = l.op("transpose", n.name, {{"x", x}, {"y", y}}, {{"perm", n.attr<TransposeAttrs>().perm}});
  l.dg().ops[static_cast<std::size_t>(i)].global = true;
}

// Expand's output shape: the input broadcast with the shape input.
std::vector<std::int64_t> expanded(Importer& im, const Node& n) {
  const Value& s = im.constant(n, 1, "shape");
  if (!is_integer(s) && s.elements() != 0) im.fail_node(n, "its shape is not integers");
  for (auto d : s.ints)
    if (d < 0) im.fail_node(n, "its shape " + dims_text(s.ints) + " has a negative entry");
  auto shape = im.broadcast(n, im.in(n, 0).shape, s.ints);
  if (shape.size() > kMaxRank) im.fail(Status::Unsupported, "node '" + n.name + "' (Expand): rank above 6");
  return shape;
}

// A constant of `shape` whose element i is input 0's element from(i).
template <class From>
Value fold_by_index(Importer& im, const Node& n, const std::vector<std::int64_t>& shape, From from) {
  const Value& x = im.in(n, 0);
  const auto vals = values_of(x);
  im.check_folded(n, shape);
  std::vector<double> r(elements_of(shape));
  for (std::uint64_t i = 0; i < r.size(); ++i) r[i] = vals[from(i)];
  return make_constant(shape, r, is_integer(x));
}

Value fold_expand(Importer& im, Node& n) {
  const auto shape = expanded(im, n);
  const auto& xs = im.in(n, 0).shape;
  return fold_by_index(im, n, shape, [&](std::uint64_t i) { return broadcast_index(shape, xs, i); });
}

Value infer_expand(Importer& im, Node& n) {
  Value out;
  out.shape = expanded(im, n);
  return out;
}

// A copy of x viewed with stride 0 along the broadcast dims.
void lower_expand(Lowerer& l, const Node& n) {
  const DType t = l.float_type();
  const auto& shape = l.shape_of(n.output);
  const auto& xs = l.shape_of(n.inputs[0]);
  const auto xst = row_major_strides(xs);
  std::vector<std::int64_t> strides(shape.size(), 0);
  const std::size_t off = shape.size() - xs.size();
  for (std::size_t d = off; d < shape.size(); ++d)
    if (xs[d - off] != 1) strides[d] = xst[d - off];
  const auto view = l.dg().add_subview(l.get(n.inputs[0], t), shape, strides, 0);
  l.op("cast", n.name, {{"x", view}, {"y", l.produce(n.output, t, shape)}});
}

// Tile: y [x0*r0, x1*r1, ...] as row-major [r0, x0, r1, x1, ...], which is
// x viewed with stride 0 along each repeat. Repeats of 1 add no dimension,
// and neighbouring dimensions of x with no repeat between them merge, so a
// view stays within kMaxRank for the usual tiles (one or two repeated axes).
struct TileView {
  std::vector<std::int64_t> shape, strides;
};

TileView tile_view(const std::vector<std::int64_t>& x, const std::vector<std::int64_t>& reps) {
  const auto xst = row_major_strides(x);
  TileView v;
  bool last_is_x = false;  // the last dimension pushed is one of x's, mergeable with the next
  for (std::size_t d = 0; d < x.size(); ++d) {
    if (reps[d] != 1) {
      v.shape.push_back(reps[d]);
      v.strides.push_back(0);
      last_is_x = false;
    }
    if (last_is_x) {
      v.shape.back() *= x[d];
      v.strides.back() = xst[d];
    } else {
      v.shape.push_back(x[d]);
      v.strides.push_back(xst[d]);
      last_is_x = true;
    }
  }
  return v;
}

// The repeats, checked; and the output shape.
std::vector<std::int64_t> tiled(Importer& im, const Node& n) {
  const auto& x = im.in(n, 0).shape;
  const Value& r = im.constant(n, 1, "repeats");
  if (!is_integer(r)) im.fail_node(n, "its repeats are not integers");
  if (r.ints.size() != x.size())
    im.fail_node(n, "repeats " + dims_text(r.ints) + " for an input of rank " + std::to_string(x.size()));
  std::vector<std::int64_t> shape(x.size());
  for (std::size_t d = 0; d < x.size(); ++d) {
    if (r.ints[d] < 1) im.fail_node(n, "repeats " + dims_text(r.ints) + " has an entry below 1");
    if (__builtin_mul_overflow(x[d], r.ints[d], &shape[d]) || shape[d] >= (std::int64_t{1} << 32))
      im.fail_node(n, "repeats " + dims_text(r.ints) + " make a dimension of 2^32 or more");
  }
  return shape;
}

Value fold_tile(Importer& im, Node& n) {
  const auto shape = tiled(im, n);
  im.check_folded(n, shape);
  const auto& xs = im.in(n, 0).shape;
  const auto xst = row_major_strides(xs), yst = row_major_strides(shape);
  return fold_by_index(im, n, shape, [&](std::uint64_t i) {
    std::uint64_t from = 0;
    for (std::size_t d = 0; d < shape.size(); ++d) from += (i / yst[d] % shape[d]) % xs[d] * xst[d];
    return from;
  });
}

Value infer_tile(Importer& im, Node& n) {
  Value out;
  out.shape = tiled(im, n);
  const auto& reps = im.constant(n, 1, "repeats").ints;
  if (tile_view(im.in(n, 0).shape, reps).shape.size() > kMaxRank)
    im.unsupported(n, "repeats " + dims_text(reps) + " on " + std::to_string(reps.size()) +
                          " axes apart take a view of rank above 6");
  return out;
}

void lower_tile(Lowerer& l, const Node& n) {
  const DType t = l.float_type();
  const auto& shape = l.shape_of(n.output);
  const auto v = tile_view(l.shape_of(n.inputs[0]), l.g.value(n.inputs[1]).ints);
  const auto x = l.dg().add_subview(l.get(n.inputs[0], t), v.shape, v.strides, 0);
  const auto y = l.dg().add_view(l.produce(n.output, t, shape), v.shape);
  l.op("cast", n.name, {{"x", x}, {"y", y}});
}

struct ShapeAttrs {
  std::int64_t start = 0;
  std::optional<std::int64_t> end;
  static ShapeAttrs read(const Attrs& a) { return {a.i("start", 0), a.opt_i("end")}; }
};

Value fold_shape(Importer& im, Node& n) {
  const auto& a = n.attr<ShapeAttrs>();
  const auto& x = im.in(n, 0).shape;
  const auto rank = static_cast<std::int64_t>(x.size());
  std::int64_t start = a.start, end = a.end.value_or(rank);
  start = std::clamp(start < 0 ? start + rank : start, std::int64_t{0}, rank);
  end = std::clamp(end < 0 ? end + rank : end, std::int64_t{0}, rank);
  std::vector<double> dims;
  for (std::int64_t i = start; i < end; ++i) dims.push_back(static_cast<double>(x[static_cast<std::size_t>(i)]));
  return make_constant({static_cast<std::int64_t>(dims.size())}, dims, true);
}

// Size: the number of x's elements, an int64 scalar (shapes are fixed).
Value fold_size(Importer& im, Node& n) {
  return make_constant({}, {static_cast<double>(elements_of(im.in(n, 0).shape))}, true);
}

// ---- DepthToSpace, SpaceToDepth, Trilu

struct BlockAttrs {
  std::int64_t block = 0;
  bool crd = false;  // DepthToSpace's mode: CRD (column, row, depth), else DCR
  static BlockAttrs read(const Attrs& a) { return {a.i("blocksize", 0), a.s("mode", "DCR") == "CRD"}; }
};

// DepthToSpace: [N, C, H, W] to [N, C / b^2, H * b, W * b]; SpaceToDepth
// the other way. Both are a transpose of a 6-D view: `from` the input's,
// `perm` its order in the output.
struct BlockMove {
  std::vector<std::int64_t> from;
  std::vector<std::size_t> perm;
};
BlockMove block_move(const Node& n, const std::vector<std::int64_t>& x) {
  const auto& a = n.attr<BlockAttrs>();
  const std::int64_t b = a.block, N = x[0], C = x[1], H = x[2], W = x[3];
  if (n.op == "SpaceToDepth") return {{N, C, H / b, b, W / b, b}, {0, 3, 5, 1, 2, 4}};
  if (a.crd) return {{N, C / (b * b), b, b, H, W}, {0, 1, 4, 2, 5, 3}};
  return {{N, b, b, C / (b * b), H, W}, {0, 3, 4, 1, 5, 2}};
}

Value infer_block(Importer& im, Node& n) {
  const auto& a = n.attr<BlockAttrs>();
  const auto& x = im.in(n, 0).shape;
  if (x.size() != 4) im.fail_node(n, "x of rank " + std::to_string(x.size()) + "; it takes [N, C, H, W]");
  const std::int64_t b = a.block;
  if (b < 1) im.fail_node(n, "blocksize " + std::to_string(b) + "; it must be at least 1");
  Value out;
  if (n.op == "SpaceToDepth") {
    if (x[2] % b || x[3] % b)
      im.fail_node(n, "H and W of " + dims_text(x) + " are not multiples of " + std::to_string(b));
    out.shape = {x[0], x[1] * b * b, x[2] / b, x[3] / b};
  } else {
    if (x[1] % (b * b)) im.fail_node(n, "C of " + dims_text(x) + " is not a multiple of " + std::to_string(b * b));
    out.shape = {x[0], x[1] / (b * b), x[2] * b, x[3] * b};
  }
  return out;
}

void lower_block(Lowerer& l, const Node& n) {
  const DType t = l.float_type();
  const auto move = block_move(n, l.shape_of(n.inputs[0]));
  std::vector<std::int64_t> to;
  for (auto d : move.perm) to.push_back(move.from[d]);
  const auto y = l.produce(n.output, t, l.shape_of(n.output));
  l.op("transpose", n.name, {{"x", l.dg().add_view(l.get(n.inputs[0], t), move.from)}, {"y", l.dg().add_view(y, to)}},
       {{"perm", move.perm}});
}

struct TriluAttrs {
  bool upper = true;
  std::int64_t k = 0;  // from the constant input, by its shape rule
  static TriluAttrs read(const Attrs& a) { return {a.i("upper", 1) != 0, 0}; }
};

Value infer_trilu(Importer& im, Node& n) {
  auto& a = n.attr<TriluAttrs>();
  Value out;
  out.shape = im.in(n, 0).shape;
  if (out.shape.size() < 2)
    im.fail_node(n, "x of rank " + std::to_string(out.shape.size()) + "; it takes rank 2 or more");
  if (im.has(n, 1)) {
    const auto k = values_of(im.constant(n, 1, "k"));
    if (k.size() != 1) im.fail_node(n, "its k is not one integer");
    a.k = static_cast<std::int64_t>(k[0]);
  }
  n.inputs.resize(1);  // k is read
  return out;
}

// x where the last two dimensions' (row, column) is on or above the k-th
// diagonal (column - row >= k; on or below with upper = 0), else 0: a
// where over a constant mask of the last two dimensions.
void lower_trilu(Lowerer& l, const Node& n) {
  const auto& a = n.attr<TriluAttrs>();
  const DType t = l.float_type();
  const auto& shape = l.shape_of(n.output);
  const std::int64_t rows = shape[shape.size() - 2], cols = shape.back();
  std::vector<std::uint8_t> mask(static_cast<std::size_t>(rows * cols));
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t j = 0; j < cols; ++j)
      mask[static_cast<std::size_t>(i * cols + j)] = (a.upper ? j - i >= a.k : j - i <= a.k) ? 1 : 0;
  l.op("where", n.name,
       {{"cond", l.add_raw(DType::U8, {rows, cols}, mask.data(), mask.size())},
        {"a", l.get(n.inputs[0], t)},
        {"b", l.add_weight({0.0f}, t, {})},
        {"y", l.produce(n.output, t, shape)}});
}

// ---- Identity, Dropout, Constant

// Removed: their output is their input (inference).
void expand_identity(Importer& im, Node& n, const onnx::NodeProto&) {
  im.in(n, 0);
  // A Dropout in training mode (opset 12 on: its third input) drops at
  // random; only inference's, which passes x on, is taken.
  if (n.op == "Dropout" && im.has(n, 2)) {
    const Value& training = im.in(n, 2);
    if (!training.data) im.unsupported(n, "a training_mode computed on the device");
    if (values_of(training).at(0) != 0) im.unsupported(n, "training mode (it drops at random)");
  }
  im.alias[n.output] = n.inputs[0];
  im.g.notes.push_back("removed " + n.op + " '" + n.name + "'");
}

struct ConstantAttrs {
  const onnx::AttributeProto* value = nullptr;  // into the node, while it is expanded
  static ConstantAttrs read(const Attrs& a) { return {a.find("value")}; }
};

void expand_constant(Importer& im, Node& n, const onnx::NodeProto&) {
  const auto* t = n.attr<ConstantAttrs>().value;
  if (!t || !t->has_t()) im.unsupported(n, "only the 'value' tensor form");
  im.g.values[n.output] = im.tensor_value(t->t(), "constant '" + n.name + "'");
}

}  // namespace

std::span<const OpHandler> shape_handlers() {
  static const OpHandler h[] = {
      {.ops = {"Reshape"},
       .read = read_attrs<ReshapeAttrs>,
       .infer = infer_reshape,
       .fold = infer_reshape,
       .folds = Fold::IfFirstTwoConstant,
       .lower = lower_view},
      {.ops = {"Flatten"},
       .read = read_attrs<FlattenAttrs>,
       .infer = infer_reshape,
       .fold = infer_reshape,
       .folds = Fold::IfConstant,
       .lower = lower_view},
      {.ops = {"Unsqueeze", "Squeeze"},
       .read = read_attrs<SqueezeAttrs>,
       .infer = infer_squeeze,
       .fold = fold_squeeze,
       .folds = Fold::IfConstant,
       .lower = lower_view},
      {.ops = {"Cast"},
       .read = read_attrs<CastAttrs>,
       .infer = infer_cast,
       .fold = fold_cast,
       .folds = Fold::IfConstant,
       .lower = lower_cast},
      {.ops = {"CastLike"},
       .opsets = {.first = 15, .refusal = "opset {opset} (CastLike came in 15)"},
       .expand = expand_cast_like},
      {.ops = {"Transpose"},
       .read = read_attrs<TransposeAttrs>,
       .infer = infer_transpose,
       .fold = fold_transpose,
       .folds = Fold::IfConstant,
       .lower = lower_transpose},
      {.ops = {"Expand"}, .infer = infer_expand, .fold = fold_expand, .folds = Fold::IfConstant, .lower = lower_expand},
      {.ops = {"Tile"}, .infer = infer_tile, .fold = fold_tile, .folds = Fold::IfConstant, .lower = lower_tile},
      {.ops = {"Shape"}, .read = read_attrs<ShapeAttrs>, .fold = fold_shape, .folds = Fold::Always},
      {.ops = {"Size"}, .fold = fold_size, .folds = Fold::Always},
      {.ops = {"DepthToSpace", "SpaceToDepth"},
       .read = read_attrs<BlockAttrs>,
       .infer = infer_block,
       .lower = lower_block,
       .writes_fresh = true},
      {.ops = {"Trilu"},
       .opsets = {.first = 14, .refusal = "Trilu before opset 14"},
       .read = read_attrs<TriluAttrs>,
       .infer = infer_trilu,
       .lower = lower_trilu,
       .writes_fresh = true},
      {.ops = {"Identity", "Dropout"}, .expand = expand_identity},
      {.ops = {"Constant"}, .read = read_attrs<ConstantAttrs>, .expand = expand_constant},
  };
  return h;
}

}  // namespace tpuhal::rt::detail
