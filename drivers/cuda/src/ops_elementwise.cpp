// Launchers of the elementwise family (ops.h): elementwise maps (casts and
// transposes among them), where, cumsum.
#include "ops.h"

#include "../kernels/elementwise.h"

namespace tpuhal::cuda {
namespace {

using driver::ElementwiseOp;

static_assert(k::kActNone == static_cast<std::uint32_t>(Activation::None) &&
              k::kActRelu == static_cast<std::uint32_t>(Activation::Relu) &&
              k::kActClip == static_cast<std::uint32_t>(Activation::Clip) &&
              k::kActSigmoid == static_cast<std::uint32_t>(Activation::Sigmoid) &&
              k::kActSilu == static_cast<std::uint32_t>(Activation::Silu) &&
              k::kActLeakyRelu == static_cast<std::uint32_t>(Activation::LeakyRelu) &&
              k::kActTanh == static_cast<std::uint32_t>(Activation::Tanh) &&
              k::kActHardSigmoid == static_cast<std::uint32_t>(Activation::HardSigmoid) &&
              k::kActHardSwish == static_cast<std::uint32_t>(Activation::HardSwish));

// The kernels' name for each map. No default: a new ElementwiseOp fails
// the build here (-Wswitch) until it has one.
k::MapOp map_op(ElementwiseOp op) {
  switch (op) {
    case ElementwiseOp::Identity:  // run_map copies or casts it before asking
    case ElementwiseOp::Add: return k::kMapAdd;
    case ElementwiseOp::Sub: return k::kMapSub;
    case ElementwiseOp::Mul: return k::kMapMul;
    case ElementwiseOp::Div: return k::kMapDiv;
    case ElementwiseOp::Max: return k::kMapMax;
    case ElementwiseOp::Min: return k::kMapMin;
    case ElementwiseOp::Mod: return k::kMapMod;
    case ElementwiseOp::Fmod: return k::kMapFmod;
    case ElementwiseOp::Activation: return k::kMapActivation;
    case ElementwiseOp::Abs: return k::kMapAbs;
    case ElementwiseOp::Neg: return k::kMapNeg;
    case ElementwiseOp::Exp: return k::kMapExp;
    case ElementwiseOp::Log: return k::kMapLog;
    case ElementwiseOp::Sqrt: return k::kMapSqrt;
    case ElementwiseOp::Erf: return k::kMapErf;
    case ElementwiseOp::Ceil: return k::kMapCeil;
    case ElementwiseOp::Floor: return k::kMapFloor;
    case ElementwiseOp::Round: return k::kMapRound;
    case ElementwiseOp::Sin: return k::kMapSin;
    case ElementwiseOp::Cos: return k::kMapCos;
    case ElementwiseOp::Tan: return k::kMapTan;
    case ElementwiseOp::Asin: return k::kMapAsin;
    case ElementwiseOp::Acos: return k::kMapAcos;
    case ElementwiseOp::Atan: return k::kMapAtan;
    case ElementwiseOp::Sinh: return k::kMapSinh;
    case ElementwiseOp::Cosh: return k::kMapCosh;
    case ElementwiseOp::Asinh: return k::kMapAsinh;
    case ElementwiseOp::Acosh: return k::kMapAcosh;
    case ElementwiseOp::Atanh: return k::kMapAtanh;
    case ElementwiseOp::Equal: return k::kMapEqual;
    case ElementwiseOp::Less: return k::kMapLess;
    case ElementwiseOp::LessOrEqual: return k::kMapLessOrEqual;
    case ElementwiseOp::Greater: return k::kMapGreater;
    case ElementwiseOp::GreaterOrEqual: return k::kMapGreaterOrEqual;
    case ElementwiseOp::And: return k::kMapAnd;
    case ElementwiseOp::Or: return k::kMapOr;
    case ElementwiseOp::Xor: return k::kMapXor;
    case ElementwiseOp::Not: return k::kMapNot;
  }
  return k::kMapAdd;
}

bool is_float(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16; }

// The dtype rules the map kernels rely on (the HAL's builders enforce
// them; an OpDesc made otherwise is refused, not misread).
std::string refuse_map(const driver::OpDesc& op) {
  const auto& at = std::get<driver::ElementwiseAttrs>(op.attrs);
  if (at.op == ElementwiseOp::Identity) return {};
  const driver::TensorArg &a = op.tensors[0], &b = op.tensors[1], &y = op.tensors[2];
  const bool binary = k::map_is_binary(map_op(at.op));
  if (binary && (!b.present() || b.dtype != a.dtype)) return op_in(op, a.dtype) + " (a and b of different dtypes)";
  if (driver::is_logical(at.op) && a.dtype != DType::U8) return op_in(op, a.dtype) + " (logic takes u8)";
  if (driver::is_comparison(at.op) || driver::is_logical(at.op))
    return y.dtype == DType::U8 ? std::string() : op_in(op, y.dtype) + " (the result of a comparison is u8)";
  if (y.dtype != a.dtype) return op_in(op, y.dtype) + " (y of a dtype other than its operands')";
  if (driver::is_float_only(at.op) && !is_float(a.dtype)) return op_in(op, a.dtype) + " (a float map)";
  return {};
}

CUresult run_map(const Kernels& kernels, CUstream stream, const driver::OpDesc& op) {
  const auto& at = std::get<driver::ElementwiseAttrs>(op.attrs);
  const k::Tensor a = tensor_of(op.tensors[0]), b = tensor_of(op.tensors[1]), y = tensor_of(op.tensors[2]);
  if (at.op == ElementwiseOp::Identity) {
    const k::ConvertParams p{k::numel(y), a, y};
    return kernels.launch(stream, a.dtype == y.dtype ? "ew_copy" : "ew_cast", p);
  }
  k::MapParams p{};
  p.n = k::numel(y);
  p.a = a;
  p.b = b;
  p.y = y;
  p.op = map_op(at.op);
  p.act = static_cast<std::uint32_t>(at.activation.kind);
  p.alpha = at.activation.alpha;
  p.beta = at.activation.beta;
  const char* kernel = driver::is_comparison(at.op) || driver::is_logical(at.op) ? "ew_compare"
                       : k::is_float(a.dtype)                                    ? "ew_float"
                                                                                 : "ew_int";
  return kernels.launch(stream, kernel, p);
}

CUresult run_cumsum(const Kernels& kernels, CUstream stream, const driver::OpDesc& op) {
  const auto& at = std::get<driver::CumSumAttrs>(op.attrs);
  k::CumSumParams p{};
  p.x = tensor_of(op.tensors[0]);
  p.y = tensor_of(op.tensors[1]);
  p.len = p.x.shape[at.axis];
  p.x_step = p.x.strides[at.axis];
  p.y_step = p.y.strides[at.axis];
  p.x.shape[at.axis] = 1;
  p.y.shape[at.axis] = 1;
  p.n = p.len == 0 ? 0 : k::numel(p.x);
  p.exclusive = at.exclusive ? 1 : 0;
  p.reverse = at.reverse ? 1 : 0;
  return kernels.launch(stream, "cumsum", p);
}

}  // namespace

std::string refuse_elementwise(const driver::OpDesc& op) {
  switch (op.kind) {
    case driver::OpKind::Where: return {};
    case driver::OpKind::Elementwise: return refuse_map(op);
    case driver::OpKind::CumSum: {
      const DType t = op.tensors[0].dtype;
      return is_float(t) || t == DType::I32 ? std::string() : op_in(op, t) + " (cumsum takes floats and i32)";
    }
    default: return op.name + " (not an elementwise kind)";
  }
}

CUresult run_elementwise(const Kernels& kernels, CUstream stream, const driver::OpDesc& op, const k::Fault&) {
  switch (op.kind) {
    case driver::OpKind::Where: {
      k::WhereParams p{};
      tensors_of(op, {&p.cond, &p.a, &p.b, &p.y});
      p.n = k::numel(p.y);
      return kernels.launch(stream, "where", p);
    }
    case driver::OpKind::Elementwise: return run_map(kernels, stream, op);
    case driver::OpKind::CumSum: return run_cumsum(kernels, stream, op);
    default: return CUDA_ERROR_NOT_SUPPORTED;
  }
}

}  // namespace tpuhal::cuda
