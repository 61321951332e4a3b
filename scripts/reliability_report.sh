#!/usr/bin/env bash
# Regenerates the figures of docs/reliability.md: runs the reliability suite with the
# long-mode counts (crash trials, corruption, full disk, real EIO), the fuzzers, every
# suite under ASan + UBSan and the threaded suites under TSan, and rewrites the table
# between the "figures" markers.
#   bash scripts/reliability_report.sh [--quick]
# --quick uses the CI counts (24 crash trials, 240 corruption trials, 30 s of fuzzing).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${STOWAGE_BUILD_DIR:-$root/build}
crash=500 corruption=3000 fuzz_seconds=120
if [ "${1:-}" = --quick ]; then crash=24 corruption=240 fuzz_seconds=30; fi

figures=$(mktemp)
trap 'rm -f "$figures"' EXIT
export STOWAGE_RELIABILITY_FIGURES=$figures
bash "$root/scripts/build.sh" >&2
start=$(date +%s)
STOWAGE_CRASH_TRIALS=$crash STOWAGE_CORRUPTION_TRIALS=$corruption "$build/tests/reliability_tests" --gtest_brief=1
echo "reliability.suite_seconds $(( $(date +%s) - start ))" >>"$figures"
# The swap optimizer's faults (promise 6): 15 scenarios in each of packed and per-tensor mode.
swap_fault_tests=$("$build/tests/optim_tests" --gtest_filter='Modes/SwapFaults.*' --gtest_list_tests | grep -c '^  ')
"$build/tests/optim_tests" --gtest_filter='Modes/SwapFaults.*' --gtest_brief=1 >&2
echo "swap_faults.tests_passed $swap_fault_tests of $swap_fault_tests (5 kinds, 15 injected faults, in packed and in per-tensor mode)" >>"$figures"
bash "$root/scripts/fuzz.sh" "$fuzz_seconds"
unset STOWAGE_RELIABILITY_FIGURES
asan_suites=(dcp state memory optim reliability activation) tsan_suites=(memory dcp optim)
sanitized=0
for suite in "${asan_suites[@]}"; do
  if bash "$root/scripts/sanitize.sh" "$suite" >&2; then sanitized=$((sanitized + 1)); fi
done
echo "sanitize.address_undefined.suites_passed $sanitized of ${#asan_suites[@]}" >>"$figures"
sanitized=0
for suite in "${tsan_suites[@]}"; do
  if STOWAGE_SANITIZE=thread bash "$root/scripts/sanitize.sh" "$suite" >&2; then sanitized=$((sanitized + 1)); fi
done
echo "sanitize.thread.suites_passed $sanitized of ${#tsan_suites[@]}" >>"$figures"

table=$(mktemp)
{
  echo "<!-- figures:begin (scripts/reliability_report.sh writes this table; do not edit) -->"
  echo "Measured $(date -u +%Y-%m-%d) on $(nproc) cores, $(uname -sr)."
  echo
  echo "| Figure | Value |"
  echo "|---|---|"
  while read -r name value; do echo "| \`$name\` | $value |"; done <"$figures"
  echo "<!-- figures:end -->"
} >"$table"
python3 - "$root/docs/reliability.md" "$table" <<'PY'
import re, sys
doc, table = sys.argv[1], open(sys.argv[2]).read().rstrip("\n")
text = open(doc).read()
text = re.sub(r"<!-- figures:begin.*?<!-- figures:end -->", lambda _: table, text, flags=re.S)
open(doc, "w").write(text)
PY
rm -f "$table"
echo "docs/reliability.md: figures updated"
