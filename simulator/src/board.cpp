// The board's register file: one switch for reads, one for writes, in the
// manner of a datasheet (docs/simulator.md describes each register's effect).
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <thread>
#include <cstring>
#include <vector>

#include "board_impl.h"
#include "tpuhal/fw/video.h"
#include "tpuhal/base/log.h"
#include "tpuhal/fw/version.h"

namespace tpuhal::sim {
namespace {

std::uint32_t lo(std::uint64_t v) { return static_cast<std::uint32_t>(v); }
std::uint32_t hi(std::uint64_t v) { return static_cast<std::uint32_t>(v >> 32); }
std::uint64_t join(std::uint32_t l, std::uint32_t h) { return std::uint64_t{h} << 32 | l; }

std::uint32_t gops(double tera) {
  const double g = tera * 1000.0;
  return g >= 4294967295.0 ? UINT32_MAX : static_cast<std::uint32_t>(g + 0.5);
}

constexpr std::uint32_t kFirmwareBuildId = 0x20261101;

}  // namespace

Board::Impl::Impl(BoardProfile p, BoardOptions options)
    : profile(std::move(p)),
      // Sparse: pages appear when first touched, in huge pages where the
      // kernel allows (a 12 GiB board costs nothing until used).
      dram(options.shared_dram ? base::Mapping::memfd("tpuhal-sim-dram", profile.dram_bytes, {.huge_pages = true})
                               : base::Mapping::anonymous(profile.dram_bytes, {.noreserve = true, .huge_pages = true})),
      dram_writes(dram.data(), profile.dram_bytes, profile.aperture_bytes),
      dma(dram.data(), profile.dram_bytes, iommu, dram_writes, options.host_port),
      power_on_ns(base::monotonic_ns()),
      thermal(profile, power_on_ns) {
  try {
    tensor_isa = tensor::isa_from_env();
  } catch (const std::invalid_argument& e) {
    throw ProfileError(e.what());
  }
  const std::uint32_t nq = profile.total_queues();
  for (std::uint32_t v = 0; v <= nq; ++v) vectors.push_back(base::make_eventfd());
  if (!options.doorbells.empty() && options.doorbells.size() != nq)
    throw ProfileError("BoardOptions::doorbells: " + std::to_string(options.doorbells.size()) +
                       " shadow doorbells for " + std::to_string(nq) + " queues");
  for (std::uint32_t q = 0; q < nq; ++q) {
    auto state = std::make_unique<QueueState>();
    state->engine = profile.engine_of_queue(q);
    if (!options.doorbells.empty()) {
      state->tail = options.doorbells[q].tail;
      state->sleeping = options.doorbells[q].sleeping;
      state->doorbell_net = options.doorbell_net;
      state->tail->store(0);
      state->sleeping->store(0);
    }
    queues.push_back(std::move(state));
  }
  if (profile.decode_channels && video_unavailable().empty())
    av = base::ffmpeg::load(base::ffmpeg::Part::kDecode, nullptr);
  std::memcpy(board_name.data(), profile.model.data(), std::min(profile.model.size(), board_name.size() - 1));
  reset_time_ns.store(base::monotonic_ns());
  status.store(fw::kStatusReady);
  // The clock (docs/timing.md): modelled if the profile has a model, unless
  // TPUHAL_SIM_CLOCK=host; TPUHAL_SIM_PACE=1 paces commands to it.
  if (const char* clock = std::getenv("TPUHAL_SIM_CLOCK"); clock && *clock) {
    const std::string_view c = clock;
    if (c != "model" && c != "host" && c != "virtual")
      throw ProfileError("TPUHAL_SIM_CLOCK: \"" + std::string(c) + "\" is not \"model\", \"virtual\" or \"host\"");
    if (c != "host" && !profile.timing)
      throw ProfileError("TPUHAL_SIM_CLOCK=" + std::string(c) + ": board profile '" + profile.name +
                         "' has no timing.model (docs/timing.md)");
    if (c != "host") timing = &*profile.timing;
    virtual_clock = c == "virtual";
  } else if (profile.timing) {
    timing = &*profile.timing;
  }
  if (const char* pace_env = std::getenv("TPUHAL_SIM_PACE"); pace_env && *pace_env) {
    const std::string_view v = pace_env;
    if (v != "0" && v != "1") throw ProfileError("TPUHAL_SIM_PACE: \"" + std::string(v) + "\" is not 0 or 1");
    pace = v == "1" && timing;
    if (pace && virtual_clock)
      throw ProfileError(
          "TPUHAL_SIM_PACE=1 with TPUHAL_SIM_CLOCK=virtual: a virtual clock does not follow the host's, "
          "so there is nothing to pace commands to");
  }
  // Faults for every board of this process, e.g. "hang:queue=0:after=3".
  if (const char* env = std::getenv("TPUHAL_SIM_FAULTS")) {
    std::vector<Fault> faults;
    try {
      faults = parse_faults(env);
    } catch (const ProfileError& e) {
      throw ProfileError(std::string("TPUHAL_SIM_FAULTS: ") + e.what());
    }
    for (const Fault& f : faults) inject(f);
  }
}

Board::Impl::~Impl() {
  std::lock_guard lock(control_mu);
  for (auto& q : queues) q->cp.reset();
  for (auto& q : queues) q->thread.reset();  // the threads exit
  codec_ptr.store(nullptr);
  codec.reset();
}

void Board::Impl::raise(std::uint32_t bits) noexcept {
  if (irq_lost_queues.load(std::memory_order_relaxed) && !(bits = drop_lost_interrupts(bits))) return;
  int_status.fetch_or(bits, std::memory_order_seq_cst);
  signal_vectors(bits & int_mask.load(std::memory_order_seq_cst));
}

tensor::TensorEngine* Board::Impl::tensor_engine() {
  if (profile.tensor_cores == 0) return nullptr;
  std::call_once(tensor_once, [this] {
    // The profile's cores bound the threads, and so does this machine;
    // TPUHAL_SIM_THREADS lowers it further (results never depend on it).
    unsigned threads = std::min(profile.tensor_cores, std::max(1u, std::thread::hardware_concurrency()));
    if (const char* env = std::getenv("TPUHAL_SIM_THREADS")) {
      const long n = std::strtol(env, nullptr, 10);
      if (n >= 1) threads = std::min(threads, static_cast<unsigned>(n));
    }
    tensor = std::make_unique<tensor::TensorEngine>(threads, tensor_isa, &dram_writes);
  });
  return tensor.get();
}

CodecUnit* Board::Impl::codec_unit() {
  if (!av) return nullptr;
  std::call_once(codec_once, [this] {
    // Decode threads shared by every channel: the profile's count (default:
    // this machine's cores); TPUHAL_SIM_VIDEO_THREADS lowers it.
    const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
    unsigned threads = profile.decode_threads ? std::min(profile.decode_threads, hw) : hw;
    if (const char* env = std::getenv("TPUHAL_SIM_VIDEO_THREADS")) {
      const long n = std::strtol(env, nullptr, 10);
      if (n >= 1) threads = std::min(threads, static_cast<unsigned>(n));
    }
    codec = std::make_unique<CodecUnit>(
        *av, dma, iommu, profile.decode_channels, threads, sim::decode_memory_bytes(profile),
        [](void* board, std::uint32_t q) { static_cast<Board::Impl*>(board)->raise_if_unmasked(1u << q); }, this,
        halted, driver_version,
        CodecUnit::Clock{timing, &unit_free[static_cast<std::uint32_t>(Unit::kVideo)],
                         [](const void* board) { return static_cast<const Board::Impl*>(board)->board_time_ns(); }});
    codec_ptr.store(codec.get());
  });
  return codec.get();
}

void Board::Impl::raise_if_unmasked(std::uint32_t bits) noexcept {
  // The fence store before this (seq_cst) and this mask load pair with the
  // driver's mask store and fence re-check: one of the two sees the other.
  if (int_mask.load(std::memory_order_seq_cst) & bits) raise(bits);
}

void Board::Impl::signal_vectors(std::uint32_t bits) noexcept {
  if (lost.load(std::memory_order_relaxed)) return;  // a lost board interrupts no one
  const auto nq = static_cast<std::uint32_t>(queues.size());
  for (std::uint32_t q = 0; q < nq && bits; ++q)
    if (bits & (1u << q)) base::eventfd_signal(vectors[q].get());
  if (bits & fw::kDeviceVectorBit) base::eventfd_signal(vectors[nq].get());
}

std::uint32_t Board::Impl::read(std::uint32_t off) noexcept {
  using namespace fw::reg;
  if (off >= kQueueBase) {
    const std::uint32_t q = (off - kQueueBase) / kQueueStride;
    if (q < queues.size()) return read_queue_reg(q, (off - kQueueBase) % kQueueStride);
    bad_mmio.fetch_add(1);
    return 0xFFFFFFFF;
  }
  if (off >= kBoardName && off < kBoardName + kBoardNameBytes) {
    std::uint32_t v;
    std::memcpy(&v, board_name.data() + (off - kBoardName), 4);
    return v;
  }
  if (off >= kMemRegionBase && off < kMemRegionBase + fw::kMaxMemRegions * kMemRegionStride) {
    const std::uint32_t i = (off - kMemRegionBase) / kMemRegionStride;
    const std::uint32_t r = (off - kMemRegionBase) % kMemRegionStride;
    if (i >= profile.regions.size()) return 0;
    const auto& region = profile.regions[i];
    if (r < region::kBaseLo) {
      char name[16] = {};
      std::memcpy(name, region.name.data(), std::min<std::size_t>(region.name.size(), 15));
      std::uint32_t v;
      std::memcpy(&v, name + r, 4);
      return v;
    }
    switch (r) {
      case region::kBaseLo: return lo(region.base);
      case region::kBaseHi: return hi(region.base);
      case region::kSizeLo: return lo(region.size);
      case region::kSizeHi: return hi(region.size);
      case region::kFlags:
        return (region.host_visible ? fw::kRegionHostVisible : 0) | (region.is_default ? fw::kRegionDefault : 0) |
               (region.reserved ? fw::kRegionReserved : 0);
      default: return 0;
    }
  }
  switch (off) {
    case kIdMagic: return fw::kIdMagic;
    case kIfaceVersion: return fw::kInterfaceVersion.packed();
    case kDriverVersion: return driver_version.load();
    case kVendorDevice: return std::uint32_t{profile.pci_vendor} << 16 | profile.pci_device;
    case kBoardId: return profile.board_id;
    case kBoardRevision: return profile.revision;
    case kSerialLo: return lo(profile.serial);
    case kSerialHi: return hi(profile.serial);
    case kCaps:
      return fw::kCapCopySg | fw::kCapFill | fw::kCapWaitValue | fw::kCapTimestamp |
             (profile.tensor_cores ? fw::kCapTensor : 0) | (video_channels() ? fw::kCapVideoDecode : 0) |
             (profile.aperture_bytes ? fw::kCapHostAperture : 0) | (profile.bus == "soc" ? fw::kCapUnifiedMemory : 0) |
             fw::kCapTelemetry | (timing ? fw::kCapModelledTime : 0) | (profile.timing ? fw::kCapTimingModel : 0);
    case kFirmwareVersion: return profile.firmware_version;
    case kDramSizeLo: return lo(profile.dram_bytes);
    case kDramSizeHi: return hi(profile.dram_bytes);
    case kApertureLo: return lo(profile.aperture_bytes);
    case kApertureHi: return hi(profile.aperture_bytes);
    case kNumQueues: return static_cast<std::uint32_t>(queues.size());
    case kNumVectors: return static_cast<std::uint32_t>(vectors.size());
    case kControl: return control.load();
    case kStatus: return status.load();
    case kFatalCode: return fatal_code.load();
    case kScratch: return scratch.load();
    case kTimeLo: {
      const auto t = board_time_ns();
      time_hi_latch.store(hi(t));
      return lo(t);
    }
    case kTimeHi: return time_hi_latch.load();
    case kMaxRingEntries: return profile.max_ring_entries;
    case kNumMemRegions: return static_cast<std::uint32_t>(profile.regions.size());
    case kIntStatus: return int_status.load(std::memory_order_seq_cst);
    case kIntMask: return int_mask.load(std::memory_order_seq_cst);
    case kFp32Gflops: return gops(profile.fp32_tflops);
    case kTensorCores: return profile.tensor_cores;
    case kInt8Gops: return gops(profile.int8_tops);
    case kFp16Gflops: return gops(profile.fp16_tflops);
    case kDecodeChannels: return av ? profile.decode_channels : 0;
    case kVideoCodecs: {
      std::uint32_t bits = 0;
      for (const auto& c : profile.codecs)
        bits |= c == "h264"   ? 1u << static_cast<int>(fw::VideoCodec::kH264)
                : c == "h265" ? 1u << static_cast<int>(fw::VideoCodec::kH265)
                : c == "jpeg" ? 1u << static_cast<int>(fw::VideoCodec::kJpeg)
                              : 0u;
      return av ? bits : 0;
    }
    case kMboxStatus: {
      std::lock_guard lock(mbox_mu);
      return mbox_status;
    }
    case kMboxSeq: {
      std::lock_guard lock(mbox_mu);
      return mbox_seq;
    }
    case kMboxArg0Lo:
    case kMboxArg0Hi:
    case kMboxArg1Lo:
    case kMboxArg1Hi: {
      std::lock_guard lock(mbox_mu);
      return mbox_args[(off - kMboxArg0Lo) / 4];
    }
    case kMboxRes0Lo:
    case kMboxRes0Hi:
    case kMboxRes1Lo:
    case kMboxRes1Hi: {
      std::lock_guard lock(mbox_mu);
      return mbox_results[(off - kMboxRes0Lo) / 4];
    }
    default: return 0;
  }
}

void Board::Impl::write(std::uint32_t off, std::uint32_t value) noexcept {
  using namespace fw::reg;
  if (off >= kQueueBase) {
    const std::uint32_t q = (off - kQueueBase) / kQueueStride;
    if (q < queues.size())
      write_queue_reg(q, (off - kQueueBase) % kQueueStride, value);
    else
      bad_mmio.fetch_add(1);
    return;
  }
  switch (off) {
    case kDriverVersion: {
      driver_version.store(value);
      auto accepted = fw::accept_driver_version(fw::kInterfaceVersion, value);
      std::uint32_t s = status.load() & ~(fw::kStatusVersionOk | fw::kStatusVersionRejected);
      status.store(s | (accepted ? fw::kStatusVersionOk : fw::kStatusVersionRejected));
      return;
    }
    case kControl:
      if (value & fw::kControlReset) {
        reset_board();
        value &= ~fw::kControlReset;
      }
      control.store(value & fw::kControlEnable);
      return;
    case kScratch: scratch.store(value); return;
    case kVideoDoorbell:
      if (CodecUnit* unit = codec_ptr.load()) unit->doorbell(value);
      return;
    case kIntMask: {
      const std::uint32_t old = int_mask.exchange(value, std::memory_order_seq_cst);
      // Level semantics: unmasking a pending vector fires it now.
      signal_vectors(int_status.load(std::memory_order_seq_cst) & value & ~old);
      return;
    }
    case kIntAck: int_status.fetch_and(~value, std::memory_order_seq_cst); return;
    case kMboxArg0Lo:
    case kMboxArg0Hi:
    case kMboxArg1Lo:
    case kMboxArg1Hi: {
      std::lock_guard lock(mbox_mu);
      mbox_args[(off - kMboxArg0Lo) / 4] = value;
      return;
    }
    case kMboxCmd: run_mailbox(value); return;
    default: bad_mmio.fetch_add(1); return;
  }
}

std::uint32_t Board::Impl::read_queue_reg(std::uint32_t qi, std::uint32_t r) const noexcept {
  using namespace fw::reg::queue;
  const QueueState& q = *queues[qi];
  switch (r) {
    case kEngine: return static_cast<std::uint32_t>(q.engine);
    case kControl: return q.control.load();
    case kStatus: return q.status.load(std::memory_order_seq_cst);
    case kRingSize: return q.ring_size.load();
    case kRingBaseLo: return q.ring_base_lo.load();
    case kRingBaseHi: return q.ring_base_hi.load();
    case kFenceLo: return q.fence_lo.load();
    case kFenceHi: return q.fence_hi.load();
    case kHead: return q.head.load(std::memory_order_acquire);
    case kTail: return q.tail->load(std::memory_order_relaxed);
    case kError: return q.error.load();
    case kProgress: return q.progress.load(std::memory_order_relaxed);
    case kBusyNsLo: return lo(q.busy_ns.load(std::memory_order_relaxed));
    case kBusyNsHi: return hi(q.busy_ns.load(std::memory_order_relaxed));
    case kRetiredLo: return lo(q.retired.load(std::memory_order_relaxed));
    case kRetiredHi: return hi(q.retired.load(std::memory_order_relaxed));
    default: return 0;
  }
}

void Board::Impl::write_queue_reg(std::uint32_t qi, std::uint32_t r, std::uint32_t value) {
  using namespace fw::reg::queue;
  QueueState& q = *queues[qi];
  switch (r) {
    case kTail:
      // The doorbell: publish, then wake the command processor if it sleeps.
      // With a shadow doorbell the host stores TAIL there itself, and the
      // register write only wakes the processor (BoardOptions::doorbells).
      if (!q.sleeping) q.tail->store(value, std::memory_order_seq_cst);
      q.doorbell.notify();
      return;
    case kControl:
      if (value & fw::kQueueControlReset) {
        reset_queue(qi);
        return;
      }
      if ((value & fw::kQueueControlEnable) && !(q.control.load() & fw::kQueueControlEnable)) enable_queue(qi);
      return;
    case kRingSize: q.ring_size.store(value); return;
    case kRingBaseLo: q.ring_base_lo.store(value); return;
    case kRingBaseHi: q.ring_base_hi.store(value); return;
    case kFenceLo: q.fence_lo.store(value); return;
    case kFenceHi: q.fence_hi.store(value); return;
    default: bad_mmio.fetch_add(1); return;
  }
}

void Board::Impl::enable_queue(std::uint32_t qi) {
  std::lock_guard lock(control_mu);
  QueueState& q = *queues[qi];
  if (q.cp) return;
  const std::uint64_t ring_base = join(q.ring_base_lo.load(), q.ring_base_hi.load());
  const std::uint32_t entries = q.ring_size.load();
  const std::uint64_t status_page = join(q.fence_lo.load(), q.fence_hi.load());
  auto reject = [&](const char* why, std::uint64_t v) {
    base::logger("sim")->debug("queue {}: enable rejected: {} ({:#x})", qi, why, v);
    q.error.store(static_cast<std::uint32_t>(fw::CmdStatus::kRingConfig));
    q.status.store(fw::kQueueStatusFaulted);
  };
  if (!(status.load() & fw::kStatusVersionOk)) return reject("no interface version agreed", 0);
  if (halted.load()) return reject("the firmware has stopped", fatal_code.load());
  if (entries < fw::kMinRingEntries || entries > profile.max_ring_entries || (entries & (entries - 1)))
    return reject("ring size", entries);
  const std::uint64_t ring_bytes = std::uint64_t{entries} * sizeof(fw::CommandDescriptor);
  if (ring_base % 64 || ring_base > profile.dram_bytes || ring_bytes > profile.dram_bytes - ring_base)
    return reject("ring base", ring_base);
  if (status_page % 64 || !fw::is_host_address(status_page)) return reject("status page", status_page);
  q.error.store(0);
  q.head.store(0);
  q.tail->store(0);
  q.status.store(fw::kQueueStatusEnabled);
  q.control.store(fw::kQueueControlEnable);
  if (!q.thread) q.thread = std::make_unique<QueueThread>();
  q.cp = std::make_unique<CommandProcessor>(*this, qi, q, *q.thread,
                                            CommandProcessor::Config{ring_base, entries, status_page});
}

void Board::Impl::reset_queue(std::uint32_t qi) {
  std::lock_guard lock(control_mu);
  QueueState& q = *queues[qi];
  q.cp.reset();  // stops at the next command boundary; its thread sleeps
  if (CodecUnit* unit = codec_ptr.load(); unit && q.engine == fw::EngineType::kVideo) unit->close_queue(qi);
  q.control.store(0);
  q.status.store(0);
  q.error.store(0);
  q.head.store(0);
  q.tail->store(0);
  int_status.fetch_and(~(1u << qi));
}

void Board::Impl::reset_board() {
  resets.fetch_add(1, std::memory_order_relaxed);
  for (std::uint32_t q = 0; q < queues.size(); ++q) {
    reset_queue(q);
    std::lock_guard lock(control_mu);
    queues[q]->ring_size.store(0);
    queues[q]->ring_base_lo.store(0);
    queues[q]->ring_base_hi.store(0);
    queues[q]->fence_lo.store(0);
    queues[q]->fence_hi.store(0);
  }
  // Every command processor has stopped: the board comes back clean.
  clear_faults();
  lost.store(false);
  halted.store(false);
  int_mask.store(0);
  int_status.store(0);
  fatal_code.store(0);
  driver_version.store(0);
  {
    std::lock_guard lock(mbox_mu);
    mbox_status = static_cast<std::uint32_t>(fw::MboxStatus::kIdle);
  }
  reset_model();
  reset_time_ns.store(base::monotonic_ns());
  status.store(fw::kStatusReady);
}

void Board::Impl::reset_model() noexcept {
  for (auto& q : queues) q->model_ns.store(0, std::memory_order_relaxed);
  for (auto& u : unit_free) u.store(0, std::memory_order_relaxed);
  std::lock_guard lock(signal_mu);
  signals.clear();
}

std::uint64_t Board::Impl::model_frontier_ns() const noexcept {
  std::uint64_t t = 0;
  for (const auto& q : queues) t = std::max(t, q->model_ns.load(std::memory_order_relaxed));
  for (const auto& u : unit_free) t = std::max(t, u.load(std::memory_order_relaxed));
  return t;
}

void Board::Impl::signalled(std::uint64_t address, std::uint64_t model_ns) {
  std::lock_guard lock(signal_mu);
  if (signals.size() >= kMaxSignals && !signals.count(address)) signals.clear();
  signals[address] = model_ns;
}

std::optional<std::uint64_t> Board::Impl::signal_time(std::uint64_t address) {
  std::lock_guard lock(signal_mu);
  if (auto it = signals.find(address); it != signals.end()) return it->second;
  return std::nullopt;
}

void Board::Impl::run_mailbox(std::uint32_t cmd) {
  std::lock_guard lock(mbox_mu);
  const std::uint64_t arg0 = join(mbox_args[0], mbox_args[1]);
  std::uint64_t res0 = 0, res1 = 0;
  bool ok = true;
  switch (static_cast<fw::MboxCmd>(cmd)) {
    case fw::MboxCmd::kPing: res0 = ~arg0; break;
    case fw::MboxCmd::kGetUptime: res0 = board_time_ns(); break;
    case fw::MboxCmd::kGetBuildId: res0 = kFirmwareBuildId; break;
    case fw::MboxCmd::kQueueStats:
      if (arg0 < queues.size()) {
        res0 = queues[arg0]->busy_ns.load(std::memory_order_relaxed);
        res1 = queues[arg0]->retired.load(std::memory_order_relaxed);
      } else {
        ok = false;
        res0 = static_cast<std::uint64_t>(fw::CmdStatus::kBadArgument);
      }
      break;
    case fw::MboxCmd::kTelemetry: {
      const std::uint64_t arg1 = join(mbox_args[2], mbox_args[3]);
      const fw::Problem p = write_telemetry(arg0, arg1, res0, res1);
      if (p.status != fw::CmdStatus::kOk) {
        ok = false;
        res0 = static_cast<std::uint64_t>(p.status);
      }
      break;
    }
    case fw::MboxCmd::kTimingModel: {
      const std::uint64_t arg1 = join(mbox_args[2], mbox_args[3]);
      fw::Problem p{fw::CmdStatus::kInvalidOpcode, fw::Problem::kNoField, 0, 0};  // a board with no model
      if (profile.timing && arg1 < sizeof(fw::TimingModel)) {
        p = {fw::CmdStatus::kBadArgument, 1, arg1, sizeof(fw::TimingModel)};
      } else if (profile.timing) {
        DmaContext ctx(iommu);
        p = dma.write(ctx, arg0, &*profile.timing, sizeof(fw::TimingModel), 0);
      }
      ok = p.status == fw::CmdStatus::kOk;
      res0 = ok ? sizeof(fw::TimingModel) : static_cast<std::uint64_t>(p.status);
      break;
    }
    default:
      ok = false;
      res0 = static_cast<std::uint64_t>(fw::CmdStatus::kInvalidOpcode);
      break;
  }
  mbox_results = {lo(res0), hi(res0), lo(res1), hi(res1)};
  mbox_status = static_cast<std::uint32_t>(ok ? fw::MboxStatus::kDone : fw::MboxStatus::kError);
  ++mbox_seq;
  raise(fw::kDeviceVectorBit);
}

// ---- Telemetry -------------------------------------------------------------

void Board::Impl::engine_begin(fw::EngineType e, std::uint64_t now) noexcept {
  EngineBusy& b = engine_busy[static_cast<std::uint32_t>(e) & 3];
  std::lock_guard lock(b.mu);
  if (b.active++ == 0) b.since = now;
}

void Board::Impl::engine_end(fw::EngineType e, std::uint64_t now) noexcept {
  EngineBusy& b = engine_busy[static_cast<std::uint32_t>(e) & 3];
  std::lock_guard lock(b.mu);
  if (b.active && --b.active == 0) b.busy += now - std::min(now, b.since);
}

std::uint64_t Board::Impl::engine_busy_ns(fw::EngineType e, std::uint64_t now) noexcept {
  EngineBusy& b = engine_busy[static_cast<std::uint32_t>(e) & 3];
  std::lock_guard lock(b.mu);
  return b.busy + (b.active ? now - std::min(now, b.since) : 0);
}

void Board::Impl::count_dma(std::uint64_t src, std::uint64_t dst, std::uint64_t bytes, bool fill) noexcept {
  // A fill has no source: it writes from the board.
  const fw::DmaDirection d = fw::dma_direction(fill ? 0 : src, dst);
  dma_bytes[static_cast<std::uint32_t>(d)].fetch_add(bytes, std::memory_order_relaxed);
}

std::uint64_t Board::Impl::telemetry_total_bytes() const noexcept {
  return fw::telemetry_bytes(static_cast<std::uint32_t>(queues.size()), video_channels());
}

fw::Problem Board::Impl::write_telemetry(std::uint64_t addr, std::uint64_t capacity, std::uint64_t& written,
                                         std::uint64_t& total) {
  total = telemetry_total_bytes();
  written = 0;
  if (capacity < sizeof(fw::TelemetryHeader)) return {fw::CmdStatus::kBadArgument, 1, capacity, total};
  if (addr % 8) return {fw::CmdStatus::kBadAlignment, 0, addr, 8};
  const std::vector<std::byte> block = telemetry_block(capacity);
  DmaContext ctx(iommu);
  const fw::Problem p = dma.write(ctx, addr, block.data(), block.size(), 0);
  if (p.status == fw::CmdStatus::kOk) written = block.size();
  return p;
}

std::vector<std::byte> Board::Impl::telemetry_block(std::uint64_t capacity) {
  CodecUnit* unit = codec_ptr.load(std::memory_order_acquire);
  const auto nq = static_cast<std::uint32_t>(queues.size());
  const std::uint32_t nc = video_channels();
  const std::uint64_t now = base::monotonic_ns();
  fw::TelemetryHeader h{};
  h.magic = fw::kTelemetryMagic;
  h.version = fw::kTelemetryVersion;
  h.header_bytes = sizeof(fw::TelemetryHeader);
  h.queue_bytes = sizeof(fw::TelemetryQueue);
  h.channel_bytes = sizeof(fw::TelemetryChannel);
  // As many entries as fit, queues first.
  const std::uint64_t room = capacity - sizeof h;
  h.num_queues = static_cast<std::uint32_t>(std::min<std::uint64_t>(nq, room / sizeof(fw::TelemetryQueue)));
  h.num_channels = static_cast<std::uint32_t>(std::min<std::uint64_t>(
      nc, (room - std::uint64_t{h.num_queues} * sizeof(fw::TelemetryQueue)) / sizeof(fw::TelemetryChannel)));
  h.total_bytes = static_cast<std::uint32_t>(fw::telemetry_bytes(h.num_queues, h.num_channels));
  h.board_time_ns = now - reset_time_ns.load(std::memory_order_relaxed);
  h.uptime_ns = now - power_on_ns;
  h.resets = resets.load(std::memory_order_relaxed);
  std::uint64_t busy[4] = {};
  for (std::uint32_t e = 1; e < 4; ++e)
    h.engine_busy_ns[e] = busy[e] = engine_busy_ns(static_cast<fw::EngineType>(e), now);
  for (std::uint32_t d = 0; d < 4; ++d) h.dma_bytes[d] = dma_bytes[d].load(std::memory_order_relaxed);
  for (std::uint32_t k = 0; k < fw::kTelemetryFaultKinds; ++k)
    h.faults[k] = failed_by_status[k].load(std::memory_order_relaxed);
  h.firmware_crashes = firmware_crashes.load(std::memory_order_relaxed);

  thermal.advance(now, busy);
  h.temperature_mc = static_cast<std::int32_t>(std::lround(thermal.temperature_c() * 1000));
  h.power_mw = static_cast<std::uint32_t>(std::lround(thermal.power_w() * 1000));
  h.energy_uj = static_cast<std::uint64_t>(thermal.energy_j() * 1e6);
  h.clock_mhz = profile.clock_mhz;
  h.power_limit_mw = static_cast<std::uint32_t>(std::lround(profile.peak_power_w * 1000));

  std::vector<std::byte> block(h.total_bytes);
  std::memcpy(block.data(), &h, sizeof h);
  std::byte* at = block.data() + sizeof h;
  for (std::uint32_t q = 0; q < h.num_queues; ++q, at += sizeof(fw::TelemetryQueue)) {
    const QueueState& qs = *queues[q];
    fw::TelemetryQueue t{};
    t.engine = static_cast<std::uint32_t>(qs.engine);
    t.index = q;
    t.commands = qs.retired.load(std::memory_order_relaxed);
    t.busy_ns = qs.busy_ns.load(std::memory_order_relaxed);
    t.failures = qs.failures.load(std::memory_order_relaxed);
    std::memcpy(at, &t, sizeof t);
  }
  for (std::uint32_t c = 0; c < h.num_channels; ++c, at += sizeof(fw::TelemetryChannel)) {
    fw::TelemetryChannel t{};
    if (unit && c < unit->channels()) unit->telemetry(c, t);
    std::memcpy(at, &t, sizeof t);
  }
  return block;
}

// ---- Board -----------------------------------------------------------------

Board::Board(BoardProfile profile, BoardOptions options) : impl_(std::make_unique<Impl>(std::move(profile), options)) {}

int Board::dram_fd() const noexcept { return impl_->dram.fd(); }

std::vector<std::byte> Board::telemetry() {
  std::lock_guard lock(impl_->mbox_mu);
  return impl_->telemetry_block(impl_->telemetry_total_bytes());
}

std::uint32_t Board::queues_enabled() const noexcept {
  std::uint32_t n = 0;
  for (auto& q : impl_->queues) n += (q->control.load(std::memory_order_relaxed) & fw::kQueueControlEnable) ? 1 : 0;
  return n;
}

std::uint64_t Board::dram_resident_bytes(std::uint64_t address, std::uint64_t size) const noexcept {
  const auto page = base::page_size();
  const std::uint64_t end = std::min<std::uint64_t>(address + size, impl_->dram.size());
  if (address >= end) return 0;
  if (const int fd = impl_->dram.fd(); fd >= 0) {
    // Shared DRAM is a sparse memfd: walk its data extents, which costs
    // per extent, not per page of a range that may be gigabytes.
    std::uint64_t resident = 0;
    off_t at = static_cast<off_t>(address);
    while (static_cast<std::uint64_t>(at) < end) {
      const off_t data = ::lseek(fd, at, SEEK_DATA);
      if (data < 0 || static_cast<std::uint64_t>(data) >= end) break;  // ENXIO: no data after `at`
      off_t hole = ::lseek(fd, data, SEEK_HOLE);
      if (hole < 0) hole = static_cast<off_t>(end);
      resident += std::min<std::uint64_t>(static_cast<std::uint64_t>(hole), end) - static_cast<std::uint64_t>(data);
      at = hole;
    }
    return resident;
  }
  // Anonymous DRAM: count the pages mincore() reports present.
  const std::uint64_t first_page = address / page, last_page = (end + page - 1) / page;
  std::vector<unsigned char> present(std::min<std::uint64_t>(last_page - first_page, 1u << 20));
  std::uint64_t resident = 0;
  for (std::uint64_t p = first_page; p < last_page; p += present.size()) {
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(present.size(), last_page - p));
    if (::mincore(impl_->dram.data() + p * page, n * page, present.data()) != 0) return 0;
    for (std::size_t i = 0; i < n; ++i) resident += (present[i] & 1) ? page : 0;
  }
  return resident;
}

