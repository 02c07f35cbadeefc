// What the benchmark families share: the median of samples, and handing a
// result to the caller.
#pragma once

#include <vector>

#include "tpuhal/bench/bench.h"

namespace tpuhal::bench {

// The median of `v` (the upper middle one of an even count); 0 if empty.
double median(std::vector<double> v);

// Adds `r` to `out` and reports it through `o.on_result`. A zero `r.ratio`
// becomes value / baseline (0 without a baseline).
void emit(std::vector<Result>& out, Result r, const Options& o);

}  // namespace tpuhal::bench
