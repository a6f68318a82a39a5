#!/usr/bin/env python3
"""eta_report.py — how good was the live ETA of a finished `spill run`?

Reads the plain progress lines a run printed (stdout not a terminal: one line
every 5 s, "rows A/B · pass N (..) · .. · ETA 13m · ..") and the run's
--pass-log CSV (elapsed seconds at the end of every pass), and prints, at
each tenth of the run, the ETA shown against the time that was really left.

    python3 tools/eta_report.py STDOUT.txt PASSES.csv [--every 0.1]
"""
import csv
import re
import sys


def parse_eta(s):
    m = re.fullmatch(r"([\d.]+)(s|m|h)", s)
    if not m:
        return None
    v = float(m.group(1))
    return v * {"s": 1, "m": 60, "h": 3600}[m.group(2)]


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    every = float(sys.argv[sys.argv.index("--every") + 1]) if "--every" in sys.argv else 0.1
    elapsed = {}
    with open(sys.argv[2]) as f:
        for r in csv.DictReader(f):
            elapsed[int(r["pass"])] = float(r["elapsed"])
    total = max(elapsed.values())
    points = []
    for line in open(sys.argv[1], encoding="utf-8"):
        m = re.search(r"rows ([\d,]+)/([\d,]+) · pass (\d+) .* ETA (\S+)", line)
        if not m or int(m.group(3)) not in elapsed:
            continue
        eta = parse_eta(m.group(4))
        if eta is None:
            continue
        t = elapsed[int(m.group(3))]
        points.append((t, eta, total - t, m.group(1)))
    print(f"run: {total:.0f} s over {len(elapsed)} passes")
    print("elapsed   rows      ETA shown   really left   error")
    next_mark = 0.0
    errs = []
    for t, eta, left, rows in points:
        if left > 0:
            errs.append(abs(eta - left) / left)
        if t / total + 1e-9 >= next_mark:
            err = (eta - left) / left * 100 if left > 0 else 0
            print(f"{t:7.0f} s  {rows:>7}  {eta:8.0f} s  {left:10.0f} s  {err:+6.0f}%")
            next_mark += every
    if errs:
        inside = sum(e <= 0.25 for e in errs)
        print(f"{inside} of {len(errs)} progress lines within 25% of the time really left")


if __name__ == "__main__":
    main()
