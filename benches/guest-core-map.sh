# Sourced by the guest benches (perftest-side-by-side.sh, guest-counts.sh): the engine's core
# map for one side on rxe0, from `dev` and `gid` (the guest's device and GID index).
# Reads and atomics in flight per QP: perftest keeps the device's max_qp_rd_atom (rxe: 128),
# so the maps say as many (`worker.scheduler.max_rd_atomic`, RD_ATOMIC, default 128; the
# engine's own default is 16, a ConnectX's cap).
# WORKER_KEYS: more [worker] keys, comma-separated (e.g. "cq_depth=128,send_queue_depth=32").
# core_map FILE CONTROL_CORE WORKER_CORE YIELD_AFTER_EMPTY_POLLS [PARK_AFTER_US]
core_map() {
  cat > "$1" <<MAP
provider = "ibverbs"
device = "$dev"
gid_index = $gid
control_core = $2
workers = [$3]
[worker]
idle_after_us = 100
yield_after_empty_polls = $4
park_after_us = ${5:-0}
$(echo "${WORKER_KEYS:-}" | tr ',' '\n' | sed 's/=/ = /')
[worker.scheduler]
max_rd_atomic = ${RD_ATOMIC:-128}
MAP
}
