#include "tpuhal/sim/profile.h"

#include "tpuhal/fw/video.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <cctype>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <type_traits>

#include "tpuhal/base/units.h"
#include "tpuhal/fw/command.h"
#include "tpuhal/fw/regs.h"

namespace tpuhal::sim {

// Generated from simulator/profiles/*.json by CMake.
struct BuiltinProfile {
  const char* name;
  const char* json;
};
extern const BuiltinProfile kBuiltinProfiles[];
extern const std::size_t kBuiltinProfileCount;

namespace {

using nlohmann::json;

class Parser {
 public:
  explicit Parser(std::string_view source) : source_(source) {}

  [[noreturn]] void fail(std::string_view field, std::string_view what) const {
    throw ProfileError("board profile '" + std::string(source_) + "': " + std::string(field) + ": " +
                       std::string(what));
  }

  const json& member(const json& obj, const char* key, std::string_view path) const {
    auto it = obj.find(key);
    if (it == obj.end()) fail(std::string(path) + key, "missing");
    return *it;
  }

  std::string str(const json& v, std::string_view field, std::size_t max_len = 256) const {
    if (!v.is_string()) fail(field, "must be a string, got " + v.dump());
    auto s = v.get<std::string>();
    if (s.size() > max_len) fail(field, "longer than " + std::to_string(max_len) + " characters");
    for (unsigned char c : s)
      if (c < 0x20 || c > 0x7e) fail(field, "must be printable ASCII");
    return s;
  }

  // An unsigned integer given as a JSON number or a string: decimal, 0x hex,
  // or a byte size with a binary unit ("256MiB").
  std::uint64_t u64(const json& v, std::string_view field) const {
    if (v.is_number_unsigned()) return v.get<std::uint64_t>();
    if (v.is_number_integer()) {
      auto i = v.get<std::int64_t>();
      if (i < 0) fail(field, "must not be negative, got " + v.dump());
      return static_cast<std::uint64_t>(i);
    }
    if (v.is_string()) {
      const auto s = v.get<std::string>();
      if (s.size() > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
        std::uint64_t out = 0;
        for (std::size_t i = 2; i < s.size(); ++i) {
          const char c = static_cast<char>(std::tolower(static_cast<unsigned char>(s[i])));
          int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
          if (d < 0 || i > 17) fail(field, "is not a valid hex number: \"" + s + "\"");
          out = out << 4 | static_cast<std::uint64_t>(d);
        }
        return out;
      }
      if (auto bytes = base::parse_bytes(s)) return *bytes;
      fail(field, "is not a number or byte size: \"" + s + "\"");
    }
    fail(field, "must be a number or a string, got " + v.dump());
  }

  std::uint32_t u32(const json& v, std::string_view field) const {
    auto x = u64(v, field);
    if (x > UINT32_MAX) fail(field, "is larger than 2^32-1: " + std::to_string(x));
    return static_cast<std::uint32_t>(x);
  }

  double number(const json& v, std::string_view field) const {
    if (!v.is_number()) fail(field, "must be a number, got " + v.dump());
    double d = v.get<double>();
    if (!(d >= 0) || d > 1e9) fail(field, "must be between 0 and 1e9, got " + v.dump());
    return d;
  }

  std::uint32_t version(const json& v, std::string_view field) const {
    const auto s = str(v, field);
    unsigned major = 0, minor = 0, patch = 0;
    char tail = 0;
    if (std::sscanf(s.c_str(), "%u.%u.%u%c", &major, &minor, &patch, &tail) != 3 || major > 0xFFFF || minor > 0xFF ||
        patch > 0xFF)
      fail(field, "must be MAJOR.MINOR.PATCH (e.g. \"1.0.0\"), got \"" + s + "\"");
    return major << 16 | minor << 8 | patch;
  }

