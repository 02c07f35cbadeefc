// tpuhal: one API for every accelerator board.
//
//   auto devices = tpuhal::enumerate();
//   tpuhal::Device dev = tpuhal::open("sim:0");
//   tpuhal::Buffer host = dev.allocate(n, tpuhal::Memory::HostPinned);
//   tpuhal::Buffer dram = dev.allocate(n);                  // Memory::Device
//   tpuhal::Queue q = dev.queue(tpuhal::Engine::Compute);
//   tpuhal::Fence f = q.copy(host, dram).copy(dram, host).submit();
//   f.wait();
//
// Objects are handles: copying one shares the object; it lives while any
// handle (or in-flight work) refers to it. Every object is safe to use from
// several threads, except Batch, which belongs to the thread recording it.
// Errors are thrown as tpuhal::Error (error.hpp).
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tpuhal/error.hpp"
#include "tpuhal/export.hpp"
#include "tpuhal/ops.hpp"
#include "tpuhal/types.hpp"

namespace tpuhal {

class Device;
class Queue;
class VideoDecoder;
class Batch;
class Program;
namespace detail {
class DeviceImpl;
class BufferImpl;
class DecoderImpl;
class QueueImpl;
struct BatchState;
struct ProgramImpl;
}  // namespace detail

// Every device every installed driver can see, in driver order. Drivers that
// cannot run here (no library, no permission) list nothing; see
// unavailable_drivers() for why.
TPUHAL_API std::vector<DeviceInfo> enumerate();

// Drivers that found nothing because something is missing, with the reason:
// {"cuda", "libcuda.so.1 not found: no NVIDIA driver installed"}.
TPUHAL_API std::vector<std::pair<std::string, std::string>> unavailable_drivers();

// Opens a device by URI: "sim:0" (the first simulated board), "sim:tiny"
// (a simulated board of the built-in profile "tiny"), "sim:/path/board.json".
// Opening a URI that is already open in this process returns the same device.
// Throws NotFound (naming the devices there are) or the driver's error.
TPUHAL_API Device open(std::string_view uri);

// Uploads a firmware image to a board waiting in its loader: a USB stick
// enumerates first with its loader's identity, `tpuhal list` shows it as
// "(loader: firmware needed)", and it opens only once it runs firmware
// ("usb:1-1", docs/usb.md). The driver checks the image against the board
// before sending it, then waits up to `timeout` for the board's verdict on
// it and up to `timeout` again for the board to come back running it. Throws InvalidArgument (an image not for this
// board, saying what is wrong), FailedPrecondition (the board already runs firmware), DeviceFault (the board refused
// it), Timeout, Unsupported (a driver whose boards boot their own firmware).
TPUHAL_API void upload_firmware(std::string_view uri, std::span<const std::byte> image,
                                std::chrono::milliseconds timeout = std::chrono::seconds(10));

// A fence: the point on one queue's timeline that a submission reaches when
// it and everything submitted before it on that queue have completed.
class TPUHAL_API Fence {
 public:
  Fence() = default;  // an empty fence; waiting on it returns at once

  // The queue and timeline value this fence names.
  Queue queue() const;
  std::uint64_t value() const noexcept { return value_; }
  bool empty() const noexcept { return !queue_; }

  // True once reached. Throws the queue's error if it failed before reaching
  // this value (Status::DeviceFault, naming the failed command).
  bool is_complete() const;

  // Waits until reached. Throws Status::Timeout once the queue has made no
  // progress for `timeout` (default: the device's WaitPolicy::timeout), or
  // the queue's error if it fails first. Values reached before a failure
  // still wait successfully.
  void wait() const;
  void wait(std::chrono::nanoseconds timeout) const;
  void wait(const WaitPolicy& policy) const;

  // Board time (ns on the board's clock: since its reset on a TPU board, the
  // GPU's global timer on cuda:N) at which this value was reached,
  // while the board still keeps it (its last 128 values per queue); nullopt
  // otherwise or before completion.
  std::optional<std::uint64_t> timestamp_ns() const;

 private:
  friend class Batch;
  friend class Queue;
  Fence(std::shared_ptr<detail::QueueImpl> queue, std::uint64_t value) : queue_(std::move(queue)), value_(value) {}
  std::shared_ptr<detail::QueueImpl> queue_;
  std::uint64_t value_ = 0;
};

// Memory on or for a device. Freed when the last handle goes and no queued
// work uses it any more.
class TPUHAL_API Buffer {
 public:
  Buffer() = default;

  std::uint64_t size() const;
  Memory memory() const;
  const std::string& heap() const;  // heap it came from ("" for host memory)
  // The address the board uses for it (diagnostics, hand-built descriptors).
  std::uint64_t device_address() const;
  Device device() const;

  // Host view of the whole buffer. Works for HostPinned and DeviceHostVisible
  // memory, and for Device memory where caps.map_device_memory; otherwise
  // throws Unsupported saying which memory kind to use instead.
  std::span<std::byte> map() const;

