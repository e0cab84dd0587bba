#!/usr/bin/env bash
# Runs the Python client's tests against a prebuilt depot wheel, on a machine with CUDA GPUs
# and CuPy and/or PyTorch: the GPU tests first (pytest -m gpu: real GPUs, daemon started
# without simulated GPUs), then the whole of tests/python (simulated GPUs included).
#
#   scripts/python-gpu-check.sh WHEEL_DIR_OR_FILE [extra pytest arguments]
#
# Needs python3 with numpy and pytest (and cupy/torch for the GPU tests); no network: the
# wheel is installed with `pip install --no-index --no-deps --target $SITE`. The wheel links
# the host's libcapnp/libkj/libspdlog/libfmt/libxxhash shared libraries; if they live
# elsewhere, put their directory in DEPOT_LIBS (prepended to LD_LIBRARY_PATH).
# Environment: PYTHON (default python3), SITE (default /tmp/site, emptied first);
# EXTRA_PACKAGES, packages to install beside depot from the wheels in EXTRA_WHEELS (no index)
# where the host's Python cannot import them (scripts/gpu-check.sh: Dask and distributed);
# SUITES, the runs to make, in order (default "gpu all"): gpu (pytest -m gpu), all (the whole
# of tests/python), rest (all but the gpu tests: pytest -m "not gpu"); JUNIT_DIR, if set, gets
# a JUnit XML report of each run, pytest-<suite>.xml (scripts/gpu-check.sh sums them up).
set -uo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
source=${1:?usage: $0 WHEEL_DIR_OR_FILE [pytest arguments]}
shift
if [ -d "$source" ]; then
  wheel=$(ls -t "$source"/depot-*.whl 2>/dev/null | head -n 1)
else
  wheel=$source
fi
[ -n "$wheel" ] && [ -f "$wheel" ] || { echo "no depot wheel at $source" >&2; exit 2; }

PYTHON=${PYTHON:-python3}
SITE=${SITE:-/tmp/site}
rm -rf "$SITE"
mkdir -p "$SITE"
"$PYTHON" -m pip install --no-index --no-deps --target "$SITE" "$wheel" || exit 2
missing=()
for package in ${EXTRA_PACKAGES:-}; do
  "$PYTHON" -c "import $package" 2>/dev/null || missing+=("$package")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ -d "${EXTRA_WHEELS:-}" ]; then
    echo "== ${missing[*]} from $EXTRA_WHEELS"
    # Not fatal: the tests that need them skip, saying so.
    "$PYTHON" -m pip install -q --no-index --disable-pip-version-check \
      --find-links "$EXTRA_WHEELS" --target "$SITE" "${missing[@]}" ||
      echo "could not install ${missing[*]}: their tests skip" >&2
  else
    echo "${missing[*]} not importable and no wheels for them: their tests skip" >&2
  fi
fi

# pip --target puts the wheel's programs (depotd, depotctl) in $SITE/bin.
export DEPOT_DAEMON=${DEPOT_DAEMON:-$SITE/bin/depotd}
export PATH="$SITE/bin:$PATH"
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
if [ -n "${DEPOT_LIBS:-}" ]; then
  export LD_LIBRARY_PATH="$DEPOT_LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi

echo "== $wheel on $("$PYTHON" --version 2>&1)"
command -v nvidia-smi >/dev/null && nvidia-smi -L
"$PYTHON" - <<'PY'
import depot, depot._depot as d
print("depot", depot.__version__, "from", depot.__file__, "CUDA support:", d.HAVE_CUDA)
for name in ("numpy", "cupy", "torch"):
    try:
        m = __import__(name)
        print(name, m.__version__)
    except Exception as e:
        print(name, "unavailable:", type(e).__name__, e)
PY

cd "$repo"
status=0
for suite in ${SUITES:-gpu all}; do
  case $suite in
    gpu) select=(-m gpu) ;;
    all) select=() ;;
    rest) select=(-m "not gpu") ;;
    *) echo "SUITES: unknown suite $suite (gpu, all or rest)" >&2; exit 2 ;;
  esac
  junit=()
  [ -n "${JUNIT_DIR:-}" ] && junit=(--junitxml "$JUNIT_DIR/pytest-$suite.xml")
  echo "== pytest ${select[*]} tests/python"
  "$PYTHON" -m pytest -q -p no:cacheprovider -rs "${select[@]}" "${junit[@]}" tests/python "$@" ||
    status=1
done
exit $status
