#include "tpuhal/tpu/usb_transport.h"

#include <spdlog/spdlog.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "tpuhal/base/fd.h"
#include "tpuhal/base/log.h"
#include "tpuhal/base/mapping.h"
#include "tpuhal/fw/regs.h"
#include "tpuhal/fw/usb.h"
#include "tpuhal/tpu/device.h"

namespace tpuhal::tpu {
namespace {

using namespace std::chrono_literals;

// A register read the board does not answer in this long means it is gone.
constexpr auto kAnswerTimeout = 10s;
// How long closing waits for its last messages to reach the board (a board
// that stopped taking bulk OUT holds a close no longer than this).
constexpr auto kCloseDrain = 2s;
// Board-to-host messages are batched by the board; this side sends its
// small messages (register writes) in transfers of up to this size.
constexpr std::size_t kBatchBytes = 256u << 10;

// Board DMA of host memory. A whole aligned 4- or 8-byte word moves whole,
// atomically: the driver reads fences and status words with atomic loads,
// and the board polls words the host stores (wait-value). `local` is this
// side's buffer, `shared` the host memory the driver and users see.
template <class W>
bool word_sized(const std::byte* shared, std::size_t n) {
  return n == sizeof(W) && reinterpret_cast<std::uintptr_t>(shared) % sizeof(W) == 0;
}
template <class W>
W& word_at(std::byte* shared) {
  return *reinterpret_cast<W*>(shared);
}

void read_host(std::byte* local, std::byte* shared, std::size_t n) {
  if (word_sized<std::uint64_t>(shared, n)) {
    const auto v = std::atomic_ref<std::uint64_t>(word_at<std::uint64_t>(shared)).load(std::memory_order_seq_cst);
    std::memcpy(local, &v, n);
  } else if (word_sized<std::uint32_t>(shared, n)) {
    const auto v = std::atomic_ref<std::uint32_t>(word_at<std::uint32_t>(shared)).load(std::memory_order_seq_cst);
    std::memcpy(local, &v, n);
  } else {
    std::memcpy(local, shared, n);
  }
}

void write_host(std::byte* shared, const std::byte* local, std::size_t n) {
  if (word_sized<std::uint64_t>(shared, n)) {
    std::uint64_t v;
    std::memcpy(&v, local, n);
    std::atomic_ref<std::uint64_t>(word_at<std::uint64_t>(shared)).store(v, std::memory_order_seq_cst);
  } else if (word_sized<std::uint32_t>(shared, n)) {
    std::uint32_t v;
    std::memcpy(&v, local, n);
    std::atomic_ref<std::uint32_t>(word_at<std::uint32_t>(shared)).store(v, std::memory_order_seq_cst);
  } else {
    std::memcpy(shared, local, n);
  }
}

class UsbTransport final : public Transport {
 public:
  explicit UsbTransport(std::unique_ptr<UsbLink> link) : link_(std::move(link)), bus_(link_->bus()) {
    std::byte raw[sizeof(fw::UsbIdentity)];
    const std::size_t n = link_->control_in(fw::kUsbGetIdentity, raw);
    auto id = fw::decode_usb_identity({raw, n});
    if (!id)
      throw Error(Status::DeviceLost,
                  bus_ + ": the board's identity is malformed: " + fw::describe_usb_problem(id.problem()));
    if (id->mode != static_cast<std::uint32_t>(fw::UsbMode::kApplication))
      throw Error(Status::Unsupported, bus_ +
                                           ": the board is in loader mode: upload its firmware first "
                                           "(tpuhal usb-upload)");
    max_data_ = id->max_data;
    // One eventfd per vector the firmware interface allows; the board's
    // queue count says how many are used.
    for (std::uint32_t v = 0; v <= fw::kMaxQueues; ++v) vectors_.push_back(base::make_eventfd());
    // Drop whatever a previous user left half-sent.
    link_->control_out(fw::kUsbResetLink);
    out_thread_ = std::thread([this] { serve_out(); });
    in_thread_ = std::thread([this] { serve_in(); });
    try {
      const std::uint32_t queues = read32(fw::reg::kNumQueues);
      const std::uint64_t aperture = read32(fw::reg::kApertureLo) | std::uint64_t{read32(fw::reg::kApertureHi)} << 32;
      if (lost_.load() || queues == 0 || queues > fw::kMaxQueues || aperture % 4096 || aperture > (64ull << 30))
        throw Error(Status::DeviceLost, bus_ + ": the board does not answer sensibly (" + std::to_string(queues) +
                                            " queues, aperture " + std::to_string(aperture) + " bytes)");
      used_vectors_ = queues + 1;
      if (aperture) aperture_ = base::Mapping::anonymous(aperture, {.noreserve = true});
    } catch (...) {
      stop();
      throw;
    }
    irq_thread_ = std::thread([this] { serve_irq(); });
  }

