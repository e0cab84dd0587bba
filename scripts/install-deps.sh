#!/usr/bin/env bash
# Installs the Debian packages depot builds with, if any are missing. Safe to re-run.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  capnproto libcapnp-dev          # wire protocol schema compiler and runtime
  libboost-dev                    # Boost.Asio (header-only)
  libxxhash-dev                   # object ids from names, checksums
  libspdlog-dev libfmt-dev        # daemon logging
  libcli11-dev                    # command lines of depotd and depotctl
  libgtest-dev libgmock-dev       # tests
  libbenchmark-dev                # bench/
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "installing: ${missing[*]}"
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
  sudo="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
