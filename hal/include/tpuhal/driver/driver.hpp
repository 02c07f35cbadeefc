// The driver interface: the only thing a backend implements.
//
// A Provider owns a URI scheme ("sim", "pcie", "cuda") and turns URIs into
// DeviceBackends. The HAL above does argument checking, buffer lifetimes
// across queued work, and the wait policy (spin, block, progress-aware
// timeouts), so a backend implements only the device's own mechanics.
// Optional features default to Status::Unsupported (see Capabilities).
// drivers/skeleton/ is a complete, compiling starting point for a new one.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "tpuhal/driver/op_desc.hpp"
#include "tpuhal/error.hpp"
#include "tpuhal/export.hpp"
#include "tpuhal/monitor.hpp"
#include "tpuhal/types.hpp"

namespace tpuhal::driver {

class QueueBackend;
class ProgramBackend;

class TPUHAL_API BufferBackend {
 public:
  virtual ~BufferBackend();
  virtual std::uint64_t size() const = 0;
  virtual Memory memory() const = 0;
  virtual const std::string& heap() const = 0;
  virtual std::uint64_t device_address() const = 0;
  // Host view; throw Error(Unsupported, ...) where the memory is not mappable.
  virtual std::span<std::byte> map() = 0;
};

// Commands, already checked by the HAL: buffers are live and belong to the
// queue's device, ranges lie inside their buffers, alignment rules hold.
struct BufferRange {
  BufferBackend* buffer = nullptr;
  std::uint64_t offset = 0;
};
namespace cmd {
struct Copy {
  BufferRange src, dst;
  std::uint64_t size = 0;
};
struct Fill {
  BufferRange dst;
  std::uint64_t size = 0;
  std::uint32_t pattern = 0;
  std::uint32_t pattern_bytes = 1;
};
struct WaitFence {
  QueueBackend* queue = nullptr;  // same device
  std::uint64_t value = 0;
};
struct WaitValue {
  BufferRange location;
  std::uint64_t value = 0;
};
struct WriteValue {
  BufferRange location;
  std::uint64_t value = 0;
};
struct Timestamp {
  BufferRange location;
  // Added by tracing (trace.hpp), not by the caller: messages that number
  // the caller's commands leave it out.
  bool traced = false;
};
// A tensor op (op_desc.hpp); the OpDesc lives until the submission returns.
struct Run {
  const OpDesc* op = nullptr;
};
// Replays a program made by DeviceBackend::create_program.
struct Call {
  ProgramBackend* program = nullptr;
};
// The queue's next command starts no earlier than board time `ns`
// (caps.wait_time).
struct WaitTime {
  std::uint64_t ns = 0;
};
}  // namespace cmd
using Command = std::variant<cmd::Copy, cmd::Fill, cmd::WaitFence, cmd::WaitValue, cmd::WriteValue, cmd::Timestamp,
                             cmd::Run, cmd::Call, cmd::WaitTime>;

// A recorded command list, uploaded once, replayed by cmd::Call. The HAL
// keeps the buffers it refers to alive as long as the program lives.
class TPUHAL_API ProgramBackend {
 public:
  virtual ~ProgramBackend();
  virtual std::size_t size() const = 0;  // commands recorded
};

// A queue's timeline as last seen: the value reached and whether it failed.
struct Timeline {
  std::uint64_t completed = 0;
  bool failed = false;
};

class TPUHAL_API QueueBackend {
 public:
  virtual ~QueueBackend();
  virtual Engine engine() const = 0;
  virtual std::uint32_t index() const = 0;