  ~UsbTransport() override { stop(); }

  std::string bus() const override { return bus_; }

  std::uint32_t read32(std::uint32_t offset) override {
    Reply r;
    const std::uint64_t tag = expect(r);
    if (!send(fw::UsbType::kRegRead, tag, offset)) return forget(tag), 0xFFFFFFFF;
    if (!await(r, tag)) return 0xFFFFFFFF;
    return static_cast<std::uint32_t>(r.value);
  }

  void write32(std::uint32_t offset, std::uint32_t value) override { send(fw::UsbType::kRegWrite, 0, offset, value); }

  std::span<std::byte> aperture() override { return {aperture_.data(), aperture_.size()}; }
  bool aperture_coherent() const override { return false; }

  void flush_aperture(std::uint64_t offset, std::uint64_t size) override {
    if (offset > aperture_.size() || size > aperture_.size() - offset) return;
    for (std::uint64_t done = 0; done < size; done += max_data_) {
      const std::uint64_t n = std::min<std::uint64_t>(max_data_, size - done);
      send(fw::UsbType::kMemWrite, 0, offset + done, 0, {aperture_.data() + offset + done, n});
    }
  }

  void map_dma(std::uint64_t iova, void* host, std::uint64_t size, bool device_writes) override {
    {
      std::unique_lock lock(map_mu_);
      auto next = windows_.lower_bound(iova);
      const bool overlaps = (next != windows_.end() && next->first < iova + size) ||
                            (next != windows_.begin() && std::prev(next)->first + std::prev(next)->second.size > iova);
      if (overlaps || size == 0)
        throw Error(Status::Internal, bus_ + ": DMA mapping at IOVA " + std::to_string(iova) + " overlaps another");
      windows_.emplace(iova, Window{static_cast<std::byte*>(host), size, device_writes});
    }
    send(fw::UsbType::kMapDma, 0, iova, size, {}, device_writes ? fw::kUsbFlagDeviceWrites : 0);
  }

  void unmap_dma(std::uint64_t iova, std::uint64_t size) noexcept override {
    {
      // Taken exclusively: a board read or write being applied finishes first.
      std::unique_lock lock(map_mu_);
      auto it = windows_.find(iova);
      if (it == windows_.end() || it->second.size != size) return;
      windows_.erase(it);
    }
    send(fw::UsbType::kUnmapDma, 0, iova, size);
  }

  std::uint32_t interrupt_vectors() const override { return used_vectors_; }
  int interrupt_fd(std::uint32_t vector) const override { return vectors_.at(vector).get(); }

 private:
  struct Window {
    std::byte* host;
    std::uint64_t size;
    bool writes;
  };
  struct Reply {
    bool done = false, failed = false;
    std::uint64_t value = 0;
  };
  struct HostReadRequest {
    std::uint64_t tag, iova, size;
  };
  // A message to the board, built; or a board read, to answer when sent.
  struct Outgoing {
    std::vector<std::byte> bytes;
    std::optional<HostReadRequest> read;
  };

  std::uint64_t expect(Reply& r) {
    std::lock_guard lock(reply_mu_);
    const std::uint64_t tag = ++next_tag_;
    replies_.emplace(tag, &r);
    return tag;
  }
  void forget(std::uint64_t tag) {
    std::lock_guard lock(reply_mu_);
    replies_.erase(tag);
  }
  // Waits for the answer; false if the board is lost, refused, or silent.
  bool await(Reply& r, std::uint64_t tag) {
    std::unique_lock lock(reply_mu_);
    const bool answered = reply_cv_.wait_for(lock, kAnswerTimeout, [&] { return r.done || lost_.load(); });
    replies_.erase(tag);
    if (!answered) {
      lock.unlock();
      lose("it did not answer a register read within " + std::to_string(kAnswerTimeout.count()) + " s");
      return false;
    }
    return r.done && !r.failed;
  }

