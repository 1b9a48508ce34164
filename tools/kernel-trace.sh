#!/usr/bin/env bash
# On the GPU machine: run a command with every kernel's GPU start and end recorded (CUPTI, no
# probes between kernels: graph replays and PDL overlap as they ran) and write the trace CSV:
#
#   tools/kernel-trace.sh OUT.csv -- COMMAND...
#
# Then summarize, here or there: python3 tools/kernel_trace_report.py OUT.csv
# The tracer (tools/kernel-trace/kernel_trace.cpp) is built into build-trace/ on first use.
set -euo pipefail
if [[ $# -lt 3 || $2 != -- ]]; then
  echo "usage: tools/kernel-trace.sh OUT.csv -- COMMAND..." >&2
  exit 2
fi
out=$1
shift 2
root=$(cd "$(dirname "$0")/.." && pwd)
cuda=$(dirname "$(dirname "$(command -v nvcc)")")
lib=$root/build-trace/libkernel_trace.so
if [[ ! -f $lib ]]; then
  mkdir -p "$root/build-trace"
  cupti_inc=$cuda/include cupti_lib=$cuda/lib64
  [[ -f $cupti_inc/cupti.h ]] || cupti_inc=$cuda/extras/CUPTI/include
  [[ -d $cupti_lib ]] || cupti_lib=$cuda/lib
  [[ -f $cupti_lib/libcupti.so ]] || cupti_lib=$cuda/extras/CUPTI/lib64
  g++ -O2 -shared -fPIC -std=c++17 -I"$cupti_inc" "$root/tools/kernel-trace/kernel_trace.cpp" \
    -o "$lib" -L"$cupti_lib" -Wl,-rpath,"$cupti_lib" -lcupti
fi
SERVAL_KERNEL_TRACE=$out LD_PRELOAD=$lib "$@"
