// The skeleton driver: a complete driver that drives nothing.
//
// It implements every call of the driver interface, each failing with a
// precise Status::Unsupported, and is the template for a new driver: copy
// this directory, rename it, and replace one method at a time until the
// conformance suite is green (docs/porting.md).
#pragma once

#include <memory>

#include "tpuhal/driver/driver.hpp"

namespace tpuhal::skeleton {

// A provider for the "skeleton:" scheme. Not built into libtpuhal; register
// it with driver::register_provider() to try it.
std::shared_ptr<driver::Provider> make_provider();

// The device a skeleton provider would open, for tests and as the template.
std::shared_ptr<driver::DeviceBackend> make_device(std::string uri);

}  // namespace tpuhal::skeleton
