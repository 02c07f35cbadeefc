#include "codec_unit.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <new>
#include <utility>

#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include "../dma_engine.h"
#include <spdlog/spdlog.h>

#include "tpuhal/base/ffmpeg.h"
#include "tpuhal/base/log.h"
#include "tpuhal/base/wait.h"
#include "tpuhal/fw/status.h"
#include "tpuhal/fw/version.h"

namespace tpuhal::sim {
namespace {

template <typename T>
T load_acquire(T& v) {
  return std::atomic_ref<T>(v).load(std::memory_order_acquire);
}
template <typename T>
void store_release(T& v, T value) {
  std::atomic_ref<T>(v).store(value, std::memory_order_release);
}

// out[2i] = u[i], out[2i + 1] = v[i]: NV12's chroma row from I420's.
void interleave_uv(std::uint8_t* out, const std::uint8_t* u, const std::uint8_t* v, std::uint32_t n) {
  std::uint32_t x = 0;
#ifdef __SSE2__
  for (; x + 16 <= n; x += 16) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(u + x));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(v + x));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 2 * x), _mm_unpacklo_epi8(a, b));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 2 * x + 16), _mm_unpackhi_epi8(a, b));
  }
#endif
  for (; x < n; ++x) {
    out[2 * x] = u[x];
    out[2 * x + 1] = v[x];
  }
}

// dst[0, n) = src[0, n) with streaming stores where dst is 16-byte aligned:
// a frame goes to device DRAM that the decoder will not read again, so it
// should neither be read in first nor push the decoder's reference frames
// out of the caches. The caller fences (_mm_sfence) before publishing.
void copy_stream(std::byte* dst, const std::uint8_t* src, std::uint32_t n) {
  std::uint32_t x = 0;
#ifdef __SSE2__
  if ((reinterpret_cast<std::uintptr_t>(dst) & 15) == 0)
    for (; x + 64 <= n; x += 64) {
      const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + x));
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + x + 16));
      const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + x + 32));
      const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + x + 48));
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + x), a);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + x + 16), b);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + x + 32), c);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + x + 48), d);
    }
#endif
  std::memcpy(dst + x, src + x, n - x);
}

AVCodecID codec_id(fw::VideoCodec c) {
  switch (c) {
    case fw::VideoCodec::kH264: return AV_CODEC_ID_H264;
    case fw::VideoCodec::kH265: return AV_CODEC_ID_HEVC;
    case fw::VideoCodec::kJpeg: return AV_CODEC_ID_MJPEG;
  }
  return AV_CODEC_ID_NONE;
}

}  // namespace

struct CodecUnit::Channel {
  CodecUnit* unit = nullptr;
  std::uint32_t number = 0;

  std::mutex mu;  // guards the fields up to work_mu
  bool open = false;
  bool scheduled = false;      // in the run queue or being processed
  bool kicked = false;         // a doorbell since its turn began
  std::deque<Packet> pending;  // each charged to the unit's memory
  fw::VideoOpenArgs args{};
  std::uint32_t queue = 0;

  // Held by the decode thread whose turn it is, and by close(); guards the
  // decoder state below.
  std::mutex work_mu;
  AVCodecContext* ctx = nullptr;
  AVPacket* pkt = nullptr;
  AVFrame* frame = nullptr;
  bool frame_ready = false;            // `frame` holds a frame not yet published
  std::deque<fw::FrameRecord> outbox;  // error and end-of-stream records to publish
  std::uint64_t published = 0;         // records written
  std::uint64_t taken = 0;             // packets taken from `pending`
  std::uint64_t last_packet = 0;       // index of the last packet sent to the decoder
  std::uint64_t frames = 0;
  // The decoder's frame buffers (get_buffer): bytes referenced now, and
  // bytes charged to the unit: the most ever referenced since the decoder
  // was made, as libavcodec keeps released buffers in its pools. A buffer
  // is released where its frame is unreferenced, always under work_mu.
  std::uint64_t frames_live = 0;
  std::uint64_t frames_charged = 0;
  bool out_of_memory = false;  // get_buffer refused a frame since it was last reported
  // The modelled clock (Clock): the latest arrival of a packet sent to the
  // decoder, and the end of the channel's last frame.
  std::uint64_t fed_ns = 0;
  std::uint64_t done_ns = 0;

