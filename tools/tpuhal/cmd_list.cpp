#include <cstdio>
#include <iostream>

#include "cli.h"

namespace tpuhal::cli {

int cmd_list(const std::vector<std::string>& args) {
  po::options_description opts("Options");
  opts.add_options()("json", "print a JSON array of {uri, driver, board, memory_bytes}");
  po::variables_map vm;
  int rc = 0;
  if (!parse(args, opts, {}, vm,
             "Usage: tpuhal list [--json]\n\nLists every device every driver can see, one per line.", &rc))
    return rc;
  const auto devices = enumerate();
  if (vm.count("json")) {
    auto arr = nlohmann::json::array();
    for (auto& d : devices)
      arr.push_back({{"uri", d.uri}, {"driver", d.driver}, {"board", d.board}, {"memory_bytes", d.memory_bytes}});
    std::cout << arr.dump(2) << "\n";
    return 0;
  }
  if (devices.empty()) {
    std::printf("No devices found.\n");
  }
  for (auto& d : devices)
    std::printf("%-10s %-9s %-52s %s\n", d.uri.c_str(), d.driver.c_str(), d.board.c_str(),
                bytes(d.memory_bytes).c_str());
  for (auto& [driver, why] : unavailable_drivers()) std::printf("(%s: %s)\n", driver.c_str(), why.c_str());
  return 0;
}

}  // namespace tpuhal::cli
