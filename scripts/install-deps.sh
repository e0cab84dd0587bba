#!/usr/bin/env bash
# Installs the Debian packages depot builds with, if any are missing. Safe to re-run.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git clang-format
  capnproto libcapnp-dev          # wire protocol schema compiler and runtime
  libboost-dev                    # Boost.Asio (header-only)
  libxxhash-dev                   # object ids from names, checksums
  libspdlog-dev libfmt-dev        # daemon logging
  libcli11-dev                    # command lines of depotd and depotctl
  libgtest-dev libgmock-dev       # tests
  libbenchmark-dev                # bench/
  python3                         # tests/metrics_test.py
  python3-venv python3-dev        # make test-python: a venv to pip install into; Python.h
  systemd                         # systemd-analyze verify of the installed unit
  lintian                         # checks the Debian package (make package)
)

# The metrics test parses with prometheus_client's own parser.
python_missing=""
python3 -c 'import prometheus_client' 2>/dev/null || python_missing="prometheus_client"

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ] && [ -z "$python_missing" ]; then exit 0; fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
  sudo="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
if [ -n "$python_missing" ]; then
  # A python3 of its own (pyenv, venv) takes it from PyPI; Debian's own python3 refuses pip
  # (PEP 668) and gets Debian's package.
  python3 -m pip install --quiet "$python_missing" 2>/dev/null ||
    { $sudo apt-get update -qq && $sudo apt-get install -y -qq python3-prometheus-client; }
fi
