#!/usr/bin/env python3
"""Summarises tools/device_moe.sh's output directory: for each shape and batch, the full-batch decode passes'
median time against the layer bytes streamed per pass / 55 GB/s (docs/performance.md's pinned host->GPU limit),
tok/s, and, from the engine's expert visit counts, the bytes a pass would read if it read only the experts its
rows chose against whole layers.

    python3 tools/moe_report.py DIR
"""
import csv
import glob
import os
import re
import statistics
import sys

LINK = 55e9


def layer_bytes(show):
    """Per-layer byte ranges from `spill models show`: blk.N file F: begin-end."""
    total, layers = 0, 0
    for line in open(show):
        m = re.match(r"\s*blk\.(\d+)\s+file \d+: (\d+)-(\d+)", line)
        if m:
            total += int(m.group(3)) - int(m.group(2))
            layers += 1
    return total, layers


def experts_line(log):
    for line in open(log, errors="replace"):
        m = re.search(r"experts: (\d+) \(layer, expert\) visits ran, (\d+) skipped", line)
        if m:
            return int(m.group(1)), int(m.group(2))
    return None


def main(d):
    shapes = sorted({os.path.basename(p).split("-show")[0] for p in glob.glob(os.path.join(d, "*-show.txt"))})
    for sh in shapes:
        total, L = layer_bytes(os.path.join(d, sh + "-show.txt"))
        expert_share = None
        m = re.search(r"experts\s+(\d+) of F=\d+, (\d+) per token", open(os.path.join(d, sh + "-show.txt")).read())
        E, k = (int(m.group(1)), int(m.group(2))) if m else (0, 0)
        print(f"{sh}: {L} layers, {total / 1e9:.2f} GB streamed per pass, limit {total / LINK * 1e3:.0f} ms at 55 GB/s;"
              f" {E} experts, {k} per token")
        print(f"{'rows':>6} {'passes':>6} {'pass_ms':>9} {'limit_ms':>9} {'link%':>6} {'tok/s':>9}  expert visits")
        for p in sorted(glob.glob(os.path.join(d, sh + "-*-passes.csv")),
                        key=lambda p: int(p.rsplit("-", 2)[-2])):
            n = int(p.rsplit("-", 2)[-2])
            rows = list(csv.DictReader(open(p)))
            full = [r for r in rows if int(r["prefill_tokens"]) == 0 and int(r["seqs"]) == n]
            dec = full or [r for r in rows if int(r["prefill_tokens"]) == 0]
            if not dec:
                print(f"{n:>6} no decode passes")
                continue
            t = statistics.median(float(r["seconds"]) for r in dec)
            toks = statistics.median(int(r["decode_tokens"]) for r in dec)
            ex = experts_line(os.path.join(d, f"{sh}-{n}.log"))
            visits = ""
            if ex and E:
                ran, skipped = ex
                share = ran / (ran + skipped)
                visits = f"{ran} ran, {skipped} skipped: {share * 100:.1f}% of expert bytes needed"
            print(f"{n:>6} {len(dec):>6} {t * 1e3:>9.1f} {total / LINK * 1e3:>9.1f} {total / LINK / t * 100:>5.0f}%"
                  f" {toks / t:>9.0f}  {visits}")
        print()


if __name__ == "__main__":
    main(sys.argv[1])
