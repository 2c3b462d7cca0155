#!/usr/bin/env bash
# Runs in the Soft-RoCE guest (tests/rxe-guest/run -- bash tests/rxe-guest/cm-pair.sh): the
# cm_pair example as two processes over rdma_cm on the guest's IP (server and client exchange
# every primitive, the client disconnects, the server sees it), then a client connecting to a
# port with no listener, which must fail at once with a clear error.
set -u
bin=${CM_PAIR:-target/debug/examples/cm_pair}
: "${CORELINK_IP:?run this inside tests/rxe-guest/run}"
log=$(mktemp)
timeout 60 "$bin" server "$CORELINK_IP:7471" --provider ibverbs > "$log" 2>&1 & server=$!
for _ in $(seq 100); do grep -q listening "$log" && break; sleep 0.1; done
timeout 60 "$bin" client "$CORELINK_IP:7471" --provider ibverbs; client_rc=$?
wait $server; server_rc=$?
cat "$log"
start=$(date +%s%N)
out=$(timeout 30 "$bin" client "$CORELINK_IP:7999" --provider ibverbs 2>&1); nolisten_rc=$?
ms=$(( ($(date +%s%N) - start) / 1000000 ))
echo "no listener: exit $nolisten_rc after ${ms} ms: $out"
fail=0
[ $client_rc = 0 ] || { echo "FAIL: client exited $client_rc"; fail=1; }
[ $server_rc = 0 ] || { echo "FAIL: server exited $server_rc"; fail=1; }
if [ $nolisten_rc != 1 ] || ! grep -qiE 'rejected|unreachable' <<<"$out"; then
  echo "FAIL: a connect with no listener should fail with 'rejected' or 'unreachable'"; fail=1
fi
[ $fail = 0 ] && echo "cm-pair: 2 passed, 0 failed" || echo "cm-pair: failed"
exit $fail
