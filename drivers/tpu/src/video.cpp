// Decoder channels of the board's codec unit (fw/video.h): the channel page
// and packet staging in pinned host memory, the frame pool in device memory,
// commands on a video queue that every decoder of the device shares.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <mutex>
#include <vector>

#include <spdlog/spdlog.h>

#include "device_impl.h"
#include "tpuhal/fw/decode.h"
#include "tpuhal/fw/version.h"
#include "tpuhal/fw/video.h"

namespace tpuhal::tpu {

// The video queue that every decoder of a device shares, and what the board
// may still be using of channels whose close it did not confirm (the queue
// failed or hangs, the board stopped or went away): their page, frame pool,
// packet staging and channel number. Resetting the queue closes every
// channel it opened, so they are let go once it is reset, when the last
// decoder on it goes. (Device::reset closes them on the board too; the
// queue, failed from then on, still keeps them until that moment.)
struct VideoQueue {
  std::shared_ptr<TpuQueue> queue;
  std::atomic<bool> hung{false};  // a close timed out: later ones do not wait
  std::mutex mu;
  std::vector<std::shared_ptr<void>> parked;  // guarded by mu

  ~VideoQueue() {
    queue.reset();  // ~TpuQueue resets the hardware queue: the board closes its channels
    parked.clear();
  }
};

namespace {

using namespace std::chrono_literals;

driver::DecoderEvent event(driver::DecoderEvent::Kind kind) {
  driver::DecoderEvent e;
  e.kind = kind;
  return e;
}

template <typename T>
T load_acquire(const T& v) {
  return std::atomic_ref<T>(const_cast<T&>(v)).load(std::memory_order_acquire);
}
template <typename T>
void store_release(T& v, T value) {
  std::atomic_ref<T>(v).store(value, std::memory_order_release);
}

fw::VideoCodec to_fw(Codec c) {
  switch (c) {
    case Codec::H264: return fw::VideoCodec::kH264;
    case Codec::H265: return fw::VideoCodec::kH265;
    case Codec::Jpeg: return fw::VideoCodec::kJpeg;
  }
  return fw::VideoCodec::kH264;
}

// What outlives the decoder while frames are held: the page (slot words),
// the pool, and which slots the caller holds.
struct Channel {
  std::shared_ptr<TpuDevice> dev;
  std::uint32_t number = 0;
  fw::VideoOpenArgs open{};
  std::shared_ptr<driver::BufferBackend> page, pool;
  std::byte* page_data = nullptr;
  std::vector<std::atomic<bool>> held;  // by a Frame the caller has
  std::atomic<std::uint32_t> held_count{0};
  base::EventCount released;  // a frame buffer came back, or interrupt()

  fw::VideoChannelHeader& header() const { return *reinterpret_cast<fw::VideoChannelHeader*>(page_data); }
  std::uint32_t& slot_word(std::uint32_t s) const {
    return reinterpret_cast<std::uint32_t*>(page_data + fw::video_slots_offset())[s];
  }
  const fw::FrameRecord& record(std::uint64_t n) const {
    return reinterpret_cast<const fw::FrameRecord*>(page_data +
                                                    fw::video_records_offset(open.slot_count))[n % open.record_count];
  }
  void release(std::uint32_t slot) {
    held[slot].store(false, std::memory_order_relaxed);
    held_count.fetch_sub(1, std::memory_order_relaxed);
    store_release(slot_word(slot), fw::kSlotFree);
    dev->transport().write32(fw::reg::kVideoDoorbell, number);  // a waiting channel resumes
    released.notify();
  }
};

// One frame buffer of a channel's pool, handed to the caller.
class SlotBuffer final : public driver::BufferBackend {
 public:
  SlotBuffer(std::shared_ptr<Channel> ch, std::uint32_t slot) : ch_(std::move(ch)), slot_(slot) {}
  ~SlotBuffer() override { ch_->release(slot_); }
  std::uint64_t size() const override { return ch_->open.slot_bytes; }
  Memory memory() const override { return Memory::Device; }
  const std::string& heap() const override { return ch_->pool->heap(); }
  std::uint64_t device_address() const override {
    return ch_->pool->device_address() + std::uint64_t{slot_} * ch_->open.slot_bytes;
  }
  std::span<std::byte> map() override {
    return ch_->pool->map().subspan(std::uint64_t{slot_} * ch_->open.slot_bytes, ch_->open.slot_bytes);
  }

