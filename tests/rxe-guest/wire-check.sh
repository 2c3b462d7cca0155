#!/usr/bin/env bash
# Runs in the Soft-RoCE guest with the runner's --wire (tests/rxe-guest/run --wire -- bash
# tests/rxe-guest/wire-check.sh): RC over a real wire (rxea on clwa <-> rxeb on clwb), netem on
# both veths. Four checks, each under a hard timeout, about 45 s in all:
#   1. at 1 % loss each way, corelink-perf write_bw (-n 1000, 4 KiB; server on A, client on B)
#      completes every iteration, server and client exiting 0;
#   2. at 100 % loss from the middle of a run, the client fails, not hangs, with an error naming
#      the retry failure (IBV_WC_RETRY_EXC_ERR, after about (worker.retry_cnt + 1) x 67 ms with
#      the defaults). Its delay is printed, not asserted. The server (a write_bw server has
#      nothing in flight, and the client's disconnect went into the dead wire) is ended here;
#   3. on an idle connection (the echo example's client lingering after its echoes), 100 % loss
#      is seen by both sides through the engine's keepalive (worker.keepalive_ms, 1 s by
#      default: a zero-length RDMA write after a second without traffic), each closing with
#      "the peer stopped answering ... keepalive" within keepalive_ms + (retry_cnt + 1) x 67 ms,
#      about 1.5 s; before, an idle connection never heard of a dead wire. Delays printed;
#   4. kill -9 of the server, then of the client, mid-run: the survivor fails, not hangs,
#      saying that the peer went away (issue 14's defect 5: a killed server's memory goes
#      before its connections, and the client's writes were refused first; its close waits
#      worker.peer_grace_ms for the disconnect). Delays printed.
# tests/rxe-guest/wire.sh measures more (perftest beside, 10 % loss, delay, kill -9, UC).
# Build first on the host: cargo build -p corelink-apps --bins --examples (or set CORELINK_PERF
# and ENGINE_EXAMPLES).
set -u
: "${CORELINK_WIRE_A_DEVICE:?run this inside tests/rxe-guest/run --wire}"
bin=${CORELINK_PERF:-${CARGO_TARGET_DIR:-target}/debug/corelink-perf}
[ -x "$bin" ] || { echo "wire-check: no $bin (cargo build -p corelink-apps --bins)"; exit 1; }
echo_bin=${ENGINE_EXAMPLES:-${CARGO_TARGET_DIR:-target}/debug/examples}/echo
A_IP=$CORELINK_WIRE_A_IP B_DEV=$CORELINK_WIRE_B_DEVICE
work=$(mktemp -d) port=18980 passed=0 failed=0
# shellcheck source=tests/rxe-guest/wire-lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/wire-lib.sh"
core_map "$work/a.toml" "$CORELINK_WIRE_A_DEVICE" "$CORELINK_WIRE_A_GID_INDEX" 0 1
core_map "$work/b.toml" "$B_DEV" "$CORELINK_WIRE_B_GID_INDEX" 1 0
server() {   # ARGS...: a write_bw server on A, in the background (its pid in $srv)
  port=$((port + 1))
  timeout -k 5 60 taskset -c 1 "$bin" write_bw -s 4096 "$@" --config "$work/a.toml" --bind "$A_IP" -p $port > "$work/s.log" 2>&1 & srv=$!
  for _ in $(seq 200); do grep -q listening "$work/s.log" && return; sleep 0.1; done
}
show() { sed 's/^/  server | /' "$work/s.log"; sed 's/^/  client | /' "$work/c.log"; }
pass() { echo "PASS: $*"; passed=$((passed + 1)); }
fail() { show; echo "FAIL: $*"; failed=$((failed + 1)); }

# 1. 1 % loss each way: every iteration completes.
wire loss 1%
server -n 1000
t0=$EPOCHREALTIME
timeout -k 5 60 taskset -c 0 "$bin" write_bw -s 4096 -n 1000 --config "$work/b.toml" -p $port --json --timeout 50 "$A_IP" > "$work/c.out" 2> "$work/c.log"; crc=$?
t1=$EPOCHREALTIME
wait $srv; src=$?
n=$(sed -n 's/.*"iterations":\([0-9]*\).*/\1/p' "$work/c.out")
took=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')
if [ $crc = 0 ] && [ $src = 0 ] && [ "${n:-0}" = 1000 ]; then
  pass "RC write_bw at 1% loss each way: 1000 of 1000 iterations in $took s"
else
  fail "RC write_bw at 1% loss each way: client exited $crc, server $src, ${n:-no} iterations reported"
