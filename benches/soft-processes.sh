#!/usr/bin/env bash
# soft across processes (issue 13): corelink-perf's server and client as two processes on one
# fabric (CORELINK_SOFT_FABRIC), against the same test in one process and the baselines, in
# alternating rounds (each round: baseline memcpy 64 KiB, write_bw 64 KiB in two processes and
# in one, baseline ring_pingpong, send_lat 8 B and write_lat 8 B in two processes and in one).
# Prints the medians over the rounds and these ratios:
#   write_bw 64 KiB two processes / baseline memcpy 64 KiB     (average bandwidth)
#   write_bw 64 KiB one process   / baseline memcpy 64 KiB
#   send_lat 8 B two processes / baseline ring_pingpong        (typical one-way latency)
#   send_lat 8 B one process   / baseline ring_pingpong
#   write_lat 8 B two processes / baseline ring_pingpong
# The two processes' workers are on different cores (a core map each: server worker on core 0,
# client worker on core 1, each control core on the other one); the one-process run uses the
# default map (control core 0, one worker on core 1 running both ends).
# Usage: benches/soft-processes.sh
# Env: ROUNDS (default 5), N_BW (writes per run, default 3000), N_LAT (round trips per run,
# default 3000), OUT (files, default target/soft-processes), PERF (the binary; built here
# unless given), PORT (the server's, default 19300).
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-5}
N_BW=${N_BW:-3000}
N_LAT=${N_LAT:-3000}
PORT=${PORT:-19300}
OUT=${OUT:-${CARGO_TARGET_DIR:-target}/soft-processes}
if [ -z "${PERF:-}" ]; then
  cargo build -q --release -p corelink-apps --bin corelink-perf
  PERF=${CARGO_TARGET_DIR:-target}/release/corelink-perf
fi
mkdir -p "$OUT"
printf 'provider = "soft"\ncontrol_core = 1\nworkers = [0]\n' >"$OUT/server.toml"
printf 'provider = "soft"\ncontrol_core = 0\nworkers = [1]\n' >"$OUT/client.toml"
export CORELINK_SOFT_FABRIC=bench-$$
: >"$OUT/runs.jsonl"

# two TEST ARGS...: the test as a server and a client process; the client's JSON line.
two() {
  local test=$1; shift
  "$PERF" "$test" "$@" --config "$OUT/server.toml" -p "$PORT" --server \
    >/dev/null 2>"$OUT/server.err" &
  local server=$!
  local line="" tries=0
  while [ -z "$line" ] && [ $tries -lt 100 ]; do
    # (rejected while the server is not listening yet: tried again)
    line=$("$PERF" "$test" "$@" --config "$OUT/client.toml" -p "$PORT" --json 127.0.0.1 \
      2>"$OUT/client.err" | tail -1) || true
    tries=$((tries + 1))
    [ -z "$line" ] && sleep 0.05
  done
  wait "$server" || { cat "$OUT/server.err" >&2; exit 1; }
  [ -n "$line" ] || { cat "$OUT/client.err" >&2; exit 1; }
  echo "$line" | sed 's/^{/{"procs":2,/' >>"$OUT/runs.jsonl"
}

one() {
  "$PERF" "$@" --json 2>"$OUT/one.err" | tail -1 | sed 's/^{/{"procs":1,/' >>"$OUT/runs.jsonl" ||
    { cat "$OUT/one.err" >&2; exit 1; }
}

for r in $(seq 1 "$ROUNDS"); do
  "$PERF" baseline memcpy -s 65536 --json | tail -1 >>"$OUT/runs.jsonl"
  two write_bw -s 65536 -n "$N_BW"
  one write_bw -s 65536 -n "$N_BW"
  "$PERF" baseline ring_pingpong --json | tail -1 >>"$OUT/runs.jsonl"
  two send_lat -s 8 -n "$N_LAT"
  one send_lat -s 8 -n "$N_LAT"
  two write_lat -s 8 -n "$N_LAT"
  one write_lat -s 8 -n "$N_LAT"
  echo "round $r of $ROUNDS done" >&2
done

# med FILTER KEY: the median of KEY over the lines matching FILTER.
med() {
  grep -- "$1" "$OUT/runs.jsonl" | grep -o "\"$2\":[0-9.e+-]*" | cut -d: -f2 | sort -g |
    awk '{ v[NR] = $1 } END { if (NR == 0) print "-"; else if (NR % 2) print v[(NR + 1) / 2];
      else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.3f", a / b; else print "-" }'; }

memcpy=$(med '"test":"baseline_memcpy"' bw_avg_mbps)
ring=$(med '"test":"baseline_ring_pingpong"' t_typical_us)
bw2=$(med '"procs":2,"test":"write_bw"' bw_avg_mbps)
bw1=$(med '"procs":1,"test":"write_bw"' bw_avg_mbps)
sl2=$(med '"procs":2,"test":"send_lat"' t_typical_us)
sl1=$(med '"procs":1,"test":"send_lat"' t_typical_us)
wl2=$(med '"procs":2,"test":"write_lat"' t_typical_us)
wl1=$(med '"procs":1,"test":"write_lat"' t_typical_us)
echo "medians of $ROUNDS alternating rounds (runs in $OUT/runs.jsonl):"
echo "  baseline memcpy 64 KiB        $memcpy MB/s"
echo "  write_bw 64 KiB, 2 processes  $bw2 MB/s   / memcpy = $(ratio "$bw2" "$memcpy")"
echo "  write_bw 64 KiB, 1 process    $bw1 MB/s   / memcpy = $(ratio "$bw1" "$memcpy")"
echo "  baseline ring_pingpong        $ring us"
echo "  send_lat 8 B, 2 processes     $sl2 us   / ring = $(ratio "$sl2" "$ring")"
echo "  send_lat 8 B, 1 process       $sl1 us   / ring = $(ratio "$sl1" "$ring")"
echo "  write_lat 8 B, 2 processes    $wl2 us   / ring = $(ratio "$wl2" "$ring")"
echo "  write_lat 8 B, 1 process      $wl1 us   / ring = $(ratio "$wl1" "$ring")"