  // Releases the buffer now; memory returns to the device once queued work
  // that uses it completes. Using the buffer afterwards throws
  // FailedPrecondition. Calling free() twice is harmless.
  void free();
  bool valid() const noexcept;  // non-empty and not freed

 private:
  friend class Device;
  friend class Batch;
  friend struct detail::TensorState;
  friend class detail::DecoderImpl;
  explicit Buffer(std::shared_ptr<detail::BufferImpl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<detail::BufferImpl> impl_;
};

// A batch of work recorded for one queue and submitted as a unit. Commands
// run in order, after everything submitted to the queue before. Recording
// checks every argument and throws at once; nothing reaches the device until
// submit(). Not thread-safe: record on one thread (any thread may submit a
// different batch to the same queue concurrently).
class TPUHAL_API Batch {
 public:
  ~Batch();
  Batch(Batch&&) noexcept;
  Batch& operator=(Batch&&) noexcept;
  Batch(const Batch&) = delete;
  Batch& operator=(const Batch&) = delete;

  // Copies all of src into dst (sizes must match), or `size` bytes between
  // offsets. Any memory kinds; overlapping ranges copy as memmove.
  Batch& copy(const Buffer& src, const Buffer& dst);
  Batch& copy(const Buffer& src, std::uint64_t src_offset, const Buffer& dst, std::uint64_t dst_offset,
              std::uint64_t size);
  // Fills `size` bytes at `offset` with `pattern`, `pattern_bytes` (1, 2 or 4)
  // wide, little-endian; offset and size must be multiples of pattern_bytes.
  Batch& fill(const Buffer& dst, std::uint64_t offset, std::uint64_t size, std::uint32_t pattern,
              std::uint32_t pattern_bytes = 1);
  // Waits, on the device, for another queue's fence (same device).
  Batch& wait(const Fence& fence);
  // Waits, on the device, until the 64-bit word at `offset` in `buf` is >=
  // `value` (unsigned); the host or another queue writes it. offset % 8 == 0.
  Batch& wait_value(const Buffer& buf, std::uint64_t offset, std::uint64_t value);
  // Writes a 64-bit value at `offset` (offset % 8 == 0) when the batch gets there.
  Batch& write_value(const Buffer& buf, std::uint64_t offset, std::uint64_t value);
  // Writes the board time (ns) at `offset` (offset % 8 == 0).
  Batch& timestamp(const Buffer& buf, std::uint64_t offset);
  // The batch's next command starts no earlier than board time `board_ns`
  // (ns since the board's reset, as Fence::timestamp_ns() and
  // Device::board_time_ns() give it; caps.wait_time): work timed to the
  // board, such as a frame's ops after Frame::decoded_ns(). A board on the
  // host's clock waits for it; a modelled clock (docs/timing.md) moves up
  // to it. At most 2^62.
  Batch& wait_until(std::uint64_t board_ns);
  // Runs a tensor op (ops.hpp) on this queue's device (caps.tensor).
  Batch& run(const Op& op);
  // Replays a recorded program (Device::record).
  Batch& run(const Program& program);

  std::size_t size() const noexcept;  // commands recorded
  Queue queue() const;

  // Submits what was recorded and empties the batch. If the queue's ring is
  // full, waits for room while the queue makes progress, up to the device's
  // wait timeout (or `max_wait`; zero: do not wait) and then throws
  // QueueFull. Throws the queue's error once the queue is known to have
  // failed. If submit() throws, the batch keeps what was recorded.
  Fence submit();
  Fence submit(std::chrono::nanoseconds max_wait);

 private:
  friend class Queue;
  friend class Device;
  explicit Batch(std::shared_ptr<detail::QueueImpl> queue);
  explicit Batch(std::shared_ptr<detail::DeviceImpl> recording_for);
  std::unique_ptr<detail::BatchState> state_;
};

// Commands recorded once with fixed buffers and shapes, uploaded to the
// device, and replayed (Batch::run) as often as needed: a compiled model.
// New inputs are copied into its input buffers before a replay.
class TPUHAL_API Program {
 public:
  Program() = default;
  std::size_t size() const;  // commands recorded
  Device device() const;

 private:
  friend class Device;
  friend class Batch;
  explicit Program(std::shared_ptr<detail::ProgramImpl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<detail::ProgramImpl> impl_;
};

// An in-order stream of work on one hardware queue. The hardware queue is
// released when the last handle (including fences) goes, after its
// submitted work completes.
class TPUHAL_API Queue {
 public:
  Queue() = default;

  Engine engine() const;
  std::uint32_t index() const;  // hardware queue number on the board
  Device device() const;

