#!/usr/bin/env bash
# The real-GPU check of issue 35, in three parts:
#
#   scripts/gpu-check.sh prepare    here, with network: fills .gpu-bundle/ (ignored) with what
#                                   a GPU host lacks to build depot (Debian packages, unpacked
#                                   into a relocatable prefix; Python build tools as wheels)
#   scripts/gpu-check.sh run        on the GPU host, no network needed: builds depot from the
#                                   bundle, runs the C++ gpu tests, bench_gpu, the Python GPU
#                                   tests and benchmark, and prints one summary
#   scripts/gpu-check.sh rehearse   here: `run` from a copy of the working tree and the bundle,
#                                   with every system file of the bundled packages hidden
#
# Why a bundle: the GPU host (device tool, bench/README.md "Real GPUs") has Python 3.12 with
# PyTorch, CuPy, numpy, pytest, CMake, ninja and the CUDA toolkit, but none of the Debian -dev
# packages depot builds against, and no network. The Python package is built there from
# source, since the host's Python (3.12) is not this machine's (3.11).
#
# run's environment (all optional): OUT (logs and summary.txt go there, at most 8 files; else
# GPU_CHECK_WORK/out), GPU_CHECK_WORK (default build-gpu-check/ in the repository: ignored,
# so a warm device machine keeps it between calls and a rerun rebuilds only what changed),
# GPU_CHECK_BUDGET (seconds for the whole run, default 450: the check must end within 8
# minutes), GPU_CHECK_STEPS (which steps, default all: unpack configure build ctest bench-gpu
# wheel pytest-gpu bench-python bench-dask-gpu pytest-rest), GPU_CHECK_SCALE (each step's own
# time limit is multiplied by it: the rehearsal's 2 cores are slower than the host's 16), JOBS
# (default nproc), PYTHON (default python3).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
self="$repo/scripts/gpu-check.sh"
bundle=${GPU_CHECK_BUNDLE:-$repo/.gpu-bundle}
arch=x86_64-linux-gnu

# The Debian 12 (bookworm) packages depot builds with (scripts/install-deps.sh) and their
# run-time libraries. libboost1.74-dev is what libboost-dev points to; gmock, googletest's
# sources and the pkg-config wrapper are not needed. pkgconf: the host may have no pkg-config,
# which CMakeLists.txt needs for libxxhash.
debs=(
  capnproto libcapnp-dev libcapnp-0.9.2
  libspdlog-dev libspdlog1.10 libfmt-dev libfmt9
  libxxhash-dev libxxhash0
  libboost1.74-dev
  libcli11-dev
  libgtest-dev
  libbenchmark-dev libbenchmark1debian
  pkgconf-bin libpkgconf3
)
# Pure-Python wheels for building the package without network: the versions rehearsed here,
# rather than whatever the host has (scikit-build-core's own needs included).
wheels=(scikit-build-core nanobind packaging pathspec)
# What the host lacks to run depot.dask's tests (its GPU ones among them: CuPy chunks paged
# through a GPU): Dask and distributed with what they need, as wheels for the host's Python
# (3.12; binary ones for manylinux x86-64), at the versions this machine's tests run with
# (build-py's venv) where there is one. None needs numpy or pandas, which the host has.
host_python=3.12
dask_wheels=(dask distributed)

usage() {
  sed -n '2,12p' "$self" | sed 's/^# \{0,1\}//'
  exit 2
}

