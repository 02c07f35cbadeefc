// The skeleton's device: what it says about itself, and the calls that make
// buffers, queues, programs and decoders. Its board has no memory, no queues
// and no optional capability, so it describes exactly that and refuses the
// rest with Unsupported; the HAL refuses what the capabilities leave false
// before it gets here.
#include "device_impl.h"

namespace tpuhal::skeleton {

SkeletonDevice::SkeletonDevice(std::string uri) {
  // A port reads these from the board while opening it: identity and
  // versions, the memory map (one HeapInfo per heap, exactly one of them the
  // default Device heap), min_alignment, the engines and how many hardware
  // queues each has, what the tensor engine computes in, the codec channels.
  // Capabilities stay false until the calls behind them work.
  props_.uri = std::move(uri);
  props_.driver = "skeleton";
  props_.board = "skeleton (no hardware)";
  props_.bus = "none";
  // No heaps: allocate() refuses, and the conformance suite skips what needs
  // memory. No engines: create_queue() refuses, and the suite skips what
  // needs a queue. All capabilities false: the HAL refuses those calls.
}

// A port stops the board here: quiesce its queues, free its rings and status
// pages, unmap its registers. The HAL closes a device only once every
// buffer, queue and program of it is gone.
SkeletonDevice::~SkeletonDevice() = default;

// Contract (MemoryStats, types.hpp): one HeapStats per heap of the
// properties, device totals, and the host memory mapped for the device.
// The skeleton has no heaps and maps nothing: every figure is zero.
MemoryStats SkeletonDevice::memory_stats() const { return {}; }

// Contract (DeviceStatus, types.hpp): the board's time since its last reset
// and one QueueStatus per hardware queue, read from the device. The
// skeleton has no board clock and no queues.
DeviceStatus SkeletonDevice::status() const { return {}; }

// Contract (Device::allocate): `size` bytes (> 0; the HAL checks it, and that
// an alignment is 0 or a power of two) from the default heap of `memory` or
// the heap options.heap names (NotFound if none); out of memory throws
// OutOfMemory saying what is used and free in the heap and the largest block
// that would fit. HostPinned: allocate host memory and map it for DMA.
std::shared_ptr<driver::BufferBackend> SkeletonDevice::allocate(std::uint64_t, Memory memory, const AllocOptions&) {
  unsupported(
      uri(),
      std::string("has no memory to allocate ") + to_string(memory) + " memory from (its properties list no heaps)",
      "carves device memory from the heaps it lists, or allocates and DMA-maps host memory, in "
      "SkeletonDevice::allocate (src/device.cpp) and returns "
      "std::make_shared<SkeletonBuffer>(shared_from_this(), size, memory, heap, address)");
}

// Contract (Device::import_host, caps.import_host_memory): makes caller
// memory reachable by the device's DMA without a copy; the driver refuses an
// address or size that is not page-aligned (InvalidArgument, saying
// "page-aligned"). Default: Unsupported.
std::shared_ptr<driver::BufferBackend> SkeletonDevice::import_host(void*, std::uint64_t) {
  unsupported(uri(), "cannot import host memory (caps.import_host_memory is false)",
              "whose board can reach caller memory maps it for DMA in SkeletonDevice::import_host "
              "(src/device.cpp) and sets caps.import_host_memory; one that cannot deletes this override");
}

// Contract: records `commands` (no WaitFence) for replay by cmd::Call.
// Default: Unsupported.
std::shared_ptr<driver::ProgramBackend> SkeletonDevice::create_program(std::span<const driver::Command>) {
  unsupported(uri(), "cannot record programs",
              "encodes the commands once into device memory in SkeletonDevice::create_program "
              "(src/device.cpp) and returns std::make_shared<SkeletonProgram>(shared_from_this(), "
              "commands.size())");
}

// Contract (Device::queue): claims a hardware queue of `engine` and sets up
// its ring (options.ring_entries: 0 for the driver's default, else a power
// of two). ResourceExhausted if all of them are in use, Unsupported if the
// board has no such engine.
std::shared_ptr<driver::QueueBackend> SkeletonDevice::create_queue(Engine engine, const QueueOptions&) {
  unsupported(uri(), std::string("has no ") + to_string(engine) + " queues (its properties list no engines)",
              "claims a free hardware queue of the engine and sets up its ring in "
              "SkeletonDevice::create_queue (src/device.cpp), then returns "
              "std::make_shared<SkeletonQueue>(shared_from_this(), engine, index)");
}

// Contract: opens a free decoder channel (caps.video_decode);
// ResourceExhausted naming the channel count when all are open.
// Default: Unsupported.
std::shared_ptr<driver::DecoderBackend> SkeletonDevice::open_decoder(const driver::DecoderConfig&) {
  unsupported(uri(), "has no video decoder (caps.video_decode is false)",
              "with a codec unit returns a driver::DecoderBackend for a free channel in "
              "SkeletonDevice::open_decoder (src/device.cpp; drivers/tpu/src/video.cpp is one) and sets "
              "caps.video_decode; one without deletes this override");
}

// Contract: resets the board and brings it back to a usable state: work not
// complete on queues claimed now fails with kQueueReset and those queues
// stay failed; memory allocations survive. Default: Unsupported.
void SkeletonDevice::reset() {
  unsupported(uri(), "cannot reset its board",
              "resets the board and brings it back up in SkeletonDevice::reset (src/device.cpp); one "
              "whose board cannot be reset deletes this override");
}

}  // namespace tpuhal::skeleton
