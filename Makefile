# The two commands of the README: `make run` and `make test`. Everything else is CMake.
BUILD      ?= build
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
PY_BUILD   ?= build-py
PYTHON     ?= python3
JOBS       ?= $(shell nproc)
# Flags for `make run`, e.g. make run DEPOTD_ARGS="--memory 8GiB"
DEPOTD_ARGS ?=

.PHONY: all deps build install package wheel run test test-release test-asan test-tsan test-python python-install stubs format-check bench format clean \
  gpu-check-prepare gpu-check-rehearse gpu-check

all: build

deps:
	@scripts/install-deps.sh

$(BUILD)/build.ninja: | deps
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release

build: deps $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS)

# Installs depotd, depotctl, the client library and headers, the CMake package, depot.pc and
# the systemd unit under PREFIX (README, "Operating depotd").
PREFIX ?= /usr/local
install: build
	cmake --install $(BUILD) --prefix $(PREFIX)

# A Debian package of all that, in $(BUILD): apt install ./$(BUILD)/depot_*.deb
package: build
	cd $(BUILD) && cpack

# Builds, then runs depotd in the foreground; its first log lines say where its socket is.
run: build
	exec $(BUILD)/bin/depotd $(DEPOTD_ARGS)

# Every test: formatting, the Release build, then the same suite under AddressSanitizer +
# UBSan and under ThreadSanitizer, then the Python package.
test: format-check test-release test-asan test-tsan test-python

format-check: deps
	clang-format --dry-run --Werror $$(git ls-files '*.h' '*.cc')

test-release: build
	cd $(BUILD) && ctest --output-on-failure -j 2 --timeout 300

$(ASAN_BUILD)/build.ninja: | deps
	cmake -S . -B $(ASAN_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DDEPOT_SANITIZE=address,undefined -DDEPOT_BUILD_BENCHMARKS=OFF

test-asan: deps $(ASAN_BUILD)/build.ninja
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
	  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  ctest --output-on-failure -j 2 --timeout 600

$(TSAN_BUILD)/build.ninja: | deps
	cmake -S . -B $(TSAN_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DDEPOT_SANITIZE=thread -DDEPOT_BUILD_BENCHMARKS=OFF

# Tests fork client processes from a parent whose Client has a release-flusher thread; the
# children never touch the parent's Client, so threads after fork are fine (die_after_fork=0).
# Six tests are skipped here: their children (forked, then connecting a Client of their
# own) start a flusher thread on the stack glibc reclaimed from the parent's, so the thread
# gets the parent thread's id and TSan aborts with "dup thread" (a TSan limitation with fork,
# not a race). The Release and ASan runs cover them.
TSAN_SKIP = LifecycleTest.ReaderInAnotherProcessSeesTheObjectInSharedMemoryWithoutCopy|SharedWithUserTest.ASharedUidReadsButCannotChangeAnything|SharedWithGroupTest.AMemberOfASharedGroupReadsButCannotWrite|SharedWritersTest\.|PrivateCopyTest.WritesInAChildProcessAreItsOwn

test-tsan: deps $(TSAN_BUILD)/build.ninja
	cmake --build $(TSAN_BUILD) -j $(JOBS)
	cd $(TSAN_BUILD) && TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:die_after_fork=0 \
	  ctest --output-on-failure -j 2 --timeout 600 -E '$(TSAN_SKIP)'

# The Python package in a venv under $(PY_BUILD), with what its checks need (PyTorch from
# PyPI brings its CUDA libraries: about 6 GB and a minute to install, so that the tests of
# depot.multiprocessing with tensors run): `pip install .`
# (so the packaging is tested too; the CMake build is kept in $(PY_BUILD)/<wheel tag> between
# runs). nanobind is the version the build pins (pyproject.toml), whose stub generator wrote
# client/python/depot/_depot.pyi.
PY_VENV  = $(PY_BUILD)/venv/bin/python
NANOBIND = $(shell sed -n 's/.*"\(nanobind==[^"]*\)".*/\1/p' pyproject.toml)
# The stubs of depot._depot, private names (_register_errors, _fields) included, with the
# entries of client/python/stubgen.patterns written as it says.
STUBGEN  = $(PY_VENV) -m nanobind.stubgen -q -P -p client/python/stubgen.patterns -m depot._depot

python-install: deps
	test -x $(PY_VENV) || $(PYTHON) -m venv $(PY_BUILD)/venv
	$(PY_VENV) -m pip install --quiet --disable-pip-version-check pytest numpy \
	  pytest-asyncio 'dask[array]' distributed pandas pyarrow zarr cubed xarray mypy torch paddlepaddle \
	  '$(NANOBIND)'
	CMAKE_BUILD_PARALLEL_LEVEL=$(JOBS) $(PY_VENV) -m pip install --quiet \
	  --disable-pip-version-check --config-settings=build-dir='$(abspath $(PY_BUILD))/{wheel_tag}' .

# The package's types, then pytest against private daemons (tests/python), then the wheel for
# other machines (make wheel). The stubs of depot._depot must be what the stub generator
# writes for the module just built (else: make stubs); mypy then checks the package with them
# (pyproject.toml, [tool.mypy]). (mypy's stubtest cannot read the signatures of nanobind's
# functions, so the stubs are compared with the generator's output instead.)
test-python: python-install
	$(STUBGEN) -o $(PY_BUILD)/_depot.pyi
	diff -u client/python/depot/_depot.pyi $(PY_BUILD)/_depot.pyi || \
	  { echo "client/python/depot/_depot.pyi is not what the binding builds: run make stubs" >&2; exit 1; }
	$(PY_VENV) -m mypy --cache-dir $(PY_BUILD)/mypy-cache
	$(PY_VENV) -m pytest -q -p no:cacheprovider tests/python
	scripts/build-wheel.sh $(PY_VENV) $(PY_BUILD)/dist

# Writes client/python/depot/_depot.pyi anew from the binding as built: after changing
# client/python/src/, run it and commit the stubs with the change.
stubs: python-install
	$(STUBGEN) -o client/python/depot/_depot.pyi

# The wheel for other machines, in $(PY_BUILD)/dist: the libraries depotd, depotctl and the
# module need beyond glibc and libstdc++ are inside (auditwheel), checked by the script.
wheel: deps
	test -x $(PY_BUILD)/venv/bin/python || $(PYTHON) -m venv $(PY_BUILD)/venv
	CMAKE_BUILD_PARALLEL_LEVEL=$(JOBS) scripts/build-wheel.sh $(PY_BUILD)/venv/bin/python $(PY_BUILD)/dist

# Runs every benchmark program (see bench/README.md).
bench: build
	@for b in $(BUILD)/bin/bench_*; do echo "== $$b"; $$b || exit 1; done

# The real-GPU check (bench/README.md, "Real GPUs"). prepare: here, with network, fills
# .gpu-bundle/ with what a GPU host lacks to build depot; rehearse: here, as root, runs the
# check from a copy of the working tree and the bundle alone; gpu-check: on the GPU host.
gpu-check-prepare:
	scripts/gpu-check.sh prepare

gpu-check-rehearse:
	scripts/gpu-check.sh rehearse

gpu-check:
	scripts/gpu-check.sh run

format:
	clang-format -i $$(git ls-files '*.h' '*.cc')

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD) $(PY_BUILD)
