// The board's timing model (docs/timing.md): what commands cost, pinned per
// profile, and the simulated board keeping that time on its clock.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <vector>

#include "support/error_of.hpp"
#include "tpuhal/driver/driver.hpp"
#include "tpuhal/skeleton/skeleton.h"
#include "tpuhal/tpuhal.hpp"

namespace tpuhal {
namespace {

using test::error_of;

// Buffers and the ops the tests cost: a 3x3 convolution of 3 channels into
// 16 (8x8, padded), a [64, 128] x [128, 256] product, a 1024-element add.
struct Work {
  Device dev;
  Buffer x, w, y, a, b, c, u, v, s;
  Op conv, matmul, add;
  explicit Work(const char* uri) : dev(open(uri)) {
    x = dev.allocate(3 * 64 * 4);
    w = dev.allocate(16 * 27 * 4);
    y = dev.allocate(16 * 64 * 4);
    a = dev.allocate(64 * 128 * 4);
    b = dev.allocate(128 * 256 * 4);
    c = dev.allocate(64 * 256 * 4);
    u = dev.allocate(1024 * 4);
    v = dev.allocate(1024 * 4);
    s = dev.allocate(1024 * 4);
    for (Buffer* buf : {&x, &w, &a, &b, &u, &v}) dev.queue().batch().fill(*buf, 0, buf->size(), 0).submit().wait();
    ops::Conv2dOptions o;
    o.pads = {1, 1, 1, 1};
    conv = ops::conv2d(Tensor(x, DType::F32, {1, 3, 8, 8}), Tensor(w, DType::F32, {16, 3, 3, 3}),
                       Tensor(y, DType::F32, {1, 16, 8, 8}), o);
    matmul = ops::matmul(Tensor(a, DType::F32, {64, 128}), Tensor(b, DType::F32, {128, 256}),
                         Tensor(c, DType::F32, {64, 256}));
    add = ops::add(Tensor(u, DType::F32, {1024}), Tensor(v, DType::F32, {1024}), Tensor(s, DType::F32, {1024}));
  }
  std::uint64_t ns(const Op& op) const { return dev.modelled(op).value().ns; }
};

TEST(Timing, GivenTinyWhenOpsAreCostedThenEachIsItsRooflinePlusFixedCosts) {
  // tiny: 500 MHz, 8 lanes, fp32 16 MACs per lane and cycle at 50 %: 32e9
  // MAC/s; vector unit 8 fp32 elements per lane and cycle: 32e9/s; DRAM
  // 16000 MB/s; op_ns 2000 + command_ns 200. Activations up to a quarter
  // of the local memory (8 lanes x 64 KiB / 4 = 128 KiB) stay on chip;
  // weights stream from DRAM.
  Work t("sim:tiny");
  // conv: 16 x 64 outputs x 3 x 9 taps = 27648 MACs (16 channels fill
  // 2 x 8 lanes; fp32 tiles are 1 channel): 864 ns. W's 1728 bytes: 108 ns.
  // The fixed 2200 ns exceed both.
  const ModelledTime conv = t.dev.modelled(t.conv).value();
  EXPECT_EQ(conv.compute_ns, 864u);
  EXPECT_EQ(conv.memory_ns, 108u);
  EXPECT_EQ(conv.overhead_ns, 2200u);
  EXPECT_EQ(conv.ns, 864u + 2200u);
  EXPECT_EQ(conv.bound, ModelledTime::Bound::Overhead);
  // matmul: 64 x 256 x 128 = 2097152 MACs: 65536 ns; A, B and Y (32, 128
  // and 64 KiB) all fit on chip.
  const ModelledTime mm = t.dev.modelled(t.matmul).value();
  EXPECT_EQ(mm.compute_ns, 65536u);
  EXPECT_EQ(mm.memory_ns, 0u);
  EXPECT_EQ(mm.ns, 65536u + 2200u);
  EXPECT_EQ(mm.bound, ModelledTime::Bound::Compute);
  // add: 1024 elements at one cycle each: 32 ns, on chip.
  const ModelledTime add = t.dev.modelled(t.add).value();
  EXPECT_EQ(add.compute_ns, 32u);
  EXPECT_EQ(add.memory_ns, 0u);
  EXPECT_EQ(add.ns, 32u + 2200u);
  // An activation whose slice along the output's first dimension (what a
  // compiler runs a group of layers by: an image, a row) passes the local
  // memory's share streams from DRAM: a batch of two [512, 256] products,
  // each image's A 256 KiB and Y 512 KiB. B (128 KiB) stays on chip.
  Buffer big_a = t.dev.allocate(2 * 512 * 128 * 4), big_y = t.dev.allocate(2 * 512 * 256 * 4);
  const Op batch = ops::matmul(Tensor(big_a, DType::F32, {2, 512, 128}), Tensor(t.b, DType::F32, {128, 256}),
                               Tensor(big_y, DType::F32, {2, 512, 256}));
  // A's 512 KiB and Y's 1 MiB: 1572864 bytes at 16000 MB/s.
  EXPECT_EQ(t.dev.modelled(batch).value().memory_ns, 98304u);
  // The same numbers as one [1024, 256] product: its slices are rows of
  // 512 and 1024 bytes, all on chip.
  const Op rows = ops::matmul(Tensor(big_a, DType::F32, {1024, 128}), Tensor(t.b, DType::F32, {128, 256}),
                              Tensor(big_y, DType::F32, {1024, 256}));
  EXPECT_EQ(t.dev.modelled(rows).value().memory_ns, 0u);
  // A batch of four images of 64 KiB: 256 KiB each operand, but one image
  // of each fits, so all stay on chip.
  Buffer p = t.dev.allocate(4 * 16 * 32 * 32 * 4), q = t.dev.allocate(4 * 16 * 32 * 32 * 4),
         r = t.dev.allocate(4 * 16 * 32 * 32 * 4);
  const Op images = ops::add(Tensor(p, DType::F32, {4, 16, 32, 32}), Tensor(q, DType::F32, {4, 16, 32, 32}),
                             Tensor(r, DType::F32, {4, 16, 32, 32}));
  EXPECT_EQ(t.dev.modelled(images).value().memory_ns, 0u);
  // A matrix product's B is needed whole by every row, even where its
  // first dimension (K) is as long as A's rows: [256, 2048] is 2 MiB,
  // 131072 ns, while A's and Y's rows (1 and 8 KiB) stay on chip.
  Buffer sq_a = t.dev.allocate(256 * 256 * 4), wide_b = t.dev.allocate(256 * 2048 * 4),
         wide_y = t.dev.allocate(256 * 2048 * 4);
  const Op wide = ops::matmul(Tensor(sq_a, DType::F32, {256, 256}), Tensor(wide_b, DType::F32, {256, 2048}),
                              Tensor(wide_y, DType::F32, {256, 2048}));
  EXPECT_EQ(t.dev.modelled(wide).value().memory_ns, 131072u);
  // So is a gather's table along axis 0: each output row reads any of its
  // rows. [2048, 64] is 512 KiB, 32768 ns.
  Buffer table = t.dev.allocate(2048 * 64 * 4), rows_of = t.dev.allocate(2048 * 4), got = t.dev.allocate(2048 * 64 * 4);
  const Op lookup = ops::gather(Tensor(table, DType::F32, {2048, 64}), Tensor(rows_of, DType::I32, {2048}),
                                Tensor(got, DType::F32, {2048, 64}), 0);
  EXPECT_EQ(t.dev.modelled(lookup).value().memory_ns, 32768u);
  // A slice of a strided view is what one image of the view spans: a copy
  // into the first 32 of 64 channels of a [2, 64, 32, 32] tensor (a
  // Concat's part) writes 128 KiB per image, on chip, though the view
  // spans 384 KiB from its first image to its last.
  Buffer part = t.dev.allocate(2 * 32 * 32 * 32 * 4), whole = t.dev.allocate(2 * 64 * 32 * 32 * 4);
  const Op into = ops::cast(Tensor(part, DType::F32, {2, 32, 32, 32}),
                            Tensor(whole, DType::F32, {2, 32, 32, 32}, {64 * 32 * 32, 32 * 32, 32, 1}, 0));
  EXPECT_EQ(t.dev.modelled(into).value().memory_ns, 0u);
}

TEST(Timing, GivenEveryBuiltInProfileWhenTheSameOpsAreCostedThenTheFiguresArePinned) {
  // Integer arithmetic on the descriptor: these hold on every host, ISA
  // level (scripts/test.sh runs this at each) and under qemu-aarch64.
  struct Pinned {
    const char* uri;
    std::uint64_t conv, matmul, add;
  };
  for (const Pinned& p : {Pinned{"sim:tiny", 3064, 67736, 2232}, Pinned{"sim:edge-soc", 4516, 20684, 4310},
                          Pinned{"sim:bm1684x", 654, 4315, 451}}) {
    SCOPED_TRACE(p.uri);
    const Work t(p.uri);
    EXPECT_EQ(t.ns(t.conv), p.conv);
    EXPECT_EQ(t.ns(t.matmul), p.matmul);
    EXPECT_EQ(t.ns(t.add), p.add);
  }
}

// An op placed on its own (Op::set_global, interface 1.18) streams every
// tensor from device memory, and a permute's gathered side one element per
// 32-byte burst; the result is the same either way.
TEST(Timing, GivenAGlobalOpWhenCostedThenEveryTensorStreamsAndAPermutedReadMovesABurstPerElement) {
  Device dev = open("sim:tiny");  // 16000 MB/s of device memory
  Buffer x = dev.allocate(2 * 3 * 8 * 16 * 4), y = dev.allocate(2 * 3 * 16 * 8 * 4);
  Buffer staging = dev.allocate(x.size(), Memory::HostPinned);
  auto* in = reinterpret_cast<float*>(staging.map().data());
  for (int i = 0; i < 2 * 3 * 8 * 16; ++i) in[i] = static_cast<float>(i);
  dev.queue().copy(staging, x).submit().wait();
  Op grouped = ops::transpose(Tensor(x, DType::F32, {2, 3, 8, 16}), Tensor(y, DType::F32, {2, 3, 16, 8}), {0, 1, 3, 2});
  EXPECT_FALSE(grouped.global());
  Op alone = grouped;
  EXPECT_TRUE(alone.set_global().global());
  EXPECT_FALSE(grouped.global());  // a copy: the first op keeps its placement
  // Grouped, both 3 KiB tensors stay on chip.
  EXPECT_EQ(dev.modelled(grouped).value().memory_ns, 0u);
  // Alone: 768 elements read out of order at 32 bytes each (24576) and the
  // 3072 bytes written in order, 27648 bytes at 16000 MB/s.
  const ModelledTime t = dev.modelled(alone).value();
  EXPECT_EQ(t.memory_ns, 1728u);
  EXPECT_EQ(t.compute_ns, dev.modelled(grouped).value().compute_ns);  // the same work on the vector unit
  EXPECT_EQ(t.ns, std::max(t.compute_ns, t.memory_ns) + t.overhead_ns);
  // An op that reads in order streams its bytes: three 4 KiB tensors.
  Buffer u = dev.allocate(4096), v = dev.allocate(4096), w = dev.allocate(4096);
  Op add = ops::add(Tensor(u, DType::F32, {1024}), Tensor(v, DType::F32, {1024}), Tensor(w, DType::F32, {1024}));
  EXPECT_EQ(dev.modelled(add).value().memory_ns, 0u);
  EXPECT_EQ(dev.modelled(add.set_global()).value().memory_ns, 768u);
  // Both placements compute the same.
  std::vector<float> got[2];
  for (int i = 0; i < 2; ++i) {
    dev.queue().fill(y, 0, y.size(), 0).run(i ? alone : grouped).copy(y, staging).submit().wait();
    got[i].assign(in, in + 2 * 3 * 16 * 8);
  }
  EXPECT_EQ(got[0], got[1]);
  EXPECT_EQ(got[0][1], 16.0f);  // y[0, 0, 0, 1] = x[0, 0, 1, 0]
  EXPECT_EQ(error_of([] { Op().set_global(); }).status(), Status::FailedPrecondition);
}

// A convolution accumulating into y reads y too: alone (DDR to DDR), y's
// 4096 bytes move twice. x 768, w 1728, y 4096 bytes at 16000 MB/s: 412 ns,
// and 668 accumulating.
TEST(Timing, GivenAnAccumulatingConvolutionWhenCostedAloneThenItsOutputMovesInAndOut) {
  Work t("sim:tiny");
  ops::Conv2dOptions o;
  o.pads = {1, 1, 1, 1};
  const Tensor x(t.x, DType::F32, {1, 3, 8, 8}), w(t.w, DType::F32, {16, 3, 3, 3}), y(t.y, DType::F32, {1, 16, 8, 8});
  Op plain = ops::conv2d(x, w, y, o);
  o.accumulate = true;
  Op accumulating = ops::conv2d(x, w, y, o);
  EXPECT_EQ(t.dev.modelled(plain.set_global()).value().memory_ns, 412u);
  EXPECT_EQ(t.dev.modelled(accumulating.set_global()).value().memory_ns, 668u);
  EXPECT_EQ(accumulating.cost().bytes, plain.cost().bytes + 4096);
}

TEST(Timing, GivenFewInputChannelsOrDepthwiseWhenCostedThenTheyFillFewTilesOfEachLane) {
  Device dev = open("sim:bm1684x");  // fp16: tiles of 16 input channels, 64 lanes
  Buffer x = dev.allocate(64 * 32 * 32 * 2), y = dev.allocate(64 * 32 * 32 * 2);
  Buffer wd = dev.allocate(64 * 9 * 2), wf = dev.allocate(64 * 64 * 9 * 2);
  ops::Conv2dOptions o;
  o.pads = {1, 1, 1, 1};
  const Tensor xt(x, DType::F16, {1, 64, 32, 32}), yt(y, DType::F16, {1, 64, 32, 32});
  const Op full = ops::conv2d(xt, Tensor(wf, DType::F16, {64, 64, 3, 3}), yt, o);
  o.groups = 64;
  const Op depthwise = ops::conv2d(xt, Tensor(wd, DType::F16, {64, 1, 3, 3}), yt, o);
  // 64 times the multiply-adds, but the depthwise one pads its 1 input
  // channel to a tile of 16: its array time is a quarter of the full one's.
  const ModelledTime f = dev.modelled(full).value(), d = dev.modelled(depthwise).value();
  EXPECT_NEAR(static_cast<double>(f.compute_ns) / static_cast<double>(d.compute_ns), 4.0, 0.01);
}

TEST(Timing, GivenCopiesFillsAndFramesWhenCostedThenTheyGoAtTheirUnitsRates) {
  Device dev = open("sim:bm1684x");
  // The bus: 3500 MB/s each way, 200 ns a command.
  EXPECT_EQ(dev.modelled_copy(1'000'000, Memory::HostPinned, Memory::Device).value().ns, 285'715u + 200u);
  EXPECT_EQ(dev.modelled_copy(1'000'000, Memory::Device, Memory::HostPinned).value().ns, 285'715u + 200u);
  EXPECT_EQ(dev.modelled_copy(1'000'000, Memory::Device, Memory::DeviceHostVisible).value().bound,
            ModelledTime::Bound::Memory);
  // 1080p at 1.7 Gpixel/s; an I frame 150 %, a B frame 110 %; JPEG at its own rate.
  const std::uint64_t p = dev.modelled_decode_ns(Codec::H264, FrameType::Predicted, 1920, 1080).value();
  EXPECT_EQ(p, 1'219'765u);
  EXPECT_EQ(dev.modelled_decode_ns(Codec::H264, FrameType::Intra, 1920, 1080).value(), 1'829'648u);
  EXPECT_EQ(dev.modelled_decode_ns(Codec::H265, FrameType::Bidirectional, 1920, 1080).value(), 1'341'742u);
  // 600 frames of 1080p a second.
  EXPECT_EQ(dev.modelled_decode_ns(Codec::Jpeg, FrameType::Intra, 1920, 1080).value(), 1'666'667u);
}

TEST(Timing, GivenABatchWhenItRunsThenItsStampsDifferByExactlyTheModelledCosts) {
  Work t("sim:tiny");
  ASSERT_TRUE(t.dev.properties().caps.modelled_time);
  Buffer stamps = t.dev.allocate(4 * 8, Memory::HostPinned);
  for (int round = 0; round < 3; ++round) {
    t.dev.queue()
        .batch()
        .timestamp(stamps, 0)
        .run(t.conv)
        .timestamp(stamps, 8)
        .run(t.matmul)
        .timestamp(stamps, 16)
        .run(t.add)
        .timestamp(stamps, 24)
        .submit()
        .wait();
    std::uint64_t s[4];
    std::memcpy(s, stamps.map().data(), sizeof s);
    EXPECT_EQ(s[1] - s[0], t.ns(t.conv)) << "round " << round;
    EXPECT_EQ(s[2] - s[1], t.ns(t.matmul)) << "round " << round;
    EXPECT_EQ(s[3] - s[2], t.ns(t.add)) << "round " << round;
  }
}

TEST(Timing, GivenTwoComputeQueuesWhenBothRunOnTheTensorEngineThenTheirOpsDoNotOverlap) {
  Work t("sim:tiny");
  Queue q0 = t.dev.queue(), q1 = t.dev.queue();
  const std::uint64_t m = t.ns(t.matmul);
  for (int round = 0; round < 3; ++round) {
    Fence f0 = q0.batch().run(t.matmul).submit();
    Fence f1 = q1.batch().run(t.matmul).submit();
    f0.wait();
    f1.wait();
    const std::uint64_t a = f0.timestamp_ns().value(), b = f1.timestamp_ns().value();
    EXPECT_GE(a > b ? a - b : b - a, m) << "the two products shared the engine, round " << round;
  }
}

TEST(Timing, GivenAQueueWaitingOnAnotherWhenItGoesOnThenItStartsAfterTheOthersModelledFence) {
  Work t("sim:tiny");
  Queue q0 = t.dev.queue(), q1 = t.dev.queue();
  Buffer stamp = t.dev.allocate(8, Memory::HostPinned);
  Batch slow = q0.batch();
  for (int i = 0; i < 20; ++i) slow.run(t.matmul);
  const Fence f0 = slow.submit();
  q1.batch().wait(f0).timestamp(stamp, 0).submit().wait();
  std::uint64_t s = 0;
  std::memcpy(&s, stamp.map().data(), sizeof s);
  EXPECT_GE(s, f0.timestamp_ns().value());
}

// TPUHAL_SIM_CLOCK (and TPUHAL_SIM_PACE) for the boards opened while it lives.
struct ClockEnv {
  explicit ClockEnv(const char* clock, const char* pace = nullptr) {
    ::setenv("TPUHAL_SIM_CLOCK", clock, 1);
    if (pace) ::setenv("TPUHAL_SIM_PACE", pace, 1);
  }
  ~ClockEnv() {
    ::unsetenv("TPUHAL_SIM_CLOCK");
    ::unsetenv("TPUHAL_SIM_PACE");
  }
  ClockEnv(const ClockEnv&) = delete;
  ClockEnv& operator=(const ClockEnv&) = delete;
};

// The board times a fresh sim:tiny on a virtual clock stamps around the same
// work: a batch, then one waiting until 1 ms after it, then an empty one.
std::vector<std::uint64_t> virtual_stamps() {
  const ClockEnv env("virtual");
  Work t("sim:tiny");
  Queue q = t.dev.queue();
  Buffer stamps = t.dev.allocate(5 * 8, Memory::HostPinned);
  q.batch().timestamp(stamps, 0).run(t.conv).run(t.matmul).timestamp(stamps, 8).submit().wait();
  std::uint64_t s[5];
  std::memcpy(s, stamps.map().data(), 16);
  q.batch().wait_until(s[1] + 1'000'000).timestamp(stamps, 16).run(t.add).timestamp(stamps, 24).submit().wait();
  q.batch().timestamp(stamps, 32).submit().wait();
  std::memcpy(s, stamps.map().data(), sizeof s);
  return {s, s + 5};
}

TEST(Timing, GivenAVirtualClockWhenTheSameWorkRunsOnTwoBoardsThenEveryStampIsTheModelsAlone) {
  // Model time alone: the host's time between and before batches counts
  // for nothing, so two boards give the same stamps to the nanosecond (on
  // the model's clock a batch starts no earlier than its submission on the
  // host's, which differs run to run).
  const std::vector<std::uint64_t> a = virtual_stamps(), b = virtual_stamps();
  EXPECT_EQ(a, b);
  const Work t("sim:tiny");
  EXPECT_EQ(a[1] - a[0], t.ns(t.conv) + t.ns(t.matmul));
  EXPECT_EQ(a[2], a[1] + 1'000'000);  // the wait moved the clock up to its time, and cost nothing
  EXPECT_EQ(a[3] - a[2], t.ns(t.add));
  EXPECT_EQ(a[4], a[3]);  // the next batch starts where the queue left off
}

TEST(Timing, GivenAVirtualClockWhenWorkWaitsSecondsOfBoardTimeThenTheBoardsNowIsWhereItsClocksReached) {
  const ClockEnv env("virtual");
  Work t("sim:tiny");
  ASSERT_TRUE(t.dev.properties().caps.wait_time);
  ASSERT_TRUE(t.dev.properties().caps.modelled_time);
  const std::uint64_t t0 = t.dev.board_time_ns().value();
  // Five seconds on the board, which no host waits for.
  const std::uint64_t at = t0 + 5'000'000'000ull;
  Buffer stamps = t.dev.allocate(2 * 8, Memory::HostPinned);
  t.dev.queue().batch().wait_until(at).timestamp(stamps, 0).run(t.matmul).timestamp(stamps, 8).submit().wait();
  std::uint64_t s[2];
  std::memcpy(s, stamps.map().data(), sizeof s);
  EXPECT_EQ(s[0], at);
  EXPECT_EQ(s[1] - s[0], t.ns(t.matmul));
  EXPECT_EQ(t.dev.board_time_ns().value(), s[1]);
}

TEST(Timing, GivenTheHostsClockWhenWorkWaitsUntilABoardTimeThenItStartsNoEarlier) {
  const ClockEnv env("host");
  Work t("sim:tiny");
  ASSERT_TRUE(t.dev.properties().caps.wait_time);
  EXPECT_FALSE(t.dev.properties().caps.modelled_time);
  const std::uint64_t at = t.dev.board_time_ns().value() + 20'000'000;
  Buffer stamp = t.dev.allocate(8, Memory::HostPinned);
  Queue q = t.dev.queue();
  q.batch().wait_until(at).timestamp(stamp, 0).submit().wait();
  std::uint64_t s = 0;
  std::memcpy(&s, stamp.map().data(), sizeof s);
  EXPECT_GE(s, at);
  // Bad input: past 2^62, refused before anything reaches the board; the
  // queue goes on.
  const Error e = error_of([&] { q.batch().wait_until((1ull << 62) + 1); });
  EXPECT_EQ(e.status(), Status::InvalidArgument);
  EXPECT_NE(std::string(e.what()).find("2^62"), std::string::npos) << e.what();
  q.batch().timestamp(stamp, 0).submit().wait();
}

TEST(Timing, GivenAVirtualClockWithPacingOrAClockItDoesNotKnowWhenOpenedThenTheBoardIsRefusedSayingWhy) {
  {
    const ClockEnv env("virtual", "1");
    const Error e = error_of([] { (void)open("sim:tiny"); });
    EXPECT_NE(std::string(e.what()).find("TPUHAL_SIM_PACE"), std::string::npos) << e.what();
  }
  const ClockEnv env("bogus");
  const Error e = error_of([] { (void)open("sim:tiny"); });
  EXPECT_NE(std::string(e.what()).find("\"virtual\""), std::string::npos) << e.what();
}

TEST(Timing, GivenABoardWithoutATimingModelWhenAskedThenThereIsNoModelledTime) {
  // The skeleton driver's board keeps no model; neither does a profile
  // without timing.model (tests/sim/profile_test.cpp).
  driver::register_provider(skeleton::make_provider());
  Device dev = open("skeleton:0");
  EXPECT_FALSE(dev.properties().caps.modelled_time);
  EXPECT_FALSE(dev.modelled_copy(1, Memory::HostPinned, Memory::Device).has_value());
  EXPECT_FALSE(dev.modelled_decode_ns(Codec::H264, FrameType::Intra, 64, 64).has_value());
  // Nor work timed to its clock.
  EXPECT_FALSE(dev.properties().caps.wait_time);
  EXPECT_FALSE(dev.board_time_ns().has_value());
  EXPECT_EQ(error_of([&] { dev.queue().batch().wait_until(1); }).status(), Status::Unsupported);
}

TEST(Timing, GivenAnOpOfAnotherDeviceWhenCostedThenItIsRefusedByName) {
  const Work t("sim:tiny");
  Device other = open("sim:bm1684x");
  EXPECT_EQ(error_of([&] { (void)other.modelled(t.conv); }).status(), Status::InvalidArgument);
  EXPECT_EQ(error_of([&] { (void)other.modelled(Op{}); }).status(), Status::InvalidArgument);
}

}  // namespace
}  // namespace tpuhal
