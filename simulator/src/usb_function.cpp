#include "tpuhal/sim/usb_function.h"

#include <poll.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "tpuhal/base/fd.h"
#include "tpuhal/base/log.h"
#include "tpuhal/fw/image.h"
#include "tpuhal/fw/regs.h"
#include "tpuhal/fw/version.h"

namespace tpuhal::sim {

constexpr std::size_t kSpareBuffers = 8;
constexpr std::size_t kMaxQueuedBytes = 4u << 20;

struct UsbFunction::Impl final : HostPort {
  Impl(FunctionEndpoints& endpoints, UsbFunctionOptions opts)
      : ep(endpoints), options(opts), stop_irq(base::make_eventfd()) {}

  FunctionEndpoints& ep;
  const UsbFunctionOptions options;
  std::unique_ptr<Board> board;
  std::uint64_t aperture_bytes = 0;

  // Board -> host messages, numbered in the order they are queued.
  std::mutex send_mu;
  std::condition_variable send_cv;
  std::deque<std::vector<std::byte>> outgoing;  // guarded
  // Buffers of messages sent, kept for the next ones (guarded): a fresh
  // megabyte per message costs page faults and zeroing each time.
  std::vector<std::vector<std::byte>> spare;
  std::size_t queued_bytes = 0;  // in outgoing; guarded
  std::condition_variable room_cv;
  std::uint32_t sequence = 0;                    // last one queued; guarded
  bool stopping = false;                         // guarded
  std::atomic<bool> gone{false};                 // the host is unreachable

  // The board's reads of host memory waiting for kHostData.
  struct Pending {
    std::byte* out;
    std::uint64_t size;
    int state = 0;  // 0: waiting, 1: answered, 2: refused or lost
  };
  std::mutex read_mu;
  std::condition_variable read_cv;
  std::unordered_map<std::uint64_t, Pending*> pending;  // guarded
  std::uint64_t next_tag = 0;                           // guarded

  std::atomic<bool> reset_requested{false};
  base::UniqueFd stop_irq;
  std::thread out_thread, in_thread, irq_thread;

  std::atomic<std::uint64_t> host_messages{0}, refused{0}, host_reads{0}, host_writes{0}, interrupts{0};

  // Queues one board message; false once the host is gone.
  bool send(fw::UsbType type, std::uint64_t tag, std::uint64_t a0, std::uint64_t a1 = 0,
            std::span<const std::byte> data = {}) {
    {
      std::unique_lock lock(send_mu);
      // Back-pressure: a DMA to the host waits while the pipe has enough
      // queued, rather than queueing the whole copy in memory.
      if (!data.empty())
        room_cv.wait(lock, [&] { return queued_bytes < kMaxQueuedBytes || gone.load() || stopping; });
      if (gone.load(std::memory_order_relaxed) || stopping) return false;
      std::vector<std::byte> m;
      if (!spare.empty()) {
        m = std::move(spare.back());
        spare.pop_back();
        m.clear();
      }
      fw::append_usb_message(m, type, tag, a0, a1, data, ++sequence);
      queued_bytes += m.size();
      outgoing.push_back(std::move(m));
    }
    send_cv.notify_one();
    return true;
  }

  void lose() {
    if (gone.exchange(true)) return;
    {
      std::lock_guard lock(read_mu);
      for (auto& [tag, p] : pending) p->state = 2;
    }
    read_cv.notify_all();
    send_cv.notify_all();
    room_cv.notify_all();
  }

  // HostPort: the board's DMA of host memory.
  bool read(std::uint64_t iova, void* out, std::uint64_t size) override {
    const std::uint64_t pieces = (size + options.max_data - 1) / options.max_data;
    std::vector<Pending> waits(pieces);
    std::vector<std::uint64_t> tags(pieces);
    {
      std::lock_guard lock(read_mu);
      for (std::uint64_t i = 0; i < pieces; ++i) {
        const std::uint64_t off = i * options.max_data;
        waits[i] = {static_cast<std::byte*>(out) + off, std::min<std::uint64_t>(options.max_data, size - off)};
        if (gone.load()) waits[i].state = 2;
        tags[i] = ++next_tag;
        pending.emplace(tags[i], &waits[i]);
      }
    }
    // Every piece is asked for at once: the host answers them back to back.
    for (std::uint64_t i = 0; i < pieces; ++i) {
      host_reads.fetch_add(1, std::memory_order_relaxed);
      if (!send(fw::UsbType::kHostRead, tags[i], iova + i * options.max_data, waits[i].size)) lose();
    }
    bool ok = true;
    std::unique_lock lock(read_mu);
    for (std::uint64_t i = 0; i < pieces; ++i) {
      read_cv.wait(lock, [&] { return waits[i].state != 0; });
      ok &= waits[i].state == 1;
      pending.erase(tags[i]);
    }
    return ok;
  }

