// The devices the conformance suite runs on: every device enumerate() finds
// (the simulated boards always, real boards and GPUs where present) plus
// simulated boards of two profiles unlike the default one: "tiny" (a small
// PCIe card) and "edge-soc" (a SoC: unified memory, one queue per engine,
// no video unit). The conformance suite also registers the skeleton driver
// first, so that enumerate() finds its board, "skeleton:0" (a device with
// nothing in it, drivers/skeleton/); the other suites do not.
#pragma once

#include <string>
#include <vector>

#include "tpuhal/tpuhal.hpp"

namespace tpuhal::testing {

// What enumerate() finds, plus the simulated boards above.
inline std::vector<std::string> find_conformance_devices() {
  std::vector<std::string> uris;
  for (auto& d : tpuhal::enumerate()) uris.push_back(d.uri);
  uris.push_back("sim:tiny");
  uris.push_back("sim:edge-soc");
  uris.push_back("usb-sim:tiny");
  return uris;
}

// The same, found once per process: gtest evaluates a suite's parameter
// generator once per TEST_P, and each enumerate() scans the buses
// (libusb's udev scan alone takes milliseconds), which cost every test
// process of a large suite about a second before its test began.
inline const std::vector<std::string>& conformance_devices() {
  static const std::vector<std::string> uris = find_conformance_devices();
  return uris;
}

// gtest parameter names: "sim:0" -> "sim_0".
inline std::string param_name(const std::string& uri) {
  std::string s;
  for (char c : uri) s += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return s;
}

}  // namespace tpuhal::testing
