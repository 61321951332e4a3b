#!/usr/bin/env bash
# Installs the build tree into a temporary prefix, then configures, builds and runs a
# consumer project that finds it with find_package(stowage), and the LibTorch the build
# used (its Torch_DIR, the third argument) as a user would point at it: the folder above
# Torch_DIR on CMAKE_PREFIX_PATH, as torch.utils.cmake_prefix_path gives it, so that
# TorchConfig's own find_package(Caffe2) finds the same LibTorch's, not the system's. A
# CUDA LibTorch's config also needs the build's nvcc (the fourth argument, empty otherwise).
set -euo pipefail
source_dir=$1
binary_dir=$2
torch_dir=$3
cuda_args=()
if [ -n "${4:-}" ]; then cuda_args=(-DCMAKE_CUDA_COMPILER="$4"); fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$binary_dir" --prefix "$work/prefix" >/dev/null
cmake -S "$source_dir/tests/install/consumer" -B "$work/build" -G Ninja \
  -DCMAKE_PREFIX_PATH="$work/prefix;$(dirname "$torch_dir")" -DTorch_DIR="$torch_dir" "${cuda_args[@]}" >/dev/null
cmake --build "$work/build" >/dev/null
"$work/build/consumer" | grep -q " ok$"
echo "consumer built against the installed stowage and ran"