fi
wire clear

# 2. 100 % loss from the middle of a run: the client fails naming the retry failure.
wire delay 0ms
server -D 30
timeout -k 5 45 taskset -c 0 "$bin" write_bw -s 4096 -D 30 --config "$work/b.toml" -p $port --timeout 40 "$A_IP" > "$work/c.out" 2> "$work/c.log" & cli=$!
sent() { cat "/sys/class/infiniband/$B_DEV/ports/1/hw_counters/sent_pkts"; }
s0=$(sent)
for _ in $(seq 200); do [ $(($(sent) - s0)) -ge 300 ] && break; sleep 0.1; done
sleep 1
t0=$EPOCHREALTIME
wire loss 100%
wait $cli; crc=$?
t1=$EPOCHREALTIME
took=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')
wire clear
kill $srv 2> /dev/null; wait $srv 2> /dev/null
if [ $crc != 0 ] && [ $crc != 124 ] && [ $crc != 137 ] && grep -q 'RETRY_EXC_ERR' "$work/c.log"; then
  pass "RC at 100% loss from mid-run: the client failed $took s after the loss began: $(grep 'corelink-perf: ' "$work/c.log" | tail -1)"
else
  fail "RC at 100% loss from mid-run: the client exited $crc after $took s, without naming RETRY_EXC_ERR"
fi

# 3. 100 % loss on an idle connection: both sides see it through the keepalive.
if [ -x "$echo_bin" ]; then
  port=$((port + 1))
  timeout -k 5 40 taskset -c 1 "$echo_bin" server "$A_IP:$port" --config "$work/a.toml" --timeout 30 > "$work/s.log" 2>&1 & srv=$!
  for _ in $(seq 200); do grep -q listening "$work/s.log" && break; sleep 0.1; done
  timeout -k 5 40 taskset -c 0 "$echo_bin" client "$A_IP:$port" --config "$work/b.toml" --count 10 --linger 20000 --timeout 30 > "$work/c.log" 2>&1 & cli=$!
  for _ in $(seq 200); do grep -q lingering "$work/c.log" && break; sleep 0.1; done
  sleep 0.3
  t0=$EPOCHREALTIME
  wire loss 100%
  wait $cli; crc=$?
  t1=$EPOCHREALTIME
  wait $srv; src=$?
  t2=$EPOCHREALTIME
  wire clear
  took=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')
  took_s=$(awk -v a="$t0" -v b="$t2" 'BEGIN { printf "%.2f", b - a }')
  if [ $crc = 1 ] && [ $src = 1 ] && grep -q keepalive "$work/c.log" && grep -q keepalive "$work/s.log"; then
    pass "100% loss on an idle connection: the client saw it after $took s, the server by $took_s s: $(grep -o 'was lost.*' "$work/c.log" | head -1 | cut -c1-120)"
  else
    fail "100% loss on an idle connection: client exited $crc after $took s, server $src after $took_s s, not both naming the keepalive"
  fi
else
  fail "no $echo_bin (cargo build -p corelink-apps --examples)"
fi
# 4. kill -9 of either side mid-run: the survivor says that the peer went away.
for victim in server client; do
  wire delay 0ms
  server -D 30
  timeout -k 5 45 taskset -c 0 "$bin" write_bw -s 4096 -D 30 --config "$work/b.toml" -p $port --timeout 40 "$A_IP" > "$work/c.out" 2> "$work/c.log" & cli=$!
  s0=$(sent)
  for _ in $(seq 200); do [ $(($(sent) - s0)) -ge 300 ] && break; sleep 0.1; done
  if [ $victim = server ]; then dead=$srv alive=$cli log=$work/c.log; else dead=$cli alive=$srv log=$work/s.log; fi
  t0=$EPOCHREALTIME
  pkill -9 -P $dead; wait $dead 2> /dev/null
  wait $alive; arc=$?
  t1=$EPOCHREALTIME
  took=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')
  if [ $arc != 0 ] && [ $arc != 124 ] && [ $arc != 137 ] && grep -q 'the peer went away' "$log"; then
    pass "kill -9 of the $victim mid-run: the survivor failed $took s after it: $(grep 'corelink-perf: ' "$log" | tail -1 | cut -c1-160)"
  else
    fail "kill -9 of the $victim mid-run: the survivor exited $arc after $took s, without saying that the peer went away"
  fi
done
wire clear
rm -rf "$work"
echo "wire-check: $passed passed, $failed failed"
[ $failed = 0 ]