 private:
  std::shared_ptr<Channel> ch_;
  std::uint32_t slot_;
};

// A channel whose close the board did not confirm, kept by its VideoQueue:
// its number is given back when the queue has been reset.
struct ParkedChannel {
  std::shared_ptr<Channel> ch;
  std::shared_ptr<driver::BufferBackend> staging;
  ~ParkedChannel() {
    if (ch) ch->dev->release_decoder_channel(ch->number);
  }
};

class TpuDecoder final : public driver::DecoderBackend {
 public:
  TpuDecoder(std::shared_ptr<TpuDevice> dev, std::shared_ptr<VideoQueue> vq, std::uint32_t number,
             const driver::DecoderConfig& config)
      : dev_(std::move(dev)), vq_(std::move(vq)), queue_(vq_->queue.get()), config_(config) {
    ch_ = std::make_shared<Channel>();
    ch_->dev = dev_;
    ch_->number = number;
    fw::VideoOpenArgs& o = ch_->open;
    o.channel = number;
    o.codec = to_fw(config.codec);
    o.layout = config.format == PixelFormat::NV12 ? fw::PixelLayout::kNv12 : fw::PixelLayout::kI420;
    o.max_width = config.max_width;
    o.max_height = config.max_height;
    o.slot_count = config.frame_buffers;
    o.record_count = std::min<std::uint32_t>(fw::kMaxVideoRecords, 2 * config.frame_buffers + 16);
    o.slot_bytes = (fw::plane_layout(o.max_width, o.max_height, o.layout).bytes + 4095) / 4096 * 4096;
    // The pool in the video heap where the board has one.
    AllocOptions pool_options;
    pool_options.alignment = 4096;
    for (const auto& h : dev_->properties().heaps)
      if (h.name == "vpu") pool_options.heap = h.name;
    ch_->pool = dev_->allocate(o.slot_bytes * o.slot_count, Memory::Device, pool_options);
    ch_->page = dev_->allocate(fw::video_page_bytes(o.slot_count, o.record_count), Memory::HostPinned, {});
    ch_->page_data = ch_->page->map().data();
    o.pool = ch_->pool->device_address();
    o.page = ch_->page->device_address();
    ch_->held = std::vector<std::atomic<bool>>(o.slot_count);
    staging_ = dev_->allocate(staging_bytes(o.max_width, o.max_height), Memory::HostPinned, {});
    send_open();
  }

  ~TpuDecoder() override {
    // The board must be done with the page, the pool and the staging ring
    // before they can go, and with the channel before its number is reused:
    // wait for the close. If the board does not confirm it, they stay with
    // the video queue until the queue is reset (VideoQueue). Once a close
    // has timed out the queue is taken to hang, and closing the other
    // channels on it does not wait again.
    try {
      if (vq_->hung.load(std::memory_order_relaxed))
        throw Error(Status::Timeout, queue_->name() + " did not complete a close before");
      const std::uint64_t fence = submit(close_descriptor());
      wait_fence(fence, 5s);
      dev_->release_decoder_channel(ch_->number);
      return;
    } catch (const std::exception& e) {
      if (const auto* err = dynamic_cast<const Error*>(&e); err && err->status() == Status::Timeout)
        vq_->hung.store(true, std::memory_order_relaxed);
      dev_->log->warn("{}: the board did not confirm its close ({}); its memory is kept until {} is reset", name(),
                      e.what(), queue_->name());
    }
    auto parked = std::make_shared<ParkedChannel>();
    parked->ch = ch_;
    parked->staging = staging_;
    std::lock_guard lock(vq_->mu);
    vq_->parked.push_back(std::move(parked));
  }

