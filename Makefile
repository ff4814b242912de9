# The two set-up commands: `make demo` and `make test`.
JOBS ?= $(shell nproc)
BUILD ?= build
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
FUZZ_BUILD ?= build-fuzz
# Seconds each fuzz target runs: in `make fuzz`, and in `make test`.
FUZZ_SECONDS ?= 60
FUZZ_TEST_SECONDS ?= 10
CMAKE_FLAGS ?= -DCMAKE_BUILD_TYPE=RelWithDebInfo
# Four trees of one source: ccache (when installed) compiles each file once
# per compiler and flags. Paths are hashed relative to this checkout, so a
# second clone on the same machine reuses the cache too. Expanded when a
# recipe runs (=, not :=): on a fresh machine ccache is there only once
# `deps` has installed it.
LAUNCHER = $(if $(shell command -v ccache),-DCMAKE_C_COMPILER_LAUNCHER=ccache \
  -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
export CCACHE_BASEDIR := $(CURDIR)
export CCACHE_NOHASHDIR := 1

.PHONY: all deps build build-asan build-tsan build-fuzz demo test fuzz unit format format-check \
  install clean

all: build

deps:
	./scripts/install-deps.sh

build: deps
	cmake -S . -B $(BUILD) $(CMAKE_FLAGS) $(LAUNCHER) >/dev/null
	cmake --build $(BUILD) -j $(JOBS)

build-asan: deps
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DKVB_SANITIZE=ON $(LAUNCHER) >/dev/null
	cmake --build $(ASAN_BUILD) -j $(JOBS)

# ThreadSanitizer with clang, whose -Wthread-safety checks the lock
# annotations as errors.
build-tsan: deps
	cmake -S . -B $(TSAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVB_TSAN=ON \
	  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ $(LAUNCHER) >/dev/null
	cmake --build $(TSAN_BUILD) -j $(JOBS)

# libFuzzer targets (fuzz/*.cc) with ASan + UBSan, built with clang.
build-fuzz: deps
	cmake -S . -B $(FUZZ_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVB_FUZZ=ON \
	  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ $(LAUNCHER) >/dev/null
	cmake --build $(FUZZ_BUILD) -j $(JOBS) --target fuzz

# Each fuzz target for FUZZ_SECONDS (`make test` runs them for FUZZ_TEST_SECONDS).
fuzz: build-fuzz
	./scripts/run-fuzz.sh $(FUZZ_BUILD) $(FUZZ_SECONDS)

demo: build
	./$(BUILD)/bin/kvbridge demo

test: format-check build build-asan build-tsan build-fuzz
	FUZZ_SECONDS=$(FUZZ_TEST_SECONDS) ./scripts/run-tests.sh $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD) \
	  $(FUZZ_BUILD)

format:
	git ls-files '*.h' '*.cc' | xargs clang-format -i

format-check: deps
	git ls-files '*.h' '*.cc' | xargs clang-format --dry-run --Werror

install: build
	cmake --install $(BUILD)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD) $(FUZZ_BUILD)
