#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/) in the sanitizers' build (scripts/sanitize_build.sh:
# clang, ASan + UBSan) and runs them at once for a bounded time, each on a scratch copy of
# its seed corpus:
#   bash scripts/fuzz.sh [SECONDS_PER_TARGET]     (default 45: each target's share of two cores)
# Fails on a crash, a leak, a hang (-timeout), or an allocation over -malloc_limit_mb.
# Execution counts go to STOWAGE_RELIABILITY_FIGURES when set.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
seconds=${1:-45}
build=$(STOWAGE_SANITIZE=address,undefined bash "$root/scripts/sanitize_build.sh" metadata_fuzzer reader_fuzzer \
  torch_dcp_metadata_fuzzer)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
export LSAN_OPTIONS=suppressions=$root/scripts/sanitizers/lsan.supp
# The three run at once, each for SECONDS_PER_TARGET * 3 / 2 of wall time: on two cores that
# is the CPU time each had when they ran one after another, in half the wall time.
targets=(metadata reader torch_dcp_metadata)
wall_seconds=$((seconds * 3 / 2))
declare -A pid_of=()
for target in "${targets[@]}"; do
  mkdir -p "$work/$target"
  # New inputs go to the scratch corpus; the committed seeds are only read.
  "$build/fuzz/${target}_fuzzer" -max_total_time="$wall_seconds" -timeout=10 -rss_limit_mb=2048 \
    -malloc_limit_mb=512 -print_final_stats=1 "$work/$target" "$root/fuzz/corpus/$target" \
    >"$work/$target.log" 2>&1 &
  pid_of[$target]=$!
done
status=0
for target in "${targets[@]}"; do
  target_status=0
  wait "${pid_of[$target]}" || target_status=$?
  if [ "$target_status" -ne 0 ]; then
    status=1
    tail -n 60 "$work/$target.log"
  fi
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$work/$target.log" | grep -o '[0-9]*$' || echo 0)
  echo "fuzz: ${target}_fuzzer ran $runs inputs in ${wall_seconds} s beside the others (status $target_status)"
  if [ -n "${STOWAGE_RELIABILITY_FIGURES:-}" ]; then
    echo "fuzz.${target}.executions ${runs:-0}" >>"$STOWAGE_RELIABILITY_FIGURES"
    echo "fuzz.${target}.seconds $wall_seconds" >>"$STOWAGE_RELIABILITY_FIGURES"
  fi
done
exit $status
