#!/usr/bin/env bash
# Builds tpuhal with AddressSanitizer and UndefinedBehaviorSanitizer (into
# build/sanitize/) and runs every test. Extra arguments go to ctest
# (e.g. -R Conformance).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build="$root/build/sanitize"
# How long each step took, and the CPU time it took (scripts/lib/cpu.bash),
# for the CI log (CI's whole run must stay under 40 minutes): the time of
# the processes that ended in it, so the sanitizer build's includes the
# install of the tests' packages beside it, which says its own.
source "$root/scripts/lib/cpu.bash"
step_prefix="tpuhal test"
step_start
arm64() { [[ -z ${TPUHAL_SKIP_ARM64:-} && $(uname -m) == x86_64 ]]; }
# What the build needs, first; what only the tests need (the model zoo's
# PyTorch, QEMU, podman, Prometheus, GStreamer's plugins, and for the arm64
# step its cross compiler and libraries) installs while the build runs: on
# a fresh machine that is minutes of downloading the build no longer waits
# for. The tests wait for it.
"$root/scripts/setup.sh" --build
took "installing what the build needs"
mkdir -p "$root/build"
installing_log="$root/build/setup-tests.log"
# The background jobs' statuses go to files, written as they exit:
# `wait PID` loses a status once the PID is reused after the job ended
# (pid_max is 32768 on these machines, and a CI run starts more processes
# than that), and then says "not a child of this shell".
installing_status="$root/build/setup-tests.status"
rm -f "$installing_status"
(
  trap 'echo $? >"$installing_status"' EXIT
  s=$SECONDS
  "$root/scripts/setup.sh" --test
  if (($# == 0)) && arm64; then "$root/scripts/arm64.sh" --install-only; fi
  cpu_since 0 0
  echo "tpuhal test: installing what the tests need took $((SECONDS - s)) s (CPU: $REPLY), beside the build"
) >"$installing_log" 2>&1 &
installing=$!
# A failed configure or build leaves the install to finish, not to be cut
# off halfway through dpkg, and says if it failed.
# The status of a background job that wrote it to FILE as it exited.
# (A job another shell started is not this one's child: then it polls
# until the file is there or the job is gone.)
job_status() {
  wait "$1" 2>/dev/null || true
  while [[ ! -f $2 ]] && kill -0 "$1" 2>/dev/null; do sleep 1; done
  cat "$2" 2>/dev/null || echo 1
}
trap 'if [[ -n ${installing:-} ]] && [[ $(job_status "$installing" "$installing_status") != 0 ]]; then
  echo "tpuhal test: installing what the tests need failed (log: $installing_log)" >&2; fi' EXIT
# Waits for that install; fails with its log if it failed.
installed() {
  local st
  st=$(job_status "$installing" "$installing_status")
  installing=
  if ((st)); then
    echo "tpuhal test: installing what the tests need failed:" >&2
    cat "$installing_log" >&2
    exit 1
  fi
  tail -n 1 "$installing_log" >&2
}
# -O1 with line tables only (-g1): what the sanitizers need for exact
# reports and call sites, and about half the compile time of -O2 -g.
san_flags=(-DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG"
  "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG")
# A unity build (CMake batches each library's files into a few units), so
# that the headers every file includes are compiled once per batch rather
# than once per file. (The other trees CI builds are unity builds too, so a
# file that does not include what it uses can pass CI where a batch-mate
# includes it; the demo's release build, file by file, finds it.)
# clang: with the sanitizers it compiles this tree in about 60 % of GCC's
# time (and its ThreadSanitizer tree in a third). GCC builds the arm64 tree,
# also with -Werror, so CI meets both compilers' warnings.
# (TPUHAL_SANITIZE_CXX=g++ TPUHAL_SANITIZE_CC=gcc builds this tree with GCC.)
# With clang the tree also builds the libFuzzer targets (the layers they
# reach get libFuzzer's coverage instrumentation, the tensor kernels
# excepted: fuzz/CMakeLists.txt), so that CI's fuzzing needs no tree of its
# own; it cost a third as much CPU time as this build did.
san_cxx=${TPUHAL_SANITIZE_CXX:-clang++}
fuzz_here=OFF
[[ ${san_cxx##*/} == clang++* ]] && fuzz_here=ON
source "$root/scripts/lib/configure.bash"
configure_with "${TPUHAL_SANITIZE_CC:-clang}" "$san_cxx" "$build" "${san_flags[@]}" \
  -DCMAKE_UNITY_BUILD=ON -DTPUHAL_SANITIZE=address,undefined -DTPUHAL_WERROR=ON -DTPUHAL_FUZZ=$fuzz_here \
  -DTPUHAL_BUILD_TESTS=ON -DCMAKE_DISABLE_FIND_PACKAGE_ONNX=OFF
cmake --build "$build"
took "the sanitizer build"
# The trees built after this one (ThreadSanitizer's, the packages') take its
# CUDA kernels rather than run nvcc again (configure_with passes it on).
if [[ -f $build/drivers/cuda_kernels.fatbin ]]; then export TPUHAL_CUDA_FATBIN=$build/drivers/cuda_kernels.fatbin; fi
installed
# The other steps' trees and tests: ThreadSanitizer's, the fuzz targets' and
# arm64's. Without a filter they build and run alongside the tests under
# load, as the busy work those run beside (scripts/load-test.sh
# --alongside), in place of processes that only spin: the machine is as
# busy, and the CI run is shorter by what those steps took after it.
# The tensor engine at every instruction-set level below this CPU's own (the
# load pass covers that one; docs/ops.md): the op, ONNX node and runtime
# tests again with TPUHAL_MAX_ISA and oneDNN's cap set, so that a machine
# with AVX-512 also tests what an AVX2 or SSE machine runs. They do not
# depend on timing: the load pass runs them after its tests, while the
# steps alongside it finish. Skipped, like those steps, when ctest was
# given a filter. The vector loops' own tests (TensorIsa, OpsIsa) step
# through every level the CPU has by themselves, so here only the two that
# check the cap run again. The compiler's tests that run no model's
# arithmetic (refusals, parsing, folding shapes, memory plans, the CLI's
# messages) are left out: they do the same at every level; so is the
# capacity plan's pipeline run, whose figures are the timing model's. At
# sse2 oneDNN keeps sse41's cap, so only tpuhal's own vector loops differ
# from that level: the op tests run there, not the models. Leaks are not
# looked for here (the load pass did, at this CPU's level): the levels
# differ in arithmetic, and leak checking took a fifth of their time.
isa_independent='^Runtime\.(PrecisionNamesParse|EveryOpTheCompilerTakes|GivenAnArrayWhenWrittenAsNpy|GivenTheWrongInputSize|GivenUnsupportedOps|GivenASymbolicBatchWithoutAShape|GivenADamaged|GivenACorrupted|GivenTheExportersFlattenChain|GivenSliceCastSqueeze|GivenShapeOpsOnDeviceData|GivenAChainOfLayers|GivenAnInitializerWhoseShape|GivenFoldingThatWould|GivenAnOutputShapeNo|GivenWindowAttributes|GivenAModelThatCannotRunSeveralBatches|GivenTheCliWhenACompileIsRefused|GivenControlBytes|GivenThePlanWhenTheVideoPipelineRuns)'
isa_levels() {
  local top level onednn levels tests
  local info
  info=$(TPUHAL_LOG=error ASAN_OPTIONS="$ASAN_OPTIONS:detect_leaks=0" "$build/bin/tpuhal" info sim:tiny --json 2>&1) || true
  top=$(sed -n 's/.*"tensor_isa": "\([a-z0-9_]*\)".*/\1/p' <<<"$info")
  [[ -n $top ]] || { echo "tpuhal test: tpuhal info did not name the tensor engine's instruction set: $info" >&2; return 1; }
  case $(uname -m) in
    x86_64) levels=(sse2 sse41 avx2 avx512 avx512_vnni) ;;
    aarch64) levels=(generic neon) ;;
    *) levels=() ;;
  esac
  for level in "${levels[@]}"; do
    [[ $level == "$top" ]] && break
    case $level in
      sse2 | sse41) onednn=SSE41 ;;
      avx2) onednn=AVX2 ;;
      avx512) onednn=AVX512_CORE ;;
      *) onednn=ALL ;;
    esac
    tests='Devices/Ops\..*/sim_tiny|OpsDeterminism|TensorIsa\.(TheCapComes|VectorEntryPointsRunTheLevel)'
    [[ $level == sse2 ]] || tests+='|OnnxNode|Runtime|Timing'
    echo "tpuhal test: the tensor tests at TPUHAL_MAX_ISA=$level (this CPU: $top)" >&2
    (cd "$build" && TPUHAL_MAX_ISA=$level ONEDNN_MAX_CPU_ISA=$onednn ASAN_OPTIONS="$ASAN_OPTIONS:detect_leaks=0" \
      ctest --output-on-failure -j "$(nproc)" -E "$isa_independent" -R "^($tests)")
  done
}
# Each step says how long it took, in the alongside log and on stderr.
# The command runs in a subshell, whose children are its own: a background
# job that the calling shell reaps meanwhile (the packages' step, beside
# the others) does not count in it. Its variables stay in the subshell.
timed() {
  (
    s=$SECONDS
    trap 'step_report "$*" "$s" 0 0' EXIT
    "$@"
  )
}
fuzz_tree() { if [[ $fuzz_here == ON ]]; then echo "$build"; else echo "$root/build/fuzz"; fi; }
# The Debian packages (docs/packages.md): built, checked by lintian, then
# installed, used and removed in a fresh Debian root, which needs root.
# Its fresh Debian root is mostly downloading: debootstrap runs from the
# start of the steps alongside, beside the builds.
debian_base_start() {
  [[ $(id -u) -eq 0 ]] || return 0
  debian_base=$(mktemp -d /tmp/tpuhal-debian-base-XXXXXX)
  (
    trap 'echo $? >"$debian_base.status"' EXIT
    source scripts/lib/debian-root.bash && TPUHAL_DEBIAN_BASE='' debian_root "$debian_base"
  ) >"$debian_base.log" 2>&1 &
  debian_base_pid=$!
}
packages() {
  if [[ $(id -u) -eq 0 ]]; then
    local st
    st=$(job_status "$debian_base_pid" "$debian_base.status")
    if ((st)); then
      cat "$debian_base.log" >&2
      echo "tpuhal test: a fresh Debian root for the packages' test failed" >&2
      return 1
    fi
    TPUHAL_DEBIAN_BASE=$debian_base timed scripts/package.sh --test
    rm -rf --one-file-system "$debian_base" "$debian_base.log" "$debian_base.status"
  else
    echo "tpuhal test: the packages' test needs root (debootstrap, chroot): not run" >&2
  fi
}
# ThreadSanitizer's tree first; then the packages' step in the background
# (its build, then dpkg, lintian, a venv and podman, much of that on one
# core) beside the other builds and runs, which keep the other core busy.
# Run last and alone, it left a core idle for minutes; started after the
# arm64 build, it was still the last to end, its one-core part alone at the
# tail for about ten minutes after the tests had ended. Its output goes to
# build/packages.log, its timings to stderr.
alongside_steps() {
  debian_base_start
  timed scripts/tsan.sh --build-only
  local log="$root/build/packages.log" pid st
  rm -f "$log.status"
  (
    trap 'echo $? >"$log.status"' EXIT
    packages
  ) >"$log" 2>&1 &
  pid=$!
  [[ $fuzz_here == ON ]] || timed scripts/fuzz.sh --build-only
  if arm64; then timed scripts/arm64.sh --build-only; fi
  timed scripts/tsan.sh --no-build
  timed scripts/fuzz.sh --build "$(fuzz_tree)" --no-build --seconds 5 --parallel "$(nproc)" -- -seed=1
  if arm64; then timed scripts/arm64.sh --no-build; fi
  st=$(job_status "$pid" "$log.status")
  grep '^tpuhal \(test\|package\): ' "$log" >&2 || true
  if ((st)); then
    tail -n 200 "$log" >&2
    echo "tpuhal test: the packages' step failed (log: $log)" >&2
    return 1
  fi
}
export -f arm64 timed alongside_steps isa_levels fuzz_tree packages debian_base_start job_status cpu_ticks cpu_since \
  step_report
