// Board profiles: the built-ins, validation of broken documents, and lookup
// through TPUHAL_PROFILE_PATH.
#include "tpuhal/sim/profile.h"

#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "support/scoped_env.hpp"

namespace tpuhal::sim {
namespace {

constexpr std::uint64_t kMiB = 1ull << 20;
constexpr std::uint64_t kGiB = 1ull << 30;

// A valid document the broken cases below are derived from, one edit each.
const char* const kValidProfile = R"({
  "name": "unit-test",
  "model": "Unit test board",
  "bus": "pcie",
  "pci": { "vendor": "0x1f1c", "device": "0x00aa" },
  "board_id": 7,
  "revision": 2,
  "serial": "0xABCDEF",
  "firmware_version": "1.2.3",
  "memory": {
    "dram": "32MiB",
    "aperture": "8MiB",
    "regions": [
      { "name": "visible", "base": "0", "size": "8MiB", "flags": ["host_visible"] },
      { "name": "heap", "base": "8MiB", "size": "16MiB", "flags": ["default"] },
      { "name": "fw", "base": "24MiB", "size": "8MiB", "flags": ["reserved"] }
    ]
  },
  "queues": { "compute": 1, "copy": 2 },
  "max_ring_entries": 256,
  "timing": { "idle_spin_us": 10 }
})";

std::string replace(std::string text, const std::string& from, const std::string& to) {
  const auto pos = text.find(from);
  EXPECT_NE(pos, std::string::npos) << "test bug: '" << from << "' not in the base profile";
  if (pos != std::string::npos) text.replace(pos, from.size(), to);
  return text;
}

// The ProfileError message for `text`, or "" if it parsed.
std::string error_of(const std::string& text) {
  try {
    (void)parse_profile(text, "test.json");
  } catch (const ProfileError& e) {
    return e.what();
  }
  return "";
}

TEST(SimProfile, BuiltinNamesListBoth) {
  auto names = builtin_profile_names();
  EXPECT_NE(std::find(names.begin(), names.end(), "bm1684x"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "tiny"), names.end());
}

TEST(SimProfile, TinyBuiltinLoads) {
  const BoardProfile p = load_profile("tiny");
  EXPECT_EQ(p.name, "tiny");
  EXPECT_EQ(p.model, "Small test board (simulated)");
  EXPECT_EQ(p.bus, "pcie");
  EXPECT_EQ(p.pci_vendor, 0x1f1c);
  EXPECT_EQ(p.pci_device, 0x0001);
  EXPECT_EQ(p.board_id, 1u);
  EXPECT_EQ(p.serial, 1u);
  EXPECT_EQ(p.firmware_version, 0x010000u);
  EXPECT_EQ(p.dram_bytes, 64 * kMiB);
  EXPECT_EQ(p.aperture_bytes, 16 * kMiB);
  ASSERT_EQ(p.regions.size(), 2u);
  EXPECT_EQ(p.regions[0].name, "host-visible");
  EXPECT_EQ(p.regions[0].base, 0u);
  EXPECT_EQ(p.regions[0].size, 16 * kMiB);
  EXPECT_TRUE(p.regions[0].host_visible);
  EXPECT_FALSE(p.regions[0].is_default);
  EXPECT_EQ(p.regions[1].name, "device");
  EXPECT_EQ(p.regions[1].base, 16 * kMiB);
  EXPECT_EQ(p.regions[1].size, 48 * kMiB);
  EXPECT_TRUE(p.regions[1].is_default);
  EXPECT_EQ(p.total_queues(), 4u);
  EXPECT_EQ(p.engine_of_queue(0), fw::EngineType::kCompute);
  EXPECT_EQ(p.engine_of_queue(1), fw::EngineType::kCompute);
  EXPECT_EQ(p.engine_of_queue(2), fw::EngineType::kCopy);
  EXPECT_EQ(p.engine_of_queue(3), fw::EngineType::kVideo);
  EXPECT_EQ(p.engine_of_queue(4), fw::EngineType::kNone);
  EXPECT_EQ(p.max_ring_entries, 4096u);
  EXPECT_EQ(p.tensor_cores, 2u);
  EXPECT_DOUBLE_EQ(p.fp16_tflops, 0.5);
  EXPECT_DOUBLE_EQ(p.fp32_tflops, 0.125);
  EXPECT_EQ(p.decode_channels, 2u);
  EXPECT_EQ(p.codecs, (std::vector<std::string>{"h264", "h265", "jpeg"}));
}

