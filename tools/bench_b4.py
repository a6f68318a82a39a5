#!/usr/bin/env python3
"""Benchmark B4 (CPU): SmolLM2-135M-Instruct Q4_1 on this machine's cores, spill
vs llama.cpp (llama-cpp-python, built from source) in the same run.

  make bench && python3 tools/bench_b4.py [--tokens 64] [--batches 1,8,64,256]

llama.cpp: single-sequence greedy decode (EOS ignored) after a 32-token prompt,
timed over the decode steps only.  spill: build/bench/bench_decode (same prompt
length, same number of steps) at each batch size.  Writes
bench/results/b4_cpu.{csv,json,svg} with the machine description.

This 2-core VM's speed drifts by up to 25% between runs a minute apart (both engines move together), so the
single-row comparison is made --reps times (default 5), llama.cpp and spill alternating, and the median ratio
and the medians are reported beside every pair; the batched sweep runs once after them.
"""
import argparse
import json
import os
import platform
import subprocess
import time

import numpy as np

MODEL = os.path.expanduser(os.environ.get("SPILL_HOME", "~/.streamweights")) + \
    "/models/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf"


def cpu_name():
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def llama_cpp_decode(n_prompt, n_tok, threads):
    from llama_cpp import Llama
    llm = Llama(model_path=MODEL, n_ctx=512, n_threads=threads, n_batch=512, verbose=False)
    prompt = [100 + (i * 7919) % (49152 - 200) for i in range(n_prompt)]
    llm.eval(prompt)
    eos = llm.token_eos()
    t0 = time.perf_counter()
    for _ in range(n_tok):
        logits = np.array(llm.scores[llm.n_tokens - 1])
        logits[eos] = -np.inf
        llm.eval([int(logits.argmax())])
    dt = time.perf_counter() - t0
    return {"engine": "llama.cpp", "version": __import__("llama_cpp").__version__, "batch": 1,
            "decode_tok_s": n_tok / dt, "pass_ms": dt / n_tok * 1e3}


def svg(rows, ref, path):
    w, h, pad = 640, 320, 50
    top = max(r["decode_tok_s"] for r in rows + [ref]) * 1.1
    bars = [("llama.cpp b1", ref["decode_tok_s"])] + [(f"spill b{r['batch']}", r["decode_tok_s"]) for r in rows]
    bw = (w - 2 * pad) / len(bars)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">',
           f'<text x="{w/2}" y="16" text-anchor="middle" font-size="13">B4: SmolLM2-135M Q4_1 decode tok/s, {os.cpu_count()} cores</text>']
    for i, (name, v) in enumerate(bars):
        bh = (h - 2 * pad) * v / top
        x = pad + i * bw + 6
        color = "#888" if i == 0 else "#2b6cb0"
        out.append(f'<rect x="{x:.1f}" y="{h-pad-bh:.1f}" width="{bw-12:.1f}" height="{bh:.1f}" fill="{color}"/>')
        out.append(f'<text x="{x+(bw-12)/2:.1f}" y="{h-pad-bh-4:.1f}" text-anchor="middle">{v:.0f}</text>')
        out.append(f'<text x="{x+(bw-12)/2:.1f}" y="{h-pad+14:.1f}" text-anchor="middle">{name}</text>')
    out.append(f'<line x1="{pad}" y1="{h-pad}" x2="{w-pad}" y2="{h-pad}" stroke="black"/></svg>')
    open(path, "w").write("\n".join(out))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--batches", default="1,8,64,256")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    pairs = []
    for rep in range(a.reps):  # single-row decode, the two engines alternating
        lc = llama_cpp_decode(a.prompt, a.tokens, a.threads)
        cmd = ["build/bench/bench_decode", MODEL, "--batch", "1", "--tokens", str(a.tokens), "--prompt",
               str(a.prompt), "--threads", str(a.threads)]
        sp = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.splitlines()[0])
        pairs.append({"llama_cpp": lc["decode_tok_s"], "spill": sp["decode_tok_s"],
                      "ratio": sp["decode_tok_s"] / lc["decode_tok_s"]})
        print(json.dumps(pairs[-1]), flush=True)
    med = lambda k: float(np.median([p[k] for p in pairs]))
    ref = llama_cpp_decode(a.prompt, a.tokens, a.threads)
    ref["decode_tok_s_median_of_reps"] = med("llama_cpp")
    print(json.dumps(ref), flush=True)
    rows = []
    for exact in (False, True):
        cmd = ["build/bench/bench_decode", MODEL, "--batch", a.batches, "--tokens", str(a.tokens), "--prompt",
               str(a.prompt), "--threads", str(a.threads)] + (["--exact"] if exact else [])
        for line in subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.splitlines():
            r = json.loads(line)
            r["engine"] = "spill"
            rows.append(r)
            print(line, flush=True)
    os.makedirs("bench/results", exist_ok=True)
    machine = {"cpu": cpu_name(), "cores": os.cpu_count(), "kernel": platform.release(),
               "load_avg_at_start": os.getloadavg()}
    single = next(r for r in rows if r["batch"] == 1 and r["q8_activations"])
    best = max(r["decode_tok_s"] for r in rows)
    summary = {"machine": machine, "llama_cpp": ref, "spill": rows, "single_row_pairs": pairs,
               "single_vs_llama_cpp_median": med("ratio"), "single_spill_median": med("spill"),
               "single_llama_cpp_median": med("llama_cpp"),
               "single_vs_llama_cpp": single["decode_tok_s"] / ref["decode_tok_s"],
               "best_batched_vs_llama_cpp_single": best / ref["decode_tok_s"],
               "targets": {"single": 0.8, "batched": 5.0}}
    json.dump(summary, open("bench/results/b4_cpu.json", "w"), indent=1)
    with open("bench/results/b4_cpu.csv", "w") as f:
        f.write("engine,batch,q8_activations,decode_tok_s,pass_ms\n")
        f.write(f"llama.cpp,1,true,{ref['decode_tok_s']:.2f},{ref['pass_ms']:.3f}\n")
        for r in rows:
            f.write(f"spill,{r['batch']},{str(r['q8_activations']).lower()},{r['decode_tok_s']:.2f},{r['pass_ms']:.3f}\n")
    svg([r for r in rows if r["q8_activations"]], ref, "bench/results/b4_cpu.svg")
    print(json.dumps({k: summary[k] for k in ("single_vs_llama_cpp_median", "single_spill_median",
                                              "single_llama_cpp_median", "single_vs_llama_cpp",
                                              "best_batched_vs_llama_cpp_single")}))


if __name__ == "__main__":
    main()
