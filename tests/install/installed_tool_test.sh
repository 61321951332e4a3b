#!/usr/bin/env bash
# The installed tool starts with no environment set (its RUNPATH finds the LibTorch it was
# built against, and that LibTorch's own libraries): `--version`, then two ranks of a small
# training run under its own `launch`, which join one process group over c10d.
#   installed_tool_test.sh PREFIX LIBTORCH
set -euo pipefail
prefix=$1
libtorch=$2
# shellcheck source=tests/install/libtorch_check.sh
source "$(dirname "$0")/libtorch_check.sh"
stowage=$prefix/bin/stowage
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
clean_env=(env -i PATH=/usr/bin:/bin HOME="$HOME")

fail() {
  echo "FAIL: $1" >&2
  cat "$work/log" >&2
  readelf -d "$stowage" | grep -E 'R(UN)?PATH' >&2 || echo "$stowage has no RPATH or RUNPATH" >&2
  exit 1
}

"${clean_env[@]}" "$stowage" --version >"$work/log" 2>&1 || fail "$stowage --version"
grep -q "^stowage " "$work/log" || fail "$stowage --version printed no version"
expect_libtorch "$stowage" "$libtorch"

"${clean_env[@]}" "$stowage" launch --nproc 2 -- "$stowage" train --run-dir "$work/run" --steps 2 \
  --layers 2 --width 64 --heads 2 --batch 8 --seq-len 32 --threads 1 >"$work/log" 2>&1 ||
  fail "$stowage launch --nproc 2 -- $stowage train"
grep -q "data-parallel over 2 ranks" "$work/log" || fail "launch --nproc 2 did not train over 2 ranks"
echo "the installed stowage ran with no environment set: --version, and launch --nproc 2 -- stowage train"
