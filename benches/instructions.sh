#!/usr/bin/env bash
# Instructions per 8-byte RDMA write on soft (loopback), counted by callgrind: the engine
# (`corelink-perf write_bw`, its worker thread, which runs both ends) against the same writes as
# a hand-written verbs loop (`corelink-perf baseline raw_write`, its client thread, which posts
# and polls; soft executes each write inside the post), at -l 16 -Q 64 and at -l 1 -Q 1, with
# the ratio engine / raw at each.
#
# Whole threads, no --toggle-collect: every instruction the thread ran counts, empty polls and
# all. callgrind cuts each run at corelink-perf's markers of the timed part
# (--dump-before='*timed_phase_begin*' and '*timed_phase_end*', apps/src/perf/phase.rs), so the
# thread's count comes in three parts: set-up, the timed part, tear-down. Per write:
#   timed  the thread's instructions from the first timed write to the last completion, / N;
#   whole  all three parts / every write the run posted (the engine's untimed warm-up window
#          included). Set-up and tear-down hold what the worker spins while the other threads
#          run (under valgrind threads take turns): on a machine with fewer cores than the
#          run's threads, as here, corelink-perf's map has an idle worker yield its core
#          (YIELD_AFTER_EMPTY_POLLS), which keeps that small (0.6 million instructions, from
#          13.6 million with its TSC calibration on the worker and no yield);
#   busy   the engine's earlier figure: Worker::after_completions inclusive, in the timed part
#          (busy iterations only, what --toggle-collect='*after_completions*' counted).
# Usage: benches/instructions.sh [extra corelink-perf options]
# Env: N (writes per run, default 200000: about 10 s a run), OUT (callgrind files, default
# target/callgrind), PERF (the binary; built here unless given).
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-200000}
OUT=${OUT:-${CARGO_TARGET_DIR:-target}/callgrind}
extra=("$@")
if [ -z "${PERF:-}" ]; then
  cargo build -q --release -p corelink-apps --bin corelink-perf
  PERF=${CARGO_TARGET_DIR:-target}/release/corelink-perf
fi
command -v valgrind >/dev/null || { echo "valgrind is not installed" >&2; exit 2; }
command -v callgrind_annotate >/dev/null || { echo "callgrind_annotate is missing" >&2; exit 2; }
mkdir -p "$OUT"

# run NAME ARGS...: corelink-perf under callgrind; its files are $OUT/NAME.out*.
run() {
  local name=$1; shift
  rm -f "$OUT/$name".out* "$OUT/$name".json "$OUT/$name".err
  valgrind --tool=callgrind --separate-threads=yes --fair-sched=yes \
    --dump-before='*timed_phase_begin*' --dump-before='*timed_phase_end*' \
    --callgrind-out-file="$OUT/$name.out" \
    "$PERF" "$@" "${extra[@]}" --json >"$OUT/$name.json" 2>"$OUT/$name.err" ||
    { cat "$OUT/$name.err" >&2; exit 1; }
}

# header FILE: "thread part Ir" from a callgrind file's header and totals.
header() {
  awk '/^part:/ { p = $2 } /^thread:/ { t = $2 } /^summary:/ { s = $2 }
       /^totals:/ { if (s == "") s = $2 }
       END { if (t != "" && s != "") print t + 0, p + 0, s }' "$1"
}

# parts NAME: "Ir_setup Ir_timed Ir_teardown PART2_FILE" of the thread that ran the timed part
# (the one whose files name the markers: the worker, or raw_write's client thread).
parts() {
  local f tid="" line
  for f in $(grep -l 'timed_phase_begin\|timed_phase_end' "$OUT/$1".out* 2>/dev/null); do
    line=$(header "$f")
    [ -n "$line" ] && tid=${line%% *} && break
  done
  [ -n "$tid" ] || { echo "$1: no thread ran the timed part (see $OUT/$1.err)" >&2; exit 1; }
  local -A ir=() file=()
  for f in "$OUT/$1".out*; do
    line=$(header "$f")
    [ -n "$line" ] || continue
    read -r t p s <<<"$line"
    [ "$t" = "$tid" ] || continue
    ir[$p]=$s
    file[$p]=$f
  done
  [ "${#ir[@]}" = 3 ] || { echo "$1: thread $tid has ${#ir[@]} parts, not 3" >&2; exit 1; }
  local keys
  keys=$(printf '%s\n' "${!ir[@]}" | sort -n | tr '\n' ' ')
  read -r a b c <<<"$keys"
  echo "${ir[$a]} ${ir[$b]} ${ir[$c]} ${file[$b]}"
}

key() { grep -o "\"$1\":[0-9.e+-]*" "$2" | head -1 | cut -d: -f2; }
div() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.0f", a / b }'; }
# ratio A AN B BN: (A / AN) / (B / BN), per-write figures unrounded.
ratio() {
  awk -v a="$1" -v an="$2" -v b="$3" -v bn="$4" \
    'BEGIN { if (b > 0 && an > 0) printf "%.2f", (a / an) / (b / bn); else print "-" }'
}

printf '%-12s %-26s %-7s %10s %10s %10s %10s\n' \
  setting run thread writes timed whole busy
for set in "16 64" "1 1"; do
  read -r l q <<<"$set"
  tag="l${l}q${q}"
  run "engine-$tag" write_bw -s 8 -n "$N" -l "$l" -Q "$q"
  run "raw-$tag" baseline raw_write -s 8 -n "$N" -l "$l" -Q "$q"
  read -r es et ed ef <<<"$(parts "engine-$tag")"
  read -r rs rt rd _ <<<"$(parts "raw-$tag")"
  en=$(key iterations "$OUT/engine-$tag.json")
  rn=$(key iterations "$OUT/raw-$tag.json")
  # Every write the engine posted, its warm-up window included (the summary counts both ends).
  eall=$(grep -o 'engine: [0-9]* requests' "$OUT/engine-$tag.err" | grep -o '[0-9]*' | head -1)
  busy=$(callgrind_annotate --inclusive=yes --threshold=100 "$ef" 2>/dev/null |
    awk '/Worker<P,H>::after_completions \[/ && !done { gsub(",", "", $1); print $1; done = 1 }')
  et_w=$(div "$et" "$en")
  ew_w=$(div "$((es + et + ed))" "${eall:-$en}")
  rt_w=$(div "$rt" "$rn")
  rw_w=$(div "$((rs + rt + rd))" "$rn")
  printf '%-12s %-26s %-7s %10s %10s %10s %10s\n' "-l $l -Q $q" "engine (write_bw)" worker \
    "$en" "$et_w" "$ew_w" "$(div "${busy:-0}" "$en")"
  printf '%-12s %-26s %-7s %10s %10s %10s %10s\n' "-l $l -Q $q" "raw (baseline raw_write)" \
    client "$rn" "$rt_w" "$rw_w" -
  printf '%-12s %-26s %-7s %10s %10s %10s %10s\n' "-l $l -Q $q" "ratio engine / raw" "" "" \
    "$(ratio "$et" "$en" "$rt" "$rn")" "$(ratio "$((es + et + ed))" "${eall:-$en}" "$((rs + rt + rd))" "$rn")" ""
done
echo "(instructions per write; timed: the timed part of the thread; whole: the whole thread;"
echo " busy: after_completions only. callgrind files in $OUT)"
