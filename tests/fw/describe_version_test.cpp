// describe(): the one-line messages for problems and failures, and the
// interface version negotiation.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>

#include "tpuhal/fw/decode.h"
#include "tpuhal/fw/version.h"
#include "support/interface_version.hpp"

namespace tpuhal::fw {
namespace {

using ::testing::HasSubstr;

constexpr std::uint16_t op(Opcode o) { return static_cast<std::uint16_t>(o); }

// ---- describe ------------------------------------------------------------------

TEST(FwDescribe, DmaFaultNamesOpcodeFieldHexAddressAndAccess) {
  const std::string read = describe(CmdStatus::kDmaFault, op(Opcode::kCopy), 0, 0x1000000000, kAccessRead);
  EXPECT_EQ(read, "copy: src address 0x1000000000 is not mapped for DMA (read)");

  const std::string write =
      describe(CmdStatus::kDmaFault, op(Opcode::kCopy), 1, kHostWindowBase + 0xabc000, kAccessWrite);
  EXPECT_THAT(write, HasSubstr("copy: dst"));
  EXPECT_THAT(write, HasSubstr("0x1000000abc000"));
  EXPECT_THAT(write, HasSubstr("(write)"));
}

TEST(FwDescribe, DecodedProblemsRoundTripIntoMessages) {
  // Each message comes from what decode_command reported for a real descriptor.
  struct Case {
    CommandDescriptor d;
    const char* expected[3];
  };
  auto desc = [](Opcode o, std::uint64_t a0, std::uint64_t a1, std::uint64_t a2, std::uint64_t a3 = 0) {
    CommandDescriptor d{};
    d.opcode = static_cast<std::uint16_t>(o);
    d.args[0] = a0;
    d.args[1] = a1;
    d.args[2] = a2;
    d.args[3] = a3;
    return d;
  };
  const Case cases[] = {
      {desc(Opcode::kCopy, 0, 0x1000, 0), {"copy: size = 0 is out of range", "limit 1099511627776"}},
      {desc(Opcode::kCopy, 0, 0x1000, 64, 7), {"copy: unused arg3 is 0x7, must be zero"}},
      {desc(Opcode::kCopySg, 0x1004, 1, 64), {"copy_sg: segment list = 0x1004", "multiple of 32"}},
      {desc(Opcode::kCopySg, 0x1000, 0, 64), {"copy_sg: segment count = 0", "limit 65536"}},
      {desc(Opcode::kFill, 0x1000, 16, 3ull << 32), {"fill: pattern = 12884901888", "limit 4"}},
      {desc(Opcode::kFill, 0x1000, 6, 4ull << 32), {"fill: size = 0x6", "multiple of 4"}},
      {desc(Opcode::kWaitValue, 0x1001, 0, 0), {"wait_value: address = 0x1001", "multiple of 8"}},
      {desc(Opcode::kWaitValue, 0x1000, 0, 5), {"wait_value: mode = 5 is out of range"}},
      {desc(Opcode::kWriteValue, 0x1004, 0, 0), {"write_value: address = 0x1004"}},
      {desc(Opcode::kTimestamp, 0x1000, 1, 0), {"timestamp: unused arg1 is 0x1"}},
      {desc(Opcode::kCall, 0x1010, 1, 0), {"call: command list = 0x1010", "multiple of 64"}},
      {desc(Opcode::kCall, 0, 1, 0), {"call: command list is 0, which is never valid"}},
  };
  for (const auto& c : cases) {
    auto r = decode_command(c.d);
    ASSERT_FALSE(r.ok());
    const std::string msg = describe(r.problem(), c.d.opcode);
    SCOPED_TRACE(msg);
    for (const char* want : c.expected)
      if (want) {
        EXPECT_THAT(msg, HasSubstr(want));
      }
  }
}

TEST(FwDescribe, HeaderProblemsNameTheirField) {
  CommandDescriptor d{};
  d.opcode = 99;
  auto r = decode_command(d);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(describe(r.problem(), d.opcode), "unknown opcode 0x63 (interface " + test::interface_version_text() +
                                                 " defines 1.." + std::to_string(kMaxOpcode) + ")");

  d.opcode = op(Opcode::kNop);
  d.flags = kFlagFence | 0x40;
  d.fence_value = 1;
  r = decode_command(d);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(describe(r.problem(), d.opcode), "nop: undefined flag bits 0x40 in flags 0x41");

  d.flags = kFlagFence;
  d.fence_value = 0;
  r = decode_command(d);
  ASSERT_FALSE(r.ok());
  const std::string fence = describe(r.problem(), d.opcode);
  EXPECT_THAT(fence, HasSubstr("nop: fence value = 0 is out of range"));
  EXPECT_THAT(fence, HasSubstr("limit 9223372036854775807"));
}

TEST(FwDescribe, BoardSideStatusesReadWell) {
  EXPECT_EQ(describe(CmdStatus::kBadSequence, op(Opcode::kNop), Problem::kFieldSequence, 17, 3),
            "nop: descriptor sequence 17 where the ring position is 3 (stale or corrupt ring slot)");
  EXPECT_EQ(describe(CmdStatus::kFenceNotMonotonic, op(Opcode::kCopy), Problem::kFieldFence, 4, 9),
            "copy: fence value 4 is not greater than the last one written, 9");
  EXPECT_EQ(describe(CmdStatus::kDependencyFailed, op(Opcode::kWaitValue), 0, 0x2000, 0),
            "wait_value: the timeline at 0x2000 that this queue waits on has failed");
  EXPECT_EQ(describe(CmdStatus::kUnsupportedOnEngine, op(Opcode::kFill), Problem::kFieldOpcode, 4,
                     static_cast<std::uint64_t>(EngineType::kCopy)),
            "fill is not supported on a copy queue");
  EXPECT_EQ(describe(CmdStatus::kRingConfig, 0, Problem::kFieldSequence, 0x40, 0),
            "ring configuration rejected: sequence = 0x40");
  EXPECT_EQ(describe(CmdStatus::kFirmwareFault, 0, Problem::kNoField, 99, 0), "firmware fault (code 0x63)");
  EXPECT_EQ(describe(CmdStatus::kEccError, op(Opcode::kCopy), 0, 0xdead000, 0),
            "copy: uncorrectable ECC error at device address 0xdead000");
  EXPECT_EQ(describe(CmdStatus::kHang, op(Opcode::kFill), Problem::kNoField, 2'500'000'000, 0),
            "fill: stopped by the board's watchdog after 2500 ms");
  EXPECT_EQ(describe(CmdStatus::kQueueReset, op(Opcode::kCopySg), Problem::kNoField, 0, 0),
            "copy_sg: discarded by a queue reset");
  EXPECT_EQ(describe(CmdStatus::kOk, op(Opcode::kTimestamp), Problem::kNoField, 0, 0), "timestamp: ok");
}

TEST(FwDescribe, UnknownOpcodeAndStatusAreShownRaw) {
  EXPECT_THAT(describe(CmdStatus::kDmaFault, 0x1234, 0, 0x10, kAccessRead),
              HasSubstr("opcode 0x1234: arg0 address 0x10"));
  EXPECT_EQ(describe(static_cast<CmdStatus>(77), op(Opcode::kNop), 0, 0, 0), "unknown status 77 for nop");
}

TEST(FwDescribe, FailureOverloadUsesTheRecordedOpcode) {
  Failure f;
  f.status = CmdStatus::kDmaFault;
  f.opcode = op(Opcode::kFill);
  f.field = 0;
  f.value = kHostWindowBase;
  f.detail = kAccessWrite;
  EXPECT_EQ(describe(f), "fill: dst address 0x1000000000000 is not mapped for DMA (write)");
}

TEST(FwDescribe, VersionAndLengthProblems) {
  auto v = negotiate(Version{2, 3}, Version{1, 0}, Version{1, 4});
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(describe(v.problem(), 0), "interface version 2.3 is not compatible with 1.4");

  auto l = decode_command(std::span<const std::byte>{});
  ASSERT_FALSE(l.ok());
  EXPECT_EQ(describe(l.problem(), 0), "descriptor of 0 bytes, expected 64");
}

TEST(FwDescribe, ArgNames) {
  EXPECT_EQ(arg_name(op(Opcode::kCopy), 0), "src");
  EXPECT_EQ(arg_name(op(Opcode::kCopy), 2), "size");
  EXPECT_EQ(arg_name(op(Opcode::kCopySg), 1), "segment count");
  EXPECT_EQ(arg_name(op(Opcode::kFill), 2), "pattern");
  EXPECT_EQ(arg_name(op(Opcode::kWaitValue), 2), "mode");
  EXPECT_EQ(arg_name(op(Opcode::kWriteValue), 2), "arg2");
  EXPECT_EQ(arg_name(op(Opcode::kTimestamp), 1), "arg1");
  EXPECT_EQ(arg_name(op(Opcode::kNop), 0), "arg0");
  EXPECT_EQ(arg_name(op(Opcode::kCopy), 5), "arg5");
  EXPECT_EQ(arg_name(999, 0), "arg0");
}

// ---- Versions ------------------------------------------------------------------

TEST(FwDescribe, AnIndexOutsideItsAxisIsNamedWithTheAxisLength) {
  const Problem p{CmdStatus::kBadArgument, tensor_data_field(1), static_cast<std::uint64_t>(std::int64_t{-9}), 5};
  EXPECT_EQ(describe(p.status, static_cast<std::uint16_t>(Opcode::kTensorOp), p.field, p.value, p.detail),
            "tensor_op: tensor 1 holds the index -9, outside [-5, 5) (the length of the indexed axis)");
  // The field has a name of its own, apart from the attribute words.
  EXPECT_EQ(
      describe(CmdStatus::kReservedNotZero, static_cast<std::uint16_t>(Opcode::kTensorOp), tensor_data_field(2), 5, 0),
      "tensor_op: unused tensor 2 data is 0x5, must be zero");
}

TEST(FwDescribe, ARefusedRowIsNamedWithWhatIsWrongWithIt) {
  const auto op = static_cast<std::uint16_t>(Opcode::kTensorOp);
  EXPECT_EQ(describe(CmdStatus::kBadArgument, op, tensor_row_field(1), 3, 1u << 20),
            "tensor_op: row 3 of tensor 1 asks for more than 1048576 samples (the most one row may take)");
  EXPECT_EQ(describe(CmdStatus::kBadArgument, op, tensor_row_field(1), 0, 0),
            "tensor_op: row 0 of tensor 1 holds a value that is not finite once scaled");
  EXPECT_EQ(describe(CmdStatus::kReservedNotZero, op, tensor_row_field(9), 5, 0),
            "tensor_op: unused tensor 9 row is 0x5, must be zero");
}

TEST(FwVersion, PackAndUnpack) {
  EXPECT_EQ((Version{1, 0}.packed()), 0x00010000u);
  EXPECT_EQ((Version{0xABCD, 0x1234}.packed()), 0xABCD1234u);
  EXPECT_EQ(Version::unpack(0xABCD1234), (Version{0xABCD, 0x1234}));
}

// The interface's minor is at least the newest kind's (schema/ops.py): a new
// kind raises it; the test itself names no version.
TEST(FwVersion, TheInterfaceMinorCoversEveryKind) {
  EXPECT_EQ(kInterfaceVersion.major, 1);
  std::uint16_t newest = 0;
  for (const auto& k : kOpKinds) newest = std::max(newest, k.minor);
  EXPECT_GE(kInterfaceVersion.minor, newest);
}

TEST(FwVersion, NegotiatePicksTheSmallerMinorOfTheSameMajor) {
  struct Case {
    Version board, min, max, agreed;
  };
  const Case cases[] = {
      {{1, 0}, {1, 0}, {1, 0}, {1, 0}}, {{1, 5}, {1, 0}, {1, 3}, {1, 3}},  // board newer: driver's max
      {{1, 2}, {1, 0}, {1, 7}, {1, 2}},                                    // driver newer: board's minor
      {{1, 2}, {1, 2}, {1, 7}, {1, 2}},                                    // exactly the driver's minimum
      {{3, 9}, {3, 1}, {3, 9}, {3, 9}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.board.packed());
    auto r = negotiate(c.board, c.min, c.max);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(*r, c.agreed);
  }
}

TEST(FwVersion, NegotiateRejectsOtherMajorsAndTooOldMinors) {
  struct Case {
    Version board, min, max;
  };
  const Case cases[] = {
      {{2, 0}, {1, 0}, {1, 9}},  // newer major
      {{0, 9}, {1, 0}, {1, 9}},  // older major
      {{1, 1}, {1, 2}, {1, 5}},  // board's minor below the driver's minimum
      {{1, 3}, {0, 0}, {1, 5}},  // driver range spans majors
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.board.packed());
    auto r = negotiate(c.board, c.min, c.max);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.problem().status, CmdStatus::kBadArgument);
    EXPECT_EQ(r.problem().field, Problem::kFieldVersion);
    EXPECT_EQ(r.problem().value, c.board.packed());
    EXPECT_EQ(r.problem().detail, c.max.packed());
  }
}

TEST(FwVersion, BoardAcceptsSameMajorUpToItsMinor) {
  const Version board{1, 3};
  for (std::uint16_t minor = 0; minor <= 3; ++minor) {
    auto r = accept_driver_version(board, Version{1, minor}.packed());
    ASSERT_TRUE(r.ok()) << minor;
    EXPECT_EQ(*r, (Version{1, minor}));
  }
}

TEST(FwVersion, BoardRejectsNewerMinorOrOtherMajor) {
  const Version board{1, 3};
  for (std::uint32_t requested :
       {Version{1, 4}.packed(), Version{2, 0}.packed(), Version{0, 3}.packed(), 0u, 0xFFFFFFFFu}) {
    SCOPED_TRACE(requested);
    auto r = accept_driver_version(board, requested);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.problem().status, CmdStatus::kBadArgument);
    EXPECT_EQ(r.problem().field, Problem::kFieldVersion);
    EXPECT_EQ(r.problem().value, requested);
    EXPECT_EQ(r.problem().detail, board.packed());
  }
}

}  // namespace
}  // namespace tpuhal::fw
