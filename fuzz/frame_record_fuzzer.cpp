// The driver's side of video output: the 64-byte FrameRecord a board writes
// into a decoder channel's page, checked by fw::decode_frame_record against
// the channel's open arguments before the driver hands the frame out
// (TpuDecoder in drivers/tpu/src/video.cpp).
//
// Input: 12 bytes of channel configuration, then the record (zero-padded,
// or cut, to 64 bytes):
//   byte 0      bit 0 layout (0 NV12, 1 I420)
//   bytes 1-2   max width - 1, bytes 3-4 max height - 1 (modulo 8192)
//   byte 5      slot count - 1 (modulo 64), byte 6 record count - 1
//   byte 7      extra 4 KiB pages per slot beyond what the largest frame needs (0-3)
//   bytes 8-11  unused
// The configuration is one the driver could have opened the channel with:
// slots sized as it sizes them.
//
// Properties: a record is accepted exactly when the contract allows it (an
// independent reading: a frame in a slot that exists, of a size within the
// channel's maximum that fits the slot, its planes exactly where
// plane_layout puts them; an error of one of the three statuses a board may
// report; an end of stream); an accepted record comes back unchanged and
// every plane of an accepted frame lies inside its slot; a refusal is a
// kFirmwareFault whose message is a printable sentence.
#include <algorithm>
#include <cinttypes>

#include "fuzz_util.h"
#include "tpuhal/fw/decode.h"
#include "tpuhal/fw/video.h"

namespace fw = tpuhal::fw;

namespace {

bool allowed(const fw::FrameRecord& r, const fw::VideoOpenArgs& open) {
  switch (r.kind) {
    case static_cast<std::uint32_t>(fw::RecordKind::kFrame): {
      if (r.slot >= open.slot_count || r.width == 0 || r.height == 0 || r.width > open.max_width ||
          r.height > open.max_height)
        return false;
      const fw::PlaneLayout L = fw::plane_layout(r.width, r.height, open.layout);
      if (L.bytes > open.slot_bytes) return false;
      for (std::uint32_t p = 0; p < 3; ++p) {
        const bool used = p < L.planes;
        if (r.pitch[p] != (used ? L.pitch[p] : 0) || r.offset[p] != (used ? L.offset[p] : 0)) return false;
      }
      return true;
    }
    case static_cast<std::uint32_t>(fw::RecordKind::kError):
      return r.status == static_cast<std::uint32_t>(fw::CmdStatus::kCorruptStream) ||
             r.status == static_cast<std::uint32_t>(fw::CmdStatus::kUnsupportedStream) ||
             r.status == static_cast<std::uint32_t>(fw::CmdStatus::kOutOfMemory) ||
             r.status == static_cast<std::uint32_t>(fw::CmdStatus::kDmaFault);
    case static_cast<std::uint32_t>(fw::RecordKind::kEos): return true;
    default: return false;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::uint8_t cfg[12] = {};
  std::memcpy(cfg, data, std::min<std::size_t>(size, sizeof cfg));
  const std::size_t skip = std::min<std::size_t>(size, sizeof cfg);
  const auto r = tpuhal::fuzz::load_padded<fw::FrameRecord>(data + skip, size - skip);

  fw::VideoOpenArgs open{};
  open.layout = (cfg[0] & 1) ? fw::PixelLayout::kI420 : fw::PixelLayout::kNv12;
  open.max_width = 1 + (cfg[1] | cfg[2] << 8) % fw::kMaxVideoDimension;
  open.max_height = 1 + (cfg[3] | cfg[4] << 8) % fw::kMaxVideoDimension;
  open.slot_count = 1 + cfg[5] % fw::kMaxVideoSlots;
  open.record_count = 1 + cfg[6] % fw::kMaxVideoRecords;
  open.slot_bytes =
      ((fw::plane_layout(open.max_width, open.max_height, open.layout).bytes + 4095) / 4096 + cfg[7] % 4) * 4096;

  auto decoded = fw::decode_frame_record(r, open);
  const bool expect = allowed(r, open);
  FUZZ_CHECK(decoded.ok() == expect, "kind %u slot %u %ux%u in a %ux%u channel: %s", r.kind, r.slot, r.width, r.height,
             open.max_width, open.max_height, decoded ? "accepted" : "refused");
  if (decoded) {
    FUZZ_CHECK(std::memcmp(&*decoded, &r, sizeof r) == 0, "the accepted record changed");
    if (r.kind == static_cast<std::uint32_t>(fw::RecordKind::kFrame)) {
      const fw::PlaneLayout L = fw::plane_layout(r.width, r.height, open.layout);
      for (std::uint32_t p = 0; p < L.planes; ++p) {
        const std::uint64_t end = r.offset[p] + std::uint64_t{r.pitch[p]} * (L.rows[p] - 1) + L.row_bytes[p];
        FUZZ_CHECK(L.row_bytes[p] <= r.pitch[p] && end <= open.slot_bytes,
                   "plane %u (offset %u, pitch %u, %u rows of %u) leaves the %" PRIu64 "-byte slot", p, r.offset[p],
                   r.pitch[p], L.rows[p], L.row_bytes[p], open.slot_bytes);
      }
    }
  } else {
    const fw::Problem& p = decoded.problem();
    FUZZ_CHECK(p.status == fw::CmdStatus::kFirmwareFault, "refused with status %u", static_cast<unsigned>(p.status));
    const std::string msg = fw::describe(p, 0);
    FUZZ_CHECK(tpuhal::fuzz::printable(msg), "message \"%s\"", msg.c_str());
  }
  return 0;
}
