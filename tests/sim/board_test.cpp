// sim::Board driven purely through its registers, as a driver would: BAR0
// MMIO, the DRAM aperture, the IOMMU and the interrupt eventfds. No driver
// code is involved.
#include "tpuhal/sim/board.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "tpuhal/base/fd.h"
#include "tpuhal/base/mapping.h"
#include "tpuhal/base/wait.h"
#include "tpuhal/fw/command.h"
#include "tpuhal/fw/decode.h"
#include "tpuhal/fw/regs.h"
#include "tpuhal/fw/telemetry.h"
#include "tpuhal/fw/version.h"
#include "tpuhal/sim/profile.h"
#include "support/interface_version.hpp"

namespace tpuhal::sim {
namespace {

namespace reg = fw::reg;
namespace qreg = fw::reg::queue;

constexpr std::uint64_t kWin = fw::kHostWindowBase;
constexpr std::uint64_t kSecond = 1'000'000'000ull;
constexpr std::uint32_t kTinyQueues = 4;

// Host-window layout used by every test.
constexpr std::uint64_t kStatusIova = kWin;               // queue q: kStatusIova + q * 4 KiB
constexpr std::uint64_t kSrcIova = kWin + 0x100000;       // read-only source buffer
constexpr std::uint64_t kDstIova = kWin + 0x200000;       // read/write buffer
constexpr std::uint64_t kUnmappedIova = kWin + 0x900000;  // never mapped
constexpr std::size_t kBufBytes = 64 * 1024;

// DRAM layout: rings low in the aperture, data above them.
constexpr std::uint64_t ring_base(std::uint32_t q) { return 0x10000 + q * 0x10000; }
constexpr std::uint64_t kDramData = 0x200000;

fw::CommandDescriptor desc(fw::Opcode op, std::uint64_t a0 = 0, std::uint64_t a1 = 0, std::uint64_t a2 = 0) {
  fw::CommandDescriptor d{};
  d.opcode = static_cast<std::uint16_t>(op);
  d.args[0] = a0;
  d.args[1] = a1;
  d.args[2] = a2;
  return d;
}

fw::CommandDescriptor fenced(fw::CommandDescriptor d, std::uint64_t fence,
                             std::uint16_t extra_flags = fw::kFlagInterrupt) {
  d.flags = static_cast<std::uint16_t>(d.flags | fw::kFlagFence | extra_flags);
  d.fence_value = fence;
  return d;
}

bool readable(int fd, int timeout_ms) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, timeout_ms) == 1 && (p.revents & POLLIN);
}

class SimBoard : public ::testing::Test {
 protected:
  // Host memory first: it must outlive the board's command processors.
  base::Mapping status_pages_ = base::Mapping::anonymous(kTinyQueues * fw::kQueueStatusPageSize, {.populate = true});
  base::Mapping src_ = base::Mapping::anonymous(kBufBytes, {.populate = true});
  base::Mapping dst_ = base::Mapping::anonymous(kBufBytes, {.populate = true});
  Board board_{load_profile("tiny")};
  std::uint32_t tail_[kTinyQueues] = {};
  std::uint32_t ring_entries_[kTinyQueues] = {};

  void SetUp() override {
    ASSERT_EQ(board_.iommu().map(kStatusIova, status_pages_.data(), status_pages_.size(), kIommuRead | kIommuWrite),
              "");
    ASSERT_EQ(board_.iommu().map(kSrcIova, src_.data(), kBufBytes, kIommuRead), "");
    ASSERT_EQ(board_.iommu().map(kDstIova, dst_.data(), kBufBytes, kIommuRead | kIommuWrite), "");
    for (std::size_t i = 0; i < kBufBytes; ++i) src_.data()[i] = static_cast<std::byte>((i * 7 + 3) & 0xFF);
  }

  std::uint32_t r(std::uint32_t off) { return board_.mmio_read32(off); }
  void w(std::uint32_t off, std::uint32_t v) { board_.mmio_write32(off, v); }
  std::uint64_t r64(std::uint32_t lo) {
    const std::uint64_t l = r(lo);
    return std::uint64_t{r(lo + 4)} << 32 | l;
  }
  std::uint32_t qr(std::uint32_t q, std::uint32_t off) { return r(reg::queue_reg(q, off)); }
  void qw(std::uint32_t q, std::uint32_t off, std::uint32_t v) { w(reg::queue_reg(q, off), v); }

  void agree_version() {
    w(reg::kDriverVersion, fw::kInterfaceVersion.packed());
    ASSERT_TRUE(r(reg::kStatus) & fw::kStatusVersionOk);
  }

  void program_queue(std::uint32_t q, std::uint32_t entries, std::uint64_t base, std::uint64_t status_page) {
    qw(q, qreg::kRingSize, entries);
    qw(q, qreg::kRingBaseLo, static_cast<std::uint32_t>(base));
    qw(q, qreg::kRingBaseHi, static_cast<std::uint32_t>(base >> 32));
    qw(q, qreg::kFenceLo, static_cast<std::uint32_t>(status_page));
    qw(q, qreg::kFenceHi, static_cast<std::uint32_t>(status_page >> 32));
  }

  // Negotiates (if needed) and enables queue q with a 16-entry ring.
  void enable_queue(std::uint32_t q, std::uint32_t entries = 16) {
    if (!(r(reg::kStatus) & fw::kStatusVersionOk)) agree_version();
    program_queue(q, entries, ring_base(q), kStatusIova + q * fw::kQueueStatusPageSize);
    qw(q, qreg::kControl, fw::kQueueControlEnable);
    ASSERT_EQ(qr(q, qreg::kStatus), fw::kQueueStatusEnabled) << "queue " << q;
    ASSERT_EQ(qr(q, qreg::kError), 0u);
    ring_entries_[q] = entries;
    tail_[q] = 0;
  }

  // Writes d into the next ring slot of q. The sequence is the ring position
  // unless `keep_sequence`.
  void push(std::uint32_t q, fw::CommandDescriptor d, bool keep_sequence = false) {
    if (!keep_sequence) d.sequence = tail_[q];
    const std::uint64_t slot = ring_base(q) + (tail_[q] & (ring_entries_[q] - 1)) * sizeof d;
    std::memcpy(board_.aperture().data() + slot, &d, sizeof d);
    ++tail_[q];
  }
  void doorbell(std::uint32_t q) { qw(q, qreg::kTail, tail_[q]); }
  // Enables queue q and runs two nops on it, the second fenced (value 1).
  void retire_two_nops(std::uint32_t q) {
    enable_queue(q);
    push(q, desc(fw::Opcode::kNop));
    push(q, fenced(desc(fw::Opcode::kNop), 1, 0));
    doorbell(q);
    ASSERT_EQ(wait_timeline(q, 1), 1u);
    ASSERT_TRUE(wait_reg(q, qreg::kRetiredLo, [](std::uint32_t n) { return n == 2; }));
  }

  fw::QueueStatusPage& page(std::uint32_t q) {
    return *reinterpret_cast<fw::QueueStatusPage*>(status_pages_.data() + q * fw::kQueueStatusPageSize);
  }
  std::uint64_t timeline(std::uint32_t q) {
    return std::atomic_ref<std::uint64_t>(page(q).fence.value).load(std::memory_order_acquire);
  }

  // Waits (at most 5 s) until q's timeline reaches `value` or fails; returns it.
  std::uint64_t wait_timeline(std::uint32_t q, std::uint64_t value) {
    const std::uint64_t deadline = base::monotonic_ns() + 5 * kSecond;
    std::uint64_t v = timeline(q);
    while ((v & fw::kTimelineValueMask) < value && !(v & fw::kTimelineFailed) && base::monotonic_ns() < deadline) {
      std::this_thread::yield();
      v = timeline(q);
    }
    return v;
  }
  // Waits (at most 5 s) until q's timeline is exactly `value`; returns it.
  std::uint64_t wait_timeline_exact(std::uint32_t q, std::uint64_t value) {
    const std::uint64_t deadline = base::monotonic_ns() + 5 * kSecond;
    std::uint64_t v = timeline(q);
    while (v != value && base::monotonic_ns() < deadline) {
      std::this_thread::yield();
      v = timeline(q);
    }
    return v;
  }
  // Waits (at most 5 s) for q's timeline to carry the failed bit; returns it.
  std::uint64_t wait_failed(std::uint32_t q) {
    const std::uint64_t deadline = base::monotonic_ns() + 5 * kSecond;
    std::uint64_t v = timeline(q);
    while (!(v & fw::kTimelineFailed) && base::monotonic_ns() < deadline) {
      std::this_thread::yield();
      v = timeline(q);
    }
    return v;
  }
  // Waits (at most 5 s) until a queue register satisfies pred.
  template <class Pred>
  bool wait_reg(std::uint32_t q, std::uint32_t off, Pred pred) {
    const std::uint64_t deadline = base::monotonic_ns() + 5 * kSecond;
    while (!pred(qr(q, off))) {
      if (base::monotonic_ns() >= deadline) return false;
      std::this_thread::yield();
    }
    return true;
  }