TEST(SimProfile, Bm1684xBuiltinLoads) {
  const BoardProfile p = load_profile("bm1684x");
  EXPECT_EQ(p.name, "bm1684x");
  EXPECT_EQ(p.pci_vendor, 0x1f1c);
  EXPECT_EQ(p.pci_device, 0x1686);
  EXPECT_EQ(p.board_id, 1684u);
  EXPECT_EQ(p.serial, 0x0000168400000001u);
  EXPECT_EQ(p.dram_bytes, 12 * kGiB);
  EXPECT_EQ(p.aperture_bytes, 256 * kMiB);
  ASSERT_EQ(p.regions.size(), 3u);
  EXPECT_EQ(p.regions[1].name, "npu");
  EXPECT_EQ(p.regions[1].base, 256 * kMiB);
  EXPECT_EQ(p.regions[1].size, 7936 * kMiB);
  EXPECT_TRUE(p.regions[1].is_default);
  EXPECT_EQ(p.regions[2].base, 8 * kGiB);
  EXPECT_EQ(p.regions[2].size, 4 * kGiB);
  EXPECT_EQ(p.total_queues(), 10u);
  EXPECT_EQ(p.engine_of_queue(3), fw::EngineType::kCompute);
  EXPECT_EQ(p.engine_of_queue(4), fw::EngineType::kCopy);
  EXPECT_EQ(p.engine_of_queue(8), fw::EngineType::kVideo);
  EXPECT_EQ(p.engine_of_queue(9), fw::EngineType::kVideo);
  EXPECT_EQ(p.engine_of_queue(10), fw::EngineType::kNone);
  EXPECT_EQ(p.max_ring_entries, 65536u);
  EXPECT_EQ(p.tensor_cores, 8u);
  EXPECT_DOUBLE_EQ(p.int8_tops, 32.0);
  EXPECT_EQ(p.decode_channels, 256u);
}

TEST(SimProfile, ValidDocumentParsesEveryField) {
  const BoardProfile p = parse_profile(kValidProfile, "test.json");
  EXPECT_EQ(p.name, "unit-test");
  EXPECT_EQ(p.pci_device, 0xaa);
  EXPECT_EQ(p.revision, 2u);
  EXPECT_EQ(p.serial, 0xABCDEFu);
  EXPECT_EQ(p.firmware_version, (1u << 16) | (2u << 8) | 3u);
  EXPECT_EQ(p.dram_bytes, 32 * kMiB);
  ASSERT_EQ(p.regions.size(), 3u);
  EXPECT_TRUE(p.regions[2].reserved);
  EXPECT_EQ(p.total_queues(), 3u);
  EXPECT_EQ(p.engine_of_queue(0), fw::EngineType::kCompute);
  EXPECT_EQ(p.engine_of_queue(2), fw::EngineType::kCopy);
  EXPECT_EQ(p.max_ring_entries, 256u);
  EXPECT_EQ(p.idle_spin_us, 10u);
}

TEST(SimProfile, UsbIdsAreReadWithAnOptionalLoaderProduct) {
  const std::string pci = R"("pci": { "vendor": "0x1f1c", "device": "0x00aa" },)";
  BoardProfile p = parse_profile(
      replace(kValidProfile, pci, R"("usb": { "vendor": "0x1209", "product": "0x0010", "loader_product": "0x0011" },)"),
      "test.json");
  EXPECT_EQ(p.usb_vendor, 0x1209);
  EXPECT_EQ(p.usb_product, 0x0010);
  EXPECT_EQ(p.usb_loader_product, 0x0011);
  p = parse_profile(replace(kValidProfile, pci, R"("usb": { "vendor": "0x1209", "product": "0x0010" },)"), "test.json");
  EXPECT_EQ(p.usb_loader_product, 0);
  EXPECT_NE(error_of(replace(kValidProfile, pci, R"("usb": { "vendor": "0x1209" },)")).find("usb.product"),
            std::string::npos);
  EXPECT_NE(error_of(replace(kValidProfile, pci, R"("usb": { "vendor": "0x11209", "product": "1" },)")).find("16-bit"),
            std::string::npos);
  EXPECT_NE(error_of(replace(kValidProfile, pci, R"("usb": 7,)")).find("usb: must be an object"), std::string::npos);
}

