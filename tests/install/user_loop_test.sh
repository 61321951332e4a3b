#!/usr/bin/env bash
# examples/user_loop.cpp, a user's own BatchNorm/Dropout model and loop on train::Trainer,
# built against the installed package and run as a user would: SIGTERM in the middle of
# a run (it saves the step it is on and exits 75), then --resume, ends bit-identical to
# a run never stopped (parameters and buffers: the example prints their hash), on one
# rank and on two under the installed `stowage launch`. On the simulated device (a
# LibTorch 2.x build) it runs in a capacity that plain AdamW exceeds.
#   user_loop_test.sh SOURCE_DIR PREFIX [CUDA_COMPILER]
set -euo pipefail
source_dir=$1
prefix=$2
cuda_args=()
if [ -n "${3:-}" ]; then cuda_args=(-DCMAKE_CUDA_COMPILER="$3"); fi
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
fail() {
  echo "FAIL: $1" >&2
  cat "$work/log" >&2 2>/dev/null || true
  exit 1
}

cmake -S "$source_dir/tests/install/user_loop" -B "$work/build" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" \
  -DEXAMPLE_SOURCE="$source_dir/examples/user_loop.cpp" "${cuda_args[@]}" >"$work/log" 2>&1 || fail "configure"
cmake --build "$work/build" >"$work/log" 2>&1 || fail "build"
example=$work/build/user_loop
stowage=$prefix/bin/stowage
clean_env=(env -i PATH=/usr/bin:/bin HOME="$HOME" OMP_NUM_THREADS=1)

device=cpu
if grep -q "stowage::sim" "$prefix"/lib*/cmake/stowage/*.cmake 2>/dev/null; then
  # 3.2 M parameters: 12.6 MiB each of weights and gradients, 25 MiB of AdamW's state.
  device=sim
  clean_env+=(STOWAGE_SIM_CAPACITY=46MiB)
  if "${clean_env[@]}" "$example" "$work/plain" --device sim --swap-times 0 --steps 3 >"$work/log" 2>&1; then
    fail "plain AdamW trained in 46 MiB: the capacity proves nothing"
  fi
  grep -qi "out of memory" "$work/log" || fail "plain AdamW failed, but not for memory"
fi

# state_of RUN_LOG: the "step N state H" line the example ends with.
state_of() { grep -E "^step [0-9]+ state [0-9]+$" "$1" | tail -1; }

# run_preempted NAME LAUNCHER...: starts the example, SIGTERMs it once step 8 is logged,
# expects status 75, resumes it to the end, and prints its final state.
run_preempted() {
  local name=$1
  shift
  "${clean_env[@]}" "$@" "$example" "$work/$name" --device "$device" >"$work/log" 2>&1 &
  local pid=$!
  for _ in $(seq 600); do
    grep -qE '"step":(8|9|[1-9][0-9])[,}]' "$work/$name/metrics.jsonl" 2>/dev/null && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -TERM "$pid" 2>/dev/null || fail "$name ended before it could be preempted"
  local status=0
  wait "$pid" || status=$?
  [ "$status" = 75 ] || fail "$name: SIGTERM gave status $status, not 75"
  grep -q "preempted by SIGTERM" "$work/log" || fail "$name: no preemption report"
  "${clean_env[@]}" "$@" "$example" "$work/$name" --device "$device" --resume >"$work/log" 2>&1 ||
    fail "$name: the resume failed"
  grep -q "resume: from" "$work/log" || fail "$name: did not resume from a checkpoint"
  state_of "$work/log"
}

for ranks in 1 2; do
  launcher=()
  if [ "$ranks" = 2 ]; then launcher=("$stowage" launch --nproc 2 --); fi
  "${clean_env[@]}" "${launcher[@]}" "$example" "$work/whole-$ranks" --device "$device" >"$work/log" 2>&1 ||
    fail "$ranks rank(s): the uninterrupted run failed"
  whole=$(state_of "$work/log")
  [ -n "$whole" ] || fail "$ranks rank(s): the run printed no state"
  resumed=$(run_preempted "stopped-$ranks" "${launcher[@]}")
  [ "$whole" = "$resumed" ] || fail "$ranks rank(s) on $device: resumed '$resumed', uninterrupted '$whole'"
  echo "$ranks rank(s) on $device: SIGTERM and --resume ended bit-identical ($whole)"
done
