// oneDNN objects the tensor engine keeps: one CPU engine and stream, and
// the thread count its OpenMP regions use. Internal to the simulator.
#pragma once

#include <cstdint>
#include <cstring>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "../dram_writes.h"

namespace tpuhal::sim::tensor {

struct DnnlState {
  // `writes`: the board's DRAM write log, or null (kept weights are
  // compared on every lookup).
  DnnlState(unsigned n, const DramWrites* writes) : threads(static_cast<int>(n)), dram_writes(writes) {
    // No VTune JIT profiling: otherwise each thread that generates its first
    // kernel tries to dlopen the profiler's libJitPI.so, and the failed
    // dlopen leaves glibc's per-thread error buffer behind (which
    // LeakSanitizer reports when the process exits at the wrong moment).
    dnnl::set_jit_profiling_flags(0);
  }
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  int threads;
  const DramWrites* dram_writes;
  // oneDNN runs its loops on OpenMP threads of the calling thread; each
  // command processor sets its own team size before calling.
  void bind_threads() const;

  // Weights reordered into a primitive's preferred layout, reused while the
  // bytes they came from are unchanged (checked byte for byte unless the
  // DRAM write log shows no write since the last check, so a model whose
  // weights are rewritten in place is never served stale ones).
  struct Reordered {
    KeptSource kept;  // the weights as they were
    dnnl::memory memory;
    std::size_t memory_bytes = 0;  // memory's size
    std::uint64_t used = 0;        // `lookups` when last served or stored
    std::uint64_t serial = 0;      // the floats' serial it was reordered from, if any
  };
  // `key` names the weights' address and layouts; `bytes` is the weights'
  // dense span. Returns the cached memory or null.
  // `serial`: nonzero, the weights are floats the caller keeps, named by
  // that serial (PackedCache::find): the entry serves if it was reordered
  // from the floats of the same serial, without comparing bytes, and never
  // otherwise, whatever the floats' address. Zero: their bytes are compared.
  const dnnl::memory* cached_weights(const std::string& key, const std::byte* bytes, std::size_t size,
                                     std::uint64_t serial = 0) {
    ++lookups;
    auto it = weights.find(key);
    if (it == weights.end() || it->second.kept.source.size() != size ||
        (serial ? it->second.serial != serial : !it->second.kept.holds(dram_writes, bytes, size)))
      return nullptr;
    it->second.used = lookups;
    return &it->second.memory;
  }
  // Weights past `capacity` (the source bytes and the reordered
  // ones) are kept only in room that idle entries leave: those no lookup
  // has served for 4 * (entries + 256) lookups (a model run no more, or
  // weights freed). Otherwise the first ones a model runs stay, where
  // emptying the cache would make a model larger than it miss on every
  // layer of every run.
  // `serial`: as cached_weights'.
  void remember_weights(const std::string& key, const std::byte* bytes, std::size_t size, dnnl::memory m,
                        std::uint64_t serial = 0) {
    const std::size_t reordered = m.get_desc().get_size();
    const auto fits = [&] {
      const auto it = weights.find(key);
      const std::size_t kept = it == weights.end() ? 0 : it->second.kept.source.size() + it->second.memory_bytes;
      return cached_bytes - kept + size + reordered <= capacity;
    };
    if (!fits()) {
      const std::uint64_t idle = 4 * (weights.size() + 256);
      for (auto it = weights.begin(); it != weights.end();)
        if (it->first != key && lookups - it->second.used > idle) {
          cached_bytes -= it->second.kept.source.size() + it->second.memory_bytes;
          it = weights.erase(it);
        } else {
          ++it;
        }
      if (!fits()) {
        // Not kept: nor may an entry kept from other bytes stay under
        // this key.
        if (const auto it = weights.find(key); it != weights.end()) {
          cached_bytes -= it->second.kept.source.size() + it->second.memory_bytes;
          weights.erase(it);
        }
        return;
      }
    }
    auto& e = weights[key];
    cached_bytes = cached_bytes - (e.kept.source.size() + e.memory_bytes) + size + reordered;
    e.memory_bytes = reordered;
    e.used = lookups;
    e.serial = serial;
    e.kept.keep(dram_writes, bytes, size);
    e.memory = std::move(m);
  }
  // Convolution primitives by their full description: creating the
  // descriptor and looking up the primitive costs tens of microseconds,
  // a noticeable share of a small int8 convolution.
  // A oneDNN primitive must be destroyed on the thread that made it while
  // that thread lives (else oneDNN 2.6 loses a small per-thread block), so
  // each remembers its maker and release_thread() drops a thread's own.
  struct Conv {
    dnnl::convolution_forward::primitive_desc pd;
    dnnl::convolution_forward primitive;
    dnnl::memory scratchpad;  // scratchpad_mode::user: runs use the engine's lock
    std::thread::id maker;
    // Where the primitive writes in a layout of its own choosing (empty:
    // straight into the caller's), and the reorder into the caller's.
    dnnl::memory dst;
    dnnl::reorder to_user;
    // Whether the primitive wants the weights in another layout than the
    // caller's, and that layout's hash (part of the reordered weights' key),
    // found when the primitive is made.
    bool reorders_weights = false;
    std::size_t weights_layout = 0;
    // The run's arguments, made with the primitive (oneDNN allocates for
    // each memory object): a run sets where each one is and executes with
    // `args`, which holds them (and the weights the run uses).
    dnnl::memory x, y, w_user, bias, src_zero;
    std::unordered_map<int, dnnl::memory> args;
  };
  std::unordered_map<std::string, Conv> convs;
  // Convolutions that dnnl_conv() will not run on oneDNN's choice of
  // implementation (a reference one for fused requantisation, a wrong one
  // for some grouped int8 geometries); not tried again.
  std::unordered_set<std::string> refused;
  void release_thread() {
    const auto me = std::this_thread::get_id();
    for (auto it = convs.begin(); it != convs.end();) it = it->second.maker == me ? convs.erase(it) : std::next(it);
  }

  // ResNet-50's f32 weights, and those reordered for oneDNN's NHWC
  // kernels, take about 200 MB.
  static constexpr std::size_t kWeightCacheBytes = std::size_t{320} << 20;
  std::size_t capacity = kWeightCacheBytes;
  std::unordered_map<std::string, Reordered> weights;
  std::size_t cached_bytes = 0;
  std::uint64_t lookups = 0;  // cached_weights calls so far
};

}  // namespace tpuhal::sim::tensor