  // Waits (at most 5 s) until INT_STATUS has all of `bits`. A failing queue
  // raises its interrupt after recording the failure, so this is a separate
  // wait.
  bool wait_int_status(std::uint32_t bits) {
    const std::uint64_t deadline = base::monotonic_ns() + 5 * kSecond;
    while ((r(reg::kIntStatus) & bits) != bits) {
      if (base::monotonic_ns() >= deadline) return false;
      std::this_thread::yield();
    }
    return true;
  }

  std::string region_name(std::uint32_t i) {
    char name[17] = {};
    for (std::uint32_t off = 0; off < 16; off += 4) {
      const std::uint32_t v = r(reg::region_reg(i, reg::region::kName + off));
      std::memcpy(name + off, &v, 4);
    }
    return name;
  }
};

// ---- Identity ---------------------------------------------------------------------

TEST(SimBoardSharedDram, DramInAMemfdIsTheApertureAnotherMappingSees) {
  Board board(load_profile("tiny"), BoardOptions{.shared_dram = true, .doorbells = {}});
  const int fd = board.dram_fd();
  ASSERT_GE(fd, 0);
  // Sealed: whoever maps it cannot be faulted by a truncation.
  const int seals = ::fcntl(fd, F_GET_SEALS);
  EXPECT_TRUE(seals & F_SEAL_SHRINK);
  EXPECT_TRUE(seals & F_SEAL_GROW);
  const std::uint64_t before = board.dram_resident_bytes();
  const std::size_t bytes = board.aperture().size();
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ASSERT_NE(p, MAP_FAILED);
  auto* other = static_cast<std::byte*>(p);
  board.aperture()[4096] = std::byte{0x3C};
  EXPECT_EQ(other[4096], std::byte{0x3C});
  other[8192] = std::byte{0x7E};
  EXPECT_EQ(board.aperture()[8192], std::byte{0x7E});
  EXPECT_GE(board.dram_resident_bytes(), before + 2 * 4096);
  ::munmap(p, bytes);
}

TEST(SimBoardSharedDram, PrivateDramHasNoFdAndCountsWhatIsTouched) {
  Board board(load_profile("tiny"));
  EXPECT_EQ(board.dram_fd(), -1);
  const std::uint64_t before = board.dram_resident_bytes();
  std::memset(board.aperture().data(), 1, 1 << 20);
  EXPECT_GE(board.dram_resident_bytes(), before + (1 << 20));
}

// Shadow doorbells (BoardOptions::doorbells): the queue's TAIL lives in the
// host's word, which the command processor polls; the register write only
// wakes a processor that sleeps, and the processor says when it does.
struct ShadowDoorbellBoard {
  struct alignas(64) Words {
    std::atomic<std::uint32_t> tail{0};
    alignas(64) std::atomic<std::uint32_t> sleeping{0};
  };
  base::Mapping status = base::Mapping::anonymous(kTinyQueues * fw::kQueueStatusPageSize, {.populate = true});
  std::vector<Words> words = std::vector<Words>(kTinyQueues);
  std::unique_ptr<Board> board;

  // Queue 0 enabled, its ring 16 entries.
  explicit ShadowDoorbellBoard(std::chrono::milliseconds net) {
    BoardOptions options{.shared_dram = false, .doorbells = {}, .doorbell_net = net};
    for (auto& w : words) options.doorbells.push_back({&w.tail, &w.sleeping});
    board = std::make_unique<Board>(load_profile("tiny"), std::move(options));
    EXPECT_EQ(board->iommu().map(kStatusIova, status.data(), status.size(), kIommuRead | kIommuWrite), "");
    board->mmio_write32(reg::kDriverVersion, fw::kInterfaceVersion.packed());
    qw(qreg::kRingSize, 16);
    qw(qreg::kRingBaseLo, ring_base(0));
    qw(qreg::kRingBaseHi, ring_base(0) >> 32);
    qw(qreg::kFenceLo, kStatusIova);
    qw(qreg::kFenceHi, kStatusIova >> 32);
    qw(qreg::kControl, fw::kQueueControlEnable);
    EXPECT_EQ(board->mmio_read32(reg::queue_reg(0, qreg::kStatus)), fw::kQueueStatusEnabled);
  }
  void qw(std::uint32_t r, std::uint64_t v) {
    board->mmio_write32(reg::queue_reg(0, r), static_cast<std::uint32_t>(v));
  }
  // A nop at ring position `at` that signals `fence`.
  void put(std::uint32_t at, std::uint64_t fence) {
    fw::CommandDescriptor d = fenced(desc(fw::Opcode::kNop), fence, 0);
    d.sequence = at;
    std::memcpy(board->aperture().data() + ring_base(0) + (at % 16) * sizeof d, &d, sizeof d);
  }
  std::uint64_t timeline() {
    return std::atomic_ref<std::uint64_t>(reinterpret_cast<fw::QueueStatusPage*>(status.data())->fence.value).load();
  }
  // Waits (at most 5 s) for `pred`.
  template <class Pred>
  static bool wait_for(Pred pred) {
    const std::uint64_t deadline = base::monotonic_ns() + 5 * kSecond;
    while (!pred() && base::monotonic_ns() < deadline) std::this_thread::yield();
    return pred();
  }
};

TEST(SimBoardShadowDoorbells, TheProcessorPollsTheShadowAndSaysWhenItSleeps) {
  // No net for a lost wake-up within the test's life: asleep, the processor
  // must not look at the shadow until the register rings.
  ShadowDoorbellBoard b(std::chrono::hours(24));
  auto& words = b.words;
  auto timeline = [&] { return b.timeline(); };
  // Idle past its spin window, the processor sleeps and says so.
  ASSERT_TRUE(b.wait_for([&] { return words[0].sleeping.load() == 1; }));
  // A store to the shadow alone does not wake it...
  b.put(0, 1);
  words[0].tail.store(1);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(timeline(), 0u);
  EXPECT_EQ(words[0].sleeping.load(), 1u);
  // ...a register write does, and the board takes TAIL from the shadow, not
  // from the value written.
  b.board->mmio_write32(reg::queue_reg(0, qreg::kTail), 12345);
  EXPECT_TRUE(b.wait_for([&] { return timeline() == 1; }));
  EXPECT_EQ(words[0].tail.load(), 1u);
  EXPECT_EQ(b.board->mmio_read32(reg::queue_reg(0, qreg::kTail)), 1u);
  // While it polls, the shadow alone is enough; asleep, the client kicks.
  for (std::uint32_t i = 1; i < 40; ++i) {
    b.put(i, i + 1);
    words[0].tail.store(i + 1, std::memory_order_seq_cst);
    if (words[0].sleeping.load(std::memory_order_seq_cst))
      b.board->mmio_write32(reg::queue_reg(0, qreg::kTail), 0);  // the client's kick
    ASSERT_TRUE(b.wait_for([&] { return timeline() == i + 1; })) << "command " << i;
  }
  // A queue reset zeroes the shadow too.
  b.qw(qreg::kControl, fw::kQueueControlReset);
  EXPECT_EQ(words[0].tail.load(), 0u);
  // One doorbell word per queue, or none.
  BoardOptions wrong{.shared_dram = false, .doorbells = {{&words[0].tail, &words[0].sleeping}}};
  EXPECT_THROW(Board(load_profile("tiny"), std::move(wrong)), ProfileError);
}

