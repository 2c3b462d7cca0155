#!/usr/bin/env bash
# The engine scheduler's effects, each measured as a ratio of two corelink-perf runs made one
# after the other in this run (3 alternating repetitions each; medians):
#   1. 8-byte write message rate, doorbell batching + selective signalling on (-l 16 -Q 64) vs
#      off (-l 1 -Q 1);
#   2. 8-byte read latency under a mixed load (64 background 4 KiB writes, at most 8 work
#      requests per QP on the device), priorities on vs off (--no-priority);
#   3. work requests per request on a skewed read workload (90 % of 64-byte reads on 4 hot
#      records), merging on vs off (--no-merge);
#   4. flat (--flat) vs scheduled: write_lat 8 B typical latency (low load) and write_bw 8 B
#      message rate (high load, 128 in flight).
# Usage: benches/scheduler-effects.sh [corelink-perf options, e.g. --provider ibverbs]
#   (in the guest: tests/rxe-guest/run -- bash benches/scheduler-effects.sh --provider ibverbs)
# Env: PERF (the binary; default target/release/corelink-perf), N (bw iterations, default
# 1000000: about 0.1 s a run on soft, enough to steady the ratios; the guest wants fewer),
# NLAT (latency iterations, default 20000).
set -euo pipefail
cd "$(dirname "$0")/.."
PERF=${PERF:-${CARGO_TARGET_DIR:-target}/release/corelink-perf}
N=${N:-1000000}
NLAT=${NLAT:-20000}
extra=("$@")
[ -x "$PERF" ] || { echo "no $PERF: cargo build --release -p corelink-apps" >&2; exit 2; }

key() { grep -o "\"$1\":[0-9.e+-]*" | head -1 | cut -d: -f2; }
# run KEY ARGS...: the value of KEY in the JSON line (or, for wr_per_req, the engine summary).
run() {
  local k=$1; shift
  local out err
  err=$(mktemp)
  out=$("$PERF" "$@" "${extra[@]}" --json 2>"$err") || { cat "$err" >&2; rm -f "$err"; exit 1; }
  if [ "$k" = wr_per_req ]; then
    grep -o 'work requests ([0-9.]* per request)' "$err" | grep -o '[0-9.]*' | head -1
  else
    echo "$out" | key "$k"
  fi
  rm -f "$err"
}
median() { printf '%s\n' "$@" | sort -g | sed -n 2p; }
# pair NAME KEY "ARGS A" "ARGS B": 3 alternating runs of each; prints medians and A/B.
pair() {
  local name=$1 k=$2 a=$3 b=$4 ra=() rb=()
  for _ in 1 2 3; do
    # shellcheck disable=SC2086
    ra+=("$(run "$k" $a)"); rb+=("$(run "$k" $b)")
  done
  local ma mb
  ma=$(median "${ra[@]}"); mb=$(median "${rb[@]}")
  printf '%-58s %-14s %12s %12s %8s\n' "$name" "$k" "$ma" "$mb" \
    "$(awk -v a="$ma" -v b="$mb" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "-" }')"
}
printf '%-58s %-14s %12s %12s %8s\n' "experiment (A vs B)" "figure" "A" "B" "A/B"
pair "write_bw 8 B: -l 16 -Q 64 vs -l 1 -Q 1" msg_rate_mpps \
  "write_bw -s 8 -n $N -l 16 -Q 64" "write_bw -s 8 -n $N -l 1 -Q 1"
pair "read_lat 8 B, mixed load: priorities off vs on" t_typical_us \
  "read_lat -s 8 -n $NLAT --bg-writes 64 --max-outstanding 8 --no-priority" \
  "read_lat -s 8 -n $NLAT --bg-writes 64 --max-outstanding 8"
pair "read_bw 64 B, 4 hot records: merging off vs on" wr_per_req \
  "read_bw -s 64 -n $N --hot-records 4 --no-merge" "read_bw -s 64 -n $N --hot-records 4"
pair "write_lat 8 B (low load): scheduled vs flat" t_typical_us \
  "write_lat -s 8 -n $NLAT" "write_lat -s 8 -n $NLAT --flat"
pair "write_bw 8 B (high load): scheduled vs flat" msg_rate_mpps \
  "write_bw -s 8 -n $N" "write_bw -s 8 -n $N --flat"
