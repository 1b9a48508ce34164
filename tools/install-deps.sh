#!/usr/bin/env bash
# Installs the Debian packages serval builds and tests with (idempotent).
set -euo pipefail
pkgs=(cmake ninja-build ccache g++ pkg-config libboost1.81-dev nlohmann-json3-dev
      libcli11-dev libspdlog-dev libfmt-dev libcurl4-openssl-dev libpcre2-dev
      libutf8proc-dev libyaml-dev libgtest-dev libgmock-dev curl python3 prometheus gnuplot-nox)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
# Node.js (for the npm test peers) may come from another source than Debian.
command -v node >/dev/null && command -v npm >/dev/null || missing+=(nodejs npm)
[[ ${#missing[@]} -eq 0 ]] && exit 0
SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO=sudo
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