// A client that stores the shadow and never rings (a lost wake-up) is
// served anyway, once the processor's net runs out.
TEST(SimBoardShadowDoorbells, ANetServesAShadowStoreThatNothingRang) {
  ShadowDoorbellBoard b(std::chrono::milliseconds(10));
  ASSERT_TRUE(b.wait_for([&] { return b.words[0].sleeping.load() == 1; }));
  b.put(0, 1);
  b.words[0].tail.store(1);
  EXPECT_TRUE(b.wait_for([&] { return b.timeline() == 1; }));
}

TEST_F(SimBoard, IdentityRegistersDescribeTheTinyProfile) {
  EXPECT_EQ(r(reg::kIdMagic), fw::kIdMagic);
  EXPECT_EQ(r(reg::kIfaceVersion), fw::kInterfaceVersion.packed());
  EXPECT_EQ(r(reg::kVendorDevice), 0x1f1c0001u);
  EXPECT_EQ(r(reg::kBoardId), 1u);
  EXPECT_EQ(r(reg::kBoardRevision), 1u);
  EXPECT_EQ(r64(reg::kSerialLo), 1u);
  EXPECT_EQ(r(reg::kFirmwareVersion), 0x010000u);
  EXPECT_EQ(r(reg::kCaps), fw::kCapCopySg | fw::kCapFill | fw::kCapWaitValue | fw::kCapTimestamp |
                               fw::kCapHostAperture | fw::kCapTensor | fw::kCapVideoDecode | fw::kCapTelemetry |
                               fw::kCapModelledTime | fw::kCapTimingModel);
  EXPECT_EQ(r(reg::kDecodeChannels), 2u);
  EXPECT_EQ(r(reg::kVideoCodecs), 1u << 1 | 1u << 2 | 1u << 3);  // h264, h265, jpeg
  EXPECT_EQ(r64(reg::kDramSizeLo), 64ull << 20);
  EXPECT_EQ(r64(reg::kApertureLo), 16ull << 20);
  EXPECT_EQ(board_.aperture().size(), 16u << 20);
  EXPECT_EQ(r(reg::kNumQueues), kTinyQueues);
  EXPECT_EQ(r(reg::kNumVectors), kTinyQueues + 1);
  EXPECT_EQ(board_.interrupt_vectors(), kTinyQueues + 1);
  EXPECT_EQ(r(reg::kMaxRingEntries), 4096u);
  EXPECT_EQ(r(reg::kTensorCores), 2u);
  EXPECT_EQ(r(reg::kInt8Gops), 1000u);
  EXPECT_EQ(r(reg::kFp16Gflops), 500u);
  EXPECT_EQ(r(reg::kFp32Gflops), 125u);
  EXPECT_EQ(r(reg::kDecodeChannels), 2u);
  EXPECT_EQ(r(reg::kStatus), fw::kStatusReady);  // no version agreed yet
  EXPECT_EQ(board_.bad_mmio_accesses(), 0u);
}

TEST_F(SimBoard, QueueEnginesFollowTheProfileOrder) {
  EXPECT_EQ(qr(0, qreg::kEngine), static_cast<std::uint32_t>(fw::EngineType::kCompute));
  EXPECT_EQ(qr(1, qreg::kEngine), static_cast<std::uint32_t>(fw::EngineType::kCompute));
  EXPECT_EQ(qr(2, qreg::kEngine), static_cast<std::uint32_t>(fw::EngineType::kCopy));
  EXPECT_EQ(qr(3, qreg::kEngine), static_cast<std::uint32_t>(fw::EngineType::kVideo));
  for (std::uint32_t q = 0; q < kTinyQueues; ++q) {
    EXPECT_EQ(qr(q, qreg::kStatus), 0u);
    EXPECT_EQ(qr(q, qreg::kHead), 0u);
  }
}

TEST_F(SimBoard, RegionRegistersCarryNamesAndLayout) {
  ASSERT_EQ(r(reg::kNumMemRegions), 2u);
  EXPECT_EQ(region_name(0), "host-visible");
  EXPECT_EQ(r64(reg::region_reg(0, reg::region::kBaseLo)), 0u);
  EXPECT_EQ(r64(reg::region_reg(0, reg::region::kSizeLo)), 16ull << 20);
  EXPECT_EQ(r(reg::region_reg(0, reg::region::kFlags)), fw::kRegionHostVisible);
  EXPECT_EQ(region_name(1), "device");
  EXPECT_EQ(r64(reg::region_reg(1, reg::region::kBaseLo)), 16ull << 20);
  EXPECT_EQ(r64(reg::region_reg(1, reg::region::kSizeLo)), 48ull << 20);
  EXPECT_EQ(r(reg::region_reg(1, reg::region::kFlags)), fw::kRegionDefault);
  // Regions past the advertised count read as zero.
  EXPECT_EQ(region_name(2), "");
  EXPECT_EQ(r(reg::region_reg(2, reg::region::kSizeLo)), 0u);
}

TEST_F(SimBoard, BoardNameRegisterHoldsTheModel) {
  char name[reg::kBoardNameBytes + 1] = {};
  for (std::uint32_t off = 0; off < reg::kBoardNameBytes; off += 4) {
    const std::uint32_t v = r(reg::kBoardName + off);
    std::memcpy(name + off, &v, 4);
  }
  EXPECT_STREQ(name, "Small test board (simulated)");
}

TEST_F(SimBoard, ScratchIsReadWriteAndTimeMovesForward) {
  w(reg::kScratch, 0xCAFEF00D);
  EXPECT_EQ(r(reg::kScratch), 0xCAFEF00Du);
  const std::uint64_t t0 = r64(reg::kTimeLo);
  const std::uint64_t t1 = r64(reg::kTimeLo);
  EXPECT_GE(t1, t0);
  EXPECT_LT(t1, 3600 * kSecond);  // since the board's reset, moments ago
}

// ---- Version negotiation ------------------------------------------------------------

TEST_F(SimBoard, SupportedDriverVersionIsAccepted) {
  w(reg::kDriverVersion, fw::kInterfaceVersion.packed());
  EXPECT_EQ(r(reg::kDriverVersion), fw::kInterfaceVersion.packed());
  const std::uint32_t status = r(reg::kStatus);
  EXPECT_TRUE(status & fw::kStatusVersionOk);
  EXPECT_FALSE(status & fw::kStatusVersionRejected);
  EXPECT_TRUE(status & fw::kStatusReady);
}

TEST_F(SimBoard, UnsupportedDriverVersionIsRejected) {
  const fw::Version newer{fw::kInterfaceVersion.major, static_cast<std::uint16_t>(fw::kInterfaceVersion.minor + 1)};
  for (std::uint32_t bad : {fw::Version{2, 0}.packed(), newer.packed(), fw::Version{0, 0}.packed()}) {
    SCOPED_TRACE(bad);
    w(reg::kDriverVersion, bad);
    const std::uint32_t status = r(reg::kStatus);
    EXPECT_TRUE(status & fw::kStatusVersionRejected);
    EXPECT_FALSE(status & fw::kStatusVersionOk);
  }
  // A rejected version leaves the queues unusable.
  program_queue(0, 16, ring_base(0), kStatusIova);
  qw(0, qreg::kControl, fw::kQueueControlEnable);
  EXPECT_EQ(qr(0, qreg::kStatus), fw::kQueueStatusFaulted);
  EXPECT_EQ(qr(0, qreg::kError), static_cast<std::uint32_t>(fw::CmdStatus::kRingConfig));

  // A good version afterwards replaces the verdict.
  w(reg::kDriverVersion, fw::kInterfaceVersion.packed());
  EXPECT_TRUE(r(reg::kStatus) & fw::kStatusVersionOk);
  EXPECT_FALSE(r(reg::kStatus) & fw::kStatusVersionRejected);
  qw(0, qreg::kControl, fw::kQueueControlEnable);
  EXPECT_EQ(qr(0, qreg::kStatus), fw::kQueueStatusEnabled);
  EXPECT_EQ(qr(0, qreg::kError), 0u);
}

// ---- Queue configuration ------------------------------------------------------------

