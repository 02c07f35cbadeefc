// tpuhal reset URI: resets a board and checks that it works again.
#include <chrono>
#include <cstdio>

#include "cli.h"

namespace tpuhal::cli {

int cmd_reset(const std::vector<std::string>& args) {
  po::options_description opts("Options");
  opts.add_options()("device,d", po::value<std::string>(), "device URI");
  po::positional_options_description pos;
  pos.add("device", 1);
  po::variables_map vm;
  int rc = 0;
  const char* usage =
      "Usage: tpuhal reset URI\n\nResets the board (after a fault: a DMA error, a hang, a firmware crash, a lost "
      "board), then checks that it runs a command again. Queues claimed before the reset stay failed.";
  if (!parse(args, opts, pos, vm, usage, &rc)) return rc;
  if (!vm.count("device")) {
    std::fprintf(stderr, "tpuhal reset: name the device to reset\n%s\n", usage);
    return 2;
  }
  Device dev = open(vm["device"].as<std::string>());
  const auto start = std::chrono::steady_clock::now();
  dev.reset();
  const auto took = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - start);
  // A fence-only submission round-trips through the board's command processor.
  Queue q = dev.queue(dev.properties().engines.front().engine);
  q.submit().wait(std::chrono::seconds(5));
  std::printf("%s: reset in %lld us; the board runs commands again\n", dev.uri().c_str(),
              static_cast<long long>(took.count()));
  return 0;
}

}  // namespace tpuhal::cli
