#!/usr/bin/env bash
# The check run on the GPU machine that is sometimes lent (DEVELOPERS.md), in two halves.
#
#   bash scripts/device_check.sh prepare
#     Here. Gathers what that machine lacks (it has Python's torch, cmake, ninja and nvcc,
#     and no Debian -dev packages): the header-only nlohmann-json, CLI11 and xxhash, gloo's
#     headers (c10d's Gloo header includes them; the torch wheel does not ship them) and
#     googletest's sources, from this machine's Debian packages, into .cache/device-deps
#     (ignored by git, a few MiB). fmt comes from the torch wheel's own headers. Then
#     configures a build against the project's torch wheel with only those, as the GPU
#     machine will, so that a missing piece shows here.
#
#   bash scripts/device_check.sh run          (device run: carry [".cache/device-deps"])
#     There. Configures against python3's torch, builds with 16 jobs, runs the device tests
#     (tests/device), the seed suites on CUDA tensors and `stowage train` on cuda:0, and the
#     three benchmarks on cuda:0. JSON and logs go to $OUT (default: device-check-out/);
#     each stage has a time limit so that the whole stays inside 8 minutes and what ran is
#     always written.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
deps=$root/.cache/device-deps

prepare() {
  set -e
  bash "$root/scripts/setup.sh"
  rm -rf "$deps"
  mkdir -p "$deps/include"
  cp -r /usr/include/nlohmann /usr/include/CLI /usr/include/gloo "$deps/include/"
  cp /usr/include/xxhash.h "$deps/include/"
  cp -r /usr/include/liburing.h /usr/include/liburing "$deps/include/"
  mkdir -p "$deps/lib" && cp /usr/lib/x86_64-linux-gnu/liburing.a "$deps/lib/"
  cp -r /usr/src/googletest "$deps/googletest"
  echo "device_check: gathered $(du -sh "$deps" | cut -f1) into $deps"
  local python_env
  python_env=$(bash "$root/scripts/python_env.sh")
  local build=$root/build-device-prepare
  mkdir -p "$build"
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$("$python_env/bin/python" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')" \
    -DSTOWAGE_DEPS_DIR="$deps" -DSTOWAGE_PYTHON="$python_env/bin/python" -DCMAKE_IGNORE_PREFIX_PATH=/usr \
    >"$build/configure.log" 2>&1 || { tail -n 40 "$build/configure.log"; exit 1; }
  echo "device_check: a configure with only the gathered dependencies succeeded (build-device-prepare/)"
}

# Runs one stage under a time limit, its output into $out/<name>.log; says how it ended.
stage() {
  local name=$1 limit=$2
  shift 2
  local start=$SECONDS
  timeout "$limit" "$@" >"$out/$name.log" 2>&1
  local status=$?
  echo "device_check: $name: exit $status in $((SECONDS - start)) s" | tee -a "$out/summary.txt"
  return $status
}

run() {
  out=${OUT:-$root/device-check-out}
  mkdir -p "$out"
  [ -d "$deps" ] || { echo "device_check: $deps is missing: run 'prepare' here and carry it" >&2; exit 1; }
  local build=$root/build-device
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$out/gpu.txt" 2>&1
  python3 -c 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.is_available())' >>"$out/gpu.txt" 2>&1
  stage configure 120 cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$(python3 -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')" \
    -DSTOWAGE_DEPS_DIR="$deps" -DSTOWAGE_PYTHON="$(command -v python3)" -DTORCH_CUDA_ARCH_LIST=9.0 \
    -DSTOWAGE_BUILD_EXAMPLES=OFF || return 1
  stage build 300 cmake --build "$build" --parallel 16 --target device_tests dcp_tests activation_tests stowage_cli stowage_bench_cli ||
    { tail -n 60 "$out/build.log"; return 1; }
  stage device_tests 60 "$build/tests/device_tests" --gtest_output="json:$out/device_tests.json"
  stage seed_suites 60 bash -c "'$build/tests/dcp_tests' --gtest_filter='DcpSeed000.*' && \
    '$build/tests/activation_tests' --gtest_filter='Checkpoint.*:IsTensorLike.*:Sequential*'"
  stage train 60 "$build/stowage" train --device cuda:0 --steps 60 --run-dir "$build/device-run"
  stage bench_swap 60 bash -c "'$build/stowage' bench swap --device cuda:0 --json >'$out/bench_swap.json'"
  stage bench_swap_disk 90 bash -c \
    "'$build/stowage' bench swap --tier disk --device cuda:0 --dir '$build' --json >'$out/bench_swap_disk.json'"
  stage bench_dcp 60 bash -c "'$build/stowage' bench dcp --device cuda:0 --size-mib 1024 --json >'$out/bench_dcp.json'"
  stage bench_activation 60 bash -c \
    "'$build/stowage' bench activation --device cuda:0 --batch 16384 --json >'$out/bench_activation.json'"
  cat "$out/summary.txt"
}

case "${1:-}" in
  prepare) prepare ;;
  run) run ;;
  *) echo "usage: $0 prepare|run" >&2; exit 2 ;;
esac