TEST(SimProfile, NumbersMayBeJsonNumbersAndCommentsAreAllowed) {
  std::string text = replace(kValidProfile, R"("dram": "32MiB")", R"("dram": 33554432)");
  text = replace(text, R"("board_id": 7,)", "// a comment\n  \"board_id\": 7,");
  const BoardProfile p = parse_profile(text, "test.json");
  EXPECT_EQ(p.dram_bytes, 32 * kMiB);
}

struct BrokenCase {
  const char* what;
  std::string text;
  std::vector<std::string> message_parts;  // all must appear in the error
};

// Each case is refused, with a message that names its source first and
// holds every part.
void expect_refused(const std::vector<BrokenCase>& cases) {
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    const std::string msg = error_of(c.text);
    ASSERT_FALSE(msg.empty()) << "accepted";
    EXPECT_EQ(msg.rfind("board profile 'test.json': ", 0), 0u) << msg;
    for (const auto& part : c.message_parts)
      EXPECT_NE(msg.find(part), std::string::npos) << "'" << part << "' not in: " << msg;
  }
}

TEST(SimProfile, BrokenDocumentsAreRejectedNamingTheField) {
  const std::string v = kValidProfile;
  const std::vector<BrokenCase> cases = {
      {"invalid JSON", "{ \"name\": ", {"document", "not valid JSON"}},
      {"not an object", "[1, 2]", {"document", "must be a JSON object"}},
      {"missing name", replace(v, R"("name": "unit-test",)", ""), {"name: missing"}},
      {"bad name characters", replace(v, R"("unit-test")", R"("unit test")"), {"name:", "unit test"}},
      {"name not a string", replace(v, R"("unit-test")", "12"), {"name:", "must be a string"}},
      {"missing model", replace(v, R"("model": "Unit test board",)", ""), {"model: missing"}},
      {"bad bus", replace(v, R"("bus": "pcie")", R"("bus": "isa")"), {"bus:", "\"isa\""}},
      {"pci id too wide", replace(v, R"("0x00aa")", R"("0x10000")"), {"pci:", "16-bit"}},
      {"bad hex", replace(v, R"("0xABCDEF")", R"("0xABCDEG")"), {"serial:", "hex", "0xABCDEG"}},
      {"negative number", replace(v, R"("board_id": 7)", R"("board_id": -7)"), {"board_id:", "negative"}},
      {"u32 overflow", replace(v, R"("revision": 2)", R"("revision": 4294967296)"), {"revision:", "2^32-1"}},
      {"missing firmware_version", replace(v, R"("firmware_version": "1.2.3",)", ""), {"firmware_version: missing"}},
      {"bad firmware_version",
       replace(v, R"("1.2.3")", R"("1.2")"),
       {"firmware_version:", "MAJOR.MINOR.PATCH", "\"1.2\""}},
      {"firmware_version trailing junk",
       replace(v, R"("1.2.3")", R"("1.2.3-rc1")"),
       {"firmware_version:", "1.2.3-rc1"}},
      {"firmware_version minor too big", replace(v, R"("1.2.3")", R"("1.256.0")"), {"firmware_version:"}},
      {"missing memory", replace(v, R"("memory": {)", R"("memoryx": {)"), {"memory: missing"}},
      {"dram not a multiple of 4 KiB",
       replace(v, R"("dram": "32MiB")", R"("dram": 33554944)"),
       {"memory.dram:", "multiple of 4 KiB", "33554944"}},
      {"dram with a bad unit", replace(v, R"("32MiB")", R"("32MB")"), {"memory.dram:", "\"32MB\""}},
      {"dram too small", replace(v, R"("dram": "32MiB")", R"("dram": "512KiB")"), {"memory.dram:", "524288"}},
      {"aperture larger than DRAM",
       replace(v, R"("aperture": "8MiB")", R"("aperture": "64MiB")"),
       {"memory.aperture:", "no larger than DRAM"}},
      {"missing regions", replace(v, R"("regions": [)", R"("regionz": [)"), {"memory.regions: missing"}},
      {"overlapping regions",
       replace(v, R"("base": "24MiB")", R"("base": "20MiB")"),
       {"memory.regions[2]", "overlaps memory.regions[1]", "\"heap\""}},
      {"two default regions",
       replace(v, R"(["reserved"])", R"(["default"])"),
       {"memory.regions:", "exactly one region", "default", "found 2"}},
      {"no default region", replace(v, R"(["default"])", "[]"), {"memory.regions:", "exactly one region", "found 0"}},
      {"host_visible past the aperture",
       replace(v, R"(["default"])", R"(["default", "host_visible"])"),
       {"memory.regions[1]", "host_visible", "aperture", "8 MiB"}},
      {"region past DRAM",
       replace(v, R"("size": "16MiB")", R"("size": "32MiB")"),
       {"memory.regions[1]", "extends past DRAM", "32 MiB"}},
      {"region misaligned",
       replace(v, R"("base": "8MiB")", R"("base": 8389120)"),
       {"memory.regions[1]", "multiples of 4 KiB"}},
      {"region name too long",
       replace(v, R"("name": "heap")", R"("name": "a-very-long-region-name")"),
       {"memory.regions[1].name"}},
      {"duplicate region name",
       replace(v, R"("name": "fw")", R"("name": "heap")"),
       {"memory.regions[2].name", "\"heap\" is used twice"}},
      {"unknown region flag",
       replace(v, R"(["reserved"])", R"(["cached"])"),
       {"memory.regions[2].flags", "unknown flag \"cached\""}},
      {"default and reserved",
       replace(v, R"(["reserved"])", R"(["reserved", "default"])"),
       {"memory.regions[2]", "both default and reserved"}},
      {"unknown queue engine",
       replace(v, R"("copy": 2)", R"("copy": 2, "tensor": 1)"),
       {"queues.tensor:", "unknown engine"}},
      {"too many queues in a group", replace(v, R"("copy": 2)", R"("copy": 32)"), {"queues.copy:", "too many queues"}},
      {"too many queues in total",
       replace(v, R"("compute": 1, "copy": 2)", R"("compute": 16, "copy": 16)"),
       {"queues:", "1 to 31 queues", "got 32"}},
      {"no queues", replace(v, R"("compute": 1, "copy": 2)", R"("compute": 0)"), {"queues:", "got 0"}},
      {"ring size not a power of two",
       replace(v, R"("max_ring_entries": 256)", R"("max_ring_entries": 300)"),
       {"max_ring_entries:", "power of two", "300"}},
      {"ring size too small",
       replace(v, R"("max_ring_entries": 256)", R"("max_ring_entries": 8)"),
       {"max_ring_entries:", "got 8"}},
      {"idle spin too long", replace(v, R"("idle_spin_us": 10)", R"("idle_spin_us": 20000)"), {"timing.idle_spin_us:"}},
      {"model not printable", replace(v, R"("Unit test board")", R"("Unit\ttest")"), {"model:", "printable ASCII"}},
  };
  expect_refused(cases);
}

