#!/usr/bin/env bash
# Runs clang-tidy (Debian's clang-tidy-14, the checks of .clang-tidy) over stowage's C++ and
# fails on any finding:
#   bash scripts/tidy.sh          every compiled source: the build's unity batches, plus fuzz/
#   bash scripts/tidy.sh FILE...  the named files only, each as its own translation unit
# The compile commands come from a configure-only build folder on Debian's LibTorch,
# ${STOWAGE_TIDY_BUILD_DIR:-build-tidy}, without the precompiled header (gcc's, which clang
# can't read). A unit costs ~40 s of LibTorch's headers whatever its size, so the whole
# tree is checked in units of CMake's unity batches joined (scripts/tidy_db.py). Findings
# are reported at the source's own file and line; the project's headers are checked
# wherever a unit includes them.
# STOWAGE_JOBS clang-tidy processes run at once (default 2).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash scripts/setup.sh
build=${STOWAGE_TIDY_BUILD_DIR:-$root/build-tidy}
STOWAGE_LIBTORCH=debian
source scripts/libtorch.sh
# Configuring writes compile_commands.json and, with the unity build on, the batch files
# (CMakeFiles/<target>.dir/Unity/unity_<n>_cxx.cxx); nothing is compiled.
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "${torch_args[@]}" \
  -DSTOWAGE_UNITY_BUILD=ON -DCMAKE_EXPORT_COMPILE_COMMANDS=ON -DCMAKE_DISABLE_PRECOMPILE_HEADERS=ON >/dev/null

# The compilation database clang-tidy reads (scripts/tidy_db.py): the whole tree's, in units
# of batches joined, or one entry per named file.
db=$build/tidy
rm -rf "$db"
mkdir -p "$db"
python3 scripts/tidy_db.py "$root" "$build/compile_commands.json" "$db" "$@"

# Findings in the project's own files only, at their sources' lines (scripts/tidy_run.py).
# Units found clean are remembered beside ccache's cache, so that a clone (CI's) checks
# again only the units whose preprocessed text changed.
if ! python3 scripts/tidy_run.py "$root" "$db" "${STOWAGE_JOBS:-2}" \
  "${STOWAGE_CACHE_DIR:-$HOME/.cache/stowage}/tidy"; then
  echo "tidy: findings above (.clang-tidy holds the checks)" >&2
  exit 1
fi
