// fw::decode_command: the board's first look at a 64-byte descriptor the host
// wrote into a ring (or a program's command list).
//
// Input: the descriptor's bytes. Other lengths exercise the span overload's
// length check. Properties:
//   - the span and struct overloads agree;
//   - a descriptor of opcodes 1-9 and 13 decodes exactly when
//     docs/firmware-interface.md says it is valid (spec_valid below is an
//     independent reading of that table); a decoded one re-encodes to the
//     same 64 bytes (nothing dropped or invented), occupies the slots the
//     contract says, and runs on the engines the contract says;
//   - every opcode: one outside 1..fw::kMaxOpcode, undefined flags or a bad
//     fence value are refused; a decoded command carries the opcode's
//     alternative of fw::CommandArgs and the header fields unchanged, and
//     some engine runs it. Opcodes added after 1.1 (fw::kMaxOpcode grows
//     with the interface) get these checks and the sanitizers without a
//     change here;
//   - a refusal names a known status and reads as a printable sentence.
#include <cinttypes>
#include <span>
#include <variant>

#include "fuzz_util.h"
#include "tpuhal/fw/command.h"
#include "tpuhal/fw/decode.h"
#include "tpuhal/fw/tensor.h"

namespace fw = tpuhal::fw;

namespace {

// The opcodes spec_valid and encode know: interface 1.1's, and 1.21's
// wait_time.
constexpr std::uint16_t kModelledOpcodes = 9;
constexpr std::uint16_t kWaitTime = 13;

bool no_wrap(std::uint64_t address, std::uint64_t size) { return address <= UINT64_MAX - size; }

bool args_zero_from(const fw::CommandDescriptor& d, int first) {
  for (int i = first; i < 6; ++i)
    if (d.args[i] != 0) return false;
  return true;
}

// The header rules every opcode shares: known flags; a fence value, when
// written, in (0, 2^63).
bool header_valid(const fw::CommandDescriptor& d) {
  if (d.opcode == 0 || d.opcode > fw::kMaxOpcode) return false;
  if (d.flags & ~fw::kKnownFlags) return false;
  return !(d.flags & fw::kFlagFence) || (d.fence_value != 0 && d.fence_value < fw::kTimelineFailed);
}

// The descriptor table of docs/firmware-interface.md, read independently of
// decode.cpp: unused arguments zero, sizes within (0, 2^40], ranges that do
// not wrap the address space, the alignments each opcode names.
bool spec_valid(const fw::CommandDescriptor& d) {
  if (!header_valid(d)) return false;
  const std::uint64_t* a = d.args;
  switch (d.opcode) {
    case 1:  // nop
      return args_zero_from(d, 0);
    case 2:  // copy: src, dst, size
      return args_zero_from(d, 3) && a[2] > 0 && a[2] <= fw::kMaxTransferBytes && no_wrap(a[0], a[2]) &&
             no_wrap(a[1], a[2]);
    case 3:  // copy_sg: list (32-aligned), count 1..65536, total
      return args_zero_from(d, 3) && a[0] % 32 == 0 && a[1] >= 1 && a[1] <= 65536 && no_wrap(a[0], a[1] * 32) &&
             a[2] > 0 && a[2] <= fw::kMaxTransferBytes;
    case 4: {  // fill: dst, size, pattern | width << 32
      const std::uint64_t width = a[2] >> 32, pattern = a[2] & 0xFFFFFFFF;
      if (!args_zero_from(d, 3) || (width != 1 && width != 2 && width != 4)) return false;
      if (width < 4 && pattern >= (1ull << (8 * width))) return false;
      return a[1] > 0 && a[1] <= fw::kMaxTransferBytes && a[1] % width == 0 && a[0] % width == 0 && no_wrap(a[0], a[1]);
    }
    case 5:  // wait_value: address (8-aligned), value, mode 0 | 1 (timeline: 63 bits)
      return args_zero_from(d, 3) && a[0] % 8 == 0 && a[2] <= 1 && (a[2] == 0 || a[1] <= fw::kTimelineValueMask);
    case 6:  // write_value: address (8-aligned), value
      return args_zero_from(d, 2) && a[0] % 8 == 0;
    case 7:  // timestamp: address (8-aligned)
      return args_zero_from(d, 1) && a[0] % 8 == 0;
    case 8:  // tensor_op: block address (8-aligned, 0 = inline), bytes
      return args_zero_from(d, 2) && a[0] % 8 == 0 && a[1] >= sizeof(fw::OpHeader) && a[1] <= fw::kMaxParamBytes &&
             no_wrap(a[0], a[1]);
    case 9:  // call: list address (64-aligned, not 0), slots 1..2^24
      return args_zero_from(d, 2) && a[0] != 0 && a[0] % 64 == 0 && a[1] >= 1 && a[1] <= fw::kMaxCallSlots &&
             no_wrap(a[0], a[1] * 64);
    case 13:  // wait_time: board time, at most 2^62
      return args_zero_from(d, 1) && a[0] <= (1ull << 62);
    default: return false;
  }
}

template <class... F>
struct Overloaded : F... {
  using F::operator()...;
};
template <class... F>
Overloaded(F...) -> Overloaded<F...>;

// The descriptor a decoded command of a modelled opcode came from.
fw::CommandDescriptor encode(const fw::Command& c) {
  fw::CommandDescriptor d{};
  d.opcode = static_cast<std::uint16_t>(c.opcode);
  d.flags = c.flags;
  d.sequence = c.sequence;
  d.fence_value = c.fence_value;
  std::uint64_t* a = d.args;
  std::visit(
      Overloaded{
          [](const fw::NopArgs&) {}, [&](const fw::CopyArgs& x) { a[0] = x.src, a[1] = x.dst, a[2] = x.size; },
          [&](const fw::CopySgArgs& x) { a[0] = x.list, a[1] = x.count, a[2] = x.total; },
          [&](const fw::FillArgs& x) {
            a[0] = x.dst, a[1] = x.size;
            a[2] = std::uint64_t{x.pattern} | std::uint64_t{x.pattern_bytes} << 32;
          },
          [&](const fw::WaitValueArgs& x) {
            a[0] = x.address, a[1] = x.value, a[2] = static_cast<std::uint64_t>(x.mode);
          },
          [&](const fw::WriteValueArgs& x) { a[0] = x.address, a[1] = x.value; },
          [&](const fw::TimestampArgs& x) { a[0] = x.address; },
          [&](const fw::TensorOpArgs& x) { a[0] = x.address, a[1] = x.bytes; },
          [&](const fw::CallArgs& x) { a[0] = x.address, a[1] = x.slots; },
          [&](const fw::WaitTimeArgs& x) { a[0] = x.ns; }, [](const auto&) {},  // the video opcodes: not re-encoded
      },
      c.args);
  return d;
}

void check_problem(const fw::Problem& p, std::uint16_t opcode) {
  FUZZ_CHECK(p.status != fw::CmdStatus::kOk && fw::is_known(static_cast<std::uint32_t>(p.status)),
             "refusal with status %u", static_cast<unsigned>(p.status));
  const std::string msg = fw::describe(p, opcode);
  FUZZ_CHECK(tpuhal::fuzz::printable(msg), "message \"%s\"", msg.c_str());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto bytes = std::as_bytes(std::span(data, size));
  auto from_span = fw::decode_command(bytes);
  if (size != sizeof(fw::CommandDescriptor)) {
    FUZZ_CHECK(!from_span && from_span.problem().status == fw::CmdStatus::kBadArgument &&
                   from_span.problem().field == fw::Problem::kFieldLength && from_span.problem().value == size,
               "a %zu-byte descriptor was not refused for its length", size);
    check_problem(from_span.problem(), 0);
    return 0;
  }

  const auto d = tpuhal::fuzz::load<fw::CommandDescriptor>(data);
  auto decoded = fw::decode_command(d);
  FUZZ_CHECK(decoded.ok() == from_span.ok(), "span and struct overloads disagree");
  const bool modelled = d.opcode <= kModelledOpcodes || d.opcode == kWaitTime;
  FUZZ_CHECK(!decoded.ok() || header_valid(d), "opcode %u flags %#x fence %#" PRIx64 " accepted", d.opcode, d.flags,
             d.fence_value);
  if (d.opcode == 0 || d.opcode > fw::kMaxOpcode)
    FUZZ_CHECK(!decoded && decoded.problem().status == fw::CmdStatus::kInvalidOpcode,
               "opcode %u not refused as invalid", d.opcode);
  FUZZ_CHECK(!modelled || decoded.ok() == spec_valid(d),
             "opcode %u flags %#x fence %#" PRIx64 " args %#" PRIx64 " %#" PRIx64 " %#" PRIx64 " %#" PRIx64
             ": decoder says %s, the contract says %s",
             d.opcode, d.flags, d.fence_value, d.args[0], d.args[1], d.args[2], d.args[3],
             decoded ? "valid" : fw::describe(decoded.problem(), d.opcode).c_str(),
             spec_valid(d) ? "valid" : "invalid");
  if (!decoded) {
    const fw::Problem& p = decoded.problem();
    const fw::Problem& q = from_span.problem();
    FUZZ_CHECK(p.status == q.status && p.field == q.field && p.value == q.value && p.detail == q.detail,
               "span and struct overloads report different problems");
    check_problem(p, d.opcode);
    return 0;
  }

  const fw::Command& c = *decoded;
  FUZZ_CHECK(c.args.index() + 1 == d.opcode, "opcode %u decoded as alternative %zu", d.opcode, c.args.index());
  FUZZ_CHECK(static_cast<std::uint16_t>(c.opcode) == d.opcode && c.flags == d.flags && c.sequence == d.sequence &&
                 c.fence_value == d.fence_value,
             "opcode %u: header fields changed", d.opcode);
  FUZZ_CHECK(!fw::engine_accepts(fw::EngineType::kNone, c.opcode), "engine none accepts");
  FUZZ_CHECK(fw::engine_accepts(fw::EngineType::kCompute, c.opcode) ||
                 fw::engine_accepts(fw::EngineType::kCopy, c.opcode) ||
                 fw::engine_accepts(fw::EngineType::kVideo, c.opcode),
             "opcode %u runs on no engine", d.opcode);
  for (std::uint16_t i = 0; i < 8; ++i)
    FUZZ_CHECK(tpuhal::fuzz::printable(fw::arg_name(d.opcode, i)), "arg_name(%u, %u)", d.opcode, i);
  if (!modelled) {
    FUZZ_CHECK(fw::command_slots(c) == 1, "opcode %u occupies %" PRIu64 " slots", d.opcode, fw::command_slots(c));
    return 0;
  }

  const fw::CommandDescriptor again = encode(c);
  FUZZ_CHECK(std::memcmp(&again, &d, sizeof d) == 0, "opcode %u does not re-encode to its bytes", d.opcode);

  const std::uint64_t slots = fw::command_slots(c);
  std::uint64_t expected_slots = 1;
  if (const auto* t = std::get_if<fw::TensorOpArgs>(&c.args); t && t->address == 0)
    expected_slots = 1 + (t->bytes + 63) / 64;
  FUZZ_CHECK(slots == expected_slots, "opcode %u occupies %" PRIu64 " slots", d.opcode, slots);

  const bool compute_only = c.opcode == fw::Opcode::kTensorOp || c.opcode == fw::Opcode::kCall;
  FUZZ_CHECK(fw::engine_accepts(fw::EngineType::kCompute, c.opcode), "compute refuses");
  FUZZ_CHECK(fw::engine_accepts(fw::EngineType::kCopy, c.opcode) == !compute_only, "copy engine");
  FUZZ_CHECK(fw::engine_accepts(fw::EngineType::kVideo, c.opcode) == !compute_only, "video engine");
  return 0;
}
