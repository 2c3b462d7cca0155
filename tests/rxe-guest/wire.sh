#!/usr/bin/env bash
# Loss, delay and kill on a real wire, in the Soft-RoCE guest:
#
#   cargo build --release -p corelink-apps --bin corelink-perf
#   tests/rxe-guest/run --wire --timeout 900 -- bash tests/rxe-guest/wire.sh
#
# The runner's --wire gives two rxe devices joined by a veth pair (end A: rxea on clwa, end B:
# rxeb on clwb). Servers run on A (core 1), clients on B (core 0). netem is put on both veths,
# so a condition holds in each direction ("loss 10%" drops 10 % of what A sends and 10 % of what
# B sends: data and acknowledgements alike). Each run has a hard timeout. Measured and printed
# as one table (condition, who, what the user saw, after how long, what was lost on the wire):
#   - RC write_bw (-n ITERS, SIZE bytes) at 0 %, 1 % and 10 % loss and at 10 ms and 50 ms delay,
#     corelink-perf beside perftest's ib_write_bw -u 14 (the engine's default ACK timeout);
#     ratio = corelink's transfer time / perftest's (from each one's average bandwidth);
#   - 100 % loss set mid-run (a second after data flows): the client's report and how long
#     after the loss began; then the wire is restored and the server's report (a write_bw
#     server has nothing in flight: if it has not heard 10 s later, that is reported, not failed);
#   - kill -9 of the server mid-run (the client's report and delay) and of the client (the
#     server's);
#   - UC send_bw at 10 % loss (corelink-perf -c UC, on verbs), and at 100 % loss from the
#     middle of a 5 s run (UC sends complete whatever the wire does; the client then waits up
#     to 60 s for the server's count on its TCP control connection, over the same dead wire).
# Times are measurements, not assertions. Exit status: 1 if a run hung (ended by its hard
# timeout), crashed (killed by a signal we did not send) or completed with the wrong number of
# iterations; otherwise 0, whatever the times. A client that fails is a measurement (under 10 %
# loss the connection manager's handshake itself may time out); its server, which may still be
# waiting, gets 10 s and is then ended by the script and reported so. ITERS (3000), SIZE (4096), REPS (pairs per loss
# condition: 3), ONLY="name ..." (run only those of: bw delay loss100 kill_server kill_client uc
# uc100), CORELINK_PERF (the binary). About 8 minutes in the emulated guest.
set -u
: "${CORELINK_WIRE_A_DEVICE:?run this inside tests/rxe-guest/run --wire}"
A_DEV=$CORELINK_WIRE_A_DEVICE A_GID=$CORELINK_WIRE_A_GID_INDEX A_IP=$CORELINK_WIRE_A_IP A_NET=$CORELINK_WIRE_A_NETDEV
B_DEV=$CORELINK_WIRE_B_DEVICE B_GID=$CORELINK_WIRE_B_GID_INDEX B_NET=$CORELINK_WIRE_B_NETDEV
perf=${CORELINK_PERF:-${CARGO_TARGET_DIR:-target}/release/corelink-perf}
iters=${ITERS:-3000} size=${SIZE:-4096}
[ -x "$perf" ] || { echo "wire: no $perf (cargo build --release -p corelink-apps --bin corelink-perf)"; exit 1; }
command -v ib_write_bw > /dev/null || { echo "wire: no ib_write_bw (perftest)"; exit 1; }
work=$(mktemp -d)
port=18900 bad=0 rows=() notes=() reps=1 J='' RC=''

core_map() {   # FILE DEVICE GID CONTROL_CORE WORKER_CORE
  cat > "$1" <<MAP
provider = "ibverbs"
device = "$2"
gid_index = $3
control_core = $4
workers = [$5]
[worker]
idle_after_us = 100
yield_after_empty_polls = 64
MAP
}
core_map "$work/a.toml" "$A_DEV" "$A_GID" 0 1
core_map "$work/b.toml" "$B_DEV" "$B_GID" 1 0

