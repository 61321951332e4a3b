#!/usr/bin/env bash
# A third LibTorch, on demand (not in CI): builds and tests this tree in a Debian 13
# ("trixie") chroot against its libtorch-dev 2.6 (CPU only, built without libuv) with GCC
# 14, as a user of Debian's next release would.
#   bash scripts/test_debian13.sh [--prepare] [CTEST_ARGS...]
# --prepare stops once the chroot and its packages are there.
# The chroot is made once with debootstrap, from the Debian mirror this machine's apt
# sources name, under ${STOWAGE_CACHE_DIR:-~/.cache/stowage}/debian13 (about 3 GB with the
# build), and reused; the checkout is bind-mounted into it read-write at /stowage and
# builds into build-debian13/. Needs root (debootstrap, mount, chroot).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
prepare_only=0
if [ "${1:-}" = --prepare ]; then prepare_only=1; shift; fi
chroot_dir=${STOWAGE_CACHE_DIR:-$HOME/.cache/stowage}/debian13
mirror=$(sed -n 's/^URIs: *\(http[^ ]*debian\)$/\1/p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -n 1)
mirror=${mirror:-http://deb.debian.org/debian}

if [ "$(id -u)" -ne 0 ]; then
  echo "test_debian13: needs root for debootstrap, mount and chroot" >&2
  exit 1
fi
command -v debootstrap >/dev/null || { apt-get update -qq && apt-get install -y -qq debootstrap; }

if [ ! -f "$chroot_dir/.stowage-complete" ]; then
  echo "test_debian13: making the trixie chroot in $chroot_dir from $mirror"
  rm -rf "$chroot_dir"
  debootstrap --variant=minbase trixie "$chroot_dir" "$mirror"
  touch "$chroot_dir/.stowage-complete"
fi

mounts=()
unmount_all() {
  for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do umount -l "${mounts[$i]}" 2>/dev/null || true; done
}
trap unmount_all EXIT
bind() {
  mkdir -p "$chroot_dir$2"
  mount --bind "$1" "$chroot_dir$2"
  mounts+=("$chroot_dir$2")
}
bind /proc /proc
bind /sys /sys
bind /dev /dev
bind /dev/pts /dev/pts
mkdir -p "$chroot_dir/dev/shm"
mount -t tmpfs tmpfs "$chroot_dir/dev/shm"
mounts+=("$chroot_dir/dev/shm")
bind "$root" /stowage
cp /etc/resolv.conf "$chroot_dir/etc/resolv.conf"

# scripts/setup.sh installs the same package names there (Debian 13's versions), less the
# reliability passes' clang: those passes stay on Debian 12's build.
in_chroot() {
  chroot "$chroot_dir" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
    STOWAGE_BUILD_DIR=/stowage/build-debian13 STOWAGE_TEST_EXTRA=0 CCACHE_DIR=/root/.ccache "$@"
}
in_chroot bash /stowage/scripts/setup.sh
if [ $prepare_only = 1 ]; then exit 0; fi
in_chroot bash -c 'cd /stowage && bash scripts/build.sh && cd build-debian13 &&
                   ctest --output-on-failure --parallel 2 "$@"' test_debian13 "$@"