export build root fuzz_here isa_independent step_prefix
done_alongside=0
# OpenMP's worker threads (the tensor engine's and oneDNN's in LLVM's
# libomp, PyTorch's in GNU libgomp) spin after each parallel region before
# they sleep: libomp for 200 ms by default (KMP_BLOCKTIME; the tensor
# engine's threads set 1 ms for their own teams where it is unset), libgomp
# for its spin count. On a shared CI runner, and
# in the load pass, which crowds the cores on purpose, that spinning takes
# the cores the other tests and builds need: the convolution and matrix
# product op tests beside two busy processes took 100 s as they were, 76 s
# with threads that sleep at once. What the tests check does not change.
export KMP_BLOCKTIME=${KMP_BLOCKTIME:-0} OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:strict_string_checks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
if (($# > 0)) || [[ -n ${TPUHAL_SKIP_LOAD:-} ]]; then
  # A filter (or TPUHAL_SKIP_LOAD=1): the tests it selects, on a quiet machine.
  (cd "$build" && ctest --output-on-failure -j "$(nproc)" "$@")
  took "ctest"
else
  # Every test once, on a busy machine, as shared CI runners are
  # (scripts/load-test.sh): the steps above building and running (then a
  # busy process per core) at normal priority and ctest at twice the cores
  # (`scripts/load-test.sh --repeat 3 --runs 10` runs the families most
  # sensitive to timing again and again, for a longer hunt; a second round
  # of them took CI 270 s). First, quietly, the few it leaves out: checks of the tree, the
  # model zoo's numerics, the integer kernels at every level and the QEMU
  # guests, which do not depend on timing and would only be slow there.
  (cd "$build" && ctest --output-on-failure -j "$(nproc)" -R "$("$root/scripts/load-test.sh" --build "$build" --skipped)")
  took "the quiet tests"
  (cd "$root" && scripts/load-test.sh --build "$build" --repeat 1 --alongside "set -euo pipefail; alongside_steps" \
    --then "set -euo pipefail; timed isa_levels")
  done_alongside=1
  grep '^tpuhal test: ' "$build/load-test/alongside.log" >&2 || true
  took "every other test under load, then at every instruction-set level, with ThreadSanitizer, fuzzing and arm64 alongside"
fi

# ThreadSanitizer over the tests where threads meet (scripts/tsan.sh,
# build/tsan/), fuzzing (each fuzz target for 5 s on its committed corpus,
# one per core at a time, in this tree, or build/fuzz/ when it is GCC's;
# docs/fuzzing.md;
# with a fixed seed so that a CI failure can be replayed) and arm64 (the
# cross build and the tensor and conformance tests under qemu-aarch64,
# scripts/arm64.sh; skipped with TPUHAL_SKIP_ARM64=1). They ran alongside
# the load pass above; with TPUHAL_SKIP_LOAD=1 they run here, quietly.
# Skipped when ctest was given a filter, so that `scripts/test.sh -R Foo`
# stays quick.
if (($# == 0)) && ((!done_alongside)); then
  timed isa_levels
  took "the tensor tests at every instruction-set level"
  (cd "$root"; alongside_steps)
  took "ThreadSanitizer, fuzzing and arm64"
fi
step_report "the whole run" 0 0 0
