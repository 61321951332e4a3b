#!/usr/bin/env bash
# The main job from a fresh Debian 12 machine: set-up, build, then run stowage.
# With no arguments it runs the default job, in a run directory of its own under runs/
# (a run directory belongs to one run); otherwise the arguments go to stowage.
# STOWAGE_LIBTORCH=wheel runs it on PyPI's LibTorch 2.11.0 instead of Debian's 1.13.1.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bash "$root/scripts/build.sh" >&2
source "$root/scripts/libtorch.sh" >&2
build=${STOWAGE_BUILD_DIR:-$libtorch_build}
if [ $# -eq 0 ]; then set -- train --run-dir "runs/$(date +%Y%m%d-%H%M%S)"; fi
exec "$build/stowage" "$@"
