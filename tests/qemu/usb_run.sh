#!/usr/bin/env bash
# Boots a small Linux guest under QEMU (software emulation) and tests the
# usb: driver on the kernel's real USB stack inside it: dummy_hcd gives the
# guest a USB device controller wired to a host controller, and
# tpuhal-usb-gadget presents a simulated board on it through configfs and
# FunctionFS (usb_f_fs). The driver reaches the board through libusb, usbfs
# and the host controller. In order:
#   1. the gadget starts in loader mode; usb_guest_test uploads firmware
#      (refused images first) and the board re-enumerates as the application;
#   2. the conformance suite runs on the usb: device;
#   3. a driver killed mid-transfer leaves nothing that stops the next one
#      opening the board;
#   4. usb_guest_test unbinds the gadget mid-transfer (the cable pulled):
#      device-lost, not a timeout (how soon is printed), then the board comes back;
#   5. with TPUHAL_QEMU_BENCH=1 only: tpuhal bench dma and submit on the
#      usb: device, beside a plain libusb bulk loopback (usb_loopback_bench)
#      against the kernel's own source/sink function on a second dummy
#      controller, in the same boot. They assert nothing and take a third of
#      the boot, so the README's test command leaves them out.
#
#   [TPUHAL_QEMU_BENCH=1] usb_run.sh BUILD_DIR [CACHE_DIR]
#
# Programs come from BUILD_DIR/bin; the kernel and modules as in run.sh
# (guest.sh). Exit status: 0 pass, 1 fail, 77 skipped (QEMU is not installed).
set -euo pipefail

build=${1:?usage: usb_run.sh BUILD_DIR [CACHE_DIR]}
cache=${2:-$build/qemu-cache}
# The whole boot under TCG (no KVM on CI's runners) with the sanitizer
# build's programs: about 250 s alone on a 2-core VM, 415-440 s beside
# the other quiet tests or a build. The bound is for a hung guest only.
boot_timeout=${TPUHAL_QEMU_TIMEOUT:-900}
bench=0
[[ ${TPUHAL_QEMU_BENCH:-} == 1 ]] && bench=1

here=$(cd "$(dirname "$0")" && pwd)
source "$here/guest.sh"
guest_setup "$cache"
guest_modules "$root" drivers/usb/common/usb-common drivers/usb/core/usbcore drivers/usb/gadget/udc/udc-core \
  drivers/usb/gadget/udc/dummy_hcd fs/configfs/configfs drivers/usb/gadget/libcomposite \
  drivers/usb/gadget/function/usb_f_fs drivers/usb/gadget/function/usb_f_ss_lb
guest_programs "$root" "$build/bin/tpuhal-usb-gadget" "$build/bin/usb_guest_test" "$build/bin/hal_conformance" \
  "$build/bin/tpuhal" "$build/bin/usb_loopback_bench" "$build/bin/edu_test"
cat > "$root/init" <<'EOF'
#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mkdir -p /dev/shm && mount -t tmpfs shm /dev/shm  # as on any system: LLVM's OpenMP registers itself there
load() { insmod /lib/modules/$1.ko $2 || echo "insmod $1 failed"; }
for m in usb-common usbcore udc-core configfs libcomposite usb_f_fs usb_f_ss_lb; do load $m; done
load dummy_hcd num=2
mount -t configfs none /sys/kernel/config
export ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 TPUHAL_LOG=warn
# For a ThreadSanitizer build (usb_run.sh build/tsan ...): libusb hands its
# transfers between threads through the kernel, which ThreadSanitizer
# cannot see, so reports inside libusb are suppressed.
echo "race:libusb-1.0.so.0" > /tmp/tsan.supp
export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:suppressions=/tmp/tsan.supp
bench=@BENCH@
rc=0
step() { echo "guest: $* (at $(cut -d" " -f1 /proc/uptime) s)"; }
fail() { echo "guest: FAIL $*"; rc=1; }
# Whether FILE comes to hold PATTERN within 120 s: a bound for a hung
# program only (as usb_guest_test's), since the emulated machine beside a
# busy host is slow.
await() { for i in $(seq 1200); do grep -q "$2" "$1" && return 0; sleep 0.1; done; return 1; }
# Ends the boot with the verdict, after the gadget's log.
verdict() {
  sed 's/^/gadget: /' /tmp/gadget.log
  echo "tpuhal-verdict $rc"
  /edu_test exit $rc
  poweroff -f
}

# The loopback baseline's gadget: the kernel's source/sink on the second controller.
g=/sys/kernel/config/usb_gadget/lb
mkdir -p $g/functions/SourceSink.0 $g/configs/c.1
echo 0x1209 > $g/idVendor; echo 0x0003 > $g/idProduct
echo 2 > $g/functions/SourceSink.0/pattern              # no data checks
echo 65536 > $g/functions/SourceSink.0/bulk_buflen      # requests as large as the board's
ln -s $g/functions/SourceSink.0 $g/configs/c.1/
udcs=$(ls /sys/class/udc)
echo $udcs | cut -d' ' -f2 > $g/UDC || fail "cannot bind the source/sink gadget"

/tpuhal-usb-gadget --loader --udc $(echo $udcs | cut -d' ' -f1) > /tmp/gadget.log 2>&1 &
gadget=$!
if ! await /tmp/gadget.log 'bound to'; then
  fail "tpuhal-usb-gadget did not start"
  verdict
fi

