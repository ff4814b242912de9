#!/usr/bin/env bash
# Runs every test: ctest in the normal build, the Python tests, then ctest
# again under ASan+UBSan and under ThreadSanitizer, then each libFuzzer target
# for FUZZ_SECONDS (default 10; scripts/run-fuzz.sh).
set -euo pipefail
build=${1:-build}
asan=${2:-build-asan}
tsan=${3:-build-tsan}
fuzz=${4:-build-fuzz}
here=$(cd "$(dirname "$0")/.." && pwd)
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$here/tests/lsan.supp:print_suppressions=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
echo "== tests ($build)"
ctest --test-dir "$build" --output-on-failure --timeout 300
echo "== python tests ($build, Debian's python3)"
PYTHONPATH="$(cd "$build" && pwd)/python" /usr/bin/python3 -m pytest -q -p no:cacheprovider \
  "$here/python/tests"
echo "== tests under AddressSanitizer + UndefinedBehaviorSanitizer ($asan)"
ctest --test-dir "$asan" --output-on-failure --timeout 600
if [ -d "$tsan" ]; then
  echo "== tests under ThreadSanitizer ($tsan)"
  TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1:suppressions=$here/tests/tsan.supp} \
    ctest --test-dir "$tsan" --output-on-failure --timeout 600
fi
if [ -d "$fuzz/fuzz" ]; then
  echo "== fuzz targets, ${FUZZ_SECONDS:-10} s each ($fuzz)"
  "$here/scripts/run-fuzz.sh" "$fuzz" "${FUZZ_SECONDS:-10}"
fi
