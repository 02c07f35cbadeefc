// TPU driver: bring-up, memory, queue pool and interrupts.
#include <spdlog/spdlog.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstring>
#include <thread>

#include "device_impl.h"
#include "tpuhal/base/hex.h"
#include "tpuhal/fw/telemetry.h"
#include "tpuhal/fw/timing.h"
#include "tpuhal/tpu/telemetry.h"
#include "tpuhal/fw/video.h"
#include "encode.h"
#include "tpuhal/base/log.h"
#include "tpuhal/base/units.h"
#include "tpuhal/base/wait.h"
#include "tpuhal/fw/version.h"

namespace tpuhal::tpu {
namespace {

using namespace std::chrono_literals;
using base::format_bytes;

constexpr std::uint64_t kDeviceAlignment = 256;
constexpr std::uint32_t kDefaultRingEntries = 4096;
constexpr fw::Version kDriverMin{1, 0};  // 1.0 boards work without tensor ops
constexpr fw::Version kDriverMax = fw::kInterfaceVersion;

std::string read_string(Transport& t, std::uint32_t offset, std::uint32_t bytes) {
  std::string s(bytes, '\0');
  for (std::uint32_t i = 0; i < bytes; i += 4) {
    const std::uint32_t v = t.read32(offset + i);
    std::memcpy(s.data() + i, &v, 4);
  }
  s.resize(std::strlen(s.c_str()));
  for (char& c : s)
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) > 0x7e) c = '?';
  return s;
}

// Device memory in one heap.
class DeviceBuffer final : public driver::BufferBackend {
 public:
  DeviceBuffer(std::shared_ptr<TpuDevice> dev, std::size_t heap, std::string heap_name, Memory memory,
               std::uint64_t address, std::uint64_t size)
      : dev_(std::move(dev)),
        heap_(heap),
        heap_name_(std::move(heap_name)),
        memory_(memory),
        address_(address),
        size_(size) {}
  ~DeviceBuffer() override { dev_->free_device(heap_, address_); }

  std::uint64_t size() const override { return size_; }
  Memory memory() const override { return memory_; }
  const std::string& heap() const override { return heap_name_; }
  std::uint64_t device_address() const override { return address_; }
  std::span<std::byte> map() override {
    auto ap = dev_->aperture();
    const bool mappable = memory_ == Memory::DeviceHostVisible || dev_->properties().caps.map_device_memory;
    if (!dev_->transport().aperture_coherent())
      throw Error(Status::Unsupported, dev_->uri() + ": device memory is not host-mappable over " +
                                           dev_->transport().bus() +
                                           " (the bus has no memory window); copy through a Memory::HostPinned buffer");
    if (!mappable || address_ + size_ > ap.size())
      throw Error(Status::Unsupported, dev_->uri() + ": device memory in heap '" + heap_name_ +
                                           "' is not host-mappable on this board (caps.map_device_memory is false); "
                                           "allocate Memory::DeviceHostVisible (" +
                                           format_bytes(dev_->properties().host_visible_bytes) +
                                           " window) or copy through a Memory::HostPinned buffer");
    return ap.subspan(address_, size_);
  }

 private:
  std::shared_ptr<TpuDevice> dev_;
  std::size_t heap_;
  std::string heap_name_;
  Memory memory_;
  std::uint64_t address_, size_;
};

// Host memory mapped for the board's DMA: owned (pinned allocation) or the
// caller's (import).
class HostBuffer final : public driver::BufferBackend {
 public:
  HostBuffer(std::shared_ptr<TpuDevice> dev, base::Mapping mapping, std::byte* data, std::uint64_t size,
             std::uint64_t mapped_size, bool imported)
      : dev_(std::move(dev)),
        mapping_(std::move(mapping)),
        data_(data),
        size_(size),
        mapped_size_(mapped_size),
        imported_(imported) {
    iova_ = dev_->map_host(data_, mapped_size_, imported_, imported_ ? nullptr : &mapping_);
  }
  ~HostBuffer() override { dev_->unmap_host(iova_, mapped_size_, imported_); }

  std::uint64_t size() const override { return size_; }
  Memory memory() const override { return Memory::HostPinned; }
  const std::string& heap() const override {
    static const std::string kNone;
    return kNone;
  }
  std::uint64_t device_address() const override { return iova_; }
  std::span<std::byte> map() override { return {data_, size_}; }

 private:
  std::shared_ptr<TpuDevice> dev_;
  base::Mapping mapping_;  // empty when imported
  std::byte* data_;
  std::uint64_t size_, mapped_size_;
  bool imported_;
  std::uint64_t iova_ = 0;
};

}  // namespace

std::string interface_protocol() {
  return "firmware interface " + std::to_string(kDriverMax.major) + "." + std::to_string(kDriverMax.minor);
}

std::shared_ptr<driver::DeviceBackend> open_device(std::unique_ptr<Transport> transport, std::string uri,
                                                   std::string driver_name) {
  auto dev = std::make_shared<TpuDevice>(std::move(transport), std::move(uri), std::move(driver_name));
  dev->bring_up();
  return dev;
}

TpuDevice::TpuDevice(std::unique_ptr<Transport> transport, std::string uri, std::string driver_name)
    : log(base::logger("tpu")),
      transport_(std::move(transport)),
      iova_(fw::kHostWindowBase, fw::kHostWindowEnd - fw::kHostWindowBase, base::page_size()) {
  props_.uri = std::move(uri);
  props_.driver = std::move(driver_name);
}

