#!/usr/bin/env bash
# The size rule of docs/style (issue 10): no file under src/ over 600 lines.
# Prints every file over the limit and fails when there is one.
set -euo pipefail
cd "$(dirname "$0")/.."
limit=${1:-600}
over=$(git ls-files 'src/*.cc' 'src/*.h' | xargs wc -l | awk -v l="$limit" '$2 != "total" && $1 > l')
if [ -n "$over" ]; then
  echo "files under src/ over $limit lines:"
  echo "$over"
  exit 1
fi
echo "every file under src/ has <= $limit lines"
