// `tpuhal` as a user runs it: exit codes, text, and JSON others parse.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <filesystem>
#include <fstream>
#include <set>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "run_cli.h"
#include "support/trace_check.hpp"
#include "support/interface_version.hpp"
#include "support/temp_path.hpp"

namespace {

using nlohmann::json;
using ::testing::HasSubstr;

using tpuhal::test::Output;
using tpuhal::test::run;

json parse_json(const std::string& s) {
  auto j = json::parse(s, nullptr, false);
  EXPECT_FALSE(j.is_discarded()) << s;
  return j;
}

TEST(Cli, ListPrintsOneLinePerDeviceAndJsonWithTheDocumentedFields) {
  Output text = run("list");
  ASSERT_EQ(text.code, 0) << text.out;
  EXPECT_THAT(text.out, HasSubstr("sim:0"));
  EXPECT_THAT(text.out, HasSubstr("BM1684X"));

  Output j = run("list --json", "TPUHAL_SIM_BOARDS=bm1684x,tiny");
  ASSERT_EQ(j.code, 0) << j.out;
  json arr = parse_json(j.out);
  ASSERT_TRUE(arr.is_array());
  ASSERT_EQ(arr.size(), 2u);
  EXPECT_EQ(arr[0]["uri"], "sim:0");
  EXPECT_EQ(arr[1]["uri"], "sim:1");
  EXPECT_EQ(arr[0]["driver"], "tpu-sim");
  EXPECT_EQ(arr[0]["memory_bytes"], 12ull << 30);
  EXPECT_EQ(arr[1]["memory_bytes"], 64ull << 20);
  EXPECT_TRUE(arr[1]["board"].is_string());
}

TEST(Cli, ListWithNoBoardsSaysSo) {
  Output r = run("list", "TPUHAL_SIM_BOARDS=");
  EXPECT_EQ(r.code, 0);
  EXPECT_THAT(r.out, HasSubstr("No devices found."));
  EXPECT_EQ(parse_json(run("list --json", "TPUHAL_SIM_BOARDS=").out), json::array());
}

// The program, the library it loaded and what each driver speaks, so that a
// user with packages of two releases can tell which is which.
TEST(Cli, VersionNamesTheProgramTheLibraryAndEachDriversProtocol) {
  Output r = run("--version");
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string project = TPUHAL_PROJECT_VERSION;
  EXPECT_THAT(r.out, ::testing::StartsWith("tpuhal " + project + "\nlibtpuhal " + project + "\n"));
  const std::string interface = "firmware interface " + tpuhal::test::interface_version_text();
  EXPECT_THAT(r.out, HasSubstr("  sim:     " + interface + "\n"));
  EXPECT_THAT(r.out, HasSubstr("  pcie:    " + interface + "\n"));
  EXPECT_THAT(r.out, HasSubstr("  simd:    simulator daemon protocol " + std::to_string(TPUHAL_SIMD_PROTOCOL) + ", " +
                               interface + "\n"));
  json j = parse_json(run("info --json sim:tiny").out);
  EXPECT_EQ(j["library_version"], project);
  EXPECT_EQ(j["protocol"], interface);
  EXPECT_THAT(run("info sim:tiny").out, HasSubstr("Library                libtpuhal " + project + ", " + interface));
}

TEST(Cli, InfoDescribesADevice) {
  Output r = run("info sim:tiny");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("Device sim:tiny"));
  EXPECT_THAT(r.out, HasSubstr("64 MiB (16 MiB host-visible)"));
  EXPECT_THAT(r.out, HasSubstr("compute x2, copy x1, video x1"));
  EXPECT_THAT(r.out, HasSubstr("Capabilities"));

  json j = parse_json(run("info --json --device sim:tiny").out);
  EXPECT_EQ(j["uri"], "sim:tiny");
  EXPECT_EQ(j["memory_bytes"], 64ull << 20);
  EXPECT_EQ(j["heaps"].size(), 2u);
  EXPECT_EQ(j["engines"]["compute"], 2);
  EXPECT_EQ(j["caps"]["wait_value"], true);
  EXPECT_EQ(j["interface_version"], tpuhal::test::interface_version_text());
}