wire() {   # netem arguments for both ends, or "clear"
  local d
  for d in "$A_NET" "$B_NET"; do
    if [ "$1" = clear ]; then tc qdisc del dev "$d" root 2> /dev/null || true
    else tc qdisc replace dev "$d" root netem "$@" || { echo "wire: tc netem $* on $d failed"; exit 1; }; fi
  done
}
drops() {   # packets netem dropped on both ends since its qdisc was made
  local d n=0 x
  for d in "$A_NET" "$B_NET"; do
    x=$(tc -s qdisc show dev "$d" | sed -n 's/.*(dropped \([0-9]*\),.*/\1/p' | head -1)
    n=$((n + ${x:-0}))
  done
  echo $n
}
ctr() {   # rxe hardware counter NAME summed over both ends
  local n=0 d x
  for d in "$A_DEV" "$B_DEV"; do
    x=$(cat "/sys/class/infiniband/$d/ports/1/hw_counters/$1" 2> /dev/null || echo 0)
    n=$((n + x))
  done
  echo $n
}
snap() { echo "$(drops) $(ctr completer_retry_err) $(ctr rcvd_seq_err) $(ctr retry_exceeded_err)"; }
# lost BEFORE: what the wire lost since snap printed BEFORE: netem's drops (both ends) and rxe's
# counters (both ends): requester retries (timeouts and NAKs), sequence NAKs received, retries
# exceeded.
lost() {
  local d0 r0 s0 e0 d1 r1 s1 e1
  read -r d0 r0 s0 e0 <<< "$1"
  read -r d1 r1 s1 e1 <<< "$(snap)"
  [ "$d1" -ge "$d0" ] || d0=0   # the qdisc was made again in between
  echo "$((d1 - d0)) pkts dropped; $((r1 - r0)) retries, $((s1 - s0)) seq NAKs, $((e1 - e0)) retry-exceeded"
}
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f s", b - a }'; }
row() { rows+=("$(printf '%-26s | %-8s | %-58s | %-8s | %s' "$@")"); printf '%-26s | %-8s | %-58s | %-8s | %s\n' "$@"; }
# why LOG: the last error line of a corelink-perf log, or its last line that is not a rule
why() {
  local l
  l=$(grep -E 'corelink-perf: |error|Error|ERR' "$1" | grep -v 'note:\|warning:' | tail -1)
  [ -n "$l" ] || l=$(grep -v '^---' "$1" | tail -1)
  echo "${l#corelink-perf: }"
}
short() { local s=$1; [ ${#s} -le 58 ] && echo "$s" || echo "${s:0:55}..."; }
# judge RC: sets J to what the exit status says (124/137: a hang, ended by the hard timeout;
# another signal: a crash; both fail the script)
judge() {
  case $1 in
    124|137) bad=1 J="HUNG (hard timeout)" ;;
    13[0-9]|1[4-9][0-9]) bad=1 J="CRASHED (exit $1)" ;;
    *) J="exit $1" ;;
  esac
}
# reap PID SECS: waits at most SECS for PID; sets RC to its exit status, or to "alive" after ending
# it (a server whose client failed may still wait for it: reported, not a hang of the run)
reap() {
  local t=$EPOCHREALTIME
  while kill -0 "$1" 2> /dev/null && [ "$(secs "$t" "$EPOCHREALTIME" | cut -d. -f1)" -lt "$2" ]; do sleep 0.2; done
  if kill -0 "$1" 2> /dev/null; then kill "$1"; wait "$1" 2> /dev/null; RC=alive
  else wait "$1"; RC=$?; fi
}
wait_listening() { for _ in $(seq 200); do grep -q listening "$1" && return 0; sleep 0.1; done; return 1; }
# wait_flowing: until B has sent 300 packets more than when called (the run's data flows)
wait_flowing() {
  local s0
  s0=$(cat "/sys/class/infiniband/$B_DEV/ports/1/hw_counters/sent_pkts")
  for _ in $(seq 300); do
    [ $(($(cat "/sys/class/infiniband/$B_DEV/ports/1/hw_counters/sent_pkts") - s0)) -ge 300 ] && return 0
    sleep 0.1
  done
  return 1
}
bw_of() { sed -n 's/.*"bw_avg_mbps":\([0-9.e+-]*\).*/\1/p' "$1" | head -1; }
iters_of() { sed -n 's/.*"iterations":\([0-9]*\).*/\1/p' "$1" | head -1; }
# perftest's BW average (MiB/s) -> MB/s
pt_bw() { awk -v s="$size" '$1 == s && NF >= 5 { printf "%.2f", $4 * 1048576 / 1e6; exit }' "$1"; }

