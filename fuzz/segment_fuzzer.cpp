// fw::decode_segment: one 32-byte scatter-gather element of a kCopySg list,
// read by the board from DRAM or host memory the host filled.
//
// Input: the segment's bytes (shorter inputs are zero-padded, longer cut).
// Properties: a segment decodes exactly when the contract says it is valid
// (reserved word zero, size in (0, 2^40], neither range wraps the address
// space); a decoded segment is the input unchanged; a refusal names its
// field and reads as a printable sentence.
#include <cinttypes>

#include "fuzz_util.h"
#include "tpuhal/fw/command.h"
#include "tpuhal/fw/decode.h"

namespace fw = tpuhal::fw;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto s = tpuhal::fuzz::load_padded<fw::DmaSegment>(data, size);
  const bool valid = s.reserved == 0 && s.size > 0 && s.size <= fw::kMaxTransferBytes && s.src <= UINT64_MAX - s.size &&
                     s.dst <= UINT64_MAX - s.size;
  auto decoded = fw::decode_segment(s);
  FUZZ_CHECK(decoded.ok() == valid, "segment {%#" PRIx64 ", %#" PRIx64 ", %#" PRIx64 ", %#" PRIx64 "}: decoder says %s",
             s.src, s.dst, s.size, s.reserved, decoded ? "valid" : "invalid");
  if (decoded) {
    FUZZ_CHECK(std::memcmp(&*decoded, &s, sizeof s) == 0, "decoded segment differs from input");
    return 0;
  }
  const fw::Problem& p = decoded.problem();
  FUZZ_CHECK(p.status == fw::CmdStatus::kReservedNotZero || p.status == fw::CmdStatus::kBadArgument, "status %u",
             static_cast<unsigned>(p.status));
  FUZZ_CHECK(p.field <= 3, "field %u is not a segment word", p.field);
  // As the board reports it: against the kCopySg descriptor.
  const std::string msg = fw::describe(p, static_cast<std::uint16_t>(fw::Opcode::kCopySg));
  FUZZ_CHECK(tpuhal::fuzz::printable(msg), "message \"%s\"", msg.c_str());
  return 0;
}
