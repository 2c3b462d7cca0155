#!/usr/bin/env bash
# Connection set-up time on rxe0, one boot: librdmacm's cmtime (1 and 100 connections) and the
# connect_time example (verbs-level Context::connect and the engine's Client::connect one at a
# time, then 100 verbs-level and 100 engine connects at once) against an engine server. Run it
# in the guest:
#
#   cargo build --release -p corelink-apps --examples
#   tests/rxe-guest/run --timeout 900 -- bash benches/connect-time.sh
#
# Prints cmtime's own step table and connect_time's cold / warm milliseconds; compare them as
# ratios from the same boot only (the guest is emulated). benches/connect-time-ratios.py turns
# rounds of it (each headed "#### round N") into issue 14's three ratios and their medians.
#
# The guest has two vCPUs, and rxe's work (the connection manager's included) runs on them:
# the server's control core is vCPU 0 and its worker vCPU 1, the client's the other way round
# (as two hosts would, neither control core waits for the other's CPU; cmtime's two
# processes are not pinned at all), and a worker with connections parks once idle 100 us
# (`worker.park_after_us`) rather than spin on a vCPU the device needs. PARK_US=0 spins.
set -u
: "${CORELINK_IP:?run this inside tests/rxe-guest/run}"
dir=${ENGINE_EXAMPLES:-${CARGO_TARGET_DIR:-target}/release/examples}
ip=$CORELINK_IP
# A core map: control core $1, worker $2.
core_map() {
  local map
  map=$(mktemp --suffix .toml)
  cat > "$map" <<TOML
provider = "ibverbs"
device = "${CORELINK_IBV_DEVICE:-rxe0}"
gid_index = ${CORELINK_IBV_GID_INDEX:-0}
control_core = $1
workers = [$2]
[worker]
idle_after_us = 100
park_after_us = ${PARK_US:-100}
TOML
  echo "$map"
}
# stop_server PID: a cmtime server whose client is done has 5 s to exit, then is stopped (at
# times it waits for its whole timeout, a minute or two of an idle guest).
stop_server() {
  for _ in $(seq 50); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
  kill "$1" 2>/dev/null; wait "$1" 2>/dev/null
}
server_map=$(core_map 0 1)
client_map=$(core_map 1 0)
echo "== cmtime, 1 connection"
timeout 60 cmtime -b "$ip" -p 7501 > /tmp/cmtime-srv.log 2>&1 & srv=$!
sleep 1
timeout 60 cmtime -s "$ip" -p 7501 -c 1; stop_server $srv
echo "== cmtime, 100 connections"
timeout 120 cmtime -b "$ip" -p 7502 > /tmp/cmtime-srv.log 2>&1 & srv=$!
sleep 1
timeout 120 cmtime -s "$ip" -p 7502 -c 100; stop_server $srv
echo "== connect_time (20 one at a time, 100 at once)"
log=$(mktemp)
"$dir/connect_time" server "$ip:7503" --config "$server_map" --parallel 100 > "$log" 2>&1 & srv=$!
for _ in $(seq 100); do grep -q listening "$log" && break; sleep 0.1; done
timeout 300 "$dir/connect_time" client "$ip:7503" --config "$client_map" --count 20 --parallel 100; rc=$?
kill $srv 2>/dev/null; wait $srv 2>/dev/null
sed 's/^/  server | /' "$log"
exit $rc
