// A stand-in for libcuda.so.1, so the CUDA shim's tests run on machines
// without a GPU. It implements the entry points the shim resolves
// (drivers/cuda/src/entry_points.inc) on host memory, with the rules of the
// real driver that the shim must follow checked rather than assumed:
//
//   - every call but device queries and context management needs a current
//     context (CUDA_ERROR_INVALID_CONTEXT otherwise);
//   - device pointers are process addresses (unified addressing): pinned and
//     registered host memory is its own device address, and device memory is
//     a reserved range (cuMemAddressReserve) that is unreadable until a
//     physical chunk is mapped there (cuMemMap) *and* made accessible
//     (cuMemSetAccess);
//   - stream work runs later, on a thread per stream, in order; an address
//     that is not accessible when the work runs is a sticky
//     CUDA_ERROR_ILLEGAL_ADDRESS on that stream, never a read of freed
//     memory;
//   - capture (cuStreamBeginCapture) records work into a graph instead of
//     running it; cuGraphLaunch replays it in the stream.
//
// Settings, read at cuInit/cuDriverGetVersion: TPUHAL_FAKE_CUDA_VERSION
// (default 12080: "12.8"), TPUHAL_FAKE_CUDA_DEVICES (default 1; 0 makes
// cuInit report CUDA_ERROR_NO_DEVICE), TPUHAL_FAKE_CUDA_MEMORY (bytes per
// device, default 256 MiB).
//
// Test controls (extern "C"): tpuhal_fake_cuda_fail(code) makes the next
// stream operation any stream runs fail with `code`;
// tpuhal_fake_cuda_refuse_modules(1) makes cuModuleLoadData fail (0 again:
// load); tpuhal_fake_cuda_reset() disarms both;
// tpuhal_fake_cuda_launch_host(stream, kernel, params) queues host work as
// a kernel (the stand-in cuBLAS, fake_cublas.cpp, runs its products so);
// tpuhal_fake_cuda_live_allocations()
// counts what is allocated and not yet given back (host allocations and
// registrations, physical chunks, address reservations, graphs, cuMemAlloc
// blocks, modules).
//
// Kernels: the shim's clock kernels (PTX, known by name) and its tensor-op
// kernels (a fatbin: drivers/cuda/kernels, whose host build this library
// links) run on the host when their stream reaches them; any other kernel
// does nothing.
//
// Simplifications: a sticky error stays with its stream rather than
// poisoning the whole context, and a physical chunk's contents do not
// survive unmapping it.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <string>
#include <thread>
#include <vector>

#include "host_kernels.h"

namespace {

constexpr std::size_t kGranularity = 2u << 20;
constexpr int kMaxDevices = 8;

std::uint64_t env_number(const char* name, std::uint64_t fallback) {
  const char* s = std::getenv(name);
  if (!s || !*s) return fallback;
  return std::strtoull(s, nullptr, 0);
}

// ---- Process-wide state (never destroyed: stream threads may outlive main) ----

struct Context {
  int device = 0;
  int retained = 0;  // primary context retain count
};

struct Mapping {
  std::uint64_t size = 0;
  CUmemGenericAllocationHandle handle = 0;
  bool accessible = false;  // cuMemSetAccess done
};

struct Chunk {
  std::uint64_t size = 0;
  int device = 0;
  bool mapped = false;
};

struct Reservation {
  std::uint64_t size = 0;
  void* base = nullptr;  // the mmap'd span, maybe larger for alignment
  std::size_t span = 0;
};

struct Op;
struct Graph {
  std::vector<Op> ops;
};

struct Op {
  enum Kind { Copy, Set8, Set16, Set32, Wait, Write, Launch, Kernel } kind = Copy;
  std::uint64_t dst = 0, src = 0, count = 0;  // count: bytes (Copy) or elements (Set*)
  std::uint64_t value = 0;
  unsigned flags = 0;
  std::shared_ptr<const std::vector<Op>> graph;              // Launch
  const tpuhal::cuda::k::HostKernel* host = nullptr;         // Kernel of KernelKind::Host
  std::shared_ptr<const std::vector<unsigned char>> params;  // its parameters
};

// What a kernel does when the stand-in runs it (Op::flags of a Kernel): the
// shim's clock kernels (drivers/cuda/src/clock.cpp) write the host's
// CLOCK_MONOTONIC as the board time; every other kernel does nothing.
// A tensor-op kernel (KernelKind::Host) runs its host build over every item.
enum KernelKind : unsigned { Empty, Stamp, FenceStamp, Host };

struct Stream;

struct State {
  std::mutex mu;  // everything below but memory
  std::atomic<bool> initialised{false};
  std::atomic<int> devices{0};
  std::atomic<std::uint64_t> memory{0};
  Context contexts[kMaxDevices];
  std::uint64_t used[kMaxDevices] = {};  // physical chunk bytes per device
  std::map<CUmemGenericAllocationHandle, Chunk> chunks;
  CUmemGenericAllocationHandle next_handle = 1;
  std::set<Stream*> streams;
  std::set<Graph*> graphs;
  std::set<CUgraphExec> execs;
  std::atomic<unsigned long long> live{0};
  std::atomic<int> armed{0};
  std::atomic<bool> refuse_modules{false};  // cuModuleLoadData fails (tpuhal_fake_cuda_refuse_modules)

  // What stream work may touch: read-locked while an operation runs, so a
  // range cannot be unmapped under it.
  std::shared_mutex memory_mu;
  std::map<std::uint64_t, std::uint64_t> host;  // base -> size: pinned and registered
  std::set<std::uint64_t> pinned;               // the bases of cuMemHostAlloc's
  std::map<std::uint64_t, Mapping> mapped;      // device VA -> mapping
  std::map<std::uint64_t, Reservation> reserved;
  std::map<std::uint64_t, std::pair<std::uint64_t, int>> allocations;  // cuMemAlloc: base -> span, device

