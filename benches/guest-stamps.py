"""Splits a send_lat run's round trips from both sides' stamps (benches/guest-stamps.sh).

guest-stamps.py CLIENT_DIR SERVER_DIR CLIENT_LOG: each directory holds its process's
<pid>.bin (pairs of little-endian u64: time-stamp counter, point; verbs/src/stamps.rs), the log
the client's JSON line (its t_typical_us gives the counter's rate). Prints medians in us over
the run's last 90 % of round trips.
"""
import json, os, statistics, struct, sys

DB_IN, DB_OUT, RECV, SEND, EMPTY = 1, 2, 3, 4, 5


def load(d):
    out = []
    for f in os.listdir(d):
        if f.endswith('.bin'):
            b = open(os.path.join(d, f), 'rb').read()
            out += [struct.unpack_from('<QQ', b, i) for i in range(0, len(b), 16)]
    return out


cli, srv = load(sys.argv[1]), load(sys.argv[2])
typical = None
for line in open(sys.argv[3]):
    if line.startswith('{'):
        typical = json.loads(line).get('t_typical_us')
if not cli or not srv or not typical:
    sys.exit(f'no stamps or no result ({len(cli)} client, {len(srv)} server stamps)')
events = sorted([(t, 'c', p) for t, p in cli] + [(t, 's', p) for t, p in srv])
seg = {k: [] for k in ('round trip', 'c tail', 's tail', 'c->s', 's->c', 'c doorbell',
                       's doorbell', 'c after', 's after', 'c to send', 's to send', 'c late', 's late', 'c idle loop',
                       's idle loop', 'c finding', 's finding')}
last = {}  # (side, point) -> counter
after_db = {'c': None, 's': None}   # the last doorbell's end, while no empty poll followed it
idle_since = {'c': None, 's': None}  # the last empty poll, if nothing else came since
last_empty = {'c': None, 's': None}
for t, side, p in events:
    peer = 's' if side == 'c' else 'c'
    if p == DB_IN and last.get((side, RECV), -1) > last.get((side, DB_IN), t):
        seg[side + ' tail'].append(t - last[side, RECV])
        if side == 'c':
            seg['round trip'].append(t - last[side, DB_IN])
    if p == DB_OUT and (side, DB_IN) in last:
        seg[side + ' doorbell'].append(t - last[side, DB_IN])
        after_db[side] = t
    if p == EMPTY:
        if after_db[side] is not None:
            seg[side + ' after'].append(t - after_db[side])
            after_db[side] = None
        if idle_since[side] is not None:
            seg[side + ' idle loop'].append(t - idle_since[side])
        idle_since[side] = last_empty[side] = t
    else:
        idle_since[side] = None
    if p == SEND and after_db[side] is not None:
        # (the part of the work after the doorbell until its send's completion was polled)
        seg[side + ' to send'].append(t - after_db[side])
    if p == RECV:
        if (peer, DB_IN) in last:
            seg[('s->c' if side == 'c' else 'c->s')].append(t - last[peer, DB_IN])
        if last_empty[side] is not None:
            seg[side + ' finding'].append(t - last_empty[side])
        # late: the message was found before the loop came back to an empty poll
        seg[side + ' late'].append(1 if after_db[side] is not None else 0)
    last[side, p] = t
per_us = statistics.median(seg['round trip'][len(seg['round trip']) // 10:]) / typical
print(f't_typical {typical:.3f} us ({per_us:.0f} counter ticks an us)')
for k, v in seg.items():
    v = v[len(v) // 10:]
    if not v:
        continue
    if k.endswith('late'):
        print(f'  {k:12s} {sum(v) / len(v):8.3f} of the messages found before the loop was idle')
    else:
        print(f'  {k:12s} {statistics.median(v) / per_us:8.3f} us  (n={len(v)})')
