#!/usr/bin/env bash
# perftest and corelink-perf side by side on the same Soft-RoCE device, sizes and iteration
# counts, one table: test, size, perftest, corelink, ratio. Run it in the guest, one command:
#
#   cargo build --release -p corelink-apps --bin corelink-perf
#   tests/rxe-guest/run --timeout 900 -- bash benches/perftest-side-by-side.sh
#
# Each test runs as a server and a client process on the guest's IP. TESTS="send_lat:8 ..."
# picks tests (default: all seven), ITERS the iterations (1000), CORELINK_ARGS extra client
# options for corelink-perf, RAW=1 corelink's verbs loop instead of its engine (`corelink-perf
# baseline raw_TEST`: what corelink's verbs layer costs beside perftest; RAW_PLACED=1 puts its
# client on core 0 and its server on 1, as perftest's and the engine's), SERVER_YIELD /
# CLIENT_YIELD each side's `worker.yield_after_empty_polls` (0: pure busy-polling; rxe's kernel
# work shares the vCPUs), NICE both tools' nice value (below). perftest reports MB/sec in MiB
# (2^20 bytes); corelink's MB/s (10^6 bytes) are converted to MiB for the ratio. Bandwidth ratio
# = corelink / perftest (higher is better); latency ratio = corelink t_typical / perftest
# t_typical (lower is better), and on a line of its own (TEST_min) t_min's. The guest is
# emulated (TCG): for comparison only.
# Both run with perftest's defaults: its bandwidth tests ask for one completion in 100
# (`--cq-mod`, 100 by default), so corelink's do too (`-Q ${CQ_MOD:-100}`; its own default
# is 1, one completion per request); both keep 128 requests in flight. perftest's latency tests
# signal one send in 100 as well, so corelink's ping-pongs go quiet with one completion in 100
# asked for (`--quiet -Q ${CQ_MOD:-100}` on both sides, unless CORELINK_ARGS / SERVER_ARGS
# give --quiet or -Q themselves; LAT_SIGNAL_EACH=1 signals each send). perftest's bandwidth
# server waits in a blocking call while the client runs, leaving its core to rxe's kernel
# work; corelink's bandwidth server does the same once idle (`worker.park_after_us`,
# SERVER_PARK_US, default 100; 0 busy-polls). So do both tools' read_lat and atomic_lat
# servers, whose side of the test is only the target of the client's requests: perftest's
# sleeps in a blocking call, corelink's parks (TARGET_PARK_US, default 100; 0 busy-polls: a
# busy target on the other vCPU cost read_lat 1.164 x perftest typical against 1.078 parked,
# t_min 1.105 against 1.066, 16 alternating rounds in one boot, session 43; atomic_lat the
# same either way). The ping-pong servers (send_lat, write_lat) answer each message, as
# perftest's do, and busy-poll (LAT_SERVER_PARK_US parks them too).
set -u
: "${CORELINK_IBV_DEVICE:?run this inside tests/rxe-guest/run}" "${CORELINK_IP:?}"
dev=$CORELINK_IBV_DEVICE gid=${CORELINK_IBV_GID_INDEX:-1} ip=$CORELINK_IP
perf=${CORELINK_PERF:-${CARGO_TARGET_DIR:-target}/release/corelink-perf}
iters=${ITERS:-1000}
[ -x "$perf" ] || { echo "no $perf: cargo build --release -p corelink-apps --bin corelink-perf"; exit 1; }
work=$(mktemp -d)
# The two processes on different cores: the server's worker on 1, the client's on 0.
# (core_map: benches/guest-core-map.sh)
# shellcheck source=benches/guest-core-map.sh
source "$(dirname "${BASH_SOURCE[0]}")/guest-core-map.sh"
core_map "$work/client.toml" 1 0 "${CLIENT_YIELD:-0}"
core_map "$work/server.toml" 0 1 "${SERVER_YIELD:-0}" "${LAT_SERVER_PARK_US:-0}"
core_map "$work/server-idle.toml" 0 1 "${SERVER_YIELD:-0}" "${SERVER_PARK_US:-100}"
core_map "$work/server-target.toml" 0 1 "${SERVER_YIELD:-0}" "${TARGET_PARK_US:-100}"
port=18800
# What every process of both tools is started under: (NO_ASLR=1) no address-space
# randomization, `setarch -R`, so that every run of a binary has the same layout, and the same
# collisions in the emulator's TLB
launch=()
[ -n "${NO_ASLR:-}" ] && launch=(setarch "$(uname -m)" -R)
# (NICE=N: every process of both tools, servers and clients, runs at nice N, e.g. -20. On rxe an
# RDMA read's responder is a tasklet whose raise wakes ksoftirqd, and a client at nice 0 is
# preempted by it on most round trips, about 20 us each here, however little it has left to do:
# read_lat's t_typical then measures that switch (see benches/guest-softirqs.sh))
[ -n "${NICE:-}" ] && launch=(nice -n "$NICE" "${launch[@]}")
# (SERVER_ARGS: extra corelink-perf options for the server, e.g. --quiet with CORELINK_ARGS=--quiet)
# perftest TEST SIZE -> its result line's fields (server on core 1, client on core 0)
run_perftest() {
  local tool=$1 size=$2 out
  # (PHASES=1: a line on stderr as each tool's run starts, to line up with the host's view)
  [ -n "${PHASES:-}" ] && echo "phase perftest $tool" >&2
  port=$((port + 1))
  "${launch[@]}" taskset -c 1 timeout 120 "$tool" -d "$dev" -x "$gid" -s "$size" -n "$iters" -p $port -F > "$work/srv.log" 2>&1 &
  local srv=$!
  sleep 1
  out=$("${launch[@]}" taskset -c 0 timeout 120 "$tool" -d "$dev" -x "$gid" -s "$size" -n "$iters" -p $port -F "$ip" 2>&1)
  wait $srv
  echo "$out" | awk -v s="$size" '$1 == s && NF >= 5 { print; exit }'
}
# corelink-perf TEST SIZE -> its JSON line
# Whether options $1 choose their own signalling (--quiet or -Q)
own_signalling() { [[ " $1 " == *" --quiet "* || " $1 " == *" -Q "* ]]; }
run_corelink() {
  local test=$1 size=$2 like=() slike=() server=$work/server.toml
  [ -n "${PHASES:-}" ] && echo "phase corelink $test" >&2
  [[ $test == *_bw ]] && like=(-Q "${CQ_MOD:-100}")
  [[ $test == *_bw ]] && server=$work/server-idle.toml
  [[ $test == read_lat || $test == atomic_lat ]] && server=$work/server-target.toml
  if [[ $test == send_lat || $test == write_lat ]] && [ -z "${RAW:-}${LAT_SIGNAL_EACH:-}" ]; then
    own_signalling "${CORELINK_ARGS:-}" || like=(--quiet -Q "${CQ_MOD:-100}")
    own_signalling "${SERVER_ARGS:-}" || slike=(--quiet -Q "${CQ_MOD:-100}")
  fi
  port=$((port + 1))
  # (RAW=1: corelink's verbs layer without the engine, `baseline raw_TEST`, which pins its
  # own threads: the server's to core 0, the client's to 1; RAW_PLACED=1 places them as
  # perftest's and the engine's are instead, the server on core 1 and the client on 0, with
  # taskset: a process allowed one core pins nothing itself)
  local run=("$test" --config "$server") runc=("$test" --config "$work/client.toml")
  local on_srv=() on_cli=()
  [ -n "${RAW:-}" ] && run=(baseline "raw_$test" --provider ibverbs) && runc=("${run[@]}")
  [ -n "${RAW:-}" ] && [ -n "${RAW_PLACED:-}" ] && on_srv=(taskset -c 1) && on_cli=(taskset -c 0)
  # shellcheck disable=SC2086
  "${launch[@]}" "${on_srv[@]}" timeout 120 "$perf" "${run[@]}" --bind "$ip" -p $port -s "$size" -n "$iters" "${slike[@]}" ${SERVER_ARGS:-} > "$work/csrv.log" 2>&1 &
  local srv=$!
  for _ in $(seq 100); do grep -q listening "$work/csrv.log" && break; sleep 0.1; done
  # shellcheck disable=SC2086
  "${launch[@]}" "${on_cli[@]}" timeout 120 "$perf" "${runc[@]}" -p $port -s "$size" -n "$iters" "${like[@]}" ${CORELINK_ARGS:-} --json "$ip" 2>/dev/null | head -1
  wait $srv
}
# A table row: NAME SIZE PERFTEST CORELINK UNIT, with corelink / perftest
row() {
  local r
  # (a figure that is not a positive finite number, e.g. perftest's "inf", makes no ratio)
  r=$(awk -v p="$3" -v c="$4" 'BEGIN { p += 0; c += 0
    if (p > 0 && c > 0 && p < 1e300 && c < 1e300) printf "%.3f", c / p; else print "nan" }')
  printf '%-10s %8s %14s %14s %8s  %s\n' "$1" "$2" "${3:-nan}" "${4:-nan}" "$r" "$5"
}

