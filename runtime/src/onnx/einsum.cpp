// Einsum of two operands that is a batched matrix product (every label in
// both operands and the output is a batch dimension; those in both
// operands only are summed; the others are kept), or of one operand that
// only permutes it: as Transpose, Reshape, MatMul, Reshape, Transpose.
#include <algorithm>
#include <map>

#include "onnx/importer.hpp"

namespace tpuhal::rt::detail {
namespace {

struct EinsumAttrs {
  std::string equation;  // without spaces
  static EinsumAttrs read(const Attrs& a) {
    EinsumAttrs e;
    for (char c : a.s("equation", ""))
      if (c != ' ') e.equation += c;
    return e;
  }
};

struct Equation {
  std::vector<std::string> operands;  // each operand's subscripts
  std::string out;                    // the output's
  std::map<char, std::int64_t> dims;  // each subscript's size (broadcast)
};

[[noreturn]] void refuse(const Importer& im, const Node& n, const std::string& why) {
  im.unsupported(n, "equation '" + n.attr<EinsumAttrs>().equation + "': " + why);
}

bool has_label(const std::string& s, char c) { return s.find(c) != std::string::npos; }

// The equation, checked against the operands' shapes.
Equation parse(Importer& im, const Node& n) {
  const std::string& eq = n.attr<EinsumAttrs>().equation;
  const auto arrow = eq.find("->");
  if (arrow == std::string::npos) refuse(im, n, "no output subscripts (->)");
  if (eq.find("...") != std::string::npos) refuse(im, n, "an ellipsis");
  Equation e;
  e.out = eq.substr(arrow + 2);
  for (std::size_t at = 0; at <= arrow;) {
    const auto comma = std::min(eq.find(',', at), arrow);
    e.operands.push_back(eq.substr(at, comma - at));
    at = comma + 1;
  }
  if (e.operands.size() != n.inputs.size())
    im.fail_node(n, "the equation has " + std::to_string(e.operands.size()) + " operands");
  auto& dims = e.dims;
  for (std::size_t i = 0; i < e.operands.size(); ++i) {
    const auto& sh = im.in(n, i).shape;
    const std::string& ops = e.operands[i];
    if (ops.size() != sh.size())
      im.fail_node(n, "operand " + std::to_string(i) + " of rank " + std::to_string(sh.size()) + " for '" + ops + "'");
    for (std::size_t d = 0; d < sh.size(); ++d) {
      const char c = ops[d];
      if (std::count(ops.begin(), ops.end(), c) != 1) refuse(im, n, "a repeated subscript (a diagonal)");
      if (dims.count(c) && dims[c] != sh[d] && dims[c] != 1 && sh[d] != 1)
        im.fail_node(n, std::string("subscript ") + c + " has sizes " + std::to_string(dims[c]) + " and " +
                            std::to_string(sh[d]));
      dims[c] = std::max(dims[c], sh[d]);
    }
  }
  for (char c : e.out)
    if (!dims.count(c)) im.fail_node(n, std::string("output subscript ") + c + " is in no operand");
  return e;
}

// `from` (subscripts `labels`) transposed to `order` as value `to`; `from`
// itself where the order is the same.
std::string transposed(Importer& im, const Node& n, const std::string& from, const std::string& labels,
                       const std::string& order, const std::string& to, const std::string& suffix) {
  if (labels == order) return from;
  onnx::NodeProto p;
  Node t = im.derived(n, suffix, "Transpose", {from}, to, p);
  auto* perm = p.add_attribute();
  perm->set_name("perm");
  perm->set_type(onnx::AttributeProto::INTS);
  for (char c : order) perm->add_ints(static_cast<std::int64_t>(labels.find(c)));
  im.emit(std::move(t), p);
  return to;
}

std::string reshaped(Importer& im, const Node& n, const std::string& from, std::vector<std::int64_t> shape,
                     const std::string& to, const std::string& suffix) {
  const std::string sn = im.add_constant(n.name + "/" + suffix + "_shape", {static_cast<std::int64_t>(shape.size())},
                                         std::vector<double>(shape.begin(), shape.end()), true);
  im.emit_derived(n, suffix, "Reshape", {from, sn}, to);
  return to;
}

// Two operands: [batch, m, k] by [batch, k, n].
void as_matmul(Importer& im, const Node& n, const Equation& e) {
  const std::string &la = e.operands[0], &lb = e.operands[1], &out = e.out;
  std::string batch, m, k, nn;
  for (char c : out)
    if (has_label(la, c) && has_label(lb, c)) batch += c;
  for (char c : la) {
    if (has_label(out, c) && !has_label(lb, c)) m += c;
    if (!has_label(out, c) && has_label(lb, c)) k += c;
    if (!has_label(out, c) && !has_label(lb, c))
      refuse(im, n, std::string("subscript ") + c + " summed in one operand");
  }
  for (char c : lb) {
    if (has_label(out, c) && !has_label(la, c)) nn += c;
    if (!has_label(out, c) && !has_label(la, c))
      refuse(im, n, std::string("subscript ") + c + " summed in one operand");
  }
  auto extent = [&](const std::string& labels, const std::vector<std::int64_t>& sh, const std::string& within) {
    std::int64_t s = 1;
    for (char c : labels) s *= sh[within.find(c)];
    return s;
  };
  const std::string p = n.name + "/";
  const auto& sa = im.in(n, 0).shape;
  const auto& sb = im.in(n, 1).shape;
  std::vector<std::int64_t> a_shape, b_shape, y_shape;
  for (char c : batch) {
    a_shape.push_back(sa[la.find(c)]);
    b_shape.push_back(sb[lb.find(c)]);
    y_shape.push_back(e.dims.at(c));
  }
  const std::int64_t msz = extent(m, sa, la), ksz = extent(k, sa, la), nsz = extent(nn, sb, lb);
  a_shape.insert(a_shape.end(), {msz, ksz});
  b_shape.insert(b_shape.end(), {ksz, nsz});
  std::string a = transposed(im, n, n.inputs[0], la, batch + m + k, p + "a", "transpose_a");
  a = reshaped(im, n, a, a_shape, p + "a_matrix", "reshape_a");
  std::string b = transposed(im, n, n.inputs[1], lb, batch + k + nn, p + "b", "transpose_b");
  b = reshaped(im, n, b, b_shape, p + "b_matrix", "reshape_b");
  im.emit_derived(n, "matmul", "MatMul", {a, b}, p + "product");
  for (char c : m + nn) y_shape.push_back(e.dims.at(c));
  const std::string order = batch + m + nn;
  const std::string y = reshaped(im, n, p + "product", y_shape, order == out ? n.output : p + "y", "reshape_y");
  if (order != out) transposed(im, n, y, order, out, n.output, "transpose_y");
  im.g.notes.push_back("Einsum '" + n.name + "' (" + n.attr<EinsumAttrs>().equation + ") runs as a MatMul of [" +
                       batch + "|" + m + "|" + k + "] by [" + batch + "|" + k + "|" + nn + "]");
}

void expand_einsum(Importer& im, Node& n, const onnx::NodeProto&) {
  const Equation e = parse(im, n);
  if (e.operands.size() == 1) {
    const std::string& labels = e.operands[0];
    if (labels.size() != e.out.size() || !std::is_permutation(e.out.begin(), e.out.end(), labels.begin()))
      refuse(im, n, "one operand that is summed, not only permuted");
    const std::string r = transposed(im, n, n.inputs[0], labels, e.out, n.output, "transpose");
    if (r != n.output) im.alias[n.output] = r;  // the identity
    return;
  }
  if (e.operands.size() != 2) refuse(im, n, std::to_string(e.operands.size()) + " operands");
  as_matmul(im, n, e);
}

}  // namespace

std::span<const OpHandler> einsum_handlers() {
  static const OpHandler h[] = {
      {.ops = {"Einsum"}, .read = read_attrs<EinsumAttrs>, .expand = expand_einsum},
  };
  return h;
}

}  // namespace tpuhal::rt::detail
