#!/usr/bin/env python3
"""make_lora_fixtures.py — the LoRA fixtures of tests/test_lora.c, from numpy alone (no torch, no peft).

For tiny models of tests/data/ref/<base>/ (tools/gen_ref_models.py) it writes random adapters with B non-zero
(PEFT's own init leaves B = 0, which would test nothing), and for each the merged model the adapter stands
for, W' = W + scale * B @ A computed in float64 and stored fp32:

    tests/data/lora/adapters/<variant>/   adapter_config.json + adapter_model.safetensors (PEFT) or
                                          adapters.safetensors (mlx-lm: lora_a = A.T [in, r], lora_b = B.T [r, out])
    tests/data/lora/merged/<variant>/     config.json + model.safetensors (the base's, with the merged weights)

The C test runs the CPU engine on base + adapter (unmerged, per row) and on the merged model and compares every
position's logits.  The factors are rounded to the variant's storage dtype (F32, F16, BF16) before merging, so
the merged weights are exactly what the stored factors say.  Safetensors files are written by hand: u64 LE header
length, the JSON header padded with spaces to a multiple of 8, the data.  Deterministic (fixed seeds).

Run from anywhere with a Python that has numpy:  python3 tools/make_lora_fixtures.py
"""
import json
import math
import os
import shutil
import struct

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REF = os.path.join(ROOT, "tests", "data", "ref")
OUT = os.path.join(ROOT, "tests", "data", "lora")

ALL7 = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
PATH = {"q_proj": "self_attn.q_proj", "k_proj": "self_attn.k_proj", "v_proj": "self_attn.v_proj",
        "o_proj": "self_attn.o_proj", "qkv_proj": "self_attn.qkv_proj", "gate_proj": "mlp.gate_proj",
        "up_proj": "mlp.up_proj", "down_proj": "mlp.down_proj", "gate_up_proj": "mlp.gate_up_proj"}

# name -> how the adapter is made.  key: what follows lora_A / lora_B in PEFT names (peft strips the adapter name
# on save; some versions and tools keep ".default").  test_lora.c lists the same variants.
VARIANTS = {
    # PEFT, every projection, plain scale alpha / r, fp32 factors
    "llama_all7": dict(base="llama_gqa_s64", layout="peft", r=4, alpha=8, rslora=False, targets=ALL7,
                       dtype="F32", key=".weight"),
    # PEFT, q and v only, rsLoRA (alpha / sqrt r), bf16 factors, per-module rank and alpha (rank_pattern,
    # alpha_pattern matched as peft's get_pattern_key does: `(.*\.)?(key)$` against the module's name)
    "llama_qv_rs": dict(base="llama_gqa_s64", layout="peft", r=8, alpha=4, rslora=True, targets=["q_proj", "v_proj"],
                        dtype="BF16", key=".weight", rank_pattern={"v_proj": 4},
                        alpha_pattern={"layers.1.self_attn.q_proj": 12}),
    # mlx-lm, every projection of the last layer only (num_layers 1), fp16 factors, scale used as given
    "qwen2_mlx": dict(base="qwen2_bias", layout="mlx", r=4, scale=2.0, targets=ALL7, dtype="F16", num_layers=1),
    # PEFT on Phi-3's fused projections (B split by rows into q, k, v and gate, up on load)
    "phi3_fused": dict(base="phi3_plain_tied", layout="peft", r=4, alpha=8, rslora=False,
                       targets=["qkv_proj", "o_proj", "gate_up_proj", "down_proj"], dtype="F32",
                       key=".default.weight"),
    # PEFT on an MoE base: attention only, rsLoRA, names without the .weight suffix
    "qwen3moe_attn": dict(base="qwen3_moe_top8", layout="peft", r=4, alpha=4, rslora=True,
                          targets=["q_proj", "k_proj", "v_proj", "o_proj"], dtype="F32", key=""),
}

NP_DT = {"F32": np.float32, "F16": np.float16}


# ---------------------------------------------------------------- safetensors by hand

def bf16_bits(x):
    """fp32 -> bf16 bits, round to nearest even (finite inputs)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype(np.uint16)


def bf16_to_f32(b):
    return (b.astype(np.uint32) << 16).view(np.float32)


def round_to(x, dtype):
    """x as the dtype stores it, back in fp32 (what a reader of the file sees)."""
    x = np.asarray(x, dtype=np.float32)
    if dtype == "BF16":
        return bf16_to_f32(bf16_bits(x))
    return x.astype(NP_DT[dtype]).astype(np.float32)


def tensor_bytes(x, dtype):
    if dtype == "BF16":
        return bf16_bits(x).astype("<u2").tobytes()
    return np.ascontiguousarray(x, dtype=NP_DT[dtype]).astype(np.dtype(NP_DT[dtype]).newbyteorder("<")).tobytes()


def write_st(path, tensors, metadata=None):
    """tensors: list of (name, dtype, array); written in that order, contiguous."""
    header, blobs, off = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for name, dtype, x in tensors:
        b = tensor_bytes(x, dtype)
        header[name] = {"dtype": dtype, "shape": list(np.shape(x)), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for b in blobs:
            f.write(b)


def read_st(path):
    """[(name, dtype, fp32 array)] in file order, and the metadata."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    meta = header.pop("__metadata__", None)
    out = []
    for name, t in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        b, e = t["data_offsets"]
        raw = data[b:e]
        if t["dtype"] == "F32":
            x = np.frombuffer(raw, "<f4")
        elif t["dtype"] == "F16":
            x = np.frombuffer(raw, "<f2").astype(np.float32)
        elif t["dtype"] == "BF16":
            x = bf16_to_f32(np.frombuffer(raw, "<u2"))
        else:
            raise SystemExit(f"{path}: {name} is {t['dtype']}")
        out.append((name, t["dtype"], x.reshape(t["shape"]).astype(np.float32)))
    return out, meta


