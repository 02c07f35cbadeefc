#include "tpuhal/fw/timing.h"

#include <algorithm>
#include <cstddef>
#include <optional>
#include <variant>

namespace tpuhal::fw {
namespace {

__extension__ typedef unsigned __int128 u128;  // products of counts and rates, without overflow

constexpr std::uint64_t kSaturated = UINT64_MAX / 4;  // a time no command reaches; sums of a few stay finite

std::uint64_t clamp64(u128 v) noexcept { return v > kSaturated ? kSaturated : static_cast<std::uint64_t>(v); }
// ceil(a / b), b > 0.
std::uint64_t div_up(u128 a, u128 b) noexcept { return clamp64((a + b - 1) / b); }
std::uint64_t round_up(std::uint64_t v, std::uint64_t to) noexcept { return to ? div_up(v, to) * to : v; }
std::uint64_t mul(std::uint64_t a, std::uint64_t b) noexcept { return clamp64(u128{a} * b); }

std::uint32_t idx(MacPrecision p) noexcept { return static_cast<std::uint32_t>(p); }

const TensorRef& tensor(const OpBlock& op, std::size_t i) noexcept { return op.tensors[i]; }
const TensorRef& output(const OpBlock& op) noexcept { return op.tensors[op.num_tensors - 1]; }
std::uint64_t dim(const TensorRef& t, std::uint32_t i) noexcept { return i < t.rank ? t.shape[i] : 1; }

std::uint32_t weight_tensors(OpKind kind);

std::optional<bool> sliced_by_rule(const OpBlock& op, std::uint32_t i) noexcept;  // op_timing.inc

// An output the op also reads (a convolution accumulating into it) moves
// twice, in and out.
std::uint64_t passes(const OpBlock& op, std::uint32_t i) noexcept {
  return (read_mask(op) & op_kind_info(op.kind).written) >> i & 1 ? 2 : 1;
}

// What the op moves through device memory: each tensor once, the bytes it
// spans (a broadcast operand, stride 0, only what it holds), except
// activations whose slice fits the local memory's share for one tensor (a
// quarter of all lanes' local memory): a compiler keeps those on chip
// between the layers of a group, running the group slice by slice along the
// output's first dimension (the images of a batch, the rows of a matrix).
// A tensor is sliced with the output where each slice of the output reads
// only the same slice of it (sliced_with_output), and a slice is what one
// index of that dimension spans (of a strided view, not the stride); any
// other tensor is needed whole. Weights always stream from device memory.
bool sliced_with_output(const OpBlock& op, std::uint32_t i, std::uint64_t rows) noexcept {
  const TensorRef& t = op.tensors[i];
  const TensorRef& y = output(op);
  if (t.rank < 2 || dim(t, 0) != rows) return false;
  switch (op.kind) {
    case OpKind::kMatMul:
    case OpKind::kMatMulInteger:
    case OpKind::kQLinearMatMul: {
      // B [K, N] serves every row; a batch of matrices [..., K, N] slices
      // with the batch.
      const std::uint32_t b = op.kind == OpKind::kQLinearMatMul ? 3 : 1;
      return i != b || (t.rank >= 3 && t.rank == y.rank);
    }
    case OpKind::kGather:  // along axis 0 each output row reads any row of X
      return !(i == 0 && std::get<GatherAttrs>(op.attrs).axis == 0);
    default: return sliced_by_rule(op, i).value_or(true);
  }
}

// A global op (kOpGlobal) runs on its own, DDR to DDR: every tensor
// streams from device memory, and one whose innermost dimension (its last
// of more than one element) is not contiguous, the gathered side of a
// permute, moves one element per DRAM burst.
std::uint64_t global_bytes(const OpBlock& op) noexcept {
  std::uint64_t bytes = 0;
  for (std::uint32_t i = 0; i < op.num_tensors; ++i) {
    const TensorRef& t = op.tensors[i];
    if (static_cast<DType>(t.dtype) == DType::kNone) continue;
    std::uint32_t d = t.rank;
    while (d > 0 && t.shape[d - 1] == 1) --d;
    const bool gathered = d > 0 && t.strides[d - 1] != 0 && t.strides[d - 1] != 1;
    const std::uint64_t width = dtype_size(static_cast<DType>(t.dtype));
    bytes = clamp64(u128{bytes} +
                    u128{passes(op, i)} *
                        (gathered ? mul(tensor_elements(t), std::max(kDramBurstBytes, width)) : op.extent[i]));
  }
  return bytes;
}

std::uint64_t tensor_bytes(const TimingModel& m, const OpBlock& op) noexcept {
  if (op.flags & kOpGlobal) return global_bytes(op);
  const std::uint64_t local = std::uint64_t{m.lanes} * m.lane_memory_kib * 1024 / 4;
  const std::uint32_t weights = weight_tensors(op.kind);
  const TensorRef& y = output(op);
  const std::uint64_t rows = y.rank >= 2 ? std::max<std::uint64_t>(dim(y, 0), 1) : 1;
  std::uint64_t bytes = 0;
  for (std::uint32_t i = 0; i < op.num_tensors; ++i) {
    TensorRef slice = op.tensors[i];
    if (static_cast<DType>(slice.dtype) == DType::kNone) continue;
    if (sliced_with_output(op, i, rows)) slice.shape[0] = 1;
    if (!(weights >> i & 1) && (rows > 1 ? tensor_extent(slice) : op.extent[i]) <= local) continue;
    bytes = clamp64(u128{bytes} + u128{passes(op, i)} * op.extent[i]);
  }
  return bytes;
}

// The precision a vector op runs at: its widest of the first input and
// the output (a quantize reads f32).
MacPrecision vector_precision(const OpBlock& op) noexcept {
  const auto a = mac_precision(static_cast<DType>(tensor(op, 0).dtype));
  const auto y = mac_precision(static_cast<DType>(output(op).dtype));
  return std::max(a, y);
}

OpWork base_work(const TimingModel& m, const OpBlock& op, MacPrecision p) noexcept {
  OpWork w;
  w.precision = p;
  w.bytes = tensor_bytes(m, op);
  return w;
}

Activation activation_of(const OpBlock& op) noexcept {
  if (const auto* c = std::get_if<ConvAttrs>(&op.attrs)) return static_cast<Activation>(c->activation);
  if (const auto* mm = std::get_if<MatMulAttrs>(&op.attrs)) return static_cast<Activation>(mm->activation);
  return Activation::kNone;
}

// The cost classes of schema/ops.py, each with the index of the tensor it
// names and the vector cycles per output (matmul and convolution: the fused
// activation's).
std::uint64_t activation_cycles(Activation v);
std::uint64_t elementwise_cycles(ElementwiseOp v, Activation activation);
std::uint64_t elementwise_cycles(const OpBlock& op) {
  const auto& a = std::get<ElementwiseAttrs>(op.attrs);
  return elementwise_cycles(static_cast<ElementwiseOp>(a.op), static_cast<Activation>(a.activation));
}

// Y[..., M, N] = A[..., M, K] B[..., K, N]: N on the lanes, K on the tiles.
OpWork matmul_work(const TimingModel& m, const OpBlock& op, std::size_t a_index, std::uint64_t) {
  const TensorRef& a = tensor(op, a_index);
  const TensorRef& y = output(op);
  OpWork w = base_work(m, op, mac_precision(static_cast<DType>(a.dtype)));
  const auto* attrs = std::get_if<MatMulAttrs>(&op.attrs);
  const bool ta = attrs && attrs->trans_a;
  const std::uint64_t k = a.rank >= 2 ? dim(a, a.rank - (ta ? 2 : 1)) : dim(a, 0);
  const std::uint64_t n = y.rank ? dim(y, y.rank - 1) : 1;
  const std::uint64_t outputs = tensor_elements(y);
  const std::uint64_t rows = n ? outputs / n : 0;
  w.macs = mul(outputs, k);
  w.lane_macs = mul(mul(rows, round_up(n, m.lanes)), round_up(k, m.channel_tile[idx(w.precision)]));
  w.vector_cycles = mul(outputs, activation_cycles(activation_of(op)));
  return w;
}

// Y = conv(X, W), W [Cout, Cin/groups, kh, kw]: output channels on the
// lanes, each group's input channels on the tiles.
OpWork conv_work(const TimingModel& m, const OpBlock& op, std::size_t w_index, std::uint64_t) {
  const TensorRef& wt = tensor(op, w_index);
  const TensorRef& y = output(op);
  OpWork w = base_work(m, op, mac_precision(static_cast<DType>(tensor(op, 0).dtype)));
  const std::uint64_t cout = dim(wt, 0), cin_g = dim(wt, 1), taps = mul(dim(wt, 2), dim(wt, 3));
  const std::uint64_t outputs = tensor_elements(y);
  const std::uint64_t positions = cout ? outputs / cout : 0;  // N * Ho * Wo
  w.macs = mul(mul(outputs, cin_g), taps);
  w.lane_macs =
      mul(mul(mul(positions, round_up(cout, m.lanes)), round_up(cin_g, m.channel_tile[idx(w.precision)])), taps);
  w.vector_cycles = mul(outputs, activation_cycles(activation_of(op)));
  return w;
}

// Each X element scattered through W [Cin, Cout/groups, kh, kw]: the
// output channels of a group on the lanes, the input channels on the tiles.
OpWork conv_transpose_work(const TimingModel& m, const OpBlock& op, std::size_t x_index, std::size_t w_index,
                           std::uint64_t) {
  const TensorRef& x = tensor(op, x_index);
  const TensorRef& wt = tensor(op, w_index);
  OpWork w = base_work(m, op, mac_precision(static_cast<DType>(x.dtype)));
  const auto& attrs = std::get<ConvAttrs>(op.attrs);
  const std::uint64_t groups = std::max<std::uint64_t>(attrs.groups, 1);
  const std::uint64_t cin = dim(wt, 0), cout_g = dim(wt, 1), taps = mul(dim(wt, 2), dim(wt, 3));
  const std::uint64_t positions = cin ? tensor_elements(x) / cin : 0;  // N * H * W
  w.macs = mul(mul(tensor_elements(x), cout_g), taps);
  w.lane_macs = mul(mul(mul(positions, round_up(mul(cout_g, groups), m.lanes)),
                        round_up(cin / groups, m.channel_tile[idx(w.precision)])),
                    taps);
  w.vector_cycles = mul(tensor_elements(output(op)), activation_cycles(activation_of(op)));
  return w;
}

OpWork pool_work(const TimingModel& m, const OpBlock& op, std::uint64_t cycles) {
  OpWork w = base_work(m, op, vector_precision(op));
  const auto& a = std::get<PoolAttrs>(op.attrs);
  w.vector_cycles = mul(mul(tensor_elements(output(op)), mul(a.kernel[0], a.kernel[1])), cycles);
  return w;
}

// Every element read or written once through the vector unit.
OpWork per_output_work(const TimingModel& m, const OpBlock& op, std::uint64_t cycles) {
  OpWork w = base_work(m, op, vector_precision(op));
  w.vector_cycles = mul(std::max(tensor_elements(tensor(op, 0)), tensor_elements(output(op))), cycles);
  return w;
}

// Every element of tensor t (nms: its scores) or of the output, whichever
// has more, once through the vector unit.
OpWork scan_work(const TimingModel& m, const OpBlock& op, std::uint32_t t, std::uint64_t cycles) {
  OpWork w = base_work(m, op, vector_precision(op));
  w.vector_cycles = mul(std::max(tensor_elements(tensor(op, t)), tensor_elements(output(op))), cycles);
  return w;
}

#include "op_timing.inc"

// ns for `amount` at `per_s` a second.
std::uint64_t at_rate(std::uint64_t amount, u128 per_s) noexcept {
  return per_s ? div_up(u128{amount} * 1'000'000'000u, per_s) : kSaturated;
}

CommandTime finish(CommandTime t) noexcept {
  t.ns = clamp64(u128{std::max(t.compute_ns, t.memory_ns)} + t.overhead_ns);
  if (t.overhead_ns >= std::max(t.compute_ns, t.memory_ns))
    t.bound = Bound::kOverhead;
  else
    t.bound = t.compute_ns >= t.memory_ns ? Bound::kCompute : Bound::kMemory;
  return t;
}

}  // namespace

const char* to_string(MacPrecision p) noexcept {
  switch (p) {
    case MacPrecision::kInt8: return "int8";
    case MacPrecision::kF16: return "fp16";
    case MacPrecision::kF32: return "fp32";
  }
  return "?";
}

MacPrecision mac_precision(DType t) noexcept {
  switch (t) {
    case DType::kI8:
    case DType::kU8: return MacPrecision::kInt8;
    case DType::kF16:
    case DType::kBF16: return MacPrecision::kF16;
    case DType::kF32:
    case DType::kI32:
    case DType::kNone: break;
  }
  return MacPrecision::kF32;
}

const char* to_string(Bound b) noexcept {
  switch (b) {
    case Bound::kCompute: return "compute";
    case Bound::kMemory: return "memory";
    case Bound::kOverhead: return "overhead";
  }
  return "?";
}

std::uint64_t TimingModel::peak_macs_per_s(MacPrecision p) const noexcept {
  return mul(mul(lanes, macs_per_lane_cycle[idx(p)]), mul(clock_mhz, 1'000'000));
}

const char* check_timing(const TimingModel& m, const char** why) noexcept {
  const char* positive = "must be a positive number";
  const char* percent = "must be a percentage from 1 to 100";
  const char* slower = "must be a percentage from 100 to 1000 (of a P frame's time)";
  auto bad = [&](const char* field, const char* reason) {
    if (why) *why = reason;
    return field;
  };
  if (!m.clock_mhz) return bad("clock_mhz", positive);
  if (!m.lanes) return bad("lanes", positive);
  static constexpr const char* kMacs[] = {"macs_per_lane_cycle.int8", "macs_per_lane_cycle.fp16",
                                          "macs_per_lane_cycle.fp32"};
  static constexpr const char* kTile[] = {"channel_tile.int8", "channel_tile.fp16", "channel_tile.fp32"};
  static constexpr const char* kEff[] = {"mac_efficiency_pct.int8", "mac_efficiency_pct.fp16",
                                         "mac_efficiency_pct.fp32"};
  static constexpr const char* kVec[] = {"vector_lane_elems.int8", "vector_lane_elems.fp16", "vector_lane_elems.fp32"};
  for (std::uint32_t p = 0; p < kMacPrecisions; ++p) {
    if (!m.macs_per_lane_cycle[p]) return bad(kMacs[p], positive);
    if (!m.channel_tile[p]) return bad(kTile[p], positive);
    if (!m.mac_efficiency_pct[p] || m.mac_efficiency_pct[p] > 100) return bad(kEff[p], percent);
    if (!m.vector_lane_elems[p]) return bad(kVec[p], positive);
  }
  if (!m.dram_mbps) return bad("dram_mbps", positive);
  if (!m.host_mbps) return bad("host_mbps", positive);
  if (!m.d2d_mbps) return bad("d2d_mbps", positive);
  static constexpr const char* kDecode[] = {"decode_pixels_per_s.h264", "decode_pixels_per_s.h265",
                                            "decode_pixels_per_s.jpeg"};
  for (std::uint32_t c = 0; c < 3; ++c)
    if (!m.decode_pixels_per_s[c]) return bad(kDecode[c], positive);
  if (m.intra_pct < 100 || m.intra_pct > 1000) return bad("intra_pct", slower);
  if (m.bidir_pct < 100 || m.bidir_pct > 1000) return bad("bidir_pct", slower);
  return nullptr;
}

OpWork op_work(const TimingModel& m, const OpBlock& op) noexcept {
  if (op.num_tensors == 0) return {};
  return kind_work(m, op);
}

Result<CommandTime> op_time(const TimingModel& m, const OpWork& work, OpKind kind) noexcept {
  const std::uint32_t p = idx(work.precision);
  const u128 array_per_s = u128{m.peak_macs_per_s(work.precision)} * m.mac_efficiency_pct[p] / 100;
  const u128 vector_per_s = u128{m.lanes} * m.vector_lane_elems[p] * m.clock_mhz * 1'000'000;
  if ((work.lane_macs && !array_per_s) || (work.vector_cycles && !vector_per_s) || (work.bytes && !m.dram_mbps))
    return Problem{CmdStatus::kBadArgument, Problem::kNoField, static_cast<std::uint64_t>(kind), p};
  CommandTime t;
  t.compute_ns = clamp64(u128{work.lane_macs ? at_rate(work.lane_macs, array_per_s) : 0} +
                         (work.vector_cycles ? at_rate(work.vector_cycles, vector_per_s) : 0));
  t.memory_ns = at_rate(work.bytes, u128{m.dram_mbps} * 1'000'000);
  t.overhead_ns = u128{m.op_ns} + m.command_ns;
  return finish(t);
}

Result<CommandTime> op_time(const TimingModel& m, const OpBlock& op) noexcept {
  return op_time(m, op_work(m, op), op.kind);
}

CommandTime copy_time(const TimingModel& m, std::uint64_t bytes, DmaDirection direction) noexcept {
  CommandTime t;
  const std::uint64_t mbps = direction == DmaDirection::kDeviceToDevice ? m.d2d_mbps : m.host_mbps;
  t.memory_ns = at_rate(bytes, u128{mbps} * 1'000'000);
  t.overhead_ns = m.command_ns;
  return finish(t);
}

CommandTime fill_time(const TimingModel& m, std::uint64_t bytes) noexcept {
  CommandTime t;
  t.memory_ns = at_rate(bytes, u128{m.dram_mbps} * 1'000'000);
  t.overhead_ns = m.command_ns;
  return finish(t);
}

CommandTime command_time(const TimingModel& m) noexcept {
  CommandTime t;
  t.overhead_ns = m.command_ns;
  return finish(t);
}

std::uint64_t decode_ns(const TimingModel& m, VideoCodec codec, FrameType type, std::uint32_t width,
                        std::uint32_t height) noexcept {
  const auto c = static_cast<std::uint32_t>(codec) - 1;
  if (c >= 3) return kSaturated;
  std::uint64_t pct = 100;
  if (codec == VideoCodec::kJpeg)
    pct = 100;  // every JPEG frame is an I frame, at the JPEG rate
  else if (type == FrameType::kIntra)
    pct = m.intra_pct;
  else if (type == FrameType::kBidirectional)
    pct = m.bidir_pct;
  const u128 pixels = u128{width} * height;
  const u128 rate = u128{m.decode_pixels_per_s[c]} * 100;
  return rate ? div_up(pixels * pct * 1'000'000'000u, rate) : kSaturated;
}

}  // namespace tpuhal::fw