void TpuDevice::bring_up() {
  start_board();
  read_properties();
  setup_status_pages();
  start_interrupt_thread();
  log->info("{}: {} on {}, {} DRAM, {} queues, interface {}", props_.uri, props_.board, props_.bus,
            format_bytes(props_.memory_bytes), hw_queues_.size(), props_.interface_version);
}

void TpuDevice::start_board() {
  Transport& t = *transport_;
  const std::string& uri = props_.uri;
  const std::uint32_t magic = t.read32(fw::reg::kIdMagic);
  if (magic == 0xFFFFFFFF)
    throw Error(Status::DeviceLost, uri + ": the board does not answer (register reads return all ones)");
  if (magic != fw::kIdMagic)
    throw Error(Status::NotFound, uri + ": not a tpuhal board (identity register reads " + hex(magic) + ", expected " +
                                      hex(fw::kIdMagic) + ")");

  // Interface version: pick what both sides speak, tell the board, check
  // that it agrees.
  const auto board_version = fw::Version::unpack(t.read32(fw::reg::kIfaceVersion));
  auto agreed = fw::negotiate(board_version, kDriverMin, kDriverMax);
  if (!agreed)
    throw Error(Status::VersionMismatch, uri + ": the board speaks interface " + std::to_string(board_version.major) +
                                             "." + std::to_string(board_version.minor) + ", this driver " +
                                             std::to_string(kDriverMin.major) + "." + std::to_string(kDriverMin.minor) +
                                             " to " + std::to_string(kDriverMax.major) + "." +
                                             std::to_string(kDriverMax.minor));
  t.write32(fw::reg::kDriverVersion, agreed->packed());
  const auto deadline = std::chrono::steady_clock::now() + 1s;
  for (;;) {
    const std::uint32_t status = t.read32(fw::reg::kStatus);
    if (status & fw::kStatusVersionOk) break;
    if ((status & fw::kStatusVersionRejected) || std::chrono::steady_clock::now() > deadline)
      throw Error(Status::VersionMismatch, uri + ": the board rejected interface version " +
                                               std::to_string(agreed->major) + "." + std::to_string(agreed->minor) +
                                               " (status " + hex(status) + ")");
    std::this_thread::sleep_for(100us);
  }
  props_.interface_version = std::to_string(agreed->major) + "." + std::to_string(agreed->minor);
  agreed_minor_ = agreed->minor;
  t.write32(fw::reg::kControl, fw::kControlEnable);
}

// ---- Faults and reset (docs/faults.md) ---------------------------------------

TpuDevice::Health TpuDevice::check_health() noexcept {
  Health h = health();
  if (h != Health::kOk) return h;
  Transport& t = *transport_;
  const std::uint32_t status = t.read32(fw::reg::kStatus);
  if (status == 0xFFFFFFFF && t.read32(fw::reg::kIdMagic) == 0xFFFFFFFF) {
    h = Health::kLost;
  } else if (status & fw::kStatusFatal) {
    fatal_code_.store(t.read32(fw::reg::kFatalCode));
    h = Health::kFatal;
  } else {
    return h;
  }
  if (health_.exchange(h) == Health::kOk) {
    log->error("{}", health_error(uri()).what());
    for (auto& hq : hw_queues_) hq->irq.notify();
  }
  return h;
}

Error TpuDevice::health_error(const std::string& who) const {
  const std::string recover = "; reset the device (Device::reset, or `tpuhal reset " + uri() + "`)";
  if (health() == Health::kLost)
    return Error(Status::DeviceLost, who +
                                         ": the board does not answer (its registers read all ones: "
                                         "removed, or its link is down)" +
                                         recover);
  const std::uint32_t code = fatal_code_.load();
  return Error(Status::DeviceLost, who + ": the board stopped: its firmware reports a fatal error (" +
                                       fw::to_string(static_cast<fw::CmdStatus>(code)) + ", code " +
                                       std::to_string(code) + ")" + recover);
}

void TpuDevice::reset() {
  std::lock_guard reset_lock(reset_mu_);
  log->warn("{}: resetting the board", uri());
  {
    // Queues claimed now lose the work they have not completed.
    std::lock_guard lock(queues_mu_);
    for (auto& hq : hw_queues_)
      if (hq->owner) hq->owner->mark_reset();
  }
  Transport& t = *transport_;
  // The board stops every queue before the write returns, clears its
  // queues' registers and interrupt state, and starts afresh.
  t.write32(fw::reg::kControl, fw::kControlReset);
  start_board();
  fatal_code_.store(0);
  health_.store(Health::kOk, std::memory_order_release);
  {
    std::lock_guard lock(irq_mu_);
    t.write32(fw::reg::kIntAck, 0xFFFFFFFF);
    t.write32(fw::reg::kIntMask, irq_mask_);
  }
  for (auto& hq : hw_queues_) hq->irq.notify();
}

