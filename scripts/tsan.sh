#!/usr/bin/env bash
# ThreadSanitizer over the tests where threads meet (build/tsan/): the
# conformance suite, the driver, thread and validation-layer tests, the
# simulator daemon, the CUDA shim on its stand-in driver, and a short soak,
# plain and traced. Run by scripts/test.sh (CI). Extra arguments go to ctest.
#
#   scripts/tsan.sh [--build-only | --no-build] [CTEST_ARGS...]
#
#   --build-only  configure and build, and run nothing (scripts/test.sh
#                 builds while other tests run)
#   --no-build    run the tests in build/tsan/ as it is
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build="$root/build/tsan"
build_it=1
test_it=1
case ${1:-} in
  --build-only) test_it=0; shift ;;
  --no-build) build_it=0; shift ;;
  -h | --help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
esac

if ((build_it)); then
  "$root/scripts/setup.sh"
  # The flags of scripts/test.sh's sanitizer build (-O1, line tables, unity),
  # no ONNX front end and the tpuhal tool's device commands only: none of
  # these tests compiles a model or decodes video, and the other commands
  # and what they link were a fifth of the rest. clang builds it in a third of GCC's time
  # (TPUHAL_TSAN_CC=gcc TPUHAL_TSAN_CXX=g++ builds it with GCC).
  source "$root/scripts/lib/configure.bash"
  configure_with "${TPUHAL_TSAN_CC:-clang}" "${TPUHAL_TSAN_CXX:-clang++}" "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" \
    -DCMAKE_UNITY_BUILD=ON -DCMAKE_DISABLE_FIND_PACKAGE_ONNX=ON -DTPUHAL_CLI_DEVICE_ONLY=ON -DTPUHAL_SANITIZE=thread -DTPUHAL_WERROR=ON
  # The CUDA shim's tests where the toolkit's headers were found.
  cuda_targets=()
  if grep -q '^build cuda_shim_test:' "$build/build.ninja"; then cuda_targets=(cuda_shim_test tpuhal_fake_cuda cuda_gpu_test); fi
  cmake --build "$build" --target hal_threads tpu_driver hal_conformance sim_board_test tpuhal_cli hal_validation \
    hal_trace hal_telemetry simd_test tpuhal_simd simd_client tpu_usb_test tpu_libusb_link_test "${cuda_targets[@]}"
fi
((test_it)) || exit 0

export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1}
# One tensor-engine thread: its parallel loops are OpenMP regions, and
# OpenMP's runtime is not instrumented, so ThreadSanitizer cannot see
# their synchronisation. Results do not depend on the thread count.
export TPUHAL_SIM_THREADS=1
# The op suite on the CUDA stand-in (Cuda.Ops*) is left out: it needs the
# op tests, which this tree does not build, and its threads are the
# stand-in's streams, which the conformance suite here already runs.
(cd "$build" && ctest --output-on-failure -j "$(nproc)" \
  -R '^(Threads|TpuDriver|Devices/Conformance|Devices/TelemetryTest|SimBoard|Validation|Trace|Simd|Cuda|UsbTransport|UsbSim|UsbLoader|UsbFunction|LibusbLink)' \
  -E '^Cuda\.Ops' "$@")
(($# == 0)) || exit 0
# The soak test (docs/faults.md): every thread, queue and process path at
# once, for 10 s, with a fixed seed so that a failure can be replayed.
TPUHAL_LOG=error "$build/bin/tpuhal" stress --device sim:tiny --seconds 10 --threads 4 --processes 2 --seed 1
# The same traced (docs/tracing.md): every thread and process writing
# events while the trace's writers drain them.
TPUHAL_LOG=error "$build/bin/tpuhal" trace -o "$build/stress-trace.json" -- \
  "$build/bin/tpuhal" stress --device sim:tiny --seconds 5 --threads 4 --processes 2 --seed 2
