// Tensors and ops: every operand checked on the host, with an error that
// names the op, the operand and the value, before anything reaches a device.
#include "tpuhal/ops.hpp"

#include <spdlog/fmt/fmt.h>

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>
#include <string_view>

#include "impl.hpp"
#include "op_cost.hpp"
#include "tpuhal/driver/op_desc.hpp"
#include "tpuhal/fw/planes.h"
#include "tpuhal/fw/window.h"
#include "tpuhal/tpuhal.hpp"

namespace tpuhal {
namespace detail {

struct TensorState {
  Buffer buffer;
  DType dtype = DType::F32;
  std::vector<std::int64_t> shape, strides;
  std::uint64_t offset = 0;

  static const std::shared_ptr<BufferImpl>& impl(const Buffer& b) { return b.impl_; }
  static const TensorState& of(const Tensor& t) {
    if (!t.state_) throw Error(Status::InvalidArgument, "empty Tensor");
    return *t.state_;
  }
  static Tensor make(std::shared_ptr<const TensorState> s) {
    Tensor t;
    t.state_ = std::move(s);
    return t;
  }
};

}  // namespace detail

using detail::TensorState;

namespace {

std::string dims_text(const std::vector<std::int64_t>& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

std::uint64_t extent_bytes(DType dtype, const std::vector<std::int64_t>& shape,
                           const std::vector<std::int64_t>& strides) {
  std::uint64_t last = 0;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == 0) return 0;
    const auto span = static_cast<std::uint64_t>(shape[i] - 1);
    const auto stride = static_cast<std::uint64_t>(strides[i]);
    if (span && stride > (UINT64_MAX >> 2) / span)
      throw Error(Status::InvalidArgument, "tensor of shape " + dims_text(shape) + " spans more than 2^62 elements");
    last += span * stride;
  }
  return (last + 1) * size_of(dtype);
}

std::vector<std::int64_t> row_major(const std::vector<std::int64_t>& shape) {
  std::vector<std::int64_t> s(shape.size());
  std::int64_t step = 1;
  for (std::size_t i = shape.size(); i-- > 0;) {
    s[i] = step;
    step *= std::max<std::int64_t>(shape[i], 1);
  }
  return s;
}

}  // namespace

std::uint32_t size_of(DType dtype) noexcept {
  switch (dtype) {
    case DType::F32:
    case DType::I32: return 4;
    case DType::F16:
    case DType::BF16: return 2;
    case DType::I8:
    case DType::U8: return 1;
  }
  return 0;
}

// ---- Tensor --------------------------------------------------------------------

Tensor::Tensor() = default;
Tensor::~Tensor() = default;
Tensor::Tensor(const Tensor&) = default;
Tensor& Tensor::operator=(const Tensor&) = default;
Tensor::Tensor(Tensor&&) noexcept = default;
Tensor& Tensor::operator=(Tensor&&) noexcept = default;

Tensor::Tensor(const Buffer& buffer, DType dtype, std::vector<std::int64_t> shape, std::uint64_t offset)
    : Tensor(buffer, dtype, shape, row_major(shape), offset) {}

Tensor::Tensor(const Buffer& buffer, DType dtype, std::vector<std::int64_t> shape, std::vector<std::int64_t> strides,
               std::uint64_t offset) {
  auto s = std::make_shared<TensorState>();
  const auto& impl = TensorState::impl(buffer);
  if (!impl) throw Error(Status::InvalidArgument, "Tensor: empty Buffer handle");
  impl->acquire("Tensor");  // throws if freed
  if (size_of(dtype) == 0) throw Error(Status::InvalidArgument, "Tensor: unknown dtype");
  if (shape.size() > kMaxRank)
    throw Error(Status::InvalidArgument, "Tensor: rank " + std::to_string(shape.size()) + " is above the limit of 6");
  if (strides.size() != shape.size())
    throw Error(Status::InvalidArgument, "Tensor: " + std::to_string(strides.size()) + " strides for " +
                                             std::to_string(shape.size()) + " dimensions");
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0 || shape[i] >= (std::int64_t{1} << 32))
      throw Error(Status::InvalidArgument,
                  "Tensor: shape[" + std::to_string(i) + "] = " + std::to_string(shape[i]) + " is outside [0, 2^32)");
    if (strides[i] < 0)
      throw Error(Status::InvalidArgument,
                  "Tensor: strides[" + std::to_string(i) + "] = " + std::to_string(strides[i]) + " is negative");
  }
  if (offset % size_of(dtype))
    throw Error(Status::InvalidArgument, "Tensor: offset " + std::to_string(offset) + " is not a multiple of the " +
                                             to_string(dtype) + " element size " + std::to_string(size_of(dtype)));
  const std::uint64_t need = extent_bytes(dtype, shape, strides);
  if (offset > impl->size() || need > impl->size() - offset)
    throw Error(Status::OutOfRange, std::string("Tensor: ") + to_string(dtype) + dims_text(shape) + " at offset " +
                                        std::to_string(offset) + " needs " + std::to_string(need) +
                                        " bytes but the buffer has " + std::to_string(impl->size()));
  s->buffer = buffer;
  s->dtype = dtype;
  s->shape = std::move(shape);
  s->strides = std::move(strides);
  s->offset = offset;
  state_ = std::move(s);
}

const Buffer& Tensor::buffer() const { return TensorState::of(*this).buffer; }
DType Tensor::dtype() const { return TensorState::of(*this).dtype; }
const std::vector<std::int64_t>& Tensor::shape() const { return TensorState::of(*this).shape; }
const std::vector<std::int64_t>& Tensor::strides() const { return TensorState::of(*this).strides; }
std::uint64_t Tensor::offset() const { return TensorState::of(*this).offset; }
std::size_t Tensor::rank() const { return TensorState::of(*this).shape.size(); }
std::uint64_t Tensor::elements() const {
  std::uint64_t n = 1;
  for (auto d : shape()) n *= static_cast<std::uint64_t>(d);
  return n;
}
bool Tensor::contiguous() const {
  const auto& s = TensorState::of(*this);
  const auto rm = row_major(s.shape);
  for (std::size_t i = 0; i < s.shape.size(); ++i)
    if (s.shape[i] > 1 && s.strides[i] != rm[i]) return false;
  return true;
}

Tensor Tensor::reshape(std::vector<std::int64_t> new_shape) const {
  const auto& s = TensorState::of(*this);
  if (!contiguous()) throw Error(Status::InvalidArgument, "reshape: " + describe() + " is not contiguous");
  std::uint64_t n = 1;
  for (auto d : new_shape) {
    if (d < 0) throw Error(Status::InvalidArgument, "reshape: dimension " + std::to_string(d) + " is negative");
    n *= static_cast<std::uint64_t>(d);
  }
  if (n != elements())
    throw Error(Status::InvalidArgument, "reshape: " + dims_text(new_shape) + " holds " + std::to_string(n) +
                                             " elements, " + describe() + " holds " + std::to_string(elements()));
  return Tensor(s.buffer, s.dtype, std::move(new_shape), s.offset);
}