void TpuDevice::read_properties() {
  Transport& t = *transport_;
  const std::string& uri = props_.uri;
  caps_ = t.read32(fw::reg::kCaps);
  props_.board = read_string(t, fw::reg::kBoardName, fw::reg::kBoardNameBytes);
  props_.bus = t.bus();
  props_.tensor_isa = t.tensor_isa();
  const std::uint32_t vd = t.read32(fw::reg::kVendorDevice);
  props_.pci_vendor = static_cast<std::uint16_t>(vd >> 16);
  props_.pci_device = static_cast<std::uint16_t>(vd);
  props_.serial = hex(read64(fw::reg::kSerialLo));
  const std::uint32_t fwv = t.read32(fw::reg::kFirmwareVersion);
  props_.firmware_version =
      std::to_string(fwv >> 16) + "." + std::to_string((fwv >> 8) & 0xFF) + "." + std::to_string(fwv & 0xFF);
  props_.memory_bytes = read64(fw::reg::kDramSizeLo);
  const std::uint64_t aperture_bytes = read64(fw::reg::kApertureLo);
  aperture_ = t.aperture();
  if (aperture_.size() < aperture_bytes)
    throw Error(Status::Internal, uri + ": the transport maps " + format_bytes(aperture_.size()) + " of the " +
                                      format_bytes(aperture_bytes) + " aperture");
  aperture_ = aperture_.first(aperture_bytes);
  props_.min_alignment = kDeviceAlignment;
  props_.tensor_cores = t.read32(fw::reg::kTensorCores);
  props_.peak_int8_tops = t.read32(fw::reg::kInt8Gops) / 1000.0;
  props_.peak_fp16_tflops = t.read32(fw::reg::kFp16Gflops) / 1000.0;
  props_.peak_fp32_tflops = t.read32(fw::reg::kFp32Gflops) / 1000.0;
  props_.decode_channels = t.read32(fw::reg::kDecodeChannels);
  props_.caps.map_device_memory = (caps_ & fw::kCapUnifiedMemory) && t.aperture_coherent();
  props_.caps.import_host_memory = t.can_map_any_memory();
  props_.caps.wait_value = caps_ & fw::kCapWaitValue;
  props_.caps.timestamps = caps_ & fw::kCapTimestamp;
  // Tensor ops arrived with interface 1.1.
  props_.caps.tensor = (caps_ & fw::kCapTensor) && agreed_minor_ >= 1;
  if (props_.caps.tensor) props_.dtypes = {DType::F32, DType::F16, DType::BF16, DType::I8, DType::U8, DType::I32};
  props_.caps.video_decode = (caps_ & fw::kCapVideoDecode) && agreed_minor_ >= 2 && props_.decode_channels > 0;
  props_.caps.telemetry = (caps_ & fw::kCapTelemetry) && agreed_minor_ >= 6;
  props_.caps.modelled_time = (caps_ & fw::kCapModelledTime) && agreed_minor_ >= 9;
  props_.caps.wait_time = (caps_ & fw::kCapTimestamp) && agreed_minor_ >= fw::kMinorWaitTime;
  if (props_.caps.video_decode) {
    const std::uint32_t codecs = t.read32(fw::reg::kVideoCodecs);
    if (codecs & 1u << static_cast<int>(fw::VideoCodec::kH264)) props_.codecs.push_back(Codec::H264);
    if (codecs & 1u << static_cast<int>(fw::VideoCodec::kH265)) props_.codecs.push_back(Codec::H265);
    if (codecs & 1u << static_cast<int>(fw::VideoCodec::kJpeg)) props_.codecs.push_back(Codec::Jpeg);
  }
  max_ring_entries_ = t.read32(fw::reg::kMaxRingEntries);

  // Heaps from the board's memory regions.
  const std::uint32_t regions = t.read32(fw::reg::kNumMemRegions);
  if (regions == 0 || regions > fw::kMaxMemRegions)
    throw Error(Status::DeviceLost, uri + ": the board reports " + std::to_string(regions) + " memory regions (1.." +
                                        std::to_string(fw::kMaxMemRegions) + " expected)");
  for (std::uint32_t i = 0; i < regions; ++i) {
    const std::string name = read_string(t, fw::reg::region_reg(i, fw::reg::region::kName), 16);
    const std::uint64_t rbase = read64(fw::reg::region_reg(i, fw::reg::region::kBaseLo));
    const std::uint64_t rsize = read64(fw::reg::region_reg(i, fw::reg::region::kSizeLo));
    const std::uint32_t flags = t.read32(fw::reg::region_reg(i, fw::reg::region::kFlags));
    if (rbase > props_.memory_bytes || rsize > props_.memory_bytes - rbase)
      throw Error(Status::DeviceLost,
                  uri + ": memory region '" + name + "' (" + hex(rbase) + "+" + hex(rsize) + ") lies outside DRAM");
    const bool visible = flags & fw::kRegionHostVisible;
    if (visible && rbase + rsize > aperture_.size())
      throw Error(Status::DeviceLost, uri + ": host-visible region '" + name + "' extends past the aperture");
    if (flags & fw::kRegionReserved) continue;
    const Memory memory = visible ? Memory::DeviceHostVisible : Memory::Device;
    heaps_.push_back(
        Heap{name, memory, (flags & fw::kRegionDefault) != 0, RangeAllocator(rbase, rsize, kDeviceAlignment)});
    props_.heaps.push_back(HeapInfo{name, memory, rbase, rsize, (flags & fw::kRegionDefault) != 0});
    if (visible) props_.host_visible_bytes += rsize;
  }
  // Over a bus without a memory window the host-visible regions still hold
  // the rings and command lists, but users cannot map them.
  props_.caps.host_visible_device_memory = props_.host_visible_bytes > 0 && t.aperture_coherent();
  if (props_.host_visible_bytes == 0)
    throw Error(Status::Unsupported, uri + ": the board has no host-visible memory for command rings");

  // Hardware queues.
  const std::uint32_t nq = t.read32(fw::reg::kNumQueues);
  if (nq == 0 || nq > fw::kMaxQueues)
    throw Error(Status::DeviceLost, uri + ": the board reports " + std::to_string(nq) + " queues");
  std::uint32_t per_engine[3] = {};
  for (std::uint32_t q = 0; q < nq; ++q) {
    auto hq = std::make_unique<HwQueue>();
    hq->engine = static_cast<fw::EngineType>(t.read32(fw::reg::queue_reg(q, fw::reg::queue::kEngine)));
    if (hq->engine == fw::EngineType::kCompute)
      ++per_engine[0];
    else if (hq->engine == fw::EngineType::kCopy)
      ++per_engine[1];
    else if (hq->engine == fw::EngineType::kVideo)
      ++per_engine[2];
    hw_queues_.push_back(std::move(hq));
  }
  const Engine engines[3] = {Engine::Compute, Engine::Copy, Engine::Video};
  for (int e = 0; e < 3; ++e)
    if (per_engine[e]) props_.engines.push_back({engines[e], per_engine[e]});
  if (t.interrupt_vectors() < nq + 1)
    throw Error(Status::Internal, uri + ": the transport offers " + std::to_string(t.interrupt_vectors()) +
                                      " interrupt vectors, " + std::to_string(nq + 1) + " needed");
}

