// decode_command / decode_segment / decode_failure / engine_accepts: the
// validating decoders on the host<->board boundary.
#include "tpuhal/fw/decode.h"
#include "tpuhal/fw/video.h"

#include <gtest/gtest.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <span>
#include <variant>
#include <vector>

namespace tpuhal::fw {
namespace {

CommandDescriptor make(Opcode op, std::array<std::uint64_t, 6> args = {}, std::uint16_t flags = 0,
                       std::uint64_t fence = 0, std::uint32_t sequence = 0) {
  CommandDescriptor d{};
  d.opcode = static_cast<std::uint16_t>(op);
  d.flags = flags;
  d.sequence = sequence;
  d.fence_value = fence;
  for (int i = 0; i < 6; ++i) d.args[i] = args[static_cast<std::size_t>(i)];
  return d;
}

// Asserts that `r` failed with exactly this problem.
void expect_problem(const Result<Command>& r, CmdStatus status, std::uint16_t field, std::uint64_t value) {
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.problem().status, status);
  EXPECT_EQ(r.problem().field, field);
  EXPECT_EQ(r.problem().value, value);
}

void expect_problem(const Result<Command>& r, CmdStatus status, std::uint16_t field, std::uint64_t value,
                    std::uint64_t detail) {
  expect_problem(r, status, field, value);
  if (!r.ok()) {
    EXPECT_EQ(r.problem().detail, detail);
  }
}

constexpr std::uint64_t kHost = kHostWindowBase;

// ---- Header fields ---------------------------------------------------------

TEST(FwDecode, ZeroedDescriptorIsAnInvalidOpcode) {
  CommandDescriptor d{};
  expect_problem(decode_command(d), CmdStatus::kInvalidOpcode, Problem::kFieldOpcode, 0);
}

TEST(FwDecode, OpcodePastTheLastOneIsInvalid) {
  for (std::uint16_t op : {std::uint16_t{kMaxOpcode + 1}, std::uint16_t{99}, std::uint16_t{0xFFFF}}) {
    SCOPED_TRACE(op);
    CommandDescriptor d{};
    d.opcode = op;
    expect_problem(decode_command(d), CmdStatus::kInvalidOpcode, Problem::kFieldOpcode, op);
  }
}

TEST(FwDecode, UndefinedFlagBitsAreRejected) {
  for (std::uint16_t flags :
       {std::uint16_t{1u << 2}, std::uint16_t{0x8000}, std::uint16_t{kFlagFence | kFlagInterrupt | 0x10}}) {
    SCOPED_TRACE(flags);
    auto d = make(Opcode::kNop, {}, flags, 1);
    expect_problem(decode_command(d), CmdStatus::kInvalidFlags, Problem::kFieldFlags, flags, kKnownFlags);
  }
}

TEST(FwDecode, FenceFlagNeedsANonZeroValueBelowTheFailedBit) {
  expect_problem(decode_command(make(Opcode::kNop, {}, kFlagFence, 0)), CmdStatus::kBadArgument, Problem::kFieldFence,
                 0, kTimelineValueMask);
  expect_problem(decode_command(make(Opcode::kNop, {}, kFlagFence, kTimelineFailed)), CmdStatus::kBadArgument,
                 Problem::kFieldFence, kTimelineFailed, kTimelineValueMask);
  expect_problem(decode_command(make(Opcode::kNop, {}, kFlagFence, UINT64_MAX)), CmdStatus::kBadArgument,
                 Problem::kFieldFence, UINT64_MAX, kTimelineValueMask);

  // The largest legal fence value, and any value when the flag is clear.
  auto top = decode_command(make(Opcode::kNop, {}, kFlagFence, kTimelineValueMask));
  ASSERT_TRUE(top.ok());
  EXPECT_EQ(top->fence_value, kTimelineValueMask);
  EXPECT_TRUE(decode_command(make(Opcode::kNop, {}, 0, UINT64_MAX)).ok());
  EXPECT_TRUE(decode_command(make(Opcode::kNop, {}, kFlagInterrupt, 0)).ok());
}

TEST(FwDecode, HeaderFieldsAreCopiedIntoTheCommand) {
  auto r = decode_command(make(Opcode::kNop, {}, kFlagFence | kFlagInterrupt, 42, 0xDEADBEEF));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->opcode, Opcode::kNop);
  EXPECT_EQ(r->flags, kFlagFence | kFlagInterrupt);
  EXPECT_EQ(r->fence_value, 42u);
  EXPECT_EQ(r->sequence, 0xDEADBEEFu);
  EXPECT_TRUE(std::holds_alternative<NopArgs>(r->args));
}

