// sim::Board consuming a ring the host filled with arbitrary bytes: what a
// buggy or hostile driver can make the board read. The board is driven
// through BAR0 exactly as tests/sim/board_test.cpp drives it.
//
// Properties, for every input:
//   - the board neither crashes nor touches memory outside its DRAM and the
//     windows the IOMMU maps (AddressSanitizer watches the host windows,
//     PROT_NONE guard pages either side of DRAM catch overruns there) and
//     never writes a read-only window;
//   - enabling the queue succeeds exactly when its configuration is valid;
//   - the queue then either completes every published descriptor, or halts
//     with a recorded failure (ERROR, and when the status page is writable
//     a failed timeline and a record fw::decode_failure accepts and
//     fw::describe can say), or blocks in a kWaitValue nothing will satisfy.
//     Anything else within 10 s is a hang. A halted queue has latched its
//     interrupt, and signalled it if unmasked.
//
// One board per process (a 1 MiB profile, four queues, no tensor engine, no
// idle spinning); per input: DRAM and host windows cleared, the queue
// programmed, enabled, rung, waited on and reset. Each queue's command
// processor thread is started by its first enable and then kept, asleep
// between a reset and the next enable, as for any user of the board.
//
// Input layout (fuzz/make_seeds.py writes seeds in it):
//   byte 0  bits 0-1  queue: 0, 1 compute; 2 copy; 3 video
//           bits 2-3  ring entries: 16 << n
//           bits 4-5  ring base: 0 = DRAM start, 1 = DRAM end, 2 = overhanging
//                     the end of DRAM (refused), 3 = 32 (misaligned, refused)
//           bits 6-7  status page window: 0 = read/write (8 KiB), 1 = read-only
//                     (4 KiB), 2 = unmapped IOVA, 3 = DRAM (refused)
//   byte 1  bits 0-6  status page offset in its window, in 64-byte units
//           bit 7     the queue's interrupt vector unmasked
//   byte 2  ring slots filled from the input (then cut to the ring and the input)
//   byte 3  TAIL written: 0 = the slots filled, else this value
//   then    the ring slots, 64 bytes each
//   then    data (up to 64 KiB), copied to DRAM at kDataDram (0x10000), to a
//           read/write host window at kHostRwIova (first 16 KiB) and to a
//           read-only one at kHostRoIova (first 4 KiB)
// Missing header bytes read as zero.
#include <poll.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "fuzz_util.h"
#include "tpuhal/base/fd.h"
#include "tpuhal/base/wait.h"
#include "tpuhal/fw/command.h"
#include "tpuhal/fw/decode.h"
#include "tpuhal/fw/regs.h"
#include "tpuhal/fw/version.h"
#include "tpuhal/sim/board.h"
#include "tpuhal/sim/profile.h"

namespace fw = tpuhal::fw;
namespace sim = tpuhal::sim;
namespace reg = fw::reg;
namespace qreg = fw::reg::queue;

namespace {

constexpr char kProfile[] = R"({
  "name": "fuzz", "model": "fuzz target board", "bus": "pcie", "firmware_version": "1.1.0",
  "memory": { "dram": "1MiB", "aperture": "1MiB", "regions": [
    { "name": "dram", "base": "0", "size": "1MiB", "flags": ["host_visible", "default"] } ] },
  "queues": { "compute": 2, "copy": 1, "video": 1 },
  "max_ring_entries": 128,
  "timing": { "idle_spin_us": 0 }
})";

