// The USB wire format (fw/usb.h): messages built by append_usb_message decode
// back on the side they travel to, a stream of them splits by length, and
// every malformed header or argument is refused with a sentence.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>

#include "tpuhal/fw/image.h"
#include "tpuhal/fw/regs.h"
#include "tpuhal/fw/usb.h"

namespace tpuhal::fw {
namespace {

using ::testing::HasSubstr;
constexpr std::uint32_t kBar0 = kBar0Size;

std::vector<std::byte> msg(UsbType type, std::uint64_t tag, std::uint64_t a0, std::uint64_t a1 = 0,
                           std::vector<std::byte> data = {}, std::uint32_t seq = 0, std::uint16_t flags = 0) {
  std::vector<std::byte> out;
  append_usb_message(out, type, tag, a0, a1, data, seq, flags);
  return out;
}

std::string refused(const std::vector<std::byte>& m, UsbDirection d, std::uint32_t max_data = kUsbMaxData) {
  auto r = decode_usb_message(m, d, kBar0, max_data);
  EXPECT_FALSE(r.ok());
  return r ? "" : describe_usb_problem(r.problem());
}

template <class T>
void write(std::vector<std::byte>& v, std::size_t at, T x) {
  std::memcpy(v.data() + at, &x, sizeof x);
}

TEST(Usb, EveryTypeRoundTripsInItsDirection) {
  const std::vector<std::byte> data(100, std::byte{0x5A});
  struct Case {
    UsbType type;
    UsbDirection dir;
    std::uint64_t a0, a1;
    bool with_data;
  };
  const Case cases[] = {
      {UsbType::kRegWrite, UsbDirection::kToBoard, 0x40, 0xDEADBEEF, false},
      {UsbType::kRegRead, UsbDirection::kToBoard, 0x44, 0, false},
      {UsbType::kMemWrite, UsbDirection::kToBoard, 0x100000, 0, true},
      {UsbType::kMemRead, UsbDirection::kToBoard, 0x100000, 4096, false},
      {UsbType::kHostData, UsbDirection::kToBoard, 1ull << 48, 0, true},
      {UsbType::kMapDma, UsbDirection::kToBoard, 1ull << 48, 8192, false},
      {UsbType::kUnmapDma, UsbDirection::kToBoard, 1ull << 48, 8192, false},
      {UsbType::kFwBegin, UsbDirection::kToBoard, 65536, 0, false},
      {UsbType::kFwData, UsbDirection::kToBoard, 4096, 0, true},
      {UsbType::kFwCommit, UsbDirection::kToBoard, 0xE3069283, 0, false},
      {UsbType::kRegValue, UsbDirection::kToHost, 0x40, 7, false},
      {UsbType::kMemData, UsbDirection::kToHost, 0x2000, 0, true},
      {UsbType::kHostRead, UsbDirection::kToHost, 1ull << 48, 256, false},
      {UsbType::kHostWrite, UsbDirection::kToHost, (1ull << 48) + 64, 0, true},
      {UsbType::kError, UsbDirection::kToHost, static_cast<std::uint64_t>(CmdStatus::kBadArgument), 0x3, false},
      {UsbType::kFwStatus, UsbDirection::kToHost, 0, 0, false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(to_string(c.type));
    const std::uint32_t seq = c.dir == UsbDirection::kToHost ? 9 : 0;
    const auto m = msg(c.type, 0x1234, c.a0, c.a1, c.with_data ? data : std::vector<std::byte>{}, seq);
    auto len = usb_message_bytes(m, c.dir);
    ASSERT_TRUE(len.ok()) << describe_usb_problem(len.problem());
    EXPECT_EQ(*len, m.size());
    auto r = decode_usb_message(m, c.dir, kBar0);
    ASSERT_TRUE(r.ok()) << describe_usb_problem(r.problem());
    EXPECT_EQ(r->type, c.type);
    EXPECT_EQ(r->tag, 0x1234u);
    EXPECT_EQ(r->sequence, seq);
    EXPECT_EQ(r->arg[0], c.a0);
    EXPECT_EQ(r->arg[1], c.a1);
    EXPECT_EQ(r->data.size(), c.with_data ? data.size() : 0u);
    // The other direction refuses it.
    const auto other = c.dir == UsbDirection::kToBoard ? UsbDirection::kToHost : UsbDirection::kToBoard;
    EXPECT_THAT(refused(m, other), HasSubstr("not this way"));
  }
  EXPECT_STREQ(to_string(UsbType::kHostRead), "host-read");
}

TEST(Usb, AStreamOfMessagesSplitsByLength) {
  std::vector<std::byte> stream;
  const std::vector<std::byte> a(3, std::byte{1}), b(5000, std::byte{2});
  append_usb_message(stream, UsbType::kHostWrite, 1, 0x1000, 0, a, 1);
  append_usb_message(stream, UsbType::kRegValue, 2, 0x8, 0x55, {}, 2);
  append_usb_message(stream, UsbType::kMemData, 3, 0x0, 0, b, 3);
  std::span<const std::byte> rest(stream);
  std::vector<UsbType> seen;
  while (!rest.empty()) {
    auto n = usb_message_bytes(rest, UsbDirection::kToHost);
    ASSERT_TRUE(n.ok()) << describe_usb_problem(n.problem());
    auto m = decode_usb_message(rest.first(*n), UsbDirection::kToHost, kBar0);
    ASSERT_TRUE(m.ok()) << describe_usb_problem(m.problem());
    seen.push_back(m->type);
    rest = rest.subspan(*n);
  }
  EXPECT_EQ(seen, (std::vector<UsbType>{UsbType::kHostWrite, UsbType::kRegValue, UsbType::kMemData}));
  // Half a header is not yet a message.
  auto n = usb_message_bytes(std::span(stream).first(20), UsbDirection::kToHost);
  ASSERT_FALSE(n.ok());
  EXPECT_THAT(describe_usb_problem(n.problem()), HasSubstr("20 bytes, fewer than a 40-byte header"));
  // A message cut short (or with bytes of the next) is refused whole.
  auto cut = decode_usb_message(std::span(stream).first(sizeof(UsbHeader) + 2), UsbDirection::kToHost, kBar0);
  EXPECT_FALSE(cut.ok());
}

// The splitter hands over the same messages however the stream is cut into
// buffers: whole ones where they lie, cut ones assembled.
TEST(Usb, TheSplitterGivesEveryMessageWholeHoweverTheStreamIsCut) {
  std::vector<std::byte> stream;
  std::vector<std::vector<std::byte>> want;
  for (std::uint32_t i = 1; i <= 12; ++i) {
    const std::vector<std::byte> data(i % 3 == 0 ? 0 : i * 700 + 1, static_cast<std::byte>(i));
    const std::size_t at = stream.size();
    if (data.empty())
      append_usb_message(stream, UsbType::kRegValue, i, 0x8, i, {}, i);
    else
      append_usb_message(stream, UsbType::kHostWrite, i, 0x1000 * i, 0, data, i);
    want.emplace_back(stream.begin() + static_cast<std::ptrdiff_t>(at), stream.end());
  }
  for (const std::size_t cut :
       {std::size_t{1}, std::size_t{7}, sizeof(UsbHeader), std::size_t{41}, std::size_t{4096}, stream.size()}) {
    SCOPED_TRACE(cut);
    UsbSplitter split(UsbDirection::kToHost);
    std::vector<std::vector<std::byte>> got;
    std::size_t in_place = 0;
    for (std::size_t at = 0; at < stream.size(); at += cut) {
      const std::span<const std::byte> buffer = std::span(stream).subspan(at, std::min(cut, stream.size() - at));
      auto fed = split.feed(buffer, [&](std::span<const std::byte> m) {
        if (m.data() >= buffer.data() && m.data() + m.size() <= buffer.data() + buffer.size()) ++in_place;
        got.emplace_back(m.begin(), m.end());
        return true;
      });
      ASSERT_TRUE(fed.ok()) << describe_usb_problem(fed.problem());
      EXPECT_EQ(*fed, UsbSplitter::Fed::kAll);
    }
    EXPECT_EQ(got, want);
    EXPECT_EQ(split.held(), 0u);
    // In one buffer, no message is copied.
    if (cut == stream.size()) {
      EXPECT_EQ(in_place, want.size());
    }
  }
}

TEST(Usb, TheSplitterStopsWhenAskedAndRefusesAStreamOutOfStep) {
  std::vector<std::byte> stream;
  append_usb_message(stream, UsbType::kRegWrite, 1, 0x10, 1);
  append_usb_message(stream, UsbType::kRegWrite, 2, 0x14, 2);
  append_usb_message(stream, UsbType::kRegWrite, 3, 0x18, 3);
  UsbSplitter split(UsbDirection::kToBoard);
  int seen = 0;
  auto fed = split.feed(stream, [&](std::span<const std::byte>) { return ++seen < 2; });
  ASSERT_TRUE(fed.ok());
  EXPECT_EQ(*fed, UsbSplitter::Fed::kStopped);
  EXPECT_EQ(seen, 2);
  EXPECT_EQ(split.held(), 0u);  // the rest of a stopped buffer is dropped

  // A bad header, whole or assembled from a cut, is a problem and leaves
  // nothing held; the next buffer starts afresh.
  std::vector<std::byte> bad = stream;
  write<std::uint32_t>(bad, sizeof(UsbHeader), 0x12345678);  // the second message's magic
  for (std::size_t cut : {bad.size(), sizeof(UsbHeader) + 3}) {
    SCOPED_TRACE(cut);
    split.reset();
    seen = 0;
    auto count = [&](std::span<const std::byte>) { return ++seen > 0; };
    auto first = split.feed(std::span(bad).first(cut), count);
    auto r = first.ok() ? split.feed(std::span(bad).subspan(cut), count) : first;
    ASSERT_FALSE(r.ok());
    EXPECT_THAT(describe_usb_problem(r.problem()), HasSubstr("out of step"));
    EXPECT_EQ(seen, 1);
    EXPECT_EQ(split.held(), 0u);
    auto again = split.feed(stream, count);
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(seen, 4);
  }
  // The wrong direction is out of step too, and reset() drops a cut message.
  EXPECT_FALSE(UsbSplitter(UsbDirection::kToHost).feed(stream, [](auto) { return true; }).ok());
  ASSERT_TRUE(split.feed(std::span(stream).first(10), [](auto) { return true; }).ok());
  EXPECT_EQ(split.held(), 10u);
  split.reset();
  EXPECT_EQ(split.held(), 0u);
}

TEST(Usb, TheWireSequenceWrapsPast32BitsWithoutEverReadingZero) {
  EXPECT_EQ(usb_wire_sequence(0), 0u);  // no message yet
  EXPECT_EQ(usb_wire_sequence(1), 1u);
  EXPECT_EQ(usb_wire_sequence(0xFFFFFFFFull), 0xFFFFFFFFu);
  EXPECT_EQ(usb_wire_sequence(0x100000000ull), 1u);
  EXPECT_EQ(usb_wire_sequence(0x100000001ull), 2u);
  EXPECT_EQ(usb_wire_sequence(2 * 0xFFFFFFFFull + 1), 1u);
  // Consecutive counts are consecutive on the wire except at the wrap, and
  // a header never carries 0, which the decoder refuses from a board.
  for (std::uint64_t n = 0xFFFFFFF0ull; n < 0x100000010ull; ++n) {
    const std::uint32_t w = usb_wire_sequence(n), next = usb_wire_sequence(n + 1);
    EXPECT_NE(next, 0u);
    EXPECT_EQ(next, w == 0xFFFFFFFFu ? 1u : w + 1);
  }
}

TEST(Usb, AFirmwareUploadFitsTheLinksTransfersWhateverTheBoardsLargestPayload) {
  // Large enough for three chunks of the largest payload, with a ragged end.
  std::vector<std::uint32_t> words(2'500'001 / 4 + 1);
  for (std::size_t i = 0; i < words.size(); ++i) words[i] = static_cast<std::uint32_t>(i * 2654435761u);
  const std::span<const std::byte> image = std::as_bytes(std::span(words)).first(2'500'001);
  for (const std::uint32_t max_data : {4000u, 768u << 10, (1u << 20) - 1, kUsbMaxData}) {
    SCOPED_TRACE(max_data);
    const auto transfers = usb_upload_transfers(image, max_data, 0xC0FFEEu, 5);
    ASSERT_FALSE(transfers.empty());
    std::vector<std::byte> rebuilt;
    std::vector<UsbType> types;
    std::uint64_t commit_crc = 0;
    UsbSplitter split(UsbDirection::kToBoard, max_data);
    for (const auto& t : transfers) {
      EXPECT_LE(t.size(), kUsbTransferBytes);
      auto fed = split.feed(t, [&](std::span<const std::byte> bytes) {
        auto m = decode_usb_message(bytes, UsbDirection::kToBoard, kBar0, max_data);
        EXPECT_TRUE(m.ok()) << describe_usb_problem(m.problem());
        if (!m) return false;
        EXPECT_EQ(m->tag, 5u);
        types.push_back(m->type);
        if (m->type == UsbType::kFwBegin) {
          EXPECT_EQ(m->arg[0], image.size());
        }
        if (m->type == UsbType::kFwData) {
          EXPECT_EQ(m->arg[0], rebuilt.size());
          rebuilt.insert(rebuilt.end(), m->data.begin(), m->data.end());
        }
        if (m->type == UsbType::kFwCommit) commit_crc = m->arg[0];
        return true;
      });
      ASSERT_TRUE(fed.ok());
    }
    EXPECT_EQ(split.held(), 0u);
    ASSERT_GE(types.size(), 3u);
    EXPECT_EQ(types.front(), UsbType::kFwBegin);
    EXPECT_EQ(types.back(), UsbType::kFwCommit);
    EXPECT_EQ(types.size(), 2 + (image.size() + max_data - 1) / max_data);
    ASSERT_EQ(rebuilt.size(), image.size());
    EXPECT_EQ(std::memcmp(rebuilt.data(), image.data(), image.size()), 0);
    EXPECT_EQ(commit_crc, 0xC0FFEEu);
  }
}

TEST(Usb, HeadersAreChecked) {
  auto m = msg(UsbType::kRegRead, 1, 0x10);
  write<std::uint32_t>(m, 0, 0x12345678);
  EXPECT_THAT(refused(m, UsbDirection::kToBoard), HasSubstr("out of step"));
  m = msg(UsbType::kRegRead, 1, 0x10);
  write<std::uint16_t>(m, 4, 0x77);
  EXPECT_EQ(refused(m, UsbDirection::kToBoard), "usb: message type 0x77 is unknown");
  EXPECT_THAT(refused(msg(UsbType::kRegRead, 1, 0x10, 0, {}, 0, 1), UsbDirection::kToBoard),
              HasSubstr("flags 0x1 are not defined for reg-read"));
  EXPECT_THAT(refused(msg(UsbType::kMemWrite, 1, 0, 0, std::vector<std::byte>(64)), UsbDirection::kToBoard, 32),
              HasSubstr("length 64 where 32 is the most"));
  EXPECT_THAT(refused(msg(UsbType::kRegValue, 1, 0x10, 0, {}, 0), UsbDirection::kToHost),
              HasSubstr("board messages are numbered from 1"));
  EXPECT_THAT(refused(msg(UsbType::kRegRead, 1, 0x10, 0, {}, 5), UsbDirection::kToBoard),
              HasSubstr("host messages carry sequence 0"));
  EXPECT_THAT(refused(msg(UsbType::kRegRead, 1, 0x10, 0, std::vector<std::byte>(4)), UsbDirection::kToBoard),
              HasSubstr("4 bytes of data on a message that carries none"));
  EXPECT_THAT(refused(msg(UsbType::kMemWrite, 1, 0x10), UsbDirection::kToBoard),
              HasSubstr("a message that carries data has none"));
}

TEST(Usb, ArgumentsAreChecked) {
  EXPECT_EQ(refused(msg(UsbType::kRegWrite, 1, 0x13, 1), UsbDirection::kToBoard),
            "usb: reg-write argument 0 = 0x13 is not 4-byte aligned");
  EXPECT_THAT(refused(msg(UsbType::kRegRead, 1, kBar0), UsbDirection::kToBoard), HasSubstr("is out of range"));
  EXPECT_THAT(refused(msg(UsbType::kRegWrite, 1, 0x10, 1ull << 32), UsbDirection::kToBoard),
              HasSubstr("argument 1 = 0x100000000 is out of range"));
  EXPECT_THAT(refused(msg(UsbType::kRegRead, 1, 0x10, 3), UsbDirection::kToBoard), HasSubstr("reserved, must be 0"));
  EXPECT_THAT(refused(msg(UsbType::kMemRead, 1, 0, 0), UsbDirection::kToBoard), HasSubstr("argument 1 = 0"));
  EXPECT_THAT(refused(msg(UsbType::kMemRead, 1, 0, kUsbMaxData + 1), UsbDirection::kToBoard),
              HasSubstr("is out of range"));
  EXPECT_THAT(refused(msg(UsbType::kHostRead, 1, ~0ull - 8, 64, {}, 1), UsbDirection::kToHost),
              HasSubstr("host-read argument 0"));
  EXPECT_THAT(refused(msg(UsbType::kFwBegin, 1, kMaxImageBytes + 1), UsbDirection::kToBoard),
              HasSubstr("fw-begin argument 0"));
  EXPECT_THAT(
      refused(msg(UsbType::kFwData, 1, kMaxImageBytes - 2, 0, std::vector<std::byte>(4)), UsbDirection::kToBoard),
      HasSubstr("fw-data argument 0"));
  EXPECT_THAT(refused(msg(UsbType::kFwCommit, 1, 1ull << 33), UsbDirection::kToBoard), HasSubstr("fw-commit"));
}

TEST(Usb, MappingsArePageGranularAndOnlyMapsCarryTheWriteFlag) {
  auto ok = decode_usb_message(msg(UsbType::kMapDma, 0, 1ull << 48, 4096, {}, 0, kUsbFlagDeviceWrites),
                               UsbDirection::kToBoard, kBar0);
  ASSERT_TRUE(ok.ok()) << describe_usb_problem(ok.problem());
  EXPECT_EQ(ok->flags, kUsbFlagDeviceWrites);
  EXPECT_EQ(refused(msg(UsbType::kMapDma, 0, (1ull << 48) + 8, 4096), UsbDirection::kToBoard),
            "usb: map-dma argument 0 = 0x1000000000008 is not a non-zero multiple of 4096");
  EXPECT_THAT(refused(msg(UsbType::kUnmapDma, 0, 1ull << 48, 0), UsbDirection::kToBoard),
              HasSubstr("unmap-dma argument 1 = 0 is not a non-zero multiple of 4096"));
  EXPECT_THAT(refused(msg(UsbType::kMapDma, 0, ~0ull - 4095, 8192), UsbDirection::kToBoard),
              HasSubstr("map-dma argument 0"));
  EXPECT_THAT(
      refused(msg(UsbType::kUnmapDma, 0, 1ull << 48, 4096, {}, 0, kUsbFlagDeviceWrites), UsbDirection::kToBoard),
      HasSubstr("flags 0x2 are not defined for unmap-dma"));
}

TEST(Usb, AHostDataFaultCarriesNoBytes) {
  auto ok = decode_usb_message(msg(UsbType::kHostData, 7, 0, 0, {}, 0, kUsbFlagFault), UsbDirection::kToBoard, kBar0);
  ASSERT_TRUE(ok.ok()) << describe_usb_problem(ok.problem());
  EXPECT_EQ(ok->flags, kUsbFlagFault);
  EXPECT_THAT(
      refused(msg(UsbType::kHostData, 7, 0, 0, std::vector<std::byte>(8), 0, kUsbFlagFault), UsbDirection::kToBoard),
      HasSubstr("carries none"));
  EXPECT_THAT(
      refused(msg(UsbType::kHostWrite, 7, 0, 0, std::vector<std::byte>(8), 1, kUsbFlagFault), UsbDirection::kToHost),
      HasSubstr("flags 0x1 are not defined for host-write"));
}

TEST(Usb, IdentityAndInterruptRecordsAreChecked) {
  UsbIdentity id{
      kUsbMagic, static_cast<std::uint32_t>(UsbMode::kApplication), 1684, Version{1, 2}.packed(), 0x01020003, 65536,
      {}};
  std::vector<std::byte> v(sizeof id);
  std::memcpy(v.data(), &id, sizeof id);
  auto r = decode_usb_identity(v);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->board_id, 1684u);
  EXPECT_FALSE(decode_usb_identity(std::span(v).first(60)).ok());
  id.mode = 3;
  std::memcpy(v.data(), &id, sizeof id);
  EXPECT_FALSE(decode_usb_identity(v).ok());
  id.mode = static_cast<std::uint32_t>(UsbMode::kLoader);
  id.max_data = kUsbMaxData * 2;
  std::memcpy(v.data(), &id, sizeof id);
  EXPECT_FALSE(decode_usb_identity(v).ok());
  id.max_data = 512;
  id.reserved[3] = 1;
  std::memcpy(v.data(), &id, sizeof id);
  EXPECT_FALSE(decode_usb_identity(v).ok());

  UsbInterrupt irq{kUsbMagic, 0b101, 42};
  std::vector<std::byte> w(sizeof irq);
  std::memcpy(w.data(), &irq, sizeof irq);
  auto i = decode_usb_interrupt(w);
  ASSERT_TRUE(i.ok());
  EXPECT_EQ(i->vectors, 0b101u);
  EXPECT_EQ(i->after_sequence, 42u);
  irq.vectors = 0;
  std::memcpy(w.data(), &irq, sizeof irq);
  EXPECT_FALSE(decode_usb_interrupt(w).ok());
  EXPECT_FALSE(decode_usb_interrupt(std::span(w).first(8)).ok());
}

}  // namespace
}  // namespace tpuhal::fw
