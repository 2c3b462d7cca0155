# Sourced by the guest benches (perftest-side-by-side.sh, guest-counts.sh, ...): the engine's
# core map for one side on rxe0, from `dev` and `gid` (the guest's device and GID index), and
# one client run of perftest, the raw loop or the engine beside its server (`client_run`), and
# a figure from corelink-perf's JSON (`json`).
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

# client_run KIND TEST SIZE ITERS PORT BEFORE AFTER: one run of TEST's client at SIZE bytes and
# ITERS iterations beside its server, KIND: perftest (server on CPU 1, client on 0), raw
# (corelink-perf's `baseline raw_TEST`, which pins its own threads), engine (core maps
# $work/server.toml and $work/client.toml) or parked (the server's map $work/parked.toml). Runs
# the command BEFORE once the server listens and AFTER once the client is done; the client's
# output is in $work/cli.log. Needs dev, gid, ip, perf and work; the engine's client and server
# get CORELINK_ARGS and SERVER_ARGS (options split on spaces).
client_run() {
  local kind=$1 test=$2 size=$3 iters=$4 port=$5 before=$6 after=$7 srv cli pid
  local at=(-p "$port" -s "$size" -n "$iters")
  case $kind in
    perftest)
      srv=(taskset -c 1 "ib_$test" -d "$dev" -x "$gid" "${at[@]}" -F)
      cli=(taskset -c 0 "ib_$test" -d "$dev" -x "$gid" "${at[@]}" -F "$ip") ;;
    raw)
      srv=("$perf" baseline "raw_$test" --provider ibverbs "${at[@]}")
      cli=("${srv[@]}" --json "$ip") && srv+=(--bind "$ip") ;;
    engine|parked)
      local map=$work/server.toml
      [ "$kind" = parked ] && map=$work/parked.toml
      # shellcheck disable=SC2206 # (extra options, split on spaces)
      srv=("$perf" "$test" --config "$map" --bind "$ip" "${at[@]}" ${SERVER_ARGS:-})
      # shellcheck disable=SC2206
      cli=("$perf" "$test" --config "$work/client.toml" "${at[@]}" ${CORELINK_ARGS:-} --json "$ip") ;;
    *) echo "unknown kind $kind (perftest, raw, engine, parked)"; return 2 ;;
  esac
  timeout 300 "${srv[@]}" > "$work/srv.log" 2>&1 &
  pid=$!
  if [ "$kind" = perftest ]; then sleep 1.5; else
    for _ in $(seq 100); do grep -q listening "$work/srv.log" && break; sleep 0.1; done
  fi
  $before
  timeout 300 "${cli[@]}" > "$work/cli.log" 2>&1 || { echo "client failed:"; cat "$work/cli.log"; }
  $after
  wait "$pid" || true # (a server's own status is not the run's)
}

# json KEY: the number KEY in the first line of corelink-perf's flat JSON on standard input that
# has it, or nan (awk, not python: in the emulated guest each python start took about 7 s)
json() {
  awk -v k="\"$1\"" '{ i = index($0, k ":"); if (!i) next
    v = substr($0, i + length(k) + 1); sub(/^ */, "", v); sub(/[,}].*/, "", v); print v; f = 1
    exit } END { if (!f) print "nan" }'
}
