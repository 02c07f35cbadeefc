// Plain data shared by the public API and the driver interface: memory
// kinds, engines, device properties, statistics and wait policies.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "tpuhal/export.hpp"

namespace tpuhal {

// Where a Buffer lives.
enum class Memory : std::uint8_t {
  Device,             // device DRAM. map() only where caps.map_device_memory
  DeviceHostVisible,  // device DRAM inside the host-visible window; map() works
  HostPinned,         // host memory the device reaches by DMA; map() works
};
TPUHAL_API const char* to_string(Memory memory) noexcept;

// What a hardware queue runs. Every engine runs copies, fills and
// synchronisation; compute adds tensor work, video adds decoding.
enum class Engine : std::uint8_t { Compute, Copy, Video };
TPUHAL_API const char* to_string(Engine engine) noexcept;

// Element types the tensor engine computes in.
enum class DType : std::uint8_t { F32, F16, BF16, I8, U8, I32 };

// Video (video.hpp).
enum class Codec : std::uint8_t { H264, H265, Jpeg };
// NV12: a Y plane, then one plane of interleaved U/V at half resolution.
// I420: Y, U and V planes; chroma at half resolution, rounded up.
enum class PixelFormat : std::uint8_t { NV12, I420 };
TPUHAL_API const char* to_string(Codec codec) noexcept;  // "h264", "h265", "jpeg"
// What kind of frame a decoder made: a decoder's time depends on it.
enum class FrameType : std::uint8_t { Intra, Predicted, Bidirectional };
TPUHAL_API const char* to_string(FrameType type) noexcept;  // "I", "P", "B"

// A command's time in the board's timing model (Device::modelled,
// docs/timing.md): board nanoseconds computed from the command alone, the
// same on every host.
struct ModelledTime {
  // What bounds it: the engine's arithmetic, memory, or the fixed cost of a
  // command and an op.
  enum class Bound : std::uint8_t { Compute, Memory, Overhead };
  std::uint64_t ns = 0;  // max(compute, memory) + overhead
  std::uint64_t compute_ns = 0;
  std::uint64_t memory_ns = 0;
  std::uint64_t overhead_ns = 0;
  Bound bound = Bound::Overhead;
};
TPUHAL_API const char* to_string(ModelledTime::Bound bound) noexcept;  // "compute", "memory", "overhead"
TPUHAL_API const char* to_string(PixelFormat format) noexcept;         // "nv12", "i420"

struct VideoDecoderOptions {
  Codec codec = Codec::H264;
  PixelFormat format = PixelFormat::NV12;
  // Frames larger than this are errors (the channel's frame buffers are
  // sized for it).
  std::uint32_t max_width = 1920, max_height = 1088;
  // Frame buffers in device memory: how many frames the caller may hold at
  // once, plus the ones the board is writing (1..64).
  std::uint32_t frame_buffers = 4;
  // When the caller holds every frame buffer and the board has a frame for
  // one, receive() waits this long for a frame to be dropped (by another
  // thread: a display, an encoder, a queue downstream) before it throws
  // ResourceExhausted; zero throws at once. try_receive() never waits, and
  // VideoDecoder::interrupt() ends a wait early.
  std::chrono::milliseconds frame_buffer_wait{0};
};
TPUHAL_API const char* to_string(DType dtype) noexcept;

struct HeapInfo {
  std::string name;  // "npu", "host-visible", ...
  Memory memory = Memory::Device;
  std::uint64_t base = 0;  // device address of the heap's first byte
  std::uint64_t size = 0;
  bool is_default = false;  // used by allocate(n, Memory::Device) without a heap name
};

struct EngineInfo {
  Engine engine = Engine::Compute;
  std::uint32_t queues = 0;  // hardware queues of this engine
};

// What a device can do. Everything not listed true is refused with
// Status::Unsupported, up front, the same way on every bus.
struct Capabilities {
  bool map_device_memory = false;           // Buffer::map() on Memory::Device
  bool host_visible_device_memory = false;  // Memory::DeviceHostVisible exists
  bool import_host_memory = false;          // Device::import_host()
  bool wait_value = false;                  // Batch::wait_value() / write_value()
  bool timestamps = false;                  // Fence::timestamp_ns(), Batch::timestamp()
  bool tensor = false;                      // tensor engine ops
  bool video_decode = false;                // VideoDecoder
  bool telemetry = false;                   // Device::telemetry()
  // The board's clock (timestamps, Fence::timestamp_ns()) is a timing
  // model's, not measured: a simulated board with a timing model
  // (docs/timing.md).
  bool modelled_time = false;
  // Batch::wait_until(), VideoDecoder::send_at(), Frame::decoded_ns() and
  // Device::board_time_ns(): work timed on the board's clock.
  bool wait_time = false;
};

struct Properties {
  std::string uri;     // "sim:0"
  std::string driver;  // "tpu-sim", "cuda", ...
  std::string board;   // the board's model name
  std::string bus;     // "simulated pcie", "pcie 0000:03:00.0", ...
  std::string serial;
  std::string firmware_version;   // "1.0.0"
  std::string interface_version;  // host<->board interface agreed, "1.0"
  std::uint16_t pci_vendor = 0;
  std::uint16_t pci_device = 0;

