#!/bin/sh
# Installs the wheel (scripts/build-wheel.sh) into a venv on a fresh Debian 12 root that has
# Python and nothing of depot's build dependencies, and runs depotd and the client from it.
# Needs root, debootstrap and a Debian mirror and PyPI (about two minutes).
#
#   scripts/check-wheel.sh build-py/dist/depot-*.whl
set -eu
wheel=$(realpath "$1")
root=$(mktemp -d "${TMPDIR:-/tmp}/depot-wheel-root-XXXXXX")
chmod 755 "$root"
cleanup() {
  umount "$root/proc" 2>/dev/null || true
  mountpoint -q "$root/proc" || rm -rf --one-file-system "$root"
}
trap cleanup EXIT
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$root" \
  http://deb.debian.org/debian > "$root.log" 2>&1 || { tail "$root.log"; exit 1; }
rm -f "$root.log"
mount -t proc proc "$root/proc"
# The wheel and its one declared dependency, fetched here (where pip is set up for this
# network), installed there from files only.
mkdir "$root/tmp/wheels"
cp "$wheel" "$root/tmp/wheels/"
python3 -m pip download --quiet --disable-pip-version-check --only-binary=:all: \
  --python-version 3.11 -d "$root/tmp/wheels" "$wheel"
chroot "$root" sh -ec "
  # (libxxhash0 is part of every Debian: apt needs it. The wheel carries its own anyway.)
  for lib in libcapnp libkj libspdlog libfmt; do
    if ls /usr/lib/x86_64-linux-gnu/\$lib* > /dev/null 2>&1; then
      echo \"\$lib is on this system: not a fair check\"; exit 1
    fi
  done
  python3 -m venv /opt/venv
  /opt/venv/bin/pip install --quiet --no-index --find-links /tmp/wheels \
    /tmp/wheels/$(basename "$wheel")
  /opt/venv/bin/depotd --version
  /opt/venv/bin/python -c '
import depot
with depot.start_daemon(memory=\"64MiB\") as daemon, daemon.client() as client:
    ref = client.put(b\"hello\" * 1000)
    assert bytes(client.get(ref)) == b\"hello\" * 1000
    print(\"put and get through\", daemon.socket, \"ok\")
'
  /opt/venv/bin/pip list --format=freeze
"
echo "the wheel on a fresh Debian 12 with Python only: ok"