void TpuDevice::setup_status_pages() {
  // One page per hardware queue, for the life of the device: a queue may wait
  // on another's timeline, so these never move.
  const std::size_t bytes = hw_queues_.size() * fw::kQueueStatusPageSize;
  try {
    status_pages_ = transport_->allocate_host(bytes);
  } catch (const std::system_error& e) {
    throw Error(Status::OutOfMemory, props_.uri + ": cannot allocate the queues' status pages: " + e.what());
  }
  status_pages_iova_ = map_host(status_pages_.data(), status_pages_.size(), /*imported=*/true, &status_pages_);
  for (std::size_t q = 0; q < hw_queues_.size(); ++q) {
    hw_queues_[q]->page = reinterpret_cast<fw::QueueStatusPage*>(status_pages_.data() + q * fw::kQueueStatusPageSize);
    hw_queues_[q]->page_iova = status_pages_iova_ + q * fw::kQueueStatusPageSize;
  }
}

TpuDevice::~TpuDevice() {
  if (irq_thread_.joinable()) {
    base::eventfd_signal(irq_stop_.get());
    irq_thread_.join();
  }
  Transport& t = *transport_;
  t.write32(fw::reg::kIntMask, 0);
  // Queues were reset as they were released; make sure of it before the
  // status pages go away.
  for (std::uint32_t q = 0; q < hw_queues_.size(); ++q)
    t.write32(fw::reg::queue_reg(q, fw::reg::queue::kControl), fw::kQueueControlReset);
  if (status_pages_iova_) unmap_host(status_pages_iova_, status_pages_.size(), true);
  if (telemetry_iova_) unmap_host(telemetry_iova_, telemetry_page_.size(), true);
  std::lock_guard lock(mem_mu_);
  for (auto& h : heaps_) {
    const auto s = h.allocator.stats();
    if (s.allocations)
      log->warn("{}: closing with {} allocation(s), {} still live in heap '{}'", props_.uri, s.allocations,
                format_bytes(s.used), h.name);
  }
}

std::uint64_t TpuDevice::read64(std::uint32_t lo_offset) const {
  std::lock_guard lock(reg64_mu_);
  const std::uint32_t lo = transport_->read32(lo_offset);
  const std::uint32_t hi = transport_->read32(lo_offset + 4);
  return std::uint64_t{hi} << 32 | lo;
}

// ---- Memory --------------------------------------------------------------------

std::pair<std::size_t, std::uint64_t> TpuDevice::allocate_device(std::uint64_t size, Memory memory,
                                                                 const AllocOptions& options, bool not_null) {
  const std::uint64_t alignment = options.alignment ? options.alignment : kDeviceAlignment;
  std::lock_guard lock(mem_mu_);
  std::size_t pick = heaps_.size();
  if (!options.heap.empty()) {
    std::string names;
    for (std::size_t i = 0; i < heaps_.size(); ++i) {
      names += (names.empty() ? "" : ", ") + heaps_[i].name;
      if (heaps_[i].name == options.heap) pick = i;
    }
    if (pick == heaps_.size())
      throw Error(Status::NotFound, uri() + ": no heap named '" + options.heap + "' (heaps: " + names + ")");
    if (memory == Memory::DeviceHostVisible && heaps_[pick].memory != Memory::DeviceHostVisible)
      throw Error(Status::InvalidArgument, uri() + ": heap '" + options.heap +
                                               "' is not host-visible; Memory::DeviceHostVisible needs one that is");
  } else {
    for (std::size_t i = 0; i < heaps_.size() && pick == heaps_.size(); ++i) {
      if (memory == Memory::Device ? heaps_[i].is_default : heaps_[i].memory == Memory::DeviceHostVisible) pick = i;
    }
    if (pick == heaps_.size())
      throw Error(Status::Unsupported, uri() + ": no heap for " + to_string(memory) + " memory on this board");
  }
  Heap& heap = heaps_[pick];
  auto address = heap.allocator.allocate(size, alignment);
  if (address && *address == 0 && not_null) {  // the next block, and the first given back
    auto next = heap.allocator.allocate(size, alignment);
    heap.allocator.free(0);
    address = next;
  }
  if (!address) {
    const auto s = heap.allocator.stats();
    throw Error(Status::OutOfMemory, uri() + ": cannot allocate " + format_bytes(size) + " (" + std::to_string(size) +
                                         " bytes) in heap '" + heap.name + "': " + format_bytes(s.used) + " used in " +
                                         std::to_string(s.allocations) + " allocation(s), " + format_bytes(s.free) +
                                         " free, largest free block " + format_bytes(s.largest_free));
  }
  return {pick, *address};
}

