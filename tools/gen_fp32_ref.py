#!/usr/bin/env python3
"""An independent fp32 forward of the default model in numpy (weights
dequantized by the `gguf` package), added to tests/data/llamacpp/smollm2.json
as "fp32": per prompt, the log-prob of every forced next token and the greedy
generation (to EOS or 128 tokens).  llama.cpp is a peer with its own
approximations (f16 KV cache, 8-bit activations); this is the exact reference
spill's fp32 path is held to.

    python3 tools/gen_fp32_ref.py [MODEL.gguf]
"""
import json
import os
import sys

import gguf
import numpy as np

MODEL = sys.argv[1] if len(sys.argv) > 1 else os.path.expanduser(
    "~/.streamweights/models/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf")
FX = "tests/data/llamacpp/smollm2.json"
r = gguf.GGUFReader(MODEL)
T = {t.name: t for t in r.tensors}
f = lambda k: r.fields[k].parts[r.fields[k].data[0]][0]
D, L, H, K = int(f("llama.embedding_length")), int(f("llama.block_count")), int(f("llama.attention.head_count")), \
    int(f("llama.attention.head_count_kv"))
S, THETA, EPS = D // H, float(f("llama.rope.freq_base")), float(f("llama.attention.layer_norm_rms_epsilon"))
EOS = int(f("tokenizer.ggml.eos_token_id"))


def W(name):
    t = T[name]
    a = gguf.quants.dequantize(t.data, t.tensor_type)
    return a.reshape([int(x) for x in reversed(t.shape)]).astype(np.float32) if len(t.shape) > 1 else a.astype(
        np.float32)


emb = W("token_embd.weight")
LW = [{k: W(f"blk.{l}.{k}.weight") for k in ["attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm",
                                                "ffn_gate", "ffn_up", "ffn_down"]} for l in range(L)]
ONORM = W("output_norm.weight")
INV = 1.0 / (THETA ** (np.arange(0, S, 2, dtype=np.float64) / S))


def rms(x, w):
    return (x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + EPS)).astype(np.float32) * w


def rope(x, pos):  # GGUF llama: consecutive pairs (Q/K were permuted by the converter)
    ang = np.outer(pos, INV)
    c, s = np.cos(ang)[:, None, :].astype(np.float32), np.sin(ang)[:, None, :].astype(np.float32)
    out = np.empty_like(x)
    out[..., 0::2] = x[..., 0::2] * c - x[..., 1::2] * s
    out[..., 1::2] = x[..., 0::2] * s + x[..., 1::2] * c
    return out


def hidden(ids, cache, start):
    """Final hidden states (n, D) after the output norm for tokens ids at positions start.., appending K/V to cache
    (list per layer): what the output projection multiplies (tools/gen_embed_ref.py pools them)."""
    n = len(ids)
    x = emb[ids].copy()
    pos = np.arange(start, start + n)
    for l, lw in enumerate(LW):
        h = rms(x, lw["attn_norm"])
        q = rope((h @ lw["attn_q"].T).reshape(n, H, S), pos)
        k = rope((h @ lw["attn_k"].T).reshape(n, K, S), pos)
        v = (h @ lw["attn_v"].T).reshape(n, K, S)
        ck, cv = cache[l]
        ck = np.concatenate([ck, k]) if ck is not None else k
        cv = np.concatenate([cv, v]) if cv is not None else v
        cache[l] = (ck, cv)
        kk, vv = np.repeat(ck, H // K, axis=1), np.repeat(cv, H // K, axis=1)
        att = np.einsum("thd,shd->hts", q, kk) / np.sqrt(S)
        mask = pos[:, None] < np.arange(len(ck))[None, :]
        att = np.where(mask[None], -np.inf, att)
        att = np.exp(att - att.max(-1, keepdims=True))
        att /= att.sum(-1, keepdims=True)
        x = x + np.einsum("hts,shd->thd", att, vv).reshape(n, H * S) @ lw["attn_output"].T
        h = rms(x, lw["ffn_norm"])
        g, u = h @ lw["ffn_gate"].T, h @ lw["ffn_up"].T
        x = x + ((g / (1 + np.exp(-g))) * u) @ lw["ffn_down"].T
    return rms(x, ONORM)


def forward(ids, cache, start):
    """Logits (n, V) for tokens ids at positions start.., appending K/V to cache (list per layer)."""
    return (hidden(ids, cache, start) @ emb.T).astype(np.float64)


def main():
    fx = json.load(open(FX))
    for i, p in enumerate(fx["prompts"]):
        ids, n_prompt = p["ids"], p["n_prompt"]
        lg = forward(ids[:-1], [(None, None)] * L, 0)
        lse = np.log(np.exp(lg - lg.max(1, keepdims=True)).sum(1)) + lg.max(1)
        lp = (lg[np.arange(len(ids) - 1), ids[1:]] - lse).tolist()
        cache = [(None, None)] * L
        out = forward(ids[:n_prompt], cache, 0)[-1]
        greedy, pos = [], n_prompt
        while len(greedy) < fx["new_tokens"]:
            t = int(out.argmax())
            if t == EOS:
                break
            greedy.append(t)
            out = forward([t], cache, pos)[-1]
            pos += 1
        p["fp32"] = {"logprob_next": [round(v, 7) for v in lp], "greedy": greedy,
                     "top1": lg.argmax(1).tolist()}
        print(i, len(greedy), flush=True)
    json.dump(fx, open(FX, "w"), separators=(",", ":"))


if __name__ == "__main__":
    main()
