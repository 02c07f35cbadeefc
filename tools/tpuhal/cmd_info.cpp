#include <cstdio>
#include <iostream>

#include "cli.h"

namespace tpuhal::cli {

nlohmann::json properties_json(const Properties& p) {
  nlohmann::json heaps = nlohmann::json::array();
  for (auto& h : p.heaps)
    heaps.push_back({{"name", h.name},
                     {"memory", to_string(h.memory)},
                     {"base", h.base},
                     {"size", h.size},
                     {"default", h.is_default}});
  nlohmann::json engines = nlohmann::json::object();
  for (auto& e : p.engines) engines[to_string(e.engine)] = e.queues;
  nlohmann::json dtypes = nlohmann::json::array();
  for (auto d : p.dtypes) dtypes.push_back(to_string(d));
  char pci[16];
  std::snprintf(pci, sizeof pci, "%04x:%04x", p.pci_vendor, p.pci_device);
  return {{"uri", p.uri},
          {"driver", p.driver},
          {"board", p.board},
          {"bus", p.bus},
          {"pci_id", pci},
          {"serial", p.serial},
          {"firmware_version", p.firmware_version},
          {"interface_version", p.interface_version},
          {"memory_bytes", p.memory_bytes},
          {"host_visible_bytes", p.host_visible_bytes},
          {"min_alignment", p.min_alignment},
          {"heaps", heaps},
          {"engines", engines},
          {"tensor_cores", p.tensor_cores},
          {"peak_int8_tops", p.peak_int8_tops},
          {"peak_fp16_tflops", p.peak_fp16_tflops},
          {"peak_fp32_tflops", p.peak_fp32_tflops},
          {"dtypes", dtypes},
          {"tensor_isa", p.tensor_isa},
          {"decode_channels", p.decode_channels},
          {"caps",
           {{"map_device_memory", p.caps.map_device_memory},
            {"host_visible_device_memory", p.caps.host_visible_device_memory},
            {"import_host_memory", p.caps.import_host_memory},
            {"wait_value", p.caps.wait_value},
            {"timestamps", p.caps.timestamps},
            {"tensor", p.caps.tensor},
            {"video_decode", p.caps.video_decode},
            {"telemetry", p.caps.telemetry},
            {"modelled_time", p.caps.modelled_time},
            {"wait_time", p.caps.wait_time}}}};
}

int cmd_info(const std::vector<std::string>& args) {
  po::options_description opts("Options");
  opts.add_options()("device,d", po::value<std::string>(), "device URI (default: the first device)")(
      "json", "print the properties as a JSON object");
  po::positional_options_description pos;
  pos.add("device", 1);
  po::variables_map vm;
  int rc = 0;
  if (!parse(args, opts, pos, vm,
             "Usage: tpuhal info [URI] [--json]\n\nDescribes one device: board, bus, memory and "
             "heaps, engines, compute and video resources, capabilities.",
             &rc))
    return rc;
  Device dev = open(pick_device(vm));
  const Properties& p = dev.properties();
  // What this library speaks to the board (its driver's protocol), beside
  // what the board says it runs.
  std::string protocol;
  const std::string scheme = p.uri.substr(0, p.uri.find(':'));
  for (const auto& [s, text] : tpuhal::protocol_versions())
    if (s == scheme) protocol = text;
  if (vm.count("json")) {
    nlohmann::json j = properties_json(p);
    j["library_version"] = tpuhal::version();
    j["protocol"] = protocol;
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  auto row = [](const char* k, const std::string& v) { std::printf("  %-22s %s\n", k, v.c_str()); };
  std::printf("Device %s\n", p.uri.c_str());
  row("Board", p.board);
  row("Driver", p.driver);
  row("Bus", p.bus);
  char pci[16];
  std::snprintf(pci, sizeof pci, "%04x:%04x", p.pci_vendor, p.pci_device);
  if (p.pci_vendor || p.pci_device) row("PCI ID", pci);  // none on a SoC
  row("Serial", p.serial);
  row("Firmware", p.firmware_version);
  row("Interface", p.interface_version);
  row("Library", std::string("libtpuhal ") + tpuhal::version() + (protocol.empty() ? "" : ", " + protocol));
  row("Memory", bytes(p.memory_bytes) + " (" + bytes(p.host_visible_bytes) + " host-visible)");
  row("Allocation alignment", std::to_string(p.min_alignment) + " bytes");
  std::printf("  Heaps\n");
  for (auto& h : p.heaps) {
    char base[32];
    std::snprintf(base, sizeof base, "0x%llx", static_cast<unsigned long long>(h.base));
    std::printf("    %-20s %-10s %-20s base %s%s\n", h.name.c_str(), bytes(h.size).c_str(), to_string(h.memory), base,
                h.is_default ? "  (default)" : "");
  }
  std::string engines;
  for (auto& e : p.engines)
    engines += (engines.empty() ? "" : ", ") + std::string(to_string(e.engine)) + " x" + std::to_string(e.queues);
  row("Queues", engines);
  char tensor[160];
  std::snprintf(tensor, sizeof tensor, "%u (peak %g int8 TOPS, %g fp16 TFLOPS, %g fp32 TFLOPS)", p.tensor_cores,
                p.peak_int8_tops, p.peak_fp16_tflops, p.peak_fp32_tflops);
  row("Tensor cores", tensor);
  std::string dtypes;
  for (auto d : p.dtypes) dtypes += (dtypes.empty() ? "" : " ") + std::string(to_string(d));
  row("Tensor dtypes", dtypes.empty() ? "none (no tensor engine yet)" : dtypes);
  if (!p.tensor_isa.empty()) row("Tensor engine ISA", p.tensor_isa + " (host CPU; TPUHAL_MAX_ISA caps it)");
  row("Decode channels", std::to_string(p.decode_channels));
  std::string caps;
  auto cap = [&](bool on, const char* name) {
    if (on) caps += (caps.empty() ? "" : " ") + std::string(name);
  };
  cap(p.caps.map_device_memory, "map_device_memory");
  cap(p.caps.host_visible_device_memory, "host_visible_device_memory");
  cap(p.caps.import_host_memory, "import_host_memory");
  cap(p.caps.wait_value, "wait_value");
  cap(p.caps.timestamps, "timestamps");
  cap(p.caps.tensor, "tensor");
  cap(p.caps.video_decode, "video_decode");
  cap(p.caps.telemetry, "telemetry");
  cap(p.caps.modelled_time, "modelled_time");
  cap(p.caps.wait_time, "wait_time");
  row("Capabilities", caps);
  if (p.caps.modelled_time) row("Board clock", "modelled (the board's timing model; docs/timing.md)");
  const WaitPolicy w = dev.wait_policy();
  row("Wait policy", std::string(to_string(w.mode)) + ", spin " + std::to_string(w.spin.count() / 1000) +
                         " us, timeout " + std::to_string(w.timeout.count() / 1'000'000) + " ms");
  return 0;
}

}  // namespace tpuhal::cli
