#!/usr/bin/env bash
# Installs every build and test dependency of stowage from Debian 12 packages.
# Idempotent and quick when everything is already there; uses sudo only when not root.
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache pkg-config
  libtorch-dev libgloo-dev
  libsleef-dev  # ATen's vector headers include sleef.h (src/optim/fused_adam_kernel_loop.h)
  libopenblas0-openmp  # see choose_openmp_openblas
  libgtest-dev libgmock-dev libbenchmark-dev
  libcli11-dev nlohmann-json3-dev libfmt-dev libxxhash-dev
  e2fsprogs  # mkfs.ext4 for the EIO tests (tests/reliability/io_error_test.cpp)
  python3 python3-venv  # the torch wheel's environment (scripts/python_env.sh)
  clang-format-14  # scripts/format.sh
  clang-tidy-14  # scripts/tidy.sh (it brings clang-14, whose preprocessor keys tidy's cache)
  liburing-dev  # the swap optimizer's disk tier (src/optim/swap_file_io.cpp)
  python3-matplotlib  # the benchmark report's charts (bench/report/plot_report.py)
  chromium  # the benchmark report's browser test (tests/cli/report_test.cpp)
)
# The sanitizers' build of the reliability passes (scripts/sanitize_build.sh: clang, its
# ASan, UBSan and libFuzzer runtimes), unless they are off (STOWAGE_TEST_EXTRA=0, as in
# scripts/test_debian13.sh's newer Debian).
if [ "${STOWAGE_TEST_EXTRA:-1}" != 0 ]; then packages+=(clang-14 libclang-rt-14-dev); fi

sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi

# Debian's LibTorch runs its intra-op work on OpenMP (libgomp), and its BLAS must share
# that runtime: OpenBLAS's pthreads build spins threads of its own against OpenMP's on
# the same cores, and a step ran 2.5-4x slower (issue 37). When several OpenBLAS builds are
# installed, the OpenMP one is chosen for each library name it provides.
choose_openmp_openblas() {
  local dir=/usr/lib/x86_64-linux-gnu name
  for name in libblas.so.3 liblapack.so.3 libopenblas.so.0; do
    if [ "$(readlink -f "$dir/$name")" != "$(readlink -f "$dir/openblas-openmp/$name")" ]; then
      echo "setup: $name -> OpenBLAS's OpenMP build"
      "${sudo_cmd[@]}" update-alternatives --quiet --set "$name-x86_64-linux-gnu" "$dir/openblas-openmp/$name"
    fi
  done
}

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -ne 0 ]; then
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
choose_openmp_openblas