// ---- NOP ---------------------------------------------------------------------

TEST(FwDecode, NopRejectsEveryNonZeroArgument) {
  for (int i = 0; i < 6; ++i) {
    SCOPED_TRACE(i);
    std::array<std::uint64_t, 6> args{};
    args[static_cast<std::size_t>(i)] = 0x1234 + static_cast<std::uint64_t>(i);
    expect_problem(decode_command(make(Opcode::kNop, args)), CmdStatus::kReservedNotZero, static_cast<std::uint16_t>(i),
                   0x1234 + static_cast<std::uint64_t>(i));
  }
}

TEST(FwDecode, ReservedCheckReportsTheFirstNonZeroArgument) {
  expect_problem(decode_command(make(Opcode::kNop, {0, 0, 5, 0, 7, 0})), CmdStatus::kReservedNotZero, 2, 5);
}

// ---- COPY --------------------------------------------------------------------

TEST(FwDecode, CopyDecodesItsArguments) {
  auto r = decode_command(make(Opcode::kCopy, {kHost + 0x1000, 0x2000, 4096}));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->opcode, Opcode::kCopy);
  const auto* a = std::get_if<CopyArgs>(&r->args);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->src, kHost + 0x1000);
  EXPECT_EQ(a->dst, 0x2000u);
  EXPECT_EQ(a->size, 4096u);
}

TEST(FwDecode, CopyAllowsUnalignedAddressesAndTheMaximumSize) {
  auto r = decode_command(make(Opcode::kCopy, {3, 5, kMaxTransferBytes}));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(std::get<CopyArgs>(r->args).size, kMaxTransferBytes);
}

TEST(FwDecode, CopySizeMustBeBetweenOneAndTheTransferLimit) {
  expect_problem(decode_command(make(Opcode::kCopy, {0, 0x1000, 0})), CmdStatus::kBadArgument, 2, 0, kMaxTransferBytes);
  expect_problem(decode_command(make(Opcode::kCopy, {0, 0x1000, kMaxTransferBytes + 1})), CmdStatus::kBadArgument, 2,
                 kMaxTransferBytes + 1, kMaxTransferBytes);
}

TEST(FwDecode, CopyRangesThatWrapTheAddressSpaceAreRejected) {
  // src + size overflows 64 bits.
  expect_problem(decode_command(make(Opcode::kCopy, {UINT64_MAX - 10, 0, 16})), CmdStatus::kBadArgument, 0,
                 UINT64_MAX - 10);
  // dst + size overflows; src is fine.
  expect_problem(decode_command(make(Opcode::kCopy, {0, UINT64_MAX - 4095, 4096})), CmdStatus::kBadArgument, 1,
                 UINT64_MAX - 4095);
  // The last address that still fits.
  EXPECT_TRUE(decode_command(make(Opcode::kCopy, {UINT64_MAX - 16, 0, 16})).ok());
}

TEST(FwDecode, CopyRejectsNonZeroUnusedArguments) {
  for (int i = 3; i < 6; ++i) {
    SCOPED_TRACE(i);
    std::array<std::uint64_t, 6> args{0, 0x1000, 64};
    args[static_cast<std::size_t>(i)] = 1;
    expect_problem(decode_command(make(Opcode::kCopy, args)), CmdStatus::kReservedNotZero,
                   static_cast<std::uint16_t>(i), 1);
  }
}

