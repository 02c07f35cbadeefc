#include "dma_engine.h"

#include <atomic>
#include <cstring>
#include <vector>

namespace tpuhal::sim {
namespace {

fw::Problem ok() { return {}; }

fw::Problem fault(std::uint16_t field, std::uint64_t addr, std::uint32_t kind) {
  return {fw::CmdStatus::kDmaFault, field, addr, kind == kIommuWrite ? fw::kAccessWrite : fw::kAccessRead};
}

bool tick(const DmaEngine::Hooks& hooks) {
  // The command processor is the only writer of its progress counter.
  if (hooks.progress)
    hooks.progress->store(hooks.progress->load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
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
  if (addr < dram_size_) {
    if (size > dram_size_ - addr) return nullptr;
    if (kind & kIommuWrite) access.writes_dram(writes_, addr, size);
    return dram_ + addr;
  }
  if (fw::is_host_address(addr)) return access.translate(addr, size, kind);
  return nullptr;
}

fw::Problem DmaEngine::copy_remote(DmaContext& ctx, std::uint64_t src, std::uint64_t dst, std::uint64_t size,
                                   std::uint16_t src_field, std::uint16_t dst_field) const {
  // The permission checks take a DmaAccess; the transfer does not, because no
  // host pointer is involved and the host's own table is the authority (it
  // refuses a range unmapped meanwhile). Holding an access across the
  // transfer would make the board's unmap, which arrives on the same link as
  // the answers this transfer waits for, wait for it.
  std::byte *s = nullptr, *d = nullptr;
  {
    DmaAccess access(ctx);
    if (remote(src) ? !access.permits(src, size, kIommuRead) : !(s = resolve(access, src, size, kIommuRead)))
      return fault(src_field, src, kIommuRead);
    if (remote(dst) ? !access.permits(dst, size, kIommuWrite) : !(d = resolve(access, dst, size, kIommuWrite)))
      return fault(dst_field, dst, kIommuWrite);
  }
  if (!s) {  // from the host: into DRAM directly, or through a bounce buffer
    std::vector<std::byte> bounce(d ? 0 : size);
    std::byte* to = d ? d : bounce.data();
    const bool read = port_->read(src, to, size, ctx.abandon());
    if (d) writes_.wrote(dst, size);  // written after the access ended
    if (!read) return fault(src_field, src, kIommuRead);
    if (d) return ok();
    s = bounce.data();
    return port_->write(dst, s, size) ? ok() : fault(dst_field, dst, kIommuWrite);
  }
  return port_->write(dst, s, size) ? ok() : fault(dst_field, dst, kIommuWrite);
}

fw::Problem DmaEngine::copy(DmaContext& ctx, std::uint64_t src, std::uint64_t dst, std::uint64_t size,
                            std::uint16_t src_field, std::uint16_t dst_field, const Hooks& hooks) const {
  // Overlapping ranges copy back to front when dst is above src, so that
  // chunking keeps memmove semantics.
  const bool backward = dst > src && dst - src < size;
  if (auto p = check_read(src, size, src_field); p.status != fw::CmdStatus::kOk) return p;
  const bool through_port = remote(src) || remote(dst);
  const std::uint64_t chunk = through_port ? kRemoteChunk : kChunk;
  std::uint64_t done = 0;
  while (done < size) {
    const std::uint64_t n = size - done < chunk ? size - done : chunk;
    const std::uint64_t off = backward ? size - done - n : done;
    if (through_port) {
      if (auto p = copy_remote(ctx, src + off, dst + off, n, src_field, dst_field); p.status != fw::CmdStatus::kOk)
        return p;
    } else {
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

fw::Problem DmaEngine::fill(DmaContext& ctx, std::uint64_t dst, std::uint64_t size, std::uint32_t pattern,
                            std::uint32_t width, std::uint16_t dst_field, const Hooks& hooks) const {
  const bool through_port = remote(dst);
  const std::uint64_t chunk = through_port ? kRemoteChunk : kChunk;
  std::vector<std::byte> bounce;
  std::uint64_t done = 0;
  while (done < size) {
    const std::uint64_t n = size - done < chunk ? size - done : chunk;  // chunk % 64 == 0
    if (through_port) {
      {
        DmaAccess access(ctx);
        if (!access.permits(dst + done, n, kIommuWrite)) return fault(dst_field, dst + done, kIommuWrite);
      }
      if (bounce.size() < n) {
        bounce.resize(n);
        fill_pattern(bounce.data(), n, pattern, width);
      }
      if (!port_->write(dst + done, bounce.data(), n)) return fault(dst_field, dst + done, kIommuWrite);
    } else {
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
  if (remote(src)) {
    {
      DmaAccess access(ctx);
      if (!access.permits(src, size, kIommuRead)) return fault(field, src, kIommuRead);
    }
    return port_->read(src, out, size, ctx.abandon()) ? ok() : fault(field, src, kIommuRead);
  }
  DmaAccess access(ctx);
  std::byte* s = resolve(access, src, size, kIommuRead);
  if (!s) return fault(field, src, kIommuRead);
  std::memcpy(out, s, size);
  return ok();
}

fw::Problem DmaEngine::write(DmaContext& ctx, std::uint64_t dst, const void* in, std::uint64_t size,
                             std::uint16_t field) const {
  if (size == 0) return ok();
  if (remote(dst)) {
    {
      DmaAccess access(ctx);
      if (!access.permits(dst, size, kIommuWrite)) return fault(field, dst, kIommuWrite);
    }
    return port_->write(dst, in, size) ? ok() : fault(field, dst, kIommuWrite);
  }
  DmaAccess access(ctx);
  std::byte* d = resolve(access, dst, size, kIommuWrite);
  if (!d) return fault(field, dst, kIommuWrite);
  std::memcpy(d, in, size);
  return ok();
}

fw::Problem DmaEngine::load64(DmaContext& ctx, std::uint64_t addr, std::uint64_t& out, std::uint16_t field) const {
  if (auto bad = check_read(addr, 8, field); bad.status != fw::CmdStatus::kOk) return bad;
  if (remote(addr)) return read(ctx, addr, &out, 8, field);
  DmaAccess access(ctx);
  std::byte* p = resolve(access, addr, 8, kIommuRead);
  if (!p) return fault(field, addr, kIommuRead);
  out = std::atomic_ref<std::uint64_t>(*reinterpret_cast<std::uint64_t*>(p)).load(std::memory_order_acquire);
  return ok();
}

fw::Problem DmaEngine::store64(DmaContext& ctx, std::uint64_t addr, std::uint64_t value, std::uint16_t field) const {
  if (remote(addr)) return write(ctx, addr, &value, 8, field);
  DmaAccess access(ctx);
  std::byte* p = resolve(access, addr, 8, kIommuWrite);
  if (!p) return fault(field, addr, kIommuWrite);
  std::atomic_ref<std::uint64_t>(*reinterpret_cast<std::uint64_t*>(p)).store(value, std::memory_order_seq_cst);
  return ok();
}

}  // namespace tpuhal::sim
