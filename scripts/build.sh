#!/usr/bin/env bash
# Installs dependencies (scripts/setup.sh), then configures and builds stowage on the
# LibTorch that STOWAGE_LIBTORCH picks (scripts/libtorch.sh: Debian's 1.13.1 by default,
# or PyPI's 2.11.0 wheel), in ${STOWAGE_BUILD_DIR:-build or build-wheel}. Extra arguments
# go to CMake's configure step.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

bash "$root/scripts/setup.sh"
source "$root/scripts/libtorch.sh"
build=${STOWAGE_BUILD_DIR:-$libtorch_build}

source "$root/scripts/ccache.sh"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE="${STOWAGE_BUILD_TYPE:-Release}" "${launcher[@]}" \
  "${torch_args[@]}" "$@"
# LibTorch translation units need ~1.5 GiB each: 2 jobs fit any machine we run on.
cmake --build "$build" --parallel "${STOWAGE_JOBS:-2}"
