#!/usr/bin/env bash
# Makes .clean/: the committed tree (HEAD) without models/, for a device run while the working
# tree holds unfinished edits. Carry it with the device deps and data, and run on the device:
#   cd .clean && tools/gpu-check.sh ...
# The links to ../.device-deps, ../.device-data and ../models resolve in the device's copy of the
# repository; .clean/COMMIT names the commit for the results table.
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
rm -rf .clean
mkdir .clean
git archive HEAD | tar -x -C .clean --exclude=models
ln -s ../.device-deps .clean/.device-deps
ln -s ../.device-data .clean/.device-data
ln -s ../models .clean/models
git rev-parse --short HEAD >.clean/COMMIT
grep -qx '/.clean/' .git/info/exclude || echo '/.clean/' >>.git/info/exclude
echo ".clean/ holds $(cat .clean/COMMIT) ($(du -sh .clean | cut -f1)); carry .clean, .device-deps, .device-data"
