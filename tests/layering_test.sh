#!/usr/bin/env bash
# Dependencies point down only (docs/architecture.md). Fails, naming the
# file and the include, when a layer reaches up or sideways.
set -euo pipefail
root=$1
status=0
checked=()
check() {  # check DIR PATTERN WHY
  local hits
  checked+=("$1")
  if [[ ! -d $root/$1 ]]; then
    echo "layering: there is no folder $1: update this script where it moved"
    status=1
    return
  fi
  hits=$(grep -rnE "#include \"($2)" "$root/$1" --include='*.h' --include='*.hpp' --include='*.cpp' || true)
  if [[ -n $hits ]]; then
    echo "layering: $1 must not include $2 ($3):"
    echo "$hits"
    status=1
  fi
}
check firmware_iface 'tpuhal/(base|sim|tpu|driver|tpuhal|bench)/|tpuhal/[a-z_]+\.hpp' "firmware_iface depends on nothing"
check simulator 'tpuhal/(tpu|driver|bench)/|tpuhal/[a-z_]+\.hpp' "the simulator never sees a driver or the HAL"
check drivers/tpu/src 'tpuhal/sim/' "the driver reaches the board only through a Transport"
check drivers/tpu/include 'tpuhal/sim/' "the driver reaches the board only through a Transport"
check drivers/tpu/transports 'tpuhal/(cuda|skeleton|rt|bench|pipeline)/|tpuhal/tpuhal\.hpp' "a transport sees the TPU driver, its bus and the driver interface"
for t in "$root"/drivers/tpu/transports/*/; do
  t=${t%/}; t=${t#"$root"/}
  [[ $t == */pcie ]] || check "$t" 'tpuhal/bus/' "only the pcie transport stands on the PCI bus layer"
  [[ $t == */sim || $t == */usb_sim ]] ||
    check "$t" 'tpuhal/sim/' "only the sim and usb_sim transports meet the simulator; the others reach boards"
done
check drivers/bus 'tpuhal/(fw|sim|tpu|simd|cuda|skeleton|driver|rt|bench|pipeline)/|tpuhal/tpuhal\.hpp' "bus code knows no board and nothing above it"
check drivers/cuda 'tpuhal/(fw|sim|tpu|simd|bus|skeleton|rt|bench|pipeline)/|tpuhal/tpuhal\.hpp' "the CUDA shim stands on the driver interface only"
check drivers/skeleton 'tpuhal/(fw|sim|tpu|simd|bus|cuda|rt|bench|pipeline)/|tpuhal/tpuhal\.hpp' "the skeleton shows what a new driver stands on: the driver interface"
check base 'tpuhal/(fw|sim|tpu|driver|bench)/|tpuhal/[a-z_]+\.hpp' "base is below everything"
check hal 'tpuhal/(sim|tpu|fw|bench)/' "the HAL knows drivers only through the driver interface"
check runtime 'tpuhal/(sim|tpu|fw|driver|base|bench)/' "the runtime stands on the public API only"
check bench 'tpuhal/(sim|tpu|fw|simd|bus|cuda|driver|skeleton)/' "benchmarks measure through the public API"
check examples 'tpuhal/(sim|tpu|fw|simd|bus|cuda|driver|skeleton|base|bench)/' "examples use the public API, the runtime and the pipeline only"
check pipeline 'tpuhal/(sim|tpu|fw|simd|bus|cuda|driver|skeleton|base|bench)/' "the video pipeline stands on the public API only"
check bindings 'tpuhal/(sim|tpu|fw|simd|bus|cuda|driver|skeleton|bench)/' "the bindings wrap the public API and the runtime"
check tools/tpuhal 'tpuhal/(sim|tpu|fw|simd|bus|cuda|driver|skeleton)/' "the CLI uses the public API; it meets the simulator through sim: URIs and the daemon"
check tools/tpuhal-simd 'tpuhal/(tpu|driver|bus|cuda|skeleton|rt|bench|pipeline)/|tpuhal/[a-z_]+\.hpp' "the daemon serves simulated boards over the protocol; it never sees a driver or the HAL"
check tools/fleet 'tpuhal/' "what a container needs from the host is read from sysfs; it uses no tpuhal layer"
check gst 'tpuhal/(sim|tpu|fw|simd|bus|cuda|driver|skeleton|base|bench)/' "the GStreamer elements use the public API and the runtime"
check tools/tpuhal-device-plugin 'tpuhal/(sim|tpu|fw|simd|bus|cuda|driver|skeleton)/' "the device plugin uses the public API, as the CLI does"
check tools/tpuhal-usb-gadget 'tpuhal/(tpu|driver|bus|cuda|skeleton|simd|rt|bench|pipeline)/|tpuhal/[a-z_]+\.hpp' "the gadget is the board's side of the cable"
# tests/ and fuzz/ may reach any layer: they test each one from below.
# Every other folder with code has a rule above, so a new one gets one too.
exempt=(tests fuzz build)
while IFS= read -r dir; do
  dir=${dir#"$root"/}
  [[ " ${exempt[*]} " == *" ${dir%%/*} "* ]] && continue
  covered=0
  for c in "${checked[@]}"; do
    [[ $dir == "$c" || $dir == "$c"/* ]] && covered=1 && break
  done
  if ((!covered)); then
    echo "layering: $dir has code and no rule here: add one"
    status=1
  fi
done < <(find "$root" -path "$root/.git" -prune -o -type f \( -name '*.cpp' -o -name '*.h' -o -name '*.hpp' \) -printf '%h\n' | sort -u)
[[ $status -eq 0 ]] && echo "layering: ok"
exit $status
