# The two set-up commands: `make demo` and `make test`.
JOBS ?= $(shell nproc)
BUILD ?= build
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
CMAKE_FLAGS ?= -DCMAKE_BUILD_TYPE=RelWithDebInfo

.PHONY: all deps build build-asan build-tsan demo test unit format format-check install clean

all: build

deps:
	./scripts/install-deps.sh

build: deps
	cmake -S . -B $(BUILD) $(CMAKE_FLAGS) >/dev/null
	cmake --build $(BUILD) -j $(JOBS)

build-asan: deps
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DKVB_SANITIZE=ON >/dev/null
	cmake --build $(ASAN_BUILD) -j $(JOBS)

# ThreadSanitizer with clang, whose -Wthread-safety checks the lock
# annotations as errors.
build-tsan: deps
	cmake -S . -B $(TSAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVB_TSAN=ON \
	  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ >/dev/null
	cmake --build $(TSAN_BUILD) -j $(JOBS)

demo: build
	./$(BUILD)/bin/kvbridge demo

test: format-check build build-asan build-tsan
	./scripts/run-tests.sh $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD)

format:
	git ls-files '*.h' '*.cc' | xargs clang-format -i

format-check: deps
	git ls-files '*.h' '*.cc' | xargs clang-format --dry-run --Werror

install: build
	cmake --install $(BUILD)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD)