TEST(Cli, SmiShowsMemoryAndQueues) {
  Output r = run("smi --queues");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("Memory used / total"));
  EXPECT_THAT(r.out, HasSubstr("/ 12 GiB"));
  EXPECT_THAT(r.out, HasSubstr("compute"));

  json j = parse_json(run("smi --json --device sim:tiny").out);
  ASSERT_EQ(j.size(), 1u);
  EXPECT_EQ(j[0]["uri"], "sim:tiny");
  EXPECT_EQ(j[0]["memory_total"], 64ull << 20);
  EXPECT_EQ(j[0]["queues"].size(), 4u);
  EXPECT_EQ(j[0]["queues"][0]["engine"], "compute");
  // Telemetry (docs/telemetry.md): the sensors, and utilisation over the
  // sampling interval; an idle board in a fresh process is idle.
  EXPECT_EQ(j[0]["telemetry"]["power_limit_w"], 5.0);  // tiny.json
  EXPECT_EQ(j[0]["telemetry"]["clock_mhz"], 500);
  EXPECT_EQ(j[0]["telemetry"]["queues"].size(), 4u);
  EXPECT_EQ(j[0]["telemetry"]["channels"].size(), 2u);
  EXPECT_EQ(j[0]["utilisation"]["compute"], 0.0);
  EXPECT_GE(j[0]["utilisation"]["interval_s"].get<double>(), 0.1);
  EXPECT_THAT(run("smi").out, HasSubstr("Util tensor/DMA/video"));

  // --loop: one JSON line per sample, --count of them.
  Output l = run("smi --device sim:tiny --json --loop 0.02 --count 3");
  ASSERT_EQ(l.code, 0) << l.out;
  std::istringstream lines(l.out);
  int samples = 0;
  for (std::string line; std::getline(lines, line); ++samples) {
    json s = parse_json(line);
    ASSERT_EQ(s.size(), 1u);
    EXPECT_TRUE(s[0]["utilisation"].is_object()) << line;
  }
  EXPECT_EQ(samples, 3);
  Output bad = run("smi --count 2");
  EXPECT_EQ(bad.code, 2);
  EXPECT_THAT(bad.out, HasSubstr("--count needs --loop"));
  bad = run("smi --loop 0");
  EXPECT_EQ(bad.code, 2);
  EXPECT_THAT(bad.out, HasSubstr("--loop takes a period in seconds above 0"));
}

TEST(Cli, BenchPrintsJsonLinesWithFiguresAndBaselines) {
  Output r = run("bench submit --quick --json --device sim:tiny");
  ASSERT_EQ(r.code, 0) << r.out;
  std::istringstream lines(r.out);
  std::string line;
  std::set<std::string> seen;
  while (std::getline(lines, line)) {
    json j = parse_json(line);
    for (const char* key : {"bench", "value", "unit", "baseline", "ratio"})
      EXPECT_TRUE(j.contains(key)) << key << " missing in " << line;
    EXPECT_GT(j["value"].get<double>(), 0) << line;
    EXPECT_GT(j["baseline"].get<double>(), 0) << line;
    seen.insert(j["bench"].get<std::string>());
  }
  EXPECT_TRUE(seen.count("round_trip"));
  EXPECT_TRUE(seen.count("submit_rate"));
}

TEST(Cli, BenchDmaCoversSizesFrom4KiBTo64MiBBothWays) {
  Output r = run("bench dma --quick --json --device sim:0");
  ASSERT_EQ(r.code, 0) << r.out;
  std::istringstream lines(r.out);
  std::string line;
  std::set<std::pair<std::string, std::uint64_t>> seen;
  while (std::getline(lines, line)) {
    json j = parse_json(line);
    EXPECT_EQ(j["bench"], "dma");
    EXPECT_EQ(j["unit"], "GB/s");
    EXPECT_EQ(j["baseline_name"], "memcpy");
    seen.insert({j["direction"].get<std::string>(), j["bytes"].get<std::uint64_t>()});
  }
  EXPECT_EQ(seen.size(), 16u);
  EXPECT_TRUE(seen.count({"h2d", 4096}));
  EXPECT_TRUE(seen.count({"d2h", 64ull << 20}));
}