  std::set<const void*> modules, functions;
};

State& state() {
  static State* s = new State;
  return *s;
}

thread_local std::vector<Context*> current;

CUresult need_context() {
  if (!state().initialised) return CUDA_ERROR_NOT_INITIALIZED;
  return current.empty() ? CUDA_ERROR_INVALID_CONTEXT : CUDA_SUCCESS;
}

// Whether [address, address + size) lies in host memory the driver knows or
// in accessible mapped device memory; caller holds memory_mu.
bool reachable(const State& s, std::uint64_t address, std::uint64_t size) {
  if (size == 0) return true;
  if (address + size < address) return false;
  if (auto it = s.host.upper_bound(address); it != s.host.begin()) {
    --it;
    if (address >= it->first && address + size <= it->first + it->second) return true;
  }
  auto it = s.mapped.upper_bound(address);
  if (it == s.mapped.begin()) return false;
  --it;
  std::uint64_t at = address;
  const std::uint64_t end = address + size;
  while (it != s.mapped.end() && it->first <= at && at < it->first + it->second.size) {
    if (!it->second.accessible) return false;
    at = it->first + it->second.size;
    if (at >= end) return true;
    ++it;
  }
  return false;
}

// ---- Streams ------------------------------------------------------------------------

CUresult run(const Op& op);

struct Stream : std::enable_shared_from_this<Stream> {
  Context* context = nullptr;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Op> ops;  // the front stays until it has run: empty means idle
  CUresult error = CUDA_SUCCESS;
  bool destroyed = false;
  bool capturing = false;
  bool capture_invalid = false;
  std::vector<Op> captured;
  std::thread thread;  // its worker, until cuStreamDestroy joins or detaches it

  void start() {
    thread = std::thread([self = shared_from_this()] { self->work(); });
  }

  void work() {
    std::unique_lock lock(mu);
    for (;;) {
      cv.wait(lock, [&] { return !ops.empty() || destroyed; });
      if (ops.empty()) return;
      const Op op = ops.front();
      const bool skip = error != CUDA_SUCCESS;
      lock.unlock();
      const CUresult r = skip ? CUDA_SUCCESS : run(op);
      lock.lock();
      ops.pop_front();
      if (r != CUDA_SUCCESS && error == CUDA_SUCCESS) error = r;
      cv.notify_all();
    }
  }

