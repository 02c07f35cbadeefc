// Memory of the CUDA shim. Device memory: one heap, a virtual address range
// as large as the GPU's memory reserved once, carved by the same best-fit
// allocator the TPU driver uses and backed chunk by chunk with physical
// memory (cuMemCreate/cuMemMap), so heaps have a base and a size and
// out-of-memory errors say what is used and free, as on every board. Host
// memory: cuMemHostAlloc, or the caller's pages registered.
#include <spdlog/spdlog.h>

#include <algorithm>

#include "device_impl.h"
#include "tpuhal/base/mapping.h"
#include "tpuhal/base/units.h"

namespace tpuhal::cuda {

using base::format_bytes;

// ---- The heap ------------------------------------------------------------------

DeviceHeap::DeviceHeap(const Api& api, CUcontext ctx, int ordinal, std::uint64_t memory) : api_(api), ctx_(ctx) {
  prop_.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop_.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop_.location.id = ordinal;
  access_.location = prop_.location;
  access_.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  ScopedContext scope(api_, ctx_);
  std::size_t g = 0;
  check(api_, api_.cuMemGetAllocationGranularity(&g, &prop_, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
        "cuMemGetAllocationGranularity");
  chunk_ = std::max<std::uint64_t>(g, 4096);
  // Whole chunks, no more than the GPU has: heaps add up to at most
  // memory_bytes (an H100's 85017493504 bytes are not a multiple of 2 MiB).
  size_ = std::max(memory / chunk_, std::uint64_t{1}) * chunk_;
  check(api_, api_.cuMemAddressReserve(&base_, size_, chunk_, 0, 0), "cuMemAddressReserve");
  alloc_.emplace(base_, size_, kMinAlignment);
}

DeviceHeap::~DeviceHeap() {
  ScopedContext scope(api_, ctx_);
  for (auto& [index, c] : chunks_) {
    api_.cuMemUnmap(base_ + index * chunk_, chunk_);
    api_.cuMemRelease(c.handle);
  }
  api_.cuMemAddressFree(base_, size_);
}

std::uint64_t DeviceHeap::allocate(const std::string& uri, std::uint64_t size, std::uint64_t alignment) {
  std::lock_guard lock(mu_);
  auto address = alloc_->allocate(size, alignment);
  if (!address) throw out_of_memory(uri, size, "");
  const std::uint64_t end = *address + alloc_->block_size(*address);
  const std::uint64_t first = (*address - base_) / chunk_, last = (end - 1 - base_) / chunk_;
  ScopedContext scope(api_, ctx_);
  for (std::uint64_t i = first; i <= last; ++i) {
    if (CUresult r = back(i); r != CUDA_SUCCESS) {
      for (std::uint64_t j = first; j < i; ++j) unback(j);
      alloc_->free(*address);
      if (r == CUDA_ERROR_OUT_OF_MEMORY) throw out_of_memory(uri, size, "; the GPU has no memory left to back it");
      check(api_, r, uri + ": backing device memory");
    }
  }
  return *address;
}

void DeviceHeap::free(std::uint64_t address) noexcept {
  std::lock_guard lock(mu_);
  const std::uint64_t size = alloc_->block_size(address);
  if (size == 0 || !alloc_->free(address)) {
    log()->error("free of unknown device address {:#x}", address);
    return;
  }
  const std::uint64_t first = (address - base_) / chunk_, last = (address + size - 1 - base_) / chunk_;
  try {
    ScopedContext scope(api_, ctx_);
    for (std::uint64_t i = first; i <= last; ++i) unback(i);
  } catch (const Error& e) {
    log()->error("freeing device memory: {}", e.what());
  }
}

base::RangeAllocator::Stats DeviceHeap::stats() const {
  std::lock_guard lock(mu_);
  return alloc_->stats();
}

CUresult DeviceHeap::back(std::uint64_t index) {
  Chunk& c = chunks_[index];
  if (c.users++ > 0) return CUDA_SUCCESS;
  const CUdeviceptr va = base_ + index * chunk_;
  CUresult r = api_.cuMemCreate(&c.handle, chunk_, &prop_, 0);
  if (r == CUDA_SUCCESS) {
    r = api_.cuMemMap(va, chunk_, 0, c.handle, 0);
    if (r == CUDA_SUCCESS) {
      r = api_.cuMemSetAccess(va, chunk_, &access_, 1);
      if (r != CUDA_SUCCESS) api_.cuMemUnmap(va, chunk_);
    }
    if (r != CUDA_SUCCESS) api_.cuMemRelease(c.handle);
  }
  if (r != CUDA_SUCCESS) chunks_.erase(index);
  return r;
}

void DeviceHeap::unback(std::uint64_t index) {
  auto it = chunks_.find(index);
  if (it == chunks_.end() || --it->second.users > 0) return;
  api_.cuMemUnmap(base_ + index * chunk_, chunk_);
  api_.cuMemRelease(it->second.handle);
  chunks_.erase(it);
}

Error DeviceHeap::out_of_memory(const std::string& uri, std::uint64_t size, const std::string& more) const {
  const auto s = alloc_->stats();
  return Error(Status::OutOfMemory, uri + ": cannot allocate " + format_bytes(size) + " (" + std::to_string(size) +
                                        " bytes) in heap 'device': " + format_bytes(s.used) + " used in " +
                                        std::to_string(s.allocations) + " allocation(s), " + format_bytes(s.free) +
                                        " free, largest free block " + format_bytes(s.largest_free) + more);
}

// ---- Buffers -------------------------------------------------------------------

CudaBuffer::~CudaBuffer() {
  dev_->dispose([dev = dev_.get(), kind = kind_, address = address_, host = host_, size = size_] {
    if (kind == Kind::Device) {
      dev->heap().free(address);
      return;
    }
    const Api& api = dev->api();
    try {
      ScopedContext scope(api, dev->context());
      const CUresult r = kind == Kind::Pinned ? api.cuMemFreeHost(host) : api.cuMemHostUnregister(host);
      if (r != CUDA_SUCCESS) log()->error("{}: freeing host memory: {}", dev->uri(), describe(api, r));
    } catch (const Error& e) {
      log()->error("{}: freeing host memory: {}", dev->uri(), e.what());
    }
    dev->count_host(-static_cast<std::int64_t>(size), -1, kind == Kind::Imported);
  });
}

const std::string& CudaBuffer::heap() const {
  static const std::string device = "device", host;
  return kind_ == Kind::Device ? device : host;
}

std::span<std::byte> CudaBuffer::map() {
  if (kind_ == Kind::Device)
    throw Error(Status::Unsupported, dev_->uri() +
                                         ": device memory cannot be mapped on a GPU (caps.map_device_memory is "
                                         "false); copy it to Memory::HostPinned");
  return {static_cast<std::byte*>(host_), size_};
}

std::shared_ptr<driver::BufferBackend> CudaDevice::allocate(std::uint64_t size, Memory memory,
                                                            const AllocOptions& options) {
  if (!options.heap.empty() && options.heap != "device")
    throw Error(Status::NotFound, uri() + ": no heap named '" + options.heap + "' (heaps: device)");
  switch (memory) {
    case Memory::Device: {
      const std::uint64_t alignment = options.alignment ? std::max(options.alignment, kMinAlignment) : kMinAlignment;
      const CUdeviceptr address = heap_->allocate(uri(), size, alignment);
      return std::make_shared<CudaBuffer>(shared_from_this(), CudaBuffer::Kind::Device, size, address, nullptr);
    }
    case Memory::DeviceHostVisible:
      throw Error(Status::Unsupported, uri() +
                                           ": no host-visible device memory on a GPU "
                                           "(caps.host_visible_device_memory is false); use Memory::HostPinned");
    case Memory::HostPinned: {
      ScopedContext scope(api_, ctx_);
      void* host = nullptr;
      const CUresult r = api_.cuMemHostAlloc(&host, size, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP);
      if (r == CUDA_ERROR_OUT_OF_MEMORY)
        throw Error(Status::OutOfMemory, uri() + ": cannot allocate " + format_bytes(size) +
                                             " of pinned host memory (cuMemHostAlloc: " + describe(api_, r) + ")");
      check(api_, r, uri() + ": cuMemHostAlloc of " + std::to_string(size) + " bytes");
      CUdeviceptr address = 0;
      if (CUresult g = api_.cuMemHostGetDevicePointer(&address, host, 0); g != CUDA_SUCCESS) {
        api_.cuMemFreeHost(host);
        check(api_, g, uri() + ": cuMemHostGetDevicePointer");
      }
      if (options.alignment && address % options.alignment) {
        api_.cuMemFreeHost(host);
        throw Error(Status::Unsupported, uri() + ": pinned host memory comes page-aligned; alignment " +
                                             std::to_string(options.alignment) + " is not available");
      }
      count_host(static_cast<std::int64_t>(size), 1, false);
      return std::make_shared<CudaBuffer>(shared_from_this(), CudaBuffer::Kind::Pinned, size, address, host);
    }
  }
  throw Error(Status::InvalidArgument, uri() + ": unknown memory kind");
}

std::shared_ptr<driver::BufferBackend> CudaDevice::import_host(void* ptr, std::uint64_t size) {
  const auto page = base::page_size();
  if (reinterpret_cast<std::uintptr_t>(ptr) % page || size % page)
    throw Error(Status::InvalidArgument, uri() + ": import_host needs page-aligned memory (" + std::to_string(page) +
                                             " bytes); got size " + std::to_string(size));
  ScopedContext scope(api_, ctx_);
  check(api_, api_.cuMemHostRegister(ptr, size, CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP),
        uri() + ": cuMemHostRegister of " + std::to_string(size) + " bytes");
  CUdeviceptr address = 0;
  if (CUresult r = api_.cuMemHostGetDevicePointer(&address, ptr, 0); r != CUDA_SUCCESS) {
    api_.cuMemHostUnregister(ptr);
    check(api_, r, uri() + ": cuMemHostGetDevicePointer");
  }
  count_host(static_cast<std::int64_t>(size), 0, true);
  return std::make_shared<CudaBuffer>(shared_from_this(), CudaBuffer::Kind::Imported, size, address, ptr);
}

}  // namespace tpuhal::cuda
