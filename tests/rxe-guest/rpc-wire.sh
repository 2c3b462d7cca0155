#!/usr/bin/env bash
# Runs in the Soft-RoCE guest with the runner's --wire (tests/rxe-guest/run --wire -- bash
# tests/rxe-guest/rpc-wire.sh): the RPC layer's accounting on a real wire (rxea on clwa <->
# rxeb on clwb, netem on both veths), with the rpc_faults example as two processes (server on
# A, core 1; client on B, core 0: 4 sessions, each making its calls one after the other with a
# 10 s deadline). In every check the client must see every call end exactly once, none later
# than its deadline (plus 1 s), every answer its own, and the server run no request twice:
#   1-4. under netem loss 5 %, delay 10 ms, duplication 5 % and reordering (25 % of packets sent
#        at once, the rest 2 ms late): every call answered;
#   5.   kill -9 of the server mid-run, a new server on the same address a second later: the
#        calls the death caught end (SessionClosed), the client's sessions connect again and
#        the rest are answered by the new server;
#   6.   kill -9 of a client mid-run: the server serves the next client.
# Each run has a hard timeout; times are printed, not asserted. About two minutes in the guest
# (calls from the client's threads wait for the emulated guest's two vCPUs, which the busy-polling
# workers hold: milliseconds a call).
# ONLY="N ..." runs only those checks.
# Build first on the host: cargo build -p corelink-apps --examples (or set RPC_FAULTS).
set -u
: "${CORELINK_WIRE_A_DEVICE:?run this inside tests/rxe-guest/run --wire}"
bin=${RPC_FAULTS:-${CARGO_TARGET_DIR:-target}/debug/examples/rpc_faults}
[ -x "$bin" ] || { echo "rpc-wire: no $bin (cargo build -p corelink-apps --examples)"; exit 1; }
A_IP=$CORELINK_WIRE_A_IP
work=$(mktemp -d) port=19080 passed=0 failed=0
# shellcheck source=tests/rxe-guest/wire-lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/wire-lib.sh"
core_map "$work/a.toml" "$CORELINK_WIRE_A_DEVICE" "$CORELINK_WIRE_A_GID_INDEX" 0 1
core_map "$work/b.toml" "$CORELINK_WIRE_B_DEVICE" "$CORELINK_WIRE_B_GID_INDEX" 1 0
server() {   # LOG: an rpc_faults server on A at $port, in the background (its pid in $srv)
  timeout -k 5 120 taskset -c 1 "$bin" server "$A_IP:$port" --config "$work/a.toml" --timeout 110 > "$work/$1" 2>&1 & srv=$!
  for _ in $(seq 200); do grep -q listening "$work/$1" && return; sleep 0.1; done
}
client() {   # LOG COUNT: an rpc_faults client on B
  timeout -k 5 100 taskset -c 0 "$bin" client "$A_IP:$port" --config "$work/b.toml" --count "$2" --window 4 --timeout 90 > "$work/$1" 2>&1
}
summary() { grep -o 'calls .*' "$work/$1" | tail -1; }
# kill -9 of the process that `timeout` (pid $1) runs (killing `timeout` itself would leave it).
kill9() { pkill -9 -P "$1"; wait "$1" 2> /dev/null; }
show() { for f in "$@"; do sed "s/^/  $f | /" "$work/$f"; done; }
pass() { echo "PASS: $*"; passed=$((passed + 1)); }
fail() { echo "FAIL: $*"; failed=$((failed + 1)); }

only=${ONLY:-1 2 3 4 5 6}
on() { [[ " $only " == *" $1 "* ]]; }
# 1-4. Every call answered under loss, delay, duplication and reordering.
n=0
for cond in "loss 5%" "delay 10ms" "duplicate 5%" "delay 2ms reorder 25% 50%"; do
  port=$((port + 1)) n=$((n + 1))
  on $n || continue
  wire $cond
  server s.log
  t0=$EPOCHREALTIME
  client c.log 150; crc=$?
  t1=$EPOCHREALTIME
  wait $srv; src=$?
  wire clear
  took=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
  if [ $crc = 0 ] && [ $src = 0 ] && summary c.log | grep -q 'ok 600 '; then
    pass "netem $cond: $(summary c.log) in $took s"
  else
    show s.log c.log
    fail "netem $cond: client exited $crc, server $src"
  fi
done

# 5. kill -9 of the server mid-run; a new one on the same address.
port=$((port + 1))
if on 5; then
server s1.log; first=$srv
sent() { cat "/sys/class/infiniband/$CORELINK_WIRE_B_DEVICE/ports/1/hw_counters/sent_pkts"; }
s0=$(sent)
timeout -k 5 100 taskset -c 0 "$bin" client "$A_IP:$port" --config "$work/b.toml" --count ${KILL_COUNT:-1500} --window 4 --timeout 90 > "$work/c.log" 2>&1 & cli=$!
# (killed once calls flow: a few hundred packets sent)
for _ in $(seq 300); do [ $(($(sent) - s0)) -ge 400 ] && break; sleep 0.05; done
t0=$EPOCHREALTIME
kill9 $first
sleep 1
server s2.log
wait $cli; crc=$?
t1=$EPOCHREALTIME
wait $srv; src=$?
took=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
line=$(summary c.log)
closed=$(echo "$line" | sed -n 's/.* closed \([0-9]*\) .*/\1/p')
if [ $crc = 0 ] && [ $src = 0 ] && [ "${closed:-0}" -gt 0 ]; then
  pass "kill -9 of the server, a new one 1 s later: $line; $took s from the kill to the end"
else
  show s1.log s2.log c.log
  fail "kill -9 of the server: client exited $crc, the new server $src, ${closed:-no} calls closed"
fi
fi

# 6. kill -9 of a client mid-run: the server serves the next one.
port=$((port + 1))
if on 6; then
server s.log
timeout -k 5 100 taskset -c 0 "$bin" client "$A_IP:$port" --config "$work/b.toml" --count 100000 --window 4 --timeout 90 > "$work/dead.log" 2>&1 & cli=$!
for _ in $(seq 100); do grep -q sessions "$work/dead.log" && break; sleep 0.1; done
sleep 2
kill9 $cli
client c.log 150; crc=$?
wait $srv; src=$?
if [ $crc = 0 ] && [ $src = 0 ] && summary c.log | grep -q 'ok 600 '; then
  pass "kill -9 of a client mid-run: the next client: $(summary c.log)"
else
  show s.log dead.log c.log
  fail "kill -9 of a client: the next client exited $crc, the server $src"
fi
fi
rm -rf "$work"
echo "rpc-wire: $passed passed, $failed failed"
[ $failed = 0 ]
