#!/usr/bin/env bash
# Runs in the Soft-RoCE guest (tests/rxe-guest/run -- bash tests/rxe-guest/perf-smoke.sh): each of
# corelink-perf's eight tests on ibverbs (RC) as two processes over rdma_cm on the guest's IP: a
# server (`corelink-perf TEST --provider ibverbs --bind $CORELINK_IP -p PORT`) and a client
# (`corelink-perf TEST --provider ibverbs $CORELINK_IP -p PORT`), -n 200 at a small size; both must
# exit 0 and the client must print its table row. The guest has two vCPUs: each process pins its
# control core to 0 and its worker to 1 (they share them). Then the tests UC and UD allow, and RC
# with --use-srq, which run on verbs (queue pairs connected by hand after an exchange over a TCP
# socket on the same -p; the server's thread pins core 0, the client's core 1).
# Build first on the host:
# cargo build -p corelink-apps --bins (set CORELINK_PERF to the binary if it is elsewhere).
set -u
bin=${CORELINK_PERF:-${CARGO_TARGET_DIR:-target}/debug/corelink-perf}
: "${CORELINK_IP:?run this inside tests/rxe-guest/run}"
[ -x "$bin" ] || { echo "perf-smoke: no $bin (cargo build -p corelink-apps --bins)"; exit 1; }
passed=0 failed=0 port=18600
# one TEST ARGS...: a server and a client of TEST; both must exit 0, the client print a row.
one() {
  local test=$1 log out server server_rc client_rc
  shift
  port=$((port + 1))
  log=$(mktemp) out=$(mktemp)
  timeout 120 "$bin" "$test" --provider ibverbs --bind "$CORELINK_IP" -p $port "$@" > "$log" 2>&1 & server=$!
  for _ in $(seq 100); do grep -q listening "$log" && break; sleep 0.1; done
  timeout 120 "$bin" "$test" --provider ibverbs -p $port "$@" "$CORELINK_IP" > "$out" 2>&1; client_rc=$?
  wait $server; server_rc=$?
  sed 's/^/  server | /' "$log"
  sed 's/^/  client | /' "$out"
  if [ $client_rc = 0 ] && [ $server_rc = 0 ] && grep -Eq '^ [0-9]+ +[0-9]+ |^[{]"test"' "$out"; then
    echo "PASS: $test $*"; passed=$((passed + 1))
  else
    echo "FAIL: $test $*: client exited $client_rc, server exited $server_rc"; failed=$((failed + 1))
  fi
}
for t in write_bw read_bw send_bw; do one $t -n 200 -s 4096; done
for t in write_lat read_lat send_lat; do one $t -n 200 -s 64; done
for t in atomic_bw atomic_lat; do one $t -n 200; done
# JSON output of a client is one object per size.
one send_lat -n 100 -s 8 --json
# On verbs: UC (sends and writes), UD (sends of at most the MTU: rxe0's is 1024 here), an SRQ.
for t in write_bw send_bw; do one $t -c UC -n 200 -s 4096; done
for t in write_lat send_lat; do one $t -c UC -n 200 -s 64; done
one send_bw -c UD -n 200 -s 1024
one send_lat -c UD -n 200 -s 64
one send_bw --use-srq -n 200 -s 4096
one send_lat --use-srq -n 200 -s 64
# Several QPs, post lists and CQ moderation; a UD client's JSON.
one send_bw -c UD -q 2 -l 4 -Q 8 -n 400 -s 512
one write_bw -c UC -q 2 -l 4 -Q 8 -n 400 -s 4096
one send_lat -c UD -n 100 -s 8 --json
# A client killed (-9) in the middle of a run: its server must not call the run a success. It
# sees the disconnect (the kernel closes the dead process's connection) and exits non-zero,
# saying the run ended before it was complete.
killed() {
  local log server server_rc client
  port=$((port + 1))
  log=$(mktemp)
  timeout 60 "$bin" write_bw --provider ibverbs --bind "$CORELINK_IP" -p $port -D 30 > "$log" 2>&1 & server=$!
  for _ in $(seq 100); do grep -q listening "$log" && break; sleep 0.1; done
  # (not under `timeout`: the kill must reach corelink-perf itself)
  "$bin" write_bw --provider ibverbs -p $port -D 30 "$CORELINK_IP" > /dev/null 2>&1 & client=$!
  # Killed once it runs: the server took its connection (a busy guest may take seconds).
  for _ in $(seq 300); do grep -q "client connected" "$log" && break; sleep 0.1; done
  sleep 2
  kill -9 $client; wait $client 2>/dev/null
  wait $server; server_rc=$?
  sed 's/^/  server | /' "$log"
  if [ $server_rc != 0 ] && [ $server_rc != 124 ] && grep -q "ended before it was complete" "$log"; then
    echo "PASS: a killed client's server fails the run"; passed=$((passed + 1))
  else
    echo "FAIL: a killed client's server exited $server_rc"; failed=$((failed + 1))
  fi
}
killed
echo "perf-smoke: $passed passed, $failed failed"
[ $failed = 0 ]