  bool write(std::uint64_t iova, const void* in, std::uint64_t size) override {
    const auto* bytes = static_cast<const std::byte*>(in);
    for (std::uint64_t off = 0; off < size; off += options.max_data) {
      host_writes.fetch_add(1, std::memory_order_relaxed);
      if (!send(fw::UsbType::kHostWrite, 0, iova + off, 0,
                {bytes + off, static_cast<std::size_t>(std::min<std::uint64_t>(options.max_data, size - off))}))
        return false;
    }
    return true;
  }

  void refuse(const fw::UsbMessage& m, fw::CmdStatus status, const std::string& why) {
    refused.fetch_add(1, std::memory_order_relaxed);
    base::logger("sim")->warn("usb function: refused {}: {}", fw::to_string(m.type), why);
    send(fw::UsbType::kError, m.tag, static_cast<std::uint64_t>(status), static_cast<std::uint16_t>(m.type));
  }

  // Loader mode: the image being received.
  std::vector<std::byte> image;
  bool receiving = false;

  std::uint32_t board_id() const { return board->mmio_read32(fw::reg::kVendorDevice); }

  void fw_status(const fw::UsbMessage& m, const fw::Problem& p) {
    if (p.status == fw::CmdStatus::kOk) {
      send(fw::UsbType::kFwStatus, m.tag, 0, 0);
      return;
    }
    send(fw::UsbType::kFwStatus, m.tag, static_cast<std::uint64_t>(p.status) | std::uint64_t{p.field} << 32, p.value);
  }

  void load(const fw::UsbMessage& m) {
    switch (m.type) {
      case fw::UsbType::kFwBegin:
        image.assign(m.arg[0], std::byte{0});
        receiving = true;
        return;
      case fw::UsbType::kFwData:
        if (!receiving || m.arg[0] > image.size() || m.data.size() > image.size() - m.arg[0])
          return refuse(m, fw::CmdStatus::kBadArgument, "image data outside the announced size");
        std::memcpy(image.data() + m.arg[0], m.data.data(), m.data.size());
        return;
      case fw::UsbType::kFwCommit: {
        if (!receiving) return refuse(m, fw::CmdStatus::kBadArgument, "commit without an upload");
        receiving = false;
        auto checked = fw::check_image_for(fw::decode_image(image), board_id(), fw::kInterfaceVersion);
        if (!checked) return fw_status(m, checked.problem());
        if (checked->crc32c != m.arg[0])
          return fw_status(m, {fw::CmdStatus::kBadArgument, fw::kFieldImageChecksum, m.arg[0], checked->crc32c});
        fw_status(m, {});
        base::logger("sim")->info("usb function: firmware {:#x} accepted ({} bytes)", checked->firmware_version,
                                  image.size());
        if (options.on_firmware) options.on_firmware(std::move(image));
        image.clear();
        return;
      }
      default:
        return refuse(m, fw::CmdStatus::kBadArgument, "the board is in loader mode: upload its firmware first");
    }
  }