  // Start a batch (see Batch for each).
  Batch batch() const;
  Batch copy(const Buffer& src, const Buffer& dst) const;
  Batch copy(const Buffer& src, std::uint64_t src_offset, const Buffer& dst, std::uint64_t dst_offset,
             std::uint64_t size) const;
  Batch fill(const Buffer& dst, std::uint64_t offset, std::uint64_t size, std::uint32_t pattern,
             std::uint32_t pattern_bytes = 1) const;
  Batch wait(const Fence& fence) const;
  Batch run(const Op& op) const;
  Batch run(const Program& program) const;

  // An empty submission: its fence is reached when everything before it is.
  Fence submit() const;
  // The fence of the most recent submission (empty if none).
  Fence last_fence() const;
  // Timeline value reached so far.
  std::uint64_t completed_value() const;

 private:
  friend class Device;
  friend class Fence;
  friend class Batch;
  explicit Queue(std::shared_ptr<detail::QueueImpl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<detail::QueueImpl> impl_;
};

class TPUHAL_API Device {
 public:
  Device() = default;

  const std::string& uri() const;
  const Properties& properties() const;
  MemoryStats memory_stats() const;
  DeviceStatus status() const;
  // The board's counters and sensors (caps.telemetry; Unsupported where the
  // board keeps none). Takes no queue and waits for no work: safe to call
  // from any thread while the board runs, as often as wanted.
  Telemetry telemetry() const;

  // The board's timing model (docs/timing.md), where the device has one (a
  // simulated board whose profile gives timing.model; nullopt elsewhere):
  // what `op` costs in board time, what a copy of `bytes` from one memory
  // to another costs (a fill: from == to == Memory::Device), and what the
  // video unit spends on one decoded frame. Pure arithmetic on the command:
  // nothing runs, and the answer is the same on every host.
  std::optional<ModelledTime> modelled(const Op& op) const;
  std::optional<ModelledTime> modelled_copy(std::uint64_t bytes, Memory from, Memory to) const;
  std::optional<std::uint64_t> modelled_decode_ns(Codec codec, FrameType type, std::uint32_t width,
                                                  std::uint32_t height) const;
  // The board's clock now (ns since its reset; on a simulated board with a
  // virtual clock, the furthest its modelled clocks reached): the base for
  // Batch::wait_until() and VideoDecoder::send_at(). nullopt without
  // caps.wait_time.
  std::optional<std::uint64_t> board_time_ns() const;

  // Allocates `size` bytes (> 0). Out of memory throws OutOfMemory saying what
  // is used and free in the heap and the largest block that would fit.
  Buffer allocate(std::uint64_t size, Memory memory = Memory::Device, const AllocOptions& options = {});
  // Makes caller memory reachable by the device's DMA without a copy
  // (caps.import_host_memory). `ptr` and `size` must be page-aligned and
  // the memory must outlive the Buffer and all work using it.
  Buffer import_host(void* ptr, std::uint64_t size);

  // Records a program: `body` records commands into the batch it is given
  // (anything a batch takes except waits on fences); the result is uploaded
  // to the device once. Throws Unsupported where the device cannot.
  Program record(const std::function<void(Batch&)>& body);

  // Claims a hardware queue of `engine`. Throws ResourceExhausted if all of
  // them are in use, Unsupported if the board has no such engine.
  Queue queue(Engine engine = Engine::Compute, const QueueOptions& options = {});

  // Opens one channel of the board's codec unit (video.hpp). Throws
  // Unsupported without caps.video_decode or for a codec the board lacks,
  // InvalidArgument for bad options, ResourceExhausted when every channel
  // is open.
  VideoDecoder open_decoder(const VideoDecoderOptions& options);

  WaitPolicy wait_policy() const;
  void set_wait_policy(const WaitPolicy& policy);

  // Resets the board (after a fault: DeviceFault, DeviceLost, Timeout) and
  // brings it back to a usable state. Every queue claimed when it runs stays
  // failed: its work not yet complete fails with "queue reset" and later
  // submissions throw; release such queues and claim new ones. Buffers and
  // programs survive (device memory contents may not). Throws DeviceLost if
  // the board does not come back, Unsupported if the driver cannot reset.
  void reset();

  explicit operator bool() const noexcept { return impl_ != nullptr; }

 private:
  friend TPUHAL_API Device open(std::string_view uri);
  friend class Buffer;
  friend class Queue;
  friend class Op;
  friend class Program;
  friend struct OpAccess;
  friend class VideoDecoder;
  explicit Device(std::shared_ptr<detail::DeviceImpl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<detail::DeviceImpl> impl_;
};

// Library version, "0.1.0".
TPUHAL_API const char* version() noexcept;
// What each driver of this library speaks to its boards, by URI scheme, for
// the drivers that talk to something of ours: {"sim", "firmware interface
// 1.16"}, {"simd", "simulator daemon protocol 5, firmware interface 1.16"}.
// A board or daemon of another version is refused with VersionMismatch,
// naming both (`tpuhal --version` prints these).
TPUHAL_API std::vector<std::pair<std::string, std::string>> protocol_versions();

}  // namespace tpuhal

#include "tpuhal/validation.hpp"
#include "tpuhal/video.hpp"
