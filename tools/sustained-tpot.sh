#!/usr/bin/env bash
# On the GPU machine: one command (typically `serval bench latency` with enough iterations and
# output tokens to run for ~15 s or more) with `nvidia-smi dmon` sampling power and clocks once a
# second alongside. Read only: nothing on the GPU is changed. Prints the command's lines that match
# a pattern, then the mean board power and SM clock over the seconds drawn above a threshold (the
# busy phase; loading and warm-up draw less). Long decode runs settle at the board's power cap, where
# the SM clock, and so every issue-bound kernel, slows: the short default bench does not show it.
#
#   tools/sustained-tpot.sh [--grep REGEX] [--busy-watts W] -- COMMAND...
#
# e.g. tools/sustained-tpot.sh -- build-gpu/apps/serval bench latency --load-format dummy \
#        --kv-cache-dtype fp8 --num-iters 10 --output-len 128 --model MODEL --batch-size 1
# Default pattern 'TPOT median', threshold 600 W.
set -uo pipefail
pattern='TPOT median' busy=600
while [[ $# -gt 0 ]]; do
  case $1 in
    --grep) pattern=$2; shift ;;
    --busy-watts) busy=$2; shift ;;
    --) shift; break ;;
    *) echo "sustained-tpot: unknown option $1 (the command follows --)" >&2; exit 2 ;;
  esac
  shift
done
if [[ $# -eq 0 ]]; then
  echo "usage: tools/sustained-tpot.sh [--grep REGEX] [--busy-watts W] -- COMMAND..." >&2
  exit 2
fi
samples=$(mktemp)
trap 'rm -f "$samples"' EXIT
nvidia-smi dmon -s pc -d 1 >"$samples" 2>&1 &
dmon=$!
"$@" 2>&1 | grep -E "$pattern"
status=${PIPESTATUS[0]}
kill "$dmon" 2>/dev/null
wait "$dmon" 2>/dev/null
# dmon -s pc columns: gpu, pwr (W), gtemp, mtemp, mclk, pclk (MHz); '#' lines are headers.
awk -v busy="$busy" '!/^#/ && $2 + 0 > busy { w += $2; c += $6; n++ }
  END {
    if (n) printf "sustained: %.0f W, SM clock %.0f MHz (mean of %d s above %d W)\n", w / n, c / n, n, busy
    else printf "sustained: no second above %d W\n", busy
  }' "$samples"
exit "$status"
