#!/bin/sh
# Installs the Debian package with apt into a fresh Debian 12 root, as a new user of the
# package would on a fresh machine, and runs the daemon from it. Needs root, debootstrap and a
# Debian mirror (about a minute); the test suite's install.package test does what needs
# neither.
#
#   scripts/check-package.sh build/depot_0.1.0_amd64.deb
set -eu
deb=$(realpath "$1")
root=$(mktemp -d "${TMPDIR:-/tmp}/depot-debian12-XXXXXX")
chmod 755 "$root"  # the root of the new system: its users must traverse it
cleanup() {
  umount "$root/proc" 2>/dev/null || true
  # Never delete through a /proc still mounted.
  mountpoint -q "$root/proc" || rm -rf --one-file-system "$root"
}
trap cleanup EXIT
debootstrap --variant=minbase bookworm "$root" http://deb.debian.org/debian > "$root.log" 2>&1 ||
  { tail "$root.log"; exit 1; }
rm -f "$root.log"
mount -t proc proc "$root/proc"
cp "$deb" "$root/tmp/"
chroot "$root" sh -ec "
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq /tmp/$(basename "$deb") > /dev/null
  depotd --version
  getent passwd depot
  depotd --config /etc/depot/depotd.toml --check-config
  # As the unit runs it: user depot, the socket in /run/depot for the depot group.
  install -d -o depot -g depot -m 750 /run/depot
  setpriv --reuid=depot --regid=depot --init-groups \
    depotd --config /etc/depot/depotd.toml --memory 64MiB > /tmp/depotd.log 2>&1 &
  daemon=\$!
  trap 'kill \$daemon 2> /dev/null || true' EXIT
  export DEPOT_SOCKET=/run/depot/depot.sock DEPOT_DAEMON_UID=\$(id -u depot)
  for i in \$(seq 100); do depotctl status > /dev/null 2>&1 && break; sleep 0.1; done
  ls -l /run/depot/depot.sock || { cat /tmp/depotd.log; exit 1; }
  echo hello > /tmp/object
  depotctl put /tmp/object --name greeting
  depotctl get greeting -o /tmp/copy && cmp /tmp/object /tmp/copy
"
echo "apt install into a fresh Debian 12: ok"
