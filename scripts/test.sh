#!/usr/bin/env bash
# The whole test suite from a fresh Debian 12 machine: set-up, build, ctest.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${STOWAGE_BUILD_DIR:-$root/build}
bash "$root/scripts/build.sh"
cd "$build"
ctest --output-on-failure --parallel "${STOWAGE_JOBS:-2}" "$@"