void TpuDevice::free_device(std::size_t heap, std::uint64_t address) noexcept {
  std::lock_guard lock(mem_mu_);
  if (!heaps_[heap].allocator.free(address))
    log->error("{}: free of unknown device address {:#x} in heap '{}'", uri(), address, heaps_[heap].name);
}

std::uint64_t TpuDevice::map_host(void* ptr, std::uint64_t size, bool imported, const base::Mapping* memory) {
  std::uint64_t iova;
  {
    std::lock_guard lock(mem_mu_);
    auto a = iova_.allocate(size, base::page_size());
    if (!a) throw Error(Status::OutOfMemory, uri() + ": no room in the DMA address space for " + format_bytes(size));
    iova = *a;
  }
  try {
    if (memory)
      transport_->map_dma_memory(iova, *memory, static_cast<std::byte*>(ptr) - memory->data(), size,
                                 /*device_writes=*/true);
    else
      transport_->map_dma(iova, ptr, size, /*device_writes=*/true);
  } catch (...) {
    std::lock_guard lock(mem_mu_);
    iova_.free(iova);
    throw;
  }
  std::lock_guard lock(mem_mu_);
  if (imported) {
    imported_bytes_ += size;
  } else {
    host_pinned_bytes_ += size;
    ++host_pinned_count_;
  }
  return iova;
}

void TpuDevice::unmap_host(std::uint64_t iova, std::uint64_t size, bool imported) noexcept {
  transport_->unmap_dma(iova, size);
  std::lock_guard lock(mem_mu_);
  iova_.free(iova);
  if (imported) {
    imported_bytes_ -= size;
  } else {
    host_pinned_bytes_ -= size;
    --host_pinned_count_;
  }
}

std::shared_ptr<driver::BufferBackend> TpuDevice::allocate(std::uint64_t size, Memory memory,
                                                           const AllocOptions& options) {
  if (memory == Memory::HostPinned) {
    if (size > (1ull << 40))
      throw Error(Status::OutOfMemory,
                  uri() + ": " + format_bytes(size) + " of pinned host memory is more than this host has");
    base::Mapping m;
    try {
      m = transport_->allocate_host(size);
    } catch (const std::system_error& e) {
      throw Error(Status::OutOfMemory,
                  uri() + ": cannot allocate " + format_bytes(size) + " of pinned host memory: " + e.what());
    }
    if (!m.locked())
      log->debug("{}: {} of host memory could not be locked (RLIMIT_MEMLOCK); it stays populated", uri(),
                 format_bytes(m.size()));
    std::byte* data = m.data();
    const std::uint64_t mapped = m.size();
    return std::make_shared<HostBuffer>(shared_from_this(), std::move(m), data, size, mapped, false);
  }
  auto [heap, address] = allocate_device(size, memory, options);
  transport_->prefault(address, size);
  try {
    return std::make_shared<DeviceBuffer>(shared_from_this(), heap, heaps_[heap].name, memory, address, size);
  } catch (...) {
    free_device(heap, address);
    throw;
  }
}

std::shared_ptr<driver::BufferBackend> TpuDevice::import_host(void* ptr, std::uint64_t size) {
  if (!props_.caps.import_host_memory)
    throw Error(Status::Unsupported, uri() + ": importing caller memory is unsupported on " + props_.bus +
                                         " (caps.import_host_memory is false: the board reaches only host memory the "
                                         "transport allocates); allocate Memory::HostPinned instead");
  const auto page = base::page_size();
  if (reinterpret_cast<std::uintptr_t>(ptr) % page || size % page)
    throw Error(Status::InvalidArgument, uri() + ": import_host needs page-aligned memory (" + std::to_string(page) +
                                             " bytes); got address " + hex(reinterpret_cast<std::uintptr_t>(ptr)) +
                                             ", size " + std::to_string(size));
  return std::make_shared<HostBuffer>(shared_from_this(), base::Mapping{}, static_cast<std::byte*>(ptr), size, size,
                                      true);
}

MemoryStats TpuDevice::memory_stats() const {
  MemoryStats m;
  std::lock_guard lock(mem_mu_);
  for (auto& h : heaps_) {
    const auto s = h.allocator.stats();
    m.heaps.push_back({h.name, h.memory, s.total, s.used, s.free, s.largest_free, s.allocations, s.peak_used});
    m.device_total += s.total;
    m.device_used += s.used;
  }
  m.host_pinned_bytes = host_pinned_bytes_;
  m.host_pinned_allocations = host_pinned_count_;
  m.imported_bytes = imported_bytes_;
  return m;
}

