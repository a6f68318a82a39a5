#!/usr/bin/env python3
"""Reference embeddings of the tiny fixture model for tests/test_embed.c, computed independently of spill: the
numpy fp32 forward of tools/gen_fp32_ref.py (weights dequantized by the `gguf` package) stopped at the output norm,
then pooled here — the last token's state and the mean over every token, each L2-normalised (in float64) — for a
few token-id inputs (one longer than the CPU's 256-token prefill chunk, so spill computes it over several passes).

    .venv/bin/python tools/gen_embed_ref.py [MODEL.gguf [OUT.json]]

Writes OUT.json (default tests/data/embed/tiny_ref.json, the fixture, for the default model):
    {"format": "spill-embed-ref", "version": 1, "model": …, "inputs": [[ids]…],
     "last": [[D floats]…], "mean": [[D floats]…]}
"""
import json
import os
import sys

import numpy as np

MODEL = sys.argv[1] if len(sys.argv) > 1 else "tests/data/tiny/tiny-smollm2.gguf"
OUT = sys.argv[2] if len(sys.argv) > 2 else "tests/data/embed/tiny_ref.json"
sys.argv = [sys.argv[0], MODEL]  # gen_fp32_ref reads its model from argv when imported
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_fp32_ref as ref  # noqa: E402


def unit(v):
    v = v.astype(np.float64)
    return v / np.sqrt((v * v).sum())


def main():
    rng = np.random.default_rng(16)
    V = ref.emb.shape[0]
    lengths = [1, 7, 33, 300]
    inputs = [[int(t) for t in rng.integers(3, V, n)] for n in lengths]
    last, mean = [], []
    for ids in inputs:
        h = ref.hidden(ids, [(None, None)] * ref.L, 0).astype(np.float64)
        last.append([round(float(x), 8) for x in unit(h[-1])])
        mean.append([round(float(x), 8) for x in unit(h.mean(0))])
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    json.dump({"format": "spill-embed-ref", "version": 1, "model": MODEL, "inputs": inputs, "last": last,
               "mean": mean}, open(OUT, "w"), separators=(",", ":"))
    print(OUT, [len(i) for i in inputs])


if __name__ == "__main__":
    main()