  std::uint32_t channel() const override { return ch_->number; }

  void send(std::span<const std::byte> data, std::int64_t pts, std::uint64_t index, bool eos,
            std::optional<std::uint64_t> arrival_ns) override {
    check_queue();
    // A packet timed to the board's clock: a kWaitTime before it.
    fw::CommandDescriptor timed[2]{};
    if (arrival_ns) {
      timed[0].opcode = static_cast<std::uint16_t>(fw::Opcode::kWaitTime);
      timed[0].args[0] = *arrival_ns;
    }
    fw::CommandDescriptor& d = timed[1];
    d.opcode = static_cast<std::uint16_t>(fw::Opcode::kVideoDecode);
    d.args[0] = ch_->number;
    d.args[3] = static_cast<std::uint64_t>(pts);
    d.args[4] = index;
    if (eos) {
      d.args[5] = fw::kVideoPacketEos;
    } else {
      if (data.size() > fw::kMaxVideoPacketBytes)
        throw Error(Status::InvalidArgument, name() + ": packet " + std::to_string(index) + " of " +
                                                 std::to_string(data.size()) + " bytes is larger than the " +
                                                 std::to_string(fw::kMaxVideoPacketBytes >> 20) +
                                                 " MiB the unit takes");
      throttle(index);
      const std::uint64_t at = stage(data);
      d.args[1] = staging_->device_address() + at;
      d.args[2] = data.size();
    }
    const std::uint64_t fence = arrival_ns ? submit(timed) : submit(d);
    if (!eos) in_flight_.push_back({staging_end_, fence, index});
    ++sent_;
  }

  driver::DecoderEvent receive(std::chrono::nanoseconds timeout) override {
    fw::VideoChannelHeader& h = ch_->header();
    std::uint64_t last_progress = base::monotonic_ns();
    std::uint64_t seen_done = load_acquire(h.packets_done);
    for (;;) {
      check_queue();
      if (interrupted_.exchange(false, std::memory_order_acq_rel))
        return event(driver::DecoderEvent::Kind::Interrupted);
      if (auto ev = poll()) return *ev;
      const std::uint64_t done = load_acquire(h.packets_done);
      if (done != seen_done) {
        seen_done = done;
        last_progress = base::monotonic_ns();
      }
      const bool waiting = load_acquire(h.waiting) != 0;
      if (done >= sent_ && !waiting && load_acquire(h.published) == consumed_)
        return event(driver::DecoderEvent::Kind::NeedInput);
      if (waiting && ch_->held_count.load(std::memory_order_relaxed) == ch_->open.slot_count) {
        if (timeout.count() == 0 && config_.frame_buffer_wait.count() > 0)
          return event(driver::DecoderEvent::Kind::Timeout);  // a poll: the caller chose to wait, later
        if (!wait_for_frame_buffer())
          throw Error(Status::ResourceExhausted,
                      name() + ": the caller holds all " + std::to_string(ch_->open.slot_count) +
                          " frame buffers and the board has frames waiting for one" +
                          (config_.frame_buffer_wait.count() > 0
                               ? " (none came back for " +
                                     std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(
                                                        config_.frame_buffer_wait)
                                                        .count()) +
                                     " ms)"
                               : std::string()) +
                          "; drop frames when done with them, or raise VideoDecoderOptions::frame_buffers");
        last_progress = base::monotonic_ns();  // the board could not go on while they were held
        continue;
      }
      const std::uint64_t now = base::monotonic_ns();
      if (now - last_progress >= static_cast<std::uint64_t>(timeout.count())) {
        driver::DecoderEvent ev = event(driver::DecoderEvent::Kind::Timeout);
        // Where the board is stuck, for the caller's Timeout (a poll that
        // found nothing needs none).
        if (timeout.count() > 0)
          ev.error = Error(Status::Timeout, "the board has taken " + std::to_string(done) + " of the " +
                                                std::to_string(sent_) + " packets sent; " + queue_->name() + ": " +
                                                queue_->diagnose());
        return ev;
      }
      wait_interrupt(
          std::min<std::uint64_t>(10'000'000, static_cast<std::uint64_t>(timeout.count()) - (now - last_progress)));
    }
  }

