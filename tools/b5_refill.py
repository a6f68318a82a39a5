#!/usr/bin/env python3
"""Benchmark B5 on the GPU machine: long prompts with refill.  Runs spill on an
8B-shaped bf16 checkpoint streamed from pinned RAM (every layer each pass: --resident-layers 0),
rows with 1,000-token prompts and 128 new tokens (EOS banned with logit_bias),
batch B with newcomers' prefill mixed into decode passes, and reads the
per-pass log: clean decode passes vs passes carrying prefill, rows/hour.

    python3 tools/b5_refill.py MODEL_DIR OUTDIR SPILL_BIN [--rows 512] [--batch 256] [--chunk 4096]
"""
import json
import os
import re
import statistics
import subprocess
import sys

model_dir, outdir, spill = sys.argv[1], sys.argv[2], sys.argv[3]
arg = lambda k, d: int(sys.argv[sys.argv.index(k) + 1]) if k in sys.argv else d
rows, batch, chunk = arg("--rows", 512), arg("--batch", 256), arg("--chunk", 4096)
os.makedirs(outdir, exist_ok=True)
work = "/tmp/b5work"
os.makedirs(work, exist_ok=True)
inp = os.path.join(work, "b5.jsonl")
x = 12345
with open(inp, "w") as f:
    for i in range(rows):
        ids = []
        for _ in range(1000):
            x = (x * 1103515245 + 12345) % 2**31
            ids.append(3 + x % 49000)
        f.write(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/completions",
                            "body": {"model": "b5", "prompt": ids, "max_tokens": 128, "temperature": 0,
                                     "logit_bias": {"2": -100}}}) + "\n")
log = os.path.join(outdir, "b5_passes.csv")
p = subprocess.run([spill, "run", model_dir, inp, "-o", os.path.join(work, "job"), "--gpu", "--stream", "--batch",
                    str(batch), "--prefill-chunk", str(chunk), "--kv-mem", "62G", "--resident-layers", "0", "--pass-log",
                    log], capture_output=True, text=True, env=dict(os.environ, SPILL_CUDA_PROF="1"))
out = p.stdout + p.stderr
open(os.path.join(outdir, "b5_run.log"), "w").write(out)
passes = [l.split(",") for l in open(log).read().splitlines()[1:]] if os.path.exists(log) else []
clean = [float(r[4]) for r in passes if int(r[3]) == 0 and int(r[2]) > 0]
refill = [float(r[4]) for r in passes if int(r[3]) > 0 and int(r[2]) > 0]
m = re.search(r"([0-9]+) tokens generated in ([0-9.]+) s", out)
res = {"rows": rows, "batch": batch, "prefill_chunk": chunk, "prompt": 1000, "new_tokens": 128, "rc": p.returncode,
       "passes": len(passes), "clean_decode_passes": len(clean), "refill_passes": len(refill),
       "clean_pass_median_s": statistics.median(clean) if clean else None,
       "refill_pass_median_s": statistics.median(refill) if refill else None,
       "log_tail": out[-1000:]}
if clean and refill:
    res["refill_over_clean"] = res["refill_pass_median_s"] / res["clean_pass_median_s"]
if m:
    res["run_s"] = float(m.group(2))
    res["decode_tok_s"] = int(m.group(1)) / float(m.group(2))
    res["rows_per_hour"] = rows / float(m.group(2)) * 3600
json.dump(res, open(os.path.join(outdir, "b5.json"), "w"), indent=1)
print(json.dumps(res, indent=1))
