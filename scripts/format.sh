#!/usr/bin/env bash
# Formats every C++ file in git with the project's .clang-format (Debian's clang-format-14):
#   bash scripts/format.sh          rewrites the files
#   bash scripts/format.sh --check  changes nothing; fails listing the files that differ
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash scripts/setup.sh
mapfile -t files < <(git ls-files '*.cpp' '*.h' '*.hpp' '*.cc')
if [ "${1:-}" = --check ]; then
  clang-format-14 --style=file --dry-run --Werror "${files[@]}"
  echo "format: ${#files[@]} files as .clang-format says"
else
  clang-format-14 --style=file -i "${files[@]}"
fi