constexpr std::uint64_t kDramBytes = 1 << 20;
constexpr std::uint64_t kDataDram = 0x10000;
constexpr std::size_t kDataMax = 0x10000;
constexpr std::uint64_t kWin = fw::kHostWindowBase;
constexpr std::uint64_t kStatusIova = kWin;              // 8 KiB, read/write
constexpr std::uint64_t kStatusRoIova = kWin + 0x10000;  // 4 KiB, read-only
constexpr std::uint64_t kUnmappedIova = kWin + 0x20000;  // nothing mapped
constexpr std::uint64_t kHostRwIova = kWin + 0x100000;   // 16 KiB, read/write
constexpr std::uint64_t kHostRoIova = kWin + 0x200000;   // 4 KiB, read-only
constexpr std::size_t kStatusBytes = 0x2000, kStatusRoBytes = 0x1000;
constexpr std::size_t kHostRwBytes = 0x4000, kHostRoBytes = 0x1000;
constexpr std::uint64_t kHangNs = 10'000'000'000ull;

constexpr std::size_t kHeader = 4;
constexpr std::size_t kSlot = sizeof(fw::CommandDescriptor);

// Host memory the board reaches through the IOMMU: ordinary heap blocks, so
// that AddressSanitizer's redzones flank every window.
std::byte* host_alloc(std::size_t n) {
  auto* p = static_cast<std::byte*>(std::aligned_alloc(4096, n));
  if (!p) std::abort();
  return p;
}

// DRAM is the board's own mmap, which AddressSanitizer does not watch, and
// the kernel packs mappings next to each other. So that an access just past
// either end of DRAM faults instead of landing in a neighbour, the board is
// made when [guard page | DRAM-sized hole | guard page] has been reserved
// and the kernel puts its DRAM into that hole; when it picks another gap,
// that gap is filled and the board made again.
constexpr std::size_t kGuard = 4096;

