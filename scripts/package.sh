#!/usr/bin/env bash
# Builds tpuhal's Debian packages and its Python wheel (docs/packages.md):
# an optimised build for /usr (into build/package/), then one .deb per
# package, checked by lintian, and the wheel, into build/packages/.
#
#   scripts/package.sh [--out DIR] [--test] [--no-build]
#
#   --out DIR   where the .deb files and the wheel go (default: build/packages)
#   --test      then install the .debs in a fresh Debian 12 root, use them
#               and remove them (tests/packages/install_test.sh), the wheel
#               in a fresh venv (tests/packages/wheel_test.sh), and build
#               the simulator service images (without and with video) and
#               run one as a daemon for another container given a board
#               through CDI
#               (scripts/image.sh, tests/packages/image_test.sh); needs root
#   --no-build  package the tree as it is (after an earlier run)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build="$root/build/package"
out="$root/build/packages"
test=0 no_build=0
while (($#)); do
  case $1 in
    --out) out=$(realpath -m "$2"); shift ;;
    --test) test=1 ;;
    --no-build) no_build=1 ;;
    -h | --help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "tpuhal package: unknown argument $1 (--help)" >&2; exit 2 ;;
  esac
  shift
done
source "$root/scripts/lib/cpu.bash"
step_prefix="tpuhal package"
step_start
"$root/scripts/setup.sh" --build
"$root/scripts/setup.sh" --package
if ((!no_build)); then
  # clang with lld, a unity build and no tests: the packages' build is the
  # library and the programs only. Installed files carry no RPATH (Debian's
  # loader finds libtpuhal in /usr/lib).
  source "$root/scripts/lib/configure.bash"
  configure_with clang clang++ "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_UNITY_BUILD=ON \
    -DTPUHAL_BUILD_TESTS=OFF -DCMAKE_INSTALL_PREFIX=/usr -DCMAKE_SKIP_INSTALL_RPATH=ON
  cmake --build "$build"
  took "the build"
fi
# One date for every file of the packages and the wheel: the last commit's.
SOURCE_DATE_EPOCH=$(git -C "$root" log -1 --format=%ct 2>/dev/null || date +%s)
export SOURCE_DATE_EPOCH
/usr/bin/python3 "$root/packaging/debs.py" --build "$build" --out "$out"
/usr/bin/python3 "$root/packaging/wheel.py" --build "$build" --out "$out"
took "making the packages and the wheel"
# An error or a warning fails the run.
lintian --fail-on error,warning "$out"/*.deb
took "lintian"
if ((test)); then
  # One fresh Debian root for the run, copied for each use (the packages'
  # test and the image), made by debootstrap once (or given: scripts/test.sh
  # makes it while it builds).
  if [[ -z ${TPUHAL_DEBIAN_BASE:-} ]]; then
    TPUHAL_DEBIAN_BASE=$(mktemp -d /tmp/tpuhal-debian-base-XXXXXX)
    trap 'rm -rf --one-file-system "$TPUHAL_DEBIAN_BASE"' EXIT
    source "$root/scripts/lib/debian-root.bash"
    # shellcheck disable=SC2097,SC2098 # the new root's path, made without a base to copy
    TPUHAL_DEBIAN_BASE='' debian_root "$TPUHAL_DEBIAN_BASE"
    took "a fresh Debian root (debootstrap)"
  fi
  export TPUHAL_DEBIAN_BASE
  "$root/tests/packages/install_test.sh" "$out"
  took "the packages' test in a fresh Debian root"
  "$root/tests/packages/wheel_test.sh" "$out"/tpuhal-*.whl
  took "the wheel's test in a fresh venv"
  image=localhost/tpuhal-simd-test:$$
  "$root/scripts/image.sh" --packages "$out" --tag "$image"
  "$root/scripts/image.sh" --packages "$out" --tag "$image-video" --video
  took "the simulator service images, without and with video"
  status=0
  "$root/tests/packages/image_test.sh" "$image" "$image-video" || status=$?
  podman rmi -f "$image" "$image-video" >/dev/null 2>&1 || true
  ((status == 0)) || exit "$status"
  took "the images' test in containers"
fi
