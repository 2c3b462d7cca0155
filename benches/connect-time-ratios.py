#!/usr/bin/env python3
"""Issue 14's connect-time ratios from the output of rounds of benches/connect-time.sh run in
one boot, each round headed by a line "#### round N":

  tests/rxe-guest/run --timeout 1600 -- bash -c \\
    'for i in 1 2 3 4 5 6 7 8; do echo "#### round $i"; bash benches/connect-time.sh; done' > ct.txt
  python3 benches/connect-time-ratios.py ct.txt

Per round and as medians over the rounds:
  cold  the engine's first connect / cmtime -c 1's steps to connected (create id, address,
        route, QP, connect: the steps the engine's first connect takes too);
  warm  connect_time's median of the warm pairs' ratios (engine / verbs Context::connect);
  x100  the engine's 100 connects at once (warm median) / cmtime -c 100's connect step.
"""
import re
import statistics
import sys

STEPS = ["create id", "resolve addr", "resolve route", "create qp", "connect"]


def step(block, name):
    m = re.search(r"^" + re.escape(name) + r"\s*:\s*([\d.]+)", block, re.M)
    if not m:
        raise SystemExit(f"no '{name}' step in a cmtime table")
    return float(m.group(1))


def number(pattern, text):
    m = re.search(pattern, text, re.M)
    if not m:
        raise SystemExit(f"no match for {pattern!r}")
    return float(m.group(1))


def main(path):
    text = open(path).read()
    rounds = text.split("#### round ")[1:]
    if not rounds:
        raise SystemExit(f"{path}: no '#### round N' headers")
    rows = []
    for r in rounds:
        n = r.split("\n")[0].strip()
        one = r.split("== cmtime, 1 connection")[1].split("== cmtime, 100")[0]
        hundred = r.split("== cmtime, 100 connections")[1].split("== connect_time")[0]
        steps = sum(step(one, s) for s in STEPS)
        cold = number(r"^engine\s+cold\s+([\d.]+)", r)
        warm = number(r"median of the pairs. ratios ([\d.]+)", r)
        vx = number(r"^verbs x100\s+cold\s+[\d.]+ ms\s+warm \(median of \d+\)\s+([\d.]+)", r)
        ex = number(r"^engine x100\s+cold\s+[\d.]+ ms\s+warm \(median of \d+\)\s+([\d.]+)", r)
        c100 = step(hundred, "connect")
        rows.append((n, step(one, "connect"), steps, cold, cold / steps, warm, c100, vx, ex, ex / c100))
    head = ("round", "cm1 conn", "cm1 steps", "eng cold", "cold", "warm", "cm100 conn",
            "verbs x100", "eng x100", "x100")
    print(("{:>6} " + "{:>10} " * 9).format(*head))
    for row in rows:
        print(("{:>6} " + "{:>10.2f} " * 9).format(*row))
    med = lambda i: statistics.median(r[i] for r in rows)
    print(f"medians over {len(rows)} rounds: cold {med(4):.2f} (target at most 1.0), "
          f"warm {med(5):.2f} (at most 1.2), x100 {med(9):.2f} (at most 1.2)")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: connect-time-ratios.py OUTPUT")
    main(sys.argv[1])