// ---- Queues --------------------------------------------------------------------

std::uint32_t TpuDevice::ring_entries_for(const QueueOptions& options) const {
  std::uint32_t n = options.ring_entries ? options.ring_entries : std::min(kDefaultRingEntries, max_ring_entries_);
  if (n < fw::kMinRingEntries || n > max_ring_entries_ || (n & (n - 1)))
    throw Error(Status::InvalidArgument, uri() + ": ring_entries " + std::to_string(n) +
                                             " must be a power of two from " + std::to_string(fw::kMinRingEntries) +
                                             " to " + std::to_string(max_ring_entries_));
  return n;
}

std::shared_ptr<driver::QueueBackend> TpuDevice::create_queue(Engine engine, const QueueOptions& options) {
  const std::uint32_t entries = ring_entries_for(options);
  if (check_health() != Health::kOk) throw health_error(uri());
  const fw::EngineType want = to_fw(engine);
  std::uint32_t index = 0, total = 0;
  bool found = false;
  {
    std::lock_guard lock(queues_mu_);
    for (std::uint32_t q = 0; q < hw_queues_.size(); ++q) {
      if (hw_queues_[q]->engine != want) continue;
      ++total;
      if (!found && !hw_queues_[q]->in_use) {
        hw_queues_[q]->in_use = true;
        index = q;
        found = true;
      }
    }
  }
  if (total == 0) throw Error(Status::Unsupported, uri() + ": the board has no " + to_string(engine) + " queues");
  if (!found)
    throw Error(Status::ResourceExhausted,
                uri() + ": all " + std::to_string(total) + " " + to_string(engine) + " queues are in use");
  try {
    AllocOptions ring_options;
    ring_options.alignment = 4096;
    auto [heap, address] = allocate_device(std::uint64_t{entries} * sizeof(fw::CommandDescriptor),
                                           Memory::DeviceHostVisible, ring_options);
    try {
      auto q = std::make_shared<TpuQueue>(shared_from_this(), index, to_engine(want), entries, heap, address);
      std::lock_guard lock(queues_mu_);
      hw_queues_[index]->owner = q.get();
      return q;
    } catch (...) {
      free_device(heap, address);
      throw;
    }
  } catch (...) {
    std::lock_guard lock(queues_mu_);
    hw_queues_[index]->in_use = false;
    throw;
  }
}

std::shared_ptr<driver::ProgramBackend> TpuDevice::create_program(std::span<const driver::Command> commands) {
  if (!props_.caps.tensor)
    throw Error(Status::Unsupported,
                uri() + ": programs need the tensor engine (interface 1.1), which this board lacks");
  std::vector<Slot> slots;
  for (std::size_t i = 0; i < commands.size(); ++i)
    encode(commands[i], static_cast<std::uint32_t>(i), uri(), nullptr, /*allow_fence_wait=*/false, agreed_minor_,
           slots);
  if (slots.size() > fw::kMaxCallSlots)
    throw Error(Status::InvalidArgument, uri() + ": a program of " + std::to_string(slots.size()) +
                                             " slots exceeds the limit of " + std::to_string(fw::kMaxCallSlots));
  // The command list lives in host-visible device memory, written once
  // through the aperture; within it a descriptor's sequence is its slot.
  AllocOptions options;
  options.alignment = 4096;
  const std::uint64_t bytes = slots.size() * sizeof(fw::CommandDescriptor);
  // Not at address 0, which a call reads as "no list": the first thing in
  // its heap when recorded before any queue is claimed.
  auto [heap, address] = allocate_device(bytes, Memory::DeviceHostVisible, options, true);
  auto* list = reinterpret_cast<fw::CommandDescriptor*>(aperture_.data() + address);
  for (std::size_t i = 0; i < slots.size(); ++i) {
    if (slots[i].descriptor) slots[i].d.sequence = static_cast<std::uint32_t>(i);
    std::memcpy(static_cast<void*>(&list[i]), &slots[i].d, sizeof slots[i].d);
  }
  transport_->flush_aperture(address, bytes);
  return std::make_shared<TpuProgram>(shared_from_this(), heap, address, slots.size(), commands.size());
}

void TpuDevice::release_queue(std::uint32_t q) noexcept {
  std::lock_guard lock(queues_mu_);
  hw_queues_[q]->in_use = false;
  hw_queues_[q]->owner = nullptr;
}

DeviceStatus TpuDevice::status() const {
  DeviceStatus s;
  s.uptime_ns = read64(fw::reg::kTimeLo);
  std::lock_guard lock(queues_mu_);
  for (std::uint32_t q = 0; q < hw_queues_.size(); ++q) {
    const HwQueue& hq = *hw_queues_[q];
    if (hq.owner) {
      s.queues.push_back(hq.owner->status());
      continue;
    }
    QueueStatus qs;
    qs.engine = to_engine(hq.engine);
    qs.index = q;
    qs.busy_ns = read64(fw::reg::queue_reg(q, fw::reg::queue::kBusyNsLo));
    qs.retired = read64(fw::reg::queue_reg(q, fw::reg::queue::kRetiredLo));
    s.queues.push_back(qs);
  }
  return s;
}

// ---- Telemetry -------------------------------------------------------------------

