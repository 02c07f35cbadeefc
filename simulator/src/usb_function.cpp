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
#include <unordered_set>
#include <vector>

#include "tpuhal/base/fd.h"
#include "tpuhal/base/log.h"
#include "tpuhal/fw/image.h"
#include "tpuhal/fw/regs.h"
#include "tpuhal/fw/version.h"

namespace tpuhal::sim {

constexpr std::size_t kSpareBuffers = 8;
constexpr std::size_t kMaxQueuedBytes = 4u << 20;
// Host writes at least this large are sent from the board's memory.
constexpr std::size_t kBorrowBytes = 64u << 10;

struct UsbFunction::Impl final : HostPort {
  Impl(FunctionEndpoints& endpoints, UsbFunctionOptions opts)
      : ep(endpoints), options(opts), stop_irq(base::make_eventfd()) {}

  FunctionEndpoints& ep;
  const UsbFunctionOptions options;
  std::unique_ptr<Board> board;
  std::uint64_t aperture_bytes = 0;

  // Board -> host messages, numbered in the order they are queued. A large
  // host-write's payload is not copied into the message: it is `body`, sent
  // from where the board's DMA holds it, and the write waits until the
  // endpoint has taken it (handed).
  struct Message {
    std::vector<std::byte> bytes;
    std::span<const std::byte> body;
  };
  std::mutex send_mu;
  std::condition_variable send_cv;
  std::deque<Message> outgoing;                      // guarded
  std::uint64_t queued_count = 0, handed_count = 0;  // messages; guarded
  std::condition_variable handed_cv;
  // Buffers of messages sent, kept for the next ones (guarded): a fresh
  // megabyte per message costs page faults and zeroing each time.
  std::vector<std::vector<std::byte>> spare;
  std::size_t queued_bytes = 0;  // in outgoing; guarded
  std::condition_variable room_cv;
  std::uint64_t sequence = 0;     // count of the last one queued (fw::usb_wire_sequence); guarded
  bool stopping = false;          // guarded
  std::atomic<bool> gone{false};  // the host is unreachable

  // The board's reads of host memory waiting for kHostData.
  struct Pending {
    std::byte* out;
    std::uint64_t size;
    int state = 0;  // 0: waiting, 1: answered, 2: refused or lost
  };
  std::mutex read_mu;
  std::condition_variable read_cv;
  std::unordered_map<std::uint64_t, Pending*> pending;  // guarded
  // Reads given up (their command processor stopped) whose answers have not
  // come yet: those answers are dropped without complaint. Guarded.
  std::unordered_set<std::uint64_t> abandoned;
  std::uint64_t next_tag = 0;  // guarded

  std::atomic<bool> reset_requested{false};
  base::UniqueFd stop_irq;
  std::thread out_thread, in_thread, irq_thread;

  std::atomic<std::uint64_t> host_messages{0}, refused{0}, host_reads{0}, host_writes{0}, interrupts{0};

  // Queues one board message; its number (queued_count), or 0 once the host
  // is gone. With `borrow`, `data` is sent from where it lies: it must stay
  // put until handed_count reaches the number (wait_handed).
  std::uint64_t send(fw::UsbType type, std::uint64_t tag, std::uint64_t a0, std::uint64_t a1 = 0,
                     std::span<const std::byte> data = {}, bool borrow = false) {
    std::uint64_t number;
    {
      std::unique_lock lock(send_mu);
      // Back-pressure: a DMA to the host waits while the pipe has enough
      // queued, rather than queueing the whole copy in memory.
      if (!data.empty()) room_cv.wait(lock, [&] { return queued_bytes < kMaxQueuedBytes || gone.load() || stopping; });
      if (gone.load(std::memory_order_relaxed) || stopping) return 0;
      Message m;
      if (!spare.empty()) {
        m.bytes = std::move(spare.back());
        spare.pop_back();
        m.bytes.clear();
      }
      if (borrow) {
        const fw::UsbHeader h = fw::usb_header(type, tag, a0, a1, static_cast<std::uint32_t>(data.size()),
                                               fw::usb_wire_sequence(++sequence));
        const auto* head = reinterpret_cast<const std::byte*>(&h);
        m.bytes.assign(head, head + sizeof h);
        m.body = data;
      } else {
        fw::append_usb_message(m.bytes, type, tag, a0, a1, data, fw::usb_wire_sequence(++sequence));
      }
      queued_bytes += m.bytes.size() + m.body.size();
      outgoing.push_back(std::move(m));
      number = ++queued_count;
    }
    send_cv.notify_one();
    return number;
  }