// ---- COPY_SG -----------------------------------------------------------------

TEST(FwDecode, CopySgDecodesItsArguments) {
  auto r = decode_command(make(Opcode::kCopySg, {0x4000, 3, 12288}));
  ASSERT_TRUE(r.ok());
  const auto* a = std::get_if<CopySgArgs>(&r->args);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->list, 0x4000u);
  EXPECT_EQ(a->count, 3u);
  EXPECT_EQ(a->total, 12288u);
  EXPECT_TRUE(decode_command(make(Opcode::kCopySg, {kHost + 32, kMaxSgSegments, 1})).ok());
}

TEST(FwDecode, CopySgListMustBe32ByteAligned) {
  for (std::uint64_t list : {std::uint64_t{8}, std::uint64_t{16}, kHost + 4}) {
    SCOPED_TRACE(list);
    expect_problem(decode_command(make(Opcode::kCopySg, {list, 1, 64})), CmdStatus::kBadAlignment, 0, list,
                   sizeof(DmaSegment));
  }
}

TEST(FwDecode, CopySgSegmentCountMustBeBetweenOneAndTheLimit) {
  expect_problem(decode_command(make(Opcode::kCopySg, {0x4000, 0, 64})), CmdStatus::kBadArgument, 1, 0, kMaxSgSegments);
  expect_problem(decode_command(make(Opcode::kCopySg, {0x4000, kMaxSgSegments + 1, 64})), CmdStatus::kBadArgument, 1,
                 kMaxSgSegments + 1, kMaxSgSegments);
}

TEST(FwDecode, CopySgListThatWrapsTheAddressSpaceIsRejected) {
  const std::uint64_t list = UINT64_MAX - 31;  // 32-aligned, last segment slot
  expect_problem(decode_command(make(Opcode::kCopySg, {list, 2, 64})), CmdStatus::kBadArgument, 0, list);
}

TEST(FwDecode, CopySgTotalMustBeBetweenOneAndTheTransferLimit) {
  expect_problem(decode_command(make(Opcode::kCopySg, {0x4000, 1, 0})), CmdStatus::kBadArgument, 2, 0,
                 kMaxTransferBytes);
  expect_problem(decode_command(make(Opcode::kCopySg, {0x4000, 1, kMaxTransferBytes + 1})), CmdStatus::kBadArgument, 2,
                 kMaxTransferBytes + 1, kMaxTransferBytes);
}

TEST(FwDecode, CopySgRejectsNonZeroUnusedArguments) {
  expect_problem(decode_command(make(Opcode::kCopySg, {0x4000, 1, 64, 0, 0, 9})), CmdStatus::kReservedNotZero, 5, 9);
}

// ---- FILL --------------------------------------------------------------------

std::uint64_t pattern(std::uint32_t value, std::uint64_t width) { return value | width << 32; }

TEST(FwDecode, FillDecodesEachPatternWidth) {
  struct Case {
    std::uint32_t value;
    std::uint32_t width;
  };
  for (auto c : {Case{0xAB, 1}, Case{0xBEEF, 2}, Case{0xDEADBEEF, 4}}) {
    SCOPED_TRACE(c.width);
    auto r = decode_command(make(Opcode::kFill, {0x1000, 4096, pattern(c.value, c.width)}));
    ASSERT_TRUE(r.ok());
    const auto* a = std::get_if<FillArgs>(&r->args);
    ASSERT_NE(a, nullptr);
    EXPECT_EQ(a->dst, 0x1000u);
    EXPECT_EQ(a->size, 4096u);
    EXPECT_EQ(a->pattern, c.value);
    EXPECT_EQ(a->pattern_bytes, c.width);
  }
}

TEST(FwDecode, FillPatternWidthMustBeOneTwoOrFour) {
  for (std::uint64_t width : {0ull, 3ull, 5ull, 8ull, 0xFFFFFFFFull}) {
    SCOPED_TRACE(width);
    const std::uint64_t packed = pattern(0, width);
    expect_problem(decode_command(make(Opcode::kFill, {0x1000, 4096, packed})), CmdStatus::kBadArgument, 2, packed, 4);
  }
}

