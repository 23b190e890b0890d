#!/usr/bin/env bash
# Installs the Debian packages pagedkv builds and checks with, when missing (clang-format for
# scripts/check-format.sh, doxygen for scripts/check-docs.sh). Needs root (or sudo).
set -euo pipefail
pkgs=(cmake g++ make pkg-config libfmt-dev libgtest-dev libgmock-dev libbenchmark-dev
      libcli11-dev nlohmann-json3-dev libxxhash-dev libhwy-dev librapidcheck-dev libopenblas-dev
      libhiredis-dev redis-server clang-format doxygen)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