TEST_F(SimBoard, QueueEnableRejectsBadRingConfiguration) {
  agree_version();
  const std::uint64_t dram = 64ull << 20;
  struct Case {
    const char* what;
    std::uint32_t entries;
    std::uint64_t base;
    std::uint64_t status_page;
  };
  const Case cases[] = {
      {"ring size 0", 0, ring_base(0), kStatusIova},
      {"ring size below the minimum", 8, ring_base(0), kStatusIova},
      {"ring size not a power of two", 24, ring_base(0), kStatusIova},
      {"ring size above the board's maximum", 8192, ring_base(0), kStatusIova},
      {"ring base not 64-aligned", 16, ring_base(0) + 32, kStatusIova},
      {"ring base past DRAM", 16, dram, kStatusIova},
      {"ring runs off the end of DRAM", 16, dram - 512, kStatusIova},
      {"ring base far outside DRAM", 16, kWin, kStatusIova},
      {"status page not in the host window", 16, ring_base(0), 0x1000},
      {"status page not 64-aligned", 16, ring_base(0), kStatusIova + 32},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    program_queue(0, c.entries, c.base, c.status_page);
    qw(0, qreg::kControl, fw::kQueueControlEnable);
    EXPECT_EQ(qr(0, qreg::kStatus), fw::kQueueStatusFaulted);
    EXPECT_EQ(qr(0, qreg::kError), static_cast<std::uint32_t>(fw::CmdStatus::kRingConfig));
    EXPECT_EQ(qr(0, qreg::kControl) & fw::kQueueControlEnable, 0u);
  }
  // The registers read back what was written.
  program_queue(0, 32, ring_base(0), kStatusIova);
  EXPECT_EQ(qr(0, qreg::kRingSize), 32u);
  EXPECT_EQ(qr(0, qreg::kRingBaseLo), ring_base(0));
  EXPECT_EQ(qr(0, qreg::kFenceLo), static_cast<std::uint32_t>(kStatusIova));
  EXPECT_EQ(qr(0, qreg::kFenceHi), static_cast<std::uint32_t>(kStatusIova >> 32));
  // And a good configuration afterwards works.
  qw(0, qreg::kControl, fw::kQueueControlEnable);
  EXPECT_EQ(qr(0, qreg::kStatus), fw::kQueueStatusEnabled);
  EXPECT_EQ(qr(0, qreg::kError), 0u);
  EXPECT_EQ(qr(0, qreg::kControl), fw::kQueueControlEnable);
}

TEST_F(SimBoard, LargestRingTheBoardAdvertisesIsAccepted) {
  agree_version();
  program_queue(0, 4096, 0x100000, kStatusIova);  // 256 KiB of ring
  qw(0, qreg::kControl, fw::kQueueControlEnable);
  EXPECT_EQ(qr(0, qreg::kStatus), fw::kQueueStatusEnabled);
}

// ---- Work ---------------------------------------------------------------------------

TEST_F(SimBoard, NopAndCopyRoundTripMovesHostBytesIntoDram) {
  enable_queue(0);
  push(0, fenced(desc(fw::Opcode::kNop), 1, 0));
  push(0, fenced(desc(fw::Opcode::kCopy, kSrcIova + 128, kDramData, 8192), 2));
  doorbell(0);

  ASSERT_EQ(wait_timeline(0, 2), 2u);
  std::byte* dram = board_.aperture().data() + kDramData;
  EXPECT_EQ(std::memcmp(dram, src_.data() + 128, 8192), 0);
  EXPECT_EQ(dram[8192], std::byte{0});  // nothing past the copy

  EXPECT_EQ(page(0).stamps[2].value, 2u);
  EXPECT_EQ(page(0).stamps[1].value, 1u);
  EXPECT_GE(page(0).stamps[2].ns, page(0).stamps[1].ns);
  EXPECT_TRUE(wait_reg(0, qreg::kHead, [](std::uint32_t h) { return h == 2; }));
  EXPECT_TRUE(wait_reg(0, qreg::kRetiredLo, [](std::uint32_t n) { return n == 2; }));
  EXPECT_EQ(qr(0, qreg::kTail), 2u);
  EXPECT_EQ(qr(0, qreg::kStatus) & fw::kQueueStatusFaulted, 0u);
  EXPECT_EQ(qr(0, qreg::kError), 0u);
}

TEST_F(SimBoard, CopyFromDramBackToHostMemory) {
  enable_queue(2);  // a copy-engine queue
  std::memset(board_.aperture().data() + kDramData, 0x5A, 4096);
  push(2, desc(fw::Opcode::kCopy, kDramData, kDstIova + 8, 4096));
  push(2, fenced(desc(fw::Opcode::kNop), 7));
  doorbell(2);
  ASSERT_EQ(wait_timeline(2, 7), 7u);
  EXPECT_EQ(dst_.data()[7], std::byte{0});
  EXPECT_EQ(dst_.data()[8], std::byte{0x5A});
  EXPECT_EQ(dst_.data()[8 + 4095], std::byte{0x5A});
  EXPECT_EQ(dst_.data()[8 + 4096], std::byte{0});
}

TEST_F(SimBoard, FillWriteValueTimestampAndScatterGatherReachMemory) {
  enable_queue(1);
  std::byte* dram = board_.aperture().data();
  // A two-segment list in DRAM: host src -> DRAM, DRAM -> DRAM.
  const std::uint64_t list = kDramData + 0x10000;
  const fw::DmaSegment segs[2] = {{kSrcIova, kDramData + 0x20000, 100, 0},
                                  {kDramData + 0x20000, kDramData + 0x30000, 100, 0}};
  std::memcpy(dram + list, segs, sizeof segs);

  push(1, desc(fw::Opcode::kFill, kDramData, 64, 0xA1B2C3D4ull | 4ull << 32));
  push(1, desc(fw::Opcode::kWriteValue, kDstIova + 64, 0x1122334455667788));
  push(1, desc(fw::Opcode::kTimestamp, kDstIova + 128));
  push(1, desc(fw::Opcode::kCopySg, list, 2, 200));
  push(1, fenced(desc(fw::Opcode::kNop), 3));
  doorbell(1);
  ASSERT_EQ(wait_timeline(1, 3), 3u);

  for (int i = 0; i < 64; i += 4) {
    std::uint32_t v;
    std::memcpy(&v, dram + kDramData + i, 4);
    EXPECT_EQ(v, 0xA1B2C3D4u) << i;
  }
  EXPECT_EQ(dram[kDramData + 64], std::byte{0});
  std::uint64_t v;
  std::memcpy(&v, dst_.data() + 64, 8);
  EXPECT_EQ(v, 0x1122334455667788u);
  std::memcpy(&v, dst_.data() + 128, 8);
  EXPECT_GT(v, 0u);  // board time, ns since reset
  EXPECT_EQ(std::memcmp(dram + kDramData + 0x30000, src_.data(), 100), 0);
}

TEST_F(SimBoard, WaitValueOrdersQueuesThroughATimeline) {
  enable_queue(0);
  enable_queue(1);
  // Queue 1 waits for queue 0's timeline to reach 1, then copies what queue 0
  // wrote.
  push(1, desc(fw::Opcode::kWaitValue, kStatusIova, 1, static_cast<std::uint64_t>(fw::WaitMode::kTimeline)));
  push(1, fenced(desc(fw::Opcode::kCopy, kDramData, kDramData + 0x1000, 8), 1));
  doorbell(1);
  EXPECT_TRUE(wait_reg(1, qreg::kStatus, [](std::uint32_t s) { return (s & fw::kQueueStatusWaiting) != 0; }));
  EXPECT_EQ(timeline(1), 0u);

  push(0, desc(fw::Opcode::kWriteValue, kDramData, 0xABCDEF));
  push(0, fenced(desc(fw::Opcode::kNop), 1));
  doorbell(0);
  ASSERT_EQ(wait_timeline(1, 1), 1u);
  std::uint64_t v;
  std::memcpy(&v, board_.aperture().data() + kDramData + 0x1000, 8);
  EXPECT_EQ(v, 0xABCDEFu);
}

