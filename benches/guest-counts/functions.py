# Instructions per iteration by function, kernel and user (user code as one row), from a
# `BLOCKS=kernel bash benches/guest-counts.sh` run: for each kind and test, (count at N2 - count
# at N1) / (N2 - N1) per kernel function (the guest's symbols, printed into guest.log as "ksym"
# lines), on the vCPU with the most kernel instructions in the run (a one-sided test's client),
# or both with "all"; the functions whose counts differ most between the kinds first.
#
#   BLOCKS=kernel KINDS="perftest raw engine" TESTS=read_lat:8 N1=5000 N2=25000 \
#     bash benches/guest-counts.sh
#   python3 benches/guest-counts/functions.py target/guest-counts 5000 25000 [TOP] [all]
#
# A run's start and end (page faults, the 9p file system) add up to some hundreds of kernel
# instructions an iteration that N1 and N2 do not cancel: compare the scheduler's functions,
# not totals within that.
import sys, bisect, collections
out, n1, n2 = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
top = int(sys.argv[4]) if len(sys.argv) > 4 else 40
both = sys.argv[5:6] == ['all']
syms, runs = [], []
for l in open(f'{out}/guest.log'):
    f = l.split()
    if l.startswith('ksym ') and len(f) >= 4:
        syms.append((int(f[1], 16), f[3]))
    elif l.startswith('run '):
        runs.append((f[1], f[2], int(f[3])))
syms.sort()
addrs = [a for a, _ in syms]
cache = {}
def name(pc):
    if pc < 0xffff000000000000:
        return 'USER'
    if pc not in cache:
        i = bisect.bisect_right(addrs, pc) - 1
        cache[pc] = syms[i][1] if i >= 0 else '?'
    return cache[pc]
marks = sorted({int(l.split()[1]) for l in open(f'{out}/counts.txt')})
per = collections.defaultdict(collections.Counter)  # (mark, vcpu) -> fn -> insns
for l in open(f'{out}/blocks.txt'):
    f = l.split()
    per[(int(f[1]), int(f[5]))][name(int(f[3], 16))] += int(f[7]) * int(f[15])
def at(m):
    vs = {v: c for (mm, v), c in per.items() if mm == m}
    if both:
        t = collections.Counter()
        for c in vs.values(): t.update(c)
        return t
    return max(vs.values(), key=lambda c: sum(x for k, x in c.items() if k != 'USER'))
res = {key: at(marks[2 * i + 1]) for i, key in enumerate(runs)}
kinds = sorted({(k, t) for k, t, _ in runs}, key=lambda x: (x[1], x[0]))
d = {}
for k, t in kinds:
    a, b = res.get((k, t, n1)), res.get((k, t, n2))
    if a and b:
        d[(k, t)] = {fn: (b[fn] - a[fn]) / (n2 - n1) for fn in set(a) | set(b)}
for t in sorted({t for _, t in d}):
    ks = [k for k, tt in d if tt == t]
    print(f'== {t}: ' + ' '.join(ks))
    fns = set().union(*(d[(k, t)] for k in ks))
    print(f'{"TOTAL":40}' + ''.join(f'{sum(d[(k, t)].values()):10.0f}' for k in ks))
    diff = lambda fn: max(abs(d[(k, t)].get(fn, 0) - d[(ks[0], t)].get(fn, 0)) for k in ks)
    for fn in sorted(fns, key=diff, reverse=True)[:top]:
        print(f'{fn[:40]:40}' + ''.join(f'{d[(k, t)].get(fn, 0):10.1f}' for k in ks))
