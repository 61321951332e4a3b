#!/usr/bin/env bash
# Long mode of the crash-consistency trials (tests/reliability/crash_test.cpp):
#   bash scripts/crash_trials.sh [--trials N] [--seed S]
# Builds, then kills N saving children (default 500) at random moments and checks every
# checkpoint left behind; then N/5 two-rank jobs saving into the memory tier
# (memory_tier_crash_test.cpp), each killed whole, half of them losing a node too. Figures go to STOWAGE_RELIABILITY_FIGURES when set.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${STOWAGE_BUILD_DIR:-$root/build}
trials=500
seed=8
while [ $# -gt 0 ]; do
  case "$1" in
    --trials) trials=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    *) echo "usage: $0 [--trials N] [--seed S]" >&2; exit 2 ;;
  esac
done
bash "$root/scripts/build.sh" >&2
STOWAGE_CRASH_TRIALS=$trials STOWAGE_MEMORY_CRASH_TRIALS=$((trials / 5)) STOWAGE_CRASH_SEED=$seed \
  "$build/tests/reliability_tests" --gtest_filter='CrashConsistency.*'