TEST(Cli, DemoMovesDataAndVerifiesIt) {
  Output r = run("demo --size 1MiB --channels 2");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("OK: 1048576 bytes verified"));
  EXPECT_THAT(r.out, HasSubstr("out of range: copy of 32 bytes"));
  // The video pipeline on two streams: every frame of both came through.
  EXPECT_THAT(r.out, HasSubstr("Video analytics: 2 camera streams"));
  EXPECT_THAT(r.out, HasSubstr("total: 180 frames"));
}

// ---- tracing (docs/tracing.md) ----------------------------------------------------

std::string temp_file(const std::string& name) {
  return (std::filesystem::temp_directory_path() / (name + "-" + std::to_string(::getpid()) + ".json")).string();
}

// TPUHAL_TRACE on the demo: a trace that obeys the format, with the host's
// calls, every command of every queue, and each decoded frame per channel.
TEST(Cli, TpuhalTraceOnTheDemoTracesEveryLayer) {
  const std::string path = temp_file("demo-trace");
  Output r = run("demo --size 1MiB --channels 2", "TPUHAL_TRACE=" + path);
  ASSERT_EQ(r.code, 0) << r.out;
  const auto t = tpuhal::test::read_trace(path);
  ASSERT_FALSE(t.is_discarded());
  EXPECT_THAT(tpuhal::test::check_trace(t), ::testing::IsEmpty());
  EXPECT_EQ(t["otherData"]["dropped_events"], 0);
  EXPECT_EQ(tpuhal::test::events_named(t, "i", "frame").size(), 180u);  // 90 frames on each of 2 channels
  std::set<std::uint64_t> channels;
  for (const auto& e : tpuhal::test::events_named(t, "i", "frame"))
    channels.insert(e["args"]["channel"].get<std::uint64_t>());
  EXPECT_EQ(channels.size(), 2u);
  EXPECT_FALSE(tpuhal::test::events_named(t, "X", "copy").empty());
  EXPECT_FALSE(tpuhal::test::events_named(t, "X", "program").empty());
  EXPECT_FALSE(tpuhal::test::events_named(t, "X", "allocate").empty());
  EXPECT_FALSE(tpuhal::test::events_named(t, "X", "submit").empty());
  std::filesystem::remove(path);
}

// A trace file that cannot be created is a clear message; the program runs.
TEST(Cli, AnUnwritableTraceFileIsNamedAndTheProgramGoesOn) {
  Output r = run("list", "TPUHAL_TRACE=/nonexistent-directory/t.json");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("TPUHAL_TRACE: trace: cannot create /nonexistent-directory/t.json: No such file"));
  EXPECT_THAT(r.out, HasSubstr("running without a trace"));
  EXPECT_THAT(r.out, HasSubstr("sim:0"));
}

// `tpuhal trace`: the command and the processes it starts, in one file.
TEST(Cli, TraceMergesEveryProcessOfTheCommand) {
  const std::string path = temp_file("stress-trace");
  Output r = run("trace -o " + path + " -- " + TPUHAL_CLI +
                 " stress --device sim:tiny --seconds 1 --threads 2 --processes 2 --seed 3");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("process(es)"));
  const auto t = tpuhal::test::read_trace(path);
  ASSERT_FALSE(t.is_discarded());
  EXPECT_THAT(tpuhal::test::check_trace(t), ::testing::IsEmpty());
  EXPECT_GE(t["otherData"]["processes"].size(), 3u);  // stress and its two workers
  std::set<std::int64_t> pids;
  for (const auto& e : tpuhal::test::events_named(t, "X", "submit")) pids.insert(e["pid"].get<std::int64_t>());
  EXPECT_GE(pids.size(), 2u);
  std::filesystem::remove(path);
}