 private:
  std::string_view source_;
};

void validate(const BoardProfile& p, const Parser& ps) {
  if (p.name.empty()) ps.fail("name", "must not be empty");
  for (char c : p.name)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_'))
      ps.fail("name", "may hold only letters, digits, '-' and '_': \"" + p.name + "\"");
  if (p.decode_channels > fw::kMaxVideoChannels)
    ps.fail("video.decode_channels", std::to_string(p.decode_channels) + " is more than interface 1.2 allows (" +
                                         std::to_string(fw::kMaxVideoChannels) + ")");
  if (p.bus != "pcie" && p.bus != "soc" && p.bus != "usb")
    ps.fail("bus", "must be \"pcie\", \"soc\" or \"usb\", got \"" + p.bus + "\"");
  const std::uint64_t page = 4096;
  if (p.dram_bytes < (1u << 20) || p.dram_bytes > (1ull << 40) || p.dram_bytes % page)
    ps.fail("memory.dram", "must be a multiple of 4 KiB between 1 MiB and 1 TiB, got " + std::to_string(p.dram_bytes));
  if (p.aperture_bytes > p.dram_bytes || p.aperture_bytes % page)
    ps.fail("memory.aperture",
            "must be a multiple of 4 KiB no larger than DRAM, got " + std::to_string(p.aperture_bytes));
  if (p.regions.empty() || p.regions.size() > fw::kMaxMemRegions)
    ps.fail("memory.regions", "must list 1 to " + std::to_string(fw::kMaxMemRegions) + " regions");
  int defaults = 0;
  for (std::size_t i = 0; i < p.regions.size(); ++i) {
    const auto& r = p.regions[i];
    const std::string f = "memory.regions[" + std::to_string(i) + "]";
    if (r.name.empty() || r.name.size() > 15) ps.fail(f + ".name", "must be 1 to 15 characters");
    if (r.size == 0 || r.base % page || r.size % page) ps.fail(f, "base and size must be non-zero multiples of 4 KiB");
    if (r.base > p.dram_bytes || r.size > p.dram_bytes - r.base)
      ps.fail(f, "extends past DRAM (" + base::format_bytes(p.dram_bytes) + ")");
    if (r.host_visible && r.base + r.size > p.aperture_bytes)
      ps.fail(f, "is host_visible but extends past the aperture (" + base::format_bytes(p.aperture_bytes) + ")");
    if (r.is_default && r.reserved) ps.fail(f, "cannot be both default and reserved");
    defaults += r.is_default;
    for (std::size_t j = 0; j < i; ++j) {
      const auto& o = p.regions[j];
      if (r.base < o.base + o.size && o.base < r.base + r.size)
        ps.fail(f, "overlaps memory.regions[" + std::to_string(j) + "] (\"" + o.name + "\")");
      if (o.name == r.name) ps.fail(f + ".name", "\"" + r.name + "\" is used twice");
    }
  }
  if (defaults != 1)
    ps.fail("memory.regions", "exactly one region must have the \"default\" flag, found " + std::to_string(defaults));
  const auto queues = p.total_queues();
  if (queues == 0 || queues > fw::kMaxQueues)
    ps.fail("queues", "must total 1 to " + std::to_string(fw::kMaxQueues) + " queues, got " + std::to_string(queues));
  if (p.max_ring_entries < fw::kMinRingEntries || p.max_ring_entries > (1u << 20) ||
      (p.max_ring_entries & (p.max_ring_entries - 1)))
    ps.fail("max_ring_entries", "must be a power of two from 16 to 2^20, got " + std::to_string(p.max_ring_entries));
  if (p.idle_spin_us > 10'000) ps.fail("timing.idle_spin_us", "must be at most 10000");
  if (!(p.idle_power_w >= 0 && p.idle_power_w <= 10'000)) ps.fail("power.idle_w", "must be 0 to 10000");
  if (!(p.peak_power_w >= p.idle_power_w && p.peak_power_w <= 10'000))
    ps.fail("power.peak_w", "must be at least power.idle_w and at most 10000");
  if (!(p.ambient_c >= -50 && p.ambient_c <= 100)) ps.fail("power.ambient_c", "must be -50 to 100");
  if (!(p.thermal_c_per_w >= 0 && p.thermal_c_per_w <= 100)) ps.fail("power.thermal_c_per_w", "must be 0 to 100");
  if (!(p.thermal_time_s > 0 && p.thermal_time_s <= 3600))
    ps.fail("power.thermal_time_s", "must be above 0, at most 3600");
  if (p.clock_mhz == 0 || p.clock_mhz > 100'000) ps.fail("power.clock_mhz", "must be 1 to 100000");
}

// timing.model: every field present, positive, and sensible together
// (fw::check_timing), each named in full when it is not.
fw::TimingModel timing_model(const Parser& ps, const json& j) {
  const std::string at = "timing.model.";
  if (!j.is_object()) ps.fail("timing.model", "must be an object");
  fw::TimingModel m;
  auto u32 = [&](const char* key) { return ps.u32(ps.member(j, key, at), at + key); };
  auto u64 = [&](const char* key) { return ps.u64(ps.member(j, key, at), at + key); };
  // {"int8": ..., "fp16": ..., "fp32": ...}, or {"h264", "h265", "jpeg"}.
  auto each = [&](const char* key, std::initializer_list<const char*> names, auto* out) {
    const json& o = ps.member(j, key, at);
    const std::string field = at + key;
    if (!o.is_object()) ps.fail(field, "must be an object with " + std::to_string(names.size()) + " entries");
    for (auto it = o.begin(); it != o.end(); ++it)
      if (std::find_if(names.begin(), names.end(), [&](const char* n) { return it.key() == n; }) == names.end())
        ps.fail(field + "." + it.key(), "is not one of the entries this takes");
    std::size_t i = 0;
    for (const char* n : names) {
      const auto v = ps.u64(ps.member(o, n, field + "."), field + "." + n);
      if (v > UINT32_MAX && sizeof(out[0]) == 4) ps.fail(field + "." + n, "must be below 2^32");
      out[i++] = static_cast<std::remove_reference_t<decltype(out[0])>>(v);
    }
  };
  m.clock_mhz = u32("clock_mhz");
  m.lanes = u32("lanes");
  m.lane_memory_kib = u32("lane_memory_kib");
  m.l2_kib = u32("l2_kib");
  each("macs_per_lane_cycle", {"int8", "fp16", "fp32"}, m.macs_per_lane_cycle);
  each("channel_tile", {"int8", "fp16", "fp32"}, m.channel_tile);
  each("mac_efficiency_pct", {"int8", "fp16", "fp32"}, m.mac_efficiency_pct);
  each("vector_lane_elems", {"int8", "fp16", "fp32"}, m.vector_lane_elems);
  m.command_ns = u32("command_ns");
  m.op_ns = u32("op_ns");
  m.dram_mbps = u64("dram_mbps");
  m.host_mbps = u64("host_mbps");
  m.d2d_mbps = u64("d2d_mbps");
  each("decode_pixels_per_s", {"h264", "h265", "jpeg"}, m.decode_pixels_per_s);
  m.intra_pct = u32("intra_pct");
  m.bidir_pct = u32("bidir_pct");
  static constexpr const char* kKnown[] = {"clock_mhz",
                                           "lanes",
                                           "lane_memory_kib",
                                           "l2_kib",
                                           "macs_per_lane_cycle",
                                           "channel_tile",
                                           "mac_efficiency_pct",
                                           "vector_lane_elems",
                                           "command_ns",
                                           "op_ns",
                                           "dram_mbps",
                                           "host_mbps",
                                           "d2d_mbps",
                                           "decode_pixels_per_s",
                                           "intra_pct",
                                           "bidir_pct"};
  for (auto it = j.begin(); it != j.end(); ++it)
    if (std::find(std::begin(kKnown), std::end(kKnown), it.key()) == std::end(kKnown))
      ps.fail(at + it.key(), "is not a timing parameter (docs/timing.md lists them)");
  const char* why = nullptr;
  if (const char* bad = fw::check_timing(m, &why)) ps.fail(at + bad, why);
  return m;
}

// The peaks the host reads (tensor.*) and the model's array are one board:
// each stated peak within 10 % of lanes * macs_per_lane_cycle * clock * 2.
void check_peaks(const BoardProfile& p, const Parser& ps) {
  const struct {
    double stated;
    fw::MacPrecision precision;
    const char* field;
  } peaks[] = {{p.int8_tops, fw::MacPrecision::kInt8, "int8"},
               {p.fp16_tflops, fw::MacPrecision::kF16, "fp16"},
               {p.fp32_tflops, fw::MacPrecision::kF32, "fp32"}};
  for (const auto& k : peaks) {
    if (k.stated <= 0) continue;
    const double model = 2e-12 * static_cast<double>(p.timing->peak_macs_per_s(k.precision));
    if (model < 0.9 * k.stated || model > 1.1 * k.stated)
      ps.fail(std::string("timing.model.macs_per_lane_cycle.") + k.field,
              "gives a peak of " + std::to_string(model) + " T/s, but tensor states " + std::to_string(k.stated) +
                  " (they must agree within 10 %)");
  }
}

}  // namespace

std::uint32_t BoardProfile::total_queues() const noexcept {
  std::uint64_t n = 0;
  for (auto& g : queues) n += g.count;
  return n > UINT32_MAX ? UINT32_MAX : static_cast<std::uint32_t>(n);
}

fw::EngineType BoardProfile::engine_of_queue(std::uint32_t q) const noexcept {
  for (auto& g : queues) {
    if (q < g.count) return g.engine;
    q -= g.count;
  }
  return fw::EngineType::kNone;
}

BoardProfile parse_profile(std::string_view text, std::string_view source) {
  Parser ps(source);
  json doc = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false,
                         /*ignore_comments=*/true);
  if (doc.is_discarded()) ps.fail("document", "is not valid JSON");
  if (!doc.is_object()) ps.fail("document", "must be a JSON object");

  BoardProfile p;
  p.name = ps.str(ps.member(doc, "name", ""), "name", 32);
  p.model = ps.str(ps.member(doc, "model", ""), "model", fw::reg::kBoardNameBytes - 1);
  p.bus = ps.str(ps.member(doc, "bus", ""), "bus");
  if (auto it = doc.find("pci"); it != doc.end()) {
    if (!it->is_object()) ps.fail("pci", "must be an object");
    auto vendor = ps.u64(ps.member(*it, "vendor", "pci."), "pci.vendor");
    auto device = ps.u64(ps.member(*it, "device", "pci."), "pci.device");
    if (vendor > 0xFFFF || device > 0xFFFF) ps.fail("pci", "ids are 16-bit");
    p.pci_vendor = static_cast<std::uint16_t>(vendor);
    p.pci_device = static_cast<std::uint16_t>(device);
  }
  if (auto it = doc.find("usb"); it != doc.end()) {
    if (!it->is_object()) ps.fail("usb", "must be an object");
    auto vendor = ps.u64(ps.member(*it, "vendor", "usb."), "usb.vendor");
    auto product = ps.u64(ps.member(*it, "product", "usb."), "usb.product");
    std::uint64_t loader = 0;
    if (auto l = it->find("loader_product"); l != it->end()) loader = ps.u64(*l, "usb.loader_product");
    if (vendor > 0xFFFF || product > 0xFFFF || loader > 0xFFFF) ps.fail("usb", "ids are 16-bit");
    p.usb_vendor = static_cast<std::uint16_t>(vendor);
    p.usb_product = static_cast<std::uint16_t>(product);
    p.usb_loader_product = static_cast<std::uint16_t>(loader);
  }
  if (auto it = doc.find("board_id"); it != doc.end()) p.board_id = ps.u32(*it, "board_id");
  if (auto it = doc.find("revision"); it != doc.end()) p.revision = ps.u32(*it, "revision");
  if (auto it = doc.find("serial"); it != doc.end()) p.serial = ps.u64(*it, "serial");
  p.firmware_version = ps.version(ps.member(doc, "firmware_version", ""), "firmware_version");

  const json& mem = ps.member(doc, "memory", "");
  if (!mem.is_object()) ps.fail("memory", "must be an object");
  p.dram_bytes = ps.u64(ps.member(mem, "dram", "memory."), "memory.dram");
  p.aperture_bytes = ps.u64(ps.member(mem, "aperture", "memory."), "memory.aperture");
  const json& regions = ps.member(mem, "regions", "memory.");
  if (!regions.is_array()) ps.fail("memory.regions", "must be an array");
  for (std::size_t i = 0; i < regions.size() && i <= fw::kMaxMemRegions; ++i) {
    const std::string f = "memory.regions[" + std::to_string(i) + "]";
    const json& r = regions[i];
    if (!r.is_object()) ps.fail(f, "must be an object");
    MemRegionProfile region;
    region.name = ps.str(ps.member(r, "name", f + "."), f + ".name", 15);
    region.base = ps.u64(ps.member(r, "base", f + "."), f + ".base");
    region.size = ps.u64(ps.member(r, "size", f + "."), f + ".size");
    if (auto fl = r.find("flags"); fl != r.end()) {
      if (!fl->is_array()) ps.fail(f + ".flags", "must be an array of strings");
      for (auto& flag : *fl) {
        const auto s = ps.str(flag, f + ".flags");
        if (s == "host_visible")
          region.host_visible = true;
        else if (s == "default")
          region.is_default = true;
        else if (s == "reserved")
          region.reserved = true;
        else
          ps.fail(f + ".flags", "unknown flag \"" + s + "\" (host_visible, default, reserved)");
      }
    }
    p.regions.push_back(std::move(region));
  }

  const json& queues = ps.member(doc, "queues", "");
  if (!queues.is_object()) ps.fail("queues", "must be an object");
  static const std::pair<const char*, fw::EngineType> kEngines[] = {
      {"compute", fw::EngineType::kCompute}, {"copy", fw::EngineType::kCopy}, {"video", fw::EngineType::kVideo}};
  for (auto it = queues.begin(); it != queues.end(); ++it) {
    auto e = std::find_if(std::begin(kEngines), std::end(kEngines), [&](auto& k) { return it.key() == k.first; });
    if (e == std::end(kEngines)) ps.fail("queues." + it.key(), "unknown engine (compute, copy, video)");
  }
  for (auto& [key, engine] : kEngines) {
    if (auto it = queues.find(key); it != queues.end()) {
      const auto n = ps.u32(*it, std::string("queues.") + key);
      if (n > fw::kMaxQueues) ps.fail(std::string("queues.") + key, "too many queues");
      if (n) p.queues.push_back({engine, n});
    }
  }
  if (auto it = doc.find("max_ring_entries"); it != doc.end()) p.max_ring_entries = ps.u32(*it, "max_ring_entries");

  if (auto it = doc.find("tensor"); it != doc.end()) {
    if (!it->is_object()) ps.fail("tensor", "must be an object");
    if (auto c = it->find("cores"); c != it->end()) p.tensor_cores = ps.u32(*c, "tensor.cores");
    if (auto c = it->find("int8_tops"); c != it->end()) p.int8_tops = ps.number(*c, "tensor.int8_tops");
    if (auto c = it->find("fp16_tflops"); c != it->end()) p.fp16_tflops = ps.number(*c, "tensor.fp16_tflops");
    if (auto c = it->find("fp32_tflops"); c != it->end()) p.fp32_tflops = ps.number(*c, "tensor.fp32_tflops");
  }
  if (auto it = doc.find("video"); it != doc.end()) {
    if (!it->is_object()) ps.fail("video", "must be an object");
    if (auto c = it->find("decode_channels"); c != it->end()) p.decode_channels = ps.u32(*c, "video.decode_channels");
    if (auto c = it->find("decode_threads"); c != it->end()) p.decode_threads = ps.u32(*c, "video.decode_threads");
    if (auto c = it->find("memory"); c != it->end()) p.decode_memory_bytes = ps.u64(*c, "video.memory");
    if (auto c = it->find("codecs"); c != it->end()) {
      if (!c->is_array()) ps.fail("video.codecs", "must be an array of strings");
      for (auto& codec : *c) p.codecs.push_back(ps.str(codec, "video.codecs", 16));
    }
  }
  if (auto it = doc.find("timing"); it != doc.end()) {
    if (!it->is_object()) ps.fail("timing", "must be an object");
    if (auto c = it->find("idle_spin_us"); c != it->end()) p.idle_spin_us = ps.u32(*c, "timing.idle_spin_us");
    if (auto c = it->find("model"); c != it->end()) {
      p.timing = timing_model(ps, *c);
      check_peaks(p, ps);
    }
  }
  if (auto it = doc.find("power"); it != doc.end()) {
    if (!it->is_object()) ps.fail("power", "must be an object");
    if (auto c = it->find("idle_w"); c != it->end()) p.idle_power_w = ps.number(*c, "power.idle_w");
    if (auto c = it->find("peak_w"); c != it->end()) p.peak_power_w = ps.number(*c, "power.peak_w");
    if (auto c = it->find("ambient_c"); c != it->end()) p.ambient_c = ps.number(*c, "power.ambient_c");
    if (auto c = it->find("thermal_c_per_w"); c != it->end())
      p.thermal_c_per_w = ps.number(*c, "power.thermal_c_per_w");
    if (auto c = it->find("thermal_time_s"); c != it->end()) p.thermal_time_s = ps.number(*c, "power.thermal_time_s");
    if (auto c = it->find("clock_mhz"); c != it->end()) p.clock_mhz = ps.u32(*c, "power.clock_mhz");
  }
  validate(p, ps);
  return p;
}

std::vector<std::string> builtin_profile_names() {
  std::vector<std::string> names;
  for (std::size_t i = 0; i < kBuiltinProfileCount; ++i) names.emplace_back(kBuiltinProfiles[i].name);
  return names;
}

BoardProfile load_profile(std::string_view spec) {
  auto read_file = [](const std::string& path) -> std::optional<std::string> {
    std::ifstream in(path, std::ios::binary);
    if (!in) return std::nullopt;
    std::ostringstream text;
    text << in.rdbuf();
    return text.str();
  };
  const bool is_path =
      spec.find('/') != std::string_view::npos || (spec.size() > 5 && spec.substr(spec.size() - 5) == ".json");
  if (is_path) {
    auto text = read_file(std::string(spec));
    if (!text) throw ProfileError("board profile '" + std::string(spec) + "': cannot read the file");
    return parse_profile(*text, spec);
  }
  for (std::size_t i = 0; i < kBuiltinProfileCount; ++i)
    if (spec == kBuiltinProfiles[i].name)
      return parse_profile(kBuiltinProfiles[i].json, std::string("built-in ") + kBuiltinProfiles[i].name);
  if (const char* dirs = std::getenv("TPUHAL_PROFILE_PATH")) {
    std::string_view rest = dirs;
    while (!rest.empty()) {
      auto colon = rest.find(':');
      auto dir = rest.substr(0, colon);
      rest = colon == std::string_view::npos ? std::string_view{} : rest.substr(colon + 1);
      if (dir.empty()) continue;
      const std::string path = std::string(dir) + "/" + std::string(spec) + ".json";
      if (auto text = read_file(path)) return parse_profile(*text, path);
    }
  }
  std::string known;
  for (auto& n : builtin_profile_names()) known += (known.empty() ? "" : ", ") + n;
  throw ProfileError("no board profile named '" + std::string(spec) + "' (built-in: " + known +
                     "; others are found as NAME.json in TPUHAL_PROFILE_PATH)");
}

}  // namespace tpuhal::sim