# corelink COND TIMEOUT ARGS...: corelink-perf write_bw server on A, client on B; sets CL_BW
corelink() {
  local cond=$1 to=$2 srv t0 t1 crc src b0 out bw n
  shift 2
  port=$((port + 1)) CL_BW=
  timeout -k 5 "$to" taskset -c 1 "$perf" "$@" --config "$work/a.toml" --bind "$A_IP" -p $port > "$work/s.log" 2>&1 & srv=$!
  wait_listening "$work/s.log" || echo "wire: server not listening after 20 s"
  b0=$(snap)
  t0=$EPOCHREALTIME
  timeout -k 5 "$to" taskset -c 0 "$perf" "$@" --config "$work/b.toml" -p $port --json --timeout "$to" "$A_IP" > "$work/c.out" 2> "$work/c.log"; crc=$?
  t1=$EPOCHREALTIME
  reap $srv 10; src=$RC
  bw=$(bw_of "$work/c.out") n=$(iters_of "$work/c.out")
  if [ $crc = 0 ] && [ $src = 0 ] && [ "${n:-0}" = "$iters" ] && [ -n "$bw" ]; then
    out="completed $n/$iters, $(printf '%.2f' "$bw") MB/s" CL_BW=$bw
  elif [ $crc = 0 ]; then
    if [ $src = alive ]; then J="still running 10 s later"; else judge $src; fi
    bad=1 out="WRONG: exit 0 with ${n:-no} iterations (server $J)"
  else
    judge $crc
    out="$J: $(why "$work/c.log")"
    notes+=("$cond, corelink client: $(why "$work/c.log")")
  fi
  if [ $src = alive ]; then
    notes+=("$cond, corelink server: no report 10 s after its client ended (ended by the script); its log ends: $(why "$work/s.log")")
  elif [ $src != 0 ]; then
    judge $src; notes+=("$cond, corelink server ($J): $(why "$work/s.log")")
  fi
  row "$cond" corelink "$(short "$out")" "$(secs "$t0" "$t1")" "$(lost "$b0")"
}
# perftest COND TIMEOUT: ib_write_bw -u 14 server on A, client on B; sets PT_BW
perftest() {
  local cond=$1 to=$2 srv t0 t1 crc b0 out bw
  port=$((port + 1)) PT_BW=
  timeout -k 5 "$to" taskset -c 1 ib_write_bw -d "$A_DEV" -x "$A_GID" -s "$size" -n "$iters" -u 14 -p $port -F > "$work/ps.log" 2>&1 & srv=$!
  for _ in $(seq 200); do ss -ltn | grep -q ":$port " && break; sleep 0.1; done
  b0=$(snap)
  t0=$EPOCHREALTIME
  timeout -k 5 "$to" taskset -c 0 ib_write_bw -d "$B_DEV" -x "$B_GID" -s "$size" -n "$iters" -u 14 -p $port -F "$A_IP" > "$work/pc.log" 2>&1; crc=$?
  t1=$EPOCHREALTIME
  reap $srv 10
  bw=$(pt_bw "$work/pc.log")
  if [ $crc = 0 ] && [ -n "$bw" ]; then out="completed $iters/$iters, $bw MB/s" PT_BW=$bw
  else judge $crc; out="$J: $(tail -1 "$work/pc.log")"; fi
  row "$cond" perftest "$(short "$out")" "$(secs "$t0" "$t1")" "$(lost "$b0")"
}
ratio() {   # COND: corelink's transfer time / perftest's, from the two averages
  if [ -n "$CL_BW" ] && [ -n "$PT_BW" ]; then
    row "$1" ratio "$(awk -v c="$CL_BW" -v p="$PT_BW" 'BEGIN { printf "corelink time / perftest time = %.2f", p / c }')" "" ""
  else
    row "$1" ratio "n/a (a run did not complete)" "" ""
  fi
}
on() { [ -z "${ONLY:-}" ] || [[ " $ONLY " == *" $1 "* ]]; }

