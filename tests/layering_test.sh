#!/usr/bin/env bash
# Dependencies point down only (docs/architecture.md). Fails, naming the
# file and the include, when a layer reaches up or sideways.
set -euo pipefail
root=$1
status=0
check() {  # check DIR PATTERN WHY
  local hits
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
check drivers/tpu/pcie 'tpuhal/sim/' "the PCIe transport reaches real boards only"
check drivers/tpu/usb 'tpuhal/sim/' "the USB transport reaches boards through a UsbLink only"
check base 'tpuhal/(fw|sim|tpu|driver|bench)/|tpuhal/[a-z_]+\.hpp' "base is below everything"
check hal 'tpuhal/(sim|tpu|fw|bench)/' "the HAL knows drivers only through the driver interface"
check runtime 'tpuhal/(sim|tpu|fw|driver|base|bench)/' "the runtime stands on the public API only"
[[ $status -eq 0 ]] && echo "layering: ok"
exit $status
