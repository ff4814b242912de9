#!/usr/bin/env bash
# The function-size check must see what it is meant to see: a body of 81
# lines fails, one of 80 passes, a body it cannot read as clang-format lays
# it out is an error (never a silent pass). Files in a scratch directory.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
body() {  # name, lines
  printf 'int %s(int x,\n        int y) {\n' "$1"
  for ((i = 0; i < $2; i++)); do printf '  x += y;\n'; done
  printf '}\n\n'
}
{ body Short 80; printf 'int OneLiner() { return 1; }\n\n'; body Long 81; } > "$dir/a.cc"
set +e
out=$(python3 "$here/check-function-sizes.py" 80 "$dir/a.cc")
rc=$?
set -e
[ "$rc" = 1 ] || { echo "81-line body: exit $rc, want 1: $out"; exit 1; }
grep -q 'int Long(int x, int y): 81 lines' <<<"$out" || { echo "Long not named: $out"; exit 1; }
if grep -q 'Short' <<<"$out"; then echo "Short (80 lines) reported: $out"; exit 1; fi
body Short 80 > "$dir/b.cc"
python3 "$here/check-function-sizes.py" 80 "$dir/b.cc" >/dev/null ||
  { echo "80-line body failed"; exit 1; }
printf 'int Open() {\n  return 1;\n' > "$dir/c.cc"
set +e
out=$(python3 "$here/check-function-sizes.py" 80 "$dir/c.cc")
rc=$?
set -e
[ "$rc" = 2 ] || { echo "unclosed body: exit $rc, want 2: $out"; exit 1; }
echo "function-size check: 81 lines caught, 80 passed, unreadable body refused"
