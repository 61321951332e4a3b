#!/usr/bin/env bash
# Configures the sanitizers' build, builds the named targets in it (its output on stderr)
# and prints the build's folder:
#   build=$(bash scripts/sanitize_build.sh TARGET...)
# STOWAGE_SANITIZE picks the sanitizers:
#  - address,undefined (default): clang 14 in ${STOWAGE_SANITIZE_BUILD_DIR:-build-asan}, with
#    the fuzzers of fuzz/ (STOWAGE_FUZZ), so that the sanitized suites (scripts/sanitize.sh)
#    and the fuzzers (scripts/fuzz.sh) share one compilation of the library;
#  - thread: gcc in ${STOWAGE_SANITIZE_BUILD_DIR:-build-tsan}, as its suppressions were made.
# STOWAGE_SANITIZE_MODULES limits the library to the modules the targets need (e.g.
# "dcp;dist;state;memory"), which halves a cold build.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
sanitizers=${STOWAGE_SANITIZE:-address,undefined}
if [ "$sanitizers" = thread ]; then
  build=${STOWAGE_SANITIZE_BUILD_DIR:-$root/build-tsan} compiler=g++ fuzz=OFF
else
  build=${STOWAGE_SANITIZE_BUILD_DIR:-$root/build-asan} compiler=clang++-14 fuzz=ON
fi

bash "$root/scripts/setup.sh" >&2
source "$root/scripts/ccache.sh"
# A folder configured with another compiler (build-asan was gcc's before 2026-12-06) starts
# afresh: CMake cannot change the compiler of a configured folder.
compiler_path=$(command -v "$compiler")
if [ -f "$build/CMakeCache.txt" ] && ! grep -qx "CMAKE_CXX_COMPILER:[A-Z]*=$compiler_path" "$build/CMakeCache.txt"; then
  rm -rf "$build"
fi
# -O1, the level the sanitizers' manuals advise, and line tables only, all a report's stack
# needs: a cold build took about half the time of -O2 -g's (a library batch: 41 -> 21 s).
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_CXX_COMPILER="$compiler_path" -DCMAKE_BUILD_TYPE=RelWithDebInfo "${launcher[@]}" \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" -DSTOWAGE_SANITIZE="$sanitizers" -DSTOWAGE_FUZZ=$fuzz \
  -DSTOWAGE_MODULES="${STOWAGE_SANITIZE_MODULES:-}" -DSTOWAGE_BUILD_BENCH=OFF -DSTOWAGE_BUILD_TOOLS=OFF \
  -DSTOWAGE_BUILD_EXAMPLES=OFF >/dev/null
cmake --build "$build" --parallel "${STOWAGE_JOBS:-2}" --target "$@" >&2
echo "$build"
