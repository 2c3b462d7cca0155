#!/usr/bin/env bash
# Runs in the Soft-RoCE guest (tests/rxe-guest/run -- bash tests/rxe-guest/two-devices.sh): adds a
# second device, rxe1, on a dummy netdev of its own, then runs the ibverbs smoke tests about
# contexts and devices: QPs of sibling contexts of rxe0 connect through rdma_cm and reach each
# other's memory (sibling_contexts), and rxe0's connection manager refuses a QP of rxe1,
# connecting and accepting, with Error::WrongDevice (cm_refuses_a_qp_of_another_device).
# Run it last in a boot: rxe1 stays until the guest goes. Build the tests on the host first.
set -u
: "${CORELINK_IP:?run this inside tests/rxe-guest/run}"
ip link add cl1 type dummy && ip addr add 10.78.0.1/24 dev cl1 && ip link set cl1 up \
  && rdma link add rxe1 type rxe netdev cl1 || { echo "FAIL: cannot create rxe1"; exit 1; }
for _ in $(seq 100); do grep -q ACTIVE /sys/class/infiniband/rxe1/ports/1/state && break; sleep 0.1; done
export RXE_IP=$CORELINK_IP RXE_GID_INDEX=$CORELINK_IBV_GID_INDEX CORELINK_IBV_DEVICE2=rxe1
cargo test --offline -q -p corelink-verbs --test ibverbs_smoke -- --ignored --test-threads=1 \
  --nocapture sibling_contexts cm_refuses_a_qp_of_another_device
