#include "encode.h"

#include <algorithm>
#include <cstring>

#include "device_impl.h"
#include "tpuhal/fw/tensor.h"
#include "tpuhal/fw/version.h"

namespace tpuhal::tpu {
namespace {

fw::DType to_fw(DType t) {
  switch (t) {
    case DType::F32: return fw::DType::kF32;
    case DType::F16: return fw::DType::kF16;
    case DType::BF16: return fw::DType::kBF16;
    case DType::I8: return fw::DType::kI8;
    case DType::U8: return fw::DType::kU8;
    case DType::I32: return fw::DType::kI32;
  }
  return fw::DType::kNone;
}

// Each HAL kind is the firmware's kind of the same Name, with as many
// tensors (hal's and fw's op_kinds.inc), and every firmware kind has one.
#define TPUHAL_OP_KIND(Name, str, count, writes, Attrs, since)                   \
  static_assert(fw::op_kind_info(fw::OpKind::k##Name).tensors == (count) &&      \
                    fw::op_kind_info(fw::OpKind::k##Name).written == (writes) && \
                    fw::op_kind_info(fw::OpKind::k##Name).minor == (since),      \
                "op_kinds.inc: " #Name " takes other tensors, outputs or minor in the HAL than on the board");
#include "tpuhal/driver/op_kinds.inc"
#undef TPUHAL_OP_KIND
static_assert(driver::kOpKindCount == fw::kMaxOpKind,
              "a firmware op kind (fw/op_kinds.inc) has no HAL kind (driver/op_kinds.inc)");
// Attribute enumerations are copied by number: both layers' enums are
// generated from one list (schema/ops.py), so they end at the same value.
// The HAL's table of each enumeration ends at the firmware's kMax<Enum>.
static_assert(driver::kElementwiseOpNames.back().second == static_cast<driver::ElementwiseOp>(fw::kMaxElementwiseOp) &&
              kActivationNames.back().second == static_cast<Activation>(fw::kMaxActivation) &&
              kResizeModeNames.back().second == static_cast<ResizeMode>(fw::kMaxResizeMode) &&
              kCoordinateModeNames.back().second == static_cast<CoordinateMode>(fw::kMaxCoordinateMode) &&
              kNearestModeNames.back().second == static_cast<NearestMode>(fw::kMaxNearestMode) &&
              kColorFormatNames.back().second == static_cast<ColorFormat>(fw::kMaxColorFormat) &&
              kLayoutNames.back().second == static_cast<Layout>(fw::kMaxLayout));

fw::OpKind to_fw(driver::OpKind k) {
  switch (k) {
#define TPUHAL_OP_KIND(Name, str, count, written, Attrs, minor) \
  case driver::OpKind::Name:                                    \
    return fw::OpKind::k##Name;
#include "tpuhal/driver/op_kinds.inc"
#undef TPUHAL_OP_KIND
  }
  return fw::OpKind::kInvalid;
}

template <class T>
void append_bytes(std::vector<std::byte>& out, const T& value) {
  const auto* p = reinterpret_cast<const std::byte*>(&value);
  out.insert(out.end(), p, p + sizeof value);
}

}  // namespace

std::vector<std::byte> encode_op(const driver::OpDesc& op, std::uint16_t interface_minor) {
  std::vector<std::byte> block;
  fw::OpHeader h{};
  h.magic = fw::kOpMagic;
  h.kind = static_cast<std::uint32_t>(to_fw(op.kind));
  if (op.global && interface_minor >= fw::kMinorOpFlags) h.flags = fw::kOpGlobal;
  h.num_tensors = static_cast<std::uint32_t>(op.tensors.size());
  std::vector<std::byte> attrs;
  struct AttrVisitor {
    std::vector<std::byte>& out;
    void operator()(const driver::NoAttrs&) const { append_bytes(out, fw::QuantAttrs{}); }
#include "encode_attrs.inc"  // the op schema's structs, field by field
  };
  std::visit(AttrVisitor{attrs}, op.attrs);
  h.attr_bytes = static_cast<std::uint32_t>(attrs.size());
  append_bytes(block, h);
  for (const auto& t : op.tensors) {
    fw::TensorRef r{};
    if (t.present()) {
      r.address = t.buffer->device_address() + t.offset;
      r.dtype = static_cast<std::uint32_t>(to_fw(t.dtype));
      r.rank = t.rank;
      for (std::uint32_t d = 0; d < t.rank; ++d) {
        r.shape[d] = t.shape[d];
        r.strides[d] = t.strides[d];
      }
    }
    append_bytes(block, r);
  }
  block.insert(block.end(), attrs.begin(), attrs.end());
  return block;
}

std::uint16_t required_minor(const driver::OpDesc& op) {
  // The kind's minor, and that of each enumeration value its attributes use
  // (both from schema/ops.py).
  std::uint16_t need = driver::op_kind_info(op.kind).minor;
  auto at_least = [&](std::uint16_t minor) { need = std::max(need, minor); };
  struct AttrMinor {
    std::uint16_t operator()(const driver::NoAttrs&) const { return 1; }
#include "attr_minors.inc"  // the op schema's structs, by their enumeration fields
  };
  at_least(std::visit(AttrMinor{}, op.attrs));
  if (op.kind == driver::OpKind::Gather && op.tensors[1].dtype != DType::I32) at_least(fw::kMinorGatherByteIndices);
  return need;
}

void encode(const driver::Command& command, std::uint32_t index, const std::string& uri, const TpuQueue* self,
            bool allow_fence_wait, std::uint16_t interface_minor, std::vector<Slot>& out) {
  fw::CommandDescriptor d{};
  auto addr = [](const driver::BufferRange& r) { return r.buffer->device_address() + r.offset; };
  struct Visitor {
    fw::CommandDescriptor& d;
    const std::string& uri;
    const TpuQueue* self;
    bool allow_fence_wait;
    std::uint16_t interface_minor;
    std::vector<std::byte>* inline_block;
    decltype(addr)& address;
    void operator()(const driver::cmd::Copy& c) const {
      d.opcode = static_cast<std::uint16_t>(fw::Opcode::kCopy);
      d.args[0] = address(c.src);
      d.args[1] = address(c.dst);
      d.args[2] = c.size;
    }
    void operator()(const driver::cmd::Fill& c) const {
      d.opcode = static_cast<std::uint16_t>(fw::Opcode::kFill);
      d.args[0] = address(c.dst);
      d.args[1] = c.size;
      d.args[2] = std::uint64_t{c.pattern} | std::uint64_t{c.pattern_bytes} << 32;
    }
    void operator()(const driver::cmd::WaitFence& c) const {
      auto* other = dynamic_cast<TpuQueue*>(c.queue);
      if (!allow_fence_wait) throw Error(Status::InvalidArgument, uri + ": a program cannot wait on a fence");
      if (!other || !self || !other->same_device(*self))
        throw Error(Status::InvalidArgument, uri + ": cannot wait on a fence of another device");
      d.opcode = static_cast<std::uint16_t>(fw::Opcode::kWaitValue);
      d.args[0] = other->timeline_address();
      d.args[1] = c.value;
      d.args[2] = static_cast<std::uint64_t>(fw::WaitMode::kTimeline);
    }
    void operator()(const driver::cmd::WaitValue& c) const {
      d.opcode = static_cast<std::uint16_t>(fw::Opcode::kWaitValue);
      d.args[0] = address(c.location);
      d.args[1] = c.value;
      d.args[2] = static_cast<std::uint64_t>(fw::WaitMode::kGreaterEqual);
    }
    void operator()(const driver::cmd::WriteValue& c) const {
      d.opcode = static_cast<std::uint16_t>(fw::Opcode::kWriteValue);
      d.args[0] = address(c.location);
      d.args[1] = c.value;
    }
    void operator()(const driver::cmd::Timestamp& c) const {
      d.opcode = static_cast<std::uint16_t>(fw::Opcode::kTimestamp);
      d.args[0] = address(c.location);
    }
    void operator()(const driver::cmd::WaitTime& c) const {
      if (interface_minor < fw::kMinorWaitTime)
        throw Error(Status::Unsupported, uri + ": wait_until needs firmware interface 1." +
                                             std::to_string(fw::kMinorWaitTime) + "; the board speaks 1." +
                                             std::to_string(interface_minor) + " (update its firmware)");
      d.opcode = static_cast<std::uint16_t>(fw::Opcode::kWaitTime);
      d.args[0] = c.ns;
    }
    void operator()(const driver::cmd::Run& r) const {
      if (const auto need = required_minor(*r.op); need > interface_minor)
        throw Error(Status::Unsupported, uri + ": " + r.op->name + " needs firmware interface 1." +
                                             std::to_string(need) + "; the board speaks 1." +
                                             std::to_string(interface_minor) + " (update its firmware)");
      *inline_block = encode_op(*r.op, interface_minor);
      d.opcode = static_cast<std::uint16_t>(fw::Opcode::kTensorOp);
      d.args[0] = 0;  // inline
      d.args[1] = inline_block->size();
    }
    void operator()(const driver::cmd::Call& c) const {
      auto* p = dynamic_cast<const TpuProgram*>(c.program);
      if (!p) throw Error(Status::InvalidArgument, uri + ": not a program of this driver");
      d.opcode = static_cast<std::uint16_t>(fw::Opcode::kCall);
      d.args[0] = p->address();
      d.args[1] = p->slots();
    }
  };
  std::vector<std::byte> block;
  std::visit(Visitor{d, uri, self, allow_fence_wait, interface_minor, &block, addr}, command);
  const auto* run = std::get_if<driver::cmd::Run>(&command);
  out.push_back({d, true, index, run && run->op ? driver::to_string(run->op->kind) : nullptr});
  for (std::size_t off = 0; off < block.size(); off += sizeof(fw::CommandDescriptor)) {
    Slot s{};
    s.command = index;
    std::memcpy(&s.d, block.data() + off, std::min(sizeof s.d, block.size() - off));
    out.push_back(s);
  }
}

}  // namespace tpuhal::tpu
