// The driver's side of a failure: the 64-byte FenceRecord the board wrote
// into a queue's status page, decoded by fw::decode_failure and turned into
// the error message by fw::describe, as TpuQueue::failure() does.
//
// Input: the record's bytes (shorter inputs are zero-padded, longer cut).
// Properties: a record decodes exactly when its status is a known failure
// (not kOk); a decoded failure carries every field unchanged; an undecodable
// one becomes a kFirmwareFault naming the raw status; every message, for
// any status, opcode, field and value the board may write, is a printable
// sentence.
#include <cinttypes>

#include "fuzz_util.h"
#include "tpuhal/fw/command.h"
#include "tpuhal/fw/decode.h"

namespace fw = tpuhal::fw;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto r = tpuhal::fuzz::load_padded<fw::FenceRecord>(data, size);
  auto failure = fw::decode_failure(r);
  const bool known = r.error_status != 0 && fw::is_known(r.error_status);
  FUZZ_CHECK(failure.ok() == known, "status %u %s", r.error_status, failure ? "decoded" : "refused");
  std::string msg;
  if (failure) {
    const fw::Failure& f = *failure;
    FUZZ_CHECK(static_cast<std::uint32_t>(f.status) == r.error_status && f.opcode == r.error_opcode &&
                   f.field == r.error_field && f.sequence == r.error_sequence && f.fence == r.error_fence &&
                   f.value == r.error_value && f.detail == r.error_detail,
               "decoded failure differs from the record");
    // The driver's message: "<status>: <describe>".
    msg = std::string(fw::to_string(f.status)) + ": " + fw::describe(f);
    FUZZ_CHECK(std::string_view(fw::to_string(f.status)) != "unknown status", "status %u", r.error_status);
  } else {
    const fw::Problem& p = failure.problem();
    FUZZ_CHECK(p.status == fw::CmdStatus::kFirmwareFault && p.value == r.error_status,
               "status %u refused as %u / %" PRIu64, r.error_status, static_cast<unsigned>(p.status), p.value);
    msg = fw::describe(p, r.error_opcode);
  }
  FUZZ_CHECK(tpuhal::fuzz::printable(msg), "message \"%s\"", msg.c_str());

  // describe() is public and takes raw fields: any status the board might
  // write, known or not.
  const std::string raw = fw::describe(static_cast<fw::CmdStatus>(r.error_status), r.error_opcode, r.error_field,
                                       r.error_value, r.error_detail);
  FUZZ_CHECK(tpuhal::fuzz::printable(raw), "message \"%s\"", raw.c_str());
  return 0;
}
