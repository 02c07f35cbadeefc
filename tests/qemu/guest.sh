# Shared by the QEMU guest tests (run.sh, usb_run.sh): sourced, not run.
# A small Linux guest: the kernel from Debian's kernel package (the one
# linux-image-amd64 depends on), downloaded with apt-get into a cache the
# first time and unpacked there, never installed; an initramfs of static
# busybox, kernel modules and test programs with their shared libraries.
# The guest reports its verdict through QEMU's isa-debug-exit port
# (`edu_test exit N`: QEMU exits with 1 for pass, 3 for fail).

# guest_tools: QEMU, static busybox and cpio, or exit 77 (skip) / 1.
guest_tools() {
  qemu=$(command -v qemu-system-x86_64 || true)
  if [[ -z $qemu ]]; then
    echo "SKIP: qemu-system-x86_64 is not installed (apt-get install qemu-system-x86 busybox-static cpio, or scripts/setup.sh)"
    exit 77
  fi
  busybox=/bin/busybox
  if [[ ! -x $busybox ]] || ldd "$busybox" >/dev/null 2>&1; then
    echo "FAIL: $busybox is missing or not statically linked (install busybox-static)"
    exit 1
  fi
  command -v cpio >/dev/null || { echo "FAIL: cpio is not installed"; exit 1; }
}

# guest_kernel CACHE: sets vmlinuz and moddir (the modules' kernel/ tree).
guest_kernel() {
  local cache=$1
  mkdir -p "$cache"
  cache=$(cd "$cache" && pwd)
  local kernel_root="$cache/kernel"
  if ! compgen -G "$kernel_root/boot/vmlinuz-*" >/dev/null; then
    local pkg
    pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
    [[ -n $pkg ]] || { echo "FAIL: apt-cache knows no kernel package behind linux-image-amd64"; exit 1; }
    echo "fetching $pkg into $cache"
    rm -rf "$cache/download" && mkdir -p "$cache/download"
    (cd "$cache/download" && apt-get download "$pkg" >/dev/null 2>&1) ||
      { echo "FAIL: apt-get download $pkg failed (no network or apt lists?)"; exit 1; }
    rm -rf "$kernel_root.tmp" && dpkg -x "$cache"/download/*.deb "$kernel_root.tmp"
    rm -rf "$kernel_root" && mv "$kernel_root.tmp" "$kernel_root" && rm -rf "$cache/download"
  fi
  vmlinuz=$(ls "$kernel_root"/boot/vmlinuz-* | head -1)
  moddir=$(ls -d "$kernel_root"/lib/modules/* | head -1)/kernel
}

# guest_setup CACHE: the tools and the kernel (guest_tools, guest_kernel),
# then a scratch directory removed on exit ($work) holding an initramfs
# tree with busybox ($root); makes $cache absolute.
guest_setup() {
  guest_tools
  guest_kernel "$1"
  cache=$(cd "$1" && pwd)
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  root="$work/root"
  mkdir -p "$root"/{bin,dev,proc,sys,tmp,lib/modules}
  cp "$busybox" "$root/bin/busybox"
}

# guest_modules ROOT PATH...: kernel modules (paths under kernel/, no .ko),
# uncompressed (busybox insmod loads uncompressed modules only).
guest_modules() {
  local root=$1 m src dst
  shift
  for m in "$@"; do
    src="$moddir/$m.ko" dst="$root/lib/modules/$(basename "$m").ko"
    if [[ -f $src ]]; then
      cp "$src" "$dst"
    elif [[ -f $src.xz ]] && command -v xz >/dev/null; then
      xz -dc "$src.xz" > "$dst"
    elif [[ -f $src.zst ]] && command -v zstd >/dev/null; then
      zstd -qdc "$src.zst" > "$dst"
    else
      echo "FAIL: the kernel package has no $m.ko (nor a .ko.xz/.ko.zst this machine can unpack)"
      exit 1
    fi
  done
}

# guest_programs ROOT BINARY...: programs at the root, and the shared
# libraries they need at the paths the loader looks for them.
guest_programs() {
  local root=$1 bin lib
  shift
  for bin in "$@"; do
    [[ -x $bin ]] || { echo "FAIL: $bin is not an executable"; exit 1; }
    cp "$bin" "$root/$(basename "$bin")"
    while read -r lib; do
      [[ -e $root$lib ]] && continue
      mkdir -p "$root$(dirname "$lib")"
      cp -L "$lib" "$root$lib"
    done < <(ldd "$bin" | grep -oE '/[^ ]+' | sort -u)
  done
}

# guest_initrd ROOT OUT: packs the tree.
guest_initrd() {
  (cd "$1" && find . | cpio -o -H newc --quiet | gzip -1) > "$2"
}
