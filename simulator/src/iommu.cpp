#include "tpuhal/base/hex.h"
#include "tpuhal/sim/iommu.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <thread>

#include "dram_writes.h"
#include "tpuhal/base/wait.h"
#include "tpuhal/fw/command.h"

namespace tpuhal::sim {
namespace {}  // namespace

DmaContext::DmaContext(IommuDomain& domain) : domain_(domain) {
  std::lock_guard lock(domain_.mu_);
  domain_.contexts_.push_back(this);
}

DmaContext::~DmaContext() {
  std::lock_guard lock(domain_.mu_);
  auto& v = domain_.contexts_;
  v.erase(std::remove(v.begin(), v.end(), this), v.end());
}

DmaAccess::DmaAccess(DmaContext& ctx) noexcept : ctx_(ctx) {
  auto& gen = ctx.domain_.generation_;
  for (;;) {
    generation_ = gen.load(std::memory_order_seq_cst);
    ctx_.active_generation_.store(generation_, std::memory_order_seq_cst);
    if (gen.load(std::memory_order_seq_cst) == generation_) break;
  }
}

DmaAccess::~DmaAccess() {
  ctx_.active_generation_.store(0, std::memory_order_release);
  if (dram_log_) dram_log_->wrote(dram_begin_, dram_end_ - dram_begin_);
}

void DmaAccess::writes_dram(DramWrites& log, std::uint64_t address, std::uint64_t size) noexcept {
  log.wrote(address, size);
  if (!dram_log_) {
    dram_log_ = &log;
    dram_begin_ = address;
    dram_end_ = address + size;
    return;
  }
  dram_begin_ = std::min(dram_begin_, address);
  dram_end_ = std::max(dram_end_, address + size);
}

const DmaContext::CacheEntry* DmaAccess::find(std::uint64_t iova, std::uint64_t size) {
  if (size == 0 || iova > UINT64_MAX - size) return nullptr;
  for (auto& e : ctx_.cache_) {
    if (e.generation == generation_ && iova >= e.iova && iova + size <= e.iova + e.size) return &e;
  }
  IommuDomain& d = ctx_.domain_;
  std::lock_guard lock(d.mu_);
  auto it = d.windows_.upper_bound(iova);
  if (it == d.windows_.begin()) return nullptr;
  --it;
  const std::uint64_t base = it->first;
  const auto& w = it->second;
  if (iova + size > base + w.size) return nullptr;
  // Cache under the generation the table has now: if it moved since this
  // access began, the entry is simply never hit by this access.
  auto& slot = ctx_.cache_[ctx_.next_victim_++ % 4];
  slot = {d.generation_.load(std::memory_order_relaxed), base, w.size, w.host, w.access};
  return &slot;
}

std::byte* DmaAccess::translate(std::uint64_t iova, std::uint64_t size, std::uint32_t access) {
  const DmaContext::CacheEntry* e = find(iova, size);
  if (!e || !e->host || (e->access & access) != access) return nullptr;
  return e->host + (iova - e->iova);
}

bool DmaAccess::permits(std::uint64_t iova, std::uint64_t size, std::uint32_t access) {
  const DmaContext::CacheEntry* e = find(iova, size);
  return e && (e->access & access) == access;
}

std::string IommuDomain::map(std::uint64_t iova, void* host, std::uint64_t size, std::uint32_t access) {
  if (size == 0 || size % kIommuPage || iova % kIommuPage || reinterpret_cast<std::uintptr_t>(host) % kIommuPage)
    return "IOVA " + hex(iova) + ", host address and size " + std::to_string(size) +
           " must be non-zero multiples of 4096";
  if (iova < fw::kHostWindowBase || iova > fw::kHostWindowEnd || size > fw::kHostWindowEnd - iova)
    return "IOVA range " + hex(iova) + "+" + hex(size) + " is outside the host window " + hex(fw::kHostWindowBase) +
           ".." + hex(fw::kHostWindowEnd);
  if (access == 0 || (access & ~(kIommuRead | kIommuWrite)))
    return "access flags " + std::to_string(access) + " must be read, write or both";
  std::lock_guard lock(mu_);
  auto next = windows_.lower_bound(iova);
  if (next != windows_.end() && next->first < iova + size)
    return "IOVA range " + hex(iova) + "+" + hex(size) + " overlaps the mapping at " + hex(next->first);
  if (next != windows_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second.size > iova)
      return "IOVA range " + hex(iova) + "+" + hex(size) + " overlaps the mapping at " + hex(prev->first);
  }
  windows_.emplace(iova, Window{size, static_cast<std::byte*>(host), access});
  mapped_bytes_ += size;
  generation_.fetch_add(1, std::memory_order_seq_cst);
  return {};
}

std::string IommuDomain::unmap(std::uint64_t iova, std::uint64_t size) {
  std::uint64_t new_generation;
  {
    std::lock_guard lock(mu_);
    auto it = windows_.find(iova);
    if (it == windows_.end()) return "no mapping starts at IOVA " + hex(iova);
    if (it->second.size != size)
      return "the mapping at IOVA " + hex(iova) + " is " + std::to_string(it->second.size) + " bytes, not " +
             std::to_string(size);
    mapped_bytes_ -= size;
    windows_.erase(it);
    new_generation = generation_.fetch_add(1, std::memory_order_seq_cst) + 1;
  }
  wait_for_grace_period(new_generation);
  return {};
}

void IommuDomain::unmap_all() {
  std::uint64_t new_generation;
  {
    std::lock_guard lock(mu_);
    windows_.clear();
    mapped_bytes_ = 0;
    new_generation = generation_.fetch_add(1, std::memory_order_seq_cst) + 1;
  }
  wait_for_grace_period(new_generation);
}

void IommuDomain::wait_for_grace_period(std::uint64_t new_generation) {
  // Every access that began before the table changed carries an older
  // generation; wait until none is left. Accesses are bounded (one command's
  // transfer), so this terminates. The lock is dropped between scans because
  // a context inside an access may need it to translate.
  std::unique_lock lock(mu_);
  for (unsigned round = 0;; ++round) {
    bool busy = false;
    for (DmaContext* ctx : contexts_) {
      const auto g = ctx->active_generation_.load(std::memory_order_seq_cst);
      if (g != 0 && g < new_generation) {
        busy = true;
        break;
      }
    }
    if (!busy) return;
    lock.unlock();
    if (round < 256)
      base::cpu_relax();
    else
      std::this_thread::yield();
    lock.lock();
  }
}

std::size_t IommuDomain::mapping_count() const {
  std::lock_guard lock(mu_);
  return windows_.size();
}

std::uint64_t IommuDomain::mapped_bytes() const {
  std::lock_guard lock(mu_);
  return mapped_bytes_;
}

}  // namespace tpuhal::sim