  std::uint64_t memory_bytes = 0;        // device memory in total
  std::uint64_t host_visible_bytes = 0;  // of it, inside the host-visible window
  std::uint64_t min_alignment = 0;       // of every device allocation
  std::vector<HeapInfo> heaps;
  std::vector<EngineInfo> engines;

  std::uint32_t tensor_cores = 0;
  double peak_int8_tops = 0;
  double peak_fp16_tflops = 0;
  double peak_fp32_tflops = 0;
  std::vector<DType> dtypes;  // what the tensor engine computes in; empty if none
  // Simulated boards: the host instruction-set level their tensor engine
  // runs at ("avx2"; TPUHAL_MAX_ISA caps it, docs/ops.md). Empty otherwise.
  std::string tensor_isa;
  std::uint32_t decode_channels = 0;  // VideoDecoder channels the board has
  std::vector<Codec> codecs;          // what they decode; empty if none

  Capabilities caps;
};

struct HeapStats {
  std::string name;
  Memory memory = Memory::Device;
  std::uint64_t total = 0;
  std::uint64_t used = 0;  // including alignment padding
  std::uint64_t free = 0;
  std::uint64_t largest_free = 0;  // the largest allocation that can succeed now
  std::uint64_t allocations = 0;   // live allocations
  std::uint64_t peak_used = 0;
};

struct MemoryStats {
  std::vector<HeapStats> heaps;
  std::uint64_t device_total = 0;
  std::uint64_t device_used = 0;
  std::uint64_t host_pinned_bytes = 0;  // host memory mapped for the device
  std::uint64_t host_pinned_allocations = 0;
  std::uint64_t imported_bytes = 0;  // caller memory mapped with import_host()
};

struct QueueStatus {
  Engine engine = Engine::Compute;
  std::uint32_t index = 0;  // hardware queue number
  bool in_use = false;      // claimed by a Queue in this process
  bool busy = false;        // work submitted and not yet complete
  bool failed = false;
  std::uint64_t submitted = 0;  // timeline value of the last submission
  std::uint64_t completed = 0;  // timeline value reached
  std::uint64_t busy_ns = 0;    // time the engine spent executing
  std::uint64_t retired = 0;    // commands the board retired
};

struct DeviceStatus {
  std::uint64_t uptime_ns = 0;  // board time since its last reset
  std::vector<QueueStatus> queues;
};

// The board's telemetry (Device::telemetry(), docs/telemetry.md): counters
// since the board powered on, which resets do not clear, and its sensors.
// Rates and utilisation come from two snapshots (utilisation()).
struct EngineTelemetry {
  Engine engine = Engine::Compute;
  std::uint64_t busy_ns = 0;  // time at least one of its queues was running work
};
struct QueueTelemetry {
  Engine engine = Engine::Compute;
  std::uint32_t index = 0;     // hardware queue number
  std::uint64_t commands = 0;  // commands retired
  std::uint64_t busy_ns = 0;   // time running work (waits on other queues included)
  std::uint64_t failures = 0;  // commands that failed
};
struct ChannelTelemetry {
  std::uint32_t channel = 0;  // decode channel number
  std::uint64_t packets = 0;  // compressed packets taken
  std::uint64_t frames = 0;   // frames decoded
  std::uint64_t errors = 0;   // packets or frames that did not decode
  std::uint64_t busy_ns = 0;  // decoder time spent on the channel
};
struct FaultCount {
  std::string kind;  // "dma fault", "hang", "firmware crash", ...
  std::uint64_t count = 0;
};
struct Telemetry {
  // Board time when taken: DeviceStatus::uptime_ns's clock, but the host's
  // time since reset on a simulated board with a virtual clock
  // (docs/timing.md), so that busy shares stay shares of the host's time.
  std::uint64_t time_ns = 0;
  std::uint64_t uptime_ns = 0;           // since the board powered on
  std::uint64_t resets = 0;              // board resets since then
  std::vector<EngineTelemetry> engines;  // one per engine kind the board has
  std::vector<QueueTelemetry> queues;
  std::vector<ChannelTelemetry> channels;
  // Bytes moved by copy and fill commands, by direction.
  std::uint64_t h2d_bytes = 0, d2h_bytes = 0, d2d_bytes = 0, h2h_bytes = 0;
  std::vector<FaultCount> faults;  // kinds that happened at least once
  double temperature_c = 0;
  double power_w = 0;        // over the interval since the board last reported
  double power_limit_w = 0;  // the board's limit
  double energy_j = 0;       // since power-on
  std::uint32_t clock_mhz = 0;
};
// What happened between two snapshots of one board, as DCGM computes it:
// each engine's busy fraction of the interval, and the rates of the
// counters. Throws InvalidArgument if `after` is not later than `before`
// on the same board (its uptime went back: another board, or a power
// cycle).
struct Utilisation {
  double interval_s = 0;
  double compute = 0, copy = 0, video = 0;  // 0 to 1; 0 for an engine the board lacks
  std::vector<double> channels;             // each decode channel's share of a decoder
  double h2d_gbps = 0, d2h_gbps = 0, d2d_gbps = 0;
  double commands_per_s = 0;
  double frames_per_s = 0;
};
TPUHAL_API Utilisation utilisation(const Telemetry& before, const Telemetry& after);

// How waits wait. Hybrid (the default) spins for `spin`, then sleeps until
// the device interrupts; Spin never sleeps (lowest latency, burns a core);
// Block sleeps at once. `timeout` bounds waits that are not given one: a
// wait fails with Status::Timeout once the queue has made no progress for
// that long (progress: a command retired or a transfer chunk moved), so slow
// work that keeps moving is never cut off, and a hang always ends.
// TPUHAL_WAIT sets the process default: "hybrid", "spin", "block",
// optionally with the spin time: "hybrid:100us".
struct WaitPolicy {
  enum class Mode : std::uint8_t { Hybrid, Spin, Block };
  Mode mode = Mode::Hybrid;
  std::chrono::nanoseconds spin = std::chrono::microseconds(20);
  std::chrono::nanoseconds timeout = std::chrono::seconds(10);
};
TPUHAL_API const char* to_string(WaitPolicy::Mode mode) noexcept;

struct AllocOptions {
  std::uint64_t alignment = 0;  // 0: the device's min_alignment; else a power of two
  std::string heap;             // empty: the default heap for the memory kind
};

struct QueueOptions {
  std::uint32_t ring_entries = 0;  // 0: the driver's default; else a power of two
};

// One line of enumerate().
struct DeviceInfo {
  std::string uri;
  std::string driver;
  std::string board;
  std::uint64_t memory_bytes = 0;
};

}  // namespace tpuhal
