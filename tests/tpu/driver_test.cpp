// The TPU driver against the simulated board, below the HAL: hand-built
// descriptors the HAL would never produce, bring-up failures, recovery.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "encode.h"  // drivers/tpu/src: required_minor
#include "support/error_of.hpp"
#include "tpuhal/base/wait.h"
#include "tpuhal/fw/command.h"
#include "tpuhal/fw/regs.h"
#include "tpuhal/fw/tensor.h"
#include "tpuhal/fw/version.h"
#include "tpuhal/sim/board.h"
#include "tpuhal/tpu/device.h"
#include "tpuhal/tpu/sim_provider.h"
#include "support/interface_version.hpp"

namespace tpuhal {
namespace {

using namespace std::chrono_literals;
using test::error_of;
using ::testing::HasSubstr;

struct Rig {
  explicit Rig(const char* profile = "tiny")
      : board(std::make_shared<sim::Board>(sim::load_profile(profile))),
        dev(tpu::open_device(tpu::make_sim_transport(board), "test:tiny", "tpu-sim")) {}
  std::shared_ptr<sim::Board> board;
  std::shared_ptr<driver::DeviceBackend> dev;
};

// Waits (bounded) until `q` reaches `value` or fails; returns its timeline.
driver::Timeline settle(driver::QueueBackend& q, std::uint64_t value) {
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  for (;;) {
    auto t = q.timeline();
    if (t.completed >= value || t.failed || std::chrono::steady_clock::now() > deadline) return t;
    q.block(value, 100ms);
  }
}

fw::CommandDescriptor desc(fw::Opcode op, std::uint64_t a0 = 0, std::uint64_t a1 = 0, std::uint64_t a2 = 0) {
  fw::CommandDescriptor d{};
  d.opcode = static_cast<std::uint16_t>(op);
  d.args[0] = a0;
  d.args[1] = a1;
  d.args[2] = a2;
  return d;
}

std::uint64_t submit(driver::QueueBackend& q, std::initializer_list<fw::CommandDescriptor> ds) {
  return tpu::submit_raw(q, std::span<const fw::CommandDescriptor>(ds.begin(), ds.size()));
}

TEST(TpuDriver, DeviceMemoryOfASimulatedBoardIsBackedWhenAllocated) {
  Rig rig;
  if (sim::Board::prefault_limit() < (8u << 20)) GTEST_SKIP() << "TPUHAL_SIM_PREFAULT_MAX is below 8 MiB here";
  const std::uint64_t before = rig.board->dram_resident_bytes();
  auto buf = rig.dev->allocate(8u << 20, Memory::Device, {});
  // Nothing has touched it, yet its pages are there: a first copy into it
  // runs at the board's rate, not the host kernel's.
  EXPECT_GE(rig.board->dram_resident_bytes(), before + (8u << 20));
}

TEST(TpuDriver, AnUnmappedDmaAddressFailsTheQueueNamingCommandAndAddress) {
  Rig rig;
  auto q = rig.dev->create_queue(Engine::Compute, {});
  auto dst = rig.dev->allocate(4096, Memory::Device, {});
  const std::uint64_t bogus = fw::kHostWindowBase + (1ull << 40);
  const std::uint64_t v =
      submit(*q, {desc(fw::Opcode::kNop), desc(fw::Opcode::kCopy, bogus, dst->device_address(), 4096)});
  auto t = settle(*q, v);
  ASSERT_TRUE(t.failed);
  EXPECT_EQ(t.completed, 0u);
  Error e = q->failure();
  EXPECT_EQ(e.status(), Status::DeviceFault);
  EXPECT_THAT(e.what(), HasSubstr("submission 1 failed at command 2 of 2"));
  EXPECT_THAT(e.what(), HasSubstr("DMA fault: copy: src address 0x1010000000000 is not mapped for DMA (read)"));
}

TEST(TpuDriver, ADescriptorWritingToReadOnlyOrUndecodedMemoryFaultsOnTheDestination) {
  Rig rig;
  auto q = rig.dev->create_queue(Engine::Compute, {});
  auto src = rig.dev->allocate(4096, Memory::Device, {});
  const std::uint64_t beyond_dram = 1ull << 40;  // neither DRAM nor the host window
  const std::uint64_t v = submit(*q, {desc(fw::Opcode::kCopy, src->device_address(), beyond_dram, 64)});
  ASSERT_TRUE(settle(*q, v).failed);
  EXPECT_THAT(q->failure().what(), HasSubstr("dst address 0x10000000000 is not mapped for DMA (write)"));
}

TEST(TpuDriver, CorruptAndUnknownDescriptorsAreRejectedNotExecuted) {
  Rig rig;
  struct Case {
    fw::CommandDescriptor d;
    const char* message;
  };
  fw::CommandDescriptor bad_flags = desc(fw::Opcode::kNop);
  bad_flags.flags = 0x80;
  fw::CommandDescriptor reserved = desc(fw::Opcode::kNop);
  reserved.args[5] = 1;
  const Case cases[] = {
      {desc(static_cast<fw::Opcode>(0x55)), "unknown opcode 0x55"},
      {bad_flags, "undefined flag bits 0x80"},
      {reserved, "nop: unused arg5 is 0x1, must be zero"},
      {desc(fw::Opcode::kCopy, 0, 4096, 0), "copy: size = 0 is out of range"},
      {desc(fw::Opcode::kFill, 0, 4096, 3ull << 32), "fill: pattern"},
  };
  for (const Case& c : cases) {
    auto q = rig.dev->create_queue(Engine::Compute, {});
    const std::uint64_t v = submit(*q, {c.d});
    ASSERT_TRUE(settle(*q, v).failed) << c.message;
    Error e = q->failure();
    EXPECT_EQ(e.status(), Status::DeviceFault);
    EXPECT_THAT(e.what(), HasSubstr(c.message));
  }
}

TEST(TpuDriver, AFailedQueueRefusesWorkAndOtherQueuesCarryOn) {
  Rig rig;
  auto bad = rig.dev->create_queue(Engine::Compute, {});
  auto good = rig.dev->create_queue(Engine::Compute, {});
  auto host = rig.dev->allocate(8192, Memory::HostPinned, {});
  auto dram = rig.dev->allocate(8192, Memory::Device, {});
  std::memset(host->map().data(), 0x3C, 4096);
  std::memset(host->map().data() + 4096, 0, 4096);

  ASSERT_TRUE(settle(*bad, submit(*bad, {desc(static_cast<fw::Opcode>(0x99))})).failed);
  Error e = [&] {
    try {
      submit(*bad, {desc(fw::Opcode::kNop)});
    } catch (const Error& err) {
      return err;
    }
    return Error(Status::Ok, "");
  }();
  EXPECT_EQ(e.status(), Status::DeviceFault);
  EXPECT_THAT(e.what(), HasSubstr("unknown opcode 0x99"));

  const std::uint64_t v =
      submit(*good, {desc(fw::Opcode::kCopy, host->device_address(), dram->device_address(), 4096),
                     desc(fw::Opcode::kCopy, dram->device_address(), host->device_address() + 4096, 4096)});
  auto t = settle(*good, v);
  ASSERT_FALSE(t.failed);
  EXPECT_EQ(std::memcmp(host->map().data(), host->map().data() + 4096, 4096), 0);
}

TEST(TpuDriver, AReleasedFailedQueueIsResetAndServesAgain) {
  Rig rig;
  std::uint32_t failed_index;
  {
    auto q = rig.dev->create_queue(Engine::Copy, {});  // tiny has one copy queue
    failed_index = q->index();
    ASSERT_TRUE(settle(*q, submit(*q, {desc(static_cast<fw::Opcode>(0x42))})).failed);
  }
  auto again = rig.dev->create_queue(Engine::Copy, {});
  EXPECT_EQ(again->index(), failed_index);
  EXPECT_FALSE(again->timeline().failed);
  const std::uint64_t v = submit(*again, {desc(fw::Opcode::kNop)});
  EXPECT_EQ(v, 1u);
  auto t = settle(*again, v);
  EXPECT_FALSE(t.failed);
  EXPECT_EQ(t.completed, 1u);
}

TEST(TpuDriver, AQueueWaitingOnAFailedTimelineFailsWithDependencyFailed) {
  Rig rig;
  auto a = rig.dev->create_queue(Engine::Compute, {});
  auto b = rig.dev->create_queue(Engine::Compute, {});
  const std::uint64_t wait_b = submit(*b, {desc(fw::Opcode::kWaitValue, tpu::timeline_address(*a), 1,
                                                static_cast<std::uint64_t>(fw::WaitMode::kTimeline))});
  ASSERT_TRUE(settle(*a, submit(*a, {desc(static_cast<fw::Opcode>(0x77))})).failed);
  ASSERT_TRUE(settle(*b, wait_b).failed);
  EXPECT_THAT(b->failure().what(), HasSubstr("dependency failed"));
  // The timeline is named by the queue it belongs to, not only its address.
  EXPECT_THAT(b->failure().what(), HasSubstr("the timeline of " + rig.dev->properties().uri + " compute queue " +
                                             std::to_string(a->index())));
}

TEST(TpuDriver, TheRingWrapsManyTimes) {
  Rig rig;
  QueueOptions small;
  small.ring_entries = 16;
  auto q = rig.dev->create_queue(Engine::Compute, small);
  auto host = rig.dev->allocate(4096, Memory::HostPinned, {});
  auto* words = reinterpret_cast<std::uint64_t*>(host->map().data());
  std::uint64_t last = 0;
  for (std::uint64_t i = 0; i < 2000; ++i) {
    // Batches of 1..15 descriptors, the last writing the iteration number.
    const std::size_t n = 1 + i % 15;
    std::vector<fw::CommandDescriptor> ds(n, desc(fw::Opcode::kNop));
    ds.back() = desc(fw::Opcode::kWriteValue, host->device_address(), i);
    last = tpu::submit_raw(*q, ds);
  }
  auto t = settle(*q, last);
  ASSERT_FALSE(t.failed);
  EXPECT_EQ(t.completed, 2000u);
  EXPECT_EQ(std::atomic_ref<std::uint64_t>(words[0]).load(), 1999u);
}

TEST(TpuDriver, AbortStopsABlockedQueue) {
  Rig rig;
  auto q = rig.dev->create_queue(Engine::Compute, {});
  auto host = rig.dev->allocate(4096, Memory::HostPinned, {});
  std::memset(host->map().data(), 0, 8);
  const std::uint64_t v = submit(*q, {desc(fw::Opcode::kWaitValue, host->device_address(), 1, 0)});
  EXPECT_FALSE(q->timeline().failed);
  // The board picks the command up asynchronously; give it a moment.
  std::string state;
  for (const auto until = std::chrono::steady_clock::now() + 30s;
       state.find("waiting") == std::string::npos && std::chrono::steady_clock::now() < until;) {
    state = q->diagnose();
    std::this_thread::sleep_for(1ms);
  }
  EXPECT_THAT(state, HasSubstr("waiting in a wait command at ring position 0"));
  q->abort();
  auto t = q->timeline();
  EXPECT_TRUE(t.failed);
  EXPECT_LT(t.completed, v);
  Error e = q->failure();
  EXPECT_EQ(e.status(), Status::FailedPrecondition);
  EXPECT_THAT(e.what(), HasSubstr("aborted"));
}

TEST(TpuDriver, ABlockedWaiterWakesOnTheInterrupt) {
  Rig rig;
  auto q = rig.dev->create_queue(Engine::Compute, {});
  auto host = rig.dev->allocate(4096, Memory::HostPinned, {});
  auto* gate = reinterpret_cast<std::uint64_t*>(host->map().data());
  std::atomic_ref<std::uint64_t>(*gate).store(0);
  const std::uint64_t v = submit(*q, {desc(fw::Opcode::kWaitValue, host->device_address(), 1, 0)});
  std::thread opener([&] {
    std::this_thread::sleep_for(20ms);
    std::atomic_ref<std::uint64_t>(*gate).store(1);
  });
  // One long block: only the completion interrupt can end it early.
  const auto t0 = std::chrono::steady_clock::now();
  while (q->timeline().completed < v && std::chrono::steady_clock::now() - t0 < 30s) q->block(v, 30s);
  const auto waited = std::chrono::steady_clock::now() - t0;
  opener.join();
  EXPECT_EQ(q->timeline().completed, v);
  EXPECT_LT(waited, 10s) << "woke by timeout, not by the interrupt";
}

// A transport that forwards to the simulated board but can lie about a few
// registers, to play a board the driver must refuse.
class LyingTransport : public tpu::Transport {
 public:
  LyingTransport(std::shared_ptr<sim::Board> board, std::uint32_t reg, std::uint32_t value)
      : inner_(tpu::make_sim_transport(board)), reg_(reg), value_(value) {}
  std::string bus() const override { return inner_->bus(); }
  std::uint32_t read32(std::uint32_t off) override { return off == reg_ ? value_ : inner_->read32(off); }
  void write32(std::uint32_t off, std::uint32_t v) override { inner_->write32(off, v); }
  std::span<std::byte> aperture() override { return inner_->aperture(); }
  void map_dma(std::uint64_t iova, void* host, std::uint64_t size, bool w) override {
    inner_->map_dma(iova, host, size, w);
  }
  void unmap_dma(std::uint64_t iova, std::uint64_t size) noexcept override { inner_->unmap_dma(iova, size); }
  std::uint32_t interrupt_vectors() const override { return inner_->interrupt_vectors(); }
  int interrupt_fd(std::uint32_t v) const override { return inner_->interrupt_fd(v); }

