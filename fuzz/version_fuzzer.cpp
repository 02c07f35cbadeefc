// Interface version negotiation, both sides: fw::negotiate (the driver
// reading IFACE_VERSION from the board) and fw::accept_driver_version (the
// board reading DRIVER_VERSION from the driver).
//
// Input: 16 bytes, little-endian u32 each: the board's version, the driver's
// lowest and highest, and a raw DRIVER_VERSION write (zero-padded if short).
// Properties: negotiate agrees only on equal majors and the smaller minor,
// never below the driver's lowest; the board accepts every version a
// driver negotiated with it; accept_driver_version accepts exactly the
// versions of its major up to its minor; refusals read as sentences.
#include <algorithm>

#include "fuzz_util.h"
#include "tpuhal/fw/decode.h"
#include "tpuhal/fw/version.h"

namespace fw = tpuhal::fw;

namespace {

struct Input {
  std::uint32_t board, driver_min, driver_max, requested;
};

void check_refusal(const fw::Problem& p) {
  FUZZ_CHECK(p.status == fw::CmdStatus::kBadArgument && p.field == fw::Problem::kFieldVersion, "status %u field %#x",
             static_cast<unsigned>(p.status), p.field);
  const std::string msg = fw::describe(p, 0);
  FUZZ_CHECK(tpuhal::fuzz::printable(msg), "message \"%s\"", msg.c_str());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto in = tpuhal::fuzz::load_padded<Input>(data, size);
  const auto board = fw::Version::unpack(in.board);
  const auto lo = fw::Version::unpack(in.driver_min);
  const auto hi = fw::Version::unpack(in.driver_max);
  FUZZ_CHECK(board.packed() == in.board, "unpack/packed round trip of %#x", in.board);

  auto agreed = fw::negotiate(board, lo, hi);
  const bool compatible = board.major == hi.major && lo.major == hi.major && board.minor >= lo.minor;
  FUZZ_CHECK(agreed.ok() == compatible, "negotiate(%#x, %#x, %#x) %s", in.board, in.driver_min, in.driver_max,
             agreed ? "agreed" : "refused");
  if (agreed) {
    const fw::Version v = *agreed;
    FUZZ_CHECK(v.major == board.major && v.minor == std::min(board.minor, hi.minor), "negotiate(%#x, %#x, %#x) = %#x",
               in.board, in.driver_min, in.driver_max, v.packed());
    if (lo.minor <= hi.minor) FUZZ_CHECK(v.minor >= lo.minor, "agreed %#x is below the driver's lowest", v.packed());
    // What the driver then writes to DRIVER_VERSION, the board must accept.
    auto accepted = fw::accept_driver_version(board, v.packed());
    FUZZ_CHECK(accepted && *accepted == v, "board %#x refuses negotiated %#x", in.board, v.packed());
  } else {
    check_refusal(agreed.problem());
  }

  auto accepted = fw::accept_driver_version(board, in.requested);
  const auto req = fw::Version::unpack(in.requested);
  const bool acceptable = req.major == board.major && req.minor <= board.minor;
  FUZZ_CHECK(accepted.ok() == acceptable, "board %#x %s driver version %#x", in.board, accepted ? "accepts" : "refuses",
             in.requested);
  if (accepted)
    FUZZ_CHECK(*accepted == req, "accepted %#x as %#x", in.requested, accepted->packed());
  else
    check_refusal(accepted.problem());
  return 0;
}
