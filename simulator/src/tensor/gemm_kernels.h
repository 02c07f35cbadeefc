// Each instruction-set level's GEMM kernels, float and integer (fgemm.h,
// igemm.h). Internal to the simulator; included by the kernels' own files,
// so it declares and includes nothing more.
#pragma once

#include "fgemm.h"
#include "igemm.h"

namespace tpuhal::sim::tensor::gemm {

// One level's kernels, defined by its gemm_<isa>.cpp.
struct Kernels {
  fgemm::Kernels f;
  igemm::Kernels i;
};
// The kernels of `isa` (each level has its own; a level this build has no
// kernels for gets the portable ones).
const Kernels& kernels(Isa isa);

}  // namespace tpuhal::sim::tensor::gemm