std::uint64_t Board::dram_resident_bytes() const noexcept {
  if (impl_->dram.fd() >= 0) {
    struct stat st {};
    if (::fstat(impl_->dram.fd(), &st) != 0) return 0;
    return static_cast<std::uint64_t>(st.st_blocks) * 512;
  }
  return dram_resident_bytes(0, impl_->dram.size());
}

std::uint64_t Board::prefault_limit() noexcept {
  static const std::uint64_t limit = [] {
    const char* env = std::getenv("TPUHAL_SIM_PREFAULT_MAX");
    constexpr std::uint64_t kDefault = std::uint64_t{256} << 20;
    if (!env || !*env) return kDefault;
    char* end = nullptr;
    const unsigned long long v = std::strtoull(env, &end, 10);
    return end && *end == '\0' ? static_cast<std::uint64_t>(v) : kDefault;
  }();
  return limit;
}

void Board::prefault(std::uint64_t address, std::uint64_t size) noexcept {
  const std::uint64_t page = base::page_size(), dram = impl_->dram.size();
  if (size == 0 || size > prefault_limit() || address >= dram) return;
  const std::uint64_t first = address / page * page;
  const std::uint64_t last = std::min(dram, (address + size + page - 1) / page * page);
  ::madvise(impl_->dram.data() + first, last - first, MADV_POPULATE_WRITE);  // EINVAL before Linux 5.14: lazy
}

