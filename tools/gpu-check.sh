#!/usr/bin/env bash
# On the GPU machine: build (Ninja, sm_90a), run the `gpu` tests and the benchmark set, and
# write logs and a results table under $OUT (or ./gpu-results).
#
#   tools/gpu-check.sh [--no-tests] [--no-e2e] [--no-bench] [--bench-filter REGEX]
#                      [--test-filter REGEX] [--configs DIR] [--serving-bench] [--tp N]
#                      [--startup] [--profile CONFIG] [--trace CONFIG] [--no-kernel-bench]
#                      [--quant-fixtures] [--make-fixtures NAME,...]
#                      [--kernel-filter GTEST_FILTER] [--serve-flags "FLAGS"] [--then "CMD"]
#                      [--serving-batched-tokens N]
#                      [--test-timeout SECONDS]
#
# Steps: build (the serval binary and the kernels_gpu tests only: CI runs the CPU suites);
# `ctest -L gpu`; `ctest -L e2e` (the real server on the GPU with the fixtures and
# the demo model; the npm-based parts skip there); kernel micro-benchmarks and `bench latency`
# on dummy configs; with --serving-bench, the reference serving benchmark (Llama-3.3-70B NVFP4
# dummy, fp8 KV, 40 prompts of 1024 in / 600 out at concurrency 8). --tp N runs the latency
# benchmarks (and the serving benchmark) with tensor parallel N, and the NVFP4 MoE model also with
# expert parallel. --startup times `serve` of Qwen3-30B-A3B NVFP4 dummy from start to /health.
# --profile CONFIG writes per-kernel GPU times of a few eager batch-1 decode steps (ncu) and the
# GPU time per backend op (SERVAL_PROFILE_OPS=1, CUDA events); with --tp N, of the N-rank run.
# --trace CONFIG records the kernels of graph decode steps at batch 1 (128 in) and 8 (1024 in)
# with tools/kernel-trace.sh (fp8 KV) and appends the per-layer cost table
# (tools/kernel_trace_report.py --layers) to gpu.txt; the traces go into logs.tgz.
# --kernel-filter picks the kernel micro-benchmarks (a gtest filter; default all DISABLED_ ones).
# --test-timeout sets ctest's per-test limit (default 300 s for the one-GPU tests, at most 180 s
# for the all-GPU ones): lower it when trying kernels that might hang, so that a hang costs
# little of the device call.
# --then runs CMD (bash -c, in the repository root, after everything else, with the device deps
# on the library path; e.g. tools/gpu-ab.sh comparisons) into $OUT/then.txt.
# --serve-flags adds flags to the serving benchmark's `serve` (e.g. --async-scheduling); the
# engine's shutdown line (steps, the model's share, host work per step) goes to gpu.txt.
# --serving-batched-tokens sets that `serve`'s --max-num-batched-tokens (default 8192).
# --quant-fixtures first runs tools/make_quant_fixtures.py (PyTorch is there) and returns the new
# fixture folders in $OUT/quant-fixtures.tgz, so the tests below already use them.
# --make-fixtures NAME,... makes just those fixtures first (make_fixtures.py architectures, then
# make_quant_fixtures.py variants, e.g. deepseek_v3,deepseek_v2,deepseek_v3_fp8_block) and
# returns them in $OUT/fixtures.tgz.
#
# With unfinished edits in the working tree, tools/clean-snapshot.sh makes .clean/ (HEAD only) to
# carry and run this script from.
# The GPU machine lacks the PCRE2 and utf8proc headers: carry .device-deps made by
# ../shared/tools/pack-device-deps.sh. Bench configs come from --configs (default
# .device-data/bench-configs, a carried copy of ../shared/bench-configs); the e2e tests read
# GSM8K from .device-data. tools/device-prep.sh makes both folders.
set -uo pipefail
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}  # never NVLink multicast on these machines
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
out=${OUT:-$root/gpu-results}
mkdir -p "$out"
run_tests=1 run_e2e=1 run_bench=1 serving_bench=0 bench_filter='.*' test_filter='' tp=1
startup=0 profile='' trace='' kernel_bench=1 quant_fixtures=0 kernel_filter='*DISABLED_*' serve_flags=''
then_cmd='' test_timeout=300 make_fixtures='' serving_budget=8192
configs=.device-data/bench-configs
while [[ $# -gt 0 ]]; do
  case $1 in
    --no-tests) run_tests=0 ;;
    --no-bench) run_bench=0 ;;
    --no-e2e) run_e2e=0 ;;
    --serving-bench) serving_bench=1 ;;
    --bench-filter) bench_filter=$2; shift ;;
    --test-filter) test_filter=$2; shift ;;
    --tp) tp=$2; shift ;;
    --startup) startup=1 ;;
    --no-kernel-bench) kernel_bench=0 ;;
    --kernel-filter) kernel_filter=$2; shift ;;
    --serve-flags) serve_flags=$2; shift ;;
    --serving-batched-tokens) serving_budget=$2; shift ;;
    --then) then_cmd=$2; shift ;;
    --test-timeout) test_timeout=$2; shift ;;
    --quant-fixtures) quant_fixtures=1 ;;
    --make-fixtures) make_fixtures=$2; shift ;;
    --profile) profile=$2; shift ;;
    --trace) trace=$2; shift ;;
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
commit=$(cat COMMIT 2>/dev/null || git rev-parse --short HEAD 2>/dev/null || echo unknown)
echo "commit $commit" | tee -a "$out/gpu.txt"
# The commit above comes from git metadata that may predate the copied tree: the source digest
# identifies the tree itself (run tools/source-hash.sh locally to match it).
echo "source $(bash tools/source-hash.sh 2>/dev/null || echo unknown)" | tee -a "$out/gpu.txt"

