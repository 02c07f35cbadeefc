// Faults on demand (docs/faults.md): what the board does when a test, the
// environment (TPUHAL_SIM_FAULTS) or a profile asks it to fail.
#include <spdlog/spdlog.h>

#include <charconv>
#include <stdexcept>
#include <string>

#include "board_impl.h"
#include "tpuhal/base/log.h"

namespace tpuhal::sim {
namespace {

struct KindName {
  FaultKind kind;
  const char* name;
};
constexpr KindName kKinds[] = {
    {FaultKind::kDmaError, "dma-error"},     {FaultKind::kHang, "hang"},
    {FaultKind::kFirmwareCrash, "crash"},    {FaultKind::kEccError, "ecc"},
    {FaultKind::kInterruptLost, "irq-lost"}, {FaultKind::kDeviceLost, "lost"},
};

std::uint64_t parse_number(std::string_view item, std::string_view key, std::string_view text) {
  int base = 10;
  if (text.starts_with("0x") || text.starts_with("0X")) {
    text.remove_prefix(2);
    base = 16;
  }
  std::uint64_t v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v, base);
  if (ec != std::errc{} || end != text.data() + text.size() || text.empty())
    throw ProfileError("fault '" + std::string(item) + "': " + std::string(key) + " needs a number, got '" +
                       std::string(text) + "'");
  return v;
}

// What a DMA error can strike: copies, fills, and the packet read of a
// video decode (not the end-of-stream marker, which reads nothing).
bool moves_data(const fw::Command& cmd) {
  if (auto* v = std::get_if<fw::VideoDecodeArgs>(&cmd.args)) return v->bytes > 0;
  return cmd.opcode == fw::Opcode::kCopy || cmd.opcode == fw::Opcode::kCopySg || cmd.opcode == fw::Opcode::kFill;
}

}  // namespace

const char* to_string(FaultKind kind) noexcept {
  for (const auto& k : kKinds)
    if (k.kind == kind) return k.name;
  return "unknown";
}

std::vector<Fault> parse_faults(std::string_view spec) {
  std::vector<Fault> out;
  while (!spec.empty()) {
    const auto comma = spec.find(',');
    std::string_view item = spec.substr(0, comma);
    spec = comma == std::string_view::npos ? std::string_view{} : spec.substr(comma + 1);
    if (item.empty()) continue;
    std::string_view rest = item;
    const auto colon = rest.find(':');
    const std::string_view kind = rest.substr(0, colon);
    rest = colon == std::string_view::npos ? std::string_view{} : rest.substr(colon + 1);
    Fault f;
    bool known = false;
    for (const auto& k : kKinds)
      if (kind == k.name) {
        f.kind = k.kind;
        known = true;
      }
    if (!known)
      throw ProfileError("fault '" + std::string(item) +
                         "': unknown kind (dma-error, hang, crash, ecc, irq-lost or lost)");
    while (!rest.empty()) {
      const auto c = rest.find(':');
      const std::string_view kv = rest.substr(0, c);
      rest = c == std::string_view::npos ? std::string_view{} : rest.substr(c + 1);
      const auto eq = kv.find('=');
      const std::string_view key = kv.substr(0, eq);
      if (eq == std::string_view::npos)
        throw ProfileError("fault '" + std::string(item) + "': '" + std::string(kv) + "' is not key=value");
      const std::uint64_t v = parse_number(item, key, kv.substr(eq + 1));
      if (key == "queue")
        f.queue = static_cast<std::uint32_t>(v > fw::kMaxQueues ? fw::kMaxQueues : v);
      else if (key == "after")
        f.after_commands = v;
      else if (key == "address")
        f.address = v;
      else if (key == "size")
        f.size = v;
      else if (key == "count")
        f.count = v;
      else
        throw ProfileError("fault '" + std::string(item) + "': unknown key '" + std::string(key) +
                           "' (queue, after, address, size, count)");
    }
    if (f.kind == FaultKind::kEccError && f.size == 0)
      throw ProfileError("fault '" + std::string(item) + "': ecc needs size=BYTES");
    out.push_back(f);
  }
  return out;
}