Board::~Board() = default;

const BoardProfile& Board::profile() const noexcept { return impl_->profile; }

std::string Board::tensor_isa() const {
  if (impl_->profile.tensor_cores == 0) return {};
  return std::string(tensor::isa_name(impl_->tensor_isa));
}

std::string Board::video_unavailable() {
  std::string why;
  if (base::ffmpeg::load(base::ffmpeg::Part::kDecode, &why)) return {};
  static std::once_flag warned;  // once per process, not per board
  std::call_once(warned, [&] { base::logger("video")->warn("simulated boards have no video decoder: {}", why); });
  return why;
}

std::string Board::tensor_isa_of(const BoardProfile& profile) {
  if (profile.tensor_cores == 0) return {};
  try {
    return std::string(tensor::isa_name(tensor::isa_from_env()));
  } catch (const std::invalid_argument& e) {
    throw ProfileError(e.what());
  }
}

std::uint32_t Board::mmio_read32(std::uint32_t offset) noexcept {
  if (impl_->lost.load(std::memory_order_relaxed)) return 0xFFFFFFFF;  // nothing answers
  if (offset % 4 || offset >= fw::kBar0Size) {
    impl_->bad_mmio.fetch_add(1);
    return 0xFFFFFFFF;
  }
  return impl_->read(offset);
}