  // Telemetry since power-on (fw::TelemetryChannel): never reset.
  std::atomic<std::uint64_t> t_packets{0}, t_frames{0}, t_errors{0}, t_busy_ns{0};

  void free_decoder() {
    const base::ffmpeg::Api& av = unit->av_;
    av.avcodec_free_context(&ctx);
    av.av_packet_free(&pkt);
    av.av_frame_free(&frame);
    frame_ready = false;
    outbox.clear();
    // Every buffer has come back with the context's pools.
    unit->uncharge(frames_charged);
    frames_charged = 0;
    out_of_memory = false;
  }
};

CodecUnit::CodecUnit(const base::ffmpeg::Api& av, DmaEngine& dma, IommuDomain& iommu, std::uint32_t channels,
                     std::uint32_t threads, std::uint64_t memory, Raise raise, void* board,
                     const std::atomic<bool>& halted, const std::atomic<std::uint32_t>& driver_version, Clock clock)
    : av_(av),
      dma_(dma),
      iommu_(iommu),
      raise_(raise),
      board_(board),
      halted_(halted),
      driver_version_(driver_version),
      clock_(clock),
      memory_limit_(memory) {
  // libavcodec reports every damaged macroblock on stderr; the board reports
  // errors through its records instead.
  if (!base::logger("video")->should_log(spdlog::level::debug)) av_.av_log_set_level(AV_LOG_FATAL);
  channels_.reserve(channels);
  for (std::uint32_t i = 0; i < channels; ++i) {
    channels_.push_back(std::make_unique<Channel>());
    channels_.back()->number = i;
    channels_.back()->unit = this;
  }
  threads = std::max<std::uint32_t>(threads, 1);
  for (std::uint32_t i = 0; i < threads; ++i) workers_.emplace_back([this, i] { worker(i); });
}

