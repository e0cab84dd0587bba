#!/bin/sh
# Installs the build into a fresh prefix (cmake --install), then checks it as another project
# would use it: only public headers are there; examples/cpp builds against it with
# find_package (the shared and the static library) and with pkg-config; and the installed
# depotd, started from the installed configuration, serves those programs, runs with the
# file's settings, reloads on SIGHUP, and refuses a file with a bad key or value.
#
#   consumer_test.sh BUILD_DIR SOURCE_DIR LIBDIR      (LIBDIR: CMAKE_INSTALL_LIBDIR, e.g. lib)
set -eu
build=$1
source=$2
libdir=$3
work=$(mktemp -d "${TMPDIR:-/tmp}/depot-install-XXXXXX")
daemon=
cleanup() {
  [ -n "$daemon" ] && kill "$daemon" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
fail() {
  echo "FAILED: $*" >&2
  exit 1
}

prefix=$work/prefix
cmake --install "$build" --prefix "$prefix" > "$work/install.log"

# The public headers, and nothing of Cap'n Proto or ipc/.
headers=$(cd "$prefix/include" && find . -type f | sort | tr '\n' ' ')
[ "$headers" = "./depot/buffer.h ./depot/client.h ./depot/device_buffer.h ./depot/object_id.h ./depot/status.h ./depot/task.h ./depot/worker.h " ] ||
  fail "installed headers: $headers"
if grep -rn 'capnp\|kj/\|depot/ipc' "$prefix/include"; then fail "a public header names an internal one"; fi
for f in bin/depotd bin/depotctl $libdir/libdepot_client.a $libdir/cmake/depot/depotConfig.cmake \
  $libdir/pkgconfig/depot.pc lib/systemd/system/depotd.service etc/depot/depotd.toml; do
  [ -e "$prefix/$f" ] || fail "$f was not installed"
done
[ -e "$prefix/$libdir/libdepot_client.so" ] || fail "lib/libdepot_client.so was not installed"

# The unit, as systemd reads it (systemd-analyze comes with the systemd package, which
# scripts/install-deps.sh installs).
systemd-analyze verify "$prefix/lib/systemd/system/depotd.service" ||
  fail "systemd-analyze verify depotd.service"
grep -q "^ExecStart=$prefix/bin/depotd --config $prefix/etc/depot/depotd.toml\$" \
  "$prefix/lib/systemd/system/depotd.service" || fail "the unit's ExecStart"

# The example project, against the installed package: shared, then static.
for kind in shared static; do
  static=OFF
  [ $kind = static ] && static=ON
  cmake -S "$source/examples/cpp" -B "$work/example-$kind" -DCMAKE_PREFIX_PATH="$prefix" \
    -DDEPOT_EXAMPLE_STATIC=$static > "$work/configure-$kind.log" 2>&1 ||
    { cat "$work/configure-$kind.log"; fail "configuring examples/cpp ($kind)"; }
  cmake --build "$work/example-$kind" > "$work/build-$kind.log" 2>&1 ||
    { cat "$work/build-$kind.log"; fail "building examples/cpp ($kind)"; }
done
if ldd "$work/example-static/depot_example" | grep -q depot_client; then
  fail "the static example links libdepot_client.so"
fi
ldd "$work/example-shared/depot_example" | grep -q "libdepot_client.so.* => $prefix/$libdir/" ||
  fail "the shared example does not link the installed libdepot_client.so"
# And with pkg-config, as a Makefile would.
flags=$(PKG_CONFIG_PATH="$prefix/$libdir/pkgconfig" pkg-config --cflags --libs depot)
c++ -std=c++20 "$source/examples/cpp/main.cc" -o "$work/example-pkgconfig" $flags \
  -Wl,-rpath,"$prefix/$libdir" || fail "building with pkg-config ($flags)"

# The installed daemon, from the installed configuration; the flags put its socket here and
# give it this user's group instead of a depot group.
socket=$work/depot.sock
config=$prefix/etc/depot/depotd.toml
# As installed, it names the depot group, which only the package creates.
if ! "$prefix/bin/depotd" --config "$config" --check-config > "$work/check.log" 2>&1; then
  grep -q "$config: socket-group: 'depot' is not a group of this host" "$work/check.log" ||
    fail "checking the installed configuration: $(cat "$work/check.log")"
fi
set -- --config "$config" --socket "$socket" --socket-group "$(id -g)" \
  --share-writable-with-group "$(id -g)" --memory 64MiB --segment-size 16MiB --no-gpus
"$prefix/bin/depotd" "$@" --check-config || fail "the installed configuration does not check"
"$prefix/bin/depotd" "$@" --exit-with-pid $$ > "$work/depotd.log" 2>&1 &
daemon=$!
tries=0
until "$prefix/bin/depotctl" --socket "$socket" status > /dev/null 2>&1; do
  tries=$((tries + 1))
  [ $tries -lt 500 ] || { cat "$work/depotd.log"; fail "depotd did not start within 50 s"; }
  kill -0 "$daemon" 2>/dev/null || { cat "$work/depotd.log"; fail "depotd exited"; }
  sleep 0.1
done
"$prefix/bin/depotctl" --socket "$socket" status --json > "$work/status.json"
grep -q "\"config_file\": *\"$config\"" "$work/status.json" || fail "status: $(cat "$work/status.json")"
for program in example-shared/depot_example example-static/depot_example example-pkgconfig; do
  out=$("$work/$program" "$socket") || fail "$program: $out"
  case $out in
    "read back 26 bytes of "*) ;;
    *) fail "$program printed: $out" ;;
  esac
  "$prefix/bin/depotctl" --socket "$socket" rm depot-example/greeting > /dev/null ||
    fail "depotctl rm after $program"