TEST(FwDecode, FillPatternMustFitItsWidth) {
  expect_problem(decode_command(make(Opcode::kFill, {0x1000, 4096, pattern(0x100, 1)})), CmdStatus::kBadArgument, 2,
                 pattern(0x100, 1), 1);
  expect_problem(decode_command(make(Opcode::kFill, {0x1000, 4096, pattern(0x10000, 2)})), CmdStatus::kBadArgument, 2,
                 pattern(0x10000, 2), 2);
  EXPECT_TRUE(decode_command(make(Opcode::kFill, {0x1000, 4096, pattern(0xFF, 1)})).ok());
  EXPECT_TRUE(decode_command(make(Opcode::kFill, {0x1000, 4096, pattern(0xFFFF, 2)})).ok());
}

TEST(FwDecode, FillSizeMustBeInRangeAndAMultipleOfTheWidth) {
  expect_problem(decode_command(make(Opcode::kFill, {0x1000, 0, pattern(1, 1)})), CmdStatus::kBadArgument, 1, 0,
                 kMaxTransferBytes);
  expect_problem(decode_command(make(Opcode::kFill, {0x1000, kMaxTransferBytes + 4, pattern(1, 4)})),
                 CmdStatus::kBadArgument, 1, kMaxTransferBytes + 4, kMaxTransferBytes);
  expect_problem(decode_command(make(Opcode::kFill, {0x1000, 6, pattern(1, 4)})), CmdStatus::kBadAlignment, 1, 6, 4);
  expect_problem(decode_command(make(Opcode::kFill, {0x1000, 3, pattern(1, 2)})), CmdStatus::kBadAlignment, 1, 3, 2);
  EXPECT_TRUE(decode_command(make(Opcode::kFill, {0x1001, 3, pattern(1, 1)})).ok());
}

TEST(FwDecode, FillDestinationMustBeAlignedToTheWidth) {
  expect_problem(decode_command(make(Opcode::kFill, {0x1002, 8, pattern(1, 4)})), CmdStatus::kBadAlignment, 0, 0x1002,
                 4);
  expect_problem(decode_command(make(Opcode::kFill, {0x1001, 8, pattern(1, 2)})), CmdStatus::kBadAlignment, 0, 0x1001,
                 2);
}

TEST(FwDecode, FillRangeThatWrapsTheAddressSpaceIsRejected) {
  const std::uint64_t dst = UINT64_MAX - 7;  // 8-aligned
  expect_problem(decode_command(make(Opcode::kFill, {dst, 16, pattern(1, 4)})), CmdStatus::kBadArgument, 0, dst);
}

TEST(FwDecode, FillRejectsNonZeroUnusedArguments) {
  expect_problem(decode_command(make(Opcode::kFill, {0x1000, 16, pattern(1, 1), 4})), CmdStatus::kReservedNotZero, 3,
                 4);
}

// ---- WAIT_VALUE --------------------------------------------------------------

TEST(FwDecode, WaitValueDecodesBothModes) {
  auto ge = decode_command(make(Opcode::kWaitValue, {kHost + 8, UINT64_MAX, 0}));
  ASSERT_TRUE(ge.ok());
  const auto* a = std::get_if<WaitValueArgs>(&ge->args);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->address, kHost + 8);
  EXPECT_EQ(a->value, UINT64_MAX);  // any value in >= mode
  EXPECT_EQ(a->mode, WaitMode::kGreaterEqual);

  auto tl = decode_command(make(Opcode::kWaitValue, {0x100, kTimelineValueMask, 1}));
  ASSERT_TRUE(tl.ok());
  EXPECT_EQ(std::get<WaitValueArgs>(tl->args).mode, WaitMode::kTimeline);
  EXPECT_EQ(std::get<WaitValueArgs>(tl->args).value, kTimelineValueMask);
}

