// Plain data (tpuhal/types.hpp): the Memory, Engine and WaitMode enums, and
// read-only classes for properties, statistics, status and wait policies.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <array>
#include <cctype>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <limits>

#include "common.hpp"

#include "tpuhal/base/hex.h"

namespace tpuhal::python {
namespace {

// One Python enum whose members are also their string values
// (class Memory(str, enum.Enum)), and the C++ values they stand for.
template <class E, std::size_t N>
struct StrEnum {
  const char* python_name;
  const char* what;                                            // "memory kind", for messages
  std::array<std::pair<const char*, const char*>, N> members;  // {C++ name, value}
  std::array<PyObject*, N> objects{};                          // references kept for the life of the process

  void bind(py::module_& m, const char* doc) {
    py::list items;
    for (auto& [name, value] : members) items.append(py::make_tuple(name, value));
    py::object cls =
        py::module_::import("enum").attr("Enum")(python_name, items, py::arg("module") = "tpuhal",
                                                 py::arg("type") = py::module_::import("builtins").attr("str"));
    cls.attr("__doc__") = doc;
    cls.attr("__str__") = py::module_::import("builtins").attr("str").attr("__str__");
    m.attr(python_name) = cls;
    for (std::size_t i = 0; i < N; ++i) objects[i] = py::object(cls.attr(members[i].first)).release().ptr();
  }

  py::object from(E e) const {
    const auto i = static_cast<std::size_t>(e);
    if (i >= N) fail(Status::Internal, std::string("no tpuhal.") + python_name + " for value " + std::to_string(i));
    return py::reinterpret_borrow<py::object>(objects[i]);
  }