void TpuDevice::map_mailbox_page_locked() const {
  if (telemetry_iova_) return;
  auto* self = const_cast<TpuDevice*>(this);
  const std::uint64_t bytes =
      std::max<std::uint64_t>(fw::telemetry_bytes(static_cast<std::uint32_t>(hw_queues_.size()),
                                                  props_.caps.video_decode ? props_.decode_channels : 0),
                              sizeof(fw::TimingModel));
  try {
    telemetry_page_ = transport_->allocate_host(bytes);
  } catch (const std::system_error& e) {
    throw Error(Status::OutOfMemory, props_.uri + ": cannot allocate the mailbox buffer: " + e.what());
  }
  telemetry_iova_ = self->map_host(telemetry_page_.data(), telemetry_page_.size(), /*imported=*/true, &telemetry_page_);
}

std::uint64_t TpuDevice::mailbox_locked(fw::MboxCmd cmd, const char* what) const {
  auto* self = const_cast<TpuDevice*>(this);
  Transport& t = *transport_;
  map_mailbox_page_locked();
  // The mailbox: arguments, then the command; done when its sequence moves.
  const std::uint32_t seq = t.read32(fw::reg::kMboxSeq);
  t.write32(fw::reg::kMboxArg0Lo, static_cast<std::uint32_t>(telemetry_iova_));
  t.write32(fw::reg::kMboxArg0Hi, static_cast<std::uint32_t>(telemetry_iova_ >> 32));
  t.write32(fw::reg::kMboxArg1Lo, static_cast<std::uint32_t>(telemetry_page_.size()));
  t.write32(fw::reg::kMboxArg1Hi, static_cast<std::uint32_t>(std::uint64_t{telemetry_page_.size()} >> 32));
  t.write32(fw::reg::kMboxCmd, static_cast<std::uint32_t>(cmd));
  const std::uint64_t deadline = base::monotonic_ns() + 1'000'000'000ull;
  while (t.read32(fw::reg::kMboxSeq) == seq) {
    if (self->check_health() != Health::kOk) throw health_error(what);
    if (base::monotonic_ns() > deadline)
      throw Error(Status::Timeout, props_.uri + ": the board did not answer the " + what + " request within 1 s");
    std::this_thread::yield();
  }
  const auto status = static_cast<fw::MboxStatus>(t.read32(fw::reg::kMboxStatus));
  const std::uint64_t res0 = read64(fw::reg::kMboxRes0Lo);
  if (status != fw::MboxStatus::kDone)
    throw Error(Status::DeviceFault, props_.uri + ": the board refused the " + what +
                                         " request: " + fw::to_string(static_cast<fw::CmdStatus>(res0)));
  return res0;
}

Telemetry TpuDevice::telemetry() const {
  if (!props_.caps.telemetry) return DeviceBackend::telemetry();
  if (health() == Health::kLost) throw health_error("telemetry");
  std::lock_guard lock(telemetry_mu_);
  const std::uint64_t res0 = mailbox_locked(fw::MboxCmd::kTelemetry, "telemetry");
  std::vector<Engine> engines;
  for (const auto& e : props_.engines) engines.push_back(e.engine);
  return decode_telemetry({telemetry_page_.data(), std::min<std::size_t>(res0, telemetry_page_.size())}, engines,
                          props_.uri);
}

// ---- The timing model ------------------------------------------------------------

const fw::TimingModel* TpuDevice::timing_model() const {
  std::lock_guard lock(telemetry_mu_);
  if (!timing_read_ && (caps_ & fw::kCapTimingModel) && agreed_minor_ >= 9) {
    const std::uint64_t n = mailbox_locked(fw::MboxCmd::kTimingModel, "timing model");
    fw::TimingModel m;
    if (n != sizeof m)
      throw Error(Status::DeviceFault, props_.uri + ": the board's timing model is " + std::to_string(n) +
                                           " bytes, not " + std::to_string(sizeof m));
    std::memcpy(&m, telemetry_page_.data(), sizeof m);
    const char* why = nullptr;
    if (const char* bad = fw::check_timing(m, &why))
      throw Error(Status::DeviceFault, props_.uri + ": the board's timing model is not usable: " + bad + " " + why);
    timing_ = m;
  }
  timing_read_ = true;
  return timing_ ? &*timing_ : nullptr;
}

namespace {
ModelledTime modelled(const fw::CommandTime& t) {
  ModelledTime m;
  m.ns = t.ns;
  m.compute_ns = t.compute_ns;
  m.memory_ns = t.memory_ns;
  m.overhead_ns = t.overhead_ns;
  m.bound = t.bound == fw::Bound::kCompute  ? ModelledTime::Bound::Compute
            : t.bound == fw::Bound::kMemory ? ModelledTime::Bound::Memory
                                            : ModelledTime::Bound::Overhead;
  return m;
}
}  // namespace

std::optional<ModelledTime> TpuDevice::model_op(const driver::OpDesc& op) const {
  const fw::TimingModel* m = timing_model();
  if (!m) return std::nullopt;
  // The board costs the parameter block it would run: the same bytes.
  const std::vector<std::byte> block = encode_op(op, interface_minor());
  auto decoded = fw::decode_op(block);
  if (!decoded)
    throw Error(Status::InvalidArgument,
                props_.uri + ": modelled: the board would refuse this " + std::string(to_string(op.kind)) + ": " +
                    fw::describe(decoded.problem(), static_cast<std::uint16_t>(fw::Opcode::kTensorOp)));
  auto t = fw::op_time(*m, *decoded);
  if (!t)
    throw Error(Status::Unsupported, props_.uri + ": the board's timing model cannot cost a " +
                                         std::string(to_string(op.kind)) + " in " +
                                         fw::to_string(static_cast<fw::MacPrecision>(t.problem().detail)));
  return modelled(*t);
}

