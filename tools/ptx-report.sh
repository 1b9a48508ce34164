#!/usr/bin/env bash
# Lists the CUDA kernels (and device functions) that ptxas gives a stack frame or spills, with
# their register counts: a spill in a streaming loop costs more than it looks (the 72-register
# decode GEMV's 20 bytes of reloads cost ~1.7 % of a Llama-70B decode step, bench/RESULTS.md
# 2026-12-02). Needs nvcc only, no GPU; compiles each file on its own (slow: run it on a few).
#
#   tools/ptx-report.sh [--all] [FILE.cu ...]   (default: every file under src/kernels/cuda)
# --all lists every kernel, spilling or not.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
all=0
if [[ ${1:-} == --all ]]; then
  all=1
  shift
fi
files=("$@")
[[ ${#files[@]} -eq 0 ]] && mapfile -t files < <(ls src/kernels/cuda/*/*.cu)
obj=$(mktemp)
trap 'rm -f "$obj"' EXIT
for f in "${files[@]}"; do
  echo "== $f"
  nvcc -O3 -DNDEBUG --generate-code=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr \
    -std=c++20 -DSERVAL_HAVE_CUDA=1 -Isrc -I. -Xptxas -v -c "$f" -o "$obj" 2>&1 |
    awk -v all=$all -F"'" '
      /Compiling entry function/ { name = $2 }
      /bytes stack frame/ { frame = $0; sub(/^ +/, "", frame) }
      /Used [0-9]+ registers/ {
        regs = $0; sub(/.*Used /, "", regs); sub(/ registers.*/, "", regs)
        if (all || frame !~ /^0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads/)
          printf "  %s\n    %s registers; %s\n", name, regs, frame
      }
      /error/ { print }'
done
