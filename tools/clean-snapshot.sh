#!/usr/bin/env bash
# Makes .clean/: a committed tree (HEAD, or the ref given as the first argument, e.g. a scratch
# branch merging several work branches) without models/, for a device run while the working
# tree holds unfinished edits. Carry it with the device deps and data, and run on the device:
#   cd .clean && tools/gpu-check.sh ...
# The links to ../.device-deps, ../.device-data and ../models resolve in the device's copy of the
# repository; .clean/COMMIT names the commit for the results table.
set -euo pipefail
ref=${1:-HEAD}
root=$(git rev-parse --show-toplevel)
cd "$root"
rm -rf .clean
mkdir .clean
git archive "$ref" | tar -x -C .clean --exclude=models
ln -s ../.device-deps .clean/.device-deps
ln -s ../.device-data .clean/.device-data
ln -s ../models .clean/models
git rev-parse --short "$ref" >.clean/COMMIT
grep -qx '/.clean/' .git/info/exclude || echo '/.clean/' >>.git/info/exclude
echo ".clean/ holds $(cat .clean/COMMIT) ($(du -sh .clean | cut -f1)); carry .clean, .device-deps, .device-data"
