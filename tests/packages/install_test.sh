#!/usr/bin/env bash
# The Debian packages as a user meets them (docs/packages.md): in a fresh
# Debian 12 root made by debootstrap, `apt-get install ./*.deb`, then
#   - tpuhal --version and tpuhal list;
#   - a consumer program built with CMake (find_package) and with pkg-config;
#   - import tpuhal in Python, a round trip through a board;
#   - gst-inspect-1.0 tpuhaldec;
#   - systemd-analyze verify on the units;
#   - the simulator daemon as its socket unit runs it: started on the first
#     client, as its own user, a member of the group tpuhal let in and
#     another user kept out; with systemd-socket-activate, then (where
#     systemd-nspawn can boot the root) under systemd itself, with the
#     exporter's service;
# then `apt-get purge` and a check that no file of the packages is left.
#
#   tests/packages/install_test.sh DEBS_DIR
#
# Needs root (debootstrap, chroot, mounts) and the apt mirror. The root is
# made once per run (TPUHAL_DEBOOTSTRAP_ROOT keeps one to reuse) and the
# host's downloaded packages are shared with it.
set -euo pipefail
debs=$(realpath "$1")
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source_dir=$(cd "$here/../.." && pwd)
say() { echo "packages test: $*" >&2; }
fail() {
  say "FAILED: $*"
  exit 1
}
[[ $(id -u) -eq 0 ]] || fail "needs root (debootstrap, chroot and mounts)"
compgen -G "$debs/*.deb" >/dev/null || fail "no .deb files in $debs"

keep=${TPUHAL_DEBOOTSTRAP_ROOT:-}
root=${keep:-$(mktemp -d /tmp/tpuhal-debian-root-XXXXXX)}
mounts=()
cleanup() {
  for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do umount -l "${mounts[i]}" 2>/dev/null || true; done
  [[ -n $keep ]] || rm -rf --one-file-system "$root"
}
trap cleanup EXIT

source "$source_dir/scripts/lib/debian-root.bash"
if [[ ! -x $root/usr/bin/apt-get ]]; then
  debian_root "$root" || fail "a fresh Debian root"
fi
bind() {
  mkdir -p "$root$2"
  mount --bind "$1" "$root$2"
  mounts+=("$root$2")
}
# What chroot's commands need of the host; unmounted while systemd-nspawn
# runs the root, which mounts its own.
mount_host() {
  mount -t proc proc "$root/proc" && mounts+=("$root/proc")
  bind /dev /dev
  bind /dev/pts /dev/pts
  bind /var/cache/apt/archives /var/cache/apt/archives
}
unmount_host() {
  for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do umount -l "${mounts[i]}"; done
  mounts=()
}
mount_host
in_root() { chroot "$root" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 "$@"; }
apt_in_root() { in_root env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 -o Dpkg::Use-Pty=0 -qq "$@"; }

apt_in_root update
# What the checks use, installed before the snapshot the removal is
# compared with: a compiler, CMake and pkg-config for the consumers,
# GStreamer's tools, systemd for systemd-analyze and systemd-socket-activate,
# man for systemd-analyze's check of the units' manual pages.
apt_in_root install -y --no-install-recommends g++ cmake make pkg-config gstreamer1.0-tools systemd passwd man-db \
  >/dev/null
snapshot() {
  # Every file and link, but state that apt, dpkg, the checks' users and
  # a boot keep (systemd's timer stamps), and the backups of /etc's account
  # files (passwd-, group-, ...) that adduser's tools write.
  in_root find / -xdev \( -path /proc -o -path /dev -o -path /tmp -o -path /root -o -path /home \
    -o -path /var/cache -o -path /var/lib/apt -o -path /var/lib/dpkg -o -path /var/log -o -path /run \
    -o -path /var/lib/systemd/timers \) -prune \
    -o \( -type f -o -type l \) -print | grep -v -E '^/etc/(passwd|group|shadow|gshadow|subuid|subgid)-$' | sort
}
snapshot >"$root/tmp/before.txt"

