// tpuhal: list, inspect, benchmark and demonstrate accelerator devices.
#include <cstdio>
#include <cstring>
#include <iostream>

#include "cli.h"
#include "tpuhal/base/units.h"

namespace tpuhal::cli {

#if defined(TPUHAL_CLI_DEVICE_ONLY)
// A build with the device commands only (-DTPUHAL_CLI_DEVICE_ONLY=ON, as
// scripts/tsan.sh builds it): the others name what left them out.
namespace {
int left_out(const char* name) {
  std::fprintf(stderr,
               "tpuhal %s: this build of tpuhal has its device commands only (configured with "
               "-DTPUHAL_CLI_DEVICE_ONLY=ON); configure without it for this command\n",
               name);
  return 1;
}
}  // namespace
int cmd_demo(const std::vector<std::string>&) { return left_out("demo"); }
int cmd_decode(const std::vector<std::string>&) { return left_out("decode"); }
int cmd_compile(const std::vector<std::string>&) { return left_out("compile"); }
int cmd_model_info(const std::vector<std::string>&) { return left_out("model-info"); }
int cmd_profile(const std::vector<std::string>&) { return left_out("profile"); }
int cmd_plan(const std::vector<std::string>&) { return left_out("plan"); }
int cmd_cdi(const std::vector<std::string>&) { return left_out("cdi"); }
int cmd_exporter(const std::vector<std::string>&) { return left_out("exporter"); }
#elif !defined(TPUHAL_HAVE_PROMETHEUS)
int cmd_exporter(const std::vector<std::string>&) {
  std::fprintf(stderr,
               "tpuhal exporter: this build has no Prometheus support; install prometheus-cpp-dev "
               "(scripts/setup.sh does) and build again\n");
  return 1;
}
#endif

namespace {

struct Entry {
  const char* name;
  Command run;
  const char* summary;
};

const Entry kCommands[] = {
    {"list", cmd_list, "one line per device (--json for a JSON array)"},
    {"info", cmd_info, "everything about one device: board, memory, engines, capabilities"},
    {"smi", cmd_smi, "temperature, power, utilisation, memory and processes of each device, like nvidia-smi"},
    {"exporter", cmd_exporter, "serve every board's telemetry as Prometheus metrics (/metrics)"},
    {"cdi", cmd_cdi, "`cdi generate`: a Container Device Interface spec handing boards to containers"},
    {"bench", cmd_bench, "DMA bandwidth and command latency beside this machine's limits"},
    {"demo", cmd_demo, "move data through a device's DMA engine and queues and verify it"},
    {"firmware", cmd_firmware, "upload firmware to a board waiting in its loader (a USB stick)"},
    {"reset", cmd_reset, "reset a board after a fault and check that it works again"},
    {"stress", cmd_stress, "soak a device: threads and processes of random work, every byte checked"},
    {"decode", cmd_decode, "decode a video or JPEG file on a board's video decoder (--md5 per frame)"},
    {"compile", cmd_compile, "compile an ONNX model for the board in fp32, fp16, bf16 or calibrated int8"},
    {"model-info", cmd_model_info, "check a compiled model and print its inputs, outputs, precision, report"},
    {"profile", cmd_profile, "time a compiled model per layer on the board's clock"},
    {"plan", cmd_plan, "how many camera streams one board serves with a model (the board's timing model)"},
    {"trace", cmd_trace, "run a program with tracing on and write a Chrome trace (-o FILE -- CMD ...)"},
    {"sim", cmd_sim, "`sim serve --socket PATH`: serve simulated boards to other processes (simd:PATH#N)"},
};

void usage(std::FILE* out) {
  std::fprintf(out,
               "Usage: tpuhal COMMAND [OPTIONS]\n\n"
               "tpuhal %s: a hardware abstraction layer for AI accelerator boards.\n\n"
               "Commands:\n",
               tpuhal::version());
  for (auto& c : kCommands) std::fprintf(out, "  %-10s %s\n", c.name, c.summary);
  std::fprintf(out,
               "\n'tpuhal COMMAND --help' describes a command's options.\n\n"
               "Devices are named by URI: sim:0 is the first simulated board (TPUHAL_SIM_BOARDS\n"
               "lists their profiles), sim:PROFILE a simulated board of a profile (sim:tiny),\n"
               "simd:PATH#N board N of the simulator daemon on socket PATH (tpuhal sim serve),\n"
               "pcie:DDDD:BB:DD.F a board on PCIe, usb:BUS-PORT a board on USB (usb:1-1),\n"
               "usb-sim:PROFILE a simulated board behind an in-process USB cable.\n"
               "Environment: TPUHAL_LOG=debug|info|warn (or e.g. warn,sim=trace), TPUHAL_WAIT,\n"
               "TPUHAL_TIMEOUT, TPUHAL_SIM_BOARDS, TPUHAL_PROFILE_PATH, TPUHAL_SIMD, TPUHAL_USB_IDS,\n"
               "TPUHAL_TRACE=FILE (a Chrome trace of the whole program; docs/tracing.md)\n"
               "(see docs/).\n");
}

}  // namespace

bool parse(const std::vector<std::string>& args, const po::options_description& opts,
           const po::positional_options_description& pos, po::variables_map& vm, const std::string& usage_line,
           int* exit_code) {
  return parse(args, opts, po::options_description(), pos, vm, usage_line, exit_code);
}

bool parse(const std::vector<std::string>& args, const po::options_description& opts,
           const po::options_description& hidden, const po::positional_options_description& pos, po::variables_map& vm,
           const std::string& usage_line, int* exit_code) {
  po::options_description all(opts);
  all.add_options()("help,h", "show this help");
  po::options_description accepted(all);
  accepted.add(hidden);
  try {
    po::store(po::command_line_parser(args).options(accepted).positional(pos).run(), vm);
    if (vm.count("help")) {
      std::cout << usage_line << "\n\n" << all << "\n";
      *exit_code = 0;
      return false;
    }
    po::notify(vm);
  } catch (const po::error& e) {
    std::cerr << "tpuhal: " << e.what() << "\n" << usage_line << "\n";
    *exit_code = 2;
    return false;
  }
  return true;
}

std::string pick_device(const po::variables_map& vm) {
  if (vm.count("device")) return vm["device"].as<std::string>();
  auto all = enumerate();
  if (all.empty()) {
    std::string why = "no devices found";
    for (auto& [driver, reason] : unavailable_drivers()) why += "; " + driver + ": " + reason;
    throw Error(Status::NotFound, why + " (name one with --device, e.g. --device sim:tiny)");
  }
  return all.front().uri;
}

std::string bytes(std::uint64_t n) { return base::format_bytes(n); }

}  // namespace tpuhal::cli