  CUresult enqueue(Op op) {
    std::lock_guard lock(mu);
    if (capturing) {
      captured.push_back(std::move(op));
      return CUDA_SUCCESS;
    }
    ops.push_back(std::move(op));
    cv.notify_all();
    return CUDA_SUCCESS;
  }
};

CUresult stream_of(CUstream handle, Stream** out) {
  State& s = state();
  std::lock_guard lock(s.mu);
  auto* st = reinterpret_cast<Stream*>(handle);
  if (!handle || !s.streams.count(st)) return CUDA_ERROR_INVALID_HANDLE;  // no default stream here
  *out = st;
  return CUDA_SUCCESS;
}

CUresult run(const Op& op) {
  State& s = state();
  if (op.kind != Op::Launch)
    if (const int f = s.armed.exchange(0)) return static_cast<CUresult>(f);
  switch (op.kind) {
    case Op::Copy: {
      std::shared_lock lock(s.memory_mu);
      if (!reachable(s, op.dst, op.count) || !reachable(s, op.src, op.count)) return CUDA_ERROR_ILLEGAL_ADDRESS;
      std::memmove(reinterpret_cast<void*>(op.dst), reinterpret_cast<const void*>(op.src), op.count);
      return CUDA_SUCCESS;
    }
    case Op::Set8:
    case Op::Set16:
    case Op::Set32: {
      const unsigned width = op.kind == Op::Set8 ? 1 : op.kind == Op::Set16 ? 2 : 4;
      std::shared_lock lock(s.memory_mu);
      if (!reachable(s, op.dst, op.count * width)) return CUDA_ERROR_ILLEGAL_ADDRESS;
      auto* p = reinterpret_cast<unsigned char*>(op.dst);
      if (width == 1) {
        std::memset(p, static_cast<int>(op.value & 0xff), op.count);
      } else {
        for (std::uint64_t i = 0; i < op.count; ++i) std::memcpy(p + i * width, &op.value, width);
      }
      return CUDA_SUCCESS;
    }
    case Op::Wait: {
      auto step = std::chrono::microseconds(1);
      for (;;) {
        std::uint64_t v = 0;
        {
          std::shared_lock lock(s.memory_mu);
          if (!reachable(s, op.dst, 8)) return CUDA_ERROR_ILLEGAL_ADDRESS;
          v = std::atomic_ref<std::uint64_t>(*reinterpret_cast<std::uint64_t*>(op.dst)).load(std::memory_order_acquire);
        }
        bool done = false;
        switch (op.flags & 0xf) {
          case CU_STREAM_WAIT_VALUE_GEQ: done = static_cast<std::int64_t>(v - op.value) >= 0; break;
          case CU_STREAM_WAIT_VALUE_EQ: done = v == op.value; break;
          case CU_STREAM_WAIT_VALUE_AND: done = (v & op.value) != 0; break;
          case CU_STREAM_WAIT_VALUE_NOR: done = ~(v | op.value) != 0; break;
          default: return CUDA_ERROR_INVALID_VALUE;
        }
        if (done) return CUDA_SUCCESS;
        std::this_thread::sleep_for(step);
        step = std::min(step * 2, std::chrono::microseconds(500));
      }
    }
    case Op::Write: {
      std::shared_lock lock(s.memory_mu);
      if (!reachable(s, op.dst, 8)) return CUDA_ERROR_ILLEGAL_ADDRESS;
      std::atomic_ref<std::uint64_t>(*reinterpret_cast<std::uint64_t*>(op.dst))
          .store(op.value, std::memory_order_release);
      return CUDA_SUCCESS;
    }
    case Op::Kernel: {
      // The kernels whose work the stand-in knows by name (Function::kind);
      // any other does nothing. A bad address faults as on a GPU: when
      // the kernel runs, not when it is launched.
      if (op.flags == KernelKind::Empty) return CUDA_SUCCESS;
      std::shared_lock lock(s.memory_mu);
      if (op.flags == KernelKind::Host) {
        op.host->run(op.params->data());
        return CUDA_SUCCESS;
      }
      const std::uint64_t bytes = op.flags == KernelKind::Stamp ? 8 : 16;
      if (op.dst % 8 != 0 || !reachable(s, op.dst, bytes)) return CUDA_ERROR_ILLEGAL_ADDRESS;
      auto word = [](std::uint64_t at) {
        return std::atomic_ref<std::uint64_t>(*reinterpret_cast<std::uint64_t*>(at));
      };
      const auto now = static_cast<std::uint64_t>(
          std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
              .count());
      if (op.flags == KernelKind::Stamp) {
        word(op.dst).store(now, std::memory_order_release);
      } else {
        word(op.dst).store(0, std::memory_order_release);
        word(op.dst + 8).store(now, std::memory_order_release);
        word(op.dst).store(op.value, std::memory_order_release);
      }
      return CUDA_SUCCESS;
    }
    case Op::Launch:
      for (const Op& o : *op.graph)
        if (CUresult r = run(o); r != CUDA_SUCCESS) return r;
      return CUDA_SUCCESS;
  }
  return CUDA_ERROR_UNKNOWN;
}

// Checks an operation's arguments as the real driver does at the call, then
// queues (or captures) it.
CUresult submit(CUstream handle, Op op, std::uint64_t bytes_at_dst, std::uint64_t bytes_at_src) {
  if (CUresult r = need_context()) return r;
  Stream* st = nullptr;
  if (CUresult r = stream_of(handle, &st)) return r;
  {
    State& s = state();
    std::shared_lock lock(s.memory_mu);
    if (!reachable(s, op.dst, bytes_at_dst) || (op.kind == Op::Copy && !reachable(s, op.src, bytes_at_src))) {
      std::lock_guard sl(st->mu);
      if (st->capturing) st->capture_invalid = true;
      return CUDA_ERROR_INVALID_VALUE;
    }
  }
  return st->enqueue(std::move(op));
}

// ---- Entry points ----------------------------------------------------------------

CUresult fake_cuInit(unsigned int flags) {
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  State& s = state();
  std::lock_guard lock(s.mu);
  s.devices = static_cast<int>(std::min<std::uint64_t>(env_number("TPUHAL_FAKE_CUDA_DEVICES", 1), kMaxDevices));
  s.memory = env_number("TPUHAL_FAKE_CUDA_MEMORY", 256u << 20);
  for (int i = 0; i < kMaxDevices; ++i) s.contexts[i].device = i;
  if (s.devices == 0) return CUDA_ERROR_NO_DEVICE;
  s.initialised = true;
  return CUDA_SUCCESS;
}

struct ErrorText {
  CUresult code;
  const char* name;
  const char* text;
};
constexpr ErrorText kErrors[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_NO_BINARY_FOR_GPU, "CUDA_ERROR_NO_BINARY_FOR_GPU",
     "no kernel image is available for execution on the device"},
    {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
    {CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
    {CUDA_ERROR_LAUNCH_FAILED, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"},
    {CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
     "part or all of the requested memory range is already mapped"},
    {CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED",
     "pointer does not correspond to a registered memory region"},
    {CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
     "operation failed due to a previous error during capture"},
    {CUDA_ERROR_ILLEGAL_STATE, "CUDA_ERROR_ILLEGAL_STATE", "the operation cannot be performed in the present state"},
    {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

CUresult fake_cuGetErrorName(CUresult error, const char** out) {
  for (const auto& e : kErrors)
    if (e.code == error) {
      *out = e.name;
      return CUDA_SUCCESS;
    }
  *out = nullptr;
  return CUDA_ERROR_INVALID_VALUE;
}

CUresult fake_cuGetErrorString(CUresult error, const char** out) {
  for (const auto& e : kErrors)
    if (e.code == error) {
      *out = e.text;
      return CUDA_SUCCESS;
    }
  *out = nullptr;
  return CUDA_ERROR_INVALID_VALUE;
}

CUresult valid_device(CUdevice d) {
  State& s = state();
  std::lock_guard lock(s.mu);
  if (!s.initialised) return CUDA_ERROR_NOT_INITIALIZED;
  return d >= 0 && d < s.devices ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

CUresult fake_cuDeviceGetCount(int* count) {
  State& s = state();
  std::lock_guard lock(s.mu);
  if (!s.initialised) return CUDA_ERROR_NOT_INITIALIZED;
  if (!count) return CUDA_ERROR_INVALID_VALUE;
  *count = s.devices;
  return CUDA_SUCCESS;
}

CUresult fake_cuDeviceGet(CUdevice* device, int ordinal) {
  if (CUresult r = valid_device(ordinal)) return r;
  *device = ordinal;
  return CUDA_SUCCESS;
}

CUresult fake_cuDeviceGetName(char* name, int len, CUdevice d) {
  if (CUresult r = valid_device(d)) return r;
  if (!name || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  std::snprintf(name, static_cast<std::size_t>(len), "tpuhal fake CUDA device");
  return CUDA_SUCCESS;
}

CUresult fake_cuDeviceTotalMem(std::size_t* bytes, CUdevice d) {
  if (CUresult r = valid_device(d)) return r;
  *bytes = state().memory;
  return CUDA_SUCCESS;
}

CUresult fake_cuDeviceGetAttribute(int* v, CUdevice_attribute a, CUdevice d) {
  if (CUresult r = valid_device(d)) return r;
  switch (a) {
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *v = 4; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *v = 9; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *v = 0; break;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
    case CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS:
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY:
    case CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: *v = 1; break;
    default: *v = 0; break;
  }
  return CUDA_SUCCESS;
}

CUresult fake_cuDeviceGetPCIBusId(char* id, int len, CUdevice d) {
  if (CUresult r = valid_device(d)) return r;
  if (!id || len < 13) return CUDA_ERROR_INVALID_VALUE;
  std::snprintf(id, static_cast<std::size_t>(len), "0000:%02x:00.0", 0x10 + d);
  return CUDA_SUCCESS;
}

CUresult fake_cuDeviceGetUuid(CUuuid* uuid, CUdevice d) {
  if (CUresult r = valid_device(d)) return r;
  if (!uuid) return CUDA_ERROR_INVALID_VALUE;
  for (int i = 0; i < 16; ++i) uuid->bytes[i] = static_cast<char>(i == 15 ? d : 0xf0 + i);
  return CUDA_SUCCESS;
}

CUresult fake_cuDevicePrimaryCtxRetain(CUcontext* ctx, CUdevice d) {
  if (CUresult r = valid_device(d)) return r;
  State& s = state();
  std::lock_guard lock(s.mu);
  ++s.contexts[d].retained;
  *ctx = reinterpret_cast<CUcontext>(&s.contexts[d]);
  return CUDA_SUCCESS;
}

CUresult fake_cuDevicePrimaryCtxRelease(CUdevice d) {
  if (CUresult r = valid_device(d)) return r;
  State& s = state();
  std::lock_guard lock(s.mu);
  if (s.contexts[d].retained == 0) return CUDA_ERROR_INVALID_CONTEXT;
  --s.contexts[d].retained;
  return CUDA_SUCCESS;
}

CUresult fake_cuCtxPushCurrent(CUcontext ctx) {
  State& s = state();
  std::lock_guard lock(s.mu);
  auto* c = reinterpret_cast<Context*>(ctx);
  if (c < s.contexts || c >= s.contexts + s.devices || c->retained == 0) return CUDA_ERROR_INVALID_CONTEXT;
  current.push_back(c);
  return CUDA_SUCCESS;
}

CUresult fake_cuCtxPopCurrent(CUcontext* ctx) {
  if (current.empty()) return CUDA_ERROR_INVALID_CONTEXT;
  if (ctx) *ctx = reinterpret_cast<CUcontext>(current.back());
  current.pop_back();
  return CUDA_SUCCESS;
}

CUresult fake_cuMemGetInfo(std::size_t* free, std::size_t* total) {
  if (CUresult r = need_context()) return r;
  State& s = state();
  std::lock_guard lock(s.mu);
  *total = s.memory;
  *free = s.memory - s.used[current.back()->device];
  return CUDA_SUCCESS;
}

CUresult fake_cuMemHostAlloc(void** p, std::size_t size, unsigned int flags) {
  if (CUresult r = need_context()) return r;
  if (!p || size == 0 || (flags & ~0x7u)) return CUDA_ERROR_INVALID_VALUE;
  void* m = std::aligned_alloc(4096, (size + 4095) & ~std::size_t{4095});
  if (!m) return CUDA_ERROR_OUT_OF_MEMORY;
  State& s = state();
  std::unique_lock lock(s.memory_mu);
  s.host[reinterpret_cast<std::uint64_t>(m)] = size;
  s.pinned.insert(reinterpret_cast<std::uint64_t>(m));
  ++s.live;
  *p = m;
  return CUDA_SUCCESS;
}

CUresult fake_cuMemFreeHost(void* p) {
  if (CUresult r = need_context()) return r;
  State& s = state();
  {
    std::unique_lock lock(s.memory_mu);
    const auto base = reinterpret_cast<std::uint64_t>(p);
    if (!s.pinned.erase(base)) return CUDA_ERROR_INVALID_VALUE;
    s.host.erase(base);
    --s.live;
  }
  std::free(p);
  return CUDA_SUCCESS;
}

CUresult fake_cuMemHostGetDevicePointer(CUdeviceptr* d, void* p, unsigned int flags) {
  if (CUresult r = need_context()) return r;
  if (flags != 0 || !d) return CUDA_ERROR_INVALID_VALUE;
  State& s = state();
  std::shared_lock lock(s.memory_mu);
  const auto a = reinterpret_cast<std::uint64_t>(p);
  auto it = s.host.upper_bound(a);
  if (it == s.host.begin() || a >= std::prev(it)->first + std::prev(it)->second) return CUDA_ERROR_INVALID_VALUE;
  *d = a;  // unified addressing: the host address is the device address
  return CUDA_SUCCESS;
}

CUresult fake_cuMemHostRegister(void* p, std::size_t size, unsigned int flags) {
  if (CUresult r = need_context()) return r;
  if (!p || size == 0 || (flags & ~0xfu)) return CUDA_ERROR_INVALID_VALUE;
  State& s = state();
  std::unique_lock lock(s.memory_mu);
  const auto a = reinterpret_cast<std::uint64_t>(p);
  auto it = s.host.upper_bound(a + size - 1);
  if (it != s.host.begin() && std::prev(it)->first + std::prev(it)->second > a)
    return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
  s.host[a] = size;
  ++s.live;
  return CUDA_SUCCESS;
}

CUresult fake_cuMemHostUnregister(void* p) {
  if (CUresult r = need_context()) return r;
  State& s = state();
  std::unique_lock lock(s.memory_mu);
  const auto a = reinterpret_cast<std::uint64_t>(p);
  if (s.pinned.count(a) || !s.host.erase(a)) return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
  --s.live;
  return CUDA_SUCCESS;
}

CUresult fake_cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, std::size_t bytes, CUstream stream) {
  Op op;
  op.kind = Op::Copy;
  op.dst = dst;
  op.src = src;
  op.count = bytes;
  return submit(stream, std::move(op), bytes, bytes);
}

CUresult memset_async(Op::Kind kind, unsigned width, CUdeviceptr dst, unsigned value, std::size_t n, CUstream stream) {
  if (dst % width != 0) return CUDA_ERROR_INVALID_VALUE;
  Op op;
  op.kind = kind;
  op.dst = dst;
  op.count = n;
  op.value = value;
  return submit(stream, std::move(op), n * width, 0);
}

CUresult fake_cuMemsetD8Async(CUdeviceptr dst, unsigned char v, std::size_t n, CUstream stream) {
  return memset_async(Op::Set8, 1, dst, v, n, stream);
}
CUresult fake_cuMemsetD16Async(CUdeviceptr dst, unsigned short v, std::size_t n, CUstream stream) {
  return memset_async(Op::Set16, 2, dst, v, n, stream);
}
CUresult fake_cuMemsetD32Async(CUdeviceptr dst, unsigned int v, std::size_t n, CUstream stream) {
  return memset_async(Op::Set32, 4, dst, v, n, stream);
}

CUresult fake_cuStreamCreate(CUstream* out, unsigned int flags) {
  if (CUresult r = need_context()) return r;
  if (!out || (flags & ~1u)) return CUDA_ERROR_INVALID_VALUE;
  auto st = std::make_shared<Stream>();
  st->context = current.back();
  {
    State& s = state();
    std::lock_guard lock(s.mu);
    s.streams.insert(st.get());
  }
  st->start();
  *out = reinterpret_cast<CUstream>(st.get());
  return CUDA_SUCCESS;
}

CUresult fake_cuStreamDestroy(CUstream handle) {
  if (CUresult r = need_context()) return r;
  Stream* st = nullptr;
  if (CUresult r = stream_of(handle, &st)) return r;
  {
    State& s = state();
    std::lock_guard lock(s.mu);
    s.streams.erase(st);
  }
  // Its thread finishes what is queued, then lets go of the stream. An idle
  // stream's thread is joined here, so no thread of ours is still exiting
  // when the process does (LeakSanitizer's exit scan trips over those); one
  // with work left goes on alone, as the real driver lets it.
  std::thread worker;
  {
    std::lock_guard lock(st->mu);
    st->destroyed = true;
    st->cv.notify_all();
    if (st->ops.empty())
      worker = std::move(st->thread);
    else
      st->thread.detach();
  }
  if (worker.joinable()) worker.join();
  return CUDA_SUCCESS;
}

CUresult fake_cuStreamQuery(CUstream handle) {
  if (CUresult r = need_context()) return r;
  Stream* st = nullptr;
  if (CUresult r = stream_of(handle, &st)) return r;
  std::lock_guard lock(st->mu);
  if (st->error != CUDA_SUCCESS) return st->error;
  return st->ops.empty() ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUresult fake_cuStreamSynchronize(CUstream handle) {
  if (CUresult r = need_context()) return r;
  Stream* st = nullptr;
  if (CUresult r = stream_of(handle, &st)) return r;
  std::unique_lock lock(st->mu);
  st->cv.wait(lock, [&] { return st->ops.empty(); });
  return st->error;
}

CUresult fake_cuStreamWaitValue64(CUstream stream, CUdeviceptr addr, cuuint64_t value, unsigned int flags) {
  if (addr % 8 != 0 || (flags & 0xf) > CU_STREAM_WAIT_VALUE_NOR) return CUDA_ERROR_INVALID_VALUE;
  Op op;
  op.kind = Op::Wait;
  op.dst = addr;
  op.value = value;
  op.flags = flags;
  return submit(stream, std::move(op), 8, 0);
}

CUresult fake_cuStreamWriteValue64(CUstream stream, CUdeviceptr addr, cuuint64_t value, unsigned int flags) {
  if (addr % 8 != 0 || (flags & ~1u)) return CUDA_ERROR_INVALID_VALUE;
  Op op;
  op.kind = Op::Write;
  op.dst = addr;
  op.value = value;
  return submit(stream, std::move(op), 8, 0);
}

CUresult fake_cuStreamBeginCapture(CUstream handle, CUstreamCaptureMode mode) {
  if (CUresult r = need_context()) return r;
  if (mode > CU_STREAM_CAPTURE_MODE_RELAXED) return CUDA_ERROR_INVALID_VALUE;
  Stream* st = nullptr;
  if (CUresult r = stream_of(handle, &st)) return r;
  std::lock_guard lock(st->mu);
  if (st->capturing) return CUDA_ERROR_ILLEGAL_STATE;
  st->capturing = true;
  st->capture_invalid = false;
  st->captured.clear();
  return CUDA_SUCCESS;
}

CUresult fake_cuStreamEndCapture(CUstream handle, CUgraph* graph) {
  if (CUresult r = need_context()) return r;
  Stream* st = nullptr;
  if (CUresult r = stream_of(handle, &st)) return r;
  if (!graph) return CUDA_ERROR_INVALID_VALUE;
  std::vector<Op> ops;
  bool invalid = false;
  {
    std::lock_guard lock(st->mu);
    if (!st->capturing) return CUDA_ERROR_ILLEGAL_STATE;
    st->capturing = false;
    invalid = st->capture_invalid;
    ops.swap(st->captured);
  }
  *graph = nullptr;
  if (invalid) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  auto* g = new Graph{std::move(ops)};
  State& s = state();
  std::lock_guard lock(s.mu);
  s.graphs.insert(g);
  ++s.live;
  *graph = reinterpret_cast<CUgraph>(g);
  return CUDA_SUCCESS;
}

using Exec = std::shared_ptr<const std::vector<Op>>;

CUresult fake_cuGraphInstantiateWithFlags(CUgraphExec* out, CUgraph graph, unsigned long long flags) {
  if (CUresult r = need_context()) return r;
  if (!out || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  State& s = state();
  std::lock_guard lock(s.mu);
  auto* g = reinterpret_cast<Graph*>(graph);
  if (!s.graphs.count(g)) return CUDA_ERROR_INVALID_HANDLE;
  auto* e = new Exec(std::make_shared<const std::vector<Op>>(g->ops));
  s.execs.insert(reinterpret_cast<CUgraphExec>(e));
  ++s.live;
  *out = reinterpret_cast<CUgraphExec>(e);
  return CUDA_SUCCESS;
}

CUresult fake_cuGraphLaunch(CUgraphExec exec, CUstream stream) {
  Op op;
  op.kind = Op::Launch;
  {
    State& s = state();
    std::lock_guard lock(s.mu);
    if (!s.execs.count(exec)) return CUDA_ERROR_INVALID_HANDLE;
    op.graph = *reinterpret_cast<Exec*>(exec);  // a launch in flight outlives cuGraphExecDestroy
  }
  return submit(stream, std::move(op), 0, 0);
}

CUresult fake_cuGraphExecDestroy(CUgraphExec exec) {
  State& s = state();
  std::lock_guard lock(s.mu);
  if (!s.execs.erase(exec)) return CUDA_ERROR_INVALID_HANDLE;
  delete reinterpret_cast<Exec*>(exec);
  --s.live;
  return CUDA_SUCCESS;
}

CUresult fake_cuGraphDestroy(CUgraph graph) {
  State& s = state();
  std::lock_guard lock(s.mu);
  auto* g = reinterpret_cast<Graph*>(graph);
  if (!s.graphs.erase(g)) return CUDA_ERROR_INVALID_HANDLE;
  delete g;
  --s.live;
  return CUDA_SUCCESS;
}

// ---- Virtual memory management -------------------------------------------------------

bool valid_prop(const CUmemAllocationProp* prop, int devices) {
  return prop && prop->type == CU_MEM_ALLOCATION_TYPE_PINNED && prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE &&
         prop->location.id >= 0 && prop->location.id < devices;
}

CUresult fake_cuMemGetAllocationGranularity(std::size_t* g, const CUmemAllocationProp* prop,
                                            CUmemAllocationGranularity_flags) {
  if (!state().initialised) return CUDA_ERROR_NOT_INITIALIZED;
  if (!g || !valid_prop(prop, state().devices)) return CUDA_ERROR_INVALID_VALUE;
  *g = kGranularity;
  return CUDA_SUCCESS;
}

CUresult fake_cuMemAddressReserve(CUdeviceptr* ptr, std::size_t size, std::size_t alignment, CUdeviceptr addr,
                                  unsigned long long flags) {
  if (CUresult r = need_context()) return r;
  if (!ptr || size == 0 || size % kGranularity || addr != 0 || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  alignment = std::max(alignment, kGranularity);
  if (alignment & (alignment - 1)) return CUDA_ERROR_INVALID_VALUE;
  const std::size_t span = size + alignment;
  void* base = mmap(nullptr, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  const std::uint64_t at = (reinterpret_cast<std::uint64_t>(base) + alignment - 1) & ~(alignment - 1);
  State& s = state();
  std::unique_lock lock(s.memory_mu);
  s.reserved[at] = Reservation{size, base, span};
  ++s.live;
  *ptr = at;
  return CUDA_SUCCESS;
}

CUresult fake_cuMemAddressFree(CUdeviceptr ptr, std::size_t size) {
  if (CUresult r = need_context()) return r;
  State& s = state();
  std::unique_lock lock(s.memory_mu);
  auto it = s.reserved.find(ptr);
  if (it == s.reserved.end() || it->second.size != size) return CUDA_ERROR_INVALID_VALUE;
  auto m = s.mapped.lower_bound(ptr);
  if (m != s.mapped.end() && m->first < ptr + size) return CUDA_ERROR_ILLEGAL_STATE;  // still mapped
  munmap(it->second.base, it->second.span);
  s.reserved.erase(it);
  --s.live;
  return CUDA_SUCCESS;
}

CUresult fake_cuMemCreate(CUmemGenericAllocationHandle* handle, std::size_t size, const CUmemAllocationProp* prop,
                          unsigned long long flags) {
  if (CUresult r = need_context()) return r;
  State& s = state();
  std::lock_guard lock(s.mu);
  if (!handle || flags != 0 || size == 0 || size % kGranularity || !valid_prop(prop, s.devices))
    return CUDA_ERROR_INVALID_VALUE;
  const int d = prop->location.id;
  if (s.used[d] + size > s.memory) return CUDA_ERROR_OUT_OF_MEMORY;
  s.used[d] += size;
  *handle = s.next_handle++;
  s.chunks[*handle] = Chunk{size, d, false};
  ++s.live;
  return CUDA_SUCCESS;
}

CUresult fake_cuMemRelease(CUmemGenericAllocationHandle handle) {
  if (CUresult r = need_context()) return r;
  State& s = state();
  std::lock_guard lock(s.mu);
  auto it = s.chunks.find(handle);
  if (it == s.chunks.end()) return CUDA_ERROR_INVALID_VALUE;
  if (it->second.mapped) return CUDA_ERROR_ILLEGAL_STATE;  // the stand-in's rule: unmap first
  s.used[it->second.device] -= it->second.size;
  s.chunks.erase(it);
  --s.live;
  return CUDA_SUCCESS;
}

// Whether [ptr, ptr + size) lies inside one reservation; caller holds memory_mu.
bool inside_reservation(const State& s, std::uint64_t ptr, std::uint64_t size) {
  auto it = s.reserved.upper_bound(ptr);
  if (it == s.reserved.begin()) return false;
  --it;
  return ptr >= it->first && ptr + size <= it->first + it->second.size;
}

CUresult fake_cuMemMap(CUdeviceptr ptr, std::size_t size, std::size_t offset, CUmemGenericAllocationHandle handle,
                       unsigned long long flags) {
  if (CUresult r = need_context()) return r;
  if (offset != 0 || flags != 0 || ptr % kGranularity) return CUDA_ERROR_INVALID_VALUE;
  State& s = state();
  std::lock_guard lock(s.mu);
  auto c = s.chunks.find(handle);
  if (c == s.chunks.end() || c->second.size != size) return CUDA_ERROR_INVALID_VALUE;
  if (c->second.mapped) return CUDA_ERROR_ILLEGAL_STATE;
  std::unique_lock mlock(s.memory_mu);
  if (!inside_reservation(s, ptr, size)) return CUDA_ERROR_INVALID_VALUE;
  auto m = s.mapped.lower_bound(ptr);
  if (m != s.mapped.end() && m->first < ptr + size) return CUDA_ERROR_ALREADY_MAPPED;
  if (m != s.mapped.begin() && std::prev(m)->first + std::prev(m)->second.size > ptr) return CUDA_ERROR_ALREADY_MAPPED;
  s.mapped[ptr] = Mapping{size, handle, false};
  c->second.mapped = true;
  return CUDA_SUCCESS;
}

CUresult fake_cuMemSetAccess(CUdeviceptr ptr, std::size_t size, const CUmemAccessDesc* desc, std::size_t count) {
  if (CUresult r = need_context()) return r;
  if (!desc || count != 1 || desc->location.type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
  const bool rw = desc->flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  State& s = state();
  std::unique_lock lock(s.memory_mu);
  // Every mapping in the range, which must be covered exactly.
  std::uint64_t at = ptr;
  auto m = s.mapped.find(ptr);
  std::vector<Mapping*> ms;
  while (at < ptr + size) {
    if (m == s.mapped.end() || m->first != at) return CUDA_ERROR_INVALID_VALUE;
    ms.push_back(&m->second);
    at += m->second.size;
    ++m;
  }
  if (at != ptr + size) return CUDA_ERROR_INVALID_VALUE;
  if (mprotect(reinterpret_cast<void*>(ptr), size, rw ? PROT_READ | PROT_WRITE : PROT_NONE) != 0)
    return CUDA_ERROR_OUT_OF_MEMORY;
  for (Mapping* x : ms) x->accessible = rw;
  return CUDA_SUCCESS;
}

CUresult fake_cuMemUnmap(CUdeviceptr ptr, std::size_t size) {
  if (CUresult r = need_context()) return r;
  State& s = state();
  std::lock_guard lock(s.mu);
  std::unique_lock mlock(s.memory_mu);
  auto m = s.mapped.find(ptr);
  if (m == s.mapped.end() || m->second.size != size) return CUDA_ERROR_INVALID_VALUE;
  // Drop the pages and make the range unreadable again.
  madvise(reinterpret_cast<void*>(ptr), size, MADV_DONTNEED);
  mprotect(reinterpret_cast<void*>(ptr), size, PROT_NONE);
  if (auto c = s.chunks.find(m->second.handle); c != s.chunks.end()) c->second.mapped = false;
  s.mapped.erase(m);
  return CUDA_SUCCESS;
}

// ---- What the benchmarks' raw baseline adds (bench/src/raw_cuda.cpp) -------------------

CUresult fake_cuMemAlloc(CUdeviceptr* out, std::size_t size) {
  if (CUresult r = need_context()) return r;
  if (!out || size == 0) return CUDA_ERROR_INVALID_VALUE;
  State& s = state();
  const int d = current.back()->device;
  const std::size_t span = (size + 4095) & ~std::size_t{4095};
  std::lock_guard lock(s.mu);
  if (s.used[d] + span > s.memory) return CUDA_ERROR_OUT_OF_MEMORY;
  void* p = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  const auto at = reinterpret_cast<std::uint64_t>(p);
  std::unique_lock mlock(s.memory_mu);
  s.mapped[at] = Mapping{span, 0, true};
  s.allocations[at] = {span, d};
  s.used[d] += span;
  ++s.live;
  *out = at;
  return CUDA_SUCCESS;
}

CUresult fake_cuMemFree(CUdeviceptr p) {
  if (CUresult r = need_context()) return r;
  State& s = state();
  std::lock_guard lock(s.mu);
  std::unique_lock mlock(s.memory_mu);
  auto it = s.allocations.find(p);
  if (it == s.allocations.end()) return CUDA_ERROR_INVALID_VALUE;
  const auto [span, d] = it->second;
  munmap(reinterpret_cast<void*>(p), span);
  s.mapped.erase(p);
  s.allocations.erase(it);
  s.used[d] -= span;
  --s.live;
  return CUDA_SUCCESS;
}

struct Module;
struct Function {
  Module* module;
  std::string name;
  KernelKind kind = KernelKind::Empty;
  const tpuhal::cuda::k::HostKernel* host = nullptr;
};
struct Module {
  std::vector<std::unique_ptr<Function>> entries;
};

constexpr std::uint32_t kFatbinMagic = 0xba55ed50;  // the first word of an nvcc fatbin

CUresult add_module(std::unique_ptr<Module> m, CUmodule* out);

// Takes PTX text (and finds its .entry names) or the shim's fatbin (KernelKind says
// what each does when it runs).
CUresult fake_cuModuleLoadData(CUmodule* out, const void* image) {
  if (CUresult r = need_context()) return r;
  if (!out || !image) return CUDA_ERROR_INVALID_VALUE;
  if (state().refuse_modules) return CUDA_ERROR_NO_BINARY_FOR_GPU;
  auto m = std::make_unique<Module>();
  std::uint32_t magic = 0;
  std::memcpy(&magic, image, sizeof magic);
  if (magic == kFatbinMagic) {
    // The shim's tensor-op kernels: their host build, by name.
    for (const auto& k : tpuhal::cuda::k::host_kernels())
      m->entries.push_back(std::make_unique<Function>(Function{m.get(), k.name, KernelKind::Host, &k}));
    return add_module(std::move(m), out);
  }
  const std::string ptx(static_cast<const char*>(image));
  if (ptx.find(".version") == std::string::npos) return CUDA_ERROR_INVALID_IMAGE;
  for (std::size_t at = ptx.find(".entry"); at != std::string::npos; at = ptx.find(".entry", at + 6)) {
    std::size_t b = ptx.find_first_not_of(" \t", at + 6), e = ptx.find_first_of("( \t\n", b);
    if (b == std::string::npos || e == std::string::npos) return CUDA_ERROR_INVALID_PTX;
    const std::string name = ptx.substr(b, e - b);
    const KernelKind kind = name == "tpuhal_stamp"         ? KernelKind::Stamp
                            : name == "tpuhal_fence_stamp" ? KernelKind::FenceStamp
                                                           : KernelKind::Empty;
    m->entries.push_back(std::make_unique<Function>(Function{m.get(), name, kind}));
  }
  return add_module(std::move(m), out);
}

CUresult add_module(std::unique_ptr<Module> m, CUmodule* out) {
  State& s = state();
  std::lock_guard lock(s.mu);
  for (auto& f : m->entries) s.functions.insert(f.get());
  s.modules.insert(m.get());
  ++s.live;
  *out = reinterpret_cast<CUmodule>(m.release());
  return CUDA_SUCCESS;
}

CUresult fake_cuModuleGetFunction(CUfunction* out, CUmodule module, const char* name) {
  if (CUresult r = need_context()) return r;
  State& s = state();
  std::lock_guard lock(s.mu);
  auto* m = reinterpret_cast<Module*>(module);
  if (!s.modules.count(m)) return CUDA_ERROR_INVALID_HANDLE;
  for (auto& f : m->entries)
    if (f->name == name) {
      *out = reinterpret_cast<CUfunction>(f.get());
      return CUDA_SUCCESS;
    }
  return CUDA_ERROR_NOT_FOUND;
}

CUresult fake_cuModuleUnload(CUmodule module) {
  if (CUresult r = need_context()) return r;
  State& s = state();
  std::lock_guard lock(s.mu);
  auto* m = reinterpret_cast<Module*>(module);
  if (!s.modules.erase(m)) return CUDA_ERROR_INVALID_HANDLE;
  for (auto& f : m->entries) s.functions.erase(f.get());
  delete m;
  --s.live;
  return CUDA_SUCCESS;
}

CUresult fake_cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                             unsigned shared, CUstream stream, void** params, void** extra) {
  {
    State& s = state();
    std::lock_guard lock(s.mu);
    if (!s.functions.count(reinterpret_cast<const void*>(f))) return CUDA_ERROR_INVALID_HANDLE;
  }
  if (!gx || !gy || !gz || !bx || !by || !bz || std::uint64_t{bx} * by * bz > 1024 || shared > 48 * 1024 ||
      (params && extra))
    return CUDA_ERROR_INVALID_VALUE;
  const auto* fn = reinterpret_cast<const Function*>(f);
  Op op;
  op.kind = Op::Kernel;
  op.flags = fn->kind;
  if (fn->kind != KernelKind::Empty) {
    if (!params || !params[0] || (fn->kind == KernelKind::FenceStamp && !params[1])) return CUDA_ERROR_INVALID_VALUE;
    if (fn->kind == KernelKind::Host) {
      const auto* p = static_cast<const unsigned char*>(params[0]);
      op.host = fn->host;
      op.params = std::make_shared<const std::vector<unsigned char>>(p, p + fn->host->params);
    } else {
      std::memcpy(&op.dst, params[0], 8);
      if (fn->kind == KernelKind::FenceStamp) std::memcpy(&op.value, params[1], 8);
    }
  }
  return submit(stream, std::move(op), 0, 0);
}

// ---- Resolution --------------------------------------------------------------------

struct Entry {
  const char* name;
  void* fn;
};

// Exactly the lists of the shim and of the benchmarks' raw baseline, each
// checked against the type its caller casts it to: a signature that drifts
// fails to compile here.
const Entry kEntries[] = {
#define TPUHAL_CUDA_ENTRY(name, type) {#name, reinterpret_cast<void*>(static_cast<type>(&fake_##name))},
#include "entry_points.inc"
#include "raw_cuda_entries.inc"
#undef TPUHAL_CUDA_ENTRY
};

int driver_version() { return static_cast<int>(env_number("TPUHAL_FAKE_CUDA_VERSION", 12080)); }

}  // namespace

extern "C" {

__attribute__((visibility("default"))) CUresult CUDAAPI cuDriverGetVersion(int* version) {
  if (!version) return CUDA_ERROR_INVALID_VALUE;
  *version = driver_version();
  return CUDA_SUCCESS;
}

__attribute__((visibility("default"))) CUresult CUDAAPI cuGetProcAddress_v2(const char* symbol, void** pfn, int version,
                                                                            cuuint64_t,
                                                                            CUdriverProcAddressQueryResult* status) {
  if (!symbol || !pfn) return CUDA_ERROR_INVALID_VALUE;
  *pfn = nullptr;
  CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  CUresult r = CUDA_ERROR_NOT_FOUND;
  for (const Entry& e : kEntries)
    if (std::strcmp(e.name, symbol) == 0) {
      if (version > driver_version()) {
        found = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
      } else {
        found = CU_GET_PROC_ADDRESS_SUCCESS;
        *pfn = e.fn;
        r = CUDA_SUCCESS;
      }
      break;
    }
  if (status) *status = found;
  return r;
}

__attribute__((visibility("default"))) void tpuhal_fake_cuda_fail(int code) { state().armed.store(code); }

// For the stand-in cuBLAS (fake_cublas.cpp): queues `kernel` with a copy of
// its parameters on `stream` (or into its capture), as a kernel launch.
__attribute__((visibility("default"))) CUresult tpuhal_fake_cuda_launch_host(CUstream stream,
                                                                             const tpuhal::cuda::k::HostKernel* kernel,
                                                                             const void* params) {
  if (!kernel || !params) return CUDA_ERROR_INVALID_VALUE;
  Op op;
  op.kind = Op::Kernel;
  op.flags = KernelKind::Host;
  op.host = kernel;
  const auto* p = static_cast<const unsigned char*>(params);
  op.params = std::make_shared<const std::vector<unsigned char>>(p, p + kernel->params);
  return submit(stream, std::move(op), 0, 0);
}

__attribute__((visibility("default"))) void tpuhal_fake_cuda_reset() {
  state().armed.store(0);
  state().refuse_modules.store(false);
}

__attribute__((visibility("default"))) void tpuhal_fake_cuda_refuse_modules(int refuse) {
  state().refuse_modules.store(refuse != 0);
}

__attribute__((visibility("default"))) unsigned long long tpuhal_fake_cuda_live_allocations() {
  return state().live.load();
}

}  // extern "C"