// kValidProfile with a timing model (tiny's, for a board with no tensor
// peaks stated).
std::string with_model(const std::string& model) {
  return replace(kValidProfile, R"("timing": { "idle_spin_us": 10 })",
                 R"("timing": { "idle_spin_us": 10, "model": )" + model + "}");
}
const char* const kModel = R"({
  "clock_mhz": 500, "lanes": 8, "lane_memory_kib": 64, "l2_kib": 1024,
  "macs_per_lane_cycle": { "int8": 125, "fp16": 62, "fp32": 16 },
  "channel_tile": { "int8": 16, "fp16": 8, "fp32": 1 },
  "mac_efficiency_pct": { "int8": 50, "fp16": 50, "fp32": 50 },
  "vector_lane_elems": { "int8": 32, "fp16": 16, "fp32": 8 },
  "command_ns": 200, "op_ns": 2000,
  "dram_mbps": 16000, "host_mbps": 8000, "d2d_mbps": 8000,
  "decode_pixels_per_s": { "h264": 100000000, "h265": 100000000, "jpeg": 100000000 },
  "intra_pct": 150, "bidir_pct": 110
})";

TEST(SimProfile, ATimingModelIsReadWhole) {
  const BoardProfile p = parse_profile(with_model(kModel), "test.json");
  ASSERT_TRUE(p.timing.has_value());
  EXPECT_EQ(p.timing->clock_mhz, 500u);
  EXPECT_EQ(p.timing->lanes, 8u);
  EXPECT_EQ(p.timing->macs_per_lane_cycle[1], 62u);
  EXPECT_EQ(p.timing->channel_tile[0], 16u);
  EXPECT_EQ(p.timing->dram_mbps, 16000u);
  EXPECT_EQ(p.timing->decode_pixels_per_s[2], 100000000u);
  EXPECT_EQ(p.timing->bidir_pct, 110u);
  // Without one the board keeps the host's time.
  EXPECT_FALSE(parse_profile(kValidProfile, "test.json").timing.has_value());
  // Every built-in board has one.
  for (const auto& name : builtin_profile_names()) EXPECT_TRUE(load_profile(name).timing.has_value()) << name;
}

