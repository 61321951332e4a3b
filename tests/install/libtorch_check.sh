# shellcheck shell=bash
# Sourced by the install tests. expect_libtorch BINARY EXPECTED_LIBTORCH: with no
# environment set, BINARY loads EXPECTED_LIBTORCH (the one stowage was built against), and
# every libtorch* and libc10* it loads lies beside it: none is another LibTorch's
# (Debian's in /usr/lib, say, for a build on a pip wheel).
expect_libtorch() {
  local binary=$1 expected libraries loaded path
  expected=$(readlink -f "$2")
  libraries=$(env -i PATH=/usr/bin:/bin ldd "$binary")
  loaded=$(awk '$1 ~ /^libtorch\.so/ { print $3 }' <<<"$libraries")
  if [ -z "$loaded" ] || [ "$(readlink -f "$loaded")" != "$expected" ]; then
    echo "FAIL: $binary loads libtorch from '${loaded:-nowhere}', not $expected" >&2
    echo "$libraries" >&2
    return 1
  fi
  while read -r path; do
    if [ "$(dirname "$(readlink -f "$path")")" != "$(dirname "$expected")" ]; then
      echo "FAIL: $binary loads $path, not the one beside $expected" >&2
      echo "$libraries" >&2
      return 1
    fi
  done < <(awk '$1 ~ /^lib(torch|c10)/ { print $3 }' <<<"$libraries")
}
