#!/usr/bin/env bash
# The batch of checks that need a real RDMA stack, run in one boot of the Soft-RoCE guest:
#   tests/rxe-guest/run --wire -- bash tests/rxe-guest/ci.sh SOFT_REPORT...
# 1. the conformance suite on the ibverbs provider against rxe0;
# 2. the ibverbs provider's smoke tests;
# 3. the fidelity report on rxe0, compared scenario by scenario with each SOFT_REPORT (the same
#    report made on the host with the soft provider: in one process, and with side B in a
#    second, `--processes 2`); any difference fails, printed side by side;
# 4. the two-process connection-manager exchange (cm-pair.sh);
# 5. the engine's end-to-end tests on ibverbs (requests, scheduler scenarios, QP pools and lanes);
# 6. the RPC layer's end-to-end tests on ibverbs (rpc/tests/rpc_ibverbs.rs: ordering, credits,
#    deadlines, every error kind, at-most-once under duplicated requests, 1 B to 8 MiB byte for
#    byte, a thousand sessions on one server, merging, load balancing over three servers with
#    one shut down, request classes, typed calls, the handle);
# 7. the engine examples (echo, one-sided) as two processes (engine-examples.sh);
# 8. corelink-perf's eight tests as server and client processes (perf-smoke.sh);
# 9. with a second device (rxe1, added last): sibling contexts and the connection manager's
#    refusal of another device's QP (two-devices.sh);
# 10. librdmacm's rdma_client against the echo example's server: refused without
#    accept_foreign, echoed with it (foreign-peer.sh);
# 11. on the runner's second wire (--wire: rxea <-> rxeb over a veth pair, netem on both ends),
#    RC completes every iteration at 1 % loss and, at 100 % loss from mid-run, the client fails
#    (not hangs) naming IBV_WC_RETRY_EXC_ERR, on an idle connection both sides see 100 % loss
#    through the keepalive, and after kill -9 of either side the survivor says that the peer
#    went away (wire-check.sh, about 45 s); and the RPC layer's accounting
#    (rpc_faults as two processes: every call ends once, within its deadline, none runs twice)
#    under netem loss, delay, duplication and reordering and kill -9 of either side
#    (rpc-wire.sh, about 2.5 minutes). Skipped, and said so, without --wire (a host's own device
#    has no wire to spoil).
# Everything must have been built on the host first (cargo runs --offline here).
set -u
# On ibverbs every engine connection holds a file descriptor (its rdma_cm event channel): the
# thousand sessions of step 6, both ends in one test process beside its other tests, need more
# than the usual soft limit of 1024.
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
[ $# -ge 1 ] || { echo "usage: ci.sh SOFT_REPORT..." >&2; exit 2; }
soft_reports=("$@")
: "${CORELINK_IBV_DEVICE:?run this inside tests/rxe-guest/run}"
here=$(dirname "${BASH_SOURCE[0]}")
failed=() skipped=0
step() { echo; echo "== guest: $1"; }

step "conformance suite on ibverbs ($CORELINK_IBV_DEVICE)"
cargo test --offline -q -p corelink-tests --test conformance_ibverbs || failed+=(conformance)

step "ibverbs smoke tests"
cargo test --offline -q -p corelink-verbs --test ibverbs_smoke -- --ignored --test-threads=1 || failed+=(smoke)

step "fidelity: corelink-conformance on ibverbs vs soft"
rxe_report=$(mktemp)
target/debug/corelink-conformance --provider ibverbs --json > "$rxe_report" || failed+=(fidelity-run)
for soft_report in "${soft_reports[@]}"; do
  target/debug/corelink-conformance compare "$soft_report" "$rxe_report" || failed+=("fidelity-compare($soft_report)")
done

step "two processes over rdma_cm"
bash "$here/cm-pair.sh" || failed+=(cm-pair)

step "the engine on ibverbs"
cargo test --offline -q -p corelink-engine --test engine_ibverbs --test qp_pool_ibverbs || failed+=(engine)

step "the RPC layer on ibverbs"
cargo test --offline -q -p corelink-rpc --features ibverbs --test rpc_ibverbs || failed+=(rpc)

step "engine examples as two processes"
bash "$here/engine-examples.sh" || failed+=(engine-examples)

step "corelink-perf, server and client processes"
bash "$here/perf-smoke.sh" || failed+=(perf-smoke)

step "contexts and devices, with a second device"
bash "$here/two-devices.sh" || failed+=(two-devices)

step "a plain rdma_cm program (rdma_client) against the engine"
bash "$here/foreign-peer.sh" || failed+=(foreign-peer)

step "RC on a second wire under loss (wire-check.sh)"
if [ "${CORELINK_WIRE:-0}" = 1 ]; then
  bash "$here/wire-check.sh" || failed+=(wire)
  bash "$here/rpc-wire.sh" || failed+=(rpc-wire)
else
  echo "skipped: no second wire (tests/rxe-guest/run --wire)"; skipped=1
fi

echo
if [ ${#failed[@]} -eq 0 ]; then
  note=; [ $skipped = 0 ] || note=", 1 skipped (no wire)"
  echo "guest checks: $((11 - skipped)) passed, 0 failed$note"
else
  echo "guest checks failed: ${failed[*]}"
  exit 1
fi