# --------------------------------------------------------------------------------------------
# prepare
# --------------------------------------------------------------------------------------------
prepare() {
  tmp=$(mktemp -d "${TMPDIR:-/tmp}/depot-gpu-prepare-XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  mkdir -p "$tmp/debs" "$tmp/prefix" "$tmp/wheels"

  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  echo "== apt-get update; apt-get download ${#debs[@]} packages"
  $sudo apt-get update -qq
  # As root, apt drops to the _apt user to download, which cannot write into $tmp: stay root.
  (cd "$tmp/debs" && apt-get download -q -o APT::Sandbox::User=root "${debs[@]}")
  for d in "$tmp"/debs/*.deb; do dpkg-deb -x "$d" "$tmp/prefix"; done
  local usr="$tmp/prefix/usr"
  rm -rf "$usr/share/doc" "$usr/share/man" "$usr/share/lintian" "$usr/src"

  # Make the prefix relocatable: `run` unpacks it wherever its work folder is.
  # pkg-config files name /usr; make them relative to their own folder.
  sed -i -E 's#=/usr(/|$)#=${pcfiledir}/../../..\1#' "$usr/lib/$arch"/pkgconfig/*.pc
  sed -i -E 's#=/usr(/|$)#=${pcfiledir}/../..\1#' "$usr/share/pkgconfig"/*.pc
  # Cap'n Proto's CMake package names its compiler and schema folder by absolute path, and
  # requires OpenSSL for kj-tls, which depot does not link (the host may lack OpenSSL's headers).
  local capnp="$usr/lib/$arch/cmake/CapnProto/CapnProtoConfig.cmake"
  sed -i -e 's#/usr/bin/#${CMAKE_CURRENT_LIST_DIR}/../../../../bin/#' \
    -e 's#CAPNP_INCLUDE_DIRECTORY /usr/include#CAPNP_INCLUDE_DIRECTORY ${CMAKE_CURRENT_LIST_DIR}/../../../../include#' \
    -e 's#^if (yes)  \# WITH_OPENSSL#if (FALSE)  \# WITH_OPENSSL: off in depot'"'"'s GPU bundle (no TLS)#' \
    "$capnp"
  grep -q 'if (FALSE)  # WITH_OPENSSL' "$capnp" || { echo "prepare: could not patch $capnp" >&2; exit 1; }
  ln -s pkgconf "$usr/bin/pkg-config"
  # Nothing used may still point into the build machine's /usr. (The other CMake packages
  # compute their prefix from their own folder; their /usr lines only test for Debian's
  # symlinked layout.)
  local left
  left=$(grep -lE '(^|[ ="])/usr(/|$)' "$usr/lib/$arch"/pkgconfig/*.pc "$usr/share/pkgconfig"/*.pc "$capnp" || true)
  [ -z "$left" ] || { echo "prepare: absolute /usr paths left in: $left" >&2; exit 1; }
  [ -z "$(find "$usr" -type l -lname '/*')" ] || { echo "prepare: absolute symlinks in the prefix" >&2; exit 1; }

  echo "== pip download ${wheels[*]}"
  "${PYTHON:-python3}" -m pip download -q --disable-pip-version-check --no-deps \
    --only-binary=:all: -d "$tmp/wheels" "${wheels[@]}"
  local pinned=() name version
  for name in "${dask_wheels[@]}"; do
    version=$("$repo/build-py/venv/bin/python" -c "import $name; print($name.__version__)" \
      2>/dev/null || true)
    pinned+=("$name${version:+==$version}")
  done
  echo "== pip download ${pinned[*]} (and what they need) for Python $host_python"
  "${PYTHON:-python3}" -m pip download -q --disable-pip-version-check --only-binary=:all: \
    --python-version "$host_python" --implementation cp --platform manylinux2014_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 --platform any \
    -d "$tmp/py-wheels" "${pinned[@]}"

  rm -rf "$bundle"
  mkdir -p "$bundle/wheels" "$bundle/py-wheels"
  tar -C "$tmp/prefix" -czf "$bundle/prefix.tar.gz" usr
  cp "$tmp"/wheels/*.whl "$bundle/wheels/"
  cp "$tmp"/py-wheels/*.whl "$bundle/py-wheels/"
  {
    echo "depot GPU bundle, made $(date -u +%Y-%m-%dT%H:%MZ) on $(. /etc/os-release && echo "$PRETTY_NAME")"
    echo "by scripts/gpu-check.sh prepare; unpacked and used by scripts/gpu-check.sh run"
    echo
    echo "prefix.tar.gz (usr/, relocatable) from these Debian packages:"
    for d in "$tmp"/debs/*.deb; do
      dpkg-deb --showformat='${Package} ${Version}\n' -W "$d"
    done | sed 's/^/  /'
    echo "wheels/:"
    (cd "$bundle/wheels" && ls) | sed 's/^/  /'
    echo "py-wheels/ (for Python $host_python, installed beside depot where the host lacks Dask):"
    (cd "$bundle/py-wheels" && ls) | sed 's/^/  /'
    # What the host's C and C++ libraries must provide for the bundle's programs and libraries.
    if command -v objdump >/dev/null; then
      echo "needs on the host: $(find "$usr" -type f \( -name '*.so*' -o -path '*/bin/*' \) \
        -exec objdump -T {} + 2>/dev/null | grep -o 'GLIBC_[0-9.]*\|GLIBCXX_[0-9.]*' |
        sort -V | awk -F_ '{v[$1] = $0} END {print v["GLIBC"] ", " v["GLIBCXX"]}') or newer"
    fi
  } > "$bundle/MANIFEST"

  # The device tool sends the working tree (tracked files and untracked ones not ignored)
  # and the carried bundle, 64 MiB in all.
  local size tree
  size=$(du -cb "$bundle" | tail -n 1 | cut -f1)
  tree=$(cd "$repo" && git ls-files -z -co --exclude-standard |
    while IFS= read -r -d '' f; do [ -f "$f" ] && printf '%s\0' "$f"; done |
    xargs -0 du -cb 2>/dev/null | awk '$2 == "total" {s += $1} END {print s + 0}')
  cat "$bundle/MANIFEST"
  echo
  awk -v b="$size" -v t="$tree" -v dir="$bundle" 'BEGIN {
    m = 1048576
    printf "bundle:          %5.1f MiB in %s\n", b / m, dir
    printf "working tree:    %5.1f MiB (tracked and untracked files that travel with it)\n", t / m
    printf "left of 64 MiB:  %5.1f MiB\n", 64 - (b + t) / m
  }'
}

# --------------------------------------------------------------------------------------------
# run
# --------------------------------------------------------------------------------------------
work=${GPU_CHECK_WORK:-$repo/build-gpu-check}
out=${OUT:-$work/out}
P=$work/prefix/usr
steps_file=$work/steps.tsv

# Environment for building against the bundle. LD_LIBRARY_PATH only while building (capnp and
# pkgconf are the bundle's programs): the built programs find the bundle's libraries through
# their build RPATH, and the Python package through DEPOT_LIBS (python-gpu-check.sh).
build_env() {
  export CMAKE_PREFIX_PATH="$P"
  export PKG_CONFIG_PATH="$P/lib/$arch/pkgconfig:$P/share/pkgconfig"
  export PATH="$P/bin:$PATH"
  export LD_LIBRARY_PATH="$P/lib/$arch${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  # CMake 4 refuses packages asking for compatibility with CMake < 3.5; the bundle's are old.
  export CMAKE_POLICY_VERSION_MINIMUM=3.5
}

# The steps, each run by `step` in a process of its own under a timeout.
do_unpack() {
  local sum
  sum=$(sha256sum "$bundle/prefix.tar.gz" | cut -d' ' -f1)
  if [ "$(cat "$work/prefix/.bundle-sha256" 2>/dev/null)" = "$sum" ]; then
    echo "prefix already unpacked from this bundle: $work/prefix"
  else
    rm -rf "$work/prefix" "$work/build-tools"
    mkdir -p "$work/prefix"
    tar -C "$work/prefix" -xzf "$bundle/prefix.tar.gz"
    echo "$sum" > "$work/prefix/.bundle-sha256"
  fi
  [ -d "$work/build-tools" ] ||
    "$PYTHON" -m pip install -q --disable-pip-version-check --no-index --no-deps \
      --target "$work/build-tools" "$bundle"/wheels/*.whl
  ls "$P/bin" "$work/build-tools"
}

do_configure() {
  build_env
  local generator="Unix Makefiles"
  command -v ninja >/dev/null && generator=Ninja
  cmake -S "$repo" -B "$work/build" -G "$generator" -DCMAKE_BUILD_TYPE=Release \
    -DDEPOT_WERROR=OFF -DDEPOT_INSTALL=OFF
  # The point of the check is the CUDA backend: without the toolkit's headers it is not built.
  grep -q '^DEPOT_CUDA_INCLUDE_DIR:PATH=/' "$work/build/CMakeCache.txt" ||
    { echo "CUDA headers not found: the GPU backend would not be built" >&2; return 1; }
}

do_build() {
  build_env
  cmake --build "$work/build" -j "$JOBS" --target depotd depotctl gpu_test_client \
    gpu_cuda_test cuda_driver_test bench_gpu
}

do_ctest() {
  cd "$work/build"
  # One at a time: they share the one GPU, and timing-sensitive cases should not race.
  ctest -L gpu --output-on-failure --timeout 120 --output-junit "$work/ctest-gpu.xml"
}

do_bench_gpu() {
  "$work/build/bin/bench_gpu"
}

do_wheel() {
  build_env
  rm -rf "$work/dist"
  # The bundle's scikit-build-core and nanobind, ahead of the host's; no build isolation, so
  # pip fetches nothing.
  PYTHONPATH="$work/build-tools${PYTHONPATH:+:$PYTHONPATH}" CMAKE_BUILD_PARALLEL_LEVEL=$JOBS \
    "$PYTHON" -m pip wheel -v --no-index --no-build-isolation --no-deps --disable-pip-version-check \
    -w "$work/dist" --config-settings=build-dir="$work/build-py" \
    --config-settings=cmake.define.DEPOT_WERROR=OFF "$repo"
  ls -l "$work/dist"
}

# pytest through python-gpu-check.sh: it installs the wheel into SITE and runs the suite.
pytest_suite() {
  DEPOT_LIBS="$P/lib/$arch" SITE="$work/site" JUNIT_DIR="$work" SUITES="$1" PYTHON="$PYTHON" \
    EXTRA_WHEELS="$bundle/py-wheels" EXTRA_PACKAGES="${dask_wheels[*]}" \
    "$repo/scripts/python-gpu-check.sh" "$work/dist"
}
do_pytest_gpu() { pytest_suite gpu; }
do_pytest_rest() { pytest_suite rest; }

do_bench_python() {
  export PYTHONPATH="$work/site${PYTHONPATH:+:$PYTHONPATH}"
  export LD_LIBRARY_PATH="$P/lib/$arch${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export DEPOT_DAEMON="$work/site/bin/depotd" PATH="$work/site/bin:$PATH"
  cd "$repo/bench/python"
  # A 1 GB GPU array: the issue's goal is a 1 GB put at most 1.1x a device-to-device copy.
  "$PYTHON" bench_python.py --gpu-only --sizes 1GB --repeat 5
}

# Issue 40: the #7449 product on depot's scheduler through a GPU pool of a quarter of the
# array, against CuPy in one process and the CPU, with the cost model's choice. Needs dask,
# which the pytest steps installed into the site where the host has none.
do_bench_dask_gpu() {
  export PYTHONPATH="$work/site${PYTHONPATH:+:$PYTHONPATH}"
  export LD_LIBRARY_PATH="$P/lib/$arch${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export DEPOT_DAEMON="$work/site/bin/depotd" PATH="$work/site/bin:$PATH"
  cd "$repo/bench/python"
  echo "== bench_gpu_product.py"
  if nvidia-smi -L > /dev/null 2>&1; then
    "$PYTHON" bench_gpu_product.py --n 32768 --chunk 4096 --pool 2GiB --workers 8 \
      --store-memory 16GiB --repeat 1
  else  # a rehearsal: the script's plumbing, on a simulated GPU
    "$PYTHON" bench_gpu_product.py --simulate --n 4096 --chunk 1024 --pool 64MiB --workers 2 \
      --store-memory 1GiB --repeat 1
  fi
}

# step NAME MAX_SECONDS LOGFILE [ARGS]: runs do_NAME under a timeout that keeps the whole
# run inside its budget, appends its output to LOGFILE, and records how it ended. A failing
# step does not stop the run: the steps after it that need it say so and are skipped.
step() {
  local name=$1 max=$2 log=$3
  shift 3
  if [ -n "${GPU_CHECK_STEPS:-}" ] && [[ " $GPU_CHECK_STEPS " != *" $name "* ]]; then
    printf '%s\tnot asked\t0\t-\n' "$name" >> "$steps_file"
    return 0
  fi
  local left=$((deadline - $(date +%s) - 15))
  if [ "$left" -lt 10 ]; then
    printf '%s\tskipped: no time left\t0\t-\n' "$name" >> "$steps_file"
    echo "== $name: skipped, no time left"
    return 1
  fi
  max=$((max * ${GPU_CHECK_SCALE:-1}))
  local limit=$((max < left ? max : left)) start rc=0
  start=$(date +%s)
  echo "== $name (at most ${limit}s; log: $log)"
  echo "== $name: $(date -u +%H:%M:%S), at most ${limit}s" >> "$log"
  # In the background, so that a signal to this script (the device tool's own time limit,
  # Ctrl-C) can end the step too: timeout runs it in a process group of its own.
  timeout -k 10 "$limit" "$BASH" "$self" _step "$name" "$@" >> "$log" 2>&1 &
  step_pid=$! step_name=$name
  wait "$step_pid" || rc=$?
  step_pid=
  local took=$(($(date +%s) - start)) how=ok
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    how="TIMED OUT after ${limit}s"
  elif [ "$rc" -ne 0 ]; then
    how="FAILED (exit $rc)"
  fi
  printf '%s\t%s\t%s\t%s\n' "$name" "$how" "$took" "$(basename "$log")" >> "$steps_file"
  echo "   $name: $how in ${took}s"
  if [ "$rc" -ne 0 ]; then
    echo "   last lines of $(basename "$log"):"
    tail -n 25 "$log" | sed 's/^/   | /'
  fi
  return "$rc"
}

# Stopped from outside (the device tool's time limit, Ctrl-C): end the step under way, and
# still print what the run found so far.
interrupted() {
  trap - TERM INT HUP
  if [ -n "$step_pid" ]; then
    kill -TERM -- "-$step_pid" 2>/dev/null || true
    printf '%s\tINTERRUPTED\t%s\t-\n' "$step_name" "$(($(date +%s) - begin))" >> "$steps_file"
  fi
  summary "$(($(date +%s) - begin))" | tee "$out/summary.txt"
  exit 143
}

skip() {  # skip NAME REASON
  printf '%s\tskipped: %s\t0\t-\n' "$1" "$2" >> "$steps_file"
  echo "== $1: skipped, $2"
}

host_facts() {
  echo "date:     $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "host:     $(uname -srm); $(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME")"
  echo "glibc:    $(ldd --version 2>&1 | head -n 1)"
  echo "cores:    $(nproc); memory: $(free -g 2>/dev/null | awk '/^Mem/ {print $2 " GiB"}')"
  echo "c++:      $(c++ --version 2>&1 | head -n 1)"
  # The bundle's libraries (Debian 12, GCC 12) need glibc 2.34 and GLIBCXX_3.4.30.
  local libstdcxx
  libstdcxx=$(c++ -print-file-name=libstdc++.so.6 2>/dev/null)
  echo "libstdc++: $libstdcxx, newest $(grep -ao 'GLIBCXX_3\.4\.[0-9]*' "$libstdcxx" 2>/dev/null | sort -uV | tail -n 1) (the bundle needs GLIBCXX_3.4.30)"
  echo "cmake:    $(cmake --version 2>&1 | head -n 1); ninja $(ninja --version 2>&1)"
  echo "python:   $("$PYTHON" --version 2>&1) at $(command -v "$PYTHON")"
  echo "cuda.h:   $(grep -h -m1 '#define CUDA_VERSION' /usr/local/cuda/include/cuda.h 2>&1)"
  echo "libcuda:  $(ldconfig -p 2>/dev/null | grep -m1 'libcuda\.so\.1' || echo 'not in ldconfig -p')"
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader 2>&1 |
      sed 's/^/gpu:      /'
  else
    echo "gpu:      no nvidia-smi"
  fi
  "$PYTHON" - <<'PY' 2>&1
import importlib, sysconfig
import os
include = sysconfig.get_paths()["include"]
print("Python.h:", include, "" if os.path.exists(os.path.join(include, "Python.h")) else "(MISSING: the package cannot build)")
for name in ("numpy", "pytest", "torch", "cupy", "scikit_build_core", "nanobind", "cloudpickle", "dask", "pandas"):
    try:
        m = importlib.import_module(name)
        extra = ""
        if name == "torch":
            extra = f" (CUDA {m.version.cuda}, {m.cuda.device_count()} device(s))"
        print(f"  {name} {getattr(m, '__version__', '?')}{extra}")
    except Exception as e:
        print(f"  {name}: not importable ({type(e).__name__})")
PY
}

run() {
  PYTHON=${PYTHON:-python3}
  JOBS=${JOBS:-$(nproc)}
  local budget=${GPU_CHECK_BUDGET:-450}
  begin=$(date +%s)
  deadline=$((begin + budget))
  [ -f "$bundle/prefix.tar.gz" ] ||
    { echo "no bundle at $bundle: run 'scripts/gpu-check.sh prepare' (make gpu-check-prepare) first" >&2; exit 2; }
  # The interpreter's own scripts folder (cmake, ninja, pytest of a venv) may not be on PATH.
  PATH="$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_path("scripts"))'):$PATH"
  export PYTHON JOBS PATH GPU_CHECK_WORK="$work" GPU_CHECK_BUNDLE="$bundle" PYTHONUNBUFFERED=1
  step_pid=
  trap interrupted TERM INT HUP
  mkdir -p "$work" "$out"
  rm -f "$steps_file" "$work"/*.xml
  rm -f "$out"/{summary.txt,host.txt,build.log,ctest.log,bench.log,python.log,rest.log}
  host_facts > "$out/host.txt"
  cat "$out/host.txt"

  # Each step's own limit is for the 16-core host; the budget caps them all. The C++ half and
  # the Python half need only the unpacked bundle, so one failing does not stop the other.
  local unpacked=0 built=0 wheel=0 s
  step unpack 120 "$out/build.log" && unpacked=1
  if [ $unpacked = 0 ]; then
    for s in configure build ctest bench-gpu wheel pytest-gpu bench-python bench-dask-gpu \
      pytest-rest; do
      skip "$s" "the bundle did not unpack"
    done
  else
    if step configure 120 "$out/build.log"; then
      step build 300 "$out/build.log" && built=1
    else
      skip build "CMake's configure failed"
    fi
    if [ $built = 1 ]; then
      step ctest 150 "$out/ctest.log" || true
      step bench-gpu 120 "$out/bench.log" || true
    else
      skip ctest "the C++ build failed"
      skip bench-gpu "the C++ build failed"
    fi
    step wheel 240 "$out/python.log" && wheel=1
    if [ $wheel = 1 ]; then
      step pytest-gpu 150 "$out/python.log" || true
      step bench-python 120 "$out/bench.log" || true
      step bench-dask-gpu 150 "$out/bench.log" || true
      # The rest of tests/python (simulated GPUs), with the time left: a bonus, not required.
      step pytest-rest 600 "$out/rest.log" || true
    else
      for s in pytest-gpu bench-python bench-dask-gpu pytest-rest; do
        skip "$s" "the Python package did not build"
      done
    fi
  fi
  summary "$(($(date +%s) - begin))" | tee "$out/summary.txt"
}

# One summary of the run: steps, tests per suite, benchmark figures with baselines and ratios.
summary() {
  PYTHONUNBUFFERED=1 "$PYTHON" - "$work" "$out" "$1" <<'PY'
import collections, os, re, sys
import xml.etree.ElementTree as ET

work, out, took = sys.argv[1], sys.argv[2], int(sys.argv[3])

def read(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""

host = read(os.path.join(out, "host.txt"))
print("\n" + "=" * 78)
print(f"depot GPU check: {took} s")
for line in host.splitlines():
    if line.startswith(("date:", "gpu:", "c++:", "python:", "glibc:")):
        print("  " + line)

print("\nsteps:")
failed = False
for line in read(os.path.join(work, "steps.tsv")).splitlines():
    name, how, secs, log = line.split("\t")
    if how != "ok" and not how.startswith("not asked") and name != "pytest-rest":
        failed = True
    print(f"  {name:<14} {how:<34} {secs:>4} s  {'' if log == '-' else log}")

def junit(path):
    """(passed, failed, skipped, {reason: count}, [failed names]) of a JUnit XML file."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return None
    counts = collections.Counter()
    reasons = collections.Counter()
    failures = []
    for case in root.iter("testcase"):
        name = case.get("name", "?")
        if case.get("classname"):
            name = case.get("classname") + "." + name
        if case.find("failure") is not None or case.find("error") is not None:
            counts["failed"] += 1
            failures.append(name)
        elif case.find("skipped") is not None or case.get("status") in ("notrun", "disabled"):
            counts["skipped"] += 1
            skipped = case.find("skipped")
            why = (skipped.get("message") or "") if skipped is not None else ""
            if why == "collection skipped":  # a whole module: pytest puts why in the text
                m = re.search(r"Skipped: (.*)", skipped.text or "")
                why = re.sub(r"[\"']\)$", "", m.group(1)) if m else why
            # ctest: the reason is GoogleTest's line after "Skipped" in the output.
            text = case.findtext("system-out") or ""
            m = re.search(r"Skipped\n(.+)", text)
            if m:
                why = m.group(1)
            reasons[re.sub(r"\s+", " ", why).strip()[:150] or "(no reason given)"] += 1
        else:
            counts["passed"] += 1
    return counts["passed"], counts["failed"], counts["skipped"], reasons, failures

print("\ntests:")
suites = [("ctest -L gpu", "ctest-gpu.xml"), ("pytest -m gpu", "pytest-gpu.xml"),
          ("pytest -m 'not gpu'", "pytest-rest.xml")]
for title, name in suites:
    result = junit(os.path.join(work, name))
    if result is None:
        print(f"  {title:<20} no results")
        continue
    passed, nfailed, skipped, reasons, failures = result
    failed = failed or nfailed > 0
    print(f"  {title:<20} {passed:4d} passed {nfailed:4d} failed {skipped:4d} skipped")
    for f in failures[:20]:
        print(f"      FAILED  {f}")
    for why, n in reasons.most_common(8):
        print(f"      skipped {n:3d}x: {why}")

print("\nbench_gpu (figure, baseline, ratio):")
bench = read(os.path.join(out, "bench.log"))
m = re.search(r"\nSummary \(.*?\n((?:  .*\n?)*)", bench)
print(m.group(0).strip("\n") if m else "  no summary (see bench.log)")
print("\nbench_python.py --gpu-only:")
m = re.search(r"(get of a 100-byte object.*?)(?=\n== |\Z)", bench, re.S)
print("\n".join("  " + l for l in m.group(1).rstrip().splitlines()) if m else "  no figures (see bench.log)")
print("\nbench_gpu_product.py (issue 40):")
m = re.search(r"\n== bench_gpu_product\.py\n(.*?)(?=\n== |\Z)", bench, re.S)
print("\n".join("  " + l for l in m.group(1).rstrip().splitlines()[:40]) if m else "  not run (see bench.log)")

# The goals of issue 35 that these figures measure.
goals = []
m = re.search(r"first_import/1KiB\s+([\d.]+) ms", bench)
if m:
    goals.append(("first import of a chunk < 10 ms", f"{m.group(1)} ms", float(m.group(1)) < 10))
for d in ("h2d", "d2h"):
    m = re.search(rf"{d}/256MiB .*?:\s+([\d.]+)%", bench)
    if m:
        goals.append((f"{d} >= 80% of cuMemcpy", f"{m.group(1)}%", float(m.group(1)) >= 80))
m = re.search(r"put, warm pool .*?put / copy = ([\d.]+)x", bench)
if m and "1000 MB" in bench:
    goals.append(("1 GB put <= 1.1x a DtoD copy", f"{m.group(1)}x", float(m.group(1)) <= 1.1))
if goals and "bench_gpu: cuda GPUs" in bench:
    print("\ngoals (issue 35):")
    for what, value, ok in goals:
        print(f"  {'met ' if ok else 'MISSED'}  {what:<34} {value}")

print("\n" + ("FAILED: see the steps and tests above" if failed else "PASSED") +
      f"; logs in {out}")
sys.exit(1 if failed else 0)
PY
}

# --------------------------------------------------------------------------------------------
# rehearse
# --------------------------------------------------------------------------------------------
# Packages whose files the rehearsal hides: the bundled ones and anything else installed here
# that could stand in for them (so that a file missing from the bundle fails here).
hidden_packages=("${debs[@]}" libboost-dev libgmock-dev googletest pkgconf pkg-config libssl-dev)

rehearse() {
  [ -f "$bundle/prefix.tar.gz" ] || { echo "no bundle: run 'scripts/gpu-check.sh prepare' first" >&2; exit 2; }
  [ "$(id -u)" -eq 0 ] || { echo "rehearse needs root (unshare --mount, overlayfs)" >&2; exit 2; }
  local dir=${GPU_CHECK_REHEARSAL:-/tmp/depot-gpu-rehearsal}
  local venv=${GPU_CHECK_VENV:-/tmp/depot-gpu-rehearsal-venv}
  rm -rf "$dir"
  mkdir -p "$dir/repo" "$dir/hide" "$dir/out"

  # The GPU host's Python, as far as the check uses it, minus scikit-build-core and nanobind,
  # which must come from the bundle: kept between rehearsals.
  if [ ! -x "$venv/bin/python" ]; then
    "${PYTHON:-python3}" -m venv "$venv"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check numpy pytest cloudpickle \
      cmake ninja
  fi

  # What the device tool sends: tracked files and untracked ones git does not ignore (the
  # working tree as it is, uncommitted changes included, no .git), plus the carried bundle.
  (cd "$repo" && git ls-files -z -co --exclude-standard |
    while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done |
    tar --null -T - -cf -) | tar -C "$dir/repo" -xf -
  cp -r "$bundle" "$dir/repo/.gpu-bundle"

  # An overlay layer of whiteouts (character devices 0/0) over /usr hides every file of those
  # packages in a private mount namespace, leaving the rest of the system as it is.
  local p installed=()
  for p in "${hidden_packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" && installed+=("$p")
  done
  dpkg -L "${installed[@]}" | "${PYTHON:-python3}" -c '
import os, stat, sys
hide, n = sys.argv[1], 0
for f in sys.stdin.read().split("\n"):
    if f.startswith(("/lib/", "/bin/", "/sbin/")):
        f = "/usr" + f  # merged /usr
    if not f.startswith("/usr/") or not (os.path.islink(f) or os.path.isfile(f)):
        continue
    w = hide + f[len("/usr"):]
    if not os.path.lexists(w):
        os.makedirs(os.path.dirname(w), exist_ok=True)
        os.mknod(w, stat.S_IFCHR | 0o600, os.makedev(0, 0))
        n += 1
print(f"== rehearsal in {os.path.dirname(hide)}: {n} files of the bundled packages hidden")
' "$dir/hide"

  local begin rc=0
  begin=$(date +%s)
  unshare --mount --propagation private "$BASH" -euo pipefail -c '
    mount -t overlay depot-hide -o lowerdir="$1/hide":/usr /usr
    # Proof that the system copies are gone.
    for f in /usr/include/capnp/message.h /usr/include/boost/asio.hpp /usr/include/spdlog/spdlog.h \
        /usr/include/xxhash.h /usr/lib/x86_64-linux-gnu/libcapnp-0.9.2.so /usr/bin/capnp \
        /usr/bin/pkg-config; do
      if [ -e "$f" ]; then echo "rehearse: $f is still visible" >&2; exit 1; fi
    done
    cd "$1/repo"
    # pytest-rest (the whole Python suite on simulated GPUs) is left out: CI runs it here.
    : "${GPU_CHECK_STEPS=unpack configure build ctest bench-gpu wheel pytest-gpu bench-python \
bench-dask-gpu}"
    export GPU_CHECK_STEPS
    PATH="$2/bin:$PATH" OUT="$1/out" GPU_CHECK_WORK="$1/work" \
      JOBS=${JOBS:-2} GPU_CHECK_BUDGET=${GPU_CHECK_BUDGET:-5400} GPU_CHECK_SCALE=${GPU_CHECK_SCALE:-10} \
      nice -n "${NICE:-10}" "$BASH" scripts/gpu-check.sh run
  ' rehearse "$dir" "$venv" || rc=$?
  echo "rehearsal: exit $rc after $(($(date +%s) - begin)) s; logs in $dir/out"
  return "$rc"
}

case ${1:-} in
  prepare) prepare ;;
  run) run ;;
  rehearse) rehearse ;;
  _step) shift; name=$1; shift; set -x; "do_${name//-/_}" "$@" ;;
  *) usage ;;
esac