void Board::Impl::inject(const Fault& f) {
  const auto nq = static_cast<std::uint32_t>(queues.size());
  if (f.kind != FaultKind::kEccError && f.queue >= nq)
    throw std::out_of_range(std::string("fault ") + to_string(f.kind) + ": queue " + std::to_string(f.queue) +
                            " (the board has " + std::to_string(nq) + ")");
  base::logger("sim")->info("fault injected: {} queue {} after {} address {:#x} size {} count {}", to_string(f.kind),
                            f.queue, f.after_commands, f.address, f.size, f.count);
  switch (f.kind) {
    case FaultKind::kEccError:
      if (f.size == 0 || f.address >= profile.dram_bytes || f.size > profile.dram_bytes - f.address)
        throw std::out_of_range("fault ecc: range " + std::to_string(f.address) + "+" + std::to_string(f.size) +
                                " is not inside DRAM");
      dma.poison(f.address, f.size);
      return;
    case FaultKind::kInterruptLost:
      queues[f.queue]->irq_lost.store(f.count ? f.count : QueueState::kAllLost);
      irq_lost_queues.fetch_or(1u << f.queue);
      return;
    case FaultKind::kFirmwareCrash:
    case FaultKind::kDeviceLost:
      if (f.after_commands == 0) {
        if (f.kind == FaultKind::kFirmwareCrash)
          crash(fw::CmdStatus::kFirmwareFault);
        else
          lose();
        return;
      }
      break;
    default: break;
  }
  std::lock_guard lock(fault_mu);
  pending_faults.push_back(f);
  fault_queues.fetch_or(1u << f.queue);
}

void Board::Impl::clear_faults() noexcept {
  {
    std::lock_guard lock(fault_mu);
    pending_faults.clear();
    fault_queues.store(0);
  }
  for (auto& q : queues) q->irq_lost.store(0);
  irq_lost_queues.store(0);
  dma.clear_poison();
}

std::optional<FaultKind> Board::Impl::fault_for(std::uint32_t q, const fw::Command& cmd) {
  if (!(fault_queues.load(std::memory_order_relaxed) & (1u << q))) return std::nullopt;
  std::lock_guard lock(fault_mu);
  std::optional<FaultKind> strikes;
  std::uint32_t still = 0;
  for (auto it = pending_faults.begin(); it != pending_faults.end();) {
    if (it->queue == q && !strikes) {
      if (it->after_commands > 0) {
        --it->after_commands;  // this command counts towards it
      } else if (it->kind != FaultKind::kDmaError || moves_data(cmd)) {
        strikes = it->kind;
        it = pending_faults.erase(it);
        continue;
      }
    } else if (it->queue == q && it->after_commands > 0) {
      --it->after_commands;
    }
    still |= 1u << it->queue;
    ++it;
  }
  fault_queues.store(still);
  return strikes;
}

void Board::Impl::halt_queues() noexcept {
  halted.store(true, std::memory_order_seq_cst);
  for (auto& q : queues) q->doorbell.notify();
  memory_written.notify();
  // The codec unit's decode threads stop too, before the driver can see the
  // board stopped: it may then free what they wrote to.
  if (CodecUnit* unit = codec_ptr.load()) unit->wait_halted();
}

void Board::Impl::crash(fw::CmdStatus code) noexcept {
  base::logger("sim")->info("firmware crash ({})", fw::to_string(code));
  fatal_code.store(static_cast<std::uint32_t>(code));
  firmware_crashes.fetch_add(1, std::memory_order_relaxed);
  halt_queues();
  status.fetch_or(fw::kStatusFatal);
  raise(fw::kDeviceVectorBit);
}

void Board::Impl::lose() noexcept {
  base::logger("sim")->info("board lost");
  halt_queues();
  lost.store(true, std::memory_order_seq_cst);
}

std::uint32_t Board::Impl::drop_lost_interrupts(std::uint32_t bits) noexcept {
  std::uint32_t lose_bits = bits & irq_lost_queues.load(std::memory_order_relaxed);
  for (std::uint32_t q = 0; lose_bits && q < queues.size(); ++q) {
    if (!(lose_bits & (1u << q))) continue;
    lose_bits &= ~(1u << q);
    auto& left = queues[q]->irq_lost;
    std::uint64_t n = left.load();
    while (n != 0 && n != QueueState::kAllLost && !left.compare_exchange_weak(n, n - 1)) {
    }
    if (n != 0) bits &= ~(1u << q);  // this one is lost
    if (n == 1) irq_lost_queues.fetch_and(~(1u << q));
  }
  return bits;
}

}  // namespace tpuhal::sim