// Outputs in a directory others may write to (fs.protected_symlinks=0): a
// link planted at the output's name, and at the old predictable NAME.tmp,
// points at a victim's file. The command replaces the link with a file of
// its own and never writes through it.
struct PlantedLinks {
  std::filesystem::path dir, victim, out;
  explicit PlantedLinks(const std::string& name) {
    std::string tmpl = (std::filesystem::temp_directory_path() / "tpuhal-planted-XXXXXX").string();
    dir = ::mkdtemp(tmpl.data());
    victim = dir / "victim";
    out = dir / name;
    std::ofstream(victim) << "precious";
    std::filesystem::create_symlink(victim, out);
    std::filesystem::create_symlink(victim, dir / (name + ".tmp"));
  }
  ~PlantedLinks() { std::filesystem::remove_all(dir); }
  // The victim as it was, the output a file of its own, nothing else left.
  void expect_victim_untouched() const {
    std::ifstream in(victim);
    std::stringstream ss;
    ss << in.rdbuf();
    EXPECT_EQ(ss.str(), "precious");
    EXPECT_FALSE(std::filesystem::is_symlink(out));
    EXPECT_TRUE(std::filesystem::is_regular_file(out));
    std::set<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(dir)) names.insert(e.path().filename().string());
    const std::string name = out.filename().string();
    EXPECT_EQ(names, (std::set<std::string>{name, name + ".tmp", "victim"}));
  }
};

TEST(Cli, GivenALinkAtTheTraceOutputWhenTracingThenTheLinkedFileIsUntouched) {
  PlantedLinks merged("merged.json");
  Output r = run("trace -o " + merged.out.string() + " -- " + TPUHAL_CLI + " list");
  ASSERT_EQ(r.code, 0) << r.out;
  merged.expect_victim_untouched();
  auto t = tpuhal::test::read_trace(merged.out.string());
  ASSERT_FALSE(t.is_discarded());
  EXPECT_THAT(tpuhal::test::check_trace(t), ::testing::IsEmpty());
  EXPECT_EQ(t["otherData"]["processes"].size(), 1u);

  // TPUHAL_TRACE, written as the program runs.
  PlantedLinks env("env.json");
  r = run("list", "TPUHAL_TRACE=" + env.out.string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, ::testing::Not(HasSubstr("TPUHAL_TRACE")));
  env.expect_victim_untouched();
  t = tpuhal::test::read_trace(env.out.string());
  ASSERT_FALSE(t.is_discarded());
  EXPECT_THAT(tpuhal::test::check_trace(t), ::testing::IsEmpty());
}

TEST(Cli, TraceSaysWhatIsWrongAndPassesTheExitStatusOn) {
  Output no_output = run("trace -- true");
  EXPECT_EQ(no_output.code, 2);
  EXPECT_THAT(no_output.out, HasSubstr("-o FILE is required"));
  Output no_command = run("trace -o /tmp/x.json");
  EXPECT_EQ(no_command.code, 2);
  EXPECT_THAT(no_command.out, HasSubstr("no command to run"));
  Output bad_dir = run("trace -o /nonexistent-directory/t.json -- true");
  EXPECT_EQ(bad_dir.code, 1);
  EXPECT_THAT(bad_dir.out, HasSubstr("cannot create /nonexistent-directory/t.json"));
  const std::string path = temp_file("status-trace");
  Output missing = run("trace -o " + path + " -- /nonexistent-program");
  EXPECT_EQ(missing.code, 127);
  EXPECT_THAT(missing.out, HasSubstr("cannot run /nonexistent-program"));
  Output failing = run("trace -o " + path + " -- sh -c 'exit 3'");
  EXPECT_EQ(failing.code, 3);
  EXPECT_THAT(failing.out, HasSubstr("wrote no trace"));
  std::filesystem::remove(path);
}

TEST(Cli, EveryCommandHasHelp) {
  for (const char* cmd : {"list", "info", "smi", "exporter", "cdi", "bench", "demo", "firmware", "reset", "trace"}) {
    Output r = run(std::string(cmd) + " --help");
    EXPECT_EQ(r.code, 0) << cmd;
    EXPECT_THAT(r.out, HasSubstr(std::string("Usage: tpuhal ") + cmd)) << cmd;
  }
  Output top = run("--help");
  EXPECT_EQ(top.code, 0);
  EXPECT_THAT(top.out, HasSubstr("Commands:"));
}

TEST(Cli, MistakesGiveAClearMessageAndExitCode) {
  Output unknown = run("frobnicate");
  EXPECT_EQ(unknown.code, 2);
  EXPECT_THAT(unknown.out, HasSubstr("unknown command 'frobnicate'"));
  Output bad_opt = run("list --bogus");
  EXPECT_EQ(bad_opt.code, 2);
  Output missing = run("info sim:99");
  EXPECT_EQ(missing.code, 1);
  EXPECT_THAT(missing.out, HasSubstr("error (not found)"));
  Output bad_bench = run("bench frob");
  EXPECT_EQ(bad_bench.code, 2);
  Output bad_size = run("demo --size 12345");
  EXPECT_EQ(bad_size.code, 2);
  EXPECT_THAT(bad_size.out, HasSubstr("multiple of 4 KiB"));
}