TEST(FwDecode, WaitValueAddressMustBe8ByteAligned) {
  for (std::uint64_t addr : {std::uint64_t{4}, kHost + 1}) {
    SCOPED_TRACE(addr);
    expect_problem(decode_command(make(Opcode::kWaitValue, {addr, 1, 0})), CmdStatus::kBadAlignment, 0, addr, 8);
  }
}

TEST(FwDecode, WaitValueModeMustBeKnown) {
  for (std::uint64_t mode : {std::uint64_t{2}, UINT64_MAX}) {
    SCOPED_TRACE(mode);
    expect_problem(decode_command(make(Opcode::kWaitValue, {0x100, 1, mode})), CmdStatus::kBadArgument, 2, mode, 1);
  }
}

TEST(FwDecode, WaitValueTimelineValueMustNotCarryTheFailedBit) {
  expect_problem(decode_command(make(Opcode::kWaitValue, {0x100, kTimelineFailed, 1})), CmdStatus::kBadArgument, 1,
                 kTimelineFailed, kTimelineValueMask);
}

TEST(FwDecode, WaitValueRejectsNonZeroUnusedArguments) {
  expect_problem(decode_command(make(Opcode::kWaitValue, {0x100, 1, 0, 0, 2})), CmdStatus::kReservedNotZero, 4, 2);
}

// ---- WRITE_VALUE / TIMESTAMP ---------------------------------------------------

TEST(FwDecode, WriteValueDecodesAndChecksAlignment) {
  auto r = decode_command(make(Opcode::kWriteValue, {kHost + 64, 0x0123456789ABCDEF}));
  ASSERT_TRUE(r.ok());
  const auto* a = std::get_if<WriteValueArgs>(&r->args);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->address, kHost + 64);
  EXPECT_EQ(a->value, 0x0123456789ABCDEFu);

  expect_problem(decode_command(make(Opcode::kWriteValue, {0x104, 1})), CmdStatus::kBadAlignment, 0, 0x104, 8);
  expect_problem(decode_command(make(Opcode::kWriteValue, {0x100, 1, 3})), CmdStatus::kReservedNotZero, 2, 3);
}

TEST(FwDecode, TimestampDecodesAndChecksAlignment) {
  auto r = decode_command(make(Opcode::kTimestamp, {0x2000}));
  ASSERT_TRUE(r.ok());
  const auto* a = std::get_if<TimestampArgs>(&r->args);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->address, 0x2000u);

  expect_problem(decode_command(make(Opcode::kTimestamp, {0x2002})), CmdStatus::kBadAlignment, 0, 0x2002, 8);
  expect_problem(decode_command(make(Opcode::kTimestamp, {0x2000, 1})), CmdStatus::kReservedNotZero, 1, 1);
}

TEST(FwDecode, WaitTimeTakesABoardTimeUpTo2Pow62AndRunsOnEveryEngine) {
  for (std::uint64_t ns : {std::uint64_t{0}, std::uint64_t{40'000'000}, kMaxWaitTimeNs}) {
    auto r = decode_command(make(Opcode::kWaitTime, {ns}));
    ASSERT_TRUE(r.ok()) << ns;
    const auto* a = std::get_if<WaitTimeArgs>(&r->args);
    ASSERT_NE(a, nullptr);
    EXPECT_EQ(a->ns, ns);
  }
  EXPECT_EQ(kMaxWaitTimeNs, 1ull << 62);
  // Past it a modelled clock could overflow: refused, naming the time.
  expect_problem(decode_command(make(Opcode::kWaitTime, {kMaxWaitTimeNs + 1})), CmdStatus::kBadArgument, 0,
                 kMaxWaitTimeNs + 1, kMaxWaitTimeNs);
  expect_problem(decode_command(make(Opcode::kWaitTime, {5, 0, 0, 7})), CmdStatus::kReservedNotZero, 3, 7);
  for (EngineType e : {EngineType::kCompute, EngineType::kCopy, EngineType::kVideo})
    EXPECT_TRUE(engine_accepts(e, Opcode::kWaitTime)) << static_cast<int>(e);
  EXPECT_EQ(std::string(to_string(Opcode::kWaitTime)), "wait_time");
  EXPECT_EQ(arg_name(static_cast<std::uint16_t>(Opcode::kWaitTime), 0), "board time");
}