done
# Its settings are the installed file's, under the flags.
setting() {
  "$prefix/bin/depotctl" --socket "$socket" status --json |
    python3 -c "import json, sys; print(json.load(sys.stdin)['settings']['$1'])"
}
[ "$(setting memory)" = 64MiB ] || fail "memory: $(setting memory)"
[ "$(setting socket-mode)" = 0660 ] || fail "socket-mode: $(setting socket-mode)"
[ "$(setting log-level)" = info ] || fail "log-level: $(setting log-level)"
[ "$(stat -c %a "$socket")" = 660 ] || fail "the socket's mode: $(stat -c %a "$socket")"

# SIGHUP (systemctl reload) applies a changed log level from the file.
sed -i 's/^log-level = "info"$/log-level = "debug"/' "$config"
kill -HUP "$daemon"
tries=0
until [ "$(setting log-level)" = debug ]; do
  tries=$((tries + 1))
  [ $tries -lt 100 ] || fail "the reload did not show within 10 s: $(cat "$work/depotd.log")"
  sleep 0.1
done
grep -q "SIGHUP: log-level is now debug (was info)" "$work/depotd.log" ||
  fail "the reload was not logged: $(cat "$work/depotd.log")"

# A key the daemon does not know, and a value it cannot use, stop it naming them.
sed 's/^memory = .*/memroy = "1GiB"/' "$config" > "$work/typo.toml"
if "$prefix/bin/depotd" --config "$work/typo.toml" --check-config > "$work/typo.log" 2>&1; then
  fail "a file with an unknown key checks"
fi
grep -q "$work/typo.toml: unknown key 'memroy' (did you mean 'memory'?)" "$work/typo.log" ||
  fail "unknown key: $(cat "$work/typo.log")"
sed 's/^memory = .*/memory = "lots"/' "$config" > "$work/bad.toml"
"$prefix/bin/depotd" --config "$work/bad.toml" --memory=8GiB --socket-group "$(id -g)" \
  --share-writable-with-group "$(id -g)" --check-config > /dev/null || fail "a flag overrides the file"
if "$prefix/bin/depotd" --config "$work/bad.toml" --socket-group "$(id -g)" \
  --share-writable-with-group "$(id -g)" --check-config > "$work/bad.log" 2>&1; then
  fail "a file with a bad value checks"
fi
grep -q "$work/bad.toml: memory: 'lots' is not a size" "$work/bad.log" ||
  fail "bad value: $(cat "$work/bad.log")"

kill "$daemon"
wait "$daemon" || fail "depotd exited with $? after SIGTERM: $(cat "$work/depotd.log")"
daemon=
echo "install, find_package (shared and static), pkg-config and the installed depotd: ok"
