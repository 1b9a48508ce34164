#!/usr/bin/env bash
# Prints a 12-hex digest of the source tree (every file git tracks or would track under src, apps,
# clients, tests, tools and models, plus CMakeLists.txt), so that a GPU run's log can be matched
# to a local checkout: the git metadata copied to the GPU machine can be older than the working
# tree copied with it, and then `git rev-parse HEAD` there names the wrong commit.
#   tools/source-hash.sh        # here, and in tools/gpu-check.sh there (its gpu.txt)
set -euo pipefail
cd "$(dirname "$0")/.."
git ls-files -co --exclude-standard -- src apps clients tests tools models CMakeLists.txt |
  LC_ALL=C sort -u |
  while IFS= read -r f; do if [[ -f $f ]]; then printf '%s\0' "$f"; fi; done |
  xargs -0 sha1sum | sha1sum | cut -c1-12
