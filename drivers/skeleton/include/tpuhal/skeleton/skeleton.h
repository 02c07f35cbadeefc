// The skeleton driver: a whole driver with nothing behind it.
//
// It implements every object of the driver interface (device, queue,
// buffer, program; hal/include/tpuhal/driver/driver.hpp). Each call does
// what its contract asks of a board that has nothing (no memory, no queues,
// none of the optional capabilities) or refuses with a precise
// Status::Unsupported that says what a port fills in there. It is the
// template for a new driver: copy drivers/skeleton/, rename it, and replace
// one call at a time until the conformance suite is green on the new board
// (drivers/skeleton/README.md).
#pragma once

#include <memory>
#include <string>

#include "tpuhal/driver/driver.hpp"

namespace tpuhal::skeleton {

// A provider for the "skeleton:" scheme, with one device, "skeleton:0". Not
// built into libtpuhal; register it with driver::register_provider() (the
// conformance suite does).
std::shared_ptr<driver::Provider> make_provider();

// The device the provider opens, without the registry (for tests).
std::shared_ptr<driver::DeviceBackend> make_device(std::string uri);

}  // namespace tpuhal::skeleton
