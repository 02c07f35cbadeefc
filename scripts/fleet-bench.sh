#!/usr/bin/env bash
# What watching a shared board costs its workload (docs/operations.md):
#  1. `tpuhal bench submit` and `bench dma` on a board the simulator daemon
#     shares, with and without `tpuhal exporter` scraped every second;
#  2. `tpuhal stress` on it, with and without `tpuhal smi -l 0.01` reading
#     its telemetry in a tight loop from another process.
# Runs alternate, and medians are printed with the ratio on/off.
#
#   scripts/fleet-bench.sh [BUILD_DIR] [RUNS]     (default build/rel, 11)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
bin=$(cd "${1:-$root/build/rel}" && pwd)/bin
runs=${2:-11}
for p in tpuhal tpuhal-simd; do
  [[ -x "$bin/$p" ]] || { echo "fleet-bench: no $bin/$p; build first" >&2; exit 2; }
done
command -v curl >/dev/null || { echo "fleet-bench: needs curl" >&2; exit 2; }
py=/usr/bin/python3

dir=$(mktemp -d /tmp/tpuhal-fleet-bench-XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT

"$bin/tpuhal-simd" --socket "$dir/simd.sock" --vfs 4 >"$dir/simd.log" 2>&1 &
pids+=($!)
for _ in $(seq 50); do [[ -S "$dir/simd.sock" ]] && break; sleep 0.1; done
uri="simd:$dir/simd.sock#0"

echo "exporter scraped every second: bench submit and dma on $uri, $runs runs each" >&2
for i in $(seq "$runs"); do
  for mode in off on; do
    if [[ $mode == on ]]; then
      "$bin/tpuhal" exporter --listen 127.0.0.1:0 --device "$uri" >"$dir/exporter.out" 2>/dev/null &
      exporter=$!
      for _ in $(seq 50); do grep -q listening "$dir/exporter.out" && break; sleep 0.1; done
      port=$(sed -n 's/^listening on [^ ]*:\([0-9]*\) .*/\1/p' "$dir/exporter.out")
      (while true; do curl -s "http://127.0.0.1:$port/metrics" >/dev/null; sleep 1; done) &
      scraper=$!
    fi
    echo "$mode bench $("$bin/tpuhal" bench submit --device "$uri" --json | tr -d '\n')" >>"$dir/bench.txt"
    echo "$mode bench $("$bin/tpuhal" bench dma --device "$uri" --json | tr -d '\n')" >>"$dir/bench.txt"
    if [[ $mode == on ]]; then
      kill "$scraper" "$exporter"
      wait "$scraper" "$exporter" 2>/dev/null || true
    fi
  done
done

echo "smi -l 0.01 in another process: tpuhal stress on $uri, $runs runs each" >&2
for i in $(seq "$runs"); do
  for mode in off on; do
    if [[ $mode == on ]]; then
      "$bin/tpuhal" smi --device "$uri" --loop 0.01 --json >"$dir/smi.txt" 2>&1 &
      smi=$!
    fi
    line=$("$bin/tpuhal" stress --device "$uri" --seconds 4 --threads 2 --seed "$i" 2>&1 | grep -E 'PASSED|FAILED')
    samples=0
    if [[ $mode == on ]]; then
      kill "$smi"
      wait "$smi" 2>/dev/null || true
      samples=$(wc -l <"$dir/smi.txt")
    fi
    echo "$mode stress $samples $line" >>"$dir/bench.txt"
  done
done

"$py" - "$dir/bench.txt" <<'EOF'
import json, re, statistics as st, sys
rows = {}
failed = 0
for line in open(sys.argv[1]):
    mode, kind, rest = line.rstrip("\n").split(" ", 2)
    if kind == "stress":
        samples, text = rest.split(" ", 1)
        failed += "FAILED" in text
        m = re.search(r"\((\d+)/s\)", text)
        rows.setdefault(("stress operations/s", mode), []).append(float(m.group(1)) if m else 0.0)
        if mode == "on":
            rows.setdefault(("smi samples per run", mode), []).append(float(samples))
        continue
    for o in (json.loads(x) for x in re.findall(r"\{[^{}]*\}", rest)):
        if o["bench"] in ("round_trip", "submit_rate"):
            key = f"{o['bench']} ({o['unit']})"
        elif o["bench"] == "dma" and o["bytes"] in (4096, 1 << 20, 64 << 20):
            key = f"dma {o['direction']} {o['bytes'] >> 10} KiB (GB/s)"
        else:
            continue
        rows.setdefault((key, mode), []).append(o["value"])
keys = list(dict.fromkeys(k for k, _ in rows))
print(f"{'measure':32s} {'off':>10s} {'on':>10s} {'on/off':>7s}")
for k in keys:
    off, on = rows.get((k, "off")), rows.get((k, "on"))
    if off and on:
        print(f"{k:32s} {st.median(off):10.3f} {st.median(on):10.3f} {st.median(on) / st.median(off):7.3f}")
    elif on:
        print(f"{k:32s} {'':>10s} {st.median(on):10.1f}")
print(f"stress runs that failed a check: {failed}")
sys.exit(1 if failed else 0)
EOF