printf '%-26s | %-8s | %-58s | %-8s | %s\n' condition who "what the user saw" after "lost on the wire"
# -- bandwidth under loss and delay ---------------------------------------------------------
bw_case() {   # COND TIMEOUT NETEM...: REPS pairs (perftest, then corelink)
  local cond=$1 to=$2
  shift 2
  if [ "$1" = none ]; then wire clear; else wire "$@"; fi
  for _ in $(seq "$reps"); do
    perftest "$cond" "$to"
    corelink "$cond" "$to" write_bw -n "$iters" -s "$size"
    ratio "$cond"
  done
  wire clear
}
if on bw; then
  bw_case "no loss" 60 none
  reps=${REPS:-3} bw_case "loss 1% each way" 90 loss 1%
  reps=${REPS:-3} bw_case "loss 10% each way" 120 loss 10%
fi
if on delay; then
  bw_case "delay 10 ms each way" 90 delay 10ms
  bw_case "delay 50 ms each way" 90 delay 50ms
fi

# -- 100 % loss from the middle of a run ------------------------------------------------------
if on loss100; then
  cond="loss 100% from mid-run" port=$((port + 1))
  wire delay 0ms
  timeout -k 5 90 taskset -c 1 "$perf" write_bw -D 30 -s "$size" --config "$work/a.toml" --bind "$A_IP" -p $port > "$work/s.log" 2>&1 & srv=$!
  wait_listening "$work/s.log"
  timeout -k 5 60 taskset -c 0 "$perf" write_bw -D 30 -s "$size" --config "$work/b.toml" -p $port --timeout 60 "$A_IP" > "$work/c.out" 2> "$work/c.log" & cli=$!
  wait_flowing || echo "wire: no data flowing after 30 s"
  sleep 1
  b0=$(snap)
  t0=$EPOCHREALTIME   # (the loss begins on one end, then on the other: tc takes ~0.1 s here)
  wire loss 100%
  wait $cli; crc=$?
  t1=$EPOCHREALTIME
  judge $crc
  row "$cond" client "$(short "$J: $(why "$work/c.log")")" "$(secs "$t0" "$t1")" "$(lost "$b0")"
  notes+=("$cond, client: $(why "$work/c.log")")
  # A write_bw server has nothing of its own in flight: only the connection manager can tell it,
  # and the client's disconnect went into the dead wire. Give the wire back and wait 10 s; a
  # server still waiting then is reported (a known limit: no keep-alive), not failed.
  wire clear
  t2=$EPOCHREALTIME
  reap $srv 10
  if [ $RC = alive ]; then
    row "$cond" server "no report: still waiting 10 s after the wire came back" "-" "(ended by the script)"
    notes+=("$cond, server: still waiting 10 s after the wire came back (wire back $(secs "$t0" "$t2") after the loss began); ended by the script")
  else
    judge $RC
    row "$cond" server "$(short "$J: $(why "$work/s.log")")" "$(secs "$t0" "$EPOCHREALTIME")" "(wire back at $(secs "$t0" "$t2"))"
    notes+=("$cond, server: $(why "$work/s.log")")
  fi
fi

# -- kill -9 of one side mid-run ----------------------------------------------------------------
# kill_case WHO: WHO (server or client) is killed -9 a second after data flows; the other side's
# report and how long after the kill it came. The killed side runs without a timeout wrapper
# (the kill must reach corelink-perf), bounded by a watchdog.
kill_case() {
  local who=$1 cond="kill -9 of the $1 mid-run" srv cli victim survivor t0 t1 rc log dog
  port=$((port + 1))
  if [ "$who" = server ]; then
    taskset -c 1 "$perf" write_bw -D 30 -s "$size" --config "$work/a.toml" --bind "$A_IP" -p $port > "$work/s.log" 2>&1 & srv=$!
  else
    timeout -k 5 90 taskset -c 1 "$perf" write_bw -D 30 -s "$size" --config "$work/a.toml" --bind "$A_IP" -p $port > "$work/s.log" 2>&1 & srv=$!
  fi
  wait_listening "$work/s.log"
  if [ "$who" = client ]; then
    taskset -c 0 "$perf" write_bw -D 30 -s "$size" --config "$work/b.toml" -p $port "$A_IP" > "$work/c.out" 2> "$work/c.log" & cli=$!
    victim=$cli survivor=$srv log=$work/s.log
  else
    timeout -k 5 90 taskset -c 0 "$perf" write_bw -D 30 -s "$size" --config "$work/b.toml" -p $port --timeout 60 "$A_IP" > "$work/c.out" 2> "$work/c.log" & cli=$!
    victim=$srv survivor=$cli log=$work/c.log
  fi
  (sleep 80; kill -9 $victim 2> /dev/null) & dog=$!
  wait_flowing || echo "wire: no data flowing after 30 s"
  sleep 1
  t0=$EPOCHREALTIME
  kill -9 $victim
  wait $victim 2> /dev/null
  wait $survivor; rc=$?
  t1=$EPOCHREALTIME
  kill $dog 2> /dev/null; wait $dog 2> /dev/null
  [ "$who" = server ] && who=client || who=server
  judge $rc
  row "$cond" "$who" "$(short "$J: $(why "$log")")" "$(secs "$t0" "$t1")" ""
  notes+=("$cond, $who: $(why "$log")")
}
if on kill_server; then kill_case server; fi
if on kill_client; then kill_case client; fi

