#!/usr/bin/env bash
# Guest instructions per round trip, user and kernel, for perftest, corelink's verbs loop
# (`baseline raw_TEST`) and the engine, on rxe0 in the Soft-RoCE guest. A QEMU TCG plugin
# (benches/guest-counts/plugin.c) counts each vCPU's instructions and translation blocks in user
# and kernel mode, the host time in each mode and the kernel's entries; a marker program
# (mark.c) has it write its counters out before and after each client run. "distinct" counts
# each block once per stretch between two entries into the kernel (a round trip's path; the
# side that waits adds its polling loop's few blocks): in this emulator a block that was not
# run since the last post costs far more than its instructions (the post's kernel work, about
# 1,100 blocks, passes in between). Each test runs at
# N1 and N2 iterations, and the per-iteration figure is (count at N2 - count at N1) / (N2 - N1),
# both vCPUs summed, so that start-up and connection set-up cancel out. Run on the host:
#
#   cargo build --release -p corelink-apps --bin corelink-perf
#   bash benches/guest-counts.sh                  # TESTS="send_lat:8" N1=20000 N2=60000
#
# CORELINK_ARGS and SERVER_ARGS: extra corelink-perf options for the engine's client and server
# (e.g. --quiet for both), LAT_SERVER_PARK_US the server's `worker.park_after_us`, as in
# perftest-side-by-side.sh. Built with `--features guest-marks`,
# corelink-perf marks where the engine and the raw loop find a message: "tails" counts the
# stretches from such a mark to the next entry into the kernel (the answer's doorbell), and
# "tail blocks" the distinct user blocks in them, the part of a ping-pong's user code that is
# on its critical path (the rest runs while the peer answers), "rets" and "calls" the returns
# and calls run in them: in this emulator a return costs a look-up of the next block (about 40
# ns a call and its return, where a distinct block reached by a direct jump costs next to
# nothing). perftest has no marks.
#
# Instruction counts are the emulated CPU's and do not depend on the host's load; the time per
# mode is host time with the plugin's own overhead in it (a plugin call per block): compare it
# between kinds in one run only. User-mode counts include the busy-polling of whichever side
# waits, so they grow with the other side's time; kernel counts do not (the round trip's posts).
# A second table gives each vCPU apart (the client of a one-sided test is the round trip's
# path), with the atomic (locked) instructions, the fences (rdtsc, pause, cpuid too), the moves
# from one block to the next that make the emulator look the next up (after a return or an
# indirect call or jump; a direct jump onto another page, which its generated code is not
# chained across; "tail xpage" counts the latter in tails) and the kernel's TLB flushes;
# BLOCKS=1 / BLOCKS=kernel and PAGES=1 (below) list blocks and count data pages
# (`benches/guest-counts/functions.py` sums a BLOCKS=kernel run's by kernel function, and with
# "user" a run's user code by function: with BLOCKS set the guest runs without address-space
# randomization and prints an engine server's memory map, "umap" lines). Needs a C
# compiler and QEMU with plugin support (Debian's qemu-system-x86 7.2 has it).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
here=$repo/benches/guest-counts
perf=${CORELINK_PERF:-${CARGO_TARGET_DIR:-target}/release/corelink-perf}
n1=${N1:-20000} n2=${N2:-60000}
tests=${TESTS:-send_lat:8}
kinds=${KINDS:-perftest raw engine}

