#!/usr/bin/env bash
# Runs in the Soft-RoCE guest: a plain rdma_cm program talks to the engine. librdmacm's
# `rdma_client` (no engine header in its request) against the echo example's server:
#   1. with the default core map the engine rejects it (rdma_client fails to connect);
#   2. with `accept_foreign = true` it is a one-lane connection: rdma_client's 16-byte send is
#      echoed and rdma_client exits 0, and so does the server.
# Build first: cargo build -p corelink-apps --examples.
set -u
dir=${ENGINE_EXAMPLES:-${CARGO_TARGET_DIR:-target}/debug/examples}
: "${CORELINK_IP:?run this inside tests/rxe-guest/run}"
command -v rdma_client >/dev/null || { echo "FAIL: no rdma_client (rdmacm-utils)"; exit 1; }
passed=0 failed=0
# map FILE ACCEPT_FOREIGN
map() {
  cat > "$1" <<TOML
provider = "ibverbs"
device = "${CORELINK_IBV_DEVICE:-rxe0}"
gid_index = ${CORELINK_IBV_GID_INDEX:-0}
control_core = 0
workers = [1]
accept_foreign = $2
[worker]
idle_after_us = 100
TOML
}
# run NAME ACCEPT_FOREIGN PORT WANT_CLIENT_OK
run() {
  local name=$1 foreign=$2 port=$3 want=$4 m log server client_rc
  m=$(mktemp --suffix .toml); log=$(mktemp)
  map "$m" "$foreign"
  timeout 60 "$dir/echo" server "$CORELINK_IP:$port" --config "$m" > "$log" 2>&1 & server=$!
  for _ in $(seq 100); do grep -q listening "$log" && break; sleep 0.1; done
  timeout 30 rdma_client -s "$CORELINK_IP" -p "$port"; client_rc=$?
  if [ "$want" = ok ]; then
    wait $server; local server_rc=$?
  else
    kill $server 2>/dev/null; wait $server 2>/dev/null; local server_rc=0
  fi
  sed 's/^/  | /' "$log"
  if { [ "$want" = ok ] && [ $client_rc = 0 ] && [ $server_rc = 0 ]; } ||
     { [ "$want" = refused ] && [ $client_rc != 0 ]; }; then
    echo "PASS: $name"; passed=$((passed + 1))
  else
    echo "FAIL: $name: rdma_client exited $client_rc, the server $server_rc"; failed=$((failed + 1))
  fi
}
run "a plain rdma_cm client is refused by default" false 7491 refused
run "accept_foreign = true echoes a plain rdma_cm client" true 7492 ok
echo "foreign-peer: $passed passed, $failed failed"
[ $failed = 0 ]
