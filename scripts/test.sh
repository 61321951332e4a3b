#!/usr/bin/env bash
# The whole test suite from a fresh Debian 12 machine, on both LibTorchs: for each of
# Debian's 1.13.1 and PyPI's 2.11.0 wheel (a CUDA build, here on the CPU) set-up, build and
# ctest; then, unless ctest arguments were given or STOWAGE_TEST_EXTRA=0, the reliability
# passes (docs/reliability.md) on Debian's: the format check (scripts/format.sh), the
# tidy check (scripts/tidy.sh: clang-tidy-14 over the whole tree), the ASan + UBSan
# build of the dcp, interop, reliability, activation and optim suites, and bounded fuzzing.
# STOWAGE_LIBTORCH=debian or =wheel tests on that one only.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# Each LibTorch has its own build folder (scripts/libtorch.sh); one given folder can't serve both.
unset STOWAGE_BUILD_DIR
libtorchs=(debian wheel)
# Each step's wall time, so that a slow run (CI's limit is 90 minutes) shows where it went.
timed() {
  local step=$1 start=$SECONDS
  shift
  "$@"
  echo "test: $step took $((SECONDS - start)) s"
}
if [ -n "${STOWAGE_LIBTORCH:-}" ]; then libtorchs=("$STOWAGE_LIBTORCH"); fi

for libtorch in "${libtorchs[@]}"; do
  echo "test: LibTorch '$libtorch'"
  STOWAGE_LIBTORCH=$libtorch timed "$libtorch build" bash "$root/scripts/build.sh"
  build=$(STOWAGE_LIBTORCH=$libtorch; source "$root/scripts/libtorch.sh"; echo "$libtorch_build")
  timed "$libtorch ctest" ctest --test-dir "$build" --output-on-failure --parallel "${STOWAGE_JOBS:-2}" "$@"
done
if [ $# -eq 0 ] && [ "${STOWAGE_TEST_EXTRA:-1}" != 0 ] && [[ " ${libtorchs[*]} " == *" debian "* ]]; then
  timed format bash "$root/scripts/format.sh" --check
  timed tidy bash "$root/scripts/tidy.sh"
  timed sanitize bash "$root/scripts/sanitize.sh" dcp interop reliability activation optim
  timed fuzz bash "$root/scripts/fuzz.sh" 30
fi
