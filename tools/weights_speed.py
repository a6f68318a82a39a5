#!/usr/bin/env python3
"""weights_speed.py — issue 18's pass figures as one file, bench/results/weights-speed.json.

  python3 tools/weights_speed.py record DIR/weights-speed.jsonl --passes P.csv --log RUN.log --weights q4 \
          --layers 16 --commit C --machine M [--note TEXT]
      appends one record computed from a `spill run --pass-log` CSV and the run's log: rows = the largest pass,
      s_per_pass = the median of the passes with every row in flight and no prompt tokens, link_s = the streamed
      bytes the pre-run line gives ("weights: X GB streamed per pass") / 55e9 (the H200's measured pinned
      host->GPU rate), ratio = s_per_pass / link_s, tok_s = rows / s_per_pass.
  python3 tools/weights_speed.py merge
      gathers every bench/results/**/weights-speed.jsonl (device_fp8.sh writes them too) into
      bench/results/weights-speed.json, a list sorted by weights, rows, layers, each record with its source file.
"""
import argparse, csv, glob, json, os, re, statistics, sys

LINK = 55e9


def record(a):
    P = list(csv.DictReader(open(a.passes)))
    gb = re.search(r"weights: ([0-9.]+) GB streamed per pass", open(a.log).read())
    if not P or not gb:
        sys.exit(f"{a.passes}: no passes, or {a.log} has no 'GB streamed per pass'")
    rows = max(int(p["seqs"]) for p in P)
    full = [float(p["seconds"]) for p in P if int(p["seqs"]) == rows and int(p["prefill_tokens"]) == 0]
    if not full:
        sys.exit(f"{a.passes}: no pass with all {rows} rows and no prompt tokens")
    t, link = statistics.median(full), float(gb.group(1)) * 1e9 / LINK
    r = {"weights": a.weights, "rows": rows, "layers": a.layers, "s_per_pass": round(t, 4), "link_s": round(link, 4),
         "ratio": round(t / link, 3), "tok_s": round(rows / t, 1), "commit": a.commit, "machine": a.machine,
         "passes": len(full)}
    if a.note:
        r["note"] = a.note
    with open(a.out, "a") as f:
        f.write(json.dumps(r) + "\n")
    print(json.dumps(r))


def merge(_):
    root = os.path.join(os.path.dirname(__file__), "..", "bench", "results")
    recs = []
    for path in sorted(glob.glob(os.path.join(root, "**", "weights-speed.jsonl"), recursive=True)):
        for line in open(path):
            if line.strip():
                r = json.loads(line)
                r["source"] = os.path.relpath(path, root)
                recs.append(r)
    recs.sort(key=lambda r: (r["weights"], r["rows"], r["layers"], r["source"]))
    with open(os.path.join(root, "weights-speed.json"), "w") as f:
        json.dump(recs, f, indent=1)
        f.write("\n")
    print(f"{len(recs)} records -> bench/results/weights-speed.json")


ap = argparse.ArgumentParser()
sub = ap.add_subparsers(dest="cmd", required=True)
r = sub.add_parser("record")
r.add_argument("out")
for k in ("passes", "log", "weights", "commit", "machine"):
    r.add_argument("--" + k, required=True)
r.add_argument("--layers", type=int, required=True)
r.add_argument("--note")
sub.add_parser("merge")
a = ap.parse_args()
record(a) if a.cmd == "record" else merge(a)
