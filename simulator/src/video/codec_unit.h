// The simulated board's video codec unit: decoder channels on libavcodec,
// run by a fixed pool of decode threads shared by every channel
// (docs/simulator.md, fw/video.h for the protocol).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "tpuhal/fw/decode.h"
#include "tpuhal/fw/telemetry.h"
#include "tpuhal/fw/timing.h"
#include "tpuhal/sim/iommu.h"

struct AVCodecContext;
struct AVFrame;

namespace tpuhal::base::ffmpeg {
struct Api;
}

namespace tpuhal::sim {

class DmaEngine;

class CodecUnit {
 public:
  // `raise(queue)` signals the interrupt vector of a video queue. While
  // `halted` (the board's: its firmware crashed or the board is lost) no
  // decode thread starts a turn. `memory` bounds the unit's working memory:
  // the packets queued and the frames its decoders allocate.
  // `driver_version` is the interface the driver agreed on (reg
  // kDriverVersion): before 1.8 a refusal for memory is reported in 1.7's
  // terms.
  // `av` is FFmpeg, loaded (base::ffmpeg::Part::kDecode).
  using Raise = void (*)(void* board, std::uint32_t queue);
  // When the unit finishes each frame (fw::frame_done_ns, docs/timing.md).
  // With a timing model, a frame occupies the video unit, which every
  // channel shares, for its modelled time (fw::decode_ns), starting no
  // earlier than the packet that gave it arrived, the channel's previous
  // frame ended and the unit is free; `unit_free` is the unit's modelled
  // free time, the board's. Without one, a frame is stamped with the board's
  // time (`now`) when it is published.
  struct Clock {
    const fw::TimingModel* timing = nullptr;
    std::atomic<std::uint64_t>* unit_free = nullptr;
    std::uint64_t (*now)(const void* board) = nullptr;
  };
  CodecUnit(const base::ffmpeg::Api& av, DmaEngine& dma, IommuDomain& iommu, std::uint32_t channels,
            std::uint32_t threads, std::uint64_t memory, Raise raise, void* board, const std::atomic<bool>& halted,
            const std::atomic<std::uint32_t>& driver_version, Clock clock);
  ~CodecUnit();  // closes every channel and joins the decode threads

  std::uint32_t channels() const noexcept { return static_cast<std::uint32_t>(channels_.size()); }
  std::uint32_t threads() const noexcept { return static_cast<std::uint32_t>(workers_.size()); }

  // Command processor side, in each video queue's order. `ctx` is the
  // calling command processor's DMA context; `arrival_ns` the queue's
  // clock when it hands the packet over.
  fw::Problem open(const fw::VideoOpenArgs& a, std::uint32_t queue, DmaContext& ctx);
  fw::Problem decode(const fw::VideoDecodeArgs& a, DmaContext& ctx, std::uint64_t arrival_ns);
  fw::Problem close(std::uint32_t channel);

  // reg::kVideoDoorbell: the host freed slots of `channel`.
  void doorbell(std::uint32_t channel) noexcept;
  // Closes every channel (board reset), or those a queue opened (its reset).
  void close_all() noexcept;
  void close_queue(std::uint32_t queue) noexcept;
  // Called once the board has set `halted`: returns when no turn is in
  // progress, so that nothing more is written to pages or frame pools.
  void wait_halted() noexcept;
  // The working memory charged now (packets queued, decoders' frames) and
  // its bound.
  std::uint64_t memory_used() const noexcept { return memory_used_.load(std::memory_order_relaxed); }
  std::uint64_t memory_limit() const noexcept { return memory_limit_; }
  // Channel `channel`'s counters since power-on (channel < channels()).
  void telemetry(std::uint32_t channel, fw::TelemetryChannel& out) const noexcept;

 private:
  struct Channel;
  struct Packet {
    std::vector<std::uint8_t> data;  // with libavcodec's zeroed input padding
    std::uint64_t charged = 0;       // working memory it holds
    std::int64_t pts;
    std::uint64_t index;
    std::uint64_t arrival_ns = 0;  // board time it was handed over
    bool eos;
  };
  // The board time the frame in c.frame is finished (Clock); advances the
  // unit's and the channel's modelled time. Runs with c.work_mu held.
  std::uint64_t frame_done(Channel& c);
  // Takes `bytes` of the working memory; false (nothing taken) if they do
  // not fit.
  bool charge(std::uint64_t bytes) noexcept;
  void uncharge(std::uint64_t bytes) noexcept;
  // libavcodec's get_buffer2 for the unit's decoders: its frames, charged.
  static int get_buffer(::AVCodecContext* s, ::AVFrame* f, int flags);
  // Empties `c.pending`, giving back its charge; the caller holds c.mu.
  void drop_pending(Channel& c) noexcept;
  void worker(std::uint32_t id);
  void schedule(Channel& c);  // caller holds c.mu
  // Decodes queued packets of `c` and publishes frames until it runs out of
  // input or its turn; false if it stopped for want of a free slot or
  // record. Runs with c.work_mu held.
  bool process(Channel& c, DmaContext& ctx);

  const base::ffmpeg::Api& av_;
  DmaEngine& dma_;
  IommuDomain& iommu_;
  Raise raise_;
  void* board_;
  const std::atomic<bool>& halted_;
  const std::atomic<std::uint32_t>& driver_version_;
  const Clock clock_;
  const std::uint64_t memory_limit_;
  std::atomic<std::uint64_t> memory_used_{0};
  std::vector<std::unique_ptr<Channel>> channels_;

  std::mutex run_mu_;
  std::condition_variable run_cv_;
  std::deque<Channel*> run_queue_;  // guarded by run_mu_
  bool stopping_ = false;           // guarded by run_mu_
  std::vector<std::thread> workers_;
};

}  // namespace tpuhal::sim
