#!/usr/bin/env bash
# corelink's test command (README, .ci/run):
#  1. every unit and integration test on the host, the conformance suite on `soft` included
#     (in one process, and with each case's two sides in two processes), and the fidelity
#     report on soft in one process compared with the two-process one;
#  2. loom's model check of the SPSC rings, and bounded fuzz runs (fuzz/: the RPC wire decoder,
#     core maps, the engine's connection header, sequences of verbs on `soft`, the frames of
#     `soft` across processes) when cargo-fuzz is installed; the RPC examples on `soft`, and
#     rpc_faults as two processes on one soft fabric with its server killed mid-run;
#  3. in one boot of the Soft-RoCE guest (tests/rxe-guest/run): the conformance suite on
#     `ibverbs` against rxe0, the fidelity comparison soft vs rxe0, the two-process
#     connection-manager exchange, and the engine's and the RPC layer's end-to-end tests on
#     ibverbs, among the rest of tests/rxe-guest/ci.sh.
# Step 3 needs the guest's packages (scripts/install-deps.sh installs them); without them it is
# skipped with a message, except under CI, where it is required. CORELINK_SKIP_GUEST=1 skips it.
# With CORELINK_IBV_DEVICE (and CORELINK_IP) set, step 3 runs on this host's device instead.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

echo "== cargo test --workspace"
cargo test --workspace

echo "== compile_fail doc tests, with the error each must fail with (checked on nightly rustdoc only)"
# The ownership rules (Cx, Buf and the RPC Endpoint are !Send, Client and ring ends are not
# Clone) are locked by compile_fail doc tests; with RUSTC_BOOTSTRAP=1 rustdoc checks that each
# fails for its error code, not for a typo. Its own target directory: the flag would rebuild the
# main one.
RUSTC_BOOTSTRAP=1 CARGO_TARGET_DIR=target/doc-codes cargo test -q -p corelink-engine -p corelink-rpc --doc

echo "== loom: the SPSC rings"
RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test -q -p corelink-engine --release --lib ring::loom_tests

echo "== fuzz: decode 15 s, core_map 15 s, header 10 s, verbs_seq 20 s, soft_wire 10 s (fuzz/)"
# cargo-fuzz needs nightly features: RUSTC_BOOTSTRAP=1 lets the stable toolchain build it. The
# fuzz crate is outside the workspace (its own target directory, fuzz/target); one build serves
# every target. libFuzzer writes new inputs into the first corpus directory it is given: a
# fresh temporary one, so that the checked-in seeds (fuzz/corpus/<target>) stay as they are.
if cargo fuzz --help >/dev/null 2>&1; then
  fuzz_tmp=$(mktemp -d)
  trap 'rm -rf "$fuzz_tmp"' EXIT
  for run in decode:15 core_map:15 header:10 verbs_seq:20 soft_wire:10; do
    target=${run%:*}
    dict=()
    if [ "$target" = decode ]; then dict=(-dict=fuzz/decode.dict); fi
    mkdir "$fuzz_tmp/$target"
    RUSTC_BOOTSTRAP=1 cargo fuzz run "$target" "$fuzz_tmp/$target" "fuzz/corpus/$target" -- \
      -max_total_time="${run#*:}" "${dict[@]}"
  done
  rm -rf "$fuzz_tmp"
else
  echo "== fuzz: skipped, cargo-fuzz not installed (scripts/install-deps.sh installs it)"
fi

echo "== the RPC examples on soft, one process each (rpc_faults under a fault plan)"
for example in kv_store sequencer file_read; do
  cargo run -q -p corelink-apps --example "$example"
done
# Each call ends once and none runs twice, under a fault plan on the whole program.
CORELINK_SOFT_FAULTS=seed=3,drop=0.05,dup=0.05,reorder=0.1,delay_us=100 \
  cargo run -q -p corelink-apps --example rpc_faults -- --count 300 --window 4

