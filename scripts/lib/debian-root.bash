# Sourced by scripts/image.sh and tests/packages/install_test.sh.
#
#   debian_root DIR
#
# Makes DIR a fresh Debian 12 (bookworm) root: a copy of TPUHAL_DEBIAN_BASE
# where that names one (scripts/package.sh --test debootstraps once per run
# and shares it), else `debootstrap --variant=minbase` from the mirror this
# host's apt uses. Then gives it the host's apt sources (its security and
# updates suites too) and resolver. Needs root.
debian_root() {
  local dir=$1 mirror
  if [[ -n ${TPUHAL_DEBIAN_BASE:-} ]]; then
    cp -a "$TPUHAL_DEBIAN_BASE/." "$dir/"
  else
    mirror=$(sed -n 's/^URIs: *\([^ ]*\).*/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -n1)
    [[ -n $mirror ]] || mirror=$(awk '$1 == "deb" {print $2; exit}' /etc/apt/sources.list 2>/dev/null)
    mirror=${mirror:-http://deb.debian.org/debian}
    echo "tpuhal: debootstrap bookworm from $mirror into $dir" >&2
    debootstrap --variant=minbase bookworm "$dir" "$mirror" >"$dir.debootstrap.log" 2>&1 ||
      { cat "$dir.debootstrap.log" >&2; rm -f "$dir.debootstrap.log"; return 1; }
    rm -f "$dir.debootstrap.log"
  fi
  chmod 0755 "$dir"  # a root directory every user may enter, as /
  rm -f "$dir/etc/apt/sources.list"
  cp -a /etc/apt/sources.list* "$dir/etc/apt/" 2>/dev/null || true
  cp /etc/resolv.conf "$dir/etc/resolv.conf"
}