printf '%-10s %8s %14s %14s %8s  %s\n' test bytes perftest corelink ratio unit
for spec in ${TESTS:-write_bw:65536 read_bw:65536 send_bw:65536 atomic_bw:8 write_lat:8 send_lat:8 read_lat:8}; do
  test=${spec%%:*} size=${spec##*:}
  # (CORELINK_FIRST=1: corelink runs before perftest, so that alternating rounds cancel
  # whatever the order does)
  if [ -n "${CORELINK_FIRST:-}" ]; then
    cl=$(run_corelink "$test" "$size")
    line=$(run_perftest "ib_$test" "$size")
  else
    line=$(run_perftest "ib_$test" "$size")
    cl=$(run_corelink "$test" "$size")
  fi
  case $test in
    *_bw)
      p=$(echo "$line" | awk '{ print $4 }')                       # BW average [MiB/s]
      c=$(echo "$cl" | json bw_avg_mbps)
      c=$(awk -v c="$c" 'BEGIN { if (c + 0 > 0) printf "%.2f", c * 1e6 / 1048576; else print "nan" }')
      row "$test" "$size" "$p" "$c" "MiB/s avg (higher is better)" ;;
    *)
      p=$(echo "$line" | awk '{ print $5 }')                       # t_typical [usec]
      row "$test" "$size" "$p" "$(echo "$cl" | json t_typical_us)" "us typical (lower is better)"
      # (and the best round trip of each, t_min: what host noise can only lengthen)
      p=$(echo "$line" | awk '{ print $3 }')                       # t_min [usec]
      row "${test}_min" "$size" "$p" "$(echo "$cl" | json t_min_us)" "us min (lower is better)" ;;
  esac
done
rm -rf "$work"