step "firmware upload"
/usb_guest_test --gtest_filter='UsbGuest.TheLoader*' || fail "firmware upload"
step "conformance suite on the usb: device"
listed=$(/hal_conformance --gtest_list_tests --gtest_filter='*/usb_*-*usb_sim*' | grep -c usb_ || true)
[ "$listed" -gt 0 ] || fail "the conformance suite lists no test of a usb: device"
/hal_conformance --gtest_filter='*/usb_*-*usb_sim*' || fail "conformance"
step "a driver killed mid-transfer, then the board opened again"
# What the killed driver left queued on the board's side must not reach
# the next one: opening resets the link before reading anything.
dev=$(/tpuhal list | grep -o 'usb:[0-9][0-9.-]*' | head -1)
/usb_guest_test --gtest_also_run_disabled_tests --gtest_filter='UsbGuest.DISABLED_CopiesToTheHostUntilKilled' \
  > /tmp/victim 2>&1 &
victim=$!
await /tmp/victim 'copying to the host' || fail "the driver to be killed did not start copying: $(tail -3 /tmp/victim)"
sleep 1
kill -KILL $victim
wait $victim 2>/dev/null || true
/tpuhal info $dev > /tmp/info 2>&1 || fail "the board did not open after its driver was killed: $(tail -3 /tmp/info)"
step "unbinding the gadget mid-transfer"
/usb_guest_test --gtest_filter='UsbGuest.Unbinding*' || fail "unbinding"
if [ "$bench" = 1 ]; then
  step "benchmarks"
  dev=$(/tpuhal list | grep -o 'usb:[0-9][0-9.-]*' | head -1)
  # The loopback runs just before and just after the board's DMA figures, and
  # its mean is the baseline: the emulated machine's speed drifts.
  busy() { awk '/^cpu / {print $2+$3+$4+$7+$8, $2+$3+$4+$5+$6+$7+$8}' /proc/stat; }
  /usb_loopback_bench 1209:0003 256 > /tmp/lb1 || fail "loopback baseline"
  b0=$(busy)
  /tpuhal bench dma --device $dev --quick > /tmp/dma || fail "bench dma"
  b1=$(busy)
  /usb_loopback_bench 1209:0003 256 > /tmp/lb2 || fail "loopback baseline"
  cat /tmp/lb1 /tmp/dma /tmp/lb2
  echo "$b0 $b1" | awk '{printf "guest CPUs busy during bench dma: %.0f%%\n", 100 * ($3 - $1) / ($4 - $2)}'
  # "... OUT 148.7 MB/s, IN 155.7 MB/s"; the 16 MiB dma lines in GB/s.
  cat /tmp/lb1 /tmp/lb2 /tmp/dma | awk '
    /loopback/ { for (i = 1; i <= NF; i++) { if ($i == "OUT") out += $(i + 1) / 2; if ($i == "IN") in_ += $(i + 1) / 2 } }
    /dma bytes=16777216 direction=h2d/ { h2d = $4 * 1000 }
    /dma bytes=16777216 direction=d2h/ { d2h = $4 * 1000 }
    END { if (out > 0 && in_ > 0) printf "bulk DMA / libusb loopback (16 MiB copies; target 0.8): h2d %.0f / %.0f MB/s = %.2f, d2h %.0f / %.0f MB/s = %.2f\n", h2d, out, h2d / out, d2h, in_, d2h / in_ }'
  /tpuhal bench submit --device $dev --quick || fail "bench submit"
else
  step "benchmarks skipped (TPUHAL_QEMU_BENCH=1 runs them)"
fi

step "done"
kill -TERM $gadget
for i in $(seq 300); do kill -0 $gadget 2>/dev/null || break; sleep 0.1; done
kill -0 $gadget 2>/dev/null && { fail "tpuhal-usb-gadget did not stop within 30 s of SIGTERM"; kill -KILL $gadget; }
wait $gadget || fail "tpuhal-usb-gadget exited with $?"
verdict
EOF
sed -i "s/^bench=@BENCH@$/bench=$bench/" "$root/init"
chmod +x "$root/init"
guest_initrd "$root" "$work/initrd.gz"

log="$cache/usb.log"
start=$SECONDS
rc=0
timeout --kill-after=5 "$boot_timeout" "$qemu" -machine q35 -accel tcg -cpu max -m 4096 -smp 2 \
  -nographic -no-reboot -monitor none -serial stdio \
  -kernel "$vmlinuz" -initrd "$work/initrd.gz" \
  -append "console=ttyS0 quiet loglevel=3 panic=-1" \
  -device isa-debug-exit,iobase=0xf4,iosize=0x04 </dev/null >"$log" 2>&1 || rc=$?
# What the guest printed, less its colours, blank lines, gtest's RUN and OK
# lines and the gadget's two lines per session (all of them stay in $log):
# every step, and a failure with what came before it.
sed 's/\x1b\[[0-9;?]*[A-Za-z]//g; s/\x1bc//g' "$log" |
  grep -avE '^\[ *(RUN|OK) |^gadget: .*: session [0-9]+ (started|ended)|^\s*$' || true
grep -a '^guest: FAIL' "$log" || true  # again, last
case $rc in
  1) echo "usb: pass ($((SECONDS - start)) s)"; exit 0 ;;
  124 | 137) echo "usb: FAIL: no verdict within ${boot_timeout} s (log: $log)" ;;
  3) echo "usb: FAIL: the guest test failed (log: $log)" ;;
  *) echo "usb: FAIL: QEMU exited with $rc and no verdict (log: $log)" ;;
esac
exit 1
