#!/usr/bin/env bash
# The simulator service image (scripts/image.sh) as a CI job uses it, in
# two containers: one runs the image as the daemon, its socket on a named
# volume; the other is given a board through CDI (a spec that `tpuhal cdi
# generate` wrote for the daemon's boards) and runs `tpuhal list` and a
# copy through the board (`tpuhal demo`). A container not given the board
# sees none. The image has no FFmpeg: its boards offer no video decoder, the
# daemon's log says why, and it weighs at most 150 MB. VIDEO_IMAGE, if
# given (scripts/image.sh --video), is the same with FFmpeg: its boards
# decode.
#
#   tests/packages/image_test.sh IMAGE [VIDEO_IMAGE]
#
# Needs root (podman reads CDI specs from /etc/cdi and /var/run/cdi).
set -euo pipefail
image=$1
video_image=${2:-}
say() { echo "image test: $*" >&2; }
fail() {
  say "FAILED: $*"
  exit 1
}
[[ $(id -u) -eq 0 ]] || fail "needs root (CDI specs live in /etc/cdi and /var/run/cdi)"
id=$$
volume=tpuhal-image-test-$id
daemon=tpuhal-image-test-$id
kind=test$id.tpuhal.dev/board
spec=/var/run/cdi/tpuhal-image-test-$id.json
cleanup() {
  podman rm -f -t 5 "$daemon" >/dev/null 2>&1 || true
  podman volume rm -f "$volume" >/dev/null 2>&1 || true
  rm -f "$spec"
}
trap cleanup EXIT
# Limits this host already grants: a container may not raise them.
run=(podman --runtime runc run --ulimit nofile=1024:1024 --ulimit nproc=1000:1000 --network=none)

podman volume create "$volume" >/dev/null
"${run[@]}" -d --name "$daemon" -v "$volume:/run/tpuhal" "$image" \
  --socket /run/tpuhal/simd.sock --group tpuhal --mode 0660 --board bm1684x --board tiny >/dev/null
# The log is read whole before it is searched: `podman logs | grep -q`
# under pipefail fails when grep, done at an early line, closes the pipe
# while podman still writes (SIGPIPE).
logs() { podman logs "$daemon" 2>&1 || true; }
for _ in $(seq 1 600); do
  grep -q 'serving 2 board' <<<"$(logs)" && break
  [[ $(podman inspect "$daemon" --format '{{.State.Running}}') == true ]] || break
  sleep 0.1
done
log=$(logs)
grep -q 'serving 2 board' <<<"$log" || fail "the daemon did not start: $log"
[[ $(podman inspect "$daemon" --format '{{.Config.User}}') == tpuhal-simd ]] || fail "the daemon does not run as tpuhal-simd"
grep -q "no video decoder: .*; install FFmpeg's" <<<"$log" ||
  fail "the daemon's log does not say why its boards decode no video: $log"

# The socket as the host sees it, in the volume.
sock=$(podman volume inspect "$volume" --format '{{.Mountpoint}}')/simd.sock
[[ -S $sock ]] || fail "no socket at $sock"
say "the daemon serves $sock"
# The spec, written by the image's own tpuhal, which reaches the socket by
# the host's path.
mkdir -p /var/run/cdi
"${run[@]}" --rm --user root -v "$sock:$sock" -e "TPUHAL_SIMD=$sock" -e TPUHAL_LOG=error --entrypoint tpuhal "$image" \
  cdi generate --kind "$kind" >"$spec.tmp" || fail "tpuhal cdi generate"
mv "$spec.tmp" "$spec"
grep -q "simd:$sock#1" "$spec" || fail "the spec names no board 1 of the daemon: $(cat "$spec")"

client=("${run[@]}" --rm --user root --device "$kind=1" -e TPUHAL_LOG=error --entrypoint tpuhal "$image")
listed=$("${client[@]}" list) || fail "tpuhal list in the client container"
say "the client container lists: $listed"
grep -q "^simd:$sock#1 " <<<"$listed" || fail "the client does not see board 1"
grep -q "^simd:$sock#0 " <<<"$listed" && fail "the client sees board 0, which it was not given"
"${client[@]}" demo --size 4MiB --device "simd:$sock#1" >/dev/null || fail "a copy through board 1 (tpuhal demo)"
info=$("${client[@]}" info --json "simd:$sock#1") || fail "tpuhal info in the client container"
grep -Eq '"video_decode": *false' <<<"$info" || fail "a board of the image without FFmpeg offers video decode: $info"
none=$("${run[@]}" --rm --user root -e TPUHAL_LOG=error -e "TPUHAL_SIMD=$sock" --entrypoint tpuhal "$image" list 2>&1) || true
grep -q "^simd:" <<<"$none" && fail "a container given no board sees one: $none"
size=$(podman image inspect "$image" --format '{{.Size}}')
((size <= 150000000)) || fail "$image weighs $((size / 1000000)) MB, more than 150 MB"
say "ok ($image, $((size / 1000000)) MB)"
if [[ -n $video_image ]]; then
  info=$("${run[@]}" --rm -e TPUHAL_LOG=error --entrypoint tpuhal "$video_image" info --json sim:0) ||
    fail "tpuhal info in $video_image"
  grep -Eq '"video_decode": *true' <<<"$info" || fail "a board of $video_image offers no video decode: $info"
  size=$(podman image inspect "$video_image" --format '{{.Size}}')
  say "ok ($video_image decodes video, $((size / 1000000)) MB)"
fi