TEST(SimProfile, AMissingOrImpossibleTimingParameterIsRefusedNamingIt) {
  const std::string m = kModel;
  const std::vector<BrokenCase> cases = {
      {"missing", with_model(replace(m, R"("lanes": 8, )", "")), {"timing.model.lanes: missing"}},
      {"missing precision", with_model(replace(m, R"("int8": 16, )", "")), {"timing.model.channel_tile.int8: missing"}},
      {"zero",
       with_model(replace(m, R"("clock_mhz": 500)", R"("clock_mhz": 0)")),
       {"timing.model.clock_mhz:", "positive"}},
      {"over 100 %",
       with_model(replace(m, R"("fp16": 50, "fp32": 50 })", R"("fp16": 150, "fp32": 50 })")),
       {"timing.model.mac_efficiency_pct.fp16:", "percentage"}},
      {"I frames cheaper than P",
       with_model(replace(m, R"("intra_pct": 150)", R"("intra_pct": 50)")),
       {"timing.model.intra_pct:", "100 to 1000"}},
      {"no bandwidth",
       with_model(replace(m, R"("dram_mbps": 16000)", R"("dram_mbps": 0)")),
       {"timing.model.dram_mbps:", "positive"}},
      {"unknown parameter",
       with_model(replace(m, R"("op_ns": 2000,)", R"("op_ns": 2000, "warp_speed": 9,)")),
       {"timing.model.warp_speed:", "not a timing parameter"}},
      {"unknown precision",
       with_model(replace(m, R"("fp32": 8 })", R"("fp32": 8, "fp64": 1 })")),
       {"timing.model.vector_lane_elems.fp64:"}},
      {"not an object", with_model("12"), {"timing.model:", "must be an object"}},
      {"negative", with_model(replace(m, R"("op_ns": 2000)", R"("op_ns": -1)")), {"timing.model.op_ns:", "negative"}},
  };
  expect_refused(cases);
}

TEST(SimProfile, ATimingModelWhosePeaksAreNotTheStatedOnesIsRefused) {
  // tiny's array gives 1.0, 0.496 and 0.128 T/s; a board stating 4 TOPS int8
  // is another board.
  const std::string text = replace(with_model(kModel), R"("max_ring_entries": 256,)",
                                   R"("max_ring_entries": 256, "tensor": { "int8_tops": 4 },)");
  const std::string msg = error_of(text);
  EXPECT_NE(msg.find("timing.model.macs_per_lane_cycle.int8"), std::string::npos) << msg;
  EXPECT_NE(msg.find("within 10 %"), std::string::npos) << msg;
  EXPECT_TRUE(error_of(replace(with_model(kModel), R"("max_ring_entries": 256,)",
                               R"("max_ring_entries": 256, "tensor": { "int8_tops": 1 },)"))
                  .empty());
}