def write_json(path, obj):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")


def peft_config(base, r, alpha, targets, rslora=False, **extra):
    c = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": f"tests/data/ref/{base}",
         "r": r, "lora_alpha": alpha, "lora_dropout": 0.0, "target_modules": targets, "bias": "none",
         "fan_in_fan_out": False, "use_rslora": rslora, "use_dora": False, "rank_pattern": {}, "alpha_pattern": {},
         "modules_to_save": None, "layers_to_transform": None, "init_lora_weights": False, "inference_mode": True,
         # the rest of what a recent peft writes, at its defaults
         "alora_invocation_tokens": None, "corda_config": None, "eva_config": None, "exclude_modules": None,
         "layer_replication": None, "layers_pattern": None, "loftq_config": {}, "lora_bias": False,
         "megatron_config": None, "megatron_core": "megatron.core", "qalora_group_size": 16, "revision": None,
         "target_parameters": None, "trainable_token_indices": None, "use_qalora": False}
    c.update(extra)
    return c


def mlx_config(base, rank, scale, keys, num_layers, **extra):
    c = {"model": f"tests/data/ref/{base}", "fine_tune_type": "lora", "num_layers": num_layers, "batch_size": 4,
         "iters": 100, "learning_rate": 1e-5, "seed": 0,
         "lora_parameters": {"rank": rank, "scale": scale, "dropout": 0.0, "keys": keys}}
    c.update(extra)
    return c


# ---------------------------------------------------------------- the variants

def pattern_value(pattern, module_name, default):
    import re
    for k, v in pattern.items():
        if re.match(rf"(.*\.)?({k})$", module_name):
            return v
    return default


def make_variant(name, v, seed):
    rng = np.random.default_rng(seed)
    base_dir = os.path.join(REF, v["base"])
    with open(os.path.join(base_dir, "config.json")) as f:
        cfg = json.load(f)
    tensors, _ = read_st(os.path.join(base_dir, "model.safetensors"))
    weights = {n: x for n, _, x in tensors}
    L = cfg["num_hidden_layers"]
    first = L - v.get("num_layers", L)
    factors, merged = [], dict(weights)
    for l in range(first, L):
        for t in v["targets"]:
            mod = f"model.layers.{l}.{PATH[t]}"
            W = weights[mod + ".weight"]
            out_dim, in_dim = W.shape
            if v["layout"] == "mlx":
                r, scale = v["r"], v["scale"]
            else:
                r = pattern_value(v.get("rank_pattern", {}), mod, v["r"])
                alpha = pattern_value(v.get("alpha_pattern", {}), mod, v["alpha"])
                scale = alpha / math.sqrt(r) if v["rslora"] else alpha / r
            # |scale * B @ A| around 0.03 against base weights of std 0.1: a visible change, not a new model
            A = round_to(rng.normal(0, 0.1, (r, in_dim)), v["dtype"])
            B = round_to(rng.normal(0, 0.03 / (scale * math.sqrt(r) * 0.1), (out_dim, r)), v["dtype"])
            merged[mod + ".weight"] = (W.astype(np.float64) +
                                       scale * (B.astype(np.float64) @ A.astype(np.float64))).astype(np.float32)
            if v["layout"] == "mlx":
                factors.append((f"{mod}.lora_a", v["dtype"], A.T.copy()))
                factors.append((f"{mod}.lora_b", v["dtype"], B.T.copy()))
            else:
                factors.append((f"base_model.model.{mod}.lora_A{v['key']}", v["dtype"], A))
                factors.append((f"base_model.model.{mod}.lora_B{v['key']}", v["dtype"], B))
    ad = os.path.join(OUT, "adapters", name)
    shutil.rmtree(ad, ignore_errors=True)
    factors.sort(key=lambda t: t[0])
    if v["layout"] == "mlx":
        write_json(os.path.join(ad, "adapter_config.json"),
                   mlx_config(v["base"], v["r"], v["scale"], [PATH[t] for t in v["targets"]], v["num_layers"]))
        write_st(os.path.join(ad, "adapters.safetensors"), factors, {"format": "mlx"})
    else:
        write_json(os.path.join(ad, "adapter_config.json"),
                   peft_config(v["base"], v["r"], v["alpha"], v["targets"], v["rslora"],
                               rank_pattern=v.get("rank_pattern", {}), alpha_pattern=v.get("alpha_pattern", {})))
        write_st(os.path.join(ad, "adapter_model.safetensors"), factors, {"format": "pt"})
    md = os.path.join(OUT, "merged", name)
    shutil.rmtree(md, ignore_errors=True)
    os.makedirs(md)
    shutil.copy(os.path.join(base_dir, "config.json"), os.path.join(md, "config.json"))
    write_st(os.path.join(md, "model.safetensors"), [(n, "F32", merged[n]) for n, _, _ in tensors],
             {"format": "pt"})
    changed = sum(1 for n in weights if merged[n] is not weights[n])
    print(f"{name}: {len(factors)} factors, {changed} merged weights")


def main():
    for i, (name, v) in enumerate(VARIANTS.items()):
        make_variant(name, v, 4242 + i)


if __name__ == "__main__":
    main()