  void interrupt() noexcept override {
    interrupted_.store(true, std::memory_order_release);
    ch_->released.notify();
  }

  void reset() override {
    check_queue();
    // Frames the caller holds keep their slots; the rest are free again.
    const std::uint64_t fence = submit(close_descriptor());
    wait_fence(fence, 5s);
    // The board is done with the channel: start its page afresh.
    fw::VideoChannelHeader& h = ch_->header();
    store_release(h.published, std::uint64_t{0});
    store_release(h.packets_done, std::uint64_t{0});
    store_release(h.frames, std::uint64_t{0});
    store_release(h.waiting, std::uint32_t{0});
    store_release(h.consumed, std::uint64_t{0});
    for (std::uint32_t s = 0; s < ch_->open.slot_count; ++s)
      if (!ch_->held[s].load(std::memory_order_relaxed)) store_release(ch_->slot_word(s), fw::kSlotFree);
    consumed_ = 0;
    sent_ = 0;
    interrupted_.store(false, std::memory_order_release);  // one meant for the stream that ended
    send_open();
  }

 private:
  struct InFlight {
    std::uint64_t end;  // staging position after the packet
    std::uint64_t fence;
    std::uint64_t packet;  // its index
  };
  // The packet staging ring: room for a few uncompressed-size packets (a
  // compressed picture is almost always far smaller), so that 192 channels
  // of 360p do not pin 8 MiB each; a larger packet gets a ring of its own.
  static std::uint64_t staging_bytes(std::uint32_t width, std::uint32_t height) {
    const std::uint64_t raw = std::uint64_t{width} * height * 3 / 2;
    return (std::clamp<std::uint64_t>(2 * raw, 256ull << 10, 8ull << 20) + 4095) / 4096 * 4096;
  }
  // Packets sent and not yet decoded: within what the board queues.
  static constexpr std::uint64_t kMaxBacklog = fw::kMaxVideoPendingPackets;

  std::string name() const { return dev_->uri() + " video channel " + std::to_string(ch_->number); }

  void check_queue() {
    if (queue_->timeline().failed) throw queue_error(queue_->failure());
  }

  // An error of the video queue, which every channel shares, said of this
  // channel, and of its packet if the command that failed was one.
  Error queue_error(const Error& e) const {
    std::string packet;
    const fw::FenceRecord& rec = dev_->hw_queue(queue_->index()).page->fence;
    if (load_acquire(rec.value) & fw::kTimelineFailed) {  // the record is written before the bit
      for (const InFlight& f : in_flight_)
        if (f.fence == rec.error_fence) packet = "packet " + std::to_string(f.packet) + " was not decoded: ";
    }
    return Error(e.status(), name() + ": " + packet + e.what());
  }

  std::uint64_t submit(const fw::CommandDescriptor& d) { return submit(std::span(&d, 1)); }
  std::uint64_t submit(std::span<const fw::CommandDescriptor> d) {
    try {
      return queue_->submit_raw(d);
    } catch (const Error& e) {
      throw queue_error(e);
    }
  }

  fw::CommandDescriptor close_descriptor() const {
    fw::CommandDescriptor d{};
    d.opcode = static_cast<std::uint16_t>(fw::Opcode::kVideoClose);
    d.args[0] = ch_->number;
    return d;
  }