  // Submits `commands` (possibly none: a fence-only submission) as one unit
  // and returns its timeline value, one more than the previous submission's.
  // Waits up to `max_wait` for ring space while the queue makes progress,
  // then throws QueueFull. Thread-safe.
  virtual std::uint64_t submit(std::span<const Command> commands, std::chrono::nanoseconds max_wait) = 0;
  // Cheap (no system call): the HAL spins on it.
  virtual Timeline timeline() const = 0;
  virtual std::uint64_t submitted() const = 0;
  // Moves whenever the queue makes forward progress.
  virtual std::uint64_t progress() const = 0;
  // The error describing the failure; only called once timeline().failed.
  virtual Error failure() const = 0;
  // Sleeps until timeline().completed >= value, the queue fails, or `max`
  // passes; may return early. Thread-safe.
  virtual void block(std::uint64_t value, std::chrono::nanoseconds max) = 0;
  // Stops the hardware queue, discarding work not yet complete, and returns
  // once the board no longer touches memory that work referred to. The
  // timeline then reads failed. Called when a queue is released with work
  // that did not finish within the wait timeout.
  virtual void abort() = 0;
  virtual std::optional<std::uint64_t> timestamp_ns(std::uint64_t value) const;
  virtual QueueStatus status() const = 0;
  // Why the queue seems stuck, for a timeout message ("blocked in wait_value
  // at ring position 17"); empty if nothing to add.
  virtual std::string diagnose() const;
};

// One decoder channel of a codec unit (VideoDecoder). The HAL checks
// arguments and serialises calls on one decoder; channels are independent.
struct DecoderConfig {
  Codec codec = Codec::H264;
  PixelFormat format = PixelFormat::NV12;
  std::uint32_t max_width = 0, max_height = 0;  // frames larger are errors
  std::uint32_t frame_buffers = 0;              // output slots
  // How long receive() waits for the caller to drop a frame when it holds
  // every frame buffer and the board has a frame for one (0: not at all).
  std::chrono::nanoseconds frame_buffer_wait{0};
};
struct FramePlane {
  std::uint64_t offset = 0;  // in the frame's buffer
  std::uint32_t pitch = 0;   // bytes from one row to the next
  std::uint32_t row_bytes = 0, rows = 0;
};
struct DecoderEvent {
  enum class Kind : std::uint8_t {
    Frame,        // `buffer` and the fields below hold a frame
    Error,        // `error` says what went wrong with packet `packet`
    EndOfStream,  // every frame before the end-of-stream marker came out
    NeedInput,    // nothing more will come until more packets are sent
    Timeout,      // nothing came within the time given
    Interrupted,  // interrupt() ended the wait
  };
  Kind kind = Kind::Timeout;
  // Frame: device memory holding the frame; releasing the last reference
  // returns it to the channel.
  std::shared_ptr<BufferBackend> buffer;
  std::uint32_t width = 0, height = 0;
  std::int64_t pts = 0;
  std::uint64_t packet = 0;              // the packet it came from (Error: the packet at fault)
  std::optional<std::uint64_t> done_ns;  // Frame: board time the unit finished it (caps.wait_time)
  std::uint32_t planes = 0;
  FramePlane plane[3];
  std::optional<Error> error;
};
class TPUHAL_API DecoderBackend {
 public:
  virtual ~DecoderBackend();
  virtual std::uint32_t channel() const = 0;
  // Hands the board one packet (copied before returning), or the end of the
  // stream (`data` empty, `eos`). With `arrival_ns` (caps.wait_time), the
  // board takes the packet no earlier than that board time. Throws
  // ResourceExhausted when the caller holds every frame buffer and the board
  // has packets it cannot finish.
  virtual void send(std::span<const std::byte> data, std::int64_t pts, std::uint64_t index, bool eos,
                    std::optional<std::uint64_t> arrival_ns) = 0;
  // The next event. When the caller holds every frame buffer and the board
  // has a frame for one: with config.frame_buffer_wait, waits that long for
  // a frame to be dropped (a zero `timeout` does not wait: Timeout), then
  // throws ResourceExhausted; without, throws at once.
  virtual DecoderEvent receive(std::chrono::nanoseconds timeout) = 0;
  // From any thread: a receive() in progress returns Interrupted soon, or
  // the next one at once if none is. Default: nothing (receive() ends on
  // its own timeouts).
  virtual void interrupt() noexcept;
  // Drops queued packets and frames not yet received; the channel starts
  // again at a new stream (frames already received stay valid).
  virtual void reset() = 0;
};

class TPUHAL_API DeviceBackend {
 public:
  virtual ~DeviceBackend();
  virtual const Properties& properties() const = 0;
  virtual MemoryStats memory_stats() const = 0;
  virtual DeviceStatus status() const = 0;
  // Device::telemetry(). Default: Unsupported.
  virtual Telemetry telemetry() const;
  // The board's timing model (Device::modelled, docs/timing.md): what an
  // op, a copy (or, with from == to == Device, a fill) and a decoded frame
  // cost. Default: no model (nullopt).
  virtual std::optional<ModelledTime> model_op(const OpDesc& op) const;
  virtual std::optional<ModelledTime> model_transfer(std::uint64_t bytes, Memory from, Memory to) const;
  virtual std::optional<std::uint64_t> model_decode_ns(Codec codec, FrameType type, std::uint32_t width,
                                                       std::uint32_t height) const;
  // Device::board_time_ns(). Default: nullopt.
  virtual std::optional<std::uint64_t> board_time_ns() const;
  // Why this device cannot run `op` although it has caps.tensor ("conv2d
  // in i8 (no integer convolution on this GPU)"), or empty when it can.
  // Batch::run asks before it records the op. Default: empty.
  virtual std::string refuse_op(const OpDesc& op) const;
  virtual std::shared_ptr<BufferBackend> allocate(std::uint64_t size, Memory memory, const AllocOptions& options) = 0;
  virtual std::shared_ptr<BufferBackend> import_host(void* ptr, std::uint64_t size);
  // Records `commands` (no WaitFence) for replay. Default: Unsupported.
  virtual std::shared_ptr<ProgramBackend> create_program(std::span<const Command> commands);
  virtual std::shared_ptr<QueueBackend> create_queue(Engine engine, const QueueOptions& options) = 0;
  // Opens a free decoder channel (caps.video_decode); ResourceExhausted
  // naming the channel count when all are open. Default: Unsupported.
  virtual std::shared_ptr<DecoderBackend> open_decoder(const DecoderConfig& config);
  // Resets the board and brings it back to a usable state (Device::reset):
  // work not complete on queues claimed now fails with kQueueReset and those
  // queues stay failed; memory allocations survive. Default: Unsupported.
  virtual void reset();
};

class TPUHAL_API Provider {
 public:
  virtual ~Provider();
  // The URI scheme this provider serves ("sim").
  virtual std::string_view scheme() const = 0;
  virtual std::vector<DeviceInfo> enumerate() = 0;
  // `uri` is the whole URI, scheme included.
  virtual std::shared_ptr<DeviceBackend> open(std::string_view uri) = 0;
  // Non-empty when the provider cannot work on this machine, saying why.
  virtual std::string unavailable_reason() const;
  // Sends a firmware image to the board at `uri` waiting in its loader (a
  // USB stick's first enumeration) and waits up to `timeout` for it to come
  // back running it (tpuhal::upload_firmware). Default: Unsupported.
  virtual void upload_firmware(std::string_view uri, std::span<const std::byte> image,
                               std::chrono::milliseconds timeout);
  // The board at `uri` watched without opening it (tpuhal::observe), by a
  // provider whose boards are shared by a process that knows their users.
  // observable() says whether it can; observe() default: Unsupported.
  virtual bool observable(std::string_view uri) const;
  virtual BoardView observe(std::string_view uri);
  // What this provider speaks to its boards, with the version, for
  // tpuhal::protocol_versions() ("firmware interface 1.16"); empty (the
  // default) when there is nothing of ours on the other side to agree with.
  virtual std::string protocol() const;
};

// Adds a provider to the process-wide registry (the built-in ones are
// registered on first use). A later provider for the same scheme replaces
// the earlier one.
TPUHAL_API void register_provider(std::shared_ptr<Provider> provider);

}  // namespace tpuhal::driver
