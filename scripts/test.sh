#!/usr/bin/env bash
# The whole test suite from a fresh Debian 12 machine: set-up, build, ctest; then, unless
# ctest arguments were given or STOWAGE_TEST_EXTRA=0, the reliability passes
# (docs/reliability.md): the ASan + UBSan build of the dcp, reliability, activation and
# optim suites, and bounded fuzzing.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${STOWAGE_BUILD_DIR:-$root/build}
bash "$root/scripts/build.sh"
(cd "$build" && ctest --output-on-failure --parallel "${STOWAGE_JOBS:-2}" "$@")
if [ $# -eq 0 ] && [ "${STOWAGE_TEST_EXTRA:-1}" != 0 ]; then
  bash "$root/scripts/sanitize.sh" dcp reliability activation optim
  bash "$root/scripts/fuzz.sh" 30
fi