TEST(FwVideo, AFrameRecordCarriesTheTimeItWasFinishedInItsUnusedErrorWords) {
  FrameRecord r{};
  r.kind = static_cast<std::uint32_t>(RecordKind::kFrame);
  set_frame_done_ns(r, 0x1234'5678'9ABC'DEF0ull);
  EXPECT_EQ(frame_done_ns(r), 0x1234'5678'9ABC'DEF0ull);
  EXPECT_EQ(r.status, 0x9ABC'DEF0u);
  EXPECT_EQ(r.detail, 0x1234'5678u);
}

// ---- Byte-span entry point -----------------------------------------------------

TEST(FwDecode, SpanOfWrongLengthIsRejected) {
  std::array<std::byte, 128> buf{};
  for (std::size_t len : {std::size_t{0}, std::size_t{63}, std::size_t{65}, std::size_t{128}}) {
    SCOPED_TRACE(len);
    auto r = decode_command(std::span<const std::byte>(buf.data(), len));
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.problem().status, CmdStatus::kBadArgument);
    EXPECT_EQ(r.problem().field, Problem::kFieldLength);
    EXPECT_EQ(r.problem().value, len);
    EXPECT_EQ(r.problem().detail, 64u);
  }
}

TEST(FwDecode, SpanOf64BytesDecodesLikeTheStruct) {
  auto d = make(Opcode::kCopy, {0x10, 0x20, 0x30}, kFlagFence, 7, 5);
  std::array<std::byte, 64> bytes;
  std::memcpy(bytes.data(), &d, sizeof d);
  auto r = decode_command(std::span<const std::byte>(bytes));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->sequence, 5u);
  EXPECT_EQ(r->fence_value, 7u);
  EXPECT_EQ(std::get<CopyArgs>(r->args).size, 0x30u);

  // A bad descriptor through the span gives the struct decoder's problem.
  bytes[0] = std::byte{99};
  bytes[1] = std::byte{0};
  expect_problem(decode_command(std::span<const std::byte>(bytes)), CmdStatus::kInvalidOpcode, Problem::kFieldOpcode,
                 99);
}

// ---- Segments ----------------------------------------------------------------

TEST(FwDecodeSegment, ValidSegmentIsReturnedUnchanged) {
  DmaSegment s{kHost + 0x1000, 0x2000, 4096, 0};
  auto r = decode_segment(s);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->src, s.src);
  EXPECT_EQ(r->dst, s.dst);
  EXPECT_EQ(r->size, s.size);
}

TEST(FwDecodeSegment, InvalidSegmentsNameTheField) {
  struct Case {
    DmaSegment seg;
    CmdStatus status;
    std::uint16_t field;
    std::uint64_t value;
  };
  const Case cases[] = {
      {{0, 0x1000, 64, 5}, CmdStatus::kReservedNotZero, 3, 5},
      {{0, 0x1000, 0, 0}, CmdStatus::kBadArgument, 2, 0},
      {{0, 0x1000, kMaxTransferBytes + 1, 0}, CmdStatus::kBadArgument, 2, kMaxTransferBytes + 1},
      {{UINT64_MAX - 10, 0, 64, 0}, CmdStatus::kBadArgument, 0, UINT64_MAX - 10},
      {{0, UINT64_MAX - 10, 64, 0}, CmdStatus::kBadArgument, 1, UINT64_MAX - 10},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.value);
    auto r = decode_segment(c.seg);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.problem().status, c.status);
    EXPECT_EQ(r.problem().field, c.field);
    EXPECT_EQ(r.problem().value, c.value);
  }
}

// ---- Failure records -----------------------------------------------------------

