#!/usr/bin/env bash
# Builds the simulator service image (docs/packages.md#the-simulator-service-image):
# a Debian 12 root made by debootstrap from this host's apt mirror
# (scripts/lib/debian-root.bash; TPUHAL_DEBIAN_BASE: a copy of one), with
# the tpuhal-simd, libtpuhal0 and tpuhal-tools packages that
# scripts/package.sh made installed by apt, imported into podman. No
# registry is used. Without --video the image has no FFmpeg, and its boards
# no video decoder (libtpuhal0 only recommends FFmpeg: the daemon's log says
# what is missing); --video installs what libtpuhal0 recommends.
#
#   scripts/image.sh [--packages DIR] [--tag NAME] [--output FILE] [--video]
#
#   --packages DIR  the .deb files (default: build/packages)
#   --tag NAME      the image's name (default: localhost/tpuhal-simd:VERSION,
#                   with --video localhost/tpuhal-simd:VERSION-video)
#   --output FILE   also write the image as an OCI archive (podman save)
#   --video         boards that decode video: FFmpeg in the image (about
#                   200 MB more)
#
# Needs root (debootstrap, chroot).
set -euo pipefail
root_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
packages="$root_dir/build/packages"
tag='' output='' video=0
while (($#)); do
  case $1 in
    --packages) packages=$(realpath "$2"); shift ;;
    --tag) tag=$2; shift ;;
    --output) output=$(realpath -m "$2"); shift ;;
    --video) video=1 ;;
    -h | --help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "tpuhal image: unknown argument $1 (--help)" >&2; exit 2 ;;
  esac
  shift
done
say() { echo "tpuhal image: $*" >&2; }
[[ $(id -u) -eq 0 ]] || { say "needs root (debootstrap, chroot)"; exit 1; }
debs=()
for p in tpuhal-simd libtpuhal0 tpuhal-tools; do
  f=$(compgen -G "$packages/${p}_*.deb" | head -n1) || { say "no ${p}_*.deb in $packages (scripts/package.sh)"; exit 1; }
  debs+=("$f")
done
version=$(dpkg-deb -f "${debs[0]}" Version)
# With --video, the libraries libtpuhal0 recommends (FFmpeg's), by name.
extra='' suffix=''
if ((video)); then
  extra=$(dpkg-deb -f "${debs[1]}" Recommends | tr ',' '\n' | sed 's/(.*)//; s/ //g' | tr '\n' ' ')
  suffix=-video
fi
tag=${tag:-localhost/tpuhal-simd:$version$suffix}

work=$(mktemp -d /tmp/tpuhal-image-XXXXXX)
chmod 0755 "$work"
mounts=()
cleanup() {
  for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do umount -l "${mounts[i]}" 2>/dev/null || true; done
  rm -rf --one-file-system "$work"
}
trap cleanup EXIT
root="$work/root"
mkdir "$root"
source "$root_dir/scripts/lib/debian-root.bash"
debian_root "$root"
# Documentation, manual pages and translations stay out of the image, in
# what is installed into it (and later, as in Debian's slim images), and
# are removed from what debootstrap unpacked below.
mkdir -p "$root/etc/dpkg/dpkg.cfg.d"
cat >"$root/etc/dpkg/dpkg.cfg.d/excludes" <<'EOF'
path-exclude=/usr/share/doc/*
path-include=/usr/share/doc/*/copyright
path-exclude=/usr/share/man/*
path-exclude=/usr/share/info/*
path-exclude=/usr/share/locale/*
path-include=/usr/share/locale/locale.alias
path-exclude=/usr/share/lintian/*
EOF
mount -t proc proc "$root/proc" && mounts+=("$root/proc")
mkdir -p "$root/var/cache/apt/archives"
mount --bind /var/cache/apt/archives "$root/var/cache/apt/archives" && mounts+=("$root/var/cache/apt/archives")
mkdir -p "$root/tmp/debs"
cp "${debs[@]}" "$root/tmp/debs/"
say "apt-get install ${debs[*]##*/}"
chroot "$root" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive sh -c \
  "apt-get -qq update && cd /tmp/debs && apt-get -qq install -y --no-install-recommends ./*.deb $extra" \
  >"$work/apt.log" 2>&1 ||
  { cat "$work/apt.log" >&2; exit 1; }
# The daemon's socket folder, for a volume: the daemon's user makes the
# socket there, members of the group tpuhal may use it.
mkdir -p "$root/run/tpuhal"
chroot "$root" chown tpuhal-simd:tpuhal /run/tpuhal
for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do umount -l "${mounts[i]}"; done
mounts=()
# What debootstrap unpacked, and what apt keeps.
find "$root/usr/share/doc" -mindepth 1 ! -name copyright ! -type d -delete
find "$root/usr/share/doc" -mindepth 1 -type d -empty -delete
rm -rf "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/usr/share/lintian
find "$root/usr/share/locale" -mindepth 1 -maxdepth 1 ! -name locale.alias -exec rm -rf {} +
rm -rf "$root/tmp/debs" "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb \
  "$root"/var/log/* "$root/etc/resolv.conf" "$root/etc/machine-id"
: >"$root/etc/resolv.conf"
say "podman import as $tag"
tar -C "$root" --numeric-owner -cf "$work/root.tar" .
podman import \
  --change 'ENTRYPOINT ["/usr/bin/tpuhal-simd"]' \
  --change 'CMD ["--socket", "/run/tpuhal/simd.sock", "--group", "tpuhal", "--mode", "0660"]' \
  --change 'USER tpuhal-simd' \
  --change 'VOLUME /run/tpuhal' \
  --change "LABEL org.opencontainers.image.title=tpuhal-simd org.opencontainers.image.version=$version" \
  "$work/root.tar" "$tag" >/dev/null
size=$(podman image inspect "$tag" --format '{{.Size}}')
# What a registry would store and a pull download: the layer, gzipped.
packed=$(gzip -6 -c "$work/root.tar" | wc -c)
say "$tag: $((size / 1000000)) MB ($((packed / 1000000)) MB gzipped)"
if [[ -n $output ]]; then
  rm -f "$output"
  podman save --format oci-archive -o "$output" "$tag"
  say "wrote $output"
fi