echo "== fidelity on soft: corelink-conformance in one process vs with side B in a second"
# The same report, scenario by scenario (the guest batch compares the first with rxe0's).
cargo build -q -p corelink-apps --bin corelink-conformance
mkdir -p target/fidelity
target/debug/corelink-conformance --provider soft --json > target/fidelity/soft.jsonl
target/debug/corelink-conformance --provider soft --processes 2 --json > target/fidelity/soft-2.jsonl
target/debug/corelink-conformance compare target/fidelity/soft.jsonl target/fidelity/soft-2.jsonl

echo "== soft across processes: rpc_faults server and client as two processes, the server killed (-9) mid-run and restarted"
# Each call ends once (answered, or SessionClosed for those in flight at the kill) and none
# runs twice; the client reconnects to the restarted server. The server goes first; the client
# is killed at 120 s at most (the check is its exit status, not its time).
cargo build -q -p corelink-apps --example rpc_faults
rpc_faults=${CARGO_TARGET_DIR:-target}/debug/examples/rpc_faults
rpc_addr=127.0.0.1:$((20000 + $$ % 20000))
export CORELINK_SOFT_FABRIC=test-sh-$$
"$rpc_faults" server "$rpc_addr" >/dev/null &
rpc_server=$!
sleep 0.5
timeout 120 "$rpc_faults" client "$rpc_addr" --count 20000 --window 4 &
rpc_client=$!
sleep 1
kill -9 "$rpc_server"
wait "$rpc_server" 2>/dev/null || true
"$rpc_faults" server "$rpc_addr" >/dev/null &
rpc_server=$!
rpc_status=0
wait "$rpc_client" || rpc_status=$?
kill "$rpc_server" 2>/dev/null || true
wait "$rpc_server" 2>/dev/null || true
unset CORELINK_SOFT_FABRIC
[ "$rpc_status" = 0 ] || { echo "rpc_faults across processes failed ($rpc_status)"; exit 1; }

if [ -n "${CORELINK_IBV_DEVICE:-}" ]; then
  # A host with a real RDMA device (or rxe loaded): the same batch, without the guest.
  echo "== RDMA checks on this host's $CORELINK_IBV_DEVICE (CORELINK_IP=${CORELINK_IP:-unset})"
  cargo build -q -p corelink-apps --bins --examples
  mkdir -p target/fidelity
  target/debug/corelink-conformance --provider soft --json > target/fidelity/soft.jsonl
  target/debug/corelink-conformance --provider soft --processes 2 --json > target/fidelity/soft-2.jsonl
  exec bash tests/rxe-guest/ci.sh target/fidelity/soft.jsonl target/fidelity/soft-2.jsonl
fi
if [ "${CORELINK_SKIP_GUEST:-0}" = 1 ]; then
  echo "== Soft-RoCE guest: skipped (CORELINK_SKIP_GUEST=1)"
  exit 0
fi
if ! tests/rxe-guest/run --check-installed 2>/dev/null; then
  if [ "${CI:-}" = true ]; then
    echo "== Soft-RoCE guest: not installed (scripts/install-deps.sh installs it)" >&2
    exit 1
  fi
  echo "== Soft-RoCE guest: skipped, not installed (run scripts/install-deps.sh)"
  exit 0
fi

echo "== Soft-RoCE guest: build on the host"
cargo build -q -p corelink-apps --bins --examples
cargo test -q --no-run -p corelink-tests --test conformance_ibverbs
cargo test -q --no-run -p corelink-verbs --test ibverbs_smoke
cargo test -q --no-run -p corelink-engine --test engine_ibverbs --test qp_pool_ibverbs
cargo test -q --no-run -p corelink-rpc --features ibverbs --test rpc_ibverbs
mkdir -p target/fidelity
target/debug/corelink-conformance --provider soft --json > target/fidelity/soft.jsonl
target/debug/corelink-conformance --provider soft --processes 2 --json > target/fidelity/soft-2.jsonl

echo "== Soft-RoCE guest: boot and run the batch"
start=$(date +%s)
rc=0
tests/rxe-guest/run --wire --timeout 1800 -- bash tests/rxe-guest/ci.sh target/fidelity/soft.jsonl target/fidelity/soft-2.jsonl || rc=$?
echo "== Soft-RoCE guest: $(( $(date +%s) - start )) s, exit $rc"
exit $rc