  void send_open() {
    const fw::VideoOpenArgs& o = ch_->open;
    fw::CommandDescriptor d{};
    d.opcode = static_cast<std::uint16_t>(fw::Opcode::kVideoOpen);
    d.args[0] = o.channel;
    d.args[1] = static_cast<std::uint64_t>(o.codec) | static_cast<std::uint64_t>(o.layout) << 8 |
                std::uint64_t{o.max_width} << 16 | std::uint64_t{o.max_height} << 32;
    d.args[2] = o.page;
    d.args[3] = o.pool;
    d.args[4] = o.slot_bytes;
    d.args[5] = o.slot_count | std::uint64_t{o.record_count} << 32;
    submit(d);
  }

  void wait_fence(std::uint64_t fence, std::chrono::nanoseconds max) {
    const std::uint64_t deadline = base::monotonic_ns() + static_cast<std::uint64_t>(max.count());
    for (;;) {
      const auto t = queue_->timeline();
      if (t.completed >= fence) return;
      if (t.failed) throw queue_error(queue_->failure());
      const std::uint64_t now = base::monotonic_ns();
      if (now >= deadline) throw Error(Status::Timeout, name() + ": the board did not answer");
      queue_->block(fence, std::chrono::nanoseconds(std::min<std::uint64_t>(deadline - now, 10'000'000)));
    }
  }

  // Waits (bounded) while the board is far behind the packets sent.
  // Waits up to config_.frame_buffer_wait for the caller to drop a frame
  // (or for interrupt()): true if one came back or the wait was
  // interrupted, false if none came back in time (or no wait was asked for).
  bool wait_for_frame_buffer() {
    const std::uint64_t wait_ns = static_cast<std::uint64_t>(config_.frame_buffer_wait.count());
    const std::uint64_t start = base::monotonic_ns();
    for (;;) {
      if (ch_->held_count.load(std::memory_order_relaxed) < ch_->open.slot_count ||
          interrupted_.load(std::memory_order_acquire))
        return true;
      const std::uint64_t waited = base::monotonic_ns() - start;
      if (waited >= wait_ns) return false;
      auto ticket = ch_->released.prepare();
      if (ch_->held_count.load(std::memory_order_relaxed) < ch_->open.slot_count ||
          interrupted_.load(std::memory_order_acquire)) {
        ch_->released.cancel();
        return true;
      }
      // Slices: the queue failing is noticed too (the caller's next check).
      ch_->released.wait(ticket, std::chrono::nanoseconds(std::min<std::uint64_t>(wait_ns - waited, 100'000'000)));
      check_queue();
    }
  }

