# Shared by the checks on the runner's second wire (wire-check.sh, rpc-wire.sh), sourced:
#   core_map FILE DEVICE GID CONTROL_CORE WORKER_CORE   an ibverbs core map of one worker
#   wire clear | wire NETEM-ARGS...                     netem on both veths (or none)
core_map() {
  printf 'provider = "ibverbs"\ndevice = "%s"\ngid_index = %s\ncontrol_core = %s\nworkers = [%s]\n[worker]\nidle_after_us = 100\nyield_after_empty_polls = 64\n' \
    "$2" "$3" "$4" "$5" > "$1"
}
wire() {
  local d
  # B (the clients' side) first: a client that gives up on a dead wire disconnects, and its
  # disconnect must not slip out through B's netdev while A's is already spoilt (a busy guest
  # takes a while per tc call; the server then heard of it and never needed its keepalive).
  for d in "$CORELINK_WIRE_B_NETDEV" "$CORELINK_WIRE_A_NETDEV"; do
    if [ "$1" = clear ]; then tc qdisc del dev "$d" root 2> /dev/null || true
    else tc qdisc replace dev "$d" root netem "$@" || echo "wire: tc netem $* on $d failed"; fi
  done
}