CodecUnit::~CodecUnit() {
  close_all();
  {
    std::lock_guard lock(run_mu_);
    stopping_ = true;
  }
  run_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

fw::Problem CodecUnit::open(const fw::VideoOpenArgs& a, std::uint32_t queue, DmaContext& ctx) {
  if (a.channel >= channels_.size()) return {fw::CmdStatus::kBadArgument, 0, a.channel, channels_.size()};
  Channel& c = *channels_[a.channel];
  {
    std::lock_guard lock(c.mu);
    if (c.open) return {fw::CmdStatus::kBadArgument, 0, a.channel, channels_.size()};
  }
  // The page must be host memory mapped both ways, the pool device DRAM.
  {
    DmaAccess access(ctx);
    const std::uint64_t page_bytes = fw::video_page_bytes(a.slot_count, a.record_count);
    std::byte* page =
        fw::is_host_address(a.page) ? access.translate(a.page, page_bytes, kIommuRead | kIommuWrite) : nullptr;
    if (!page) return {fw::CmdStatus::kDmaFault, 2, a.page, fw::kAccessWrite};
    if (fw::is_host_address(a.pool) || !dma_.resolve(access, a.pool, a.slot_bytes * a.slot_count, kIommuWrite))
      return {fw::CmdStatus::kDmaFault, 3, a.pool, fw::kAccessWrite};
    auto* hdr = reinterpret_cast<fw::VideoChannelHeader*>(page);
    store_release(hdr->published, std::uint64_t{0});
    store_release(hdr->packets_done, std::uint64_t{0});
    store_release(hdr->frames, std::uint64_t{0});
    store_release(hdr->waiting, std::uint32_t{0});
  }
  std::lock_guard work(c.work_mu);
  const AVCodec* codec = av_.avcodec_find_decoder(codec_id(a.codec));
  c.ctx = codec ? av_.avcodec_alloc_context3(codec) : nullptr;
  c.pkt = av_.av_packet_alloc();
  c.frame = av_.av_frame_alloc();
  if (!c.ctx || !c.pkt || !c.frame) {
    c.free_decoder();
    return {fw::CmdStatus::kBadArgument, 1, static_cast<std::uint64_t>(a.codec), 0};
  }
  c.ctx->thread_count = 1;                  // the unit's decode threads are the parallelism
  c.ctx->err_recognition |= AV_EF_EXPLODE;  // damaged data is an error, not a concealed frame
  // Frames come from the unit's memory. A stream of far more pixels than
  // the channel's slots hold is refused before the decoder sizes its
  // tables for it; one a little larger decodes, and its frames are
  // reported as too large for the slots.
  c.ctx->opaque = &c;
  c.ctx->get_buffer2 = &CodecUnit::get_buffer;
  c.ctx->max_pixels = std::int64_t{4} * a.max_width * a.max_height;
  if (av_.avcodec_open2(c.ctx, codec, nullptr) < 0) {
    c.free_decoder();
    return {fw::CmdStatus::kBadArgument, 1, static_cast<std::uint64_t>(a.codec), 0};
  }
  c.published = c.taken = c.last_packet = c.frames = 0;
  c.fed_ns = c.done_ns = 0;
  std::lock_guard lock(c.mu);
  c.args = a;
  c.queue = queue;
  drop_pending(c);
  // A turn of the channel's previous opening may still be ending: it saw
  // `scheduled` set, so a decode() now leaves its packet to that turn, which
  // must not conclude from the old decoder's full slots that it should wait
  // for a doorbell.
  c.kicked = true;
  c.open = true;
  return {};
}

fw::Problem CodecUnit::decode(const fw::VideoDecodeArgs& a, DmaContext& ctx, std::uint64_t arrival_ns) {
  if (a.channel >= channels_.size()) return {fw::CmdStatus::kBadArgument, 0, a.channel, channels_.size()};
  Channel& c = *channels_[a.channel];
  const fw::Problem closed{fw::CmdStatus::kBadArgument, 0, a.channel, channels_.size()};
  // A driver before interface 1.8 knows no kOutOfMemory: the packet's size
  // is the argument out of range for it.
  const bool speaks_oom = (driver_version_.load() & 0xFFFF) >= fw::kMinorOutOfMemory;
  auto out_of_memory = [&](std::uint64_t limit, std::uint64_t detail) {
    return speaks_oom ? fw::Problem{fw::CmdStatus::kOutOfMemory, fw::Problem::kNoField, limit, detail}
                      : fw::Problem{fw::CmdStatus::kBadArgument, 2, a.bytes, limit};
  };
  const fw::Problem queue_full = out_of_memory(fw::kMaxVideoPendingPackets, fw::kMemoryVideoPackets);
  {
    std::lock_guard lock(c.mu);
    if (!c.open) return closed;
    if (c.pending.size() >= fw::kMaxVideoPendingPackets) return queue_full;
  }
  Packet p;
  p.pts = a.pts;
  p.index = a.index;
  p.arrival_ns = arrival_ns;
  p.eos = a.eos;
  if (a.bytes) {
    // The packet's memory is charged before it is taken: a client cannot
    // make the unit hold more than its working memory, however many
    // channels it opens and however large its packets.
    const std::uint64_t need = a.bytes + AV_INPUT_BUFFER_PADDING_SIZE;
    if (!charge(need)) return out_of_memory(memory_limit_, fw::kMemoryVideoUnit);
    p.charged = need;
    try {
      p.data.resize(need);
    } catch (const std::bad_alloc&) {
      uncharge(need);
      return out_of_memory(need, fw::kMemoryHost);
    }
    auto problem = dma_.read(ctx, a.packet, p.data.data(), a.bytes, 1);
    if (problem.status != fw::CmdStatus::kOk) {
      uncharge(need);
      return problem;
    }
    std::memset(p.data.data() + a.bytes, 0, AV_INPUT_BUFFER_PADDING_SIZE);
    p.data.resize(a.bytes);  // capacity keeps the zeroed padding
  }
  std::lock_guard lock(c.mu);
  // Closed, or filled from another queue, while the packet was read.
  if (!c.open || c.pending.size() >= fw::kMaxVideoPendingPackets) {
    uncharge(p.charged);
    return c.open ? queue_full : closed;
  }
  c.pending.push_back(std::move(p));
  if (!c.scheduled) schedule(c);
  return {};
}

fw::Problem CodecUnit::close(std::uint32_t channel) {
  if (channel >= channels_.size()) return {fw::CmdStatus::kBadArgument, 0, channel, channels_.size()};
  Channel& c = *channels_[channel];
  {
    std::lock_guard lock(c.mu);
    c.open = false;
    drop_pending(c);
  }
  // Waits out a turn in progress; after this no thread touches the page or
  // the pool until the channel is opened again.
  std::lock_guard work(c.work_mu);
  c.free_decoder();
  return {};
}

void CodecUnit::close_all() noexcept {
  for (std::uint32_t i = 0; i < channels_.size(); ++i) close(i);
}

void CodecUnit::close_queue(std::uint32_t queue) noexcept {
  for (std::uint32_t i = 0; i < channels_.size(); ++i) {
    bool mine;
    {
      std::lock_guard lock(channels_[i]->mu);
      mine = channels_[i]->open && channels_[i]->queue == queue;
    }
    if (mine) close(i);
  }
}

void CodecUnit::wait_halted() noexcept {
  // A turn holds its channel's work_mu throughout and checks `halted_` under
  // it: one that began before the board halted is waited out here; one that
  // begins after sees it and does nothing.
  for (auto& c : channels_) {
    std::lock_guard work(c->work_mu);
  }
}

bool CodecUnit::charge(std::uint64_t bytes) noexcept {
  std::uint64_t used = memory_used_.load(std::memory_order_relaxed);
  do {
    if (bytes > memory_limit_ || used > memory_limit_ - bytes) return false;
  } while (!memory_used_.compare_exchange_weak(used, used + bytes, std::memory_order_relaxed));
  return true;
}

void CodecUnit::uncharge(std::uint64_t bytes) noexcept { memory_used_.fetch_sub(bytes, std::memory_order_relaxed); }

void CodecUnit::drop_pending(Channel& c) noexcept {
  for (const Packet& p : c.pending) uncharge(p.charged);
  c.pending.clear();
}

namespace {
// One frame buffer of a decoder, wrapped so that its release is counted.
struct HeldBuffer {
  const base::ffmpeg::Api* av;
  AVBufferRef* inner;
  std::uint64_t* live;
  std::uint64_t bytes;
};
void release_buffer(void* opaque, std::uint8_t*) {
  auto* h = static_cast<HeldBuffer*>(opaque);
  *h->live -= h->bytes;
  h->av->av_buffer_unref(&h->inner);
  delete h;
}
}  // namespace

int CodecUnit::get_buffer(AVCodecContext* s, AVFrame* f, int flags) {
  Channel& c = *static_cast<Channel*>(s->opaque);
  const base::ffmpeg::Api& av = c.unit->av_;
  const int r = av.avcodec_default_get_buffer2(s, f, flags);
  if (r < 0) return r;
  std::uint64_t bytes = 0;
  for (const AVBufferRef* b : f->buf)  // 4:2:0 has no extended_buf
    if (b) bytes += b->size;
  // Past the most ever referenced, the pools grow: charge the growth.
  if (c.frames_live + bytes > c.frames_charged) {
    const std::uint64_t more = c.frames_live + bytes - c.frames_charged;
    if (!c.unit->charge(more)) {
      av.av_frame_unref(f);
      c.out_of_memory = true;
      return AVERROR(ENOMEM);
    }
    c.frames_charged += more;
  }
  for (AVBufferRef*& b : f->buf) {
    if (!b) continue;
    auto* held = new (std::nothrow) HeldBuffer{&av, b, &c.frames_live, static_cast<std::uint64_t>(b->size)};
    AVBufferRef* outer = held ? av.av_buffer_create(b->data, b->size, release_buffer, held, 0) : nullptr;
    if (!outer) {
      delete held;
      av.av_frame_unref(f);  // the buffers wrapped so far are counted out again
      c.out_of_memory = true;
      return AVERROR(ENOMEM);
    }
    c.frames_live += held->bytes;
    b = outer;
  }
  return 0;
}

void CodecUnit::doorbell(std::uint32_t channel) noexcept {
  if (channel >= channels_.size()) return;
  Channel& c = *channels_[channel];
  std::lock_guard lock(c.mu);
  c.kicked = true;
  if (c.open && !c.scheduled) schedule(c);
}

void CodecUnit::schedule(Channel& c) {
  c.scheduled = true;
  {
    std::lock_guard lock(run_mu_);
    run_queue_.push_back(&c);
  }
  run_cv_.notify_one();
}

void CodecUnit::worker(std::uint32_t) {
  DmaContext ctx(iommu_);
  for (;;) {
    Channel* c = nullptr;
    {
      std::unique_lock lock(run_mu_);
      run_cv_.wait(lock, [&] { return stopping_ || !run_queue_.empty(); });
      if (run_queue_.empty()) return;
      c = run_queue_.front();
      run_queue_.pop_front();
    }
    bool blocked = false, halted = false;
    {
      std::lock_guard work(c->work_mu);
      bool open;
      {
        std::lock_guard lock(c->mu);
        open = c->open;
        c->kicked = false;
      }
      // A halted board decodes nothing; its reset closes every channel.
      halted = halted_.load(std::memory_order_seq_cst);
      if (open && c->ctx && !halted) {
        const std::uint64_t began = base::monotonic_ns();
        try {
          blocked = !process(*c, ctx);
        } catch (const std::bad_alloc&) {
          // The host is out of memory: this turn's packet is lost, the
          // unit goes on.
          base::logger("video")->error("channel {}: out of host memory; a packet was dropped", c->number);
        }
        c->t_busy_ns.fetch_add(base::monotonic_ns() - began, std::memory_order_relaxed);
      }
    }
    // Another turn if packets are left (its budget ran out, or more came),
    // or if it waited for a slot and the host has freed one since. `halted`
    // is read again: a turn that began while the board was halted may end
    // after a reset, a reopen and a decode that saw this turn's `scheduled`
    // and so left the packet to it.
    std::lock_guard lock(c->mu);
    c->scheduled = false;
    halted = halted_.load(std::memory_order_seq_cst);
    const bool again = !halted && c->open && (blocked ? c->kicked : !c->pending.empty());
    if (again) schedule(*c);
  }
}

bool CodecUnit::process(Channel& c, DmaContext& ctx) {
  const fw::VideoOpenArgs& a = c.args;
  DmaAccess access(ctx);
  std::byte* page =
      access.translate(a.page, fw::video_page_bytes(a.slot_count, a.record_count), kIommuRead | kIommuWrite);
  if (!page) {
    // The host unmapped an open channel's page: nothing can be reported.
    base::logger("video")->error("channel {}: page at {:#x} is no longer mapped; dropping its packets", c.number,
                                 a.page);
    std::lock_guard lock(c.mu);
    drop_pending(c);
    return true;
  }
  auto* hdr = reinterpret_cast<fw::VideoChannelHeader*>(page);
  auto* slots = reinterpret_cast<std::uint32_t*>(page + fw::video_slots_offset());
  auto* records = reinterpret_cast<fw::FrameRecord*>(page + fw::video_records_offset(a.slot_count));
  bool raised = false;

  auto record_space = [&] { return c.published - load_acquire(hdr->consumed) < a.record_count; };
  auto publish = [&](const fw::FrameRecord& r) {
    std::memcpy(&records[c.published % a.record_count], &r, sizeof r);
    // seq_cst: pairs with the driver's interrupt unmask and re-check.
    std::atomic_ref<std::uint64_t>(hdr->published).store(++c.published, std::memory_order_seq_cst);
    raised = true;
  };
  auto error = [&](fw::CmdStatus status, std::uint64_t packet, std::uint32_t detail) {
    fw::FrameRecord r{};
    r.kind = static_cast<std::uint32_t>(fw::RecordKind::kError);
    r.packet = packet;
    r.status = static_cast<std::uint32_t>(status);
    r.detail = detail;
    c.outbox.push_back(r);
    c.t_errors.fetch_add(1, std::memory_order_relaxed);
  };
  // A packet the decoder failed on: out of the unit's memory if get_buffer
  // refused it a frame, else the stream's fault.
  auto failed = [&](std::uint64_t packet, int code) {
    if ((std::exchange(c.out_of_memory, false) || code == AVERROR(ENOMEM)) &&
        (driver_version_.load() & 0xFFFF) >= fw::kMinorOutOfMemory)
      error(fw::CmdStatus::kOutOfMemory, packet, fw::kMemoryVideoUnit);
    else
      error(fw::CmdStatus::kCorruptStream, packet, static_cast<std::uint32_t>(-code));
  };
  // Publishes c.frame; false if it must wait for a slot or a record.
  auto publish_frame = [&]() -> bool {
    const AVFrame& f = *c.frame;
    const std::uint64_t packet = static_cast<std::uint64_t>(f.pkt_pos >= 0 ? f.pkt_pos : 0);
    if (f.format != AV_PIX_FMT_YUV420P && f.format != AV_PIX_FMT_YUVJ420P) {
      error(fw::CmdStatus::kUnsupportedStream, packet, fw::kVideoDetailPixelFormat);
      return true;
    }
    if (f.width <= 0 || f.height <= 0 || static_cast<std::uint32_t>(f.width) > a.max_width ||
        static_cast<std::uint32_t>(f.height) > a.max_height) {
      error(fw::CmdStatus::kUnsupportedStream, packet, fw::kVideoDetailTooLarge);
      return true;
    }
    if (!record_space()) return false;
    std::uint32_t slot = a.slot_count;
    for (std::uint32_t s = 0; s < a.slot_count && slot == a.slot_count; ++s)
      if (load_acquire(slots[s]) == fw::kSlotFree) slot = s;
    if (slot == a.slot_count) return false;
    const auto w = static_cast<std::uint32_t>(f.width), h = static_cast<std::uint32_t>(f.height);
    const fw::PlaneLayout L = fw::plane_layout(w, h, a.layout);
    std::byte* dst = dma_.resolve(access, a.pool + std::uint64_t{slot} * a.slot_bytes, L.bytes, kIommuWrite);
    if (!dst) {
      error(fw::CmdStatus::kDmaFault, packet, 0);
      return true;
    }
    auto rows = [](std::byte* out, std::uint32_t pitch, const std::uint8_t* in, int in_pitch, std::uint32_t bytes,
                   std::uint32_t n) {
      for (std::uint32_t r = 0; r < n; ++r)
        copy_stream(out + std::uint64_t{r} * pitch, in + std::int64_t{r} * in_pitch, bytes);
    };
    rows(dst + L.offset[0], L.pitch[0], f.data[0], f.linesize[0], L.row_bytes[0], L.rows[0]);
    const std::uint32_t cw = (w + 1) / 2;
    if (a.layout == fw::PixelLayout::kI420) {
      rows(dst + L.offset[1], L.pitch[1], f.data[1], f.linesize[1], cw, L.rows[1]);
      rows(dst + L.offset[2], L.pitch[2], f.data[2], f.linesize[2], cw, L.rows[2]);
    } else {
      for (std::uint32_t r = 0; r < L.rows[1]; ++r)
        interleave_uv(reinterpret_cast<std::uint8_t*>(dst + L.offset[1] + std::uint64_t{r} * L.pitch[1]),
                      f.data[1] + std::int64_t{r} * f.linesize[1], f.data[2] + std::int64_t{r} * f.linesize[2], cw);
    }
#ifdef __SSE2__
    _mm_sfence();  // the streaming stores land before the record says so
#endif
    fw::FrameRecord r{};
    r.kind = static_cast<std::uint32_t>(fw::RecordKind::kFrame);
    fw::set_frame_done_ns(r, frame_done(c));
    r.slot = slot;
    r.packet = packet;
    r.pts = f.pts != AV_NOPTS_VALUE ? f.pts : f.best_effort_timestamp;
    r.width = w;
    r.height = h;
    for (std::uint32_t p = 0; p < L.planes; ++p) {
      r.pitch[p] = L.pitch[p];
      r.offset[p] = static_cast<std::uint32_t>(L.offset[p]);
    }
    store_release(slots[slot], fw::kSlotHeld);
    publish(r);
    std::atomic_ref<std::uint64_t>(hdr->frames).store(++c.frames, std::memory_order_release);
    c.t_frames.fetch_add(1, std::memory_order_relaxed);
    return true;
  };

  int budget = 16;  // packets per turn, so that busy channels share the threads
  bool blocked = false;
  for (;;) {
    // Records owed first, in order, then the frame in hand.
    while (!c.outbox.empty() && record_space()) {
      publish(c.outbox.front());
      c.outbox.pop_front();
    }
    if (!c.outbox.empty()) {
      blocked = true;
      break;
    }
    if (c.frame_ready) {
      if (!publish_frame()) {
        blocked = true;
        break;
      }
      c.frame_ready = false;
      av_.av_frame_unref(c.frame);
      continue;
    }
    const int r = av_.avcodec_receive_frame(c.ctx, c.frame);
    if (r == 0) {
      if (c.frame->decode_error_flags || (c.frame->flags & AV_FRAME_FLAG_CORRUPT)) {
        error(fw::CmdStatus::kCorruptStream, static_cast<std::uint64_t>(std::max<std::int64_t>(c.frame->pkt_pos, 0)),
              static_cast<std::uint32_t>(c.frame->decode_error_flags));
        av_.av_frame_unref(c.frame);
      } else {
        c.frame_ready = true;
      }
      continue;
    }
    if (r == AVERROR_EOF) {  // drained after an end-of-stream marker
      fw::FrameRecord eos{};
      eos.kind = static_cast<std::uint32_t>(fw::RecordKind::kEos);
      eos.packet = c.last_packet;
      c.outbox.push_back(eos);
      av_.avcodec_flush_buffers(c.ctx);
      continue;
    }
    if (r != AVERROR(EAGAIN)) {
      failed(c.last_packet, r);
      continue;
    }
    // Everything the packets taken so far will give has been published.
    store_release(hdr->packets_done, c.taken);
    if (budget-- == 0 || halted_.load(std::memory_order_relaxed)) break;
    Packet p;
    {
      std::lock_guard lock(c.mu);
      if (c.pending.empty()) break;
      p = std::move(c.pending.front());
      c.pending.pop_front();
    }
    c.last_packet = p.index;
    c.fed_ns = std::max(c.fed_ns, p.arrival_ns);
    if (p.eos) {
      ++c.taken;
      uncharge(p.charged);  // an end-of-stream marker's data is not decoded
      av_.avcodec_send_packet(c.ctx, nullptr);
      continue;
    }
    c.pkt->data = p.data.data();
    c.pkt->size = static_cast<int>(p.data.size());
    c.pkt->pts = p.pts;
    c.pkt->dts = AV_NOPTS_VALUE;
    c.pkt->pos = static_cast<std::int64_t>(p.index);
    const int s = av_.avcodec_send_packet(c.ctx, c.pkt);
    ++c.taken;
    c.t_packets.fetch_add(1, std::memory_order_relaxed);
    p.data = {};
    uncharge(p.charged);  // libavcodec has what it needs of the packet
    if (s < 0) failed(p.index, s);
  }
  store_release(hdr->waiting, blocked ? 1u : 0u);
  if (raised) raise_(board_, c.queue);
  return !blocked;
}

std::uint64_t CodecUnit::frame_done(Channel& c) {
  if (!clock_.timing) return clock_.now(board_);
  const AVFrame& f = *c.frame;
  const fw::FrameType type = f.pict_type == AV_PICTURE_TYPE_I   ? fw::FrameType::kIntra
                             : f.pict_type == AV_PICTURE_TYPE_B ? fw::FrameType::kBidirectional
                                                                : fw::FrameType::kPredicted;
  const std::uint64_t cost = fw::decode_ns(*clock_.timing, c.args.codec, type, static_cast<std::uint32_t>(f.width),
                                           static_cast<std::uint32_t>(f.height));
  // The unit is the channels': the frame starts when both are ready. A
  // frame that comes out after later packets (reordering) starts no
  // earlier than the packet that let it out.
  const std::uint64_t ready = std::max(c.fed_ns, c.done_ns);
  std::uint64_t free = clock_.unit_free->load(std::memory_order_relaxed);
  std::uint64_t begin;
  do {
    begin = std::max(ready, free);
  } while (!clock_.unit_free->compare_exchange_weak(free, begin + cost, std::memory_order_acq_rel));
  c.done_ns = begin + cost;
  return c.done_ns;
}

void CodecUnit::telemetry(std::uint32_t channel, fw::TelemetryChannel& out) const noexcept {
  const Channel& c = *channels_[channel];
  out.packets = c.t_packets.load(std::memory_order_relaxed);
  out.frames = c.t_frames.load(std::memory_order_relaxed);
  out.errors = c.t_errors.load(std::memory_order_relaxed);
  out.busy_ns = c.t_busy_ns.load(std::memory_order_relaxed);
}

}  // namespace tpuhal::sim
