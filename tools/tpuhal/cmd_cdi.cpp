// tpuhal cdi generate: a Container Device Interface spec for the boards of
// this host (docs/operations.md).
#include <cctype>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <system_error>

#include "cli.h"
#include "host_devices.h"
#include "tpuhal/base/output_file.h"

namespace tpuhal::cli {

int cmd_cdi(const std::vector<std::string>& args) {
  po::options_description opts("Options");
  opts.add_options()("output,o", po::value<std::string>(), "write the spec to FILE (default: standard output)")(
      "kind", po::value<std::string>()->default_value("tpuhal.dev/board"), "the spec's kind, VENDOR/CLASS")(
      "device,d", po::value<std::vector<std::string>>(), "only these boards (repeat; default: every board)");
  po::options_description hidden;
  hidden.add_options()("action", po::value<std::string>());
  po::positional_options_description pos;
  pos.add("action", 1);
  po::variables_map vm;
  int rc = 0;
  if (!parse(args, opts, hidden, pos, vm,
             "Usage: tpuhal cdi generate [--output FILE] [--kind VENDOR/CLASS] [--device URI]...\n\n"
             "Writes a Container Device Interface spec (cdiVersion 0.5.0, JSON) with one device per\n"
             "board, numbered 0, 1, ... in `tpuhal list`'s order, and 'all': the VFIO device\n"
             "nodes of a PCIe board, the USB device node of a USB board, the daemon's socket for a\n"
             "board the simulator daemon shares, and TPUHAL_VISIBLE_DEVICE_<NAME>, which makes\n"
             "`tpuhal list` in the container show exactly the boards it was given. Put the file in\n"
             "/etc/cdi or /var/run/cdi; then `podman run --device tpuhal.dev/board=0 ...`. FILE is\n"
             "written whole under a new name beside it and renamed over it: a runtime never reads\n"
             "half a spec, and a link at FILE is replaced, never followed.\n"
             "Boards that cannot go into a container (simulated in-process boards, CUDA devices,\n"
             "PCIe boards not bound to vfio-pci) are left out with a note on standard error.",
             &rc))
    return rc;
  if (!vm.count("action") || vm["action"].as<std::string>() != "generate") {
    std::fprintf(stderr, "tpuhal cdi: the action is 'generate' (tpuhal cdi generate --help)\n");
    return 2;
  }
  const std::string kind = vm["kind"].as<std::string>();
  const auto slash = kind.find('/');
  auto valid = [](const std::string& s, const char* extra) {
    if (s.empty() || !std::isalnum(static_cast<unsigned char>(s.front())) ||
        !std::isalnum(static_cast<unsigned char>(s.back())))
      return false;
    for (char c : s)
      if (!std::isalnum(static_cast<unsigned char>(c)) && !std::strchr(extra, c)) return false;
    return true;
  };
  if (slash == std::string::npos || !valid(kind.substr(0, slash), "-.") || !valid(kind.substr(slash + 1), "-_.")) {
    std::fprintf(stderr,
                 "tpuhal cdi: --kind '%s' is not VENDOR/CLASS (vendor a domain such as tpuhal.dev, class "
                 "letters, digits, '-', '_', '.')\n",
                 kind.c_str());
    return 2;
  }
  std::vector<std::string> uris;
  if (vm.count("device")) {
    uris = vm["device"].as<std::vector<std::string>>();
  } else {
    for (auto& d : enumerate()) uris.push_back(d.uri);
  }
  std::vector<fleet::HostDevice> devices;
  std::size_t next = 0;  // devices are numbered among those that go into containers
  for (const std::string& uri : uris) {
    devices.push_back(fleet::host_device(uri, std::to_string(next)));
    if (devices.back().skipped.empty())
      ++next;
    else
      std::fprintf(stderr, "tpuhal cdi: left out %s: %s\n", uri.c_str(), devices.back().skipped.c_str());
  }
  const std::string text = fleet::cdi_spec(devices, kind).dump(2) + "\n";
  if (!vm.count("output")) {
    std::cout << text;
    return 0;
  }
  // Whole or not at all, and never through a link someone planted at the
  // name in a shared directory: a new file beside it, renamed over it.
  const std::string path = vm["output"].as<std::string>();
  try {
    base::OutputFile out(path);
    out.write(text);
    out.commit();
  } catch (const std::system_error& e) {
    std::fprintf(stderr, "tpuhal cdi: %s\n", e.what());
    return 1;
  }
  return 0;
}

}  // namespace tpuhal::cli
