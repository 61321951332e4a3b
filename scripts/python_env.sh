#!/usr/bin/env bash
# Creates, or repairs, the Python virtual environment of stowage's second LibTorch: PyPI's
# torch wheel and the Python packages its tests use (scripts/python-requirements.txt).
#   bash scripts/python_env.sh        # prints the environment's folder
# It lives outside the checkout, keyed by the torch version, so that fresh clones (CI's
# among them) reuse the several GB instead of downloading them again:
#   ${STOWAGE_CACHE_DIR:-~/.cache/stowage}/torch-<version>
# A finished environment carries a stamp with the requirements' checksum. Without a
# matching stamp, or when torch no longer imports, pip repairs it in place; an environment
# whose Python itself no longer starts is recreated.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
requirements=$root/scripts/python-requirements.txt
version=$(sed -n 's/^torch==//p' "$requirements")
env_dir=${STOWAGE_CACHE_DIR:-$HOME/.cache/stowage}/torch-$version
stamp=$env_dir/.stowage-complete
wanted=$(sha256sum "$requirements" | cut -d' ' -f1)

healthy() {
  [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$wanted" ] &&
    "$env_dir/bin/python" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$version')" \
      >/dev/null 2>&1
}

install_into_env() {
  if ! "$env_dir/bin/python" -c "import sys" >/dev/null 2>&1; then
    rm -rf "$env_dir"
    python3 -m venv "$env_dir"
  fi
  "$env_dir/bin/python" -m pip install --quiet --disable-pip-version-check -r "$requirements"
}

if ! healthy; then
  echo "python_env: preparing $env_dir (torch $version from PyPI)" >&2
  rm -f "$stamp"
  install_into_env >&2
  echo "$wanted" >"$stamp"
  healthy || { echo "python_env: torch $version does not import from $env_dir" >&2; exit 1; }
fi
echo "$env_dir"
