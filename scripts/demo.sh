#!/usr/bin/env bash
# Builds tpuhal (optimised, into build/) and runs `tpuhal demo` on the
# built-in simulated board. Extra arguments go to the demo.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$root/scripts/setup.sh"
cmake -S "$root" -B "$root/build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTPUHAL_BUILD_TESTS=OFF >/dev/null
cmake --build "$root/build" --target tpuhal_cli
exec "$root/build/bin/tpuhal" demo "$@"
