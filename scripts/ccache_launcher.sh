#!/usr/bin/env bash
# CMake's compiler launcher (scripts/ccache.sh): ccache, and beside each precompiled header
# it compiles, the checksum that ccache's pch_external_checksum reads in place of the
# header's bytes. gcc's header differs byte for byte from one compilation of the same source
# to the next, so keyed on its bytes every unit that uses it missed in a clone at another
# path whenever the clone's own header compilation missed. The checksum is the header's
# preprocessed text without line markers (no folder of the checkout in it) and its command
# line with the checkout written as ROOT: what the header means, wherever it was compiled.
set -euo pipefail
ccache "$@"

args=("$@")
output=
for ((i = 0; i + 1 < ${#args[@]}; i++)); do
  [[ ${args[i]} == -o ]] && output=${args[i + 1]}
done
[[ $output == *.gch || $output == *.pch ]] || exit 0

# The same command, preprocessing only: no object, no dependency file (ccache wrote it).
preprocess=()
for ((i = 0; i < ${#args[@]}; i++)); do
  case ${args[i]} in
    -o | -MF | -MT | -MQ) ((++i)) ;;
    -c | -MD | -MMD) ;;
    *) preprocess+=("${args[i]}") ;;
  esac
done
{
  "${preprocess[@]}" -E -P -o -
  printf '%s\n' "${args[@]//${CCACHE_BASEDIR:-/nonexistent}/ROOT}"
} | sha256sum >"$output.sum.tmp"
mv "$output.sum.tmp" "$output.sum"
