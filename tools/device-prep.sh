#!/usr/bin/env bash
# Prepares what a device call carries besides the working tree (see tools/gpu-check.sh): the
# PCRE2 and utf8proc headers the GPU machine lacks (.device-deps, packed by
# ../shared/tools/pack-device-deps.sh) and .device-data (the dummy-weight bench configs and the
# GSM8K files that the e2e tests read). Both folders stay out of git. Idempotent.
#
#   tools/device-prep.sh [SHARED_DIR]     (default: ../shared next to the checkout)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
shared=${1:-$root/../shared}
cd "$root"
for path in /.device-deps/ /.device-data/ /.clean/ /build*/ /gpu-results/; do
  grep -qxF "$path" .git/info/exclude 2>/dev/null || echo "$path" >>.git/info/exclude
done
[[ -d .device-deps/usr ]] || bash "$shared/tools/pack-device-deps.sh" .device-deps
mkdir -p .device-data
cp -r "$shared/bench-configs" .device-data/
cp "$shared/data/gsm8k/"*.jsonl .device-data/
echo "device-prep: carry .device-deps and .device-data ($(du -sh .device-data | cut -f1))"