  void throttle(std::uint64_t index) {
    fw::VideoChannelHeader& h = ch_->header();
    const std::uint64_t start = base::monotonic_ns();
    while (sent_ - std::min(sent_, load_acquire(h.packets_done)) >= kMaxBacklog) {
      check_queue();
      if (load_acquire(h.waiting) != 0)
        throw Error(Status::ResourceExhausted,
                    name() + ": packet " + std::to_string(index) + ": the board is waiting for frame buffers with " +
                        std::to_string(sent_ - load_acquire(h.packets_done)) +
                        " packets queued; receive() frames (and drop the ones you are done with) before sending more");
      if (base::monotonic_ns() - start > 30'000'000'000ull)
        throw Error(Status::Timeout, name() + ": the board decoded nothing for 30 s");
      // Woken by a packet decoded, not by frames waiting for receive(): the
      // caller cannot take those until this returns.
      wait_interrupt(10'000'000, sent_ - kMaxBacklog + 1);
    }
  }

  // Copies a packet into the staging ring; returns its offset.
  std::uint64_t stage(std::span<const std::byte> data) {
    const std::uint64_t cap = staging_->size(), len = data.size();
    if (len > cap) {
      // A packet larger than the ring: a ring of its own, once the old one is idle.
      while (!in_flight_.empty()) {
        wait_fence(in_flight_.back().fence, 30s);
        in_flight_.clear();
      }
      staging_ = dev_->allocate((len + 4095) / 4096 * 4096, Memory::HostPinned, {});
      staging_head_ = staging_end_ = 0;
      return stage(data);
    }
    std::uint64_t at = staging_end_ % cap;
    std::uint64_t start = staging_end_;
    if (at + len > cap) {  // no wrapping inside a packet
      start += cap - at;
      at = 0;
    }
    // Room once packets before have been read by the board.
    while (start + len - staging_head_ > cap) {
      if (in_flight_.empty()) {
        staging_head_ = start;
        break;
      }
      wait_fence(in_flight_.front().fence, 30s);
      staging_head_ = in_flight_.front().end;
      in_flight_.pop_front();
    }
    while (!in_flight_.empty() && queue_->timeline().completed >= in_flight_.front().fence) {
      staging_head_ = in_flight_.front().end;
      in_flight_.pop_front();
    }
    std::memcpy(staging_->map().data() + at, data.data(), len);
    staging_end_ = start + len;
    return at;
  }

  // Sleeps (at most `ns`) until the board publishes a frame record or, with
  // `packets` set, until that many packets are decoded (then records
  // waiting do not end the sleep).
  void wait_interrupt(std::uint64_t ns, std::optional<std::uint64_t> packets = std::nullopt) {
    HwQueue& hq = dev_->hw_queue(queue_->index());
    dev_->arm_interrupt(queue_->index());
    auto ticket = hq.irq.prepare();
    const fw::VideoChannelHeader& h = ch_->header();
    bool slept = false;
    const bool ready = packets ? load_acquire(h.packets_done) >= *packets
                               : load_acquire(h.published) != consumed_ || load_acquire(h.packets_done) >= sent_;
    if (ready) {
      hq.irq.cancel();
    } else {
      hq.irq.wait(ticket, std::chrono::nanoseconds(ns));
      slept = true;
    }
    dev_->disarm_interrupt(queue_->index());
    // Interrupts may be lost, and a board that went away sends none: a sleep
    // that ends with nothing new looks at the board's STATUS (a board that
    // stopped fails the queue, which the caller's next check_queue reports).
    if (slept && (packets ? load_acquire(h.packets_done) < *packets : load_acquire(h.published) == consumed_))
      dev_->check_health();
  }

  // The next record, if the board has published one.
  std::optional<driver::DecoderEvent> poll() {
    fw::VideoChannelHeader& h = ch_->header();
    if (load_acquire(h.published) == consumed_) return std::nullopt;
    fw::FrameRecord raw;
    std::memcpy(&raw, &ch_->record(consumed_), sizeof raw);
    store_release(h.consumed, ++consumed_);
    auto rec = fw::decode_frame_record(raw, ch_->open);
    if (!rec)
      throw Error(Status::DeviceFault,
                  name() + ": the board wrote a bad frame record: " + fw::describe(rec.problem(), 0));
    driver::DecoderEvent ev;
    ev.packet = rec->packet;
    switch (static_cast<fw::RecordKind>(rec->kind)) {
      case fw::RecordKind::kFrame: {
        ev.kind = driver::DecoderEvent::Kind::Frame;
        if (ch_->held[rec->slot].exchange(true))
          throw Error(Status::DeviceFault, name() + ": the board reused frame buffer " + std::to_string(rec->slot) +
                                               " while the caller still holds it");
        ch_->held_count.fetch_add(1, std::memory_order_relaxed);
        ev.buffer = std::make_shared<SlotBuffer>(ch_, rec->slot);
        ev.width = rec->width;
        ev.height = rec->height;
        ev.pts = rec->pts;
        if (dev_->properties().caps.wait_time) ev.done_ns = fw::frame_done_ns(*rec);
        const fw::PlaneLayout L = fw::plane_layout(rec->width, rec->height, ch_->open.layout);
        ev.planes = L.planes;
        for (std::uint32_t p = 0; p < L.planes; ++p) ev.plane[p] = {L.offset[p], L.pitch[p], L.row_bytes[p], L.rows[p]};
        return ev;
      }
      case fw::RecordKind::kError: {
        ev.kind = driver::DecoderEvent::Kind::Error;
        const auto status = static_cast<fw::CmdStatus>(rec->status);
        const Status s = status == fw::CmdStatus::kCorruptStream ? Status::InvalidArgument
                         : status == fw::CmdStatus::kUnsupportedStream && rec->detail == fw::kVideoDetailTooLarge
                             ? Status::OutOfRange
                         : status == fw::CmdStatus::kUnsupportedStream ? Status::Unsupported
                         : status == fw::CmdStatus::kOutOfMemory       ? Status::ResourceExhausted
                                                                       : Status::DeviceFault;
        ev.error = Error(s, name() + ": " + fw::describe(status, 0, 0, rec->packet, rec->detail));
        return ev;
      }
      case fw::RecordKind::kEos: ev.kind = driver::DecoderEvent::Kind::EndOfStream; return ev;
    }
    return std::nullopt;
  }

  std::shared_ptr<TpuDevice> dev_;
  std::shared_ptr<VideoQueue> vq_;
  TpuQueue* const queue_;  // vq_'s
  driver::DecoderConfig config_;
  std::shared_ptr<Channel> ch_;
  std::shared_ptr<driver::BufferBackend> staging_;
  std::uint64_t staging_head_ = 0, staging_end_ = 0;
  std::deque<InFlight> in_flight_;
  std::uint64_t sent_ = 0;      // packets (and end-of-stream markers) sent
  std::uint64_t consumed_ = 0;  // records read
  std::atomic<bool> interrupted_{false};
};

}  // namespace

std::shared_ptr<driver::DecoderBackend> TpuDevice::open_decoder(const driver::DecoderConfig& config) {
  if (!props_.caps.video_decode)
    throw Error(Status::Unsupported, uri() + ": the board has no video decoder (caps.video_decode is false)");
  std::uint32_t number = 0;
  {
    std::lock_guard lock(video_mu_);
    if (decoder_channels_.empty()) decoder_channels_.assign(props_.decode_channels, false);
    auto it = std::find(decoder_channels_.begin(), decoder_channels_.end(), false);
    if (it == decoder_channels_.end())
      throw Error(Status::ResourceExhausted, uri() + ": all " + std::to_string(props_.decode_channels) +
                                                 " decoder channels are open; close a VideoDecoder first");
    *it = true;
    number = static_cast<std::uint32_t>(it - decoder_channels_.begin());
  }
  // A shared queue that has failed (a fault, or Device::reset) is left to
  // the decoders on it, and let go outside video_mu_: its end may give back
  // parked channels' numbers.
  std::shared_ptr<VideoQueue> failed;
  try {
    std::shared_ptr<VideoQueue> vq;
    {
      std::lock_guard lock(video_mu_);
      vq = video_queue_.lock();
      if (vq && vq->queue->timeline().failed) failed = std::move(vq);
      if (!vq) {
        std::shared_ptr<driver::QueueBackend> q;
        try {
          q = create_queue(Engine::Video, QueueOptions{});
        } catch (const Error& e) {
          if (!failed || e.status() != Status::ResourceExhausted) throw;
          const Error f = failed->queue->failure();
          throw Error(f.status(), uri() +
                                      ": no video queue for a new decoder: the one the open decoders share failed (" +
                                      f.what() + "); release those decoders (their frames may stay) to open new ones");
        }
        vq = std::make_shared<VideoQueue>();
        vq->queue = std::static_pointer_cast<TpuQueue>(q);
        video_queue_ = vq;
      }
    }
    return std::make_shared<TpuDecoder>(shared_from_this(), std::move(vq), number, config);
  } catch (...) {
    release_decoder_channel(number);
    throw;
  }
}

void TpuDevice::release_decoder_channel(std::uint32_t number) noexcept {
  std::lock_guard lock(video_mu_);
  if (number < decoder_channels_.size()) decoder_channels_[number] = false;
}

}  // namespace tpuhal::tpu