std::optional<ModelledTime> TpuDevice::model_transfer(std::uint64_t bytes, Memory from, Memory to) const {
  const fw::TimingModel* m = timing_model();
  if (!m) return std::nullopt;
  if (from == Memory::Device && to == Memory::Device) return modelled(fw::fill_time(*m, bytes));
  const bool from_host = from == Memory::HostPinned, to_host = to == Memory::HostPinned;
  const fw::DmaDirection d = from_host
                                 ? (to_host ? fw::DmaDirection::kHostToHost : fw::DmaDirection::kHostToDevice)
                                 : (to_host ? fw::DmaDirection::kDeviceToHost : fw::DmaDirection::kDeviceToDevice);
  return modelled(fw::copy_time(*m, bytes, d));
}

std::optional<std::uint64_t> TpuDevice::board_time_ns() const { return read64(fw::reg::kTimeLo); }

std::optional<std::uint64_t> TpuDevice::model_decode_ns(Codec codec, FrameType type, std::uint32_t width,
                                                        std::uint32_t height) const {
  const fw::TimingModel* m = timing_model();
  if (!m) return std::nullopt;
  const auto c = codec == Codec::H264   ? fw::VideoCodec::kH264
                 : codec == Codec::H265 ? fw::VideoCodec::kH265
                                        : fw::VideoCodec::kJpeg;
  const auto f = type == FrameType::Intra       ? fw::FrameType::kIntra
                 : type == FrameType::Predicted ? fw::FrameType::kPredicted
                                                : fw::FrameType::kBidirectional;
  return fw::decode_ns(*m, c, f, width, height);
}

// ---- Interrupts ------------------------------------------------------------------

void TpuDevice::start_interrupt_thread() {
  irq_stop_ = base::make_eventfd();
  // The device vector stays unmasked: it reports fatal errors.
  irq_mask_ = fw::kDeviceVectorBit;
  transport_->write32(fw::reg::kIntMask, irq_mask_);
  irq_thread_ = std::thread([this] { interrupt_loop(); });
}

void TpuDevice::arm_interrupt(std::uint32_t q) {
  HwQueue& hq = *hw_queues_[q];
  // Under the lock for every waiter, not only the first: a second waiter
  // must not return (and re-check its fence) before the first has
  // unmasked, or a completion in between raises nothing and it sleeps a
  // whole wait slice.
  std::lock_guard lock(irq_mu_);
  if (hq.armed.fetch_add(1, std::memory_order_seq_cst) != 0) return;
  // Acknowledge what is stale, then unmask; the read-back flushes the write
  // (posted on a real bus) before the caller re-checks its fence.
  transport_->write32(fw::reg::kIntAck, 1u << q);
  irq_mask_ |= 1u << q;
  transport_->write32(fw::reg::kIntMask, irq_mask_);
  (void)transport_->read32(fw::reg::kIntMask);
}

void TpuDevice::disarm_interrupt(std::uint32_t q) noexcept {
  HwQueue& hq = *hw_queues_[q];
  std::lock_guard lock(irq_mu_);
  if (hq.armed.fetch_sub(1, std::memory_order_seq_cst) != 1) return;
  irq_mask_ &= ~(1u << q);
  transport_->write32(fw::reg::kIntMask, irq_mask_);
}

void TpuDevice::interrupt_loop() {
  Transport& t = *transport_;
  base::UniqueFd ep(::epoll_create1(EPOLL_CLOEXEC));
  if (!ep) {
    log->error("{}: epoll_create1 failed ({}); waits fall back to polling", uri(), std::strerror(errno));
    return;
  }
  const std::uint32_t nv = static_cast<std::uint32_t>(hw_queues_.size()) + 1;
  auto add = [&](int fd, std::uint64_t tag) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = tag;
    ::epoll_ctl(ep.get(), EPOLL_CTL_ADD, fd, &ev);
  };
  for (std::uint32_t v = 0; v < nv; ++v) add(t.interrupt_fd(v), v);
  add(irq_stop_.get(), UINT64_MAX);

  epoll_event events[32];
  for (;;) {
    const int n = ::epoll_wait(ep.get(), events, 32, -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      log->error("{}: epoll_wait failed ({})", uri(), std::strerror(errno));
      return;
    }
    bool fired = false;
    for (int i = 0; i < n; ++i) {
      if (events[i].data.u64 == UINT64_MAX) return;
      base::eventfd_drain(t.interrupt_fd(static_cast<std::uint32_t>(events[i].data.u64)));
      fired = true;
    }
    if (!fired) continue;
    const std::uint32_t pending = t.read32(fw::reg::kIntStatus);
    if (pending) t.write32(fw::reg::kIntAck, pending);
    for (std::uint32_t q = 0; q + 1 < nv; ++q)
      if (pending & (1u << q)) hw_queues_[q]->irq.notify();
    if (pending & fw::kDeviceVectorBit) check_health();
  }
}

}  // namespace tpuhal::tpu
