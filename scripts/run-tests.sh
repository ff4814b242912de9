#!/usr/bin/env bash
# Runs every test: ctest in the normal build, the Python tests, then ctest
# again under ASan+UBSan and under ThreadSanitizer, then each libFuzzer target
# for FUZZ_SECONDS (default 10; scripts/run-fuzz.sh). In each build the unit
# tests (label unit: one process, no timing across processes) run two at a
# time; the process tests, whose detection bounds are timed, one at a time.
set -euo pipefail
build=${1:-build}
asan=${2:-build-asan}
tsan=${3:-build-tsan}
fuzz=${4:-build-fuzz}
here=$(cd "$(dirname "$0")/.." && pwd)
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$here/tests/lsan.supp:print_suppressions=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
# ctest over build $1 with timeout $2: unit tests two at a time, then the rest.
run_ctest() {
  ctest --test-dir "$1" --output-on-failure --timeout "$2" -L unit -j 2
  ctest --test-dir "$1" --output-on-failure --timeout "$2" -LE unit
}
echo "== tests ($build)"
run_ctest "$build" 300
echo "== python tests ($build, Debian's python3)"
PYTHONPATH="$(cd "$build" && pwd)/python" /usr/bin/python3 -m pytest -q -p no:cacheprovider \
  "$here/python/tests"
echo "== tests under AddressSanitizer + UndefinedBehaviorSanitizer ($asan)"
run_ctest "$asan" 600
if [ -d "$tsan" ]; then
  echo "== tests under ThreadSanitizer ($tsan)"
  TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1:suppressions=$here/tests/tsan.supp} \
    run_ctest "$tsan" 600
fi
if [ -d "$fuzz/fuzz" ]; then
  echo "== fuzz targets, ${FUZZ_SECONDS:-10} s each ($fuzz)"
  "$here/scripts/run-fuzz.sh" "$fuzz" "${FUZZ_SECONDS:-10}"
fi
