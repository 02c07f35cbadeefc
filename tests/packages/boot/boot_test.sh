#!/bin/sh
# Inside the Debian root booted by systemd-nspawn, with tpuhal's packages
# installed: the units as systemd itself runs them. Writes "ok" or
# "FAILED: why" to /var/tmp/tpuhal-boot-test/result, then powers off.
set -u
dir=/var/tmp/tpuhal-boot-test
sock=/run/tpuhal/simd.sock
finish() {
    echo "$1" >"$dir/result"
    systemctl --no-block poweroff
    exit 0
}
fail() { finish "FAILED: $*"; }
as() { user=$1; shift; setpriv --reuid="$user" --regid="$user" --init-groups env TPUHAL_LOG=error "$@"; }
# Waits up to a minute for a command to succeed (a condition, not a delay).
until_ok() { i=0; while ! "$@" >/dev/null 2>&1; do i=$((i + 1)); [ $i -lt 600 ] || return 1; sleep 0.1; done; }

systemctl is-active --quiet tpuhal-simd.socket || fail "tpuhal-simd.socket is not listening: $(systemctl status tpuhal-simd.socket 2>&1)"
systemctl is-active --quiet tpuhal-simd.service && fail "the daemon runs before its first client"
mode=$(stat -c '%U:%G %a' "$sock")
[ "$mode" = "root:tpuhal 660" ] || fail "systemd made $sock $mode, not root:tpuhal 660"

# A member of tpuhal: the first client starts the daemon, as its own user.
as alice env TPUHAL_SIMD=$sock tpuhal list | grep -q "^simd:$sock#0 " ||
    fail "alice (group tpuhal) does not see the daemon's board: $(journalctl -u tpuhal-simd.service 2>&1 | tail -5)"
systemctl is-active --quiet tpuhal-simd.service || fail "the first client did not start tpuhal-simd.service"
pid=$(systemctl show -p MainPID --value tpuhal-simd.service)
[ "$(awk '/^Uid:/ {print $2}' "/proc/$pid/status")" = "$(id -u tpuhal-simd)" ] || fail "the daemon does not run as tpuhal-simd"
as alice tpuhal demo --size 1MiB --device "simd:$sock#0" >/dev/null || fail "a copy through the daemon's board"

# Another user: refused by the socket's mode.
out=$(as mallory env TPUHAL_SIMD=$sock tpuhal info "simd:$sock#0" 2>&1) && fail "mallory (not in tpuhal) opened the board"
echo "$out" | grep -qi 'permission denied' || fail "mallory was refused without saying why: $out"

# Stopped, the daemon leaves its socket to systemd, and the next client
# starts it again.
systemctl stop tpuhal-simd.service
systemctl is-active --quiet tpuhal-simd.socket || fail "stopping the daemon stopped its socket"
as alice env TPUHAL_SIMD=$sock tpuhal list | grep -q "^simd:$sock#0 " || fail "the daemon did not start again"

# The exporter: a dynamic user in tpuhal, watching the daemon's board.
systemctl start tpuhal-exporter.service || fail "tpuhal-exporter.service: $(systemctl status tpuhal-exporter.service 2>&1)"
metrics() { python3 -c 'import urllib.request; print(urllib.request.urlopen("http://127.0.0.1:9841/metrics", timeout=5).read().decode())'; }
until_ok metrics || fail "the exporter does not answer on 127.0.0.1:9841: $(journalctl -u tpuhal-exporter.service 2>&1 | tail -5)"
metrics | grep -q "simd:$sock#0" || fail "the exporter's metrics do not name the daemon's board"
finish ok