void Board::mmio_write32(std::uint32_t offset, std::uint32_t value) noexcept {
  // A lost board drops every write but a board reset, which stands for the
  // host's link reset that brings a card back.
  if (impl_->lost.load(std::memory_order_relaxed) && !(offset == fw::reg::kControl && (value & fw::kControlReset)))
    return;
  if (offset % 4 || offset >= fw::kBar0Size) {
    impl_->bad_mmio.fetch_add(1);
    return;
  }
  impl_->write(offset, value);
}

std::span<std::byte> Board::aperture() noexcept { return {impl_->dram.data(), impl_->profile.aperture_bytes}; }

IommuDomain& Board::iommu() noexcept { return impl_->iommu; }

std::uint32_t Board::interrupt_vectors() const noexcept { return static_cast<std::uint32_t>(impl_->vectors.size()); }

int Board::interrupt_fd(std::uint32_t vector) const noexcept {
  return vector < impl_->vectors.size() ? impl_->vectors[vector].get() : -1;
}

std::uint64_t Board::bad_mmio_accesses() const noexcept { return impl_->bad_mmio.load(); }

void Board::inject(const Fault& fault) { impl_->inject(fault); }

void Board::clear_faults() noexcept { impl_->clear_faults(); }

void Board::set_command_observer(CommandObserver* observer) noexcept {
  impl_->observer.store(observer, std::memory_order_release);
}

std::uint64_t Board::time_ns() const noexcept { return impl_->board_time_ns(); }

}  // namespace tpuhal::sim
