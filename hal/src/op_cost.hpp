// The one count of an op's cost (tpuhal::OpCost), for Op::cost() and the
// trace's op events.
#pragma once

#include "tpuhal/driver/op_desc.hpp"
#include "tpuhal/ops.hpp"

namespace tpuhal::detail {

OpCost op_cost(const driver::OpDesc& op);

}  // namespace tpuhal::detail