TEST(SimProfile, TooManyRegionsIsRejected) {
  std::string regions;
  for (int i = 0; i < 9; ++i) {
    regions += std::string(i ? "," : "") + R"({ "name": "r)" + std::to_string(i) + R"(", "base": ")" +
               std::to_string(i) + R"(MiB", "size": "1MiB", "flags": [)" + (i == 0 ? R"("default")" : "") + "] }";
  }
  std::string text = kValidProfile;
  const auto begin = text.find(R"("regions": [)") + 12;
  const auto end = text.find("]\n  },", begin);
  ASSERT_NE(end, std::string::npos);
  text.replace(begin, end - begin, regions);
  const std::string msg = error_of(text);
  EXPECT_NE(msg.find("memory.regions: must list 1 to 8 regions"), std::string::npos) << msg;
}

using test::ScopedEnv;

class SimProfileFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("tpuhal-profile-test-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_ / "a");
    std::filesystem::create_directories(dir_ / "b");
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::filesystem::path write(const std::string& rel, const std::string& text) {
    const auto path = dir_ / rel;
    std::ofstream(path) << text;
    return path;
  }

  std::filesystem::path dir_;
};

TEST_F(SimProfileFiles, FoundByNameThroughTheSearchPath) {
  write("b/unit-test.json", kValidProfile);
  // Empty and missing directories are skipped; the search goes on.
  ScopedEnv env("TPUHAL_PROFILE_PATH",
                "::" + (dir_ / "missing").string() + ":" + (dir_ / "a").string() + ":" + (dir_ / "b").string());
  const BoardProfile p = load_profile("unit-test");
  EXPECT_EQ(p.name, "unit-test");
  EXPECT_EQ(p.dram_bytes, 32 * kMiB);
}

TEST_F(SimProfileFiles, FirstDirectoryOnThePathWins) {
  write("a/unit-test.json", replace(kValidProfile, R"("board_id": 7)", R"("board_id": 100)"));
  write("b/unit-test.json", kValidProfile);
  ScopedEnv env("TPUHAL_PROFILE_PATH", (dir_ / "a").string() + ":" + (dir_ / "b").string());
  EXPECT_EQ(load_profile("unit-test").board_id, 100u);
}

TEST_F(SimProfileFiles, BuiltinWinsOverTheSearchPath) {
  write("a/tiny.json", replace(kValidProfile, R"("name": "unit-test")", R"("name": "tiny")"));
  ScopedEnv env("TPUHAL_PROFILE_PATH", (dir_ / "a").string());
  EXPECT_EQ(load_profile("tiny").dram_bytes, 64 * kMiB);
}

TEST_F(SimProfileFiles, LoadedByPath) {
  const auto path = write("a/by-path.json", kValidProfile);
  EXPECT_EQ(load_profile(path.string()).name, "unit-test");
}

TEST_F(SimProfileFiles, BrokenFileOnThePathNamesTheFile) {
  const auto path = write("a/broken.json", replace(kValidProfile, R"("pcie")", R"("pci-x")"));
  ScopedEnv env("TPUHAL_PROFILE_PATH", (dir_ / "a").string());
  try {
    (void)load_profile("broken");
    FAIL() << "a broken profile loaded";
  } catch (const ProfileError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(path.string()), std::string::npos) << msg;
    EXPECT_NE(msg.find("bus:"), std::string::npos) << msg;
  }
}

TEST_F(SimProfileFiles, UnreadablePathIsAProfileError) {
  const std::string path = (dir_ / "nope.json").string();
  try {
    (void)load_profile(path);
    FAIL() << "a missing file loaded";
  } catch (const ProfileError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find("cannot read"), std::string::npos) << msg;
  }
}

TEST(SimProfile, UnknownNameListsTheBuiltins) {
  ScopedEnv env("TPUHAL_PROFILE_PATH", "/nonexistent-tpuhal-dir");
  try {
    (void)load_profile("no-such-board");
    FAIL() << "an unknown profile loaded";
  } catch (const ProfileError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("'no-such-board'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("bm1684x"), std::string::npos) << msg;
    EXPECT_NE(msg.find("tiny"), std::string::npos) << msg;
    EXPECT_NE(msg.find("TPUHAL_PROFILE_PATH"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace tpuhal::sim
