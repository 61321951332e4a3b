#!/usr/bin/env bash
# The main job from a fresh Debian 12 machine: set-up, build, then run stowage.
# With no arguments it runs the default job; otherwise the arguments go to stowage.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${STOWAGE_BUILD_DIR:-$root/build}
bash "$root/scripts/build.sh" >&2
if [ $# -eq 0 ]; then set -- train; fi
exec "$build/stowage" "$@"