if [[ -n $make_fixtures ]]; then
  # Base fixtures (tools/make_fixtures.py) and quantized variants (tools/make_quant_fixtures.py)
  # by name, in that order, returned in $OUT/fixtures.tgz.
  bases=() variants=()
  for name in ${make_fixtures//,/ }; do
    if grep -q "\"$name\": (\"" tools/make_quant_fixtures.py; then variants+=("$name"); else bases+=("$name"); fi
  done
  status=0
  if [[ ${#bases[@]} -gt 0 ]]; then
    python3 tools/make_fixtures.py --only "$(IFS=,; echo "${bases[*]}")" --out tests/fixtures \
      --tokenizer tests/fixtures/llama/tokenizer.json >"$out/fixtures.log" 2>&1 || status=$?
  fi
  if [[ $status -eq 0 && ${#variants[@]} -gt 0 ]]; then
    python3 tools/make_quant_fixtures.py --fixtures tests/fixtures \
      --only "$(IFS=,; echo "${variants[*]}")" >>"$out/fixtures.log" 2>&1 || status=$?
  fi
  echo "make fixtures ${make_fixtures}: exit $status" | tee -a "$out/gpu.txt"
  tail -n 8 "$out/fixtures.log"
  (cd tests/fixtures && tar czf "$out/fixtures.tgz" ${make_fixtures//,/ })
fi

if [[ $quant_fixtures -eq 1 ]]; then
  python3 tools/make_quant_fixtures.py --fixtures tests/fixtures >"$out/quant-fixtures.log" 2>&1
  echo "make_quant_fixtures: exit $?" | tee -a "$out/gpu.txt"
  tail -n 6 "$out/quant-fixtures.log"
  (cd tests/fixtures && tar czf "$out/quant-fixtures.tgz" ./*_nvfp4_* ./*_fp8_*)
fi

start=$(date +%s)
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DSERVAL_CUDA=ON >"$out/build.log" 2>&1 &&
  ninja -C build-gpu -k 0 -j"$(nproc)" apps/serval tests/kernels_gpu >>"$out/build.log" 2>&1
status=$?
echo "build: exit $status in $(($(date +%s) - start)) s" | tee -a "$out/gpu.txt"
if [[ $status -ne 0 ]]; then
  grep -E "error|FAILED" "$out/build.log" | head -40
  exit $status
fi

if [[ $run_tests -eq 1 ]]; then
  # Tests that use every GPU of the machine (ParallelGpu, NCCL) run one at a time after the
  # others; a per-test timeout keeps a hang from eating the whole device call.
  ctest --test-dir build-gpu -L gpu ${test_filter:+-R "$test_filter"} -E ParallelGpu \
    --output-on-failure --timeout "$test_timeout" -j4 >"$out/gpu-tests.log" 2>&1
  echo "gpu tests: exit $?" | tee -a "$out/gpu.txt"
  if [[ -z $test_filter || ParallelGpu =~ $test_filter ]]; then
    # The first failure (or hang) ends the run: a hang repeats in the next fixtures' tests.
    ctest --test-dir build-gpu -L gpu -R ParallelGpu --output-on-failure -j1 --stop-on-failure \
      --timeout "$((test_timeout < 180 ? test_timeout : 180))" \
      >>"$out/gpu-tests.log" 2>&1
    echo "gpu tests using all GPUs: exit $?" | tee -a "$out/gpu.txt"
  fi
  tail -n 25 "$out/gpu-tests.log"
fi

if [[ $run_e2e -eq 1 ]]; then
  [[ -f .device-data/train.jsonl ]] ||
    echo "warning: .device-data has no GSM8K files (tools/device-prep.sh): the e2e eval step fails" |
    tee -a "$out/gpu.txt"
  SERVAL_GSM8K_DIR=$root/.device-data ctest --test-dir build-gpu -L e2e --output-on-failure >"$out/e2e.log" 2>&1
  echo "e2e tests (GPU server): exit $?" | tee -a "$out/gpu.txt"
  grep -E "tests passed|Failed|Passed" "$out/e2e.log" | tail -n 12
fi

if [[ $run_bench -eq 1 ]]; then
  bench=$out/bench.log
  : >"$bench"
  # Kernel micro-benchmarks are DISABLED_ gtests, run here only.
  if [[ $kernel_bench -eq 1 ]]; then
    build-gpu/tests/kernels_gpu --gtest_also_run_disabled_tests \
      --gtest_filter="$kernel_filter" 2>&1 | grep -vE "^\[ *(RUN|-+|=+) *\]" | tee -a "$bench"
  fi
  serval=build-gpu/apps/serval
  latency() {  # config batch input output [extra flags]
    local cfg=$1 b=$2 i=$3 o=$4
    shift 4
    echo "== bench latency $cfg batch $b input $i output $o $*" | tee -a "$bench"
    "$serval" bench latency --model "$configs/$cfg" --load-format dummy --batch-size "$b" \
      --input-len "$i" --output-len "$o" --num-iters 3 "$@" 2>&1 | tail -n 2 | tee -a "$bench"
  }
  if [[ -d $configs ]]; then
    specs=("qwen3-30b-a3b 1 128 64" "qwen3-30b-a3b 8 1024 64" "qwen3-0.6b 1 128 64"
      "qwen3-30b-a3b-nvfp4 1 128 64" "qwen3-30b-a3b-nvfp4 8 1024 64"
      "qwen3-30b-a3b-fp8 1 128 64" "qwen3-30b-a3b-fp8 8 1024 64"
      "deepseek-v2-lite 1 128 64" "deepseek-v2-lite 8 1024 64"
      "llama-3.3-70b-nvfp4 1 128 32 --kv-cache-dtype fp8"
      "llama-3.3-70b-nvfp4 8 1024 32 --kv-cache-dtype fp8"
      "llama-3.3-70b 1 128 16 --max-model-len 1024 --gpu-memory-utilization 0.99")
    if [[ $tp -gt 1 ]]; then
      specs=("llama-3.3-70b-nvfp4 1 128 32 --kv-cache-dtype fp8 --tensor-parallel-size $tp"
        "llama-3.3-70b-nvfp4 8 1024 32 --kv-cache-dtype fp8 --tensor-parallel-size $tp"
        "qwen3-30b-a3b-nvfp4 1 128 64 --tensor-parallel-size $tp"
        "qwen3-30b-a3b-nvfp4 1 128 64 --tensor-parallel-size $tp --enable-expert-parallel"
        "qwen3-30b-a3b-nvfp4 8 1024 64 --tensor-parallel-size $tp"
        "qwen3-30b-a3b-nvfp4 8 1024 64 --tensor-parallel-size $tp --enable-expert-parallel"
        "qwen3-30b-a3b-nvfp4 64 1024 32 --tensor-parallel-size $tp"
        "qwen3-30b-a3b-nvfp4 64 1024 32 --tensor-parallel-size $tp --enable-expert-parallel")
    fi
    for spec in "${specs[@]}"; do
      [[ -d $configs/${spec%% *} ]] || continue  # the FP8 and DeepSeek ones: tools/device-prep.sh
      # shellcheck disable=SC2086
      echo "$spec" | grep -Eq "$bench_filter" && latency $spec
    done
    for cfg in qwen3-30b-a3b qwen3-30b-a3b-nvfp4 qwen3-30b-a3b-fp8 deepseek-v3-fp8; do
      [[ -d $configs/$cfg ]] || continue
      echo "bench moe $cfg" | grep -Eq "$bench_filter" || continue
      echo "== bench moe $cfg" | tee -a "$bench"
      "$serval" bench moe --config "$configs/$cfg" 2>&1 | tee -a "$bench"
    done
  fi
  # Speculative decoding (prompt lookup) on the demo model, the one trained model at hand: GSM8K
  # at concurrency 1 and 8, plain then speculative (the same answers; wall time and steps).
  if echo "spec gsm8k" | grep -Eq "$bench_filter" && [[ -f .device-data/test.jsonl ]]; then
    spec_cfg='{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}'
    for conc in 1 8; do
      for mode in plain spec; do
        flags=()
        [[ $mode == spec ]] && flags=(--speculative-config "$spec_cfg")
        port=8125
        "$serval" serve models/demo --port $port "${flags[@]}" >"$out/spec-$mode-$conc.log" 2>&1 &
        server=$!
        for _ in $(seq 1 600); do
          curl -sf "http://127.0.0.1:$port/health" >/dev/null && break
          sleep 0.1
        done
        echo "== spec gsm8k $mode concurrency $conc" | tee -a "$bench"
        "$serval" eval gsm8k --port $port --num-questions 50 --max-concurrency $conc \
          --data-dir .device-data --disable-tqdm 2>&1 | grep -E "Accuracy|Total latency" | tee -a "$bench"
        curl -sf "http://127.0.0.1:$port/metrics" |
          grep -E "^serval:(engine_steps_total|spec_decode_num_(draft|accepted)_tokens_total)" |
          tee -a "$bench"
        kill $server 2>/dev/null
        wait $server 2>/dev/null
      done
    done
  fi
fi

if [[ $startup -eq 1 && -d $configs/qwen3-30b-a3b-nvfp4 ]]; then
  port=8124
  t0=$(date +%s.%N)
  build-gpu/apps/serval serve "$configs/qwen3-30b-a3b-nvfp4" --load-format dummy --port $port \
    >"$out/startup-serve.log" 2>&1 &
  server=$!
  for _ in $(seq 1 1200); do
    curl -sf "http://127.0.0.1:$port/health" >/dev/null && break
    kill -0 $server 2>/dev/null || break
    sleep 0.05
  done
  t1=$(date +%s.%N)
  awk -v a="$t0" -v b="$t1" 'BEGIN { printf "start-up to /health 200, qwen3-30b-a3b-nvfp4 dummy: %.2f s\n", b - a }' |
    tee -a "$out/gpu.txt"
  kill $server 2>/dev/null
  wait $server 2>/dev/null
fi

if [[ -n $profile && -d $configs/$profile ]]; then
  # Kernels of two eager decode steps after warm-up, one line per launch with its GPU time.
  # The dummy weights' generation kernels (dummy_*) are not counted in the skip.
  ncu --clock-control none --metrics gpu__time_duration.sum --csv \
    --kernel-name regex:'^(?!dummy)' --launch-skip 4000 --launch-count 1200 build-gpu/apps/serval bench latency --model "$configs/$profile" \
    --load-format dummy --batch-size 1 --input-len 16 --output-len 40 --num-iters 1 \
    --num-iters-warmup 0 --enforce-eager --tensor-parallel-size "$tp" >"$out/profile.csv" \
    2>"$out/profile.err"
  echo "profile: exit $? ($(grep -c gpu__time_duration "$out/profile.csv") kernels)" | tee -a "$out/gpu.txt"
  # GPU time per backend op from CUDA events (works where ncu cannot read counters).
  SERVAL_PROFILE_OPS=1 build-gpu/apps/serval bench latency --model "$configs/$profile" \
    --load-format dummy --batch-size 1 --input-len 16 --output-len 40 --num-iters 1 \
    --num-iters-warmup 0 --enforce-eager --tensor-parallel-size "$tp" >"$out/ops-profile.txt" 2>&1
  grep -A30 "GPU time per backend op" "$out/ops-profile.txt" | head -20
fi

if [[ -n $trace && -d $configs/$trace ]]; then
  for shape in "1 128" "8 1024"; do
    set -- $shape
    csv=$out/trace-$trace-b$1.csv
    tools/kernel-trace.sh "$csv" -- build-gpu/apps/serval bench latency --model "$configs/$trace" \
      --load-format dummy --kv-cache-dtype fp8 --batch-size "$1" --input-len "$2" \
      --output-len 16 --num-iters 2 >"$out/trace-$trace-b$1.log" 2>&1
    echo "trace $trace b$1: exit $?" | tee -a "$out/gpu.txt"
    python3 tools/kernel_trace_report.py "$csv" --layers 2>&1 | sed -n '/^per layer/,$p' |
      tee -a "$out/gpu.txt"
    gzip -f "$csv"
  done
fi

if [[ $serving_bench -eq 1 && -d $configs/llama-3.3-70b-nvfp4 ]]; then
  port=8123
  # A stalled parallel step fails after 60 s (not the default 600) and the client gives up after
  # 300 s, so that a hang shows in the logs instead of using up the device call.
  SERVAL_PARALLEL_STALL_S=${SERVAL_PARALLEL_STALL_S:-60} build-gpu/apps/serval serve \
    "$configs/llama-3.3-70b-nvfp4" --load-format dummy --port $port \
    --kv-cache-dtype fp8 --max-num-seqs 512 --max-model-len 2058 --max-num-batched-tokens "$serving_budget" \
    --tensor-parallel-size "$tp" $serve_flags >"$out/serve.log" 2>&1 &
  server=$!
  for _ in $(seq 1 600); do
    curl -sf "http://127.0.0.1:$port/health" >/dev/null && break
    kill -0 $server 2>/dev/null || break
    sleep 1
  done
  timeout 300 build-gpu/apps/serval bench serve --port $port --dataset-name random \
    --random-input-len 1024 --random-output-len 600 --ignore-eos --num-prompts 40 \
    --max-concurrency 8 2>&1 | tee "$out/serving-bench.txt"
  echo "serving benchmark client: exit ${PIPESTATUS[0]} (124: gave up after 300 s)" >>"$out/gpu.txt"
  echo "serving benchmark: serve flags '$serve_flags', --max-num-batched-tokens $serving_budget" >>"$out/gpu.txt"
  kill $server 2>/dev/null
  for _ in $(seq 1 30); do kill -0 $server 2>/dev/null || break; sleep 1; done
  kill -9 $server 2>/dev/null  # a server stuck in a step does not stop on SIGTERM
  wait $server 2>/dev/null
  # The engine's shutdown line: steps, their wall time, the model's share, host work per step.
  grep -h "engine: .* steps" "$out/serve.log" | tee -a "$out/gpu.txt"
fi
if [[ -n $then_cmd ]]; then
  bash -c "$then_cmd" >"$out/then.txt" 2>&1
  echo "--then: exit $?" | tee -a "$out/gpu.txt"
fi
# The device returns at most 8 files: all logs but the summary and the benchmarks go in one archive.
(cd "$out" && find . -maxdepth 1 -type f ! -name gpu.txt ! -name bench.log ! -name '*.tgz' \
  ! -name console.txt ! -name then.txt -printf '%P\n' | tar czf logs.tgz -T - --remove-files)
exit 0
