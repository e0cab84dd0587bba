#!/bin/sh
# Builds the Debian package (cpack) and checks it: its control fields and dependencies, the
# files it holds, lintian (no errors), and that it unpacks into a fresh root (dpkg --root)
# whose depotd runs and accepts the packaged configuration.
#
#   package_test.sh BUILD_DIR LIBDIR      (LIBDIR: CMAKE_INSTALL_LIBDIR, e.g. lib)
#
# scripts/check-package.sh goes further where debootstrap and a Debian mirror are at hand:
# apt install of the package into a fresh Debian 12 root.
set -eu
build=$1
libdir=$2
work=$(mktemp -d "${TMPDIR:-/tmp}/depot-package-XXXXXX")
trap 'rm -rf "$work"' EXIT
fail() {
  echo "FAILED: $*" >&2
  exit 1
}

cpack --config "$build/CPackConfig.cmake" -B "$work" > "$work/cpack.log" 2>&1 ||
  { cat "$work/cpack.log"; fail "cpack"; }
deb=$(ls "$work"/depot_*_*.deb)
echo "built $deb"

[ "$(dpkg-deb -f "$deb" Package)" = depot ] || fail "Package: $(dpkg-deb -f "$deb" Package)"
depends=$(dpkg-deb -f "$deb" Depends)
for lib in libc6 libcapnp libspdlog libfmt libxxhash libstdc++6; do
  case $depends in *$lib*) ;; *) fail "Depends lacks $lib: $depends" ;; esac
done
dpkg-deb --ctrl-tarfile "$deb" | tar -xO ./conffiles | grep -qx /etc/depot/depotd.toml ||
  fail "/etc/depot/depotd.toml is not a conffile"
contents=$(dpkg-deb --contents "$deb" | awk '{print $6}')
for f in ./usr/bin/depotd ./usr/bin/depotctl ./usr/include/depot/client.h \
  ./usr/$libdir/libdepot_client.so.0.1.0 ./usr/$libdir/libdepot_client.a \
  ./usr/$libdir/cmake/depot/depotConfig.cmake ./usr/$libdir/pkgconfig/depot.pc \
  ./usr/lib/systemd/system/depotd.service ./usr/lib/sysusers.d/depot.conf \
  ./etc/depot/depotd.toml ./usr/share/doc/depot/copyright; do
  echo "$contents" | grep -qx "$f" || fail "the package lacks $f"
done
if echo "$contents" | grep -q 'include/depot/ipc\|capnp'; then fail "internal headers packaged"; fi

# lintian: errors fail; warnings are those of one package holding a library with its -dev
# files and a daemon without manual pages (README, "Operating depotd").
command -v lintian > /dev/null || fail "lintian is missing (scripts/install-deps.sh installs it)"
lintian --tag-display-limit 0 "$deb" > "$work/lintian.log" 2>&1 || true
if grep '^E:' "$work/lintian.log"; then fail "lintian errors"; fi

# A fresh root with an empty package database.
root=$work/root
mkdir -p "$root/var/lib/dpkg/info" "$root/var/lib/dpkg/updates" "$root/var/lib/dpkg/triggers"
touch "$root/var/lib/dpkg/status"
dpkg --root="$root" --force-depends --force-not-root --force-script-chrootless \
  --log=/dev/null --unpack "$deb" > "$work/dpkg.log" 2>&1 || { cat "$work/dpkg.log"; fail "dpkg --unpack"; }
grep -q '^Package: depot$' "$root/var/lib/dpkg/status" || fail "dpkg did not record the package"
version=$("$root/usr/bin/depotd" --version) || fail "the packaged depotd does not run"
[ "$version" = "depotd $(dpkg-deb -f "$deb" Version)" ] || fail "depotd --version: $version"
# Unpacked, not configured (that would run postinst, which adds a user, on this host): the
# conffile waits beside its place.
"$root/usr/bin/depotd" --config "$root/etc/depot/depotd.toml.dpkg-new" --socket-group "$(id -g)" \
  --share-writable-with-group "$(id -g)" --check-config || fail "the packaged configuration"
grep -q "^ExecStart=/usr/bin/depotd --config /etc/depot/depotd.toml$" \
  "$root/usr/lib/systemd/system/depotd.service" || fail "the unit's ExecStart"
echo "package: ok ($depends)"
