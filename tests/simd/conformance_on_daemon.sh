#!/usr/bin/env bash
# Runs the whole conformance suite on a board served by the simulator daemon:
# starts tpuhal-simd on a socket in a temporary directory, points
# enumerate() at it (TPUHAL_SIMD) and runs every conformance test of the
# simd: device. The in-process devices run in the suite's own ctest entries.
#   conformance_on_daemon.sh TPUHAL_SIMD_BINARY HAL_CONFORMANCE_BINARY [gtest args...]
set -euo pipefail
simd=$1
conformance=$2
shift 2
dir=$(mktemp -d /tmp/tpuhal-simd-conformance-XXXXXX)
pid=
cleanup() {
  if [[ -n $pid ]]; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  fi
  rm -rf "$dir"
}
trap cleanup EXIT
# Four VFs of the default board: a test may hold several devices at once.
"$simd" --socket "$dir/simd.sock" --board bm1684x --vfs 4 >"$dir/daemon.log" 2>&1 &
pid=$!
for _ in $(seq 300); do
  grep -q serving "$dir/daemon.log" 2>/dev/null && break
  kill -0 "$pid" 2>/dev/null || { cat "$dir/daemon.log"; echo "tpuhal-simd did not start"; exit 1; }
  sleep 0.1
done
grep -q serving "$dir/daemon.log" || { echo "tpuhal-simd did not start within 30 s"; exit 1; }
# gtest names the simd device's parameter "simd_" followed by its socket path.
listed=$(TPUHAL_SIMD="$dir/simd.sock" "$conformance" --gtest_list_tests --gtest_filter='*/simd_*' | grep -c simd_ || true)
if [[ $listed -eq 0 ]]; then
  echo "the conformance suite lists no test of the simd: device"
  exit 1
fi
TPUHAL_SIMD="$dir/simd.sock" "$conformance" --gtest_filter='*/simd_*' "$@"
