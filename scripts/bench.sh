#!/usr/bin/env bash
# corelink's main job (README, first command): perftest-style benchmarks on the default `soft`
# provider through the engine, beside the baselines measured in the same run (raw_write: the
# same writes as a verbs loop without the engine), so that each figure reads as a ratio. Speed
# figures are printed, never judged.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

cargo build -q --release -p corelink-apps --bin corelink-perf
perf=target/release/corelink-perf
run() { echo; echo "== corelink-perf $*"; "$perf" "$@"; }

run write_bw -a
run write_bw -s 65536 -n 50000
run baseline memcpy -s 65536 -n 50000
run write_bw -s 8 -n 1000000 -l 16 -Q 64
run baseline raw_write -s 8 -n 1000000 -l 16 -Q 64
run send_lat -s 8
run baseline ring_pingpong -s 8
run baseline tcp_lat -s 8
run read_lat -s 64
run atomic_bw
run atomic_lat
run send_bw -s 4096
run baseline tcp_bw -s 65536

echo; echo "== the engine scheduler's effects (benches/scheduler-effects.sh)"
N=100000 NLAT=20000 bash benches/scheduler-effects.sh

echo; echo "== the RPC layer against the engine's sends (benches/rpc-vs-send.sh)"
PERF=$perf bash benches/rpc-vs-send.sh
