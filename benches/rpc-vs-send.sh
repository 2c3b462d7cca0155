#!/usr/bin/env bash
# The design note's experiment on soft: the RPC layer (corelink-rpc) against the engine's
# direct sends, in one process per pair, alternating (`corelink-perf rpc_lat --with-send
# --rounds R`: send_lat, rpc_lat, send_lat, rpc_lat, ...; the same for rpc_bw / send_bw).
# Prints, from the medians over the R alternating runs:
#   rpc_lat 8 B / send_lat 8 B            (each run's typical, i.e. median, one-way latency)
#   rpc_bw msg rate 32 B / send_bw 32 B   (each run's average message rate)
# Loopback on soft: one worker runs both ends (client and server), so an RPC's cost is both
# sides' and a call is two messages (request and response) where send_bw counts one.
# With --callgrind, also instructions per operation (the worker thread's timed part / the
# iterations, as benches/instructions.sh counts them): per send_lat round trip, per rpc_lat
# call, per send_bw send and per rpc_bw call, both sides included.
# Usage: benches/rpc-vs-send.sh [--callgrind] [extra corelink-perf options]
# Env: ROUNDS (alternating runs, default 5), N_LAT (round trips per run, default 20000), N_BW
# (messages per run, default 200000), N_CG (operations per callgrind run, default 20000),
# OUT (files, default target/rpc-vs-send), PERF (the binary; built here unless given).
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-5}
N_LAT=${N_LAT:-20000}
N_BW=${N_BW:-200000}
N_CG=${N_CG:-20000}
OUT=${OUT:-${CARGO_TARGET_DIR:-target}/rpc-vs-send}
cg=0
if [ "${1:-}" = --callgrind ]; then cg=1; shift; fi
extra=("$@")
if [ -z "${PERF:-}" ]; then
  cargo build -q --release -p corelink-apps --bin corelink-perf
  PERF=${CARGO_TARGET_DIR:-target}/release/corelink-perf
fi
mkdir -p "$OUT"

# values TEST KEY FILE: KEY of every TEST line of FILE, one a line.
values() { grep "\"test\":\"$1\"" "$3" | grep -o "\"$2\":[0-9.e+-]*" | cut -d: -f2; }
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print "-";
  else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.3f", a / b; else print "-" }'; }

"$PERF" rpc_lat -s 8 -n "$N_LAT" --with-send --rounds "$ROUNDS" --json "${extra[@]}" \
  >"$OUT/lat.jsonl" 2>"$OUT/lat.err" || { cat "$OUT/lat.err" >&2; exit 1; }
"$PERF" rpc_bw -s 32 -n "$N_BW" --with-send --rounds "$ROUNDS" --json "${extra[@]}" \
  >"$OUT/bw.jsonl" 2>"$OUT/bw.err" || { cat "$OUT/bw.err" >&2; exit 1; }

short() { awk '{ printf "%.4g", $1 }'; }
send_lat=$(values send_lat t_typical_us "$OUT/lat.jsonl" | median | short)
rpc_lat=$(values rpc_lat t_typical_us "$OUT/lat.jsonl" | median | short)
send_bw=$(values send_bw msg_rate_mpps "$OUT/bw.jsonl" | median | short)
rpc_bw=$(values rpc_bw msg_rate_mpps "$OUT/bw.jsonl" | median | short)
provider=soft
for ((i = 0; i < ${#extra[@]}; i++)); do
  [ "${extra[$i]}" = --provider ] && provider=${extra[$((i + 1))]:-soft}
done
echo "$provider, loopback, one worker; medians of $ROUNDS alternating runs (files in $OUT)"
printf '%-40s %10s %10s %8s %s\n' measure rpc send ratio "issue 12's target"
printf '%-40s %10s %10s %8s %s\n' "rpc_lat 8 B / send_lat 8 B (us, one-way)" \
  "$rpc_lat" "$send_lat" "$(ratio "$rpc_lat" "$send_lat")" "at most 1.15"
printf '%-40s %10s %10s %8s %s\n' "rpc_bw / send_bw msg rate, 32 B (Mpps)" \
  "$rpc_bw" "$send_bw" "$(ratio "$rpc_bw" "$send_bw")" "at least 0.8"

[ "$cg" = 1 ] || exit 0
command -v valgrind >/dev/null || { echo "valgrind is not installed" >&2; exit 2; }

# timed NAME TEST SIZE: the worker thread's instructions in the timed part, / iterations.
timed() {
  local name=$1 test=$2 size=$3 f tid="" ir=""
  rm -f "$OUT/$name".out*
  valgrind --tool=callgrind --separate-threads=yes --fair-sched=yes \
    --dump-before='*timed_phase_begin*' --dump-before='*timed_phase_end*' \
    --callgrind-out-file="$OUT/$name.out" \
    "$PERF" "$test" -s "$size" -n "$N_CG" --json "${extra[@]}" \
    >"$OUT/$name.json" 2>"$OUT/$name.err" || { cat "$OUT/$name.err" >&2; exit 1; }
  # The timed part is the dump that the thread running the markers wrote second (part 2).
  for f in "$OUT/$name".out*; do
    if awk '/^part:/ { p = $2 } END { exit !(p == 2) }' "$f" &&
      grep -q 'timed_phase_end' "$f"; then
      ir=$(awk '/^summary:/ { print $2; exit } /^totals:/ { t = $2 } END { if (t) print t }' "$f" | head -1)
      break
    fi
  done
  local n
  n=$(grep -o '"iterations":[0-9]*' "$OUT/$name.json" | head -1 | cut -d: -f2)
  awk -v a="${ir:-0}" -v n="${n:-0}" 'BEGIN { if (n > 0) printf "%.0f", a / n; else print "-" }'
}
sl=$(timed send_lat send_lat 8)
rl=$(timed rpc_lat rpc_lat 8)
sb=$(timed send_bw send_bw 32)
rb=$(timed rpc_bw rpc_bw 32)
echo "instructions per operation (callgrind, the worker's timed part, both ends on one worker)"
printf '%-44s %10s\n' "send_lat 8 B, per round trip (2 sends)" "$sl" "rpc_lat 8 B, per call" "$rl" \
  "send_bw 32 B, per send" "$sb" "rpc_bw 32 B, per call (request + response)" "$rb"
