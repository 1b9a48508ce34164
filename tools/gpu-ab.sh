#!/usr/bin/env bash
# Side-by-side measurement on the GPU machine: runs one command under two environments, A then
# B, for several rounds (alternating, so drift of the machine hits both alike), and prints the
# lines of each run that match a pattern, labelled. For the comparison switches of README.md.
#
#   tools/gpu-ab.sh [--rounds N] [--grep REGEX] --a "VAR=v ..." --b "VAR=v ..." -- COMMAND...
#
# e.g. tools/gpu-ab.sh --a "" --b "SERVAL_PREFILL_WGMMA_SKEW=0" --grep TFLOP -- \
#        build-gpu/tests/kernels_gpu --gtest_also_run_disabled_tests \
#        --gtest_filter='*CudaPagedPrefillBench*'
# An empty --a or --b runs the command in the unchanged environment. Default: 2 rounds, lines
# matching 'TPOT|TFLOP|us|tok/s'.
set -uo pipefail
rounds=2 pattern='TPOT|TFLOP|us|tok/s' env_a='' env_b='' have_a=0 have_b=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --rounds) rounds=$2; shift ;;
    --grep) pattern=$2; shift ;;
    --a) env_a=$2; have_a=1; shift ;;
    --b) env_b=$2; have_b=1; shift ;;
    --) shift; break ;;
    *) echo "gpu-ab: unknown option $1 (the command follows --)" >&2; exit 2 ;;
  esac
  shift
done
if [[ $have_a -eq 0 || $have_b -eq 0 || $# -eq 0 ]]; then
  echo "usage: tools/gpu-ab.sh [--rounds N] [--grep REGEX] --a ENV --b ENV -- COMMAND..." >&2
  exit 2
fi
for ((round = 1; round <= rounds; ++round)); do
  for side in a b; do
    envs=$env_a
    [[ $side == b ]] && envs=$env_b
    echo "== round $round, $side: ${envs:-(unchanged environment)}"
    # shellcheck disable=SC2086
    env $envs "$@" 2>&1 | grep -E "$pattern" | sed "s/^/$side  /"
  done
done