if [ "${1:-}" = --inside ]; then
  # In the guest: each kind and test at N1 and N2, a mark before and after each client run.
  : "${CORELINK_IBV_DEVICE:?run through tests/rxe-guest/run}"
  mark=$2
  if [ "${BLOCKS:-}" = kernel ]; then grep ' [tT] ' /proc/kallsyms | sed 's/^/ksym /'; fi
  dev=$CORELINK_IBV_DEVICE gid=${CORELINK_IBV_GID_INDEX:-1} ip=$CORELINK_IP
  work=$(mktemp -d) port=18900
  # (perftest-side-by-side.sh's latency maps: client worker on core 0, server's on 1)
  # shellcheck source=benches/guest-core-map.sh
  source "$repo/benches/guest-core-map.sh"
  core_map "$work/client.toml" 1 0 0
  core_map "$work/server.toml" 0 1 0 "${LAT_SERVER_PARK_US:-0}"
  if [ -n "${BLOCKS:-}" ]; then
    # (user blocks are named by function: every process gets the same layout, which an
    # engine's server, its device open, prints as "umap" lines)
    echo 0 > /proc/sys/kernel/randomize_va_space
    "$perf" send_lat --config "$work/server.toml" --bind "$ip" -p $port > "$work/srv.log" 2>&1 &
    for _ in $(seq 100); do grep -q listening "$work/srv.log" && break; sleep 0.1; done
    sed 's/^/umap /' "/proc/$!/maps"
    kill $! && wait $! 2> /dev/null || true
  fi
  for spec in $tests; do
    test=${spec%%:*} size=${spec##*:}
    for kind in $kinds; do
      for n in $n1 $n2; do
        port=$((port + 1))
        echo "run $kind $test $n"
        client_run "$kind" "$test" "$size" "$n" $port "$mark" "$mark" || exit 2
      done
    done
  done
  rm -rf "$work"
  exit 0
fi

[ -x "$perf" ] || { echo "no $perf: cargo build --release -p corelink-apps --bin corelink-perf"; exit 1; }
out=$repo/${CARGO_TARGET_DIR:-target}/guest-counts
mkdir -p "$out"
cc -O2 -Wall -shared -fPIC -o "$out/plugin.so" "$here/plugin.c" -lpthread
cc -O2 -Wall -static -o "$out/mark" "$here/mark.c"
rm -f "$out/counts.txt"
# (BLOCKS=1: the plugin also lists, at each mark, the user blocks that ran, in blocks.txt;
# BLOCKS=kernel: the kernel's too, and guest.log gets the guest's kernel text symbols, "ksym"
# lines, to name them)
opts=${BLOCKS:+,blocks=$out/blocks.txt}
[ "${BLOCKS:-}" = kernel ] && opts="$opts,kernel=1"
# (PAGES=1: the plugin also counts the distinct data pages each stretch touches, per mode: each
# an entry of the emulator's TLB; models that TLB, its misses and page-table walks (a third
# table), and lists the pages that walk in walks.txt; it slows the guest several times)
[ -n "${PAGES:-}" ] && opts="$opts,pages=1,walks=$out/walks.txt"
CORELINK_GUEST_QEMU_OPTS="-plugin $out/plugin.so,out=$out/counts.txt$opts" \
  "$repo/tests/rxe-guest/run" --timeout "${TIMEOUT:-1800}" --env TESTS --env KINDS --env N1 \
  --env N2 --env BLOCKS --env LAT_SERVER_PARK_US --env CORELINK_PERF --env CORELINK_ARGS \
  --env SERVER_ARGS -- \
  bash benches/guest-counts.sh --inside "$out/mark" | tee "$out/guest.log"
python3 - "$out/guest.log" "$out/counts.txt" "$n1" "$n2" <<'PY'
import sys, collections
log, counts, n1, n2 = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
runs = [l.split()[1:] for l in open(log) if l.startswith('run ')]
marks = collections.defaultdict(dict)  # mark -> vcpu -> counters
# The plugin's labelled sections, in this order, and their sizes: user, kernel, tails (all zero
# unless the build has tail marks: see the plugin), data pages (zero without PAGES=1), atomics
# and fences (etc.) in user and kernel mode, the kernel's TLB flushes, and the moves between
# blocks that need a look-up (after a return or an indirect branch; onto another page), user
# and kernel, and those onto another page in tails.
SECTIONS = [('user', 5), ('kernel', 5), ('tails', 4), ('pages', 2), ('ops', 4), ('flushes', 1),
            ('jumps', 5), ('tlb', 12)]
N = sum(n for _, n in SECTIONS)
for l in open(counts):
    f = l.split()
    got, label = collections.defaultdict(list), None
    for x in f[6:]:
        if x.isdigit():
            got[label].append(int(x))
        else:
            label = x
    marks[int(f[1])][int(f[5])] = [v for s, n in SECTIONS for v in (got[s] + [0] * n)[:n]]
order = sorted(marks)
if len(order) != 2 * len(runs):
    sys.exit(f'{len(runs)} runs but {len(order)} marks: a client failed?')
def delta(i, vcpus=None):
    a, b = marks[order[2 * i]], marks[order[2 * i + 1]]
    return [sum(b[v][k] - a.get(v, [0] * N)[k] for v in b if vcpus is None or v in vcpus)
            for k in range(N)]
got, per_vcpu = {}, {}
for i, (kind, test, n) in enumerate(runs):
    got[(kind, test, int(n))] = delta(i)
    for v in marks[order[2 * i + 1]]:
        per_vcpu[(kind, test, int(n), v)] = delta(i, {v})
def per_iteration(table, key_lo, key_hi):
    lo, hi = table.get(key_lo), table.get(key_hi)
    return None if lo is None or hi is None else [(h - l) / (n2 - n1) for h, l in zip(hi, lo)]
print(f'per iteration ({n2} - {n1} iterations), both vCPUs; ns: host time with the plugin in it')
print(f'{"test":10} {"kind":9} {"user insns":>11} {"user TBs":>9} {"distinct":>9} {"user us":>8} '
      f'{"kern insns":>11} {"kern TBs":>9} {"distinct":>9} {"kern us":>8} {"entries":>8} {"tails":>6} '
      f'{"tail blocks":>11} {"rets":>5} {"calls":>5} {"pages u/k":>11} {"tail xpage":>10}')
for (kind, test, n) in got:
    d = per_iteration(got, (kind, test, n1), (kind, test, n)) if n == n2 else None
    if d is None:
        continue
    print(f'{test:10} {kind:9} {d[0]:11.0f} {d[1]:9.0f} {d[4]:9.0f} {d[2] / 1000:8.2f} '
          f'{d[5]:11.0f} {d[6]:9.0f} {d[9]:9.0f} {d[7] / 1000:8.2f} {d[8]:8.2f} {d[10]:6.2f} '
          f'{d[11]:11.0f} {d[12]:5.0f} {d[13]:5.0f} {d[14]:5.0f}/{d[15]:<5.0f} {d[25]:10.1f}')
# Each vCPU alone: the side whose work is on the round trip's path (a one-sided test's client,
# whose server's vCPU idles or polls) shows apart from the other.
print(f'\nper iteration and vCPU: instructions, blocks, host us, data pages, atomics and fences '
      f'(with rdtsc, pause, cpuid), look-ups after returns and indirect branches and onto '
      f'another page, user | kernel, and TLB flushes')
for (kind, test, n, v) in sorted(per_vcpu):
    d = per_iteration(per_vcpu, (kind, test, n1, v), (kind, test, n, v)) if n == n2 else None
    if d is None:
        continue
    print(f'{test:10} {kind:9} vcpu {v} {d[0]:8.0f} {d[1]:7.0f} {d[2] / 1000:7.2f} {d[14]:5.0f} '
          f'{d[16]:6.1f} {d[18]:6.1f} {d[21]:6.0f} {d[22]:6.0f} | {d[5]:8.0f} {d[6]:7.0f} '
          f'{d[7] / 1000:7.2f} {d[15]:5.0f} {d[17]:6.1f} {d[19]:6.1f} {d[23]:6.0f} {d[24]:6.0f} '
          f'{d[20]:6.2f}')
# (PAGES=1) The emulator's data TLB as the plugin models it: misses and page-table walks of the
# data accesses, user and kernel, with a table of 2^8 and of 2^10 entries; walks.txt lists, at
# each mark, the pages that walked (2^10) per vCPU and mode.
if any(sum(d[26:38]) for d in got.values()):
    print(f'\nper iteration, both vCPUs: data TLB misses / walks, user and kernel, 2^8 and 2^10 '
          f'entries (PAGES=1)')
    for (kind, test, n) in got:
        d = per_iteration(got, (kind, test, n1), (kind, test, n)) if n == n2 else None
        if d is not None:
            print(f'{test:10} {kind:9} user {d[28]:7.1f} / {d[29]:5.1f} {d[30]:7.1f} / '
                  f'{d[31]:5.1f}  kernel {d[34]:7.1f} / {d[35]:5.1f} {d[36]:7.1f} / {d[37]:5.1f}')
PY
