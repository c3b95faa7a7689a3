#!/usr/bin/env bash
# rootfs.sh OUT.tar SUITE MIRROR PACKAGE...: a minimal Debian root filesystem for an aether image, as a tarball
# for `podman import` (build.sh calls it; the tarball's cache key includes this file's text).
#
# debootstrap --variant=minbase (dpkg, apt, coreutils, bash: no systemd, no docs) plus PACKAGE..., then Debian's
# CPython 3.11 is moved from /usr to /opt/aether/python: bin/python3.11 (the real binary), lib/python3.11 (the
# standard library), lib/python3.11/site-packages (empty; the image's packages go there) and lib/python3/dist-packages
# (a link to it, the directory Debian's site.py adds for that prefix). The interpreter finds its prefix from where
# the binary is, so the directory keeps working where the node's CNI installer copies it on the host
# (/opt/aether/<version>, run as `bin/python3 -I -S`). /usr/bin/python3 links to it for anything else in the image.
# dpkg still lists the Python files under /usr: the image is not meant to take further apt installs.
set -euo pipefail
out="$1" suite="$2" mirror="$3"
shift 3
packages="$(IFS=,; echo "$*")"
work="$(mktemp -d "$(dirname "$out")/.rootfs.XXXXXX")"
root="$work/root"
cleanup() {
  # debootstrap mounts /proc and /sys in the target while it installs; never delete through a mount
  for m in proc sys dev/pts dev; do mountpoint -q "$root/$m" 2>/dev/null && umount -l "$root/$m" || true; done
  rm -rf --one-file-system "$work"
}
trap cleanup EXIT

mkdir -p "${DEBOOTSTRAP_CACHE:?}"
if ! debootstrap --variant=minbase --include="$packages" --cache-dir="$DEBOOTSTRAP_CACHE" \
    "$suite" "$root" "$mirror" >"$work/debootstrap.log" 2>&1; then
  tail -n 40 "$work/debootstrap.log" >&2
  [ -f "$root/debootstrap/debootstrap.log" ] && tail -n 40 "$root/debootstrap/debootstrap.log" >&2
  echo "rootfs: debootstrap $suite from $mirror failed" >&2
  exit 1
fi

py="$root/opt/aether/python"
mkdir -p "$py/bin" "$py/lib/python3"
mv "$root/usr/lib/python3.11" "$py/lib/python3.11"
mv "$root/usr/bin/python3.11" "$py/bin/python3.11"
ln -s python3.11 "$py/bin/python3"
ln -s python3 "$py/bin/python"
mkdir -p "$py/lib/python3.11/site-packages"
ln -s ../python3.11/site-packages "$py/lib/python3/dist-packages"
ln -sf /opt/aether/python/bin/python3.11 "$root/usr/bin/python3.11"
ln -sf python3.11 "$root/usr/bin/python3"
# the standard library's bytecode again, so tracebacks name the files where they now are
find "$py/lib/python3.11" -name __pycache__ -prune -exec rm -rf {} +
chroot "$root" /opt/aether/python/bin/python3 -m compileall -q -j 0 /opt/aether/python/lib/python3.11 >/dev/null \
  || { echo "rootfs: compileall failed" >&2; exit 1; }
chroot "$root" /opt/aether/python/bin/python3 -I -S -c 'import sys; assert sys.prefix == "/opt/aether/python", sys.prefix'

# what a container never reads
rm -rf "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/usr/share/locale/* \
  "$root"/usr/share/lintian "$root"/var/cache/apt/* "$root"/var/lib/apt/lists/* "$root"/var/log/* \
  "$root"/var/cache/debconf/*-old "$root"/debootstrap "$root"/etc/resolv.conf "$root"/etc/hostname
tar --numeric-owner -C "$root" -cf "$out.tmp" .
mv "$out.tmp" "$out"