  // Waits until the endpoint has taken message `number` and those before
  // it, or dropped them (the host is gone): their borrowed bytes are free.
  void wait_handed(std::uint64_t number) {
    std::unique_lock lock(send_mu);
    handed_cv.wait(lock, [&] { return handed_count >= number; });
  }

  void lose() {
    if (gone.exchange(true)) return;
    {
      std::lock_guard lock(read_mu);
      for (auto& [tag, p] : pending) p->state = 2;
      abandoned.clear();
    }
    read_cv.notify_all();
    send_cv.notify_all();
    room_cv.notify_all();
  }

  // The IN thread's last act: what it will not send is dropped, so that no
  // writer waits for it (and none of its borrowed bytes is touched again).
  void drop_unsent() {
    {
      std::lock_guard lock(send_mu);
      handed_count = queued_count;
    }
    handed_cv.notify_all();
  }

  // HostPort: the board's DMA of host memory.
  bool read(std::uint64_t iova, void* out, std::uint64_t size, const std::atomic<bool>* abandon) override {
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
      if (send(fw::UsbType::kHostRead, tags[i], iova + i * options.max_data, waits[i].size) == 0) lose();
    }
    bool ok = true;
    std::unique_lock lock(read_mu);
    for (std::uint64_t i = 0; i < pieces; ++i) {
      read_cv.wait(lock, [&] { return waits[i].state != 0 || (abandon && abandon->load()); });
      if (waits[i].state == 0) {
        // Given up: no answer may land in `out` from now on.
        for (std::uint64_t k = i; k < pieces; ++k) {
          pending.erase(tags[k]);
          if (waits[k].state == 0) abandoned.insert(tags[k]);
        }
        return false;
      }
      ok &= waits[i].state == 1;
      pending.erase(tags[i]);
    }
    return ok;
  }

  void wake_readers() override {
    // Under the lock: a reader between its look at the flag and its wait
    // cannot miss this.
    std::lock_guard lock(read_mu);
    read_cv.notify_all();
  }