TEST_F(SimBoard, WaitOnAFailedTimelineFailsWithDependencyFailed) {
  enable_queue(0);
  enable_queue(1);
  push(1, desc(fw::Opcode::kWaitValue, kStatusIova, 5, static_cast<std::uint64_t>(fw::WaitMode::kTimeline)));
  push(1, fenced(desc(fw::Opcode::kNop), 1));
  doorbell(1);
  push(0, fenced(desc(fw::Opcode::kCopy, kUnmappedIova, kDramData, 8), 1));
  doorbell(0);
  ASSERT_TRUE(wait_failed(0) & fw::kTimelineFailed);
  const std::uint64_t v = wait_failed(1);
  ASSERT_TRUE(v & fw::kTimelineFailed);
  const auto& rec = page(1).fence;
  EXPECT_EQ(rec.error_status, static_cast<std::uint32_t>(fw::CmdStatus::kDependencyFailed));
  EXPECT_EQ(rec.error_opcode, static_cast<std::uint16_t>(fw::Opcode::kWaitValue));
  EXPECT_EQ(rec.error_value, kStatusIova);
  EXPECT_EQ(rec.error_sequence, 0u);
}

TEST_F(SimBoard, OverlappingDramCopyHasMemmoveSemantics) {
  enable_queue(0);
  std::byte* dram = board_.aperture().data() + kDramData;
  for (int i = 0; i < 256; ++i) dram[i] = static_cast<std::byte>(i);
  push(0, desc(fw::Opcode::kCopy, kDramData, kDramData + 16, 128));                   // forwards overlap
  push(0, fenced(desc(fw::Opcode::kCopy, kDramData + 200, kDramData + 192, 32), 1));  // backwards
  doorbell(0);
  ASSERT_EQ(wait_timeline(0, 1), 1u);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(dram[i], static_cast<std::byte>(i)) << i;
  for (int i = 16; i < 144; ++i) EXPECT_EQ(dram[i], static_cast<std::byte>(i - 16)) << i;
  for (int i = 192; i < 224; ++i) EXPECT_EQ(dram[i], static_cast<std::byte>(i + 8)) << i;
}

TEST_F(SimBoard, HostWriteReleasesAWaitValue) {
  enable_queue(0);
  auto& word = *reinterpret_cast<std::uint64_t*>(dst_.data() + 256);
  push(0, desc(fw::Opcode::kWaitValue, kDstIova + 256, 5, static_cast<std::uint64_t>(fw::WaitMode::kGreaterEqual)));
  push(0, fenced(desc(fw::Opcode::kNop), 1));
  doorbell(0);
  ASSERT_TRUE(wait_reg(0, qreg::kStatus, [](std::uint32_t s) { return (s & fw::kQueueStatusWaiting) != 0; }));
  std::atomic_ref<std::uint64_t>(word).store(4, std::memory_order_release);  // not yet
  std::atomic_ref<std::uint64_t>(word).store(5, std::memory_order_release);
  ASSERT_EQ(wait_timeline(0, 1), 1u);
  EXPECT_TRUE(wait_reg(0, qreg::kStatus, [](std::uint32_t s) { return (s & fw::kQueueStatusWaiting) == 0; }));
}

TEST_F(SimBoard, QueueResetStopsAQueueBlockedInWaitValue) {
  enable_queue(0);
  push(0, desc(fw::Opcode::kWaitValue, kDstIova + 512, 1,
               static_cast<std::uint64_t>(fw::WaitMode::kGreaterEqual)));  // never satisfied
  push(0, fenced(desc(fw::Opcode::kNop), 1));
  doorbell(0);
  ASSERT_TRUE(wait_reg(0, qreg::kStatus, [](std::uint32_t s) { return (s & fw::kQueueStatusWaiting) != 0; }));
  qw(0, qreg::kControl, fw::kQueueControlReset);  // returns once the processor stopped
  EXPECT_EQ(qr(0, qreg::kStatus), 0u);
  EXPECT_EQ(qr(0, qreg::kHead), 0u);
  EXPECT_EQ(timeline(0), 0u);  // a reset is not a failure
}

TEST_F(SimBoard, ScatterGatherTotalMustMatchTheSegments) {
  enable_queue(0);
  const std::uint64_t list = kDramData + 0x10000;
  const fw::DmaSegment segs[2] = {{kSrcIova, kDramData, 64, 0}, {kSrcIova, kDramData + 64, 64, 0}};
  std::memcpy(board_.aperture().data() + list, segs, sizeof segs);
  push(0, fenced(desc(fw::Opcode::kCopySg, list, 2, 200), 1));
  doorbell(0);
  ASSERT_EQ(wait_failed(0), fw::kTimelineFailed);
  const auto& rec = page(0).fence;
  EXPECT_EQ(rec.error_status, static_cast<std::uint32_t>(fw::CmdStatus::kBadArgument));
  EXPECT_EQ(rec.error_field, 2u);     // total size
  EXPECT_EQ(rec.error_value, 200u);   // what the descriptor claimed
  EXPECT_EQ(rec.error_detail, 128u);  // what the segments add up to
}

TEST_F(SimBoard, BadSegmentNamesItsIndex) {
  enable_queue(0);
  const std::uint64_t list = kDramData + 0x10000;
  const fw::DmaSegment segs[3] = {
      {kSrcIova, kDramData, 64, 0}, {kSrcIova, kDramData + 64, 64, 0}, {kSrcIova, kDramData + 128, 64, 0xBAD}};
  std::memcpy(board_.aperture().data() + list, segs, sizeof segs);
  push(0, fenced(desc(fw::Opcode::kCopySg, list, 3, 192), 1));
  doorbell(0);
  ASSERT_EQ(wait_failed(0), fw::kTimelineFailed);
  const auto& rec = page(0).fence;
  EXPECT_EQ(rec.error_status, static_cast<std::uint32_t>(fw::CmdStatus::kReservedNotZero));
  EXPECT_EQ(rec.error_field, 3u);  // DmaSegment::reserved
  EXPECT_EQ(rec.error_value, 0xBADu);
  EXPECT_EQ(rec.error_detail, 2u);  // the third segment
}

TEST_F(SimBoard, UnreachableStatusPageLeavesOnlyTheErrorRegister) {
  agree_version();
  // Accepted at enable time (the address is in the host window), but nothing
  // is mapped there.
  program_queue(0, 16, ring_base(0), kUnmappedIova);
  qw(0, qreg::kControl, fw::kQueueControlEnable);
  ASSERT_EQ(qr(0, qreg::kStatus), fw::kQueueStatusEnabled);
  ring_entries_[0] = 16;
  push(0, fenced(desc(fw::Opcode::kNop), 1));
  doorbell(0);
  EXPECT_TRUE(wait_reg(0, qreg::kStatus, [](std::uint32_t s) { return (s & fw::kQueueStatusFaulted) != 0; }));
  EXPECT_EQ(qr(0, qreg::kError), static_cast<std::uint32_t>(fw::CmdStatus::kDmaFault));
  EXPECT_TRUE(wait_int_status(1u));
}

// ---- Failures -----------------------------------------------------------------------

TEST_F(SimBoard, UnmappedHostAddressHaltsTheQueueWithADmaFault) {
  enable_queue(0);
  enable_queue(1);
  push(0, fenced(desc(fw::Opcode::kNop), 1, 0));
  push(0, fenced(desc(fw::Opcode::kCopy, kUnmappedIova, kDramData, 256), 2));
  push(0, fenced(desc(fw::Opcode::kNop), 3));  // never runs
  doorbell(0);

  const std::uint64_t v = wait_failed(0);
  ASSERT_TRUE(v & fw::kTimelineFailed);
  EXPECT_EQ(v, 1 | fw::kTimelineFailed);  // the last good fence, plus the failed bit
  const auto& rec = page(0).fence;
  EXPECT_EQ(rec.error_status, static_cast<std::uint32_t>(fw::CmdStatus::kDmaFault));
  EXPECT_EQ(rec.error_opcode, static_cast<std::uint16_t>(fw::Opcode::kCopy));
  EXPECT_EQ(rec.error_field, 0u);  // src
  EXPECT_EQ(rec.error_value, kUnmappedIova);
  EXPECT_EQ(rec.error_detail, fw::kAccessRead);
  EXPECT_EQ(rec.error_sequence, 1u);
  EXPECT_EQ(rec.error_fence, 2u);

  auto failure = fw::decode_failure(rec);
  ASSERT_TRUE(failure.ok());
  EXPECT_EQ(fw::describe(*failure), "copy: src address 0x1000000900000 is not mapped for DMA (read)");

  EXPECT_TRUE(wait_reg(0, qreg::kStatus, [](std::uint32_t s) { return (s & fw::kQueueStatusFaulted) != 0; }));
  EXPECT_EQ(qr(0, qreg::kError), static_cast<std::uint32_t>(fw::CmdStatus::kDmaFault));
  EXPECT_EQ(qr(0, qreg::kHead), 1u);
  EXPECT_TRUE(wait_int_status(1u));  // latched even while masked

  // Another queue carries on.
  push(1, fenced(desc(fw::Opcode::kCopy, kSrcIova, kDramData, 64), 9));
  doorbell(1);
  EXPECT_EQ(wait_timeline(1, 9), 9u);
  EXPECT_EQ(std::memcmp(board_.aperture().data() + kDramData, src_.data(), 64), 0);
  // The halted queue did not move on.
  EXPECT_EQ(qr(0, qreg::kHead), 1u);
  EXPECT_EQ(timeline(0), 1 | fw::kTimelineFailed);
}