int main(int argc, char** argv) {
  using namespace tpuhal::cli;
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  const std::string name = argv[1];
  if (name == "--help" || name == "-h" || name == "help") {
    usage(stdout);
    return 0;
  }
  if (name == "--version" || name == "version") {
    // This program's version, the library it loaded (libtpuhal0 and
    // tpuhal-tools may be upgraded apart) and what its drivers speak.
    std::printf("tpuhal %s\nlibtpuhal %s\n", TPUHAL_VERSION_STRING, tpuhal::version());
    for (const auto& [scheme, protocol] : tpuhal::protocol_versions())
      std::printf("  %-8s %s\n", (scheme + ":").c_str(), protocol.c_str());
    return 0;
  }
  std::vector<std::string> args(argv + 2, argv + argc);
  for (auto& c : kCommands) {
    if (name != c.name) continue;
    try {
      return c.run(args);
    } catch (const tpuhal::Error& e) {
      std::fprintf(stderr, "tpuhal %s: error (%s): %s\n", c.name, tpuhal::to_string(e.status()), e.what());
      return 1;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "tpuhal %s: error: %s\n", c.name, e.what());
      return 1;
    }
  }
  std::fprintf(stderr, "tpuhal: unknown command '%s'\n\n", name.c_str());
  usage(stderr);
  return 2;
}
