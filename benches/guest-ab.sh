#!/usr/bin/env bash
# Alternating rounds of perftest-side-by-side.sh for several variants of corelink in one boot
# of the Soft-RoCE guest, and each variant's medians: the way to compare two builds or two
# option sets there, where one run's latency moves by 10-30 % from round to round (host
# noise), and only medians of alternating runs in one boot say anything. Run it in the guest:
#
#   cargo build --release -p corelink-apps --bin corelink-perf
#   tests/rxe-guest/run --timeout 2400 -- bash benches/guest-ab.sh
#
# VARIANTS: variants separated by ';', each NAME|BINARY|CLIENT ARGS|SERVER ARGS|raw|MAP KEYS|ENV
# (the last five may be empty; "raw" runs `baseline raw_TEST`, corelink's verbs loop without
# the engine; MAP KEYS, e.g. "cq_depth=128,send_queue_depth=32", are [worker] keys both sides'
# core maps get, as guest-core-map.sh's WORKER_KEYS; ENV, space-separated NAME=VALUE settings
# for perftest-side-by-side.sh, e.g. "TARGET_PARK_US=0" or "RAW_PLACED=1").
# Default: the engine (its ping-pongs signalling one send in 100, as perftest's: see
# perftest-side-by-side.sh), the engine signalling each send (LAT_SIGNAL_EACH=1), and the raw
# loop, all from target/release/corelink-perf. ROUNDS (5), TESTS ("send_lat:8 write_lat:8")
# and ITERS (5000) as perftest-side-by-side.sh's; even rounds run corelink before perftest
# (CORELINK_FIRST).
# Prints every round's table, then per variant and test the medians of corelink's figure, of
# perftest's beside it, and of their ratios. A test that a variant's options refuse (`--quiet`
# is for send_lat and write_lat) reports nothing for it and is left out of its medians.
set -u
: "${CORELINK_IBV_DEVICE:?run this inside tests/rxe-guest/run}"
here=$(dirname "${BASH_SOURCE[0]}")
perf=${CARGO_TARGET_DIR:-target}/release/corelink-perf
variants=${VARIANTS:-"engine|$perf|||;each|$perf|||||LAT_SIGNAL_EACH=1;raw|$perf|||raw"}
export ITERS=${ITERS:-5000} TESTS=${TESTS:-send_lat:8 write_lat:8}
log=$(mktemp)
IFS=';' read -r -a specs <<< "$variants"
for r in $(seq "${ROUNDS:-5}"); do
  for spec in "${specs[@]}"; do
    IFS='|' read -r name bin cargs sargs raw keys env <<< "$spec"
    name=$(echo "$name" | tr -d ' ')
    echo "== round $r $name" | tee -a "$log"
    first=; [ $((r % 2)) = 0 ] && first=1
    # shellcheck disable=SC2086 # (ENV: NAME=VALUE words)
    env ${env:-} CORELINK_FIRST="$first" CORELINK_PERF="$bin" CORELINK_ARGS="$cargs" \
      SERVER_ARGS="$sargs" RAW="${raw:+1}" WORKER_KEYS="$keys" \
      bash "$here/perftest-side-by-side.sh" | tee -a "$log"
  done
done
python3 - "$log" <<'PY'
import collections, re, statistics, sys
name = None
got = collections.defaultdict(list)  # (variant, test) -> [(perftest, corelink, ratio)]
for line in open(sys.argv[1]):
    m = re.match(r'== round \d+ (\S+)', line)
    if m:
        name = m.group(1)
        continue
    f = line.split()
    if name and len(f) >= 5 and re.match(r'\w+_(lat|bw)(_min)?$', f[0]):
        try:
            p, c, ratio = float(f[2]), float(f[3]), float(f[4])
        except ValueError:
            continue
        # (a run that reported nothing, or no finite figure, is left out)
        if 0 < p < float('inf') and 0 < c < float('inf') and ratio > 0:
            got[(name, f[0])].append((p, c, ratio))
print(f'\n{"variant":12} {"test":10} {"runs":>4} {"perftest":>9} {"corelink":>9} {"ratio":>7}  (medians)')
for (name, test), rows in sorted(got.items(), key=lambda kv: (kv[0][1], kv[0][0])):
    med = [statistics.median(x) for x in zip(*rows)]
    print(f'{name:12} {test:10} {len(rows):4} {med[0]:9.2f} {med[1]:9.2f} {med[2]:7.3f}')
PY
rm -f "$log"
