#!/usr/bin/env bash
# Cross-builds tpuhal for arm64 (into build/arm64/) with Debian's cross
# compiler and arm64 libraries, and runs the tensor engine's tests, the
# conformance suite, the ONNX node tests and the runtime tests under
# qemu-aarch64-static, at both arm64 instruction-set levels (generic,
# neon; below). Installs what it needs with apt-get (as root, or through
# sudo). Extra arguments go to ctest.
#
#   scripts/arm64.sh [--install-only | --build-only | --no-build] [CTEST_ARGS...]
#
#   --install-only  install the cross compiler and the arm64 libraries, and
#                 nothing more (scripts/test.sh does so while it builds)
#   --build-only  install, configure and build, and run no test
#                 (scripts/test.sh builds while other tests run)
#   --no-build    run the tests in build/arm64/ as it is
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_it=1
test_it=1
install_only=0
case ${1:-} in
  --install-only) install_only=1; test_it=0; shift ;;
  --build-only) test_it=0; shift ;;
  --no-build) build_it=0; shift ;;
  -h | --help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
esac
build="$root/build/arm64"
extra="$build/extra"  # arm64 -dev packages that cannot be installed beside the amd64 ones

if ((build_it)); then
  # One installer at a time: scripts/test.sh may have one running already.
  mkdir -p "$root/build"
  exec 8>"$root/build/.arm64-install.lock"
  flock 8
  if [[ $(id -u) -eq 0 ]]; then sudo=(); else sudo=(sudo); fi
  export DEBIAN_FRONTEND=noninteractive
  if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    "${sudo[@]}" dpkg --add-architecture arm64 8>&-
    "${sudo[@]}" apt-get -o DPkg::Lock::Timeout=900 update -qq 8>&-
  fi
  packages=(
    crossbuild-essential-arm64 qemu-user-static
    libboost-dev:arm64 libboost-program-options-dev:arm64 libspdlog-dev:arm64 libfmt-dev:arm64
    libusb-1.0-0-dev:arm64 libpci-dev:arm64 libgtest-dev:arm64 libgmock-dev:arm64
    libdnnl2:arm64 ocl-icd-opencl-dev:arm64 libonnx1:arm64 libprotobuf-dev:arm64
    libavcodec-dev:arm64 libavformat-dev:arm64 libavutil-dev:arm64
  )
  missing=()
  for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if ((${#missing[@]})); then
    echo "tpuhal arm64: installing ${missing[*]}" >&2
    "${sudo[@]}" apt-get -o DPkg::Lock::Timeout=900 update -qq 8>&-
    "${sudo[@]}" apt-get -o DPkg::Lock::Timeout=900 install -y -qq --no-install-recommends "${missing[@]}" 8>&-
  fi

  # oneDNN's and ONNX's -dev packages for arm64 share paths with the amd64 ones
  # (dnnl_config.h differs; libonnxifi.so is not under a multiarch directory),
  # so dpkg refuses them side by side: unpack them here instead, and point
  # their libraries' links at the installed arm64 runtime libraries.
  if [[ ! -f "$extra/.done" ]]; then
    rm -rf "$extra"
    mkdir -p "$extra/debs"
    (cd "$extra/debs" && apt-get download -qq libdnnl-dev:arm64 libonnx-dev:arm64 libonnxifi:arm64 2>/dev/null)
    for deb in "$extra"/debs/*.deb; do dpkg-deb -x "$deb" "$extra"; done
    for lib in libdnnl.so.2 libdnnl.so.2.6 libonnx.so.1 libonnx_proto.so.1; do
      ln -sf "/usr/lib/aarch64-linux-gnu/$lib" "$extra/usr/lib/aarch64-linux-gnu/$lib"
    done
    ln -sf libdnnl.so.2 "$extra/usr/lib/aarch64-linux-gnu/libdnnl.so"
    ln -sf libonnx.so.1 "$extra/usr/lib/aarch64-linux-gnu/libonnx.so"
    ln -sf libonnx_proto.so.1 "$extra/usr/lib/aarch64-linux-gnu/libonnx_proto.so"
    touch "$extra/.done"
  fi
  flock -u 8
  ((!install_only)) || exit 0

  cmake -S "$root" -B "$build" -G Ninja --toolchain "$root/cmake/aarch64-linux-gnu.cmake" \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g0 -DNDEBUG" \
    -DCMAKE_UNITY_BUILD=ON -DTPUHAL_WERROR=ON -DTPUHAL_BUILD_PYTHON=OFF -DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON \
    -Ddnnl_DIR="$extra/usr/lib/aarch64-linux-gnu/cmake/dnnl" -DONNX_DIR="$extra/usr/lib/aarch64-linux-gnu/cmake/ONNX" >/dev/null
  targets=(sim_tensor_isa_test ops_test hal_conformance hal_timing tpuhal_cli)
  grep -q '^build onnx_node_test:' "$build/build.ninja" && targets+=(onnx_node_test)
  grep -q '^build runtime_compile:' "$build/build.ninja" && targets+=(runtime_compile)
  [[ ${TPUHAL_ARM64_CONFIGURE_ONLY:-} ]] && exit 0
  cmake --build "$build" --target "${targets[@]}"
fi
((test_it)) || exit 0

# Under emulation everything runs tens of times slower, so the tests run on
# one simulated board (sim:tiny) rather than every device. At the top level
# (neon): the engine's kernel tests (every level, in one process), the
# cross-level and thread-count determinism tests, the op tests, the ONNX
# node tests, the runtime tests, the conformance suite and the timing
# model's pinned figures (the same integers as on x86). At the portable
# level (generic): the op tests of the products, the only ops whose code
# differs between the levels. Left out, as at the x86 levels
# (scripts/test.sh): the capacity plan's pipeline run, whose figures are
# the timing model's (Timing pins those here), and which took 108 s of
# emulation, a third of this step.
(cd "$build" && TPUHAL_MAX_ISA=neon ctest --output-on-failure -j "$(nproc)" \
  -R '^(TensorIsa|OpsIsa|OpsDeterminism|Devices/Ops\..*/sim_tiny|OnnxNode|Runtime|Devices/Conformance\..*/sim_tiny|Timing)' \
  -E '^Runtime\.GivenThePlanWhenTheVideoPipelineRuns' "$@")
echo "tpuhal arm64: the products' op tests at TPUHAL_MAX_ISA=generic" >&2
(cd "$build" && TPUHAL_MAX_ISA=generic ctest --output-on-failure -j "$(nproc)" \
  -R '^Devices/Ops\.(MatMul|Conv|QLinear|IntegerProducts).*/sim_tiny' "$@")
