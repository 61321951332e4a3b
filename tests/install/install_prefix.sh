#!/usr/bin/env bash
# Installs the build tree into PREFIX (emptied first), for the tests of the installed
# package to use: ctest's fixture stowage_installed (tests/CMakeLists.txt).
#   install_prefix.sh BINARY_DIR PREFIX
set -euo pipefail
binary_dir=$1
prefix=$2
rm -rf "$prefix"
cmake --install "$binary_dir" --prefix "$prefix" >/dev/null
echo "installed into $prefix"