  void execute(const fw::UsbMessage& m) {
    host_messages.fetch_add(1, std::memory_order_relaxed);
    if (options.loader) return load(m);
    switch (m.type) {
      case fw::UsbType::kRegWrite:
        board->mmio_write32(static_cast<std::uint32_t>(m.arg[0]), static_cast<std::uint32_t>(m.arg[1]));
        return;
      case fw::UsbType::kRegRead:
        send(fw::UsbType::kRegValue, m.tag, m.arg[0], board->mmio_read32(static_cast<std::uint32_t>(m.arg[0])));
        return;
      case fw::UsbType::kMemWrite:
      case fw::UsbType::kMemRead: {
        const std::uint64_t n = m.type == fw::UsbType::kMemWrite ? m.data.size() : m.arg[1];
        if (m.arg[0] > aperture_bytes || n > aperture_bytes - m.arg[0])
          return refuse(m, fw::CmdStatus::kBadArgument, "device range outside the aperture");
        std::byte* at = board->aperture().data() + m.arg[0];
        if (m.type == fw::UsbType::kMemWrite) {
          std::memcpy(at, m.data.data(), n);
          return;
        }
        send(fw::UsbType::kMemData, m.tag, m.arg[0], 0, {at, static_cast<std::size_t>(n)});
        return;
      }
      case fw::UsbType::kHostData: {
        {
          std::lock_guard lock(read_mu);
          auto it = pending.find(m.tag);
          if (it == pending.end() || it->second->state != 0) {
            refused.fetch_add(1, std::memory_order_relaxed);
            base::logger("sim")->warn("usb function: host-data with tag {} answers no read", m.tag);
            return;
          }
          Pending& p = *it->second;
          if (m.flags & fw::kUsbFlagFault || m.data.size() != p.size) {
            p.state = 2;
          } else {
            std::memcpy(p.out, m.data.data(), p.size);
            p.state = 1;
          }
        }
        read_cv.notify_all();
        return;
      }
      case fw::UsbType::kMapDma: {
        const std::uint32_t access = kIommuRead | (m.flags & fw::kUsbFlagDeviceWrites ? kIommuWrite : 0);
        if (auto why = board->iommu().map(m.arg[0], nullptr, m.arg[1], access); !why.empty())
          refuse(m, fw::CmdStatus::kBadArgument, why);
        return;
      }
      case fw::UsbType::kUnmapDma:
        if (auto why = board->iommu().unmap(m.arg[0], m.arg[1]); !why.empty())
          refuse(m, fw::CmdStatus::kBadArgument, why);
        return;
      default:
        return refuse(m, fw::CmdStatus::kBadArgument, "the board runs its application firmware (not the loader)");
    }
  }

  void serve_out() {
    std::vector<std::byte> buf;
    std::size_t used = 0;
    const std::size_t whole = sizeof(fw::UsbHeader) + options.max_data;
    buf.resize(2 * whole);
    for (;;) {
      if (reset_requested.exchange(false)) used = 0;
      if (buf.size() - used < whole) buf.resize(used + whole);
      const std::size_t n = ep.read_out({buf.data() + used, buf.size() - used});
      if (n == 0) break;
      used += n;
      std::size_t at = 0;
      while (used - at >= sizeof(fw::UsbHeader)) {
        std::span<const std::byte> rest{buf.data() + at, used - at};
        auto len = fw::usb_message_bytes(rest, fw::UsbDirection::kToBoard, options.max_data);
        if (!len) {
          // Out of step: nothing after this header can be trusted.
          refused.fetch_add(1, std::memory_order_relaxed);
          base::logger("sim")->warn("usb function: {}; dropping {} buffered bytes",
                                    fw::describe_usb_problem(len.problem()), used - at);
          send(fw::UsbType::kError, 0, static_cast<std::uint64_t>(len.problem().status), 0);
          at = used;
          break;
        }
        if (rest.size() < *len) break;
        auto m = fw::decode_usb_message(rest.first(*len), fw::UsbDirection::kToBoard, fw::kBar0Size,
                                        options.max_data);
        if (m) {
          execute(*m);
        } else {
          fw::UsbHeader h;
          std::memcpy(&h, rest.data(), sizeof h);
          fw::UsbMessage bad;
          bad.type = static_cast<fw::UsbType>(h.type);
          bad.tag = h.tag;
          refuse(bad, m.problem().status, fw::describe_usb_problem(m.problem()));
        }
        at += *len;
      }
      // The unfinished message moves to the front once, when the messages
      // before it are done (not on every read while it arrives).
      if (at > 0 && used > at) std::memmove(buf.data(), buf.data() + at, used - at);
      used -= at;
    }
    lose();
  }

