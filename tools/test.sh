#!/usr/bin/env bash
# Runs every test: installs what is missing, builds once (Ninja, ccache), runs ctest.
# GPU tests skip with a message on machines without a GPU.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash tools/install-deps.sh
# npm test peers (openai client, tokenizer oracles and vocabularies), pinned in tests/npm.
if [[ -f tests/npm/package.json ]]; then
  (cd tests/npm && { [[ -d node_modules ]] && npm ls >/dev/null 2>&1 || npm ci --no-audit --no-fund --loglevel=error; })
fi
build=${SERVAL_BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
ninja -C "$build"
ctest --test-dir "$build" --output-on-failure -j"$(nproc)" "$@"
