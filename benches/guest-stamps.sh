#!/usr/bin/env bash
# Where a send_lat round trip's time goes in the Soft-RoCE guest: alternating runs of several
# variants of corelink-perf built with the `guest-stamps` feature, whose ibverbs provider
# stamps the time-stamp counter at each doorbell (`ibv_post_send`, a system call on rxe), each
# completion polled and each empty poll (verbs/src/stamps.rs). Both processes' stamps share
# one counter, so benches/guest-stamps.py lines them up and splits each round trip into each
# side's user code from a receive's completion to its answer's doorbell ("tail"), and the
# one-way path from a doorbell to the peer's poll finding the message (the kernel's rxe path
# and the peer's detection), besides the doorbell's own length, the work after it, and the
# idle poll loop's period. Medians per run, in us (the counter's rate is taken from the run's
# own t_typical). Run it in the guest:
#
#   cargo build --release -p corelink-apps --bin corelink-perf --features corelink-apps/guest-stamps
#   cp target/release/corelink-perf target/perf-stamps
#   tests/rxe-guest/run --timeout 1500 --env VARIANTS -- bash benches/guest-stamps.sh
#
# VARIANTS: as guest-ab.sh's (NAME|BINARY|CLIENT ARGS|SERVER ARGS|raw, separated by ';');
# default the engine and the raw loop from target/perf-stamps. ROUNDS (3), ITERS (5000),
# SIZE (8). Only send_lat: the stamps follow messages through receive queues.
set -u
: "${CORELINK_IBV_DEVICE:?run this inside tests/rxe-guest/run}" "${CORELINK_IP:?}"
here=$(dirname "${BASH_SOURCE[0]}")
dev=$CORELINK_IBV_DEVICE gid=${CORELINK_IBV_GID_INDEX:-1} ip=$CORELINK_IP
perf=${CARGO_TARGET_DIR:-target}/perf-stamps
variants=${VARIANTS:-"engine|$perf|||;raw|$perf|||raw"}
iters=${ITERS:-5000} size=${SIZE:-8}
work=$(mktemp -d) port=19600
# (perftest-side-by-side.sh's maps: the client's worker on core 0, the server's on 1)
# shellcheck source=benches/guest-core-map.sh
source "$here/guest-core-map.sh"
core_map "$work/client.toml" 1 0 0
core_map "$work/server.toml" 0 1 0
IFS=';' read -r -a specs <<< "$variants"
for r in $(seq "${ROUNDS:-3}"); do
  for spec in "${specs[@]}"; do
    IFS='|' read -r name bin cargs sargs raw <<< "$spec"
    name=$(echo "$name" | tr -d ' ')
    [ -x "$bin" ] || { echo "no $bin (built with --features corelink-apps/guest-stamps?)"; exit 1; }
    port=$((port + 1)) d=$work/$name.$r
    mkdir -p "$d/srv" "$d/cli"
    srv=(send_lat --config "$work/server.toml") cli=(send_lat --config "$work/client.toml")
    [ -n "$raw" ] && srv=(baseline raw_send_lat --provider ibverbs) && cli=("${srv[@]}")
    # shellcheck disable=SC2086
    CORELINK_STAMPS=$d/srv timeout 120 "$bin" "${srv[@]}" --bind "$ip" -p $port -s "$size" \
      -n "$iters" $sargs > "$d/srv.log" 2>&1 &
    for _ in $(seq 100); do grep -q listening "$d/srv.log" && break; sleep 0.1; done
    # shellcheck disable=SC2086
    CORELINK_STAMPS=$d/cli timeout 120 "$bin" "${cli[@]}" -p $port -s "$size" -n "$iters" \
      $cargs --json "$ip" > "$d/cli.log" 2>&1
    wait
    echo "== round $r $name"
    python3 "$here/guest-stamps.py" "$d/cli" "$d/srv" "$d/cli.log"
  done
done