TEST_F(SimBoard, WriteToAReadOnlyMappingIsAWriteFault) {
  enable_queue(2);
  push(2, fenced(desc(fw::Opcode::kCopy, kDramData, kSrcIova + 4096, 16), 1));
  doorbell(2);
  ASSERT_TRUE(wait_failed(2) & fw::kTimelineFailed);
  const auto& rec = page(2).fence;
  EXPECT_EQ(rec.error_status, static_cast<std::uint32_t>(fw::CmdStatus::kDmaFault));
  EXPECT_EQ(rec.error_field, 1u);  // dst
  EXPECT_EQ(rec.error_value, kSrcIova + 4096);
  EXPECT_EQ(rec.error_detail, fw::kAccessWrite);
  auto failure = fw::decode_failure(rec);
  ASSERT_TRUE(failure.ok());
  const std::string msg = fw::describe(*failure);
  EXPECT_NE(msg.find("dst address 0x1000000101000"), std::string::npos) << msg;
  EXPECT_NE(msg.find("(write)"), std::string::npos) << msg;
}

TEST_F(SimBoard, CorruptSequenceIsABadSequence) {
  enable_queue(0);
  push(0, fenced(desc(fw::Opcode::kNop), 1, 0));
  auto stale = fenced(desc(fw::Opcode::kNop), 2);
  stale.sequence = 17;  // belongs to another lap of the ring
  push(0, stale, /*keep_sequence=*/true);
  doorbell(0);
  ASSERT_EQ(wait_failed(0), 1 | fw::kTimelineFailed);
  const auto& rec = page(0).fence;
  EXPECT_EQ(rec.error_status, static_cast<std::uint32_t>(fw::CmdStatus::kBadSequence));
  EXPECT_EQ(rec.error_field, fw::Problem::kFieldSequence);
  EXPECT_EQ(rec.error_value, 17u);
  EXPECT_EQ(rec.error_detail, 1u);  // the ring position
  EXPECT_EQ(rec.error_sequence, 17u);
  EXPECT_EQ(qr(0, qreg::kError), static_cast<std::uint32_t>(fw::CmdStatus::kBadSequence));
}

TEST_F(SimBoard, UnknownOpcodeIsAnInvalidOpcode) {
  enable_queue(3);
  fw::CommandDescriptor d{};
  d.opcode = 99;
  push(3, d);
  doorbell(3);
  ASSERT_EQ(wait_failed(3), fw::kTimelineFailed);  // no fence completed before it
  const auto& rec = page(3).fence;
  EXPECT_EQ(rec.error_status, static_cast<std::uint32_t>(fw::CmdStatus::kInvalidOpcode));
  EXPECT_EQ(rec.error_field, fw::Problem::kFieldOpcode);
  EXPECT_EQ(rec.error_value, 99u);
  EXPECT_EQ(rec.error_opcode, 99u);
  auto failure = fw::decode_failure(rec);
  ASSERT_TRUE(failure.ok());
  EXPECT_EQ(fw::describe(*failure), "unknown opcode 0x63 (interface " + test::interface_version_text() +
                                        " defines 1.." + std::to_string(fw::kMaxOpcode) + ")");
}

TEST_F(SimBoard, FenceValuesMustIncrease) {
  enable_queue(0);
  push(0, fenced(desc(fw::Opcode::kNop), 5, 0));
  push(0, fenced(desc(fw::Opcode::kNop), 5, 0));
  doorbell(0);
  ASSERT_EQ(wait_failed(0), 5 | fw::kTimelineFailed);
  const auto& rec = page(0).fence;
  EXPECT_EQ(rec.error_status, static_cast<std::uint32_t>(fw::CmdStatus::kFenceNotMonotonic));
  EXPECT_EQ(rec.error_field, fw::Problem::kFieldFence);
  EXPECT_EQ(rec.error_value, 5u);
  EXPECT_EQ(rec.error_detail, 5u);
}

TEST_F(SimBoard, TailBeyondTheRingIsARingConfigFailure) {
  enable_queue(0);
  qw(0, qreg::kTail, 17);  // a 16-entry ring cannot hold 17 descriptors
  ASSERT_EQ(wait_failed(0), fw::kTimelineFailed);
  const auto& rec = page(0).fence;
  EXPECT_EQ(rec.error_status, static_cast<std::uint32_t>(fw::CmdStatus::kRingConfig));
  EXPECT_EQ(rec.error_field, fw::Problem::kFieldSequence);
  EXPECT_EQ(rec.error_value, 17u);
  EXPECT_EQ(rec.error_detail, 0u);
}

TEST_F(SimBoard, QueueResetClearsTheFaultAndTheQueueRunsAgain) {
  enable_queue(0);
  push(0, desc(fw::Opcode::kCopy, kUnmappedIova, kDramData, 8));
  doorbell(0);
  ASSERT_TRUE(wait_failed(0) & fw::kTimelineFailed);
  ASSERT_TRUE(wait_reg(0, qreg::kStatus, [](std::uint32_t s) { return (s & fw::kQueueStatusFaulted) != 0; }));
  ASSERT_TRUE(wait_int_status(1u));

  qw(0, qreg::kControl, fw::kQueueControlReset);
  EXPECT_EQ(qr(0, qreg::kStatus), 0u);
  EXPECT_EQ(qr(0, qreg::kError), 0u);
  EXPECT_EQ(qr(0, qreg::kControl), 0u);
  EXPECT_EQ(qr(0, qreg::kHead), 0u);
  EXPECT_EQ(qr(0, qreg::kTail), 0u);
  EXPECT_EQ(r(reg::kIntStatus) & 1u, 0u);
  // The ring configuration survives a queue reset.
  EXPECT_EQ(qr(0, qreg::kRingSize), 16u);

  qw(0, qreg::kControl, fw::kQueueControlEnable);
  ASSERT_EQ(qr(0, qreg::kStatus), fw::kQueueStatusEnabled);
  tail_[0] = 0;
  push(0, fenced(desc(fw::Opcode::kCopy, kSrcIova, kDramData, 8), 4));
  doorbell(0);
  // The status page still says "failed" until the first new fence lands.
  EXPECT_EQ(wait_timeline_exact(0, 4), 4u);
  EXPECT_EQ(std::memcmp(board_.aperture().data() + kDramData, src_.data(), 8), 0);
}

