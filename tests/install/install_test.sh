#!/usr/bin/env bash
# Installs the build tree into a temporary prefix, then configures, builds and runs a
# consumer project that finds it with find_package(stowage).
set -euo pipefail
source_dir=$1
binary_dir=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$binary_dir" --prefix "$work/prefix" >/dev/null
cmake -S "$source_dir/tests/install/consumer" -B "$work/build" -G Ninja \
  -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/build" >/dev/null
"$work/build/consumer" | grep -q " ok$"
echo "consumer built against the installed stowage and ran"