// `tpuhal firmware` on what cannot take it: each mistake names itself.
// (The upload itself runs against a USB board in the QEMU guest test.)
TEST(Cli, FirmwareUploadRefusesWhatCannotTakeIt) {
  Output no_image = run("firmware usb:1-1");
  EXPECT_EQ(no_image.code, 2);
  EXPECT_THAT(no_image.out, HasSubstr("name the board and the image file"));
  Output missing_file = run("firmware usb:1-1 /nonexistent/board.tpfw");
  EXPECT_EQ(missing_file.code, 1);
  EXPECT_THAT(missing_file.out, HasSubstr("cannot open the image file '/nonexistent/board.tpfw'"));
  // A simulated board boots its own firmware.
  const std::string image = tpuhal::test::temp_path("cli_firmware.tpfw");
  { std::ofstream(image) << "not an image"; }
  Output sim = run("firmware sim:0 " + image);
  EXPECT_EQ(sim.code, 1);
  EXPECT_THAT(sim.out, HasSubstr("take no firmware from the host"));
  // Not an image: refused before anything is sent.
  Output not_image = run("firmware usb:1-1 " + image);
  EXPECT_EQ(not_image.code, 1);
  EXPECT_THAT(not_image.out, HasSubstr("error (invalid argument): usb:1-1: "));
  Output bad_uri = run("firmware usb:nowhere " + image);
  EXPECT_EQ(bad_uri.code, 1);
  EXPECT_THAT(bad_uri.out, HasSubstr("names no USB port"));
  Output bad_timeout = run("firmware usb:1-1 " + image + " --timeout 0");
  EXPECT_EQ(bad_timeout.code, 2);
  std::remove(image.c_str());
}

// The pcie provider on this machine's real PCI bus: a function named in
// TPUHAL_PCIE_IDS is listed with what libpci and sysfs say about it.
TEST(Cli, ListShowsPciFunctionsNamedInTpuhalPcieIds) {
  std::string bdf, vendor, device;
  std::error_code ec;
  for (auto& e : std::filesystem::directory_iterator("/sys/bus/pci/devices", ec)) {
    std::ifstream v(e.path() / "vendor"), d(e.path() / "device");
    if (v >> vendor && d >> device) {
      bdf = e.path().filename().string();
      break;
    }
  }
  if (bdf.empty()) GTEST_SKIP() << "this machine shows no PCI functions in /sys/bus/pci/devices";
  const std::string id = vendor.substr(2) + ":" + device.substr(2);  // "0x8086" -> "8086"
  Output j = run("list --json", "TPUHAL_SIM_BOARDS= TPUHAL_PCIE_IDS=" + id);
  ASSERT_EQ(j.code, 0) << j.out;
  bool found = false;
  for (auto& d : parse_json(j.out)) {
    if (d["uri"] != "pcie:" + bdf) continue;
    found = true;
    EXPECT_EQ(d["driver"], "tpu-pcie");
    EXPECT_THAT(d["board"].get<std::string>(), HasSubstr(bdf + " " + id + " class "));
    EXPECT_THAT(d["board"].get<std::string>(), HasSubstr(" NUMA "));
  }
  EXPECT_TRUE(found) << j.out;

  Output bad = run("info pcie:zz");
  EXPECT_NE(bad.code, 0);
  EXPECT_THAT(bad.out, HasSubstr("'pcie:zz' names no PCI address"));
  Output ids = run("list", "TPUHAL_PCIE_IDS=zz");
  EXPECT_EQ(ids.code, 0) << ids.out;  // the other drivers still list their devices
  EXPECT_THAT(ids.out, HasSubstr("sim:0"));
  EXPECT_THAT(ids.out, HasSubstr("(pcie: TPUHAL_PCIE_IDS: 'zz' is not a vendor:device pair"));
}

}  // namespace