std::unique_ptr<sim::Board> guarded_board(const sim::BoardProfile& profile) {
  std::vector<std::pair<void*, std::size_t>> filled;
  std::unique_ptr<sim::Board> board;
  for (int attempt = 0; attempt < 16; ++attempt) {
    void* p = ::mmap(nullptr, kDramBytes + 2 * kGuard, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) break;
    auto* hole = static_cast<std::byte*>(p) + kGuard;
    ::munmap(hole, kDramBytes);
    board = std::make_unique<sim::Board>(profile);
    std::byte* dram = board->aperture().data();
    if (dram == hole) break;
    // Give the hole and its guards back, keep the gap the kernel chose
    // occupied (until the board is placed), and try again.
    ::munmap(hole - kGuard, kGuard);
    ::munmap(hole + kDramBytes, kGuard);
    board.reset();
    void* fill =
        ::mmap(dram, kDramBytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
    if (fill != MAP_FAILED) filled.emplace_back(fill, kDramBytes);
  }
  for (auto [p, n] : filled) ::munmap(p, n);
  if (!board) {
    std::fprintf(stderr, "board_fuzzer: DRAM is not between guard pages\n");
    board = std::make_unique<sim::Board>(profile);
  }
  return board;
}

struct Harness {
  const sim::BoardProfile profile = sim::parse_profile(kProfile, "board_fuzzer");
  const std::unique_ptr<sim::Board> owned = guarded_board(profile);
  sim::Board& board = *owned;
  std::byte* dram = board.aperture().data();
  std::byte* status = host_alloc(kStatusBytes);
  std::byte* status_ro = host_alloc(kStatusRoBytes);
  std::byte* host_rw = host_alloc(kHostRwBytes);
  std::byte* host_ro = host_alloc(kHostRoBytes);
  std::uint32_t queues = 0;
  // TPUHAL_FUZZ_VERBOSE=1: one line per input saying how it ended.
  const bool verbose = std::getenv("TPUHAL_FUZZ_VERBOSE") != nullptr;

  Harness() {
    FUZZ_CHECK(board.aperture().size() == kDramBytes, "aperture %zu", board.aperture().size());
    auto map = [&](std::uint64_t iova, std::byte* p, std::size_t n, std::uint32_t access) {
      const std::string why = board.iommu().map(iova, p, n, access);
      FUZZ_CHECK(why.empty(), "iommu map: %s", why.c_str());
    };
    map(kStatusIova, status, kStatusBytes, sim::kIommuRead | sim::kIommuWrite);
    map(kStatusRoIova, status_ro, kStatusRoBytes, sim::kIommuRead);
    map(kHostRwIova, host_rw, kHostRwBytes, sim::kIommuRead | sim::kIommuWrite);
    map(kHostRoIova, host_ro, kHostRoBytes, sim::kIommuRead);
    // As the driver does: agree on a version with what the board offers.
    auto version = fw::negotiate(fw::Version::unpack(r(reg::kIfaceVersion)), fw::Version{1, 0}, fw::kInterfaceVersion);
    FUZZ_CHECK(version.ok(), "board interface %#x", r(reg::kIfaceVersion));
    w(reg::kDriverVersion, version->packed());
    FUZZ_CHECK(r(reg::kStatus) & fw::kStatusVersionOk, "version %#x refused", version->packed());
    queues = r(reg::kNumQueues);
    FUZZ_CHECK(queues == 4, "%u queues", queues);
  }

  std::uint32_t r(std::uint32_t off) { return board.mmio_read32(off); }
  void w(std::uint32_t off, std::uint32_t v) { board.mmio_write32(off, v); }
  std::uint32_t qr(std::uint32_t q, std::uint32_t off) { return r(reg::queue_reg(q, off)); }
  void qw(std::uint32_t q, std::uint32_t off, std::uint32_t v) { w(reg::queue_reg(q, off), v); }
  void qw64(std::uint32_t q, std::uint32_t lo, std::uint64_t v) {
    qw(q, lo, static_cast<std::uint32_t>(v));
    qw(q, lo + 4, static_cast<std::uint32_t>(v >> 32));
  }
  std::uint64_t retired(std::uint32_t q) {
    const std::uint64_t lo = qr(q, qreg::kRetiredLo);
    return std::uint64_t{qr(q, qreg::kRetiredHi)} << 32 | lo;
  }

  void run(const std::uint8_t* data, std::size_t size);
};

Harness& harness() {
  static Harness* h = new Harness;  // one board per process, never torn down
  return *h;
}

enum class Outcome { kCompleted, kFailed, kBlocked };

void Harness::run(const std::uint8_t* data, std::size_t size) {
  std::uint8_t h[kHeader] = {};
  std::memcpy(h, data, std::min(size, kHeader));
  const std::uint32_t q = h[0] & 3;
  const std::uint32_t entries = 16u << ((h[0] >> 2) & 3);
  const std::uint64_t ring_bytes = entries * kSlot;
  const unsigned placement = (h[0] >> 4) & 3, page_mode = h[0] >> 6;
  const std::uint64_t page_offset = 64ull * (h[1] & 0x7F);
  const bool unmask = h[1] & 0x80;
  const std::uint64_t ring_base = placement == 0   ? 0
                                  : placement == 1 ? kDramBytes - ring_bytes
                                  : placement == 2 ? kDramBytes - ring_bytes + 64
                                                   : 32;
  const std::uint64_t status_page = page_offset + (page_mode == 0   ? kStatusIova
                                                   : page_mode == 1 ? kStatusRoIova
                                                   : page_mode == 2 ? kUnmappedIova
                                                                    : 0);
  const bool config_valid = placement < 2 && page_mode < 3;
  const std::size_t body = size > kHeader ? size - kHeader : 0;
  const std::size_t slots = std::min<std::size_t>({h[2], entries, body / kSlot});
  const std::uint8_t* ring_bytes_in = data + std::min(size, kHeader);
  const std::uint8_t* extra = ring_bytes_in + slots * kSlot;
  const std::size_t extra_size = std::min(body - slots * kSlot, kDataMax);
  const std::uint32_t tail = h[3] == 0 ? static_cast<std::uint32_t>(slots) : h[3];
  // The status page is the board's to write only if all 4 KiB are mapped writable.
  const bool page_writable = page_mode == 0 && page_offset + fw::kQueueStatusPageSize <= kStatusBytes;

  // Memory as the input describes it, nothing left from the last input.
  std::memset(dram, 0, kDramBytes);
  std::memcpy(dram + kDataDram, extra, extra_size);
  if (config_valid && slots) std::memcpy(dram + ring_base, ring_bytes_in, slots * kSlot);
  std::memset(status, 0, kStatusBytes);
  std::memset(status_ro, 0, kStatusRoBytes);
  std::memset(host_rw, 0, kHostRwBytes);
  std::memcpy(host_rw, extra, std::min(extra_size, kHostRwBytes));
  std::memset(host_ro, 0, kHostRoBytes);
  std::memcpy(host_ro, extra, std::min(extra_size, kHostRoBytes));

  const std::uint64_t retired_before = retired(q);
  const int vector = board.interrupt_fd(q);
  tpuhal::base::eventfd_drain(vector);
  if (unmask) w(reg::kIntMask, 1u << q);
  qw(q, qreg::kRingSize, entries);
  qw64(q, qreg::kRingBaseLo, ring_base);
  qw64(q, qreg::kFenceLo, status_page);
  qw(q, qreg::kControl, fw::kQueueControlEnable);
  const std::uint32_t enabled = qr(q, qreg::kStatus);
  if (!config_valid) {
    if (verbose) std::fprintf(stderr, "queue %u: enable refused\n", q);
    FUZZ_CHECK(enabled == fw::kQueueStatusFaulted &&
                   qr(q, qreg::kError) == static_cast<std::uint32_t>(fw::CmdStatus::kRingConfig),
               "ring base %#" PRIx64 " status page %#" PRIx64 " accepted (STATUS %#x)", ring_base, status_page,
               enabled);
  } else {
    FUZZ_CHECK(enabled == fw::kQueueStatusEnabled && qr(q, qreg::kError) == 0,
               "ring base %#" PRIx64 " x %u status page %#" PRIx64 " refused (STATUS %#x ERROR %u)", ring_base, entries,
               status_page, enabled, qr(q, qreg::kError));
    qw(q, qreg::kTail, tail);

    // Bounded wait for one of the three ends.
    Outcome outcome;
    std::uint32_t st = 0, head = 0;
    const std::uint64_t deadline = tpuhal::base::monotonic_ns() + kHangNs;
    for (unsigned i = 0;; ++i) {
      st = qr(q, qreg::kStatus);
      head = qr(q, qreg::kHead);
      if (st & fw::kQueueStatusFaulted) {
        outcome = Outcome::kFailed;
        break;
      }
      if (st & fw::kQueueStatusWaiting) {
        // Only this queue writes memory and it waits: nothing will change.
        outcome = Outcome::kBlocked;
        break;
      }
      if (head == tail && !(st & fw::kQueueStatusBusy)) {
        outcome = Outcome::kCompleted;
        break;
      }
      if (i < 256) {
        tpuhal::base::cpu_relax();
        continue;
      }
      FUZZ_CHECK(tpuhal::base::monotonic_ns() < deadline, "queue %u hangs: STATUS %#x HEAD %u TAIL %u PROGRESS %u", q,
                 st, head, tail, qr(q, qreg::kProgress));
      std::this_thread::yield();
    }

    const std::uint32_t error = qr(q, qreg::kError);
    // The interrupt follows the failed status (as on a bus, it may arrive
    // a moment later): wait for it, boundedly, before the reset clears it.
    bool latched = false, signalled = false;
    if (outcome == Outcome::kFailed) {
      const std::uint64_t until = tpuhal::base::monotonic_ns() + 1'000'000'000ull;
      while (!(latched = r(reg::kIntStatus) & (1u << q)) && tpuhal::base::monotonic_ns() < until)
        std::this_thread::yield();
      if (unmask) {
        pollfd p{vector, POLLIN, 0};
        signalled = ::poll(&p, 1, 1000) == 1 && tpuhal::base::eventfd_drain(vector) > 0;
      }
    }
    // RETIRED survives the reset, which returns once the command processor
    // has stopped: read after it, the count is final.
    qw(q, qreg::kControl, fw::kQueueControlReset);
    const std::uint64_t done = retired(q) - retired_before;
    if (verbose) {
      const auto& rec = reinterpret_cast<const fw::QueueStatusPage*>(status + page_offset)->fence;
      auto failure = fw::decode_failure(rec);
      std::fprintf(stderr, "queue %u: %s, %" PRIu64 " of %u slots retired%s%s\n", q,
                   outcome == Outcome::kCompleted ? "completed"
                   : outcome == Outcome::kBlocked
                       ? "blocked in wait_value"
                       : ("halted: " + std::string(fw::to_string(static_cast<fw::CmdStatus>(error)))).c_str(),
                   done, tail, page_writable && failure ? ": " : "",
                   page_writable && failure ? fw::describe(*failure).c_str() : "");
    }
    switch (outcome) {
      case Outcome::kCompleted:
        FUZZ_CHECK(error == 0, "completed with ERROR %u", error);
        // Without a tensor engine every descriptor that runs occupies one slot.
        FUZZ_CHECK(done == tail, "completed %u slots, retired %" PRIu64, tail, done);
        break;
      case Outcome::kFailed: {
        FUZZ_CHECK(error != 0 && fw::is_known(error) && error != static_cast<std::uint32_t>(fw::CmdStatus::kQueueReset),
                   "halted with ERROR %u", error);
        FUZZ_CHECK(done < tail, "halted after retiring %" PRIu64 " of %u slots", done, tail);
        FUZZ_CHECK(latched, "halted without latching its interrupt");
        FUZZ_CHECK(!unmask || signalled, "halted without signalling its unmasked interrupt");
        if (page_writable) {
          // The record is written last, by the halted queue: whatever the
          // commands before wrote into the page (it is DMA-reachable), the
          // driver must find a failure it can decode and say.
          const auto& rec = reinterpret_cast<const fw::QueueStatusPage*>(status + page_offset)->fence;
          FUZZ_CHECK(rec.value & fw::kTimelineFailed, "halted (ERROR %u), timeline %#" PRIx64, error, rec.value);
          auto failure = fw::decode_failure(rec);
          FUZZ_CHECK(failure && static_cast<std::uint32_t>(failure->status) == error, "record status %u, ERROR %u",
                     rec.error_status, error);
          const std::string msg = fw::describe(*failure);
          FUZZ_CHECK(tpuhal::fuzz::printable(msg), "message \"%s\"", msg.c_str());
        }
        break;
      }
      case Outcome::kBlocked:
        FUZZ_CHECK(error == 0 && done < tail, "blocked with ERROR %u after %" PRIu64 " of %u", error, done, tail);
        break;
    }
  }

  // Reset: the command processor stops (a waiting one too); the queue's
  // thread sleeps until the next input enables it again.
  qw(q, qreg::kControl, fw::kQueueControlReset);
  FUZZ_CHECK(qr(q, qreg::kStatus) == 0 && qr(q, qreg::kHead) == 0, "queue %u after reset", q);
  w(reg::kIntMask, 0);
  w(reg::kIntAck, ~0u);

  // What the board may not write came back unchanged.
  static const std::byte kZero[kHostRoBytes] = {};
  static_assert(kStatusRoBytes <= sizeof kZero);
  const std::size_t ro_data = std::min(extra_size, kHostRoBytes);
  FUZZ_CHECK(std::memcmp(status_ro, kZero, kStatusRoBytes) == 0, "the read-only status window was written");
  FUZZ_CHECK(
      std::memcmp(host_ro, extra, ro_data) == 0 && std::memcmp(host_ro + ro_data, kZero, kHostRoBytes - ro_data) == 0,
      "the read-only host window was written");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  harness().run(data, size);
  return 0;
}
