# Instructions and look-ups per iteration by function, from a `BLOCKS=kernel` or `BLOCKS=1` run
# of guest-counts.sh: for each kind and test, (count at N2 - count at N1) / (N2 - N1) per
# function, on the vCPU with the most kernel instructions in the run (a one-sided test's
# client), or both with "all"; the functions whose counts differ most between the kinds first.
# Kernel functions are named from the guest's symbols ("ksym" lines in guest.log, BLOCKS=kernel),
# user ones, with "user", from the processes' layout ("umap" lines, ASLR off in the guest) and
# the host's symbol tables (the guest runs the host's files); otherwise user code is one row.
# "blocks" counts a function's distinct blocks (each once per stretch between two entries into
# the kernel: what a round trip's path runs through, whose translated code the kernel's work in
# between has pushed out of the host's caches), "look" the moves into its blocks that made the
# emulator look the block up (after a return or an indirect branch), "xpage" those by a direct
# jump from another page.
#
#   BLOCKS=kernel KINDS="perftest raw engine" TESTS=read_lat:8 N1=5000 N2=25000 \
#     bash benches/guest-counts.sh
#   python3 benches/guest-counts/functions.py target/guest-counts 5000 25000 [TOP] [all|vcpu=N] [user]
#
# A run's start and end (page faults, the 9p file system) add up to some hundreds of kernel
# instructions an iteration that N1 and N2 do not cancel: compare the scheduler's functions,
# not totals within that.
import sys, bisect, collections, re, subprocess
out, n1, n2 = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
top = int(sys.argv[4]) if len(sys.argv) > 4 and sys.argv[4].isdigit() else 40
both, user = 'all' in sys.argv[4:], 'user' in sys.argv[4:]
vcpu = next((int(a[5:]) for a in sys.argv[4:] if a.startswith('vcpu=')), None)
ksyms, runs, maps = [], [], []
for l in open(f'{out}/guest.log'):
    f = l.split()
    if l.startswith('ksym ') and len(f) >= 4:
        ksyms.append((int(f[1], 16), f[3]))
    elif l.startswith('umap ') and len(f) >= 7:
        lo, hi = (int(x, 16) for x in f[1].split('-'))
        maps.append((lo, hi, int(f[3], 16), f[6]))
    elif l.startswith('run '):
        runs.append((f[1], f[2], int(f[3])))

def short(s):
    """A Rust symbol without its generic arguments and crate paths: `Worker::dispatch`."""
    s = re.sub(r'::h[0-9a-f]{16}$', '', s)
    while True:
        t = re.sub(r'<[^<>]*>', '', s)
        if t == s:
            break
        s = t
    parts = [p for p in s.split('::') if p]
    return '::'.join(parts[-2:]) if parts else s

def table(syms):
    """(sorted addresses, names) of a list of (address, name)."""
    syms.sort()
    return [a for a, _ in syms], [n for _, n in syms]

def lookup(tab, pc):
    i = bisect.bisect_right(tab[0], pc) - 1
    return tab[1][i] if i >= 0 else '?'

kernel = table(ksyms)
# User code, with "user": each mapped file's symbols at its load base (its mapping at offset 0)
# plus their values; a pc is named within the file mapped there (a stripped library's code by
# the library alone).
files, spans = {}, []
if user:
    bases = {}
    for lo, hi, off, path in maps:
        if off == 0:
            bases.setdefault(path, lo)
        spans.append((lo, hi, path))
    spans.sort()
    for path, base in bases.items():
        got = []
        for flags in (['--defined-only'], ['-D', '--defined-only']):
            nm = subprocess.run(['nm', '-C', *flags, path], capture_output=True, text=True).stdout
            got = [(base + int(a, 16), short(n)) for a, t, n in
                   (x.split(' ', 2) for x in nm.splitlines() if x.count(' ') >= 2)
                   if t in 'tTwWiI' and a.strip('0')]
            if got:
                break
        files[path] = table(got)
cache = {}
def name(pc):
    if pc not in cache:
        if pc >= 0xffff000000000000:
            cache[pc] = lookup(kernel, pc) if ksyms else 'KERNEL'
        elif not user:
            cache[pc] = 'USER'
        else:
            j = bisect.bisect_right(spans, (pc, float('inf'), '')) - 1
            path = spans[j][2] if j >= 0 and spans[j][0] <= pc < spans[j][1] else '?'
            fn = lookup(files[path], pc) if path in files else '?'
            lib = path.rsplit('/', 1)[-1].split('.so')[0].split('-rdmav')[0]
            cache[pc] = fn if lib == 'corelink-perf' else f'{lib}:{fn}'
    return cache[pc]
marks = sorted({int(l.split()[1]) for l in open(f'{out}/counts.txt')})
# (mark, vcpu) -> metric -> fn -> count; metrics: instructions, look-ups, cross-page moves,
# distinct blocks
M = 4
per = collections.defaultdict(lambda: [collections.Counter() for _ in range(M)])
for l in open(f'{out}/blocks.txt'):
    f = l.split()
    c, fn = per[(int(f[1]), int(f[5]))], name(int(f[3], 16))
    c[0][fn] += int(f[7]) * int(f[15])
    c[3][fn] += int(f[9])
    if len(f) > 18:
        c[1][fn] += int(f[17])
        c[2][fn] += int(f[18])
def at(m):
    vs = {v: c for (mm, v), c in per.items() if mm == m}
    if both:
        t = [collections.Counter() for _ in range(M)]
        for c in vs.values():
            for a, b in zip(t, c):
                a.update(b)
        return t
    if vcpu is not None:
        return vs.get(vcpu, [collections.Counter() for _ in range(M)])
    return max(vs.values(), key=lambda c: sum(x for k, x in c[0].items() if k != 'USER'))
res = {key: at(marks[2 * i + 1]) for i, key in enumerate(runs)}
kinds = sorted({(k, t) for k, t, _ in runs}, key=lambda x: (x[1], x[0]))
d = {}
for k, t in kinds:
    a, b = res.get((k, t, n1)), res.get((k, t, n2))
    if a and b:
        d[(k, t)] = [{fn: (y[fn] - x[fn]) / (n2 - n1) for fn in set(x) | set(y)}
                     for x, y in zip(a, b)]
for t in sorted({t for _, t in d}):
    ks = [k for k, tt in d if tt == t]
    print(f'== {t}: ' + ' '.join(f'{k} (insns blocks look xpage)' for k in ks))
    fns = set().union(*(d[(k, t)][0] for k in ks))
    cols = ((0, 9, 0), (3, 7, 1), (1, 6, 1), (2, 6, 1))
    row = lambda k, fn: ''.join(f'{d[(k, t)][m].get(fn, 0):{w}.{p}f}' for m, w, p in cols)
    print(f'{"TOTAL":48}' + '  '.join(''.join(f'{sum(d[(k, t)][m].values()):{w}.{p}f}'
          for m, w, p in cols) for k in ks))
    # (a block or a look-up weighs as 20 instructions; one kind alone: by its own counts)
    base = (lambda m, fn: d[(ks[0], t)][m].get(fn, 0)) if len(ks) > 1 else (lambda m, fn: 0)
    diff = lambda fn: max(sum(abs(d[(k, t)][m].get(fn, 0) - base(m, fn)) *
                              (1 if m == 0 else 20) for m in range(M)) for k in ks)
    for fn in sorted(fns, key=diff, reverse=True)[:top]:
        print(f'{fn[:48]:48}' + '  '.join(row(k, fn) for k in ks))
