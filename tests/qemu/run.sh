#!/usr/bin/env bash
# Boots a small Linux guest under QEMU (software emulation) with QEMU's "edu"
# PCI device and runs edu_test inside it, twice:
#   1. q35 + intel-iommu, edu bound to vfio-pci: libpci discovery, BAR0 through
#      VFIO, MSI through an eventfd, a DMA round trip through the IOMMU;
#   2. no IOMMU, edu bound to uio_pci_generic: BAR0 through sysfs resource0,
#      INTx through UIO, DMA refused.
#
#   run.sh EDU_TEST_BINARY [CACHE_DIR]
#
# The guest kernel comes from Debian's kernel package (the one
# linux-image-amd64 depends on), downloaded with apt-get into CACHE_DIR the
# first time and unpacked there, never installed. The initramfs holds static
# busybox, the vfio/uio modules, edu_test and the shared libraries it needs.
# Each boot runs under a timeout; the guest reports its verdict through the
# isa-debug-exit port (QEMU exits with 1 for pass, 3 for fail).
#
# Exit status: 0 pass, 1 fail, 77 skipped (QEMU is not installed).
set -euo pipefail

binary=${1:?usage: run.sh EDU_TEST_BINARY [CACHE_DIR]}
cache=${2:-$(dirname "$0")/../../build/qemu-cache}
boot_timeout=${TPUHAL_QEMU_TIMEOUT:-90}

here=$(cd "$(dirname "$0")" && pwd)
source "$here/guest.sh"
[[ -x $binary ]] || { echo "FAIL: $binary is not an executable"; exit 1; }
guest_setup "$cache"

# ---- the initramfs ----
guest_modules "$root" virt/lib/irqbypass drivers/vfio/vfio drivers/vfio/vfio_virqfd drivers/vfio/vfio_iommu_type1 \
  drivers/vfio/pci/vfio-pci-core drivers/vfio/pci/vfio-pci drivers/uio/uio drivers/uio/uio_pci_generic
guest_programs "$root" "$binary"
cat > "$root/init" <<'EOF'
#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mkdir -p /dev/shm && mount -t tmpfs shm /dev/shm  # as on any system: LLVM's OpenMP registers itself there
mode=sysfs
grep -q tpuhal_mode=vfio /proc/cmdline && mode=vfio
load() { insmod /lib/modules/$1.ko || echo "insmod $1 failed"; }
if [ $mode = vfio ]; then
  for m in irqbypass vfio vfio_virqfd vfio_iommu_type1 vfio-pci-core vfio-pci; do load $m; done
  echo 1234 11e8 > /sys/bus/pci/drivers/vfio-pci/new_id
else
  load uio; load uio_pci_generic
  echo 1234 11e8 > /sys/bus/pci/drivers/uio_pci_generic/new_id
fi
echo "guest: edu_test $mode"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 /edu_test $mode
rc=$?
echo "tpuhal-verdict $rc"
/edu_test exit $rc
poweroff -f
EOF
chmod +x "$root/init"
guest_initrd "$root" "$work/initrd.gz"

# ---- the two boots ----
boot() {  # boot NAME APPEND QEMU_ARGS...
  local name=$1 append=$2
  shift 2
  local log="$cache/$name.log" start=$SECONDS rc=0
  timeout --kill-after=5 "$boot_timeout" "$qemu" -machine q35 -accel tcg -cpu max -m 1024 -smp 1 \
    -nographic -no-reboot -monitor none -serial stdio \
    -kernel "$vmlinuz" -initrd "$work/initrd.gz" \
    -append "console=ttyS0 quiet loglevel=3 panic=-1 $append" \
    "$@" -device edu -device isa-debug-exit,iobase=0xf4,iosize=0x04 </dev/null >"$log" 2>&1 || rc=$?
  grep -E '^(ok  |FAIL|     |guest:|tpuhal-verdict|insmod|==[0-9]+==)' "$log" | sed "s/^/[$name] /" || true
  case $rc in
    1) echo "[$name] pass ($((SECONDS - start)) s)"; return 0 ;;
    124 | 137) echo "[$name] FAIL: no verdict within ${boot_timeout} s (log: $log)" ;;
    3) echo "[$name] FAIL: the guest test failed (log: $log)" ;;
    *) echo "[$name] FAIL: QEMU exited with $rc and no verdict (log: $log)"; tail -n 30 "$log" ;;
  esac
  return 1
}

status=0
boot vfio "intel_iommu=on tpuhal_mode=vfio" -device intel-iommu || status=1
boot sysfs "tpuhal_mode=sysfs" || status=1
exit $status