  bool send(fw::UsbType type, std::uint64_t tag, std::uint64_t a0, std::uint64_t a1 = 0,
            std::span<const std::byte> data = {}, std::uint16_t flags = 0) {
    {
      std::lock_guard lock(out_mu_);
      if (lost_.load(std::memory_order_relaxed) || closing_) return false;
      Outgoing o{spare_locked(), std::nullopt};
      fw::append_usb_message(o.bytes, type, tag, a0, a1, data, 0, flags);
      out_.push_back(std::move(o));
    }
    out_cv_.notify_one();
    return true;
  }

  // A buffer for a message to the board: one a sent message left, if any
  // (a fresh megabyte per message costs page faults and zeroing each time).
  std::vector<std::byte> spare_locked() {
    std::vector<std::byte> m;
    if (!spare_.empty()) {
      m = std::move(spare_.back());
      spare_.pop_back();
      m.clear();
    }
    return m;
  }

  void lose(const std::string& why) {
    if (lost_.exchange(true)) return;
    if (!closing_flag_.load()) base::logger("tpu")->error("{}: the board is gone: {}", bus_, why);
    // Nothing more goes to the board, and no thread stays blocked on the
    // link (a board that stopped taking bulk OUT holds its sender).
    link_->shutdown();
    { std::lock_guard lock(reply_mu_); }
    reply_cv_.notify_all();
    { std::lock_guard lock(seq_mu_); }
    seq_cv_.notify_all();
    out_cv_.notify_all();
    // Every waiter looks: registers now read all ones.
    for (auto& fd : vectors_) base::eventfd_signal(fd.get());
  }

  void stop() {
    closing_flag_.store(true);
    {
      std::lock_guard lock(out_mu_);
      closing_ = true;
    }
    out_cv_.notify_all();
    // What was queued goes out first (the device's last register writes and
    // unmappings) and reaches the board before shutdown() cancels what is in
    // flight; kCloseDrain at most, then the link is shut down, which ends
    // every wait on it.
    if (out_thread_.joinable()) {
      const auto deadline = std::chrono::steady_clock::now() + kCloseDrain;
      {
        std::unique_lock lock(out_mu_);
        out_done_cv_.wait_until(lock, deadline, [&] { return out_done_; });
      }
      link_->drain_out(std::max(std::chrono::milliseconds(0), std::chrono::duration_cast<std::chrono::milliseconds>(
                                                                  deadline - std::chrono::steady_clock::now())));
    }
    link_->shutdown();
    if (out_thread_.joinable()) out_thread_.join();
    lose("closed");
    if (in_thread_.joinable()) in_thread_.join();
    if (irq_thread_.joinable()) irq_thread_.join();
  }

  void serve_out() {
    struct Done {
      UsbTransport& t;
      ~Done() {
        {
          std::lock_guard lock(t.out_mu_);
          t.out_done_ = true;
        }
        t.out_done_cv_.notify_all();
      }
    } done{*this};
    std::vector<Outgoing> batch;
    for (;;) {
      batch.clear();
      std::size_t bytes = 0;
      {
        std::unique_lock lock(out_mu_);
        out_cv_.wait(lock, [&] { return closing_ || lost_.load() || !out_.empty(); });
        if (out_.empty() || lost_.load()) return;  // closing sends what was queued first
        // An answer to a board read goes alone; small messages share a transfer.
        while (!out_.empty() && (batch.empty() || (!batch.front().read && !out_.front().read &&
                                                   bytes + out_.front().bytes.size() <= kBatchBytes))) {
          bytes += out_.front().bytes.size();
          batch.push_back(std::move(out_.front()));
          out_.pop_front();
        }
      }
      const bool sent = batch.front().read ? answer(*batch.front().read) : send_batch(batch, bytes);
      if (!sent) {
        lose("a bulk OUT transfer failed");
        return;
      }
    }
  }

  // Small messages, copied into one transfer; their buffers are kept for
  // the next ones.
  bool send_batch(std::vector<Outgoing>& batch, std::size_t bytes) {
    std::span<std::byte> to = link_->out_buffer(bytes);
    if (to.size() < bytes) return false;
    std::size_t at = 0;
    for (const Outgoing& o : batch) {
      std::memcpy(to.data() + at, o.bytes.data(), o.bytes.size());
      at += o.bytes.size();
    }
    {
      std::lock_guard lock(out_mu_);
      for (Outgoing& o : batch)
        if (spare_.size() < kSpareBuffers) spare_.push_back(std::move(o.bytes));
    }
    return link_->send_out(bytes);
  }