  // Small writes (fences, status words) are copied, so that they share
  // transfers with other messages; large ones are sent from `in`, and the
  // call returns once the endpoint has taken them.
  bool write(std::uint64_t iova, const void* in, std::uint64_t size) override {
    const auto* bytes = static_cast<const std::byte*>(in);
    const bool borrow = size >= kBorrowBytes;
    std::uint64_t last = 0;
    bool ok = true;
    for (std::uint64_t off = 0; off < size && ok; off += options.max_data) {
      host_writes.fetch_add(1, std::memory_order_relaxed);
      const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(options.max_data, size - off));
      const std::uint64_t number = send(fw::UsbType::kHostWrite, 0, iova + off, 0, {bytes + off, n}, borrow);
      ok = number != 0;
      last = ok ? number : last;
    }
    if (borrow && last) wait_handed(last);
    return ok;
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
        const std::uint64_t verdict = send(fw::UsbType::kFwStatus, m.tag, 0, 0);  // accepted
        base::logger("sim")->info("usb function: firmware {:#x} accepted ({} bytes)", checked->firmware_version,
                                  image.size());
        // The verdict must reach the host before the front end detaches:
        // a detach with it still queued reads, on the host, as a board
        // that went away during the upload.
        if (verdict != 0) {
          wait_handed(verdict);
          if (!gone.load() && !ep.flush_in()) lose();
        }
        if (options.on_firmware) options.on_firmware(std::move(image));
        image.clear();
        return;
      }
      default: return refuse(m, fw::CmdStatus::kBadArgument, "the board is in loader mode: upload its firmware first");
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
          if (abandoned.erase(m.tag)) return;  // its reader gave up (a queue reset)
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

  // One whole host message: decoded, checked and executed, or refused.
  void run(std::span<const std::byte> bytes) {
    auto m = fw::decode_usb_message(bytes, fw::UsbDirection::kToBoard, fw::kBar0Size, options.max_data);
    if (m) return execute(*m);
    fw::UsbHeader h;
    std::memcpy(&h, bytes.data(), sizeof h);
    fw::UsbMessage bad;
    bad.type = static_cast<fw::UsbType>(h.type);
    bad.tag = h.tag;
    refuse(bad, m.problem().status, fw::describe_usb_problem(m.problem()));
  }

  // Host messages are executed where the endpoint received them; one that
  // straddles two reads is assembled first (fw::UsbSplitter).
  void serve_out() {
    fw::UsbSplitter split(fw::UsbDirection::kToBoard, options.max_data);
    for (;;) {
      if (reset_requested.exchange(false)) split.reset();
      std::span<const std::byte> got = ep.peek_out();
      if (got.empty()) break;
      auto fed = split.feed(got, [this](std::span<const std::byte> m) {
        run(m);
        return true;
      });
      if (!fed) {
        // Out of step: nothing after this header can be trusted.
        refused.fetch_add(1, std::memory_order_relaxed);
        base::logger("sim")->warn("usb function: {}; dropping the rest of the transfer",
                                  fw::describe_usb_problem(fed.problem()));
        send(fw::UsbType::kError, 0, static_cast<std::uint64_t>(fed.problem().status), 0);
      }
      ep.release_out();
    }
    lose();
  }

  void serve_in() {
    send_messages();
    drop_unsent();
  }

  void send_messages() {
    std::vector<std::byte> batch;
    for (;;) {
      batch.clear();
      std::span<const std::byte> body;
      std::uint64_t taken = 0;
      {
        std::unique_lock lock(send_mu);
        send_cv.wait(lock, [&] { return stopping || gone.load() || !outgoing.empty(); });
        if (outgoing.empty() || gone.load()) return;
        // Small messages share a transfer; one with a borrowed body goes
        // alone, its header and body gathered by the endpoint.
        while (!outgoing.empty() && body.empty() &&
               (batch.empty() ||
                (outgoing.front().body.empty() && batch.size() + outgoing.front().bytes.size() <= (256u << 10)))) {
          Message& m = outgoing.front();
          queued_bytes -= m.bytes.size() + m.body.size();
          if (batch.empty())
            batch.swap(m.bytes);
          else
            batch.insert(batch.end(), m.bytes.begin(), m.bytes.end());
          body = m.body;
          if (spare.size() < kSpareBuffers) spare.push_back(std::move(m.bytes));
          outgoing.pop_front();
          ++taken;
        }
      }
      room_cv.notify_all();
      const bool sent = body.empty() ? ep.write_in(batch) : ep.write_in_gather(batch, body);
      {
        std::lock_guard lock(send_mu);
        handed_count += taken;
      }
      handed_cv.notify_all();
      if (!sent) {
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

std::span<const std::byte> FunctionEndpoints::peek_out() {
  if (out_staged_ == 0) {
    if (out_stage_.empty()) out_stage_.resize(fw::kUsbTransferBytes);
    out_staged_ = read_out(out_stage_);
  }
  return {out_stage_.data(), out_staged_};
}

void FunctionEndpoints::release_out() { out_staged_ = 0; }

bool FunctionEndpoints::write_in_gather(std::span<const std::byte> head, std::span<const std::byte> body) {
  in_stage_.assign(head.begin(), head.end());
  in_stage_.insert(in_stage_.end(), body.begin(), body.end());
  return write_in(in_stage_);
}

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