Tensor Tensor::permute(const std::vector<std::size_t>& perm) const {
  const auto& s = TensorState::of(*this);
  if (perm.size() != s.shape.size())
    throw Error(Status::InvalidArgument, "permute: " + std::to_string(perm.size()) + " axes for a rank-" +
                                             std::to_string(s.shape.size()) + " tensor");
  std::vector<bool> seen(perm.size());
  std::vector<std::int64_t> shape(perm.size()), strides(perm.size());
  for (std::size_t i = 0; i < perm.size(); ++i) {
    if (perm[i] >= perm.size() || seen[perm[i]])
      throw Error(Status::InvalidArgument, "permute: axis " + std::to_string(perm[i]) + " at position " +
                                               std::to_string(i) + " is out of range or repeated");
    seen[perm[i]] = true;
    shape[i] = s.shape[perm[i]];
    strides[i] = s.strides[perm[i]];
  }
  return Tensor(s.buffer, s.dtype, std::move(shape), std::move(strides), s.offset);
}

std::string Tensor::describe() const {
  if (!state_) return "empty tensor";
  const auto& s = *state_;
  const auto& impl = TensorState::impl(s.buffer);
  return std::string(to_string(s.dtype)) + dims_text(s.shape) + " at offset " + std::to_string(s.offset) + " of a " +
         (impl ? impl->describe() : "missing buffer");
}

// ---- Op --------------------------------------------------------------------------

Op::Op() = default;
Op::~Op() = default;
Op::Op(const Op&) = default;
Op& Op::operator=(const Op&) = default;

const std::string& Op::name() const {
  static const std::string kEmpty = "empty op";
  return desc_ ? desc_->name : kEmpty;
}

Device Op::device() const {
  if (!device_) throw Error(Status::FailedPrecondition, "empty Op (build one with tpuhal::ops)");
  return Device(device_);
}

OpCost Op::cost() const { return desc_ ? detail::op_cost(*desc_) : OpCost{}; }

Op& Op::set_global(bool global) {
  if (!desc_) throw Error(Status::FailedPrecondition, "empty Op (build one with tpuhal::ops)");
  if (desc_->global != global) {
    auto d = std::make_shared<driver::OpDesc>(*desc_);
    d->global = global;
    desc_ = std::move(d);
  }
  return *this;
}

bool Op::global() const { return desc_ && desc_->global; }

namespace ops {
namespace {

using driver::TensorArg;

// Collects an op's operands: checks each belongs to one device, keeps their
// buffers alive, and builds the driver's description.
// "x" -> "x's", "indices" -> "indices'".
std::string possessive(std::string_view name) { return std::string(name) + (name.ends_with('s') ? "'" : "'s"); }

class Builder {
 public:
  Builder(driver::OpKind kind, const char* name) {
    desc_ = std::make_shared<driver::OpDesc>();
    desc_->kind = kind;
    desc_->name = name;
    keep_ = std::make_shared<std::vector<std::shared_ptr<const void>>>();
  }

  [[noreturn]] void fail(Status s, const std::string& what) const { throw Error(s, desc_->name + ": " + what); }

  // The operand as itself, or as a view with `shape`/`strides`.
  TensorArg arg(const Tensor& t, const char* role) { return arg(t, role, t.shape(), t.strides()); }
  TensorArg arg(const Tensor& t, const char* role, const std::vector<std::int64_t>& shape,
                const std::vector<std::int64_t>& strides) {
    const auto& s = TensorState::of(t);
    const auto& impl = TensorState::impl(s.buffer);
    auto backend = impl->acquire(desc_->name.c_str());
    if (!device_) {
      device_ = impl->device();
    } else if (impl->device() != device_) {
      fail(Status::InvalidArgument,
           std::string(role) + " is on " + impl->device()->uri() + ", the other operands on " + device_->uri());
    }
    TensorArg a;
    a.buffer = backend.get();
    a.offset = s.offset;
    a.dtype = s.dtype;
    a.rank = static_cast<std::uint32_t>(shape.size());
    for (std::size_t i = 0; i < shape.size(); ++i) {
      a.shape[i] = static_cast<std::uint64_t>(shape[i]);
      a.strides[i] = static_cast<std::uint64_t>(strides[i]);
    }
    if (written(role))  // an output besides the last must not write an element twice
      for (std::uint32_t d = 0; d < a.rank; ++d)
        if (a.shape[d] > 1 && a.strides[d] == 0)
          fail(Status::InvalidArgument,
               std::string("the output ") + role + " has stride 0 in dimension " + std::to_string(d));
    keep_->push_back(std::move(backend));
    spans_.push_back({impl.get(), s.offset, extent_bytes(s.dtype, shape, strides), role});
    return a;
  }

  // `t` broadcast (NumPy rules) to `shape`.
  TensorArg broadcast(const Tensor& t, const char* role, const std::vector<std::int64_t>& shape) {
    const auto& ts = t.shape();
    if (ts.size() > shape.size())
      fail(Status::InvalidArgument,
           std::string(role) + " has shape " + dims_text(ts) + ", which does not broadcast to " + dims_text(shape));
    std::vector<std::int64_t> strides(shape.size(), 0);
    const std::size_t skip = shape.size() - ts.size();
    for (std::size_t i = 0; i < ts.size(); ++i) {
      if (ts[i] == shape[skip + i])
        strides[skip + i] = t.strides()[i];
      else if (ts[i] != 1)
        fail(Status::InvalidArgument,
             std::string(role) + " has shape " + dims_text(ts) + ", which does not broadcast to " + dims_text(shape));
    }
    return arg(t, role, shape, strides);
  }

  // A scale or zero point: a scalar (any shape of one element) or 1-D along
  // `axis` of `like_shape`, viewed in that shape.
  TensorArg per_axis(const Tensor& t, const char* role, const std::vector<std::int64_t>& like_shape,
                     std::int64_t axis) {
    std::vector<std::int64_t> strides(like_shape.size(), 0);
    if (t.elements() == 1) return arg(t, role, like_shape, strides);
    if (t.rank() != 1)
      fail(Status::InvalidArgument,
           std::string(role) + " has shape " + dims_text(t.shape()) + "; expected a scalar or a 1-D tensor");
    if (axis < 0 || static_cast<std::size_t>(axis) >= like_shape.size() || like_shape[axis] != t.shape()[0])
      fail(Status::InvalidArgument, std::string(role) + " has " + std::to_string(t.shape()[0]) +
                                        " elements; expected 1, or one per index of axis " + std::to_string(axis) +
                                        " of " + dims_text(like_shape));
    strides[axis] = t.strides()[0];
    return arg(t, role, like_shape, strides);
  }

  // One value (any shape of one element) over like_shape, stride 0.
  TensorArg scalar(const Tensor& t, const char* role, const std::vector<std::int64_t>& like_shape) {
    if (t.elements() != 1)
      fail(Status::InvalidArgument, std::string(role) + " must be one value, not " + dims_text(t.shape()));
    return arg(t, role, like_shape, std::vector<std::int64_t>(like_shape.size(), 0));
  }