  // "host_pinned", "HostPinned", "host-pinned", "HOST_PINNED" all match.
  E to(py::handle h) const {
    if (!py::isinstance<py::str>(h))
      throw py::type_error(std::string(what) + " must be a tpuhal." + python_name + " or a string such as '" +
                           members[0].second + "', not " + std::string(py::str(h.get_type().attr("__name__"))));
    const std::string given = h.cast<std::string>();
    const auto squash = [](std::string_view s) {
      std::string out;
      for (char c : s)
        if (c != '_' && c != '-' && c != ' ') out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      return out;
    };
    const std::string key = squash(given);
    for (std::size_t i = 0; i < N; ++i)
      if (key == squash(members[i].first)) return static_cast<E>(i);
    std::string known;
    for (auto& [name, value] : members) known += std::string(known.empty() ? "" : ", ") + "'" + value + "'";
    fail(Status::InvalidArgument, "unknown " + std::string(what) + " '" + given + "' (one of: " + known + ")");
  }
};

StrEnum<Memory, 3> g_memory{
    "Memory",
    "memory kind",
    {{{"Device", "device"}, {"DeviceHostVisible", "device_host_visible"}, {"HostPinned", "host_pinned"}}}};
StrEnum<Engine, 3> g_engine{"Engine", "engine", {{{"Compute", "compute"}, {"Copy", "copy"}, {"Video", "video"}}}};
StrEnum<WaitPolicy::Mode, 3> g_wait_mode{
    "WaitMode", "wait mode", {{{"Hybrid", "hybrid"}, {"Spin", "spin"}, {"Block", "block"}}}};

StrEnum<DType, 6> g_dtype{
    "DType", "dtype", {{{"F32", "f32"}, {"F16", "f16"}, {"BF16", "bf16"}, {"I8", "i8"}, {"U8", "u8"}, {"I32", "i32"}}}};

StrEnum<Codec, 3> g_codec{"Codec", "codec", {{{"H264", "h264"}, {"H265", "h265"}, {"Jpeg", "jpeg"}}}};
StrEnum<PixelFormat, 2> g_pixel_format{"PixelFormat", "pixel format", {{{"NV12", "nv12"}, {"I420", "i420"}}}};

std::string quoted(const std::string& s) { return py::repr(py::str(s)); }
std::string boolean(bool b) { return b ? "True" : "False"; }

double seconds(std::chrono::nanoseconds d) { return static_cast<double>(d.count()) * 1e-9; }

}  // namespace

Memory to_memory(py::handle h) { return g_memory.to(h); }
Engine to_engine(py::handle h) { return g_engine.to(h); }
WaitPolicy::Mode to_wait_mode(py::handle h) { return g_wait_mode.to(h); }
py::object from_memory(Memory m) { return g_memory.from(m); }
py::object from_engine(Engine e) { return g_engine.from(e); }
py::object from_wait_mode(WaitPolicy::Mode m) { return g_wait_mode.from(m); }
py::object from_dtype(DType d) { return g_dtype.from(d); }
Codec to_codec(py::handle h) { return g_codec.to(h); }
PixelFormat to_pixel_format(py::handle h) { return g_pixel_format.to(h); }
py::object from_codec(Codec c) { return g_codec.from(c); }
py::object from_pixel_format(PixelFormat f) { return g_pixel_format.from(f); }

DType to_dtype(py::handle h) {
  if (py::isinstance<py::str>(h)) {
    // tpuhal's names first ('f32', 'BF16', DType.I8), then NumPy's ('float32').
    const std::string given = h.cast<std::string>();
    for (std::size_t i = 0; i < g_dtype.members.size(); ++i)
      if (given == g_dtype.members[i].second || given == g_dtype.members[i].first) return static_cast<DType>(i);
  }
  py::dtype d;
  try {
    d = py::dtype::from_args(py::reinterpret_borrow<py::object>(h));
  } catch (const py::error_already_set&) {
    fail(Status::InvalidArgument, "unknown dtype " + std::string(py::repr(h)) +
                                      " (one of: 'f32', 'f16', 'bf16', 'i8', 'u8', 'i32', or a NumPy dtype "
                                      "among float32, float16, int8, uint8, int32)");
  }
  const char kind = d.kind();
  const auto size = d.itemsize();
  if (kind == 'f' && size == 4) return DType::F32;
  if (kind == 'f' && size == 2) return DType::F16;
  if (kind == 'i' && size == 1) return DType::I8;
  if (kind == 'u' && size == 1) return DType::U8;
  if (kind == 'i' && size == 4) return DType::I32;
  fail(Status::InvalidArgument, "dtype " + std::string(py::str(d)) +
                                    " has no tensor element type: the tensor engine computes in f32, f16, bf16, "
                                    "i8, u8 and i32 (NumPy float32, float16, int8, uint8, int32; bf16 by name)");
}

std::chrono::nanoseconds to_duration(py::handle h, const char* what) {
  double s;
  if (py::isinstance(h, py::module_::import("datetime").attr("timedelta"))) {
    s = h.attr("total_seconds")().cast<double>();
  } else if (py::isinstance<py::float_>(h) || py::isinstance<py::int_>(h)) {
    s = h.cast<double>();
  } else {
    throw py::type_error(std::string(what) + " must be a number of seconds or a datetime.timedelta, not " +
                         std::string(py::str(h.get_type().attr("__name__"))));
  }
  if (std::isnan(s) || s < 0)
    fail(Status::InvalidArgument, std::string(what) + " must be >= 0 seconds (got " + std::to_string(s) + ")");
  // Anything past ~292 years is "forever".
  if (s >= 9.2e9) return std::chrono::nanoseconds(std::numeric_limits<std::int64_t>::max());
  return std::chrono::nanoseconds(static_cast<std::int64_t>(std::llround(s * 1e9)));
}

void bind_types(py::module_& m) {
  g_memory.bind(m,
                "Where a Buffer lives: Device (device DRAM), DeviceHostVisible (device DRAM the host can "
                "map), HostPinned (host memory the device reaches by DMA). Members are also their string "
                "values: Memory.HostPinned == 'host_pinned'.");
  g_engine.bind(m,
                "What a hardware queue runs: Compute, Copy or Video. Every engine runs copies, fills and "
                "synchronisation. Members are also their string values: Engine.Copy == 'copy'.");
  g_wait_mode.bind(m,
                   "How waits wait: Hybrid spins, then sleeps until the device interrupts; Spin never "
                   "sleeps; Block sleeps at once. Members are also their string values.");

  g_dtype.bind(m,
               "Element types the tensor engine computes in: F32, F16, BF16, I8, U8, I32. Members are "
               "also their string values: DType.F32 == 'f32'. Wherever a dtype is taken, a NumPy dtype "
               "(numpy.float32, ...) is accepted too, except for bf16, which NumPy lacks.");

  g_codec.bind(m,
               "What a VideoDecoder decodes: H264, H265 (Annex B streams) or Jpeg (baseline JPEG files). "
               "Members are also their string values: Codec.H264 == 'h264'.");
  g_pixel_format.bind(m,
                      "How a decoded Frame lays out its pixels: NV12 (a Y plane, then one plane of "
                      "interleaved U/V at half resolution) or I420 (Y, U and V planes, chroma at half "
                      "resolution rounded up). Members are also their string values: PixelFormat.NV12 == 'nv12'.");

  py::class_<DeviceInfo>(m, "DeviceInfo", "One device that tpuhal.devices() lists.")
      .def_readonly("uri", &DeviceInfo::uri, "URI to pass to tpuhal.open(), e.g. 'sim:0'.")
      .def_readonly("driver", &DeviceInfo::driver, "Driver name, e.g. 'tpu-sim'.")
      .def_readonly("board", &DeviceInfo::board, "The board's model name.")
      .def_readonly("memory_bytes", &DeviceInfo::memory_bytes, "Device memory in total, in bytes.")
      .def("__eq__",
           [](const DeviceInfo& a, const DeviceInfo& b) {
             return a.uri == b.uri && a.driver == b.driver && a.board == b.board && a.memory_bytes == b.memory_bytes;
           })
      .def("__hash__", [](const DeviceInfo& d) { return py::hash(py::str(d.uri)); })
      .def("__repr__", [](const DeviceInfo& d) {
        return "DeviceInfo(uri=" + quoted(d.uri) + ", driver=" + quoted(d.driver) + ", board=" + quoted(d.board) +
               ", memory_bytes=" + std::to_string(d.memory_bytes) + ")";
      });

  py::class_<HeapInfo>(m, "HeapInfo", "A heap of device memory (Properties.heaps).")
      .def_readonly("name", &HeapInfo::name, "Heap name, e.g. 'npu'; pass it as Device.alloc(heap=...).")
      .def_property_readonly(
          "memory", [](const HeapInfo& h) { return from_memory(h.memory); }, "The tpuhal.Memory kind it serves.")
      .def_readonly("base", &HeapInfo::base, "Device address of its first byte.")
      .def_readonly("size", &HeapInfo::size, "Size in bytes.")
      .def_readonly("is_default", &HeapInfo::is_default, "Used by alloc(n, 'device') without a heap name.")
      .def("__repr__", [](const HeapInfo& h) {
        return "HeapInfo(name=" + quoted(h.name) + ", memory='" + to_string(h.memory) + "', base=" + hex(h.base) +
               ", size=" + std::to_string(h.size) + ", is_default=" + boolean(h.is_default) + ")";
      });

  py::class_<EngineInfo>(m, "EngineInfo", "An engine and its hardware queue count (Properties.engines).")
      .def_property_readonly(
          "engine", [](const EngineInfo& e) { return from_engine(e.engine); }, "The tpuhal.Engine.")
      .def_readonly("queues", &EngineInfo::queues, "Hardware queues of this engine.")
      .def("__repr__", [](const EngineInfo& e) {
        return "EngineInfo(engine='" + std::string(to_string(e.engine)) + "', queues=" + std::to_string(e.queues) + ")";
      });

  py::class_<Capabilities>(m, "Capabilities",
                           "What a device can do (Properties.caps). Anything false is refused with "
                           "tpuhal.Unsupported, the same way on every bus.")
      .def_readonly("map_device_memory", &Capabilities::map_device_memory,
                    "Buffer.map() (and DLPack export) of 'device' memory.")
      .def_readonly("host_visible_device_memory", &Capabilities::host_visible_device_memory,
                    "Memory.DeviceHostVisible exists.")
      .def_readonly("import_host_memory", &Capabilities::import_host_memory,
                    "Device.import_host() and zero-copy from_dlpack().")
      .def_readonly("wait_value", &Capabilities::wait_value, "Batch.wait_value() / write_value().")
      .def_readonly("timestamps", &Capabilities::timestamps, "Fence.timestamp_ns and Batch.timestamp().")
      .def_readonly("tensor", &Capabilities::tensor, "A tensor engine.")
      .def_readonly("video_decode", &Capabilities::video_decode, "Video decoding.")
      .def_readonly("telemetry", &Capabilities::telemetry, "Device.telemetry().")
      .def_readonly("modelled_time", &Capabilities::modelled_time,
                    "The board's clock is a timing model's (a simulated board; docs/timing.md).")
      .def_readonly("wait_time", &Capabilities::wait_time,
                    "Work timed on the board's clock: Batch.wait_until(), VideoDecoder.send(arrival_ns=), "
                    "Frame.decoded_ns and Device.board_time_ns().")
      .def("__repr__", [](const Capabilities& c) {
        std::string s = "Capabilities(";
        bool first = true;
        auto add = [&](const char* name, bool v) {
          s += std::string(first ? "" : ", ") + name + "=" + boolean(v);
          first = false;
        };
        add("map_device_memory", c.map_device_memory);
        add("host_visible_device_memory", c.host_visible_device_memory);
        add("import_host_memory", c.import_host_memory);
        add("wait_value", c.wait_value);
        add("timestamps", c.timestamps);
        add("tensor", c.tensor);
        add("video_decode", c.video_decode);
        add("telemetry", c.telemetry);
        add("modelled_time", c.modelled_time);
        add("wait_time", c.wait_time);
        return s + ")";
      });

  py::class_<Properties>(m, "Properties", "What a device is and can do (Device.properties): plain data.")
      .def_readonly("uri", &Properties::uri)
      .def_readonly("driver", &Properties::driver, "Driver name, e.g. 'tpu-sim'.")
      .def_readonly("board", &Properties::board, "The board's model name.")
      .def_readonly("bus", &Properties::bus, "e.g. 'simulated pcie', 'pcie 0000:03:00.0'.")
      .def_readonly("serial", &Properties::serial)
      .def_readonly("firmware_version", &Properties::firmware_version)
      .def_readonly("interface_version", &Properties::interface_version,
                    "Host<->board interface version agreed, e.g. '1.0'.")
      .def_readonly("pci_vendor", &Properties::pci_vendor)
      .def_readonly("pci_device", &Properties::pci_device)
      .def_readonly("memory_bytes", &Properties::memory_bytes, "Device memory in total.")
      .def_readonly("host_visible_bytes", &Properties::host_visible_bytes, "Of it, inside the host-visible window.")
      .def_readonly("min_alignment", &Properties::min_alignment, "Alignment of every device allocation.")
      .def_readonly("heaps", &Properties::heaps, "list[HeapInfo]")
      .def_readonly("engines", &Properties::engines, "list[EngineInfo]")
      .def_readonly("tensor_cores", &Properties::tensor_cores)
      .def_readonly("peak_int8_tops", &Properties::peak_int8_tops)
      .def_readonly("peak_fp16_tflops", &Properties::peak_fp16_tflops)
      .def_readonly("peak_fp32_tflops", &Properties::peak_fp32_tflops)
      .def_property_readonly(
          "dtypes",
          [](const Properties& p) {
            py::list out;
            for (DType d : p.dtypes) out.append(from_dtype(d));
            return out;
          },
          "Element types the tensor engine computes in, e.g. ['f32', 'f16']; empty if none.")
      .def_readonly("decode_channels", &Properties::decode_channels,
                    "VideoDecoder channels the board has (Device.open_decoder()); 0 if none.")
      .def_property_readonly(
          "codecs",
          [](const Properties& p) {
            py::list out;
            for (Codec c : p.codecs) out.append(from_codec(c));
            return out;
          },
          "What the decode channels decode, e.g. ['h264', 'h265', 'jpeg'] (tpuhal.Codec); empty if none.")
      .def_readonly("caps", &Properties::caps, "tpuhal.Capabilities")
      .def(
          "queues",
          [](const Properties& p, py::handle engine) {
            const Engine e = to_engine(engine);
            for (auto& info : p.engines)
              if (info.engine == e) return info.queues;
            return 0u;
          },
          py::arg("engine"), "Hardware queues of `engine` ('compute', 'copy', 'video'); 0 if none.")
      .def("__repr__", [](const Properties& p) {
        return "Properties(uri=" + quoted(p.uri) + ", board=" + quoted(p.board) +
               ", memory_bytes=" + std::to_string(p.memory_bytes) + ", heaps=" + std::to_string(p.heaps.size()) +
               ", engines=" + std::to_string(p.engines.size()) + ")";
      });

  py::class_<HeapStats>(m, "HeapStats", "Use of one heap (MemoryStats.heaps).")
      .def_readonly("name", &HeapStats::name)
      .def_property_readonly("memory", [](const HeapStats& h) { return from_memory(h.memory); })
      .def_readonly("total", &HeapStats::total)
      .def_readonly("used", &HeapStats::used, "Including alignment padding.")
      .def_readonly("free", &HeapStats::free)
      .def_readonly("largest_free", &HeapStats::largest_free, "The largest allocation that can succeed now.")
      .def_readonly("allocations", &HeapStats::allocations, "Live allocations.")
      .def_readonly("peak_used", &HeapStats::peak_used)
      .def("__repr__", [](const HeapStats& h) {
        return "HeapStats(name=" + quoted(h.name) + ", total=" + std::to_string(h.total) +
               ", used=" + std::to_string(h.used) + ", free=" + std::to_string(h.free) +
               ", largest_free=" + std::to_string(h.largest_free) + ", allocations=" + std::to_string(h.allocations) +
               ")";
      });

  py::class_<MemoryStats>(m, "MemoryStats", "Memory use of a device (Device.memory_stats()).")
      .def_readonly("heaps", &MemoryStats::heaps, "list[HeapStats]")
      .def_readonly("device_total", &MemoryStats::device_total)
      .def_readonly("device_used", &MemoryStats::device_used)
      .def_readonly("host_pinned_bytes", &MemoryStats::host_pinned_bytes, "Host memory mapped for the device.")
      .def_readonly("host_pinned_allocations", &MemoryStats::host_pinned_allocations)
      .def_readonly("imported_bytes", &MemoryStats::imported_bytes,
                    "Caller memory mapped with import_host() or from_dlpack().")
      .def("__repr__", [](const MemoryStats& s) {
        return "MemoryStats(device_used=" + std::to_string(s.device_used) +
               ", device_total=" + std::to_string(s.device_total) +
               ", host_pinned_bytes=" + std::to_string(s.host_pinned_bytes) +
               ", imported_bytes=" + std::to_string(s.imported_bytes) + ")";
      });

  py::class_<QueueStatus>(m, "QueueStatus", "One hardware queue (DeviceStatus.queues).")
      .def_property_readonly("engine", [](const QueueStatus& q) { return from_engine(q.engine); })
      .def_readonly("index", &QueueStatus::index, "Hardware queue number.")
      .def_readonly("in_use", &QueueStatus::in_use, "Claimed by a queue in this process.")
      .def_readonly("busy", &QueueStatus::busy, "Work submitted and not yet complete.")
      .def_readonly("failed", &QueueStatus::failed)
      .def_readonly("submitted", &QueueStatus::submitted, "Timeline value of the last submission.")
      .def_readonly("completed", &QueueStatus::completed, "Timeline value reached.")
      .def_readonly("busy_ns", &QueueStatus::busy_ns, "Time the engine spent executing.")
      .def_readonly("retired", &QueueStatus::retired, "Commands the board retired.")
      .def("__repr__", [](const QueueStatus& q) {
        return "QueueStatus(engine='" + std::string(to_string(q.engine)) + "', index=" + std::to_string(q.index) +
               ", in_use=" + boolean(q.in_use) + ", busy=" + boolean(q.busy) + ", failed=" + boolean(q.failed) +
               ", completed=" + std::to_string(q.completed) + ")";
      });

  py::class_<DeviceStatus>(m, "DeviceStatus", "Board uptime and its hardware queues (Device.status()).")
      .def_readonly("uptime_ns", &DeviceStatus::uptime_ns, "Board time since its last reset.")
      .def_readonly("queues", &DeviceStatus::queues, "list[QueueStatus]")
      .def("__repr__", [](const DeviceStatus& s) {
        return "DeviceStatus(uptime_ns=" + std::to_string(s.uptime_ns) + ", queues=" + std::to_string(s.queues.size()) +
               ")";
      });

  py::class_<EngineTelemetry>(m, "EngineTelemetry", "One engine kind's busy time (Telemetry.engines).")
      .def_property_readonly("engine", [](const EngineTelemetry& e) { return from_engine(e.engine); })
      .def_readonly("busy_ns", &EngineTelemetry::busy_ns, "Time at least one of its queues was running work.");
  py::class_<QueueTelemetry>(m, "QueueTelemetry", "One hardware queue's counters (Telemetry.queues).")
      .def_property_readonly("engine", [](const QueueTelemetry& q) { return from_engine(q.engine); })
      .def_readonly("index", &QueueTelemetry::index, "Hardware queue number.")
      .def_readonly("commands", &QueueTelemetry::commands, "Commands retired.")
      .def_readonly("busy_ns", &QueueTelemetry::busy_ns, "Time running work (waits on other queues included).")
      .def_readonly("failures", &QueueTelemetry::failures, "Commands that failed.");
  py::class_<ChannelTelemetry>(m, "ChannelTelemetry", "One decode channel's counters (Telemetry.channels).")
      .def_readonly("channel", &ChannelTelemetry::channel)
      .def_readonly("packets", &ChannelTelemetry::packets, "Compressed packets taken.")
      .def_readonly("frames", &ChannelTelemetry::frames, "Frames decoded.")
      .def_readonly("errors", &ChannelTelemetry::errors, "Packets or frames that did not decode.")
      .def_readonly("busy_ns", &ChannelTelemetry::busy_ns, "Decoder time spent on the channel.");
  py::class_<Telemetry>(m, "Telemetry",
                        "The board's counters since power-on (resets do not clear them) and its sensors "
                        "(Device.telemetry()). tpuhal.utilisation(before, after) turns two into rates.")
      .def_readonly("time_ns", &Telemetry::time_ns, "Board time when taken (DeviceStatus.uptime_ns's clock).")
      .def_readonly("uptime_ns", &Telemetry::uptime_ns, "Since the board powered on.")
      .def_readonly("resets", &Telemetry::resets)
      .def_readonly("engines", &Telemetry::engines, "list[EngineTelemetry]")
      .def_readonly("queues", &Telemetry::queues, "list[QueueTelemetry]")
      .def_readonly("channels", &Telemetry::channels, "list[ChannelTelemetry]")
      .def_readonly("h2d_bytes", &Telemetry::h2d_bytes)
      .def_readonly("d2h_bytes", &Telemetry::d2h_bytes)
      .def_readonly("d2d_bytes", &Telemetry::d2d_bytes)
      .def_readonly("h2h_bytes", &Telemetry::h2h_bytes)
      .def_property_readonly(
          "faults",
          [](const Telemetry& t) {
            py::dict d;
            for (const auto& f : t.faults) d[py::str(f.kind)] = f.count;
            return d;
          },
          "Failed commands by kind, and firmware crashes: dict[str, int].")
      .def_readonly("temperature_c", &Telemetry::temperature_c)
      .def_readonly("power_w", &Telemetry::power_w)
      .def_readonly("power_limit_w", &Telemetry::power_limit_w)
      .def_readonly("energy_j", &Telemetry::energy_j, "Since power-on.")
      .def_readonly("clock_mhz", &Telemetry::clock_mhz)
      .def("__repr__", [](const Telemetry& t) {
        return "Telemetry(uptime_ns=" + std::to_string(t.uptime_ns) +
               ", temperature_c=" + std::to_string(t.temperature_c) + ", power_w=" + std::to_string(t.power_w) + ")";
      });
  py::class_<Utilisation>(m, "Utilisation", "What happened between two telemetry snapshots (tpuhal.utilisation).")
      .def_readonly("interval_s", &Utilisation::interval_s)
      .def_readonly("compute", &Utilisation::compute, "Busy share of the interval, 0 to 1.")
      .def_readonly("copy", &Utilisation::copy)
      .def_readonly("video", &Utilisation::video)
      .def_readonly("channels", &Utilisation::channels, "Each decode channel's share of a decoder.")
      .def_readonly("h2d_gbps", &Utilisation::h2d_gbps)
      .def_readonly("d2h_gbps", &Utilisation::d2h_gbps)
      .def_readonly("d2d_gbps", &Utilisation::d2d_gbps)
      .def_readonly("commands_per_s", &Utilisation::commands_per_s)
      .def_readonly("frames_per_s", &Utilisation::frames_per_s)
      .def("__repr__", [](const Utilisation& u) {
        return "Utilisation(interval_s=" + std::to_string(u.interval_s) + ", compute=" + std::to_string(u.compute) +
               ", copy=" + std::to_string(u.copy) + ", video=" + std::to_string(u.video) + ")";
      });
  m.def("utilisation", &utilisation, py::arg("before"), py::arg("after"),
        "Each engine's busy share and the counters' rates between two snapshots of one board, oldest first.");

  py::class_<WaitPolicy>(m, "WaitPolicy",
                         "How waits wait (Device.wait_policy). `spin` and `timeout` are in seconds: a wait "
                         "raises tpuhal.Timeout once the queue has made no progress for `timeout`.")
      .def(py::init([](py::handle mode, py::handle spin, py::handle timeout) {
             WaitPolicy p;
             if (!mode.is_none()) p.mode = to_wait_mode(mode);
             if (!spin.is_none()) p.spin = to_duration(spin, "spin");
             if (!timeout.is_none()) p.timeout = to_duration(timeout, "timeout");
             return p;
           }),
           py::kw_only(), py::arg("mode") = py::none(), py::arg("spin") = py::none(), py::arg("timeout") = py::none(),
           "A policy; what is not given keeps its default (hybrid, 20 us spin, 10 s timeout).")
      .def_property(
          "mode", [](const WaitPolicy& p) { return from_wait_mode(p.mode); },
          [](WaitPolicy& p, py::handle v) { p.mode = to_wait_mode(v); }, "tpuhal.WaitMode")
      .def_property(
          "spin", [](const WaitPolicy& p) { return seconds(p.spin); },
          [](WaitPolicy& p, py::handle v) { p.spin = to_duration(v, "spin"); },
          "Seconds a Hybrid wait spins before it sleeps.")
      .def_property(
          "timeout", [](const WaitPolicy& p) { return seconds(p.timeout); },
          [](WaitPolicy& p, py::handle v) { p.timeout = to_duration(v, "timeout"); },
          "Seconds without progress after which a wait raises tpuhal.Timeout.")
      .def("__eq__", [](const WaitPolicy& a,
                        const WaitPolicy& b) { return a.mode == b.mode && a.spin == b.spin && a.timeout == b.timeout; })
      .def("__repr__", [](const WaitPolicy& p) {
        char buf[160];
        std::snprintf(buf, sizeof buf, "WaitPolicy(mode='%s', spin=%g, timeout=%g)", to_string(p.mode), seconds(p.spin),
                      seconds(p.timeout));
        return std::string(buf);
      });

  m.def(
      "version", [] { return std::string(tpuhal::version()); }, "The tpuhal library version, e.g. '0.1.0'.");
}

}  // namespace tpuhal::python
