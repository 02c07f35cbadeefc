#!/usr/bin/env bash
# Installs what tpuhal needs to build and test on Debian 12, with apt-get,
# only if something is missing. Safe to run again.
#
#   scripts/setup.sh [--build | --test | --package]
#
#   --build    only what configuring and building needs
#   --test     only what the tests need beyond that (scripts/test.sh installs
#              these while it builds)
#   --package  only what scripts/package.sh needs beyond the build's
set -euo pipefail

build_packages=(
  build-essential cmake ninja-build pkg-config clang clang-format  # clang-format: scripts/format.sh
  lld                                           # the clang trees' linker (scripts/lib/configure.bash)
  libclang-rt-14-dev libomp-dev                 # clang's libFuzzer and sanitizer runtimes, its OpenMP (scripts/fuzz.sh)
  libboost-dev libboost-program-options-dev
  libspdlog-dev libfmt-dev nlohmann-json3-dev
  libusb-1.0-0-dev libpci-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libdnnl-dev ocl-icd-opencl-dev                # the simulated tensor engine's kernels (its CMake package requires OpenCL)
  libonnx-dev libprotobuf-dev libonnx-testdata  # ONNX's node tests
  libavcodec-dev libavformat-dev libavutil-dev  # the simulated codec unit, demuxing
  pybind11-dev python3-dev python3-numpy        # the Python package (bindings/python)
  prometheus-cpp-dev                            # `tpuhal exporter`
  libgrpc++-dev protobuf-compiler protobuf-compiler-grpc  # tpuhal-device-plugin
  libgstreamer1.0-dev libgstreamer-plugins-base1.0-dev  # libgsttpuhal.so
)
package_packages=(
  dpkg-dev help2man lintian                     # dpkg-shlibdeps, manual pages from --help, the packages' check
  patchelf python3-wheel python3-venv           # the wheel: its module's RPATH, `wheel pack`; its test's venv
  debootstrap systemd-container                 # a fresh Debian 12 root to install them in, booted with systemd (--test)
)
test_packages=(
  ffmpeg                                        # clips for the video tests, and their reference MD5s
  python3-pytest python3-onnx                   # the Python tests (ONNX builds the runtime tests' models)
  python3-torch python3-torchvision             # the model zoo test (examples/model_zoo)
  qemu-system-x86 busybox-static cpio           # the PCIe transport's test on QEMU's edu device (tests/qemu/run.sh)
  prometheus                                    # promtool and a real Prometheus in the exporter's test
  podman runc python3-jsonschema                # `tpuhal cdi`: a real container given a board; the CDI schema check
  golang-github-container-orchestrated-devices-container-device-interface-dev  # the CDI specification's JSON schema
  python3-grpcio                                # the device plugin's kubelet stand-in
  gir1.2-gst-rtsp-server-1.0 gstreamer1.0-plugins-good gstreamer1.0-plugins-bad  # a real RTSP server for the live-video tests
  gstreamer1.0-tools gstreamer1.0-plugins-base  # gst-launch-1.0 in the plugin's tests
  universal-ctags                               # function lengths (tests/function_length_test.py)
  systemd                                       # systemd-socket-activate: the daemon's socket activation test
  "${package_packages[@]}"                      # the packages' test in a fresh Debian root (scripts/package.sh --test)
)
case ${1:-} in
  --build) packages=("${build_packages[@]}") ;;
  --test) packages=("${test_packages[@]}") ;;
  --package) packages=("${package_packages[@]}") ;;
  "") packages=("${build_packages[@]}" "${test_packages[@]}") ;;
  -h | --help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  *) echo "tpuhal setup: unknown argument $1 (--help)" >&2; exit 2 ;;
esac

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  exit 0
fi

echo "tpuhal setup: installing ${missing[*]}" >&2
if [[ $(id -u) -eq 0 ]]; then
  sudo=()
elif command -v sudo >/dev/null; then
  sudo=(sudo)
else
  echo "tpuhal setup: need root (or sudo) to install: ${missing[*]}" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
# Another install running (scripts/test.sh installs the tests' packages
# while it builds): wait for its lock rather than fail.
lock=(-o DPkg::Lock::Timeout=900)
"${sudo[@]}" apt-get "${lock[@]}" update -qq
"${sudo[@]}" apt-get "${lock[@]}" install -y -qq --no-install-recommends "${missing[@]}"