say "apt-get install ./*.deb"
rm -rf "$root/tmp/debs" && mkdir -p "$root/tmp/debs"
cp "$debs"/*.deb "$root/tmp/debs/"
in_root sh -c 'cd /tmp/debs && DEBIAN_FRONTEND=noninteractive apt-get -o Dpkg::Use-Pty=0 -qq install -y --no-install-recommends ./*.deb' \
  >/dev/null || fail "apt-get install ./*.deb"
packages=$(for d in "$debs"/*.deb; do dpkg-deb -f "$d" Package; done | xargs)

say "tpuhal --version, tpuhal list"
version=$(in_root tpuhal --version) || fail "tpuhal --version"
echo "$version" >&2
grep -q '^libtpuhal ' <<<"$version" || fail "tpuhal --version names no library: $version"
# Read whole before it is searched: under pipefail, `| grep -q` fails when
# grep closes the pipe before the writer is done (SIGPIPE).
listed=$(in_root env TPUHAL_LOG=error tpuhal list) || fail "tpuhal list"
grep -q '^sim:0 ' <<<"$listed" || fail "tpuhal list shows no sim:0: $listed"

say "a consumer built with CMake and with pkg-config"
rm -rf "$root/tmp/consumer" && cp -r "$source_dir/tests/install/consumer" "$root/tmp/consumer"
in_root sh -c 'cmake -S /tmp/consumer -B /tmp/consumer/build >/dev/null && cmake --build /tmp/consumer/build >/dev/null &&
  /tmp/consumer/build/consumer && /tmp/consumer/build/consumer_c' || fail "the CMake consumer"
in_root sh -c 'c++ -std=c++20 /tmp/consumer/main.cpp $(pkg-config --cflags --libs tpuhal) -o /tmp/consumer/pc &&
  /tmp/consumer/pc' || fail "the pkg-config consumer"

say "import tpuhal"
in_root python3 -c '
import numpy as np, tpuhal
with tpuhal.open("sim:0") as dev:
    a = np.arange(1024, dtype=np.float32)
    assert (dev.upload(a).download() == a).all()
print("python: ok,", tpuhal.__version__)' || fail "import tpuhal"

say "gst-inspect-1.0 tpuhaldec"
in_root gst-inspect-1.0 tpuhaldec >"$root/tmp/inspect.txt" || fail "gst-inspect-1.0 tpuhaldec"
grep -q 'tpuhaldec' "$root/tmp/inspect.txt" || fail "gst-inspect-1.0 does not describe tpuhaldec"

say "systemd-analyze verify"
in_root systemd-analyze verify /lib/systemd/system/tpuhal-simd.socket /lib/systemd/system/tpuhal-simd.service \
  /lib/systemd/system/tpuhal-exporter.service || fail "systemd-analyze verify"
in_root sh -c 'test -L /etc/systemd/system/sockets.target.wants/tpuhal-simd.socket' ||
  fail "tpuhal-simd.socket is not enabled"
in_root getent passwd tpuhal-simd >/dev/null || fail "no user tpuhal-simd"

# systemd cannot run as PID 1 in a chroot: its tool for socket activation
# does what the socket unit says (ListenSequentialPacket=, then the group
# and mode that SocketGroup= and SocketMode= would set) and starts the
# service's command as its user when the first client connects.
say "the daemon, socket-activated"
in_root sh -c 'id alice >/dev/null 2>&1 || useradd -G tpuhal alice; id mallory >/dev/null 2>&1 || useradd mallory'
sock=/run/tpuhal/simd.sock
in_root mkdir -p /run/tpuhal
rm -f "$root/tmp/simd.log" "$root$sock"
exec_start=$(sed -n 's/^ExecStart=//p' "$root/lib/systemd/system/tpuhal-simd.service" | sed 's/ *\$TPUHAL_SIMD_OPTS//')
user=$(sed -n 's/^User=//p' "$root/lib/systemd/system/tpuhal-simd.service")
group=$(sed -n 's/^Group=//p' "$root/lib/systemd/system/tpuhal-simd.service")
# shellcheck disable=SC2086
(exec chroot "$root" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin systemd-socket-activate --seqpacket -l "$sock" \
  setpriv --reuid="$user" --regid="$group" --init-groups $exec_start --board tiny) >"$root/tmp/simd.log" 2>&1 &
daemon=$!  # the activator, then (each one exec's the next) the daemon
for _ in $(seq 1 600); do grep -q '^Listening on' "$root/tmp/simd.log" && break; sleep 0.1; done
[[ -S $root$sock ]] || { cat "$root/tmp/simd.log" >&2; fail "no socket at $sock"; }
in_root chgrp "$(sed -n 's/^SocketGroup=//p' "$root/lib/systemd/system/tpuhal-simd.socket")" "$sock"
in_root chmod "$(sed -n 's/^SocketMode=//p' "$root/lib/systemd/system/tpuhal-simd.socket")" "$sock"
grep -q serving "$root/tmp/simd.log" && fail "the daemon started before its first client"
in_root setpriv --reuid=alice --regid=alice --init-groups env TPUHAL_SIMD=$sock TPUHAL_LOG=error tpuhal list |
  grep -q "^simd:$sock#0 " || { cat "$root/tmp/simd.log" >&2; fail "alice (group tpuhal) does not see the daemon's board"; }
grep -q "serving 1 board" "$root/tmp/simd.log" || fail "the daemon did not start on the first client"
[[ $(awk '/^Uid:/ {print $2}' "/proc/$daemon/status") == $(in_root id -u "$user") ]] ||
  fail "the daemon does not run as $user"
mallory=$(in_root setpriv --reuid=mallory --regid=mallory --init-groups env TPUHAL_SIMD=$sock TPUHAL_LOG=error \
  tpuhal info "simd:$sock#0" 2>&1) && fail "mallory (not in tpuhal) opened the daemon's board"
grep -q -i 'permission denied' <<<"$mallory" || fail "mallory was kept out without saying why: $mallory"
kill "$daemon"
wait "$daemon" || fail "the daemon did not stop cleanly on SIGTERM: $(cat "$root/tmp/simd.log")"

# Then systemd itself, where it can boot the root as a container
# (systemd-nspawn): the socket unit listening as root:tpuhal 0660, the
# service started by the first client as tpuhal-simd, stopped and started
# again, the exporter's service watching the daemon's board
# (tests/packages/boot/boot_test.sh says what exactly). Where systemd-nspawn
# cannot run a container, the test says so and goes on.
boot_dir=/var/tmp/tpuhal-boot-test
unmount_host
if systemd-nspawn -q --register=no --keep-unit --private-network -D "$root" --pipe /bin/true >"$root/tmp/nspawn.log" 2>&1
then
  say "the units under systemd (systemd-nspawn --boot)"
  rm -rf "$root$boot_dir" && mkdir -p "$root$boot_dir"
  cp "$here/boot/boot_test.sh" "$root$boot_dir/"
  cp "$here/boot/tpuhal-boot-test.service" "$root/etc/systemd/system/"
  ln -sf /etc/systemd/system/tpuhal-boot-test.service "$root/etc/systemd/system/multi-user.target.wants/"
  # The exporter would be the first client at boot; the test starts it later.
  rm -f "$root/etc/systemd/system/multi-user.target.wants/tpuhal-exporter.service"
  timeout 300 systemd-nspawn -q --register=no --keep-unit --private-network --console=passive -D "$root" --boot \
    >"$root/tmp/nspawn.log" 2>&1 || true
  mount_host
  result=$(cat "$root$boot_dir/result" 2>/dev/null || echo "no result (the container did not run the test)")
  [[ $result == ok ]] || {
    cat "$root$boot_dir/log" "$root/tmp/nspawn.log" >&2 2>/dev/null
    fail "under systemd: $result"
  }
  rm -rf "$root$boot_dir" "$root/etc/systemd/system/tpuhal-boot-test.service" \
    "$root/etc/systemd/system/multi-user.target.wants/tpuhal-boot-test.service"
  ln -s /lib/systemd/system/tpuhal-exporter.service "$root/etc/systemd/system/multi-user.target.wants/"
else
  mount_host
  say "systemd cannot boot the root here (systemd-nspawn: $(tail -n 1 "$root/tmp/nspawn.log")): the units were checked by systemd-analyze and systemd-socket-activate only"
fi
in_root userdel alice
in_root userdel mallory

say "apt-get purge"
# shellcheck disable=SC2086
apt_in_root purge -y $packages >/dev/null || fail "apt-get purge"
# The dependencies they brought go too, recommended by others or not.
apt_in_root -o APT::AutoRemove::RecommendsImportant=false -o APT::AutoRemove::SuggestsImportant=false \
  autoremove --purge -y >/dev/null
rm -rf "$root/run/tpuhal" "$root/tmp/consumer" "$root/tmp/debs"
snapshot >"$root/tmp/after.txt"
# New files that a package still installed owns are that package's (a
# dependency apt keeps); the rest would be ours. (/lib, /bin and /sbin are
# /usr's on Debian 12.)
cat "$root"/var/lib/dpkg/info/*.list | sed -E 's#^/(lib|lib64|bin|sbin)/#/usr/\1/#' | sort -u >"$root/tmp/owned.txt"
left=$(comm -13 "$root/tmp/before.txt" "$root/tmp/after.txt" | comm -23 - "$root/tmp/owned.txt")
[[ -z $left ]] || fail "files left after removing the packages:
$left"
say "ok ($packages)"
