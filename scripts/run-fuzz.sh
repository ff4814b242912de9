#!/usr/bin/env bash
# Runs every libFuzzer target of a KVB_FUZZ build (fuzz/*.cc -> BUILD/fuzz/fuzz_*)
# for SECONDS each, one after the other, from its committed seed corpus
# fuzz/corpus/<name>/ (read only: new inputs go to a scratch directory).
# A crash, leak, sanitizer report, timeout or OOM fails the run; the input
# that caused it is left in BUILD/fuzz-artifacts/. The execution count of each
# run is printed ("fuzz_foo: N runs in S s").
#   scripts/run-fuzz.sh [BUILD [SECONDS]]     (defaults: build-fuzz, 10)
set -euo pipefail
build=${1:-build-fuzz}
seconds=${2:-10}
here=$(cd "$(dirname "$0")/.." && pwd)
artifacts="$build/fuzz-artifacts"
mkdir -p "$artifacts"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
"$build/fuzz_make_corpus" --check "$here/fuzz/corpus"
shopt -s nullglob
targets=("$build"/fuzz/fuzz_*)
if ((${#targets[@]} == 0)); then
  echo "no fuzz targets in $build/fuzz (configure with -DKVB_FUZZ=ON and build target fuzz)" >&2
  exit 1
fi
for bin in "${targets[@]}"; do
  name=$(basename "$bin")
  name=${name#fuzz_}
  seeds="$here/fuzz/corpus/$name"
  if [ ! -d "$seeds" ]; then
    echo "fuzz_$name has no seed corpus: add fuzz/corpus/$name/ (see fuzz/README.md)" >&2
    exit 1
  fi
  scratch=$(mktemp -d)
  log="$build/fuzz-$name.log"
  if ! nice -n 10 "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
      -max_len=65536 -print_final_stats=1 -artifact_prefix="$artifacts/$name-" \
      "$scratch" "$seeds" >"$log" 2>&1; then
    rm -rf "$scratch"
    tail -n 60 "$log" >&2
    echo "fuzz_$name FAILED (log: $log, input: $artifacts/$name-*)" >&2
    exit 1
  fi
  rm -rf "$scratch"
  runs=$(sed -n 's/^Done \([0-9]*\) runs in \([0-9]*\) second.*/\1 runs in \2 s/p' "$log" | tail -n 1)
  echo "fuzz_$name: ${runs:-? runs} (log: $log)"
done