  TensorArg absent() { return TensorArg{}; }

  // A matrix product's operands a [..., M, K] and b [..., K, N] as views
  // with y's batch dimensions, which they broadcast to (NumPy's matmul),
  // y [..., M, N] checked (matmul_views).
  std::pair<TensorArg, TensorArg> matmul(const Tensor& a, const char* a_role, const Tensor& b, const char* b_role,
                                         const Tensor& y);
  // A zero point or scale of a matrix product's operand `of` [..., R, C]:
  // a scalar, or one per row (along R, `per_row`) or per column (along C),
  // viewed in of's shape.
  TensorArg matmul_param(const Tensor& t, const char* role, const TensorArg& of, bool per_row);

  void dtype_in(const Tensor& t, const char* role, std::initializer_list<DType> ok) {
    for (auto d : ok)
      if (t.dtype() == d) return;
    std::string list;
    for (auto d : ok) list += (list.empty() ? "" : ", ") + std::string(to_string(d));
    fail(Status::InvalidArgument, std::string(role) + " is " + to_string(t.dtype()) + "; supported: " + list);
  }
  void same_dtype(const Tensor& t, const char* role, const Tensor& like, const char* like_role) {
    if (t.dtype() != like.dtype())
      fail(Status::InvalidArgument,
           std::string(role) + " is " + to_string(t.dtype()) + " but " + like_role + " is " + to_string(like.dtype()));
  }
  void shape_is(const Tensor& t, const char* role, const std::vector<std::int64_t>& want, const std::string& why) {
    if (t.shape() != want)
      fail(Status::InvalidArgument, std::string(role) + " has shape " + dims_text(t.shape()) + "; expected " +
                                        dims_text(want) + " (" + why + ")");
  }
  void rank_is(const Tensor& t, const char* role, std::size_t rank) {
    if (t.rank() != rank)
      fail(Status::InvalidArgument, std::string(role) + " has shape " + dims_text(t.shape()) + ", rank " +
                                        std::to_string(t.rank()) + "; expected rank " + std::to_string(rank));
  }
  // Dimension d of t (its rank checked) is `want`, which `why` names (empty:
  // a fixed number).
  void dim_is(const Tensor& t, const char* role, std::size_t d, std::int64_t want, const std::string& why) {
    if (t.shape()[d] == want) return;
    const std::string value = std::to_string(want);
    fail(Status::InvalidArgument, std::string(role) + " has shape " + dims_text(t.shape()) + "; expected " +
                                      (why.empty() ? value : why + " (" + value + ")") + " as its dimension " +
                                      std::to_string(d));
  }
  // `into`'s shape with dimension `axis` replaced by `part`'s whole shape
  // (Gather's output), the result named `out`; at most kMaxRank dimensions.
  std::vector<std::int64_t> spliced(const Tensor& into, const char* into_role, std::size_t axis, const Tensor& part,
                                    const char* part_role, const char* out) const {
    const auto& xs = into.shape();
    std::vector<std::int64_t> want(xs.begin(), xs.begin() + static_cast<std::ptrdiff_t>(axis));
    want.insert(want.end(), part.shape().begin(), part.shape().end());
    want.insert(want.end(), xs.begin() + static_cast<std::ptrdiff_t>(axis) + 1, xs.end());
    if (want.size() > kMaxRank)
      fail(Status::InvalidArgument, std::string(out) + " would have rank " + std::to_string(want.size()) + " (" +
                                        possessive(into_role) + " rank - 1 + " + possessive(part_role) +
                                        " rank); ops take up to " + std::to_string(kMaxRank));
    return want;
  }
  // t has like's rank and at most its length in every dimension but `axis`
  // (ScatterElements' indices against its data).
  void within(const Tensor& t, const char* role, const Tensor& like, const char* like_role, std::size_t axis) const {
    bool ok = t.rank() == like.rank();
    for (std::size_t d = 0; ok && d < t.rank(); ++d) ok = d == axis || t.shape()[d] <= like.shape()[d];
    if (!ok)
      fail(Status::InvalidArgument, std::string(role) + " has shape " + dims_text(t.shape()) + "; expected " +
                                        possessive(like_role) + " rank and at most " + possessive(like_role) +
                                        " length " + dims_text(like.shape()) + " in every dimension but axis " +
                                        std::to_string(axis));
  }
  // A finite float from lo to hi (either may be infinite: no bound); `range`
  // says so in words.
  float in_range(float value, const char* name, float lo, float hi, const char* range) const {
    if (!std::isfinite(value) || value < lo || value > hi)
      fail(Status::InvalidArgument, std::string(name) + " is " + fmt::format("{}", value) +
                                        "; expected a finite number" +
                                        (std::string_view(range) == "finite" ? "" : std::string(", ") + range));
    return value;
  }
  // A count from lo to hi (a sampling ratio), as the board takes it.
  std::uint32_t count(std::int64_t value, const char* name, std::uint32_t lo, std::uint32_t hi) const {
    if (value < lo || value > hi)
      fail(Status::InvalidArgument, std::string(name) + " is " + std::to_string(value) + "; expected " +
                                        std::to_string(lo) + " to " + std::to_string(hi));
    return static_cast<std::uint32_t>(value);
  }
  // An axis of `of`, -rank..rank-1 (negative counts from the end), as the
  // board takes it: 0..rank-1.
  std::uint32_t axis(std::int64_t value, const Tensor& of) const {
    const auto rank = static_cast<std::int64_t>(of.rank());
    if (rank == 0 || value < -rank || value >= rank)
      fail(Status::InvalidArgument,
           "axis " + std::to_string(value) + " is out of range for rank " + std::to_string(rank));
    return static_cast<std::uint32_t>(value < 0 ? value + rank : value);
  }
  void activation(const ActivationParams& a) {
    if (!std::isfinite(a.alpha) || !std::isfinite(a.beta))
      fail(Status::InvalidArgument, "activation parameters must be finite");
    if (a.kind == Activation::Clip && a.alpha > a.beta)
      fail(Status::InvalidArgument,
           "clip minimum " + std::to_string(a.alpha) + " is above its maximum " + std::to_string(a.beta));
  }

