#!/usr/bin/env bash
# Installs dependencies (scripts/setup.sh), then configures and builds stowage in
# ${STOWAGE_BUILD_DIR:-build}. Extra arguments go to CMake's configure step.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${STOWAGE_BUILD_DIR:-$root/build}

bash "$root/scripts/setup.sh"

source "$root/scripts/ccache.sh"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE="${STOWAGE_BUILD_TYPE:-Release}" "${launcher[@]}" "$@"
# LibTorch translation units need ~1.5 GiB each: 2 jobs fit any machine we run on.
cmake --build "$build" --parallel "${STOWAGE_JOBS:-2}"
