#!/usr/bin/env bash
# Installs dependencies (scripts/setup.sh), then configures and builds stowage in
# ${STOWAGE_BUILD_DIR:-build}. Extra arguments go to CMake's configure step.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${STOWAGE_BUILD_DIR:-$root/build}

bash "$root/scripts/setup.sh"

# ccache makes rebuilds and CI runs on a warm machine fast; the sloppiness settings
# let it cache translation units that use the precompiled header.
launcher=()
if command -v ccache >/dev/null; then
  export CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
  export CCACHE_BASEDIR="$root"
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE="${STOWAGE_BUILD_TYPE:-Release}" "${launcher[@]}" "$@"
# LibTorch translation units need ~1.5 GiB each: 2 jobs fit any machine we run on.
cmake --build "$build" --parallel "${STOWAGE_JOBS:-2}"
