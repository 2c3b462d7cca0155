#!/usr/bin/env bash
# What the guest's kernel does around each round trip of a latency test, per iteration: the
# softirqs raised (TASKLET: work rxe defers), the interrupts taken (LOC: timer, CAL: function
# call IPIs) and the switches of ksoftirqd and other kernel threads, per CPU, for perftest,
# corelink's verbs loop (`baseline raw_TEST`) and the engine: each client runs N and 2N
# iterations, and the difference of the two runs' counts over N is the figure, so that what
# a run does once (start-up, connection, its end) cancels.
# Run it in the guest:
#
#   cargo build --release -p corelink-apps --bin corelink-perf
#   tests/rxe-guest/run --timeout 1200 -- bash benches/guest-softirqs.sh
#
# TESTS ("read_lat atomic_lat"), KINDS ("perftest raw engine"; "parked": the engine with its
# server parked once idle, `worker.park_after_us = 100`), N (iterations, 50000), REPS (rounds
# of the kinds in turn, 2). Cores as perftest-side-by-side.sh's: perftest's and the engine's
# clients on CPU 0, their servers on 1; the raw loop pins its client to 1 and its server to 0.
# On rxe (Debian's 6.1) an RDMA read's responder is a tasklet: raised in the doorbell's system
# call, it runs there (an ftrace window shows it in the client's own context), but the raise
# also wakes ksoftirqd, which most round trips then switch to and back with nothing left to
# do: the switches of ksoftirqd per read say how often, and read_lat's t_typical against its
# t_min what it costs.
set -u
: "${CORELINK_IBV_DEVICE:?run this inside tests/rxe-guest/run}" "${CORELINK_IP:?}"
dev=$CORELINK_IBV_DEVICE gid=${CORELINK_IBV_GID_INDEX:-1} ip=$CORELINK_IP
perf=${CORELINK_PERF:-${CARGO_TARGET_DIR:-target}/release/corelink-perf}
n=${N:-50000}
[ -x "$perf" ] ||
  { echo "no $perf: cargo build --release -p corelink-apps --bin corelink-perf"; exit 1; }
work=$(mktemp -d)
# shellcheck source=benches/guest-core-map.sh
source "$(dirname "${BASH_SOURCE[0]}")/guest-core-map.sh"
core_map "$work/client.toml" 1 0 0
core_map "$work/server.toml" 0 1 0 0
core_map "$work/parked.toml" 0 1 0 100
# Counters as "NAME CPU0 CPU1" (a thread's: voluntary and involuntary switches)
snap() {
  local task
  awk 'NR > 1 { printf "softirq_%s %s %s\n", $1, $2, $3 }' /proc/softirqs
  awk 'NR > 1 && NF >= 3 { printf "irq_%s %s %s\n", $1, $2, $3 }' /proc/interrupts
  for task in /proc/[0-9]*/task/[0-9]*; do
    case $(cat "$task/comm" 2>/dev/null) in
      ksoftirqd*|rcu_*|kworker*|migration*)
        awk -v n="$(tr ' ' _ < "$task/comm")" '/^voluntary_ctxt/ { v = $2 }
          /^nonvoluntary_ctxt/ { i = $2 } END { print "switches_" n, v, i }' \
          "$task/status" 2>/dev/null ;;
    esac
  done
}
snap_before() { snap > "$work/a"; }
snap_after() { snap > "$work/b"; }
# One client run of TEST by KIND at N iterations (guest-core-map.sh's client_run): the counters'
# growth over it in $work/d.N (NAME CPU0 CPU1), its t_min and t_typical in $t
run() {
  local test=$1 kind=$2 iters=$3
  client_run "$kind" "$test" 8 "$iters" $((19000 + RANDOM % 1000)) snap_before snap_after ||
    exit 2
  if [ "$kind" = perftest ]; then
    t=$(awk '$1 == 8 && NF >= 5 { print $3, $5 }' "$work/cli.log")
  else
    t="$(json t_min_us < "$work/cli.log") $(json t_typical_us < "$work/cli.log")"
  fi
  join <(sort "$work/a") <(sort "$work/b") | awk '{ print $1, $4 - $2, $5 - $3 }' > "$work/d.$iters"
}
printf '%-44s %8s %8s\n' "per iteration, (at 2N - at N) / N" "cpu0" "cpu1" &&
  echo "(switches_THREAD: its voluntary and involuntary switches instead)"
for test in ${TESTS:-read_lat atomic_lat}; do
  # (the ping-pongs signal as perftest's: see perftest-side-by-side.sh)
  CORELINK_ARGS= SERVER_ARGS=
  [[ $test == send_lat || $test == write_lat ]] && CORELINK_ARGS="--quiet -Q 100" &&
    SERVER_ARGS=$CORELINK_ARGS
  for rep in $(seq "${REPS:-2}"); do
    for kind in ${KINDS:-perftest raw engine}; do
      run "$test" "$kind" "$n"
      t1=$t
      run "$test" "$kind" $((2 * n))
      echo "== $test $kind run $rep: t_min, t_typical (us): ${t1:-none} at N, ${t:-none} at 2N"
      # (the counters that grew by at least one in 100 iterations)
      join "$work/d.$n" "$work/d.$((2 * n))" | awk -v n="$n" '{ a = $4 - $2; b = $5 - $3
        if (a + b >= n / 100) printf "  %-44s %8.3f %8.3f\n", $1, a / n, b / n }'
    done
  done
done
rm -rf "$work"