 private:
  std::unique_ptr<tpu::Transport> inner_;
  std::uint32_t reg_, value_;
};

// A transport that lets the board only read the host windows of one size.
class ReadOnlyWindows : public LyingTransport {
 public:
  ReadOnlyWindows(std::shared_ptr<sim::Board> board, std::uint64_t size)
      : LyingTransport(std::move(board), ~0u, 0), size_(size) {}  // no register lies: offsets are below 2^32 - 1
  void map_dma(std::uint64_t iova, void* host, std::uint64_t size, bool w) override {
    LyingTransport::map_dma(iova, host, size, w && size != size_);
  }

 private:
  std::uint64_t size_;
};

// top_k writes its values as well as its indices (an output other than the
// last): the board reaches both for writing, so a window it may only read
// is a DMA fault, never written.
TEST(TpuDriver, AnOpsOtherOutputIsWrittenOnlyWhereTheBoardMayWrite) {
  constexpr std::uint64_t kReadOnly = 3 * 4096;
  auto board = std::make_shared<sim::Board>(sim::load_profile("tiny"));
  auto dev = tpu::open_device(std::make_unique<ReadOnlyWindows>(board, kReadOnly), "test:ro", "tpu-sim");
  auto q = dev->create_queue(Engine::Compute, {});
  auto x = dev->allocate(4096, Memory::HostPinned, {});
  auto values = dev->allocate(kReadOnly, Memory::HostPinned, {});
  auto indices = dev->allocate(4096, Memory::HostPinned, {});
  const float xs[4] = {1, 4, 2, 3};
  std::memcpy(x->map().data(), xs, sizeof xs);
  std::memset(values->map().data(), 0x5A, 16);
  auto tensor = [](driver::BufferBackend* b, DType dt, std::uint64_t n) {
    driver::TensorArg t;
    t.buffer = b;
    t.dtype = dt;
    t.rank = 1;
    t.shape[0] = n;
    t.strides[0] = 1;
    return t;
  };
  driver::OpDesc top_k;
  top_k.kind = driver::OpKind::TopK;
  top_k.name = "top_k";
  top_k.attrs = driver::TopKAttrs{0, true, false};
  top_k.tensors = {tensor(x.get(), DType::F32, 4), tensor(values.get(), DType::F32, 2),
                   tensor(indices.get(), DType::I32, 2)};
  const driver::Command run = driver::cmd::Run{&top_k};
  const std::uint64_t v = q->submit(std::span<const driver::Command>(&run, 1), std::chrono::seconds(10));
  ASSERT_TRUE(settle(*q, v).failed);
  EXPECT_THAT(q->failure().what(), HasSubstr("is not mapped for DMA (write)"));
  EXPECT_THAT(q->failure().what(), HasSubstr("tensor 1"));
  for (int i = 0; i < 16; ++i) EXPECT_EQ(values->map()[i], std::byte{0x5A}) << "values byte " << i;
}

Error open_error(std::uint32_t reg, std::uint32_t value) {
  auto board = std::make_shared<sim::Board>(sim::load_profile("tiny"));
  try {
    tpu::open_device(std::make_unique<LyingTransport>(board, reg, value), "test:liar", "tpu-sim");
  } catch (const Error& e) {
    return e;
  }
  return Error(Status::Ok, "opened");
}

TEST(TpuDriver, BringUpRefusesBoardsItCannotDrive) {
  Error v2 = open_error(fw::reg::kIfaceVersion, fw::Version{2, 0}.packed());
  EXPECT_EQ(v2.status(), Status::VersionMismatch);
  EXPECT_THAT(v2.what(),
              HasSubstr("the board speaks interface 2.0, this driver 1.0 to " + test::interface_version_text()));

  Error gone = open_error(fw::reg::kIdMagic, 0xFFFFFFFF);
  EXPECT_EQ(gone.status(), Status::DeviceLost);
  EXPECT_THAT(gone.what(), HasSubstr("does not answer"));

  Error other = open_error(fw::reg::kIdMagic, 0x12345678);
  EXPECT_EQ(other.status(), Status::NotFound);
  EXPECT_THAT(other.what(), HasSubstr("not a tpuhal board"));

  Error regions = open_error(fw::reg::kNumMemRegions, 99);
  EXPECT_EQ(regions.status(), Status::DeviceLost);
  EXPECT_THAT(regions.what(), HasSubstr("99 memory regions"));
}

// A placement flag changes no result: a board of 1.17, which would refuse
// it as reserved, is not sent it; one of 1.18 is.
TEST(TpuDriver, TheGlobalFlagIsLeftOutForABoardOlderThanItsInterfaceMinor) {
  driver::OpDesc add;
  add.kind = driver::OpKind::Elementwise;
  add.name = "add";
  add.attrs = driver::ElementwiseAttrs{driver::ElementwiseOp::Add, {}};
  add.global = true;
  auto flags = [&](std::uint16_t minor) {
    const auto block = tpu::encode_op(add, minor);
    fw::OpHeader h;
    std::memcpy(&h, block.data(), sizeof h);
    return h.flags;
  };
  EXPECT_EQ(flags(fw::kMinorOpFlags - 1), 0u);
  EXPECT_EQ(flags(fw::kMinorOpFlags), fw::kOpGlobal);
  add.global = false;
  EXPECT_EQ(flags(fw::kMinorOpFlags), 0u);
}

// ElementwiseAttrs from the op schema: the activation's kind and parameters
// reach the board's words (alpha and beta on the wire), and its minor counts.
TEST(TpuDriver, AnElementwiseActivationAndItsParametersAreEncoded) {
  driver::OpDesc op;
  op.kind = driver::OpKind::Elementwise;
  op.name = "activation";
  op.attrs = driver::ElementwiseAttrs{driver::ElementwiseOp::Activation, ActivationParams::leaky_relu(0.25f)};
  auto words = [&] {
    const auto block = tpu::encode_op(op, fw::kInterfaceVersion.minor);
    fw::OpHeader h;
    std::memcpy(&h, block.data(), sizeof h);
    EXPECT_EQ(h.attr_bytes, sizeof(fw::ElementwiseAttrs));
    fw::ElementwiseAttrs a;
    std::memcpy(&a, block.data() + block.size() - sizeof a, sizeof a);
    return a;
  };
  fw::ElementwiseAttrs a = words();
  EXPECT_EQ(a.op, static_cast<std::uint32_t>(fw::ElementwiseOp::kActivation));
  EXPECT_EQ(a.activation, static_cast<std::uint32_t>(fw::Activation::kLeakyRelu));
  EXPECT_EQ(a.alpha, 0.25f);
  EXPECT_EQ(a.beta, 0.0f);
  op.attrs = driver::ElementwiseAttrs{driver::ElementwiseOp::Activation, ActivationParams::hard_swish()};
  EXPECT_EQ(tpu::required_minor(op), 4u);
  op.attrs = driver::ElementwiseAttrs{driver::ElementwiseOp::Add, {}};
  a = words();
  EXPECT_EQ(a.op, static_cast<std::uint32_t>(fw::ElementwiseOp::kAdd));
  EXPECT_EQ(a.activation, 0u);
  EXPECT_EQ(a.alpha, 0.0f);
  EXPECT_EQ(tpu::required_minor(op), 1u);
  // An activation on a map that is not one is sent as it is, for the board
  // to refuse (check_elementwise), not dropped.
  op.attrs = driver::ElementwiseAttrs{driver::ElementwiseOp::Add, ActivationParams::clip(0, 6)};
  a = words();
  EXPECT_EQ(a.activation, static_cast<std::uint32_t>(fw::Activation::kClip));
  EXPECT_EQ(a.beta, 6.0f);
}

TEST(TpuDriver, AnOpNewerThanTheBoardsInterfaceIsRefusedBeforeItReachesTheBoard) {
  // A board that advertises interface 1.4: the driver agrees on 1.4.
  auto board = std::make_shared<sim::Board>(sim::load_profile("tiny"));
  auto dev =
      tpu::open_device(std::make_unique<LyingTransport>(board, fw::reg::kIfaceVersion, fw::Version{1, 4}.packed()),
                       "test:old", "tpu-sim");
  EXPECT_EQ(dev->properties().interface_version, "1.4");
  auto q = dev->create_queue(Engine::Compute, {});
  driver::OpDesc top_k;
  top_k.kind = driver::OpKind::TopK;
  top_k.name = "argmax";
  top_k.attrs = driver::TopKAttrs{};
  const driver::Command run = driver::cmd::Run{&top_k};
  const Error e = error_of([&] { q->submit(std::span<const driver::Command>(&run, 1), std::chrono::seconds(1)); });
  EXPECT_EQ(e.status(), Status::Unsupported);
  EXPECT_THAT(e.what(), HasSubstr("test:old: argmax needs firmware interface 1.5; the board speaks 1.4"));
  EXPECT_THAT(error_of([&] { dev->create_program(std::span<const driver::Command>(&run, 1)); }).what(),
              HasSubstr("needs firmware interface 1.5"));
  // What each op needs.
  driver::OpDesc conv;
  conv.kind = driver::OpKind::Conv2d;
  driver::ConvAttrs ca;
  conv.attrs = ca;
  EXPECT_EQ(tpu::required_minor(conv), 1u);
  ca.activation = ActivationParams::hard_swish();
  conv.attrs = ca;
  EXPECT_EQ(tpu::required_minor(conv), 4u);
  ca.accumulate = true;  // reaches the board's words, and needs 1.23
  conv.attrs = ca;
  EXPECT_EQ(tpu::required_minor(conv), 23u);
  {
    const auto block = tpu::encode_op(conv, fw::kInterfaceVersion.minor);
    fw::ConvAttrs wire;
    std::memcpy(&wire, block.data() + block.size() - sizeof wire, sizeof wire);
    EXPECT_EQ(wire.accumulate, 1u);
    EXPECT_EQ(wire.reserved[0], 0u);
  }
  driver::OpDesc erf;
  erf.kind = driver::OpKind::Elementwise;
  erf.attrs = driver::ElementwiseAttrs{driver::ElementwiseOp::Erf, {}};
  EXPECT_EQ(tpu::required_minor(erf), 3u);
  EXPECT_EQ(tpu::required_minor(top_k), 5u);
  for (auto op : {driver::ElementwiseOp::Equal, driver::ElementwiseOp::GreaterOrEqual, driver::ElementwiseOp::And,
                  driver::ElementwiseOp::Not}) {
    driver::OpDesc logic;
    logic.kind = driver::OpKind::Elementwise;
    logic.attrs = driver::ElementwiseAttrs{op, {}};
    EXPECT_EQ(tpu::required_minor(logic), 7u) << static_cast<int>(op);
  }
  for (auto op : {driver::ElementwiseOp::Ceil, driver::ElementwiseOp::Floor, driver::ElementwiseOp::Round}) {
    driver::OpDesc rounding;
    rounding.kind = driver::OpKind::Elementwise;
    rounding.attrs = driver::ElementwiseAttrs{op, {}};
    EXPECT_EQ(tpu::required_minor(rounding), 10u) << static_cast<int>(op);
  }
  // The queue refused the op without failing: it still runs what the board has.
  EXPECT_FALSE(q->timeline().failed);
}

TEST(TpuDriver, DeviceMemoryIsReturnedWhenBuffersGo) {
  Rig rig;
  const auto before = rig.dev->memory_stats();
  {
    auto a = rig.dev->allocate(1 << 20, Memory::Device, {});
    auto b = rig.dev->allocate(1 << 16, Memory::DeviceHostVisible, {});
    auto h = rig.dev->allocate(1 << 16, Memory::HostPinned, {});
    EXPECT_GT(rig.dev->memory_stats().device_used, before.device_used);
    EXPECT_EQ(rig.board->iommu().mapping_count(), 2u);  // status pages + h
  }
  const auto after = rig.dev->memory_stats();
  EXPECT_EQ(after.device_used, before.device_used);
  EXPECT_EQ(after.host_pinned_bytes, before.host_pinned_bytes);
  EXPECT_EQ(rig.board->iommu().mapping_count(), 1u);
}

}  // namespace
}  // namespace tpuhal
