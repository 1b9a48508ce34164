#!/usr/bin/env bash
# On the GPU machine: Nsight Compute's full section set, with source-level stall samples, for some
# launches of one kernel of a command, written as text under $OUT (or ./gpu-results):
#   NAME-details.txt  the sections (speed of light, scheduler, warp states, occupancy, ...)
#   NAME-source.csv   the SASS with executed instructions and stall samples per instruction
#   NAME-report.txt   tools/ncu_source_report.py of it: stall reasons, hottest instructions, the
#                     instruction mix per pass of the hottest loops
#   NAME.ncu-rep      the report itself
#
#   tools/ncu-kernel.sh NAME KERNEL_REGEX SKIP COUNT -- COMMAND...
#
# e.g. tools/ncu-kernel.sh gemm1 'moe_gemm_nvfp4_kernel' 20 1 -- \
#        build-gpu/apps/serval bench moe --config .device-data/bench-configs/qwen3-30b-a3b-nvfp4 \
#        --tokens 8192 --iters 1
# SKIP launches of the matching kernels are passed over first (warm-up), then COUNT are profiled.
# Clocks stay as they are (--clock-control none: the GPU's clocks are never changed).
# Kernels run serialized and replayed under ncu: compare durations only among ncu runs.
# NCU_FLAGS adds ncu options (e.g. "--cache-control none": caches not flushed between replays).
set -uo pipefail
if [[ $# -lt 6 || $5 != -- ]]; then
  echo "usage: tools/ncu-kernel.sh NAME KERNEL_REGEX SKIP COUNT -- COMMAND..." >&2
  exit 2
fi
name=$1 regex=$2 skip=$3 count=$4
shift 5
out=${OUT:-gpu-results}
mkdir -p "$out"
ncu --clock-control none ${NCU_FLAGS:-} --set full --import-source yes --kernel-name "regex:$regex" \
  --launch-skip "$skip" --launch-count "$count" -f -o "$out/$name" "$@" >"$out/$name-run.txt" 2>&1
status=$?
echo "ncu: exit $status (log $out/$name-run.txt)"
[[ -f $out/$name.ncu-rep ]] || exit 1
ncu -i "$out/$name.ncu-rep" --page details >"$out/$name-details.txt" 2>&1
ncu -i "$out/$name.ncu-rep" --page source --csv --print-source sass >"$out/$name-source.csv" 2>&1
grep -E "Duration|Registers Per Thread|Issue Slots Busy|Eligible Warps|No Eligible|Warp Cycles Per Issued" \
  "$out/$name-details.txt"
python3 "$(dirname "$0")/ncu_source_report.py" "$out/$name-source.csv" >"$out/$name-report.txt" 2>&1 &&
  sed -n '/^stall reasons/p;/^loop of/,+1p' "$out/$name-report.txt"
exit "$status"
