// Each instruction-set level's GEMM kernels (gemm_kernels.h).
#include "gemm_kernels.h"

namespace tpuhal::sim::tensor {

#if defined(__x86_64__)
namespace gemm_sse2 {
extern const gemm::Kernels kKernels;
}
namespace gemm_sse41 {
extern const gemm::Kernels kKernels;
}
namespace gemm_avx2 {
extern const gemm::Kernels kKernels;
}
namespace gemm_avx512 {
extern const gemm::Kernels kKernels;
}
#elif defined(__aarch64__)
namespace gemm_neon {
extern const gemm::Kernels kKernels;
}
#endif
namespace gemm_generic {
extern const gemm::Kernels kKernels;
}

const gemm::Kernels& gemm::kernels(Isa isa) {
  switch (isa) {
#if defined(__x86_64__)
    case Isa::kSse2: return gemm_sse2::kKernels;
    case Isa::kSse41: return gemm_sse41::kKernels;
    case Isa::kAvx2: return gemm_avx2::kKernels;
    case Isa::kAvx512:
    case Isa::kAvx512Vnni: return gemm_avx512::kKernels;
#elif defined(__aarch64__)
    case Isa::kNeon: return gemm_neon::kKernels;
#endif
    default: return gemm_generic::kKernels;
  }
}

const fgemm::Kernels& fgemm::kernels(Isa isa) { return gemm::kernels(isa).f; }
const igemm::Kernels& igemm::kernels(Isa isa) { return gemm::kernels(isa).i; }

}  // namespace tpuhal::sim::tensor
