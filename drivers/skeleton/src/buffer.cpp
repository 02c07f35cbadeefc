// The skeleton's buffers and programs: memory, and work recorded into it.
// The skeleton's board has no memory, so SkeletonDevice::allocate and
// create_program never make one; this is the shape a port fills in
// (drivers/tpu/src/device.cpp has a device-memory and a host-memory buffer).
#include "device_impl.h"

namespace tpuhal::skeleton {

SkeletonBuffer::SkeletonBuffer(std::shared_ptr<SkeletonDevice> device, std::uint64_t size, Memory memory,
                               std::string heap, std::uint64_t device_address)
    : device_(std::move(device)), size_(size), memory_(memory), heap_(std::move(heap)), address_(device_address) {}

// A port returns the memory to its heap here, or unmaps and frees host
// memory. The HAL drops the last reference only once no queued work uses
// the buffer.
SkeletonBuffer::~SkeletonBuffer() = default;

// Contract: the host view; throw Error(Unsupported, ...) where the memory is
// not mappable, saying which memory kind to use instead (Buffer::map: it
// works for HostPinned and DeviceHostVisible, and for Device where
// caps.map_device_memory).
std::span<std::byte> SkeletonBuffer::map() {
  unsupported(device_->uri(),
              std::string("cannot map a ") + to_string(memory_) + " buffer (there is no memory behind it)",
              "returns the host view of the buffer in SkeletonBuffer::map (src/buffer.cpp), or refuses "
              "naming Memory::HostPinned (or DeviceHostVisible) where this memory is not mappable");
}

SkeletonProgram::SkeletonProgram(std::shared_ptr<SkeletonDevice> device, std::size_t commands)
    : device_(std::move(device)), commands_(commands) {}

// A port frees the program's encoded commands here. The HAL keeps the
// buffers a program refers to alive as long as the program lives.
SkeletonProgram::~SkeletonProgram() = default;

}  // namespace tpuhal::skeleton
