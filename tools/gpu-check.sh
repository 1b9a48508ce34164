#!/usr/bin/env bash
# On the GPU machine: build (Ninja, sm_90a), run the `gpu` tests and the benchmark set, and
# write logs and a results table under $OUT (or ./gpu-results).
#
#   tools/gpu-check.sh [--no-tests] [--no-bench] [--bench-filter REGEX] [--configs DIR]
#
# The GPU machine lacks the PCRE2 and utf8proc headers: carry .device-deps made by
# ../shared/tools/pack-device-deps.sh. Bench configs come from --configs (default
# .device-data/bench-configs, a carried copy of ../shared/bench-configs).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
out=${OUT:-$root/gpu-results}
mkdir -p "$out"
run_tests=1 run_bench=1 bench_filter='.*' configs=.device-data/bench-configs
while [[ $# -gt 0 ]]; do
  case $1 in
    --no-tests) run_tests=0 ;;
    --no-bench) run_bench=0 ;;
    --bench-filter) bench_filter=$2; shift ;;
    --configs) configs=$2; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done

deps=$root/.device-deps
if [[ -d $deps ]]; then
  sed -i "s|^prefix=.*|prefix=$deps/usr|" "$deps"/usr/lib/x86_64-linux-gnu/pkgconfig/*.pc
  export PKG_CONFIG_PATH=$deps/usr/lib/x86_64-linux-gnu/pkgconfig
  export CMAKE_PREFIX_PATH=$deps/usr CPATH=$deps/usr/include
  export LIBRARY_PATH=$deps/usr/lib/x86_64-linux-gnu
  export LD_LIBRARY_PATH=$deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi

nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv | tee "$out/gpu.txt"
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
echo "commit $commit" | tee -a "$out/gpu.txt"

start=$(date +%s)
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DSERVAL_CUDA=ON >"$out/build.log" 2>&1 &&
  ninja -C build-gpu -k 0 -j"$(nproc)" >>"$out/build.log" 2>&1
status=$?
echo "build: exit $status in $(($(date +%s) - start)) s" | tee -a "$out/gpu.txt"
if [[ $status -ne 0 ]]; then
  grep -E "error|FAILED" "$out/build.log" | head -40
  exit $status
fi

if [[ $run_tests -eq 1 ]]; then
  ctest --test-dir build-gpu -L gpu --output-on-failure -j4 >"$out/gpu-tests.log" 2>&1
  echo "gpu tests: exit $?" | tee -a "$out/gpu.txt"
  tail -n 25 "$out/gpu-tests.log"
fi

if [[ $run_bench -eq 1 ]]; then
  bench=$out/bench.log
  : >"$bench"
  # Kernel micro-benchmarks are DISABLED_ gtests, run here only.
  build-gpu/tests/kernels_gpu --gtest_also_run_disabled_tests \
    --gtest_filter="*DISABLED_*" 2>&1 | grep -vE "^\[ *(RUN|-+|=+) *\]" | tee -a "$bench"
  serval=build-gpu/apps/serval
  latency() {  # config batch input output [extra flags]
    local cfg=$1 b=$2 i=$3 o=$4
    shift 4
    echo "== bench latency $cfg batch $b input $i output $o $*" | tee -a "$bench"
    "$serval" bench latency --model "$configs/$cfg" --load-format dummy --batch-size "$b" \
      --input-len "$i" --output-len "$o" --num-iters 3 "$@" 2>&1 | tail -n 2 | tee -a "$bench"
  }
  if [[ -d $configs ]]; then
    for spec in "qwen3-30b-a3b 1 128 64" "qwen3-30b-a3b 8 1024 64" "qwen3-0.6b 1 128 64"; do
      # shellcheck disable=SC2086
      echo "$spec" | grep -Eq "$bench_filter" && latency $spec
    done
  fi
fi
exit 0
