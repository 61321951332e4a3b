#!/usr/bin/env bash
# Configures, builds and runs a consumer project that finds the installed stowage as a
# user's would, with find_package(stowage) and the install prefix on CMAKE_PREFIX_PATH,
# nothing said about LibTorch: the package's config finds the LibTorch stowage was built
# against (LIBTORCH, its libtorch.so), which the consumer must link and load, not another
# one on the usual paths (Debian's in /usr/lib, for a build on a pip wheel). A project
# that points Torch_DIR at another LibTorch is told so. A CUDA LibTorch's config also
# needs the build's nvcc (CUDA_COMPILER, empty otherwise).
#   install_test.sh SOURCE_DIR PREFIX LIBTORCH [CUDA_COMPILER]
set -euo pipefail
source_dir=$1
prefix=$2
libtorch=$3
cuda_args=()
if [ -n "${4:-}" ]; then cuda_args=(-DCMAKE_CUDA_COMPILER="$4"); fi
# shellcheck source=tests/install/libtorch_check.sh
source "$(dirname "$0")/libtorch_check.sh"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

cmake -S "$source_dir/tests/install/consumer" -B "$work/build" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" \
  "${cuda_args[@]}" >"$work/log" 2>&1 || { cat "$work/log" >&2; exit 1; }
cmake --build "$work/build" >"$work/log" 2>&1 || { cat "$work/log" >&2; exit 1; }
env -i PATH=/usr/bin:/bin "$work/build/consumer" | grep -q " ok$"
expect_libtorch "$work/build/consumer" "$libtorch"
echo "consumer built against the installed stowage, linked its LibTorch and ran"

# Another LibTorch's Torch_DIR (here a folder with none) is refused, naming both.
if cmake -S "$source_dir/tests/install/consumer" -B "$work/other" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" \
  -DTorch_DIR="$work" "${cuda_args[@]}" >"$work/log" 2>&1; then
  echo "FAIL: find_package(stowage) accepted Torch_DIR=$work, not the LibTorch stowage was built against" >&2
  exit 1
fi
grep -q "stowage was built against the" "$work/log" || { cat "$work/log" >&2; exit 1; }
echo "find_package(stowage) refused another LibTorch's Torch_DIR"
