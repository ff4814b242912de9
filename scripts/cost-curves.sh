#!/usr/bin/env bash
# The cost curves of docs/benchmarks.md ("Cost curves (issue 14)"): throughput
# and latency against request size, rooms in flight and ranks per side, on
# this host over shared memory. Runs exactly the sweep the table came from,
# each command once per repeat, each bounded by `timeout` (and the benches'
# own --timeout), so it stops by itself: ~2.5 minutes per repeat on a 2-core
# box.
#
# Usage: scripts/cost-curves.sh [kvbridge binary] [output folder]
#   REPEAT=2        run every command twice (figures swing on a busy box)
#   ONLY=size|rooms|ranks   one of the three sweeps
# Each command is printed before its output, with the date, the commit and
# `uptime`; its JSON is kept in the output folder, and one summary line per
# run follows it. Not part of `make test`: it measures, it asserts nothing.
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
bin=${1:-$here/build/bin/kvbridge}
out=${2:-/tmp/kvbridge-cost-curves-$(date -u +%Y%m%dT%H%M%S)}
repeat=${REPEAT:-1}
only=${ONLY:-}
mkdir -p "$out"
commit=$(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo unknown)
[ -n "$(git -C "$here" status --porcelain 2>/dev/null)" ] && commit="$commit+dirty"
failures=0
n=0

# run NAME ARGS...: prints the command, the time and the load, runs it with
# a 600 s ceiling, keeps stdout (one JSON object) as NAME.json, prints it.
run() {
  local name=$1
  shift
  n=$((n + 1))
  local file="$out/$(printf '%02d' "$n")-$name.json"
  echo "== $(date -u +%Y-%m-%dT%H:%M:%SZ) commit $commit"
  echo "uptime: $(uptime)"
  echo "+ kvbridge $*"
  timeout 600 "$bin" "$@" >"$file" 2>"${file%.json}.err"
  local rc=$?
  cat "$file"
  [ "$rc" -eq 0 ] || {
    echo "!! exit $rc (stderr in ${file%.json}.err)"
    failures=$((failures + 1))
  }
  summarize "$file"
}

# One line per run from its JSON (jq), so the tables can be read off.
summarize() {
  command -v jq >/dev/null || return 0
  jq -r '. as $o | if .bench == "requests" then
      (.results[0] | "-> \(.sweep) tp\($o.prefill_tp)->tp\($o.decode_tp): "
        + "\(.gbps*100|round/100) GB/s, \(.requests_per_s|round) req/s, "
        + "p50 \(.p50_us|round) us, p99 \(.p99_us|round) us, ") as $s
      | $s + "memcpy \(.memcpy_gbps_before*100|round/100) / "
        + "\(.memcpy_gbps_after*100|round/100) GB/s (x\(.ratio_to_memcpy*100|round/100)), "
        + "runs of \(.run_bytes) B \(.memcpy_runs_gbps*100|round/100) GB/s "
        + "(x\(.ratio_to_memcpy_runs*100|round/100)); "
        + "1-page p50 \(.results[1].p50_us|round) us p99 \(.results[1].p99_us|round) us, "
        + "memcpy p50 \(.one_page_memcpy_us|round) us; ok \(.ok)"
    else
      (.results[] | "-> \(.rooms) rooms: \(.requests_per_s|round) req/s, "
        + "p50 \(.p50_us/1000*10|round/10) ms, p99 \(.p99_us/1000*10|round/10) ms, "
        + "max \(.max_us/1000*10|round/10) ms, \(.bytes_per_room|round) B/room, "
        + "failed \(.failed)\(if .error then " ERROR " + .error else "" end)")
    end' "$1" 2>/dev/null || echo "-> (no JSON)"
}

echo "cost curves: $bin, commit $commit, output in $out, $(nproc) cores"
free -g | sed -n 2p
for ((r = 1; r <= repeat; r++)); do
  if [ -z "$only" ] || [ "$only" = size ]; then
    # Request size: the model of bench requests (32 layers x 8 KV heads x 128
    # x 2 B, page 16: 2 MiB per page, 128 KiB per token), 2 in flight,
    # ~4-8 GiB per point, every byte checked. The 1-page sweep each run
    # also does (one in flight) is kept small except in the 1-page run.
    run size-16 bench requests --json --no-raw --tokens 16 --requests 2000 --small-requests 1000
    run size-64 bench requests --json --no-raw --tokens 64 --requests 512 --small-requests 50
    run size-256 bench requests --json --no-raw --tokens 256 --requests 128 --small-requests 50
    run size-1024 bench requests --json --no-raw --tokens 1024 --requests 48 --small-requests 50
    run size-4096 bench requests --json --no-raw --tokens 4096 --requests 16 --small-requests 50
    run size-8192 bench requests --json --no-raw --tokens 8192 --requests 8 --small-requests 50
  fi
  if [ -z "$only" ] || [ "$only" = rooms ]; then
    # Rooms in flight: bench scale's 1-page requests (2 layers x 4 heads x
    # 64, 32 KiB), prefill tp1 -> decode tp4; requests = rounds x rooms,
    # rounds chosen so that each point runs 1,000-20,000 requests.
    run rooms-1 bench scale --json --rooms 1 --rounds 1000
    run rooms-10 bench scale --json --rooms 10 --rounds 200
    run rooms-100 bench scale --json --rooms 100 --rounds 20
    run rooms-1000 bench scale --json --rooms 1000 --rounds 4
    run rooms-10000 bench scale --json --rooms 10000 --rounds 2
  fi
  if [ -z "$only" ] || [ "$only" = ranks ]; then
    # Ranks per side: 1024-token requests (128 MiB), 32 of them, 2 in flight;
    # each decode rank holds 8/tp of the KV heads.
    for tp in "1 1" "2 2" "4 4" "8 8" "1 8" "8 1" "4 8" "8 2"; do
      set -- $tp
      run "ranks-$1-$2" bench requests --json --no-raw --prefill-tp "$1" --decode-tp "$2" \
        --tokens 1024 --requests 32 --small-requests 50
    done
  fi
done
echo "== done $(date -u +%Y-%m-%dT%H:%M:%SZ); uptime: $(uptime); $failures command(s) failed"
[ "$failures" -eq 0 ]