# -- UC under loss ------------------------------------------------------------------------------
if on uc; then
  cond="UC send_bw, loss 10% each way" port=$((port + 1))
  wire loss 10%
  b0=$(snap)
  timeout -k 5 60 taskset -c 1 "$perf" send_bw -c UC -n "$iters" -s "$size" --config "$work/a.toml" --bind "$A_IP" -p $port > "$work/s.log" 2>&1 & srv=$!
  wait_listening "$work/s.log" || sleep 2
  t0=$EPOCHREALTIME
  timeout -k 5 60 taskset -c 0 "$perf" send_bw -c UC -n "$iters" -s "$size" --config "$work/b.toml" -p $port --json "$A_IP" > "$work/c.out" 2> "$work/c.log"; crc=$?
  t1=$EPOCHREALTIME
  reap $srv 20; src=$RC
  t2=$EPOCHREALTIME
  if [ $crc = 0 ]; then out="exit 0, $(iters_of "$work/c.out") iterations, $(printf '%.2f' "$(bw_of "$work/c.out")") MB/s"
  else judge $crc; out="$J: $(why "$work/c.log")"; fi
  row "$cond" client "$(short "$out")" "$(secs "$t0" "$t1")" "$(lost "$b0")"
  if [ "$src" = alive ]; then J="still running 20 s after its client ended (ended by the script)"; else judge "$src"; fi
  row "$cond" server "$(short "$J: $(why "$work/s.log")")" "$(secs "$t0" "$t2")" ""
  notes+=("$cond, client: $(why "$work/c.log")" "$cond, server: $(why "$work/s.log")")
  wire clear
fi

# -- UC at 100 % loss from mid-run ----------------------------------------------------------------
if on uc100; then
  cond="UC send_bw, 100% loss mid-run" port=$((port + 1))
  wire delay 0ms
  timeout -k 5 100 taskset -c 1 "$perf" send_bw -c UC -D 5 -s "$size" --config "$work/a.toml" --bind "$A_IP" -p $port > "$work/s.log" 2>&1 & srv=$!
  wait_listening "$work/s.log" || sleep 2
  timeout -k 5 100 taskset -c 0 "$perf" send_bw -c UC -D 5 -s "$size" --config "$work/b.toml" -p $port --json "$A_IP" > "$work/c.out" 2> "$work/c.log" & cli=$!
  wait_flowing || echo "wire: no data flowing after 30 s"
  sleep 1
  b0=$(snap)
  t0=$EPOCHREALTIME
  wire loss 100%
  wait $cli; crc=$?
  t1=$EPOCHREALTIME
  l=$(lost "$b0")
  reap $srv 40; src=$RC
  t2=$EPOCHREALTIME
  wire clear
  judge $crc
  row "$cond" client "$(short "$J: $(why "$work/c.log")")" "$(secs "$t0" "$t1")" "$l"
  if [ "$src" = alive ]; then J="still running 40 s after its client ended (ended by the script)"; else judge "$src"; fi
  row "$cond" server "$(short "$J: $(why "$work/s.log")")" "$(secs "$t0" "$t2")" ""
  notes+=("$cond, client: $(why "$work/c.log")" "$cond, server: $(why "$work/s.log")")
fi

echo
echo "condition / who / what the user saw / after / lost (ITERS=$iters SIZE=$size; A=$A_DEV, B=$B_DEV):"
printf '%s\n' "${rows[@]}"
echo
echo "messages in full:"
printf '  %s\n' "${notes[@]+"${notes[@]}"}"
rm -rf "$work"
[ $bad = 0 ] || { echo "wire: a run hung, crashed or completed wrongly"; exit 1; }
