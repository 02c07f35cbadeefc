#include "dma_engine.h"

#include <atomic>
#include <cstring>

namespace tpuhal::sim {
namespace {

fw::Problem ok() { return {}; }

fw::Problem fault(std::uint16_t field, std::uint64_t addr, std::uint32_t kind) {
  return {fw::CmdStatus::kDmaFault, field, addr,
          kind == kIommuWrite ? fw::kAccessWrite : fw::kAccessRead};
}

bool tick(const DmaEngine::Hooks& hooks) {
  // The command processor is the only writer of its progress counter.
  if (hooks.progress)
    hooks.progress->store(hooks.progress->load(std::memory_order_relaxed) + 1,
                          std::memory_order_relaxed);
  return !(hooks.stop && hooks.stop->load(std::memory_order_relaxed));
}

void fill_pattern(std::byte* dst, std::uint64_t size, std::uint32_t pattern, std::uint32_t width) {
  if (width == 1) {
    std::memset(dst, static_cast<int>(pattern), size);
    return;
  }
  // Replicate the pattern into a 64-byte block, then copy blocks.
  std::byte block[64];
  for (std::size_t i = 0; i < sizeof block; i += width) std::memcpy(block + i, &pattern, width);
  std::uint64_t done = 0;
  while (size - done >= sizeof block) {
    std::memcpy(dst + done, block, sizeof block);
    done += sizeof block;
  }
  std::memcpy(dst + done, block, size - done);
}

}  // namespace

void DmaEngine::poison(std::uint64_t addr, std::uint64_t size) {
  std::lock_guard lock(poison_mu_);
  poison_.emplace_back(addr, addr + size);
  any_poison_.store(true, std::memory_order_release);
}

void DmaEngine::clear_poison() noexcept {
  std::lock_guard lock(poison_mu_);
  poison_.clear();
  any_poison_.store(false, std::memory_order_release);
}

std::optional<std::uint64_t> DmaEngine::poisoned(std::uint64_t addr, std::uint64_t size) const {
  if (!any_poison_.load(std::memory_order_acquire) || addr >= dram_size_) return std::nullopt;
  const std::uint64_t end = size > dram_size_ - addr ? dram_size_ : addr + size;
  std::optional<std::uint64_t> first;
  std::lock_guard lock(poison_mu_);
  for (const auto& [b, e] : poison_)
    if (b < end && e > addr) {
      const std::uint64_t at = b > addr ? b : addr;
      if (!first || at < *first) first = at;
    }
  return first;
}

fw::Problem DmaEngine::check_read(std::uint64_t addr, std::uint64_t size, std::uint16_t field) const {
  if (auto bad = poisoned(addr, size)) return {fw::CmdStatus::kEccError, field, *bad, fw::kAccessRead};
  return ok();
}

std::byte* DmaEngine::resolve(DmaAccess& access, std::uint64_t addr, std::uint64_t size,
                              std::uint32_t kind) const noexcept {
  if (size == 0) return nullptr;
  if (addr < dram_size_) return size <= dram_size_ - addr ? dram_ + addr : nullptr;
  if (fw::is_host_address(addr)) return access.translate(addr, size, kind);
  return nullptr;
}

fw::Problem DmaEngine::copy(DmaContext& ctx, std::uint64_t src, std::uint64_t dst,
                            std::uint64_t size, std::uint16_t src_field, std::uint16_t dst_field,
                            const Hooks& hooks) const {
  // Overlapping ranges copy back to front when dst is above src, so that
  // chunking keeps memmove semantics.
  const bool backward = dst > src && dst - src < size;
  if (auto p = check_read(src, size, src_field); p.status != fw::CmdStatus::kOk) return p;
  std::uint64_t done = 0;
  while (done < size) {
    const std::uint64_t n = size - done < kChunk ? size - done : kChunk;
    const std::uint64_t off = backward ? size - done - n : done;
    {
      DmaAccess access(ctx);
      std::byte* s = resolve(access, src + off, n, kIommuRead);
      if (!s) return fault(src_field, src + off, kIommuRead);
      std::byte* d = resolve(access, dst + off, n, kIommuWrite);
      if (!d) return fault(dst_field, dst + off, kIommuWrite);
      std::memmove(d, s, n);
    }
    done += n;
    if (!tick(hooks)) return {fw::CmdStatus::kQueueReset, fw::Problem::kNoField, done, size};
  }
  return ok();
}

fw::Problem DmaEngine::fill(DmaContext& ctx, std::uint64_t dst, std::uint64_t size,
                            std::uint32_t pattern, std::uint32_t width, std::uint16_t dst_field,
                            const Hooks& hooks) const {
  std::uint64_t done = 0;
  while (done < size) {
    const std::uint64_t n = size - done < kChunk ? size - done : kChunk;  // kChunk % 4 == 0
    {
      DmaAccess access(ctx);
      std::byte* d = resolve(access, dst + done, n, kIommuWrite);
      if (!d) return fault(dst_field, dst + done, kIommuWrite);
      fill_pattern(d, n, pattern, width);
    }
    done += n;
    if (!tick(hooks)) return {fw::CmdStatus::kQueueReset, fw::Problem::kNoField, done, size};
  }
  return ok();
}

fw::Problem DmaEngine::read(DmaContext& ctx, std::uint64_t src, void* out, std::uint64_t size,
                            std::uint16_t field) const {
  if (auto p = check_read(src, size, field); p.status != fw::CmdStatus::kOk) return p;
  DmaAccess access(ctx);
  std::byte* s = resolve(access, src, size, kIommuRead);
  if (!s) return fault(field, src, kIommuRead);
  std::memcpy(out, s, size);
  return ok();
}

fw::Problem DmaEngine::load64(DmaContext& ctx, std::uint64_t addr, std::uint64_t& out,
                              std::uint16_t field) const {
  if (auto bad = check_read(addr, 8, field); bad.status != fw::CmdStatus::kOk) return bad;
  DmaAccess access(ctx);
  std::byte* p = resolve(access, addr, 8, kIommuRead);
  if (!p) return fault(field, addr, kIommuRead);
  out = std::atomic_ref<std::uint64_t>(*reinterpret_cast<std::uint64_t*>(p))
            .load(std::memory_order_acquire);
  return ok();
}

fw::Problem DmaEngine::store64(DmaContext& ctx, std::uint64_t addr, std::uint64_t value,
                               std::uint16_t field) const {
  DmaAccess access(ctx);
  std::byte* p = resolve(access, addr, 8, kIommuWrite);
  if (!p) return fault(field, addr, kIommuWrite);
  std::atomic_ref<std::uint64_t>(*reinterpret_cast<std::uint64_t*>(p))
      .store(value, std::memory_order_seq_cst);
  return ok();
}

}  // namespace tpuhal::sim
