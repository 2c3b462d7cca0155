#!/usr/bin/env bash
# Runs in the Soft-RoCE guest (tests/rxe-guest/run -- bash tests/rxe-guest/engine-examples.sh): the
# engine examples on ibverbs as two processes each over rdma_cm on the guest's IP: the echo server
# and client (every echo checked byte for byte), then the one_sided server and client (sequencer,
# compare-and-swap lock, optimistic reads of records updated in place), then the RPC examples
# (kv_store: put/get/delete and optimistic one-sided gets against concurrent writers;
# sequencer: numbers by RPC and by fetch-and-add, 4 sessions, each number once; file_read: a
# file's blocks from three servers, identical requests merged). The
# server takes a core map written here (--config); the client builds its own from
# CORELINK_IBV_*. The guest has two vCPUs: each process pins its control core to 0 and its
# worker to 1 (they share them; idle workers park). Build first: cargo build -p corelink-apps --examples.
set -u
dir=${ENGINE_EXAMPLES:-${CARGO_TARGET_DIR:-target}/debug/examples}
: "${CORELINK_IP:?run this inside tests/rxe-guest/run}"
map=$(mktemp --suffix .toml)
cat > "$map" <<TOML
provider = "ibverbs"
device = "${CORELINK_IBV_DEVICE:-rxe0}"
gid_index = ${CORELINK_IBV_GID_INDEX:-0}
control_core = 0
workers = [1]
[worker]
idle_after_us = 100
TOML
passed=0 failed=0
# pair NAME PORT CLIENT-ARGS...: a server and a client of example NAME; both must exit 0.
pair() {
  local name=$1 port=$2 log server server_rc client_rc
  shift 2
  log=$(mktemp)
  timeout 120 "$dir/$name" server "$CORELINK_IP:$port" --config "$map" > "$log" 2>&1 & server=$!
  for _ in $(seq 100); do grep -q listening "$log" && break; sleep 0.1; done
  timeout 120 "$dir/$name" client "$CORELINK_IP:$port" --provider ibverbs "$@"; client_rc=$?
  wait $server; server_rc=$?
  sed 's/^/  | /' "$log"
  if [ $client_rc = 0 ] && [ $server_rc = 0 ]; then
    echo "PASS: $name"; passed=$((passed + 1))
  else
    echo "FAIL: $name: client exited $client_rc, server exited $server_rc"; failed=$((failed + 1))
  fi
}
pair echo 7481 --count 1000 --size 256 --window 2
pair one_sided 7482 --count 2000
pair kv_store 7483 --count 500
pair sequencer 7484 --count 500
pair file_read 7485 --reads 2 # its three servers: 7485 to 7487
echo "engine-examples: $passed passed, $failed failed"
[ $failed = 0 ]
