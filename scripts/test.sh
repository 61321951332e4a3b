#!/usr/bin/env bash
# The whole test suite from a fresh Debian 12 machine, on both LibTorchs: for each of
# Debian's 1.13.1 and PyPI's 2.11.0 wheel (a CUDA build, here on the CPU) set-up, build and
# ctest; then, unless ctest arguments were given or STOWAGE_TEST_EXTRA=0, the reliability
# passes (docs/reliability.md) on Debian's: the format check (scripts/format.sh), the
# tidy check (scripts/tidy.sh: clang-tidy-14 over the whole tree), the ASan + UBSan
# build of the dcp, interop, reliability, activation and optim suites, and bounded fuzzing.
# STOWAGE_LIBTORCH=debian or =wheel tests on that one only.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# Each LibTorch has its own build folder (scripts/libtorch.sh); one given folder can't serve both.
unset STOWAGE_BUILD_DIR
libtorchs=(debian wheel)
# Each step's budget in seconds: its time in a cold run (a fresh clone on a fresh 2-core
# machine, no caches: docs/reliability.md, "CI"), with a margin. A step over its budget is
# flagged when it ends and in the summary, so that a slow run shows which step made it
# slow; it does not fail the run (CI's own limit, 90 minutes, does). A warm run (ccache,
# the tidy cache and the Python environment kept) takes far less than these.
# Figures marked ~ are estimates: half the CPU-seconds measured, step by step, on the two
# cores (docs/reliability.md, "CI", "Shorter cold steps").
declare -A budget=(
  ["debian build"]=560  # apt set-up, then the cold build: 552 s (2026-12-06, stop 52, batches of 8; 16 since: -53 s)
  ["debian ctest"]=260  # one process a suite: 257 s; 229 s (2026-12-06, stop 52)
  ["python env"]=60     # what is left of it once Debian's build is done: 0 s (170 s alone)
  ["wheel build"]=600   # the cold build: 558 s; 576 s (2026-12-06, stop 52, batches of 8)
  ["wheel ctest"]=360   # one process a suite: 351 s; 326 s (2026-12-06, stop 52)
  [format]=10           # 2 s
  [tidy]=420            # the whole tree in 13 joined units, nothing remembered: 358 s (2026-12-06)
  [sanitize]=400        # clang's ASan + UBSan build at -O1 -g1 (the fuzzers' too) and its five suites: 339 s (2026-12-06)
  [fuzz]=90             # the fuzzers' link in the sanitizers' build, then the three at once for 45 s: 56 s (2026-12-06)
)
steps=()
declare -A took=()
summary() {
  local step total=0 total_budget=0 over=0
  echo "test: step times against their budgets (scripts/test.sh):"
  for step in "${steps[@]}"; do
    printf 'test:   %-14s %5d s of %5d s%s\n' "$step" "${took[$step]}" "${budget[$step]}" \
      "$([ "${took[$step]}" -gt "${budget[$step]}" ] && echo "  OVER BUDGET")"
    total=$((total + took[$step])) total_budget=$((total_budget + budget[$step]))
    if [ "${took[$step]}" -gt "${budget[$step]}" ]; then over=$((over + 1)); fi
  done
  echo "test:   total $total s of $total_budget s; $over step(s) over budget"
}
# At exit: the summary, and no Python environment left being made (an unfinished one has no
# stamp, so python_env.sh repairs it next time).
finish() {
  summary
  if [ -n "${python_env_pid:-}" ]; then kill "$python_env_pid" 2>/dev/null || true; fi
  rm -f "${python_env_log:-}"
}
trap finish EXIT
# Runs a step and says its wall time against its budget (a failed step too: it ends the run).
timed() {
  local step=$1 start=$SECONDS status=0
  shift
  "$@" || status=$?
  took[$step]=$((SECONDS - start))
  steps+=("$step")
  if [ "${took[$step]}" -gt "${budget[$step]}" ]; then
    echo "test: $step took ${took[$step]} s: OVER BUDGET (${budget[$step]} s)"
  else
    echo "test: $step took ${took[$step]} s (budget ${budget[$step]} s)"
  fi
  return $status
}
if [ -n "${STOWAGE_LIBTORCH:-}" ]; then libtorchs=("$STOWAGE_LIBTORCH"); fi

# The wheel's Python environment (scripts/python_env.sh: ~170 s cold, most of it fetching
# 4.7 GB) is made while Debian's LibTorch builds, which keeps both cores busy meanwhile.
python_env_log=$(mktemp)
if [[ " ${libtorchs[*]} " == *" wheel "* ]]; then
  bash "$root/scripts/setup.sh"
  bash "$root/scripts/python_env.sh" >"$python_env_log" 2>&1 &
  python_env_pid=$!
fi
# REQUIRES: python_env.sh was started above.
wait_for_python_env() {
  if ! wait "$python_env_pid"; then
    cat "$python_env_log" >&2
    echo "test: the Python environment (scripts/python_env.sh) failed" >&2
    return 1
  fi
}

for libtorch in "${libtorchs[@]}"; do
  echo "test: LibTorch '$libtorch'"
  if [ "$libtorch" = wheel ]; then timed "python env" wait_for_python_env; fi
  STOWAGE_LIBTORCH=$libtorch timed "$libtorch build" bash "$root/scripts/build.sh"
  build=$(STOWAGE_LIBTORCH=$libtorch; source "$root/scripts/libtorch.sh"; echo "$libtorch_build")
  timed "$libtorch ctest" ctest --test-dir "$build" --output-on-failure --parallel "${STOWAGE_JOBS:-2}" "$@"
done
if [ $# -eq 0 ] && [ "${STOWAGE_TEST_EXTRA:-1}" != 0 ] && [[ " ${libtorchs[*]} " == *" debian "* ]]; then
  timed format bash "$root/scripts/format.sh" --check
  timed tidy bash "$root/scripts/tidy.sh"
  timed sanitize bash "$root/scripts/sanitize.sh" dcp interop reliability activation optim
  timed fuzz bash "$root/scripts/fuzz.sh" 30
fi
