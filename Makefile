# The two commands of the README: `make run` and `make test`. Everything else is CMake.
BUILD      ?= build
ASAN_BUILD ?= build-asan
JOBS       ?= $(shell nproc)
# Flags for `make run`, e.g. make run DEPOTD_ARGS="--memory 8GiB"
DEPOTD_ARGS ?=

.PHONY: all deps build run test test-release test-asan bench format clean

all: build

deps:
	@scripts/install-deps.sh

$(BUILD)/build.ninja: | deps
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release

build: deps $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS)

# Builds, then runs depotd in the foreground; its first log lines say where its socket is.
run: build
	exec $(BUILD)/bin/depotd $(DEPOTD_ARGS)

# Every test: the Release build, then the same suite under AddressSanitizer + UBSan.
test: test-release test-asan

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

# Runs every benchmark program (see bench/README.md).
bench: build
	@for b in $(BUILD)/bin/bench_*; do echo "== $$b"; $$b || exit 1; done

format:
	clang-format -i $$(git ls-files '*.h' '*.cc')

clean:
	rm -rf $(BUILD) $(ASAN_BUILD)