  // A board read of host memory, answered from the mapping straight into
  // the transfer's buffer: host-data with the bytes, or with the fault flag
  // and none if no mapping (still) allows the read.
  // (The decoder took only reads of 1..max_data_ bytes.)
  bool answer(const HostReadRequest& r) {
    const std::size_t whole = sizeof(fw::UsbHeader) + r.size;
    std::span<std::byte> to = link_->out_buffer(whole);
    if (to.size() < whole) return false;
    fw::UsbHeader h = fw::usb_header(fw::UsbType::kHostData, r.tag, r.iova, 0, static_cast<std::uint32_t>(r.size));
    bool ok = false;
    {
      std::shared_lock lock(map_mu_);
      if (std::byte* from = host_range(r.iova, r.size, false)) {
        read_host(to.data() + sizeof h, from, r.size);
        ok = true;
      }
    }
    if (!ok) {
      refused_reads_.fetch_add(1, std::memory_order_relaxed);
      h.flags = fw::kUsbFlagFault;
      h.data_bytes = 0;
    }
    std::memcpy(to.data(), &h, sizeof h);
    return link_->send_out(ok ? whole : sizeof h);
  }

  // Applies one board message; false if the stream cannot be trusted.
  bool apply(const fw::UsbMessage& m) {
    switch (m.type) {
      case fw::UsbType::kRegValue:
      case fw::UsbType::kMemData:
      case fw::UsbType::kFwStatus:
      case fw::UsbType::kError: {
        if (m.type == fw::UsbType::kError && m.tag == 0) {
          base::logger("tpu")->error("{}: the board refused a {} message ({})", bus_,
                                     fw::to_string(static_cast<fw::UsbType>(m.arg[1])),
                                     fw::to_string(static_cast<fw::CmdStatus>(m.arg[0])));
          return true;
        }
        {
          std::lock_guard lock(reply_mu_);
          auto it = replies_.find(m.tag);
          if (it == replies_.end()) return true;  // its waiter gave up
          it->second->done = true;
          it->second->failed = m.type == fw::UsbType::kError;
          it->second->value = m.arg[1];
        }
        reply_cv_.notify_all();
        return true;
      }
      case fw::UsbType::kHostRead: {
        // Answered by the OUT thread, which reads the mapping into the
        // transfer itself (this thread must never wait for bulk OUT: the
        // board may be waiting for this one to read bulk IN).
        {
          std::lock_guard lock(out_mu_);
          if (lost_.load() || closing_) return true;
          out_.push_back({{}, HostReadRequest{m.tag, m.arg[0], m.arg[1]}});
        }
        out_cv_.notify_one();
        return true;
      }
      case fw::UsbType::kHostWrite: {
        std::shared_lock lock(map_mu_);
        std::byte* at = host_range(m.arg[0], m.data.size(), true);
        if (!at) {
          if (refused_writes_.fetch_add(1, std::memory_order_relaxed) < 8)
            base::logger("tpu")->error(
                "{}: the board wrote {} bytes at IOVA {:#x}, which is not mapped for it to write", bus_, m.data.size(),
                m.arg[0]);
          return true;
        }
        write_host(at, m.data.data(), m.data.size());
        return true;
      }
      default: return false;
    }
  }

  // Host memory for [iova, iova + size) if one mapping holds it with the
  // access asked for (map_mu_ held), else nullptr.
  std::byte* host_range(std::uint64_t iova, std::uint64_t size, bool write) {
    auto it = windows_.upper_bound(iova);
    if (it == windows_.begin() || size == 0) return nullptr;
    --it;
    const std::uint64_t off = iova - it->first;
    if (off >= it->second.size || size > it->second.size - off || (write && !it->second.writes)) return nullptr;
    return it->second.host + off;
  }

  // Board messages are applied where the link received them; one that
  // straddles two transfers is assembled first (fw::UsbSplitter).
  void serve_in() {
    fw::UsbSplitter split(fw::UsbDirection::kToHost, max_data_);
    for (;;) {
      std::span<const std::byte> got = link_->peek_in();
      if (got.empty()) return lose("the cable was pulled or the board reset (bulk IN ended)");
      auto fed = split.feed(got, [this](std::span<const std::byte> m) { return handle(m); });
      if (!fed) return lose("its bulk IN stream is out of step: " + fw::describe_usb_problem(fed.problem()));
      if (*fed == fw::UsbSplitter::Fed::kStopped) return;  // lost: late messages are not applied
      link_->release_in();
    }
  }