TEST(FwDecodeFailure, KnownStatusIsCopiedFieldByField) {
  FenceRecord rec{};
  rec.value = 5 | kTimelineFailed;
  rec.error_status = static_cast<std::uint32_t>(CmdStatus::kDmaFault);
  rec.error_opcode = static_cast<std::uint16_t>(Opcode::kCopy);
  rec.error_field = 1;
  rec.error_sequence = 77;
  rec.error_fence = 6;
  rec.error_value = kHost + 0x5000;
  rec.error_detail = kAccessWrite;
  auto r = decode_failure(rec);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, CmdStatus::kDmaFault);
  EXPECT_EQ(r->opcode, 2u);
  EXPECT_EQ(r->field, 1u);
  EXPECT_EQ(r->sequence, 77u);
  EXPECT_EQ(r->fence, 6u);
  EXPECT_EQ(r->value, kHost + 0x5000);
  EXPECT_EQ(r->detail, kAccessWrite);
}

TEST(FwDecodeFailure, EveryKnownNonZeroStatusDecodes) {
  for (std::uint32_t s = 1; s <= static_cast<std::uint32_t>(CmdStatus::kOutOfMemory); ++s) {
    SCOPED_TRACE(s);
    FenceRecord rec{};
    rec.error_status = s;
    auto r = decode_failure(rec);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(static_cast<std::uint32_t>(r->status), s);
  }
}

TEST(FwDecodeFailure, ZeroOrUnknownStatusIsAFirmwareFault) {
  for (std::uint32_t s : {0u, 19u, 99u, 0xFFFFFFFFu}) {
    SCOPED_TRACE(s);
    FenceRecord rec{};
    rec.error_status = s;
    rec.error_opcode = 2;
    auto r = decode_failure(rec);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.problem().status, CmdStatus::kFirmwareFault);
    EXPECT_EQ(r.problem().field, Problem::kNoField);
    EXPECT_EQ(r.problem().value, s);
  }
}

TEST(FwStatus, KnownStatusesAndNames) {
  EXPECT_TRUE(is_known(0));
  EXPECT_TRUE(is_known(18));
  EXPECT_FALSE(is_known(19));
  EXPECT_FALSE(is_known(0xFFFFFFFF));
  EXPECT_STREQ(to_string(CmdStatus::kDmaFault), "DMA fault");
  EXPECT_STREQ(to_string(CmdStatus::kOk), "ok");
  EXPECT_STREQ(to_string(static_cast<CmdStatus>(99)), "unknown status");
  EXPECT_STREQ(to_string(Opcode::kCopySg), "copy_sg");
  EXPECT_STREQ(to_string(static_cast<Opcode>(99)), "unknown");
  EXPECT_STREQ(to_string(EngineType::kVideo), "video");
  EXPECT_STREQ(to_string(static_cast<EngineType>(9)), "unknown");
}

// ---- Engines -------------------------------------------------------------------

TEST(FwEngine, EveryRealEngineRunsEveryV1Opcode) {
  for (auto engine : {EngineType::kCompute, EngineType::kCopy, EngineType::kVideo}) {
    SCOPED_TRACE(to_string(engine));
    for (std::uint16_t op = 1; op <= kMaxOpcodeV1_0; ++op)
      EXPECT_TRUE(engine_accepts(engine, static_cast<Opcode>(op))) << op;
    EXPECT_FALSE(engine_accepts(engine, Opcode::kInvalid));
  }
}

TEST(FwEngine, NoEngineAndUnknownEnginesRunNothing) {
  for (std::uint16_t op = 0; op <= kMaxOpcodeV1_0; ++op) {
    EXPECT_FALSE(engine_accepts(EngineType::kNone, static_cast<Opcode>(op))) << op;
    EXPECT_FALSE(engine_accepts(static_cast<EngineType>(77), static_cast<Opcode>(op))) << op;
  }
}

// ---- Robustness ----------------------------------------------------------------

