// tpuhal firmware URI IMAGE: uploads firmware to a board waiting in its
// loader (a USB stick after plug-in) and waits for it to come back.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>

#include "cli.h"

namespace tpuhal::cli {

int cmd_firmware(const std::vector<std::string>& args) {
  po::options_description opts("Options");
  opts.add_options()("device,d", po::value<std::string>(), "the board, as `tpuhal list` names it (usb:1-1)")(
      "image", po::value<std::string>(), "the firmware image file (the board vendor's .tpfw)")(
      "timeout", po::value<double>()->default_value(10.0),
      "seconds to wait for the loader's verdict, and again for the board to come back");
  po::positional_options_description pos;
  pos.add("device", 1).add("image", 1);
  po::variables_map vm;
  int rc = 0;
  const char* usage =
      "Usage: tpuhal firmware URI IMAGE [--timeout S]\n\n"
      "Uploads a firmware image to a board waiting in its loader: `tpuhal list` shows such a board\n"
      "with \"(loader: firmware needed)\", and it opens only once it runs firmware. The image is\n"
      "checked against the board before it is sent (format, checksum, board ID, interface\n"
      "version); then the board re-enumerates, and this waits until it answers as the\n"
      "application. See docs/usb.md.";
  if (!parse(args, opts, pos, vm, usage, &rc)) return rc;
  if (!vm.count("device") || !vm.count("image")) {
    std::fprintf(stderr, "tpuhal firmware: name the board and the image file\n%s\n", usage);
    return 2;
  }
  const double timeout_s = vm["timeout"].as<double>();
  if (!(timeout_s > 0 && timeout_s <= 3600)) {
    std::fprintf(stderr, "tpuhal firmware: --timeout must be between 0 and 3600 seconds\n");
    return 2;
  }
  const std::string uri = vm["device"].as<std::string>(), path = vm["image"].as<std::string>();
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(Status::NotFound, "tpuhal firmware: cannot open the image file '" + path + "'");
  std::vector<char> raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw Error(Status::Internal, "tpuhal firmware: reading '" + path + "' failed");
  const auto start = std::chrono::steady_clock::now();
  upload_firmware(uri, std::as_bytes(std::span(raw)),
                  std::chrono::milliseconds(static_cast<std::int64_t>(timeout_s * 1000)));
  const auto took = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start);
  std::printf("%s: firmware from %s (%zu bytes) accepted; the board came back in %.0f ms\n", uri.c_str(), path.c_str(),
              raw.size(), took.count());
  return 0;
}

}  // namespace tpuhal::cli