  // Decodes, checks and applies one whole board message; false once the
  // board is lost.
  bool handle(std::span<const std::byte> bytes) {
    if (lost_.load()) return false;
    auto m = fw::decode_usb_message(bytes, fw::UsbDirection::kToHost, fw::kBar0Size, max_data_);
    std::string wrong;
    if (!m)
      wrong = "it sent a malformed message: " + fw::describe_usb_problem(m.problem());
    else if (m->sequence != fw::usb_wire_sequence(applied_ + 1))
      wrong = "its message " + std::to_string(m->sequence) + " came after " +
              std::to_string(fw::usb_wire_sequence(applied_));
    else if (!apply(*m))
      wrong = std::string("it sent an unexpected ") + fw::to_string(m->type);
    if (!wrong.empty()) {
      lose(wrong);
      return false;
    }
    {
      std::lock_guard lock(seq_mu_);
      ++applied_;
    }
    if (irq_waiting_.load(std::memory_order_acquire)) seq_cv_.notify_all();
    return true;
  }

  void serve_irq() {
    for (;;) {
      std::byte raw[64];
      const std::size_t n = link_->interrupt_in(raw);
      if (n == 0) return lose("the cable was pulled or the board reset (interrupt IN ended)");
      auto irq = fw::decode_usb_interrupt({raw, n});
      if (!irq) return lose("it sent a malformed interrupt: " + fw::describe_usb_problem(irq.problem()));
      {
        // Whatever the board wrote before the interrupt is applied first.
        std::unique_lock lock(seq_mu_);
        irq_waiting_.store(true, std::memory_order_release);
        seq_cv_.wait(lock, [&] { return applied_ >= irq->after_sequence || lost_.load(); });
        irq_waiting_.store(false, std::memory_order_relaxed);
      }
      if (lost_.load()) return;
      for (std::uint32_t v = 0; v < vectors_.size(); ++v)
        if (irq->vectors & (1u << v)) base::eventfd_signal(vectors_[v].get());
    }
  }

  std::unique_ptr<UsbLink> link_;
  const std::string bus_;
  std::uint32_t max_data_ = fw::kUsbMaxData;
  base::Mapping aperture_;
  std::vector<base::UniqueFd> vectors_;  // fixed before the threads start
  std::uint32_t used_vectors_ = 0;

  std::shared_mutex map_mu_;
  std::map<std::uint64_t, Window> windows_;  // by IOVA; guarded

  std::mutex reply_mu_;
  std::condition_variable reply_cv_;
  std::unordered_map<std::uint64_t, Reply*> replies_;  // guarded
  std::uint64_t next_tag_ = 0;                         // guarded

  std::mutex seq_mu_;
  std::condition_variable seq_cv_;
  std::uint64_t applied_ = 0;  // the last board message applied; guarded (written by the in thread)
  std::atomic<bool> irq_waiting_{false};

  std::mutex out_mu_;
  std::condition_variable out_cv_;
  static constexpr std::size_t kSpareBuffers = 8;
  std::vector<std::vector<std::byte>> spare_;  // guarded by out_mu_
  std::deque<Outgoing> out_;                   // guarded
  bool closing_ = false;                       // guarded
  bool out_done_ = false;                      // the OUT thread has ended; guarded
  std::condition_variable out_done_cv_;
  std::atomic<bool> closing_flag_{false};
  std::atomic<bool> lost_{false};
  std::atomic<std::uint64_t> refused_reads_{0}, refused_writes_{0};

  std::thread out_thread_, in_thread_, irq_thread_;
};

}  // namespace

std::span<std::byte> UsbLink::out_buffer(std::size_t bytes) {
  if (out_stage_.size() < bytes) out_stage_.resize(bytes);
  return {out_stage_.data(), bytes};
}

bool UsbLink::send_out(std::size_t n) { return bulk_out({out_stage_.data(), n}); }

std::span<const std::byte> UsbLink::peek_in() {
  if (in_staged_ == 0) {
    if (in_stage_.empty()) in_stage_.resize(sizeof(fw::UsbHeader) + fw::kUsbMaxData);
    in_staged_ = bulk_in(in_stage_);
  }
  return {in_stage_.data(), in_staged_};
}

void UsbLink::release_in() { in_staged_ = 0; }

std::unique_ptr<Transport> make_usb_transport(std::unique_ptr<UsbLink> link) {
  return std::make_unique<UsbTransport>(std::move(link));
}

}  // namespace tpuhal::tpu