  void serve_in() {
    std::vector<std::byte> batch;
    for (;;) {
      batch.clear();
      {
        std::unique_lock lock(send_mu);
        send_cv.wait(lock, [&] { return stopping || gone.load() || !outgoing.empty(); });
        if (outgoing.empty() || gone.load()) return;
        // Small messages share a transfer.
        while (!outgoing.empty() && (batch.empty() || batch.size() + outgoing.front().size() <= (256u << 10))) {
          queued_bytes -= outgoing.front().size();
          if (batch.empty()) batch.swap(outgoing.front());
          else batch.insert(batch.end(), outgoing.front().begin(), outgoing.front().end());
          if (spare.size() < kSpareBuffers) spare.push_back(std::move(outgoing.front()));
          outgoing.pop_front();
        }
      }
      room_cv.notify_all();
      if (!ep.write_in(batch)) {
        lose();
        return;
      }
    }
  }

  void serve_irq() {
    const std::uint32_t nv = board->interrupt_vectors();
    std::vector<pollfd> fds;
    for (std::uint32_t v = 0; v < nv; ++v) fds.push_back({board->interrupt_fd(v), POLLIN, 0});
    fds.push_back({stop_irq.get(), POLLIN, 0});
    for (;;) {
      if (::poll(fds.data(), fds.size(), -1) < 0) continue;
      if (fds.back().revents) return;
      std::uint32_t vectors = 0;
      for (std::uint32_t v = 0; v < nv; ++v)
        if (fds[v].revents && base::eventfd_drain(fds[v].fd)) vectors |= 1u << v;
      if (!vectors) continue;
      fw::UsbInterrupt irq{fw::kUsbMagic, vectors, 0};
      {
        std::lock_guard lock(send_mu);
        irq.after_sequence = sequence;
      }
      interrupts.fetch_add(1, std::memory_order_relaxed);
      if (!ep.write_irq({reinterpret_cast<const std::byte*>(&irq), sizeof irq})) lose();
    }
  }
};

UsbFunction::UsbFunction(BoardProfile profile, FunctionEndpoints& endpoints, UsbFunctionOptions options)
    : impl_(std::make_unique<Impl>(endpoints, options)) {
  if (options.max_data == 0 || options.max_data > fw::kUsbMaxData)
    throw ProfileError("usb function: max_data " + std::to_string(options.max_data) + " outside 1.." +
                       std::to_string(fw::kUsbMaxData));
  BoardOptions board_options;
  board_options.host_port = impl_.get();
  impl_->board = std::make_unique<Board>(std::move(profile), board_options);
  impl_->aperture_bytes = impl_->board->aperture().size();
  impl_->out_thread = std::thread([this] { impl_->serve_out(); });
  impl_->in_thread = std::thread([this] { impl_->serve_in(); });
  impl_->irq_thread = std::thread([this] { impl_->serve_irq(); });
}

UsbFunction::~UsbFunction() {
  Impl& i = *impl_;
  i.out_thread.join();  // the endpoints are shut down: the host is gone
  i.lose();
  base::eventfd_signal(i.stop_irq.get());
  i.irq_thread.join();
  i.board.reset();  // its queues' last writes fail fast: the host is gone
  {
    std::lock_guard lock(i.send_mu);
    i.stopping = true;
  }
  i.send_cv.notify_all();
  i.room_cv.notify_all();
  i.in_thread.join();
}

fw::UsbIdentity UsbFunction::identity() const noexcept {
  fw::UsbIdentity id{};
  id.magic = fw::kUsbMagic;
  const bool loader = impl_->options.loader;
  id.mode = static_cast<std::uint32_t>(loader ? fw::UsbMode::kLoader : fw::UsbMode::kApplication);
  id.board_id = impl_->board_id();
  id.iface_version = loader ? 0 : impl_->board->mmio_read32(fw::reg::kIfaceVersion);
  id.firmware_version = loader ? 0 : impl_->options.firmware_version;
  id.max_data = impl_->options.max_data;
  return id;
}

void UsbFunction::reset_link() noexcept { impl_->reset_requested.store(true); }

Board& UsbFunction::board() noexcept { return *impl_->board; }

UsbFunction::Stats UsbFunction::stats() const noexcept {
  const Impl& i = *impl_;
  return {i.host_messages.load(), i.refused.load(), i.host_reads.load(), i.host_writes.load(), i.interrupts.load()};
}

}  // namespace tpuhal::sim
