#!/usr/bin/env bash
# Every check of the CUDA shim that needs a real GPU, on programs built
# elsewhere (it builds nothing): the conformance suite on cuda:0, the
# shim's GPU-only tests, the op suite on cuda:0 (with cuBLAS, and again on
# the shim's own kernels alone), a traced run whose board clock the trace
# aligns, the soak, the benchmarks beside the raw driver and raw cuBLAS
# (with and without the clock kernels), and compute-sanitizer's memcheck
# over the conformance suite and part of the op suite where the toolkit has
# it. Each step's output goes to OUT/NAME.log; a summary line per step to
# stdout. Exits 1 if any step failed.
#
#   scripts/gpu-checks.sh BUNDLE OUT [STEP...]
#
#   BUNDLE  a folder made by gpu-bundle from tpuhal, hal_conformance,
#           cuda_gpu_test and ops_test of a release build with tests
#           (docs/cuda.md, Testing)
#   OUT     where the logs and the trace go
#   STEP    run only these steps (names as printed); default: all
#
# cuBLAS is the machine's own: the first libcublas.so.13 (or .12) found
# under /usr/local and /opt goes on the library path. With
# TPUHAL_GPU_MODELS=DIR, each compiled model DIR/*.tpm is also profiled on
# cuda:0 (step "model_NAME").
#
# No step may take more than its timeout.
set -uo pipefail
if [[ $# -lt 2 || ${1:-} == -h || ${1:-} == --help ]]; then
  sed -n '2,/^set -uo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
  exit 2
fi
bundle=$(cd "$1" && pwd)
out=$2
shift 2
only=" $* "
mkdir -p "$out"
export LD_LIBRARY_PATH="$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
cublas=$(find /usr/local /opt -name 'libcublas.so.1[23]' 2>/dev/null | head -n 1 || true)
[[ -n $cublas ]] && LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$(dirname "$cublas")"
echo "cuBLAS: ${cublas:-none found}"
export TPUHAL_LOG=${TPUHAL_LOG:-warn}
bin=$bundle/bin
failed=0
step() {  # step NAME TIMEOUT COMMAND...
  local name=$1 limit=$2 start=$SECONDS st=0
  shift 2
  [[ $only == "  " || $only == *" $name "* ]] || return 0
  timeout "$limit" "$@" >"$out/$name.log" 2>&1 || st=$?
  printf '%-28s %s (%d s)\n' "$name" "$( ((st == 0)) && echo ok || echo "FAILED ($st)")" $((SECONDS - start))
  ((st == 0)) || { failed=1; tail -n 30 "$out/$name.log"; }
}

nvidia-smi -L >"$out/gpu.txt" 2>&1 || true
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >>"$out/gpu.txt" 2>&1 || true
head -n 3 "$out/gpu.txt"
step info 30 "$bin/tpuhal" info cuda:0
step conformance 180 "$bin/hal_conformance" --gtest_filter='*/cuda_0'
step gpu_test 180 "$bin/cuda_gpu_test"
step ops 300 "$bin/ops_test" --gtest_filter='*/cuda_0'
step ops_own_kernels 300 env TPUHAL_CUDA_BLAS=0 "$bin/ops_test" --gtest_filter='*MatMul*/cuda_0:*Program*/cuda_0'
step bench_gemm 240 "$bin/tpuhal" bench gemm --device cuda:0
for model in "${TPUHAL_GPU_MODELS:-/nonexistent}"/*.tpm; do
  [[ -f $model ]] || continue
  name=$(basename "$model" .tpm)
  step "model_$name" 120 "$bin/tpuhal" profile "$model" --device cuda:0 -n 20
done
step trace 60 "$bin/tpuhal" trace -o "$out/trace.json" -- "$bin/tpuhal" bench dma --device cuda:0 --quick
step stress 60 "$bin/tpuhal" stress --device cuda:0 --seconds 10 --threads 2 --processes 2 --seed 11
step bench_submit 60 "$bin/tpuhal" bench submit --device cuda:0
step bench_submit_no_clock 60 env TPUHAL_CUDA_TIMESTAMPS=0 "$bin/tpuhal" bench submit --device cuda:0
step bench_dma 90 "$bin/tpuhal" bench dma --device cuda:0
sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
if [[ -n $sanitizer ]]; then
  # The exhaustion test allocates the whole GPU, which the tool's own
  # allocations make fail another way.
  step memcheck 240 "$sanitizer" --tool memcheck --error-exitcode 1 "$bin/hal_conformance" \
    --gtest_filter='*/cuda_0:-*Exhaust*:*OutOfMemory*'
  step memcheck_ops 240 "$sanitizer" --tool memcheck --error-exitcode 1 "$bin/ops_test" \
    --gtest_filter='*/cuda_0:-*ResNetLayer*:*IsExactWhereSomeSums*:*AccumulatesInInt32Wrapping*'
else
  echo "memcheck                     skipped (no compute-sanitizer)"
fi
exit "$failed"