TEST_F(SimBoard, EveryEnableStartsAFreshCommandProcessor) {
  // The queue's thread outlives a reset; the processor it runs does not.
  // Whichever way the last one ended (done, halted, blocked in a wait), the
  // next enable starts at ring position 0 having seen no fence, and RETIRED
  // keeps counting.
  std::uint64_t retired = 0;
  for (std::uint64_t cycle = 0; cycle < 60; ++cycle) {
    SCOPED_TRACE("cycle " + std::to_string(cycle));
    enable_queue(0);
    switch (cycle % 3) {
      case 0:  // fence 1 again: a fresh processor has seen none
        push(0, fenced(desc(fw::Opcode::kWriteValue, kDstIova, cycle), 1, 0));
        doorbell(0);
        ASSERT_EQ(wait_timeline_exact(0, 1), 1u);
        ++retired;
        break;
      case 1:  // halts; the record's timeline is this processor's: no fence
        push(0, desc(fw::Opcode::kCopy, kUnmappedIova, kDramData, 8));
        doorbell(0);
        ASSERT_EQ(wait_failed(0), fw::kTimelineFailed);
        break;
      default:  // blocks in a wait nothing satisfies
        push(0,
             desc(fw::Opcode::kWaitValue, kDstIova + 512, 1, static_cast<std::uint64_t>(fw::WaitMode::kGreaterEqual)));
        doorbell(0);
        ASSERT_TRUE(wait_reg(0, qreg::kStatus, [](std::uint32_t s) { return (s & fw::kQueueStatusWaiting) != 0; }));
        break;
    }
    qw(0, qreg::kControl, fw::kQueueControlReset);  // returns once the processor stopped
    ASSERT_EQ(qr(0, qreg::kStatus), 0u);
    ASSERT_EQ(qr(0, qreg::kHead), 0u);
    ASSERT_EQ(r64(reg::queue_reg(0, qreg::kRetiredLo)), retired);
    std::uint64_t v;
    std::memcpy(&v, dst_.data(), 8);
    ASSERT_EQ(v, cycle / 3 * 3);  // written by the last cycle that completed
  }
}

TEST_F(SimBoard, RingWrapsAroundManyTimes) {
  enable_queue(0);
  std::uint64_t fence = 0;
  for (int batch = 0; batch < 20; ++batch) {
    for (int i = 0; i < 12; ++i) {
      auto d = desc(fw::Opcode::kWriteValue, kDstIova + 8 * static_cast<std::uint64_t>(i),
                    static_cast<std::uint64_t>(batch * 100 + i));
      push(0, i == 11 ? fenced(d, ++fence, 0) : d);
    }
    doorbell(0);
    ASSERT_EQ(wait_timeline(0, fence), fence) << "batch " << batch;
  }
  std::uint64_t v;
  std::memcpy(&v, dst_.data() + 8 * 11, 8);
  EXPECT_EQ(v, 19u * 100 + 11);
  EXPECT_TRUE(wait_reg(0, qreg::kHead, [](std::uint32_t h) { return h == 240; }));
  EXPECT_TRUE(wait_reg(0, qreg::kRetiredLo, [](std::uint32_t n) { return n == 240; }));
}

TEST_F(SimBoard, BoardResetDropsVersionQueuesAndMasks) {
  enable_queue(0);
  w(reg::kIntMask, 0xF);
  push(0, fenced(desc(fw::Opcode::kNop), 1, 0));
  doorbell(0);
  ASSERT_EQ(wait_timeline(0, 1), 1u);

  w(reg::kControl, fw::kControlReset | fw::kControlEnable);
  EXPECT_EQ(r(reg::kStatus), fw::kStatusReady);
  EXPECT_EQ(r(reg::kDriverVersion), 0u);
  EXPECT_EQ(r(reg::kControl), fw::kControlEnable);
  EXPECT_EQ(r(reg::kIntMask), 0u);
  EXPECT_EQ(qr(0, qreg::kStatus), 0u);
  EXPECT_EQ(qr(0, qreg::kRingSize), 0u);
  EXPECT_EQ(qr(0, qreg::kFenceLo), 0u);
}

// ---- Interrupts -----------------------------------------------------------------------

TEST_F(SimBoard, FencedInterruptDescriptorSignalsAnUnmaskedVector) {
  enable_queue(1);
  w(reg::kIntMask, 1u << 1);
  EXPECT_EQ(r(reg::kIntMask), 1u << 1);
  const int fd = board_.interrupt_fd(1);
  ASSERT_GE(fd, 0);
  EXPECT_FALSE(readable(fd, 0));

  push(1, fenced(desc(fw::Opcode::kNop), 1));
  doorbell(1);
  ASSERT_TRUE(readable(fd, 5000)) << "no interrupt within 5 s";
  EXPECT_GE(base::eventfd_drain(fd), 1u);
  EXPECT_EQ(timeline(1), 1u);
  EXPECT_TRUE(r(reg::kIntStatus) & (1u << 1));
  w(reg::kIntAck, 1u << 1);
  EXPECT_EQ(r(reg::kIntStatus) & (1u << 1), 0u);
  // Other vectors stayed quiet.
  EXPECT_FALSE(readable(board_.interrupt_fd(0), 0));
  EXPECT_FALSE(readable(board_.interrupt_fd(kTinyQueues), 0));
}

TEST_F(SimBoard, MaskedOrUnflaggedCompletionsDoNotSignal) {
  enable_queue(0);
  const int fd = board_.interrupt_fd(0);
  // Masked: the fenced+interrupt completion neither signals nor latches.
  push(0, fenced(desc(fw::Opcode::kNop), 1));
  // Unmasked later, but without kFlagInterrupt.
  push(0, fenced(desc(fw::Opcode::kNop), 2, 0));
  doorbell(0);
  ASSERT_EQ(wait_timeline(0, 2), 2u);
  w(reg::kIntMask, 1u);
  push(0, fenced(desc(fw::Opcode::kNop), 3, 0));
  push(0, fenced(desc(fw::Opcode::kNop), 4, 0));
  doorbell(0);
  // Each completion's interrupt is raised before the next descriptor runs, so
  // once fence 4 is visible every earlier decision has been made.
  ASSERT_EQ(wait_timeline(0, 4), 4u);
  EXPECT_FALSE(readable(fd, 0));
  EXPECT_EQ(r(reg::kIntStatus) & 1u, 0u);
}

TEST_F(SimBoard, FaultSignalsTheQueueVectorAndUnmaskingFiresALatchedOne) {
  enable_queue(0);
  enable_queue(1);
  const int fd0 = board_.interrupt_fd(0);
  const int fd1 = board_.interrupt_fd(1);
  w(reg::kIntMask, 1u << 1);
  // Queue 1 faults with its vector unmasked: signalled.
  push(1, desc(fw::Opcode::kCopy, kUnmappedIova, kDramData, 8));
  doorbell(1);
  ASSERT_TRUE(readable(fd1, 5000));
  // Queue 0 faults while masked: latched, not signalled...
  push(0, desc(fw::Opcode::kCopy, kUnmappedIova, kDramData, 8));
  doorbell(0);
  ASSERT_TRUE(wait_failed(0) & fw::kTimelineFailed);
  ASSERT_TRUE(wait_reg(0, qreg::kStatus, [](std::uint32_t s) { return (s & fw::kQueueStatusFaulted) != 0; }));
  ASSERT_TRUE(wait_int_status(1u));
  EXPECT_FALSE(readable(fd0, 0));
  // ...until unmasked.
  w(reg::kIntMask, 0x3);
  EXPECT_TRUE(readable(fd0, 0));
}

// ---- Mailbox ----------------------------------------------------------------------------

TEST_F(SimBoard, MailboxPingReturnsTheComplement) {
  w(reg::kIntMask, fw::kDeviceVectorBit);
  const std::uint64_t arg = 0x0123456789ABCDEF;
  w(reg::kMboxArg0Lo, static_cast<std::uint32_t>(arg));
  w(reg::kMboxArg0Hi, static_cast<std::uint32_t>(arg >> 32));
  EXPECT_EQ(r(reg::kMboxArg0Hi), static_cast<std::uint32_t>(arg >> 32));
  const std::uint32_t seq = r(reg::kMboxSeq);
  w(reg::kMboxCmd, static_cast<std::uint32_t>(fw::MboxCmd::kPing));
  EXPECT_EQ(r(reg::kMboxStatus), static_cast<std::uint32_t>(fw::MboxStatus::kDone));
  EXPECT_EQ(r64(reg::kMboxRes0Lo), ~arg);
  EXPECT_EQ(r(reg::kMboxSeq), seq + 1);
  EXPECT_TRUE(r(reg::kIntStatus) & fw::kDeviceVectorBit);
  EXPECT_TRUE(readable(board_.interrupt_fd(kTinyQueues), 5000));
}