  // Operands i and j (in the order arg() met them) do not overlap: for an
  // output that is not the last operand.
  void disjoint(std::size_t i, std::size_t j) {
    const Span &a = spans_.at(i), &o = spans_.at(j);
    if (a.buffer == o.buffer && a.bytes && o.bytes && a.offset < o.offset + o.bytes && o.offset < a.offset + a.bytes)
      fail(Status::InvalidArgument, std::string("the output ") + a.role + " overlaps " + o.role + " (bytes [" +
                                        std::to_string(a.offset) + ", " + std::to_string(a.offset + a.bytes) +
                                        ") and [" + std::to_string(o.offset) + ", " +
                                        std::to_string(o.offset + o.bytes) + ") of the same buffer)");
  }
  // The operand of `role` is an output too, besides the last (call before
  // its arg()): it must not write an element twice, and finish() checks it
  // overlaps no other operand.
  void writes(const char* role) { writes_.push_back(role); }
  // t has of's shape but k along `axis` (checked: < of's rank), any of 1 to
  // of's length there where k is 0; of's length there fits i32 indices.
  void k_along(const Tensor& t, const char* role, const Tensor& of, const char* of_role, std::size_t axis,
               std::int64_t k) const {
    auto want = of.shape();
    const std::int64_t len = want[axis];
    want[axis] = k == 0 && t.rank() == of.rank() ? t.shape()[axis] : k;
    if (t.shape() != want || want[axis] < 1 || want[axis] > len)
      fail(Status::InvalidArgument, std::string(role) + " has shape " + dims_text(t.shape()) + "; expected " +
                                        possessive(of_role) + " shape " + dims_text(of.shape()) + " with " +
                                        (k ? std::to_string(k) : "k (1 to " + std::to_string(len) + ")") +
                                        " along axis " + std::to_string(axis));
    if (len > 0x7FFF'FFFF)
      fail(Status::InvalidArgument, std::string(of_role) + " has " + std::to_string(len) + " elements along axis " +
                                        std::to_string(axis) + "; i32 indices reach 2^31 - 1");
  }

  Op finish(std::vector<TensorArg> tensors) {
    // What the kind's line in op_kinds.inc promises every backend.
    const driver::OpKindInfo& kind = driver::op_kind_info(desc_->kind);
    if (tensors.size() != kind.tensors || desc_->attrs.index() != kind.attrs_index)
      fail(Status::Internal, std::to_string(tensors.size()) + " tensors and attributes #" +
                                 std::to_string(desc_->attrs.index()) + " for a " + kind.name + " op, which takes " +
                                 std::to_string(kind.tensors) + " and #" + std::to_string(kind.attrs_index) +
                                 " (op_kinds.inc)");
    // An output besides the last (writes()) overlaps no other operand.
    for (std::size_t i = 0; i + 1 < spans_.size(); ++i)
      if (written(spans_[i].role))
        for (std::size_t j = 0; j < spans_.size(); ++j)
          if (j != i) disjoint(i, j);
    // The output is the last operand; it may not overlap any input.
    const Span& out = spans_.back();
    for (std::size_t i = 0; i + 1 < spans_.size(); ++i) {
      const Span& in = spans_[i];
      if (in.buffer == out.buffer && in.bytes && out.bytes && in.offset < out.offset + out.bytes &&
          out.offset < in.offset + in.bytes)
        fail(Status::InvalidArgument,
             std::string("the output ") + out.role + " overlaps input " + in.role + " (bytes [" +
                 std::to_string(out.offset) + ", " + std::to_string(out.offset + out.bytes) + ") and [" +
                 std::to_string(in.offset) + ", " + std::to_string(in.offset + in.bytes) + ") of the same buffer)");
    }
    // The output must not write an element twice.
    const TensorArg& y = tensors.back();
    for (std::uint32_t d = 0; d < y.rank; ++d)
      if (y.shape[d] > 1 && y.strides[d] == 0)
        fail(Status::InvalidArgument,
             std::string("the output ") + out.role + " has stride 0 in dimension " + std::to_string(d));
    desc_->tensors = std::move(tensors);
    return OpAccess::make(std::move(desc_), std::move(keep_), device_);
  }

  driver::OpDesc& desc() { return *desc_; }
  const std::shared_ptr<detail::DeviceImpl>& device() const { return device_; }

 private:
  struct Span {
    const detail::BufferImpl* buffer;
    std::uint64_t offset, bytes;
    const char* role;
  };
  std::shared_ptr<driver::OpDesc> desc_;
  std::shared_ptr<std::vector<std::shared_ptr<const void>>> keep_;
  std::shared_ptr<detail::DeviceImpl> device_;
  std::vector<Span> spans_;
  std::vector<const char*> writes_;  // writes(): the roles of outputs besides the last

  bool written(const char* role) const {
    return std::any_of(writes_.begin(), writes_.end(), [&](const char* w) { return std::string_view(w) == role; });
  }
};

const std::initializer_list<DType> kFloats = {DType::F32, DType::F16, DType::BF16};
const std::initializer_list<DType> kInt8 = {DType::U8, DType::I8};

// x [N,C,H,W] or [N,H,W,C]; returns {N, C, H, W}.
std::array<std::int64_t, 4> nchw(Builder& b, const Tensor& x, Layout layout, const char* role) {
  if (x.rank() != 4)
    b.fail(Status::InvalidArgument, std::string(role) + " has rank " + std::to_string(x.rank()) + "; expected 4");
  const auto& s = x.shape();
  return layout == Layout::NCHW ? std::array<std::int64_t, 4>{s[0], s[1], s[2], s[3]}
                                : std::array<std::int64_t, 4>{s[0], s[3], s[1], s[2]};
}

std::vector<std::int64_t> make_shape(Layout layout, std::int64_t n, std::int64_t c, std::int64_t h, std::int64_t w) {
  return layout == Layout::NCHW ? std::vector<std::int64_t>{n, c, h, w} : std::vector<std::int64_t>{n, h, w, c};
}

// The window kinds' shape rule is fw/window.h's, which the board's decoder
// reads too; the host says what it finds in words.
using Dims4 = std::uint64_t[4];

void to_dims(const std::array<std::int64_t, 4>& from, Dims4& to) {
  for (int i = 0; i < 4; ++i) to[i] = static_cast<std::uint64_t>(from[i]);
}

// x's (in NCHW order) and w's dimensions, as the rule takes them.
struct ConvDims {
  Dims4 x, w;
};

ConvDims conv_dims(const std::array<std::int64_t, 4>& xd, const Tensor& w) {
  ConvDims d;
  to_dims(xd, d.x);
  to_dims({w.shape()[0], w.shape()[1], w.shape()[2], w.shape()[3]}, d.w);
  return d;
}

// Conv2dOptions or Pool2dOptions as the rule takes them.
template <typename Options>
fw::Window window_of(const Options& o) {
  fw::Window w;
  for (int k = 0; k < 2; ++k) {
    w.stride[k] = o.strides[k];
    w.dilation[k] = o.dilations[k];
  }
  for (int k = 0; k < 4; ++k) w.pad[k] = o.pads[k];
  if constexpr (requires { o.groups; }) w.groups = o.groups;
  if constexpr (requires { o.kernel; }) {
    w.kernel[0] = o.kernel[0];
    w.kernel[1] = o.kernel[1];
    w.ceil_mode = o.ceil_mode;
  }
  return w;
}

// What a window op's operands are, for the words of its faults.
struct WindowOperands {
  const Tensor& x;
  const Tensor* w;  // none for pooling
  bool transposed;
  std::array<std::int64_t, 4> xd;  // x's N, C, H, W
};

// Throws the host's words for the rule's fault, if any.
void check_window(Builder& b, const fw::WindowVerdict& v, const fw::Window& win, const WindowOperands& op) {
  using F = fw::WindowFault;
  const std::string most = std::to_string(fw::kMaxWindowValue);
  switch (v.fault) {
    case F::kNone: return;
    case F::kKernel: b.fail(Status::InvalidArgument, "kernel " + std::to_string(v.got) + " must be 1 to " + most);
    case F::kStride:
    case F::kDilation: b.fail(Status::InvalidArgument, "strides and dilations must be 1 to " + most);
    case F::kPad: b.fail(Status::InvalidArgument, "pad " + std::to_string(v.got) + " is above " + most);
    case F::kPadPastWindow:
      b.fail(Status::InvalidArgument, "pads (" + std::to_string(win.pad[v.at]) + ", " +
                                          std::to_string(win.pad[v.at + 2]) + ") must be smaller than the window (" +
                                          std::to_string(v.want) + ")");
    case F::kGroups:
      b.fail(Status::InvalidArgument,
             "groups " + std::to_string(win.groups) + " must divide the input channels (" + std::to_string(op.xd[1]) +
                 ")" + (op.transposed ? "" : " and output channels (" + std::to_string(op.w->shape()[0]) + ")"));
    case F::kWeight:
      b.fail(Status::InvalidArgument, "w has shape " + dims_text(op.w->shape()) +
                                          (op.transposed ? "; its dimension 0 must be the input channels, "
                                                         : "; its dimension 1 must be input channels / groups = ") +
                                          std::to_string(v.want));
    case F::kEmptyInput:
      b.fail(Status::InvalidArgument,
             "x " + dims_text(op.x.shape()) + " and w " + dims_text(op.w->shape()) + " must not be empty");
    case F::kOutput: b.fail(Status::InvalidArgument, "y has the wrong shape");  // each builder words its own
    case F::kEmptyWindow: {
      const std::uint32_t k = v.at;
      b.fail(Status::InvalidArgument,
             "window " + std::to_string(v.got) + (k == 0 ? " down" : " across") + " x has no tap inside x (kernel " +
                 std::to_string(win.kernel[k]) + ", dilation " + std::to_string(win.dilation[k]) + ", pad " +
                 std::to_string(win.pad[k]) + ", x extent " + std::to_string(op.xd[2 + k]) + ")");
    }
  }
}

// Checks x, w, y of a convolution.
void check_conv(Builder& b, const Tensor& x, const Tensor& w, const Tensor& y, const Conv2dOptions& o) {
  const auto xd = nchw(b, x, o.layout, "x");
  if (w.rank() != 4)
    b.fail(Status::InvalidArgument,
           "w has rank " + std::to_string(w.rank()) + "; expected 4 [Cout, Cin/groups, kh, kw]");
  const fw::Window win = window_of(o);
  const WindowOperands op{x, &w, false, xd};
  const ConvDims d = conv_dims(xd, w);
  const fw::WindowVerdict v = fw::conv_shape(win, d.x, d.w);
  check_window(b, v, win, op);
  check_window(b, fw::window_values(win, false), win, op);
  if (v.out[2] == 0 || v.out[3] == 0)
    b.fail(Status::InvalidArgument, "a " + std::to_string(d.w[2]) + "x" + std::to_string(d.w[3]) +
                                        " kernel does not fit the padded " + std::to_string(xd[2]) + "x" +
                                        std::to_string(xd[3]) + " input");
  b.shape_is(y, "y", make_shape(o.layout, v.out[0], v.out[1], v.out[2], v.out[3]),
             "from x " + dims_text(x.shape()) + ", w " + dims_text(w.shape()) + ", strides, pads and dilations");
}

driver::ConvAttrs conv_attrs(const Conv2dOptions& o) {
  driver::ConvAttrs a;
  a.layout = o.layout;
  a.groups = o.groups;
  a.strides = o.strides;
  a.dilations = o.dilations;
  a.pads = o.pads;
  a.activation = o.activation;
  a.accumulate = o.accumulate;
  return a;
}

// Only conv2d accumulates into y.
void refuse_accumulate(Builder& b, const Conv2dOptions& o) {
  if (o.accumulate) b.fail(Status::InvalidArgument, "does not accumulate into y (conv2d does)");
}

// Checks a [..., M, K] @ b [..., K, N] -> y [..., M, N] and returns the
// views of a and b broadcast to y's batch dimensions.
std::pair<TensorArg, TensorArg> matmul_views(Builder& bd, const Tensor& a, const Tensor& b, const Tensor& y, bool ta,
                                             bool tb, const char* an = "a", const char* bn = "b") {
  if (a.rank() < 2 || b.rank() < 2 || y.rank() < 2)
    bd.fail(Status::InvalidArgument, "operands need rank 2 or more (a " + dims_text(a.shape()) + ", b " +
                                         dims_text(b.shape()) + ", y " + dims_text(y.shape()) + "); reshape 1-D ones");
  const auto& as = a.shape();
  const auto& bs = b.shape();
  const std::int64_t m = ta ? as[as.size() - 1] : as[as.size() - 2];
  const std::int64_t k = ta ? as[as.size() - 2] : as[as.size() - 1];
  const std::int64_t kb = tb ? bs[bs.size() - 1] : bs[bs.size() - 2];
  const std::int64_t n = tb ? bs[bs.size() - 2] : bs[bs.size() - 1];
  if (k != kb)
    bd.fail(Status::InvalidArgument, std::string(an) + " " + dims_text(as) + " and " + bn + " " + dims_text(bs) +
                                         " disagree on the inner dimension (" + std::to_string(k) + " vs " +
                                         std::to_string(kb) + ")");
  // Batch dimensions broadcast like NumPy.
  const std::size_t batch = std::max(as.size(), bs.size()) - 2;
  std::vector<std::int64_t> want(batch + 2);
  for (std::size_t i = 0; i < batch; ++i) {
    const std::int64_t da = i + as.size() >= batch + 2 ? as[i + as.size() - batch - 2] : 1;
    const std::int64_t db = i + bs.size() >= batch + 2 ? bs[i + bs.size() - batch - 2] : 1;
    if (da != db && da != 1 && db != 1)
      bd.fail(Status::InvalidArgument, std::string(an) + " " + dims_text(as) + " and " + bn + " " + dims_text(bs) +
                                           " have batch dimensions that do not broadcast");
    want[i] = da == 1 ? db : da;  // 1 stretches to the other, 0 included
  }
  want[batch] = m;
  want[batch + 1] = n;
  bd.shape_is(y, "y", want, std::string("from ") + an + " and " + bn);
  auto view = [&](const Tensor& t, const char* role, std::int64_t r0, std::int64_t r1) {
    std::vector<std::int64_t> shape = want;
    shape[batch] = r0;
    shape[batch + 1] = r1;
    std::vector<std::int64_t> strides(shape.size(), 0);
    const auto& ts = t.shape();
    const std::size_t skip = shape.size() - ts.size();
    for (std::size_t i = 0; i < ts.size(); ++i)
      strides[skip + i] = (ts[i] == 1 && shape[skip + i] != 1) ? 0 : t.strides()[i];
    return bd.arg(t, role, shape, strides);
  };
  return {view(a, an, as[as.size() - 2], as[as.size() - 1]), view(b, bn, bs[bs.size() - 2], bs[bs.size() - 1])};
}

std::pair<TensorArg, TensorArg> Builder::matmul(const Tensor& a, const char* a_role, const Tensor& b,
                                                const char* b_role, const Tensor& y) {
  return matmul_views(*this, a, b, y, false, false, a_role, b_role);
}

TensorArg Builder::matmul_param(const Tensor& t, const char* role, const TensorArg& of, bool per_row) {
  std::vector<std::int64_t> shape(of.rank);
  for (std::uint32_t i = 0; i < of.rank; ++i) shape[i] = static_cast<std::int64_t>(of.shape[i]);
  std::vector<std::int64_t> strides(of.rank, 0);
  if (t.elements() == 1) return arg(t, role, shape, strides);
  const std::uint32_t dim = per_row ? of.rank - 2 : of.rank - 1;
  if (t.rank() != 1 || t.shape()[0] != shape[dim])
    fail(Status::InvalidArgument, std::string(role) + " has shape " + dims_text(t.shape()) +
                                      "; expected a scalar or [" + std::to_string(shape[dim]) + "] (one per " +
                                      (per_row ? "row" : "column") + ")");
  strides[dim] = t.strides()[0];
  return arg(t, role, shape, strides);
}

Op elementwise(driver::ElementwiseOp op, const char* name, const Tensor& a, const Tensor* b, const Tensor& y,
               ActivationParams act = {}) {
  Builder bd(driver::OpKind::Elementwise, name);
  const bool floats_only = driver::is_float_only(op);
  const bool compare = driver::is_comparison(op);
  const bool logic = driver::is_logical(op);
  if (op != driver::ElementwiseOp::Identity) {
    if (floats_only) bd.dtype_in(a, b ? "a" : "x", kFloats);
    if (logic) bd.dtype_in(a, b ? "a" : "x", {DType::U8});
    if (compare || logic)
      bd.dtype_in(y, "y", {DType::U8});
    else
      bd.same_dtype(y, "y", a, b ? "a" : "x");
    if (b) bd.same_dtype(*b, "b", a, "a");
  }
  if (op == driver::ElementwiseOp::Activation) bd.activation(act);
  std::vector<TensorArg> t;
  t.push_back(bd.broadcast(a, b ? "a" : "x", y.shape()));
  t.push_back(b ? bd.broadcast(*b, "b", y.shape()) : bd.absent());
  t.push_back(bd.arg(y, "y"));
  bd.desc().attrs = driver::ElementwiseAttrs{op, act};
  return bd.finish(std::move(t));
}

Op pool(bool max, const Tensor& x, const Tensor& y, const Pool2dOptions& o) {
  Builder b(driver::OpKind::Pool2d, max ? "max_pool2d" : "avg_pool2d");
  if (max)
    b.dtype_in(x, "x", {DType::F32, DType::F16, DType::BF16, DType::I8, DType::U8});
  else
    b.dtype_in(x, "x", kFloats);
  b.same_dtype(y, "y", x, "x");
  const auto xd = nchw(b, x, o.layout, "x");
  const fw::Window win = window_of(o);
  const WindowOperands op{x, nullptr, false, xd};
  check_window(b, fw::window_values(win, true), win, op);
  Dims4 xs;
  to_dims(xd, xs);
  const fw::WindowVerdict v = fw::pool_shape(win, xs);
  if (v.ok() && (v.out[2] == 0 || v.out[3] == 0))
    b.fail(Status::InvalidArgument, "the window does not fit the padded input");
  check_window(b, v, win, op);
  b.shape_is(y, "y", make_shape(o.layout, v.out[0], v.out[1], v.out[2], v.out[3]),
             "from x, kernel, strides, pads and ceil_mode");
  driver::PoolAttrs a;
  a.max = max;
  a.layout = o.layout;
  a.kernel = o.kernel;
  a.strides = o.strides;
  a.dilations = o.dilations;
  a.pads = o.pads;
  a.ceil_mode = o.ceil_mode;
  a.count_include_pad = o.count_include_pad;
  b.desc().attrs = a;
  return b.finish({b.arg(x, "x"), b.arg(y, "y")});
}

}  // namespace

std::array<std::uint32_t, 2> same_pads(std::uint32_t input, std::uint32_t kernel, std::uint32_t stride,
                                       std::uint32_t dilation, bool lower) {
  if (stride == 0 || dilation == 0 || kernel == 0)
    throw Error(Status::InvalidArgument, "same_pads: kernel, stride and dilation must be at least 1");
  const std::uint64_t out = (input + stride - 1) / stride;
  const std::uint64_t window = std::uint64_t{dilation} * (kernel - 1) + 1;
  const std::int64_t need = static_cast<std::int64_t>((out - 1) * stride + window) - static_cast<std::int64_t>(input);
  const auto total = static_cast<std::uint32_t>(std::max<std::int64_t>(need, 0));
  const std::uint32_t small = total / 2, big = total - small;
  return lower ? std::array<std::uint32_t, 2>{big, small} : std::array<std::uint32_t, 2>{small, big};
}

Op matmul(const Tensor& a, const Tensor& b, const Tensor& y, const MatMulOptions& o) {
  Builder bd(driver::OpKind::MatMul, "matmul");
  bd.dtype_in(a, "a", kFloats);
  bd.same_dtype(b, "b", a, "a");
  if (y.dtype() != a.dtype() && y.dtype() != DType::F32)
    bd.fail(Status::InvalidArgument,
            std::string("y is ") + to_string(y.dtype()) + "; it must be " + to_string(a.dtype()) + " like a, or f32");
  if (!std::isfinite(o.alpha) || !std::isfinite(o.beta))
    bd.fail(Status::InvalidArgument, "alpha and beta must be finite");
  bd.activation(o.activation);
  auto [va, vb] = matmul_views(bd, a, b, y, o.transpose_a, o.transpose_b);
  TensorArg c = bd.absent();
  if (o.c) {
    bd.dtype_in(*o.c, "c", kFloats);
    c = bd.broadcast(*o.c, "c", y.shape());
  }
  driver::MatMulAttrs at;
  at.transpose_a = o.transpose_a;
  at.transpose_b = o.transpose_b;
  at.alpha = o.alpha;
  at.beta = o.beta;
  at.activation = o.activation;
  bd.desc().attrs = at;
  return bd.finish({va, vb, c, bd.arg(y, "y")});
}

Op conv2d(const Tensor& x, const Tensor& w, const Tensor& y, const Conv2dOptions& o) {
  Builder b(driver::OpKind::Conv2d, "conv2d");
  b.dtype_in(x, "x", kFloats);
  b.same_dtype(w, "w", x, "x");
  b.same_dtype(y, "y", x, "x");
  b.activation(o.activation);
  check_conv(b, x, w, y, o);
  TensorArg bias = b.absent();
  if (o.bias) {
    b.dtype_in(*o.bias, "bias", kFloats);
    b.shape_is(*o.bias, "bias", {w.shape()[0]}, "one per output channel");
    bias = b.arg(*o.bias, "bias");
  }
  b.desc().attrs = conv_attrs(o);
  return b.finish({b.arg(x, "x"), b.arg(w, "w"), bias, b.arg(y, "y")});
}

Op conv_transpose2d(const Tensor& x, const Tensor& w, const Tensor& y, const Conv2dOptions& o) {
  Builder b(driver::OpKind::ConvTranspose2d, "conv_transpose2d");
  refuse_accumulate(b, o);
  b.dtype_in(x, "x", kFloats);
  b.same_dtype(w, "w", x, "x");
  b.same_dtype(y, "y", x, "x");
  b.activation(o.activation);
  const auto xd = nchw(b, x, o.layout, "x");
  if (w.rank() != 4)
    b.fail(Status::InvalidArgument,
           "w has rank " + std::to_string(w.rank()) + "; expected 4 [Cin, Cout/groups, kh, kw]");
  const fw::Window win = window_of(o);
  const WindowOperands op{x, &w, true, xd};
  const ConvDims d = conv_dims(xd, w);
  const fw::WindowVerdict v = fw::conv_transpose_shape(win, d.x, d.w);
  check_window(b, v, win, op);
  check_window(b, fw::window_values(win, false), win, op);
  if (v.empty[0] || v.empty[1])
    b.fail(Status::InvalidArgument,
           "x " + dims_text(x.shape()) + " and w " + dims_text(w.shape()) + " must not be empty");
  Dims4 ys;
  to_dims(nchw(b, y, o.layout, "y"), ys);
  const fw::WindowVerdict out = fw::check_window_output(v, ys);
  if (out.fault == fw::WindowFault::kOutput) {
    const std::uint32_t k = out.at == 3 ? 1 : 0;  // the axis the expected shape shows
    const auto least = [&](std::uint32_t dim) {
      return static_cast<std::int64_t>(dim == 2 + k ? v.out[dim] : ys[dim]);
    };
    b.fail(Status::InvalidArgument,
           "y has shape " + dims_text(y.shape()) + "; expected " +
               dims_text(make_shape(o.layout, v.out[0], v.out[1], least(2), least(3))) +
               (v.slack[k] ? " (plus up to " + std::to_string(v.slack[k]) + " output padding along H and W)" : "") +
               " from x " + dims_text(x.shape()) + ", w " + dims_text(w.shape()) + ", strides, pads and dilations");
  }
  check_window(b, out, win, op);
  const std::int64_t cout = v.out[1];
  TensorArg bias = b.absent();
  if (o.bias) {
    b.dtype_in(*o.bias, "bias", kFloats);
    b.shape_is(*o.bias, "bias", {cout}, "one per output channel");
    bias = b.arg(*o.bias, "bias");
  }
  b.desc().attrs = conv_attrs(o);
  return b.finish({b.arg(x, "x"), b.arg(w, "w"), bias, b.arg(y, "y")});
}

Op max_pool2d(const Tensor& x, const Tensor& y, const Pool2dOptions& o) { return pool(true, x, y, o); }
Op avg_pool2d(const Tensor& x, const Tensor& y, const Pool2dOptions& o) { return pool(false, x, y, o); }

#include "op_map_builders.inc"   // add, sub, ... logical_not: the schema's maps
#include "op_kind_builders.inc"  // cumsum, ...: the kinds with rules

Op activation(const Tensor& x, const Tensor& y, const ActivationParams& act) {
  return elementwise(driver::ElementwiseOp::Activation, "activation", x, nullptr, y, act);
}
Op relu(const Tensor& x, const Tensor& y) { return activation(x, y, ActivationParams::relu()); }
Op cast(const Tensor& x, const Tensor& y) {
  return elementwise(driver::ElementwiseOp::Identity, "cast", x, nullptr, y);
}

Op transpose(const Tensor& x, const Tensor& y, const std::vector<std::size_t>& perm) {
  Builder b(driver::OpKind::Elementwise, "transpose");
  b.same_dtype(y, "y", x, "x");
  Tensor view = [&] {
    try {
      return x.permute(perm);
    } catch (const Error& e) {
      b.fail(e.status(), e.what());
    }
  }();
  b.shape_is(y, "y", view.shape(), "x's shape permuted");
  b.desc().attrs = driver::ElementwiseAttrs{driver::ElementwiseOp::Identity, {}};
  return b.finish({b.arg(view, "x"), b.absent(), b.arg(y, "y")});
}

namespace {

// A conv zero point or scale: for x a scalar; for w a scalar or one per
// output channel; for y a scalar.
TensorArg conv_param(Builder& b, const std::optional<Tensor>& t, const char* role, const Tensor& of, bool per_channel) {
  if (!t) return b.absent();
  std::vector<std::int64_t> strides(of.rank(), 0);
  if (t->elements() == 1) return b.arg(*t, role, of.shape(), strides);
  if (!per_channel || t->rank() != 1 || t->shape()[0] != of.shape()[0])
    b.fail(Status::InvalidArgument,
           std::string(role) + " has shape " + dims_text(t->shape()) + "; expected a scalar" +
               (per_channel ? " or one per output channel [" + std::to_string(of.shape()[0]) + "]" : std::string{}));
  strides[0] = t->strides()[0];
  return b.arg(*t, role, of.shape(), strides);
}

}  // namespace

Op conv_integer(const Tensor& x, const Tensor& w, const Tensor& y, const std::optional<Tensor>& x_zero_point,
                const std::optional<Tensor>& w_zero_point, const Conv2dOptions& o) {
  Builder b(driver::OpKind::ConvInteger, "conv_integer");
  refuse_accumulate(b, o);
  b.dtype_in(x, "x", kInt8);
  b.dtype_in(w, "w", kInt8);
  b.dtype_in(y, "y", {DType::I32});
  if (o.activation.kind != Activation::None || o.bias)
    b.fail(Status::InvalidArgument, "takes no activation and no bias");
  if (x_zero_point) b.same_dtype(*x_zero_point, "x_zero_point", x, "x");
  if (w_zero_point) b.same_dtype(*w_zero_point, "w_zero_point", w, "w");
  check_conv(b, x, w, y, o);
  b.desc().attrs = conv_attrs(o);
  return b.finish({b.arg(x, "x"), b.arg(w, "w"), conv_param(b, x_zero_point, "x_zero_point", x, false),
                   conv_param(b, w_zero_point, "w_zero_point", w, true), b.arg(y, "y")});
}

namespace {

// An operand of a qlinear op with its scale and zero point.
struct Quantized {
  const Tensor& t;
  const Tensor& scale;
  const Tensor& zero_point;
  const char* role;
};

// The types every qlinear op takes, in this order: each operand i8 or u8,
// each scale f32 ("<role>_scale"), each zero point of its operand's type
// ("<role>_zero_point").
void quantized_types(Builder& b, std::initializer_list<Quantized> operands) {
  for (const Quantized& q : operands) b.dtype_in(q.t, q.role, kInt8);
  for (const Quantized& q : operands) b.dtype_in(q.scale, (std::string(q.role) + "_scale").c_str(), {DType::F32});
  for (const Quantized& q : operands)
    b.same_dtype(q.zero_point, (std::string(q.role) + "_zero_point").c_str(), q.t, q.role);
}

}  // namespace

Op qlinear_conv(const Tensor& x, const Tensor& x_scale, const Tensor& x_zero_point, const Tensor& w,
                const Tensor& w_scale, const Tensor& w_zero_point, const Tensor& y_scale, const Tensor& y_zero_point,
                const Tensor& y, const Conv2dOptions& o) {
  Builder b(driver::OpKind::QLinearConv, "qlinear_conv");
  refuse_accumulate(b, o);
  quantized_types(b,
                  {{x, x_scale, x_zero_point, "x"}, {w, w_scale, w_zero_point, "w"}, {y, y_scale, y_zero_point, "y"}});
  if (o.activation.kind != Activation::None) b.fail(Status::InvalidArgument, "takes no activation");
  check_conv(b, x, w, y, o);
  TensorArg bias = b.absent();
  if (o.bias) {
    b.dtype_in(*o.bias, "bias", {DType::I32});
    b.shape_is(*o.bias, "bias", {w.shape()[0]}, "one per output channel");
    bias = b.arg(*o.bias, "bias");
  }
  std::vector<TensorArg> t{b.arg(x, "x"),
                           conv_param(b, x_scale, "x_scale", x, false),
                           conv_param(b, x_zero_point, "x_zero_point", x, false),
                           b.arg(w, "w"),
                           conv_param(b, w_scale, "w_scale", w, true),
                           conv_param(b, w_zero_point, "w_zero_point", w, true),
                           conv_param(b, y_scale, "y_scale", y, false),
                           conv_param(b, y_zero_point, "y_zero_point", y, false),
                           bias,
                           b.arg(y, "y")};
  b.desc().attrs = conv_attrs(o);
  return b.finish(std::move(t));
}

Op resize(const Tensor& x, const Tensor& y, const ResizeOptions& o) {
  Builder b(driver::OpKind::Resize, "resize");
  b.dtype_in(x, "x", {DType::F32, DType::F16, DType::BF16, DType::U8, DType::I8});
  b.same_dtype(y, "y", x, "x");
  const auto [n, c, h, w] = nchw(b, x, o.layout, "x");
  const auto [yn, yc, yh, yw] = nchw(b, y, o.layout, "y");
  if (yn != n || yc != c)
    b.fail(Status::InvalidArgument,
           "y " + dims_text(y.shape()) + " must keep x's batch and channels " + dims_text(x.shape()));
  if (h == 0 || w == 0 || yh == 0 || yw == 0) b.fail(Status::InvalidArgument, "empty images cannot be resized");
  std::array<float, 2> scales = o.scales.value_or(std::array<float, 2>{static_cast<float>(yh) / static_cast<float>(h),
                                                                       static_cast<float>(yw) / static_cast<float>(w)});
  for (float s : scales)
    if (!fw::resize_scale_ok(s))
      b.fail(Status::InvalidArgument, "scale " + std::to_string(s) + " must be positive and finite");
  driver::ResizeAttrs a;
  a.mode = o.mode;
  a.coordinate = o.coordinate;
  a.nearest = o.nearest;
  a.layout = o.layout;
  a.scales = scales;
  b.desc().attrs = a;
  return b.finish({b.arg(x, "x"), b.arg(y, "y")});
}

namespace {
Op color(ColorFormat format, const Tensor& luma, const Tensor& c1, const Tensor* c2, const Tensor& y,
         const ColorConvertOptions& o) {
  Builder b(driver::OpKind::ColorConvert, format == ColorFormat::NV12 ? "nv12_to_rgb" : "i420_to_rgb");
  b.dtype_in(luma, "luma", {DType::U8});
  b.dtype_in(c1, format == ColorFormat::NV12 ? "chroma" : "u", {DType::U8});
  if (c2) b.dtype_in(*c2, "v", {DType::U8});
  b.dtype_in(y, "y", {DType::F32, DType::F16, DType::BF16, DType::U8});
  if (luma.rank() != 2)
    b.fail(Status::InvalidArgument, "luma has shape " + dims_text(luma.shape()) + "; expected [H, W]");
  // The planes' shapes are fw/planes.h's, which the board's decoder reads too.
  const auto h = static_cast<std::uint64_t>(luma.shape()[0]), w = static_cast<std::uint64_t>(luma.shape()[1]);
  if (!fw::luma_even(h, w))
    b.fail(Status::InvalidArgument, "luma " + dims_text(luma.shape()) + " must have even height and width");
  const fw::ColorPlanes planes = fw::color_planes(format == ColorFormat::NV12, h, w);
  const auto shape = [](const std::uint64_t* dims, std::uint32_t rank) {
    return std::vector<std::int64_t>(dims, dims + rank);
  };
  if (format == ColorFormat::NV12)
    b.shape_is(c1, "chroma", shape(planes.chroma, planes.chroma_rank), "interleaved U and V at half resolution");
  else {
    b.shape_is(c1, "u", shape(planes.chroma, planes.chroma_rank), "half resolution");
    b.shape_is(*c2, "v", shape(planes.chroma, planes.chroma_rank), "half resolution");
  }
  b.shape_is(y, "y", shape(planes.y, 3), "planar RGB");
  for (int k = 0; k < 3; ++k)
    if (!std::isfinite(o.mean[k]) || !std::isfinite(o.scale[k]))
      b.fail(Status::InvalidArgument, "mean and scale must be finite");
  driver::ColorConvertAttrs a;
  a.format = format;
  a.mean = o.mean;
  a.scale = o.scale;
  b.desc().attrs = a;
  return b.finish(
      {b.arg(luma, "luma"), b.arg(c1, c2 ? "u" : "chroma"), c2 ? b.arg(*c2, "v") : b.absent(), b.arg(y, "y")});
}
}  // namespace

Op nv12_to_rgb(const Tensor& luma, const Tensor& chroma, const Tensor& y, const ColorConvertOptions& o) {
  return color(ColorFormat::NV12, luma, chroma, nullptr, y, o);
}
Op i420_to_rgb(const Tensor& luma, const Tensor& u, const Tensor& v, const Tensor& y, const ColorConvertOptions& o) {
  return color(ColorFormat::I420, luma, u, &v, y, o);
}

}  // namespace ops
}  // namespace tpuhal
