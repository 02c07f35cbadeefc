// The video engine's descriptors and frame records (fw/video.h): valid ones
// decode; each rule, broken, gives its documented problem.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tpuhal/fw/decode.h"

namespace tpuhal::fw {
namespace {

using ::testing::HasSubstr;

CommandDescriptor open_desc() {
  CommandDescriptor d{};
  d.opcode = static_cast<std::uint16_t>(Opcode::kVideoOpen);
  d.args[0] = 3;
  d.args[1] = 1 | 1u << 8 | std::uint64_t{640} << 16 | std::uint64_t{480} << 32;  // h264, nv12, 640x480
  d.args[2] = kHostWindowBase + 0x10000;
  d.args[3] = 0x100000;
  d.args[4] = plane_layout(640, 480, PixelLayout::kNv12).bytes;
  d.args[5] = 4 | std::uint64_t{24} << 32;
  return d;
}

TEST(FwVideo, OpenDecodesItsArguments) {
  auto c = decode_command(open_desc());
  ASSERT_TRUE(c.ok()) << describe(c.problem(), 10);
  const auto& a = std::get<VideoOpenArgs>(c->args);
  EXPECT_EQ(a.channel, 3u);
  EXPECT_EQ(a.codec, VideoCodec::kH264);
  EXPECT_EQ(a.layout, PixelLayout::kNv12);
  EXPECT_EQ(a.max_width, 640u);
  EXPECT_EQ(a.max_height, 480u);
  EXPECT_EQ(a.slot_count, 4u);
  EXPECT_EQ(a.record_count, 24u);
}

TEST(FwVideo, OpenRulesEachGiveTheirField) {
  struct Case {
    int arg;
    std::uint64_t value;
    CmdStatus status;
  };
  const std::uint64_t cfg = open_desc().args[1];
  for (const Case& k : std::vector<Case>{
           {0, kMaxVideoChannels, CmdStatus::kBadArgument},             // channel
           {1, (cfg & ~0xFFull) | 7, CmdStatus::kBadArgument},          // codec
           {1, (cfg & ~0xFF00ull) | 3u << 8, CmdStatus::kBadArgument},  // layout
           {1, cfg & ~(0xFFFFull << 16), CmdStatus::kBadArgument},      // width 0
           {1, cfg | 1ull << 50, CmdStatus::kReservedNotZero},
           {2, kHostWindowBase + 100, CmdStatus::kBadAlignment},       // page
           {3, 0x100010, CmdStatus::kBadAlignment},                    // pool
           {4, 1024, CmdStatus::kBadArgument},                         // slot too small
           {5, 0 | std::uint64_t{24} << 32, CmdStatus::kBadArgument},  // no slots
           {5, 8 | std::uint64_t{4} << 32, CmdStatus::kBadArgument},   // fewer records than slots
           {5, 4 | std::uint64_t{1000} << 32, CmdStatus::kBadArgument},
       }) {
    CommandDescriptor d = open_desc();
    d.args[k.arg] = k.value;
    auto c = decode_command(d);
    ASSERT_FALSE(c.ok()) << "arg " << k.arg << " = " << k.value;
    EXPECT_EQ(c.problem().status, k.status) << "arg " << k.arg;
    EXPECT_EQ(c.problem().field, k.arg);
  }
}

TEST(FwVideo, DecodeAndCloseRules) {
  CommandDescriptor d{};
  d.opcode = static_cast<std::uint16_t>(Opcode::kVideoDecode);
  d.args[0] = 1;
  d.args[1] = kHostWindowBase;
  d.args[2] = 1000;
  d.args[3] = static_cast<std::uint64_t>(-5);  // negative pts pass through
  auto ok = decode_command(d);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(std::get<VideoDecodeArgs>(ok->args).pts, -5);
  CommandDescriptor empty = d;
  empty.args[2] = 0;  // an empty packet without the end-of-stream flag
  EXPECT_EQ(decode_command(empty).problem().field, 2);
  CommandDescriptor eos = d;
  eos.args[5] = kVideoPacketEos;  // end of stream carries no packet
  EXPECT_FALSE(decode_command(eos).ok());
  eos.args[1] = eos.args[2] = 0;
  ASSERT_TRUE(decode_command(eos).ok());
  EXPECT_TRUE(std::get<VideoDecodeArgs>(decode_command(eos)->args).eos);
  CommandDescriptor flags = d;
  flags.args[5] = 2;
  EXPECT_EQ(decode_command(flags).problem().status, CmdStatus::kReservedNotZero);
  CommandDescriptor big = d;
  big.args[2] = kMaxVideoPacketBytes + 1;
  EXPECT_EQ(decode_command(big).problem().field, 2);
  CommandDescriptor close{};
  close.opcode = static_cast<std::uint16_t>(Opcode::kVideoClose);
  close.args[0] = 2;
  EXPECT_TRUE(decode_command(close).ok());
  close.args[1] = 1;
  EXPECT_EQ(decode_command(close).problem().status, CmdStatus::kReservedNotZero);
}

TEST(FwVideo, VideoOpcodesRunOnVideoQueuesOnly) {
  for (Opcode op : {Opcode::kVideoOpen, Opcode::kVideoDecode, Opcode::kVideoClose}) {
    EXPECT_TRUE(engine_accepts(EngineType::kVideo, op));
    EXPECT_FALSE(engine_accepts(EngineType::kCompute, op));
    EXPECT_FALSE(engine_accepts(EngineType::kCopy, op));
  }
  EXPECT_TRUE(engine_accepts(EngineType::kVideo, Opcode::kCopy));
  EXPECT_FALSE(engine_accepts(EngineType::kVideo, Opcode::kTensorOp));
}

TEST(FwVideo, PlaneLayoutAlignsPitchesAndRoundsChromaUp) {
  const PlaneLayout n = plane_layout(321, 241, PixelLayout::kNv12);
  EXPECT_EQ(n.planes, 2u);
  EXPECT_EQ(n.pitch[0], 384u);
  EXPECT_EQ(n.row_bytes[1], 322u);  // 161 U/V pairs
  EXPECT_EQ(n.rows[1], 121u);
  EXPECT_EQ(n.offset[1] % kVideoPlaneAlign, 0u);
  const PlaneLayout i = plane_layout(321, 241, PixelLayout::kI420);
  EXPECT_EQ(i.planes, 3u);
  EXPECT_EQ(i.row_bytes[1], 161u);
  EXPECT_GT(i.offset[2], i.offset[1]);
  EXPECT_LE(i.offset[2] + std::uint64_t{i.pitch[2]} * i.rows[2], i.bytes);
}

TEST(FwVideo, FrameRecordsFromTheBoardAreChecked) {
  VideoOpenArgs open = std::get<VideoOpenArgs>(decode_command(open_desc())->args);
  const PlaneLayout L = plane_layout(320, 240, PixelLayout::kNv12);
  FrameRecord r{};
  r.kind = static_cast<std::uint32_t>(RecordKind::kFrame);
  r.slot = 1;
  r.width = 320;
  r.height = 240;
  for (int p = 0; p < 2; ++p) {
    r.pitch[p] = L.pitch[p];
    r.offset[p] = static_cast<std::uint32_t>(L.offset[p]);
  }
  ASSERT_TRUE(decode_frame_record(r, open).ok());
  auto broken = [&](auto change) {
    FrameRecord b = r;
    change(b);
    auto d = decode_frame_record(b, open);
    EXPECT_FALSE(d.ok());
    return d.ok() ? CmdStatus::kOk : d.problem().status;
  };
  EXPECT_EQ(broken([](FrameRecord& b) { b.slot = 4; }), CmdStatus::kFirmwareFault);
  EXPECT_EQ(broken([](FrameRecord& b) { b.width = 641; }), CmdStatus::kFirmwareFault);
  EXPECT_EQ(broken([](FrameRecord& b) { b.height = 0; }), CmdStatus::kFirmwareFault);
  EXPECT_EQ(broken([](FrameRecord& b) { b.pitch[0] += 64; }), CmdStatus::kFirmwareFault);
  EXPECT_EQ(broken([](FrameRecord& b) { b.offset[2] = 64; }), CmdStatus::kFirmwareFault);
  EXPECT_EQ(broken([](FrameRecord& b) { b.kind = 9; }), CmdStatus::kFirmwareFault);
  FrameRecord e{};
  e.kind = static_cast<std::uint32_t>(RecordKind::kError);
  e.status = static_cast<std::uint32_t>(CmdStatus::kCorruptStream);
  e.packet = 7;
  e.detail = 0x41444E49;
  ASSERT_TRUE(decode_frame_record(e, open).ok());
  EXPECT_THAT(describe(CmdStatus::kCorruptStream, 0, 0, e.packet, e.detail),
              HasSubstr("packet 7 does not decode: corrupt or truncated data (decoder: invalid data)"));
  e.status = static_cast<std::uint32_t>(CmdStatus::kHang);  // not a stream error
  EXPECT_FALSE(decode_frame_record(e, open).ok());
}

}  // namespace
}  // namespace tpuhal::fw