TEST_F(SimBoard, MailboxReportsErrorsAndQueueStats) {
  w(reg::kMboxCmd, 99);
  EXPECT_EQ(r(reg::kMboxStatus), static_cast<std::uint32_t>(fw::MboxStatus::kError));
  EXPECT_EQ(r(reg::kMboxRes0Lo), static_cast<std::uint32_t>(fw::CmdStatus::kInvalidOpcode));

  w(reg::kMboxArg0Lo, kTinyQueues);  // no such queue
  w(reg::kMboxArg0Hi, 0);
  w(reg::kMboxCmd, static_cast<std::uint32_t>(fw::MboxCmd::kQueueStats));
  EXPECT_EQ(r(reg::kMboxStatus), static_cast<std::uint32_t>(fw::MboxStatus::kError));
  EXPECT_EQ(r(reg::kMboxRes0Lo), static_cast<std::uint32_t>(fw::CmdStatus::kBadArgument));

  ASSERT_NO_FATAL_FAILURE(retire_two_nops(2));
  w(reg::kMboxArg0Lo, 2);
  w(reg::kMboxCmd, static_cast<std::uint32_t>(fw::MboxCmd::kQueueStats));
  EXPECT_EQ(r(reg::kMboxStatus), static_cast<std::uint32_t>(fw::MboxStatus::kDone));
  EXPECT_EQ(r64(reg::kMboxRes1Lo), 2u);

  w(reg::kMboxCmd, static_cast<std::uint32_t>(fw::MboxCmd::kGetBuildId));
  EXPECT_EQ(r(reg::kMboxStatus), static_cast<std::uint32_t>(fw::MboxStatus::kDone));
  EXPECT_NE(r64(reg::kMboxRes0Lo), 0u);
}

// ---- Telemetry (fw/telemetry.h) ---------------------------------------------------------

TEST_F(SimBoard, TelemetryBlockIsWrittenWhereTheMailboxSays) {
  ASSERT_TRUE(r(reg::kCaps) & fw::kCapTelemetry);
  // Two commands retired on queue 2, before the block is asked for.
  ASSERT_NO_FATAL_FAILURE(retire_two_nops(2));

  auto ask = [&](std::uint64_t addr, std::uint64_t bytes) {
    w(reg::kMboxArg0Lo, static_cast<std::uint32_t>(addr));
    w(reg::kMboxArg0Hi, static_cast<std::uint32_t>(addr >> 32));
    w(reg::kMboxArg1Lo, static_cast<std::uint32_t>(bytes));
    w(reg::kMboxArg1Hi, 0);
    w(reg::kMboxCmd, static_cast<std::uint32_t>(fw::MboxCmd::kTelemetry));
    return static_cast<fw::MboxStatus>(r(reg::kMboxStatus));
  };
  const std::uint64_t whole = fw::telemetry_bytes(kTinyQueues, 2);  // tiny: two decode channels
  ASSERT_LE(whole, kBufBytes);
  std::memset(dst_.data(), 0xEE, kBufBytes);
  ASSERT_EQ(ask(kDstIova, kBufBytes), fw::MboxStatus::kDone);
  EXPECT_EQ(r64(reg::kMboxRes0Lo), whole);
  EXPECT_EQ(r64(reg::kMboxRes1Lo), whole);
  fw::TelemetryHeader h;
  std::memcpy(&h, dst_.data(), sizeof h);
  EXPECT_EQ(h.magic, fw::kTelemetryMagic);
  EXPECT_EQ(h.version, fw::kTelemetryVersion);
  EXPECT_EQ(h.header_bytes, sizeof h);
  EXPECT_EQ(h.total_bytes, whole);
  EXPECT_EQ(h.num_queues, kTinyQueues);
  EXPECT_EQ(h.num_channels, 2u);
  EXPECT_GT(h.uptime_ns, 0u);
  EXPECT_EQ(h.resets, 0u);
  EXPECT_EQ(h.power_limit_mw, 5000u);  // tiny.json: peak_w 5
  EXPECT_EQ(h.clock_mhz, 500u);
  fw::TelemetryQueue q2;
  std::memcpy(&q2, dst_.data() + sizeof h + 2 * sizeof(fw::TelemetryQueue), sizeof q2);
  EXPECT_EQ(q2.index, 2u);
  EXPECT_EQ(q2.engine, static_cast<std::uint32_t>(board_.profile().engine_of_queue(2)));
  EXPECT_EQ(q2.commands, 2u);
  EXPECT_EQ(q2.failures, 0u);
  EXPECT_GT(h.engine_busy_ns[q2.engine], 0u);
  EXPECT_EQ(dst_.data()[whole], std::byte{0xEE});  // nothing past the block

  // Room for the header and one queue: as many entries as fit.
  ASSERT_EQ(ask(kDstIova, sizeof h + sizeof(fw::TelemetryQueue) + 8), fw::MboxStatus::kDone);
  std::memcpy(&h, dst_.data(), sizeof h);
  EXPECT_EQ(h.num_queues, 1u);
  EXPECT_EQ(h.num_channels, 0u);
  EXPECT_EQ(r64(reg::kMboxRes0Lo), sizeof h + sizeof(fw::TelemetryQueue));

  // Refusals: too small for the header, unaligned, unmapped.
  EXPECT_EQ(ask(kDstIova, sizeof h - 1), fw::MboxStatus::kError);
  EXPECT_EQ(r64(reg::kMboxRes0Lo), static_cast<std::uint64_t>(fw::CmdStatus::kBadArgument));
  EXPECT_EQ(r64(reg::kMboxRes1Lo), whole);
  EXPECT_EQ(ask(kDstIova + 4, kBufBytes - 4), fw::MboxStatus::kError);
  EXPECT_EQ(r64(reg::kMboxRes0Lo), static_cast<std::uint64_t>(fw::CmdStatus::kBadAlignment));
  EXPECT_EQ(ask(kUnmappedIova, kBufBytes), fw::MboxStatus::kError);
  EXPECT_EQ(r64(reg::kMboxRes0Lo), static_cast<std::uint64_t>(fw::CmdStatus::kDmaFault));
}

// ---- Bad accesses -----------------------------------------------------------------------

TEST_F(SimBoard, OutOfRangeAndMisalignedAccessesAreCountedAndHarmless) {
  EXPECT_EQ(board_.bad_mmio_accesses(), 0u);
  EXPECT_EQ(r(fw::kBar0Size), 0xFFFFFFFFu);
  EXPECT_EQ(board_.bad_mmio_accesses(), 1u);
  EXPECT_EQ(r(0xFFFFFFFC), 0xFFFFFFFFu);
  EXPECT_EQ(board_.bad_mmio_accesses(), 2u);
  EXPECT_EQ(r(reg::kIdMagic + 2), 0xFFFFFFFFu);  // misaligned
  EXPECT_EQ(board_.bad_mmio_accesses(), 3u);

  w(fw::kBar0Size + 4, 1);
  EXPECT_EQ(board_.bad_mmio_accesses(), 4u);
  w(reg::kScratch + 1, 1);
  EXPECT_EQ(board_.bad_mmio_accesses(), 5u);
  EXPECT_EQ(r(reg::kScratch), 0u);

  // Writes to read-only registers are dropped and counted.
  w(reg::kIdMagic, 0);
  EXPECT_EQ(board_.bad_mmio_accesses(), 6u);
  EXPECT_EQ(r(reg::kIdMagic), fw::kIdMagic);
  qw(0, qreg::kHead, 5);
  EXPECT_EQ(board_.bad_mmio_accesses(), 7u);
  EXPECT_EQ(qr(0, qreg::kHead), 0u);

  // A queue the board does not have reads as all-ones; reads and writes are counted.
  EXPECT_EQ(qr(kTinyQueues, qreg::kEngine), 0xFFFFFFFFu);
  EXPECT_EQ(r(reg::queue_reg(fw::kMaxQueues, qreg::kStatus)), 0xFFFFFFFFu);
  EXPECT_EQ(board_.bad_mmio_accesses(), 9u);
  const std::uint64_t before = board_.bad_mmio_accesses();
  qw(kTinyQueues, qreg::kTail, 1);
  EXPECT_EQ(board_.bad_mmio_accesses(), before + 1);

  EXPECT_EQ(board_.interrupt_fd(kTinyQueues + 1), -1);
}

}  // namespace
}  // namespace tpuhal::sim