// Random descriptors, biased towards valid opcodes and sparse arguments so that
// the deeper checks run too: each either decodes to the opcode it carries with
// args of the matching type, or fails with a status the decoder documents.
TEST(FwDecodeFuzz, RandomDescriptorsDecodeOrGiveAKnownProblem) {
  std::mt19937_64 rng(0x7475686C);  // fixed seed: reproducible
  auto pick = [&](std::uint64_t n) { return rng() % n; };
  std::size_t decoded = 0;
  std::vector<std::size_t> per_status(16, 0);
  for (int iter = 0; iter < 100'000; ++iter) {
    CommandDescriptor d;
    std::array<std::uint64_t, 8> raw;
    for (auto& w : raw) w = rng();
    std::memcpy(&d, raw.data(), sizeof d);
    if (pick(4) != 0) d.opcode = static_cast<std::uint16_t>(pick(kMaxOpcodeV1_0 + 2));
    if (pick(2) == 0) d.flags &= kKnownFlags;
    if (pick(2) == 0) d.fence_value &= kTimelineValueMask;
    const std::uint64_t mode = pick(3);  // 0: raw bytes, 1: mixed, 2: plausible
    if (mode != 0) {
      for (int i = 0; i < 6; ++i) {
        switch (pick(5)) {
          case 0: d.args[i] = 0; break;
          case 1: d.args[i] &= 0xFFFF; break;
          case 2: d.args[i] &= ~std::uint64_t{31}; break;
          case 3: d.args[i] = pick(4096) * 8 + (pick(8) == 0 ? pick(8) : 0); break;
          default: break;
        }
      }
    }
    if (mode == 2) {
      // Unused arguments zero, as a well-behaved driver writes them.
      static constexpr int kUsedArgs[] = {0, 0, 3, 3, 3, 3, 2, 1, 0};
      for (int i = d.opcode <= kMaxOpcodeV1_0 + 1 ? kUsedArgs[d.opcode] : 6; i < 6; ++i) d.args[i] = 0;
    }
    if (d.opcode == static_cast<std::uint16_t>(Opcode::kFill) && pick(2) == 0)
      d.args[2] = (d.args[2] & 0xFF) | (std::uint64_t{1} << 32);

    auto r = decode_command(std::span<const std::byte>(reinterpret_cast<const std::byte*>(&d), sizeof d));
    if (r.ok()) {
      ++decoded;
      ASSERT_EQ(static_cast<std::uint16_t>(r->opcode), d.opcode);
      ASSERT_EQ(r->args.index(), static_cast<std::size_t>(d.opcode - 1)) << "opcode " << d.opcode;
      ASSERT_EQ(r->flags & ~kKnownFlags, 0);
      if (r->flags & kFlagFence) {
        ASSERT_NE(r->fence_value, 0u);
        ASSERT_EQ(r->fence_value & kTimelineFailed, 0u);
      }
    } else {
      const auto s = r.problem().status;
      ASSERT_TRUE(s == CmdStatus::kInvalidOpcode || s == CmdStatus::kInvalidFlags || s == CmdStatus::kReservedNotZero ||
                  s == CmdStatus::kBadArgument || s == CmdStatus::kBadAlignment)
          << "status " << static_cast<std::uint32_t>(s);
      ++per_status[static_cast<std::size_t>(s)];
      const auto f = r.problem().field;
      ASSERT_TRUE(f < 6 || (f >= Problem::kFieldOpcode && f <= Problem::kFieldFence)) << f;
      // Every problem can be put into words.
      ASSERT_FALSE(describe(r.problem(), d.opcode).empty());
    }
  }
  // The generator must reach both outcomes and every failure class, or the
  // test is not testing much.
  EXPECT_GT(decoded, 1000u);
  for (auto s : {CmdStatus::kInvalidOpcode, CmdStatus::kInvalidFlags, CmdStatus::kReservedNotZero,
                 CmdStatus::kBadArgument, CmdStatus::kBadAlignment})
    EXPECT_GT(per_status[static_cast<std::size_t>(s)], 100u) << to_string(s);
}

}  // namespace
}  // namespace tpuhal::fw
