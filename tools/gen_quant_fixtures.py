#!/usr/bin/env python3
"""Writes the fixtures for tests/test_quant.c and tests/test_matmul.c into tests/data/quant/.

dequant.bin — random but valid blocks of every weight type spill reads, and the fp32 values the
reference dequantizer (gguf-py `gguf.quants.dequantize`, a numpy port of ggml-quants.c) gives for
them; plus fp32 -> fp16 / bf16 conversion cases.  Layout (little-endian):
    "SPQD" u32 version=1 u32 n_cases
    n_cases x { u32 ggml_type, u32 n_elems, u32 n_bytes, u8 data[n_bytes], f32 expected[n_elems] }
    u32 n_conv, f32 src[n_conv], u16 fp16[n_conv], u16 bf16[n_conv]
Scales (fp16 d/dmin/m, Q8_K's f32 d) are drawn from sane magnitudes so no block produces NaN/Inf;
every other byte (nibbles, high bits, packed 6-bit scales) is uniform random.

rope.json — RoPE cases: transformers' modeling_rope_utils formulas (default, linear, llama3, yarn)
and LlamaRotaryEmbedding/apply_rotary_pos_emb, ported verbatim to numpy float32 (torch is not
installed here; the port keeps transformers' dtypes: fp32 tensors, Python-float scalars).  NORM
(consecutive pairs) cases are produced by de-interleaving, rotating-half, re-interleaving, which
is what GGUF's Q/K permutation undoes.

Deterministic (fixed seeds).  Run from the repo root: python3 tools/gen_quant_fixtures.py
"""
import json
import math
import os
import struct

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import quants

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "quant")
rng = np.random.default_rng(20261130)

# type -> (block elems, block bytes, byte offsets of fp16 scale fields, signed?)
# offsets per formats.md §4 / ggml-common.h
LAYOUT = {
    Q.Q8_0: (32, 34, [(0, "d")]),
    Q.Q4_0: (32, 18, [(0, "d")]),
    Q.Q4_1: (32, 20, [(0, "d"), (2, "m")]),
    Q.Q5_0: (32, 22, [(0, "d")]),
    Q.Q5_1: (32, 24, [(0, "d"), (2, "m")]),
    Q.Q4_K: (256, 144, [(0, "d"), (2, "d")]),
    Q.Q5_K: (256, 176, [(0, "d"), (2, "d")]),
    Q.Q6_K: (256, 210, [(208, "d")]),
}


def sane_half(n, signed):
    """fp16 scales: magnitude 10^[-4, 0.5], random sign if signed, a few exact zeros."""
    mag = 10.0 ** rng.uniform(-4, 0.5, size=n)
    sign = rng.choice([-1.0, 1.0], size=n) if signed else 1.0
    v = (mag * sign).astype(np.float16)
    v[rng.random(n) < 0.03] = 0
    return v


def random_blocks(qtype, n_blocks):
    elems, size, fields = LAYOUT[qtype]
    raw = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    for off, kind in fields:
        # d of the legacy types is signed in practice (Q4_0 writes max/-8); m is a signed minimum
        h = sane_half(n_blocks, signed=(kind == "m" or qtype in (Q.Q8_0, Q.Q4_0, Q.Q5_0, Q.Q6_K)))
        raw[:, off:off + 2] = h.view(np.uint8).reshape(n_blocks, 2)
    return raw


def q8_k_blocks(n_blocks):
    raw = rng.integers(0, 256, size=(n_blocks, 292), dtype=np.uint8)
    d = (10.0 ** rng.uniform(-5, 0, size=n_blocks) * rng.choice([-1.0, 1.0], size=n_blocks)).astype(np.float32)
    raw[:, 0:4] = d.view(np.uint8).reshape(n_blocks, 4)
    qs = raw[:, 4:260].view(np.int8).astype(np.float32)
    expected = d[:, None] * qs  # ggml dequantize_row_q8_K: y = x.d * x.qs[j]; gguf-py has no Q8_K
    return raw, expected.astype(np.float32)


def f16_cases(n):
    bits = rng.integers(0, 1 << 16, size=n, dtype=np.uint16)
    nan = ((bits >> 10) & 0x1F == 0x1F) & (bits & 0x3FF != 0)
    bits[nan] &= 0xFC00  # NaN -> inf, keep the sign
    special = np.array([0x0000, 0x8000, 0x0001, 0x03FF, 0x0400, 0x7BFF, 0x7C00, 0xFC00, 0x3C00, 0x8001], dtype=np.uint16)
    k = min(n, len(special))
    bits[:k] = special[:k]
    return bits


def bf16_cases(n):
    bits = rng.integers(0, 1 << 16, size=n, dtype=np.uint16)
    nan = ((bits >> 7) & 0xFF == 0xFF) & (bits & 0x7F != 0)
    bits[nan] &= 0xFF80
    return bits


def dequant_cases():
    cases = []  # (type, n_elems, bytes, expected f32)
    for qtype, (elems, size, _) in LAYOUT.items():
        for n_blocks in (1, 3, 64 if elems == 32 else 12):
            raw = random_blocks(qtype, n_blocks)
            exp = quants.dequantize(raw.reshape(1, -1), qtype).reshape(-1).astype(np.float32)
            assert exp.size == n_blocks * elems and np.all(np.isfinite(exp))
            cases.append((int(qtype), n_blocks * elems, raw.tobytes(), exp))
    for n_blocks in (1, 8):
        raw, exp = q8_k_blocks(n_blocks)
        cases.append((int(Q.Q8_K), n_blocks * 256, raw.tobytes(), exp.reshape(-1)))
    for n in (1, 7, 8, 33, 4099):
        b = f16_cases(n)
        exp = quants.dequantize(b.view(np.uint8).reshape(1, -1), Q.F16).reshape(-1).astype(np.float32)
        cases.append((int(Q.F16), n, b.tobytes(), exp))
        b = bf16_cases(n)
        exp = quants.dequantize(b.view(np.uint8).reshape(1, -1), Q.BF16).reshape(-1).astype(np.float32)
        cases.append((int(Q.BF16), n, b.tobytes(), exp))
    x = rng.standard_normal(37).astype(np.float32)
    cases.append((int(Q.F32), 37, x.tobytes(), x))
    return cases


def conversion_cases():
    n = 6000
    mag = 2.0 ** rng.uniform(-30, 20, size=n)
    x = (mag * rng.choice([-1.0, 1.0], size=n)).astype(np.float32)
    # exact fp16 halfway points (ties to even) and their neighbours, subnormal halfway points
    h = rng.integers(0, 0x7BFF, size=600, dtype=np.uint16)
    lo = h.view(np.float16).astype(np.float64)
    hi = (h + 1).view(np.float16).astype(np.float64)
    mid = ((lo + hi) / 2).astype(np.float32)
    x[:600] = mid
    x[600:1200] = np.nextafter(mid, np.float32(np.inf))
    x[1200:1800] = np.nextafter(mid, np.float32(-np.inf))
    # bf16 halfway points
    b = rng.integers(0, 0x7F7F, size=400, dtype=np.uint32)
    x[1800:2200] = ((b << 16) | 0x8000).astype(np.uint32).view(np.float32)
    special = [0.0, -0.0, 65504.0, 65519.99, 65520.0, -65520.0, 1e-8, 2.0 ** -24, 2.0 ** -25, 3 * 2.0 ** -26,
               2.0 ** -14, 1e38, 3.4028235e38, float("inf"), float("-inf"), 5.96e-8, 6.1e-5]
    x[2200:2200 + len(special)] = np.array(special, dtype=np.float32)
    with np.errstate(over="ignore"):
        f16 = x.astype(np.float16).view(np.uint16)
    bf16 = quants.quantize(x.reshape(1, -1), Q.BF16).view(np.uint16).reshape(-1)
    return x, f16, bf16


def write_dequant():
    cases = dequant_cases()
    x, f16, bf16 = conversion_cases()
    with open(os.path.join(OUT, "dequant.bin"), "wb") as f:
        f.write(b"SPQD" + struct.pack("<II", 1, len(cases)))
        for qtype, n, raw, exp in cases:
            f.write(struct.pack("<III", qtype, n, len(raw)))
            f.write(raw)
            f.write(np.asarray(exp, dtype="<f4").tobytes())
        f.write(struct.pack("<I", x.size))
        f.write(x.astype("<f4").tobytes() + f16.astype("<u2").tobytes() + bf16.astype("<u2").tobytes())
    return len(cases)


# ---------------------------------------------------------------- RoPE, transformers ported to numpy

F32 = np.float32


def default_inv_freq(base, dim):
    # 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(dtype=torch.float) / dim))
    return F32(1.0) / (F32(base) ** (np.arange(0, dim, 2, dtype=np.int64).astype(F32) / F32(dim)))


def linear_inv_freq(base, dim, factor):
    inv_freq = default_inv_freq(base, dim)
    inv_freq = inv_freq / F32(factor)
    return inv_freq, 1.0


def llama3_inv_freq(base, dim, factor, low_freq_factor, high_freq_factor, old_context_len):
    inv_freq = default_inv_freq(base, dim)
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = F32(2 * math.pi) / inv_freq
    inv_freq_llama = np.where(wavelen > F32(low_freq_wavelen), inv_freq / F32(factor), inv_freq)
    smooth_factor = (F32(old_context_len) / wavelen - F32(low_freq_factor)) / F32(high_freq_factor - low_freq_factor)
    smoothed_inv_freq = (F32(1) - smooth_factor) * inv_freq_llama / F32(factor) + smooth_factor * inv_freq_llama
    is_medium_freq = ~(wavelen < F32(high_freq_wavelen)) * ~(wavelen > F32(low_freq_wavelen))
    inv_freq_llama = np.where(is_medium_freq, smoothed_inv_freq, inv_freq_llama)
    return inv_freq_llama.astype(F32), 1.0


def yarn_inv_freq(base, dim, factor, original_max_position_embeddings, beta_fast=None, beta_slow=None,
                  attention_factor=None, mscale=None, mscale_all_dim=None, truncate=True):
    def get_mscale(scale, mscale=1):
        if scale <= 1:
            return 1.0
        return 0.1 * mscale * math.log(scale) + 1.0

    if attention_factor is None:
        if mscale and mscale_all_dim:
            attention_factor = float(get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim))
        else:
            attention_factor = get_mscale(factor)
    beta_fast = beta_fast or 32
    beta_slow = beta_slow or 1

    def find_correction_dim(num_rotations, dim, base, max_position_embeddings):
        return (dim * math.log(max_position_embeddings / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

    def find_correction_range(low_rot, high_rot, dim, base, max_position_embeddings, truncate):
        low = find_correction_dim(low_rot, dim, base, max_position_embeddings)
        high = find_correction_dim(high_rot, dim, base, max_position_embeddings)
        if truncate:
            low = math.floor(low)
            high = math.ceil(high)
        return max(low, 0), min(high, dim - 1)

    def linear_ramp_factor(min, max, dim):
        if min == max:
            max += 0.001
        linear_func = (np.arange(dim, dtype=F32) - F32(min)) / F32(max - min)
        return np.clip(linear_func, F32(0), F32(1))

    pos_freqs = F32(base) ** (np.arange(0, dim, 2).astype(F32) / F32(dim))
    inv_freq_extrapolation = F32(1.0) / pos_freqs
    inv_freq_interpolation = F32(1.0) / (F32(factor) * pos_freqs)
    low, high = find_correction_range(beta_fast, beta_slow, dim, base, original_max_position_embeddings, truncate)
    inv_freq_extrapolation_factor = F32(1) - linear_ramp_factor(low, high, dim // 2)
    inv_freq = (inv_freq_interpolation * (F32(1) - inv_freq_extrapolation_factor)
                + inv_freq_extrapolation * inv_freq_extrapolation_factor)
    return inv_freq.astype(F32), attention_factor


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return np.concatenate((-x2, x1), axis=-1)


def rope_neox(x, pos, inv_freq, attention_scaling, n_rot):
    """x (T, H, S); LlamaRotaryEmbedding.forward + apply_rotary_pos_emb, partial rotary on the first n_rot dims."""
    freqs = pos.astype(F32)[:, None] * inv_freq[None, :]          # (T, n_rot/2), fp32
    emb = np.concatenate((freqs, freqs), axis=-1)
    cos = (np.cos(emb) * F32(attention_scaling)).astype(F32)[:, None, :]
    sin = (np.sin(emb) * F32(attention_scaling)).astype(F32)[:, None, :]
    rot, rest = x[..., :n_rot], x[..., n_rot:]
    out = (rot * cos) + (rotate_half(rot) * sin)
    return np.concatenate((out, rest), axis=-1).astype(F32)


def rope_norm(x, pos, inv_freq, attention_scaling, n_rot):
    """Consecutive pairs (2i, 2i+1): de-interleave the rotated dims, rotate-half, re-interleave."""
    rot = x[..., :n_rot]
    perm = np.concatenate((np.arange(0, n_rot, 2), np.arange(1, n_rot, 2)))
    y = x.copy()
    deint = np.concatenate((rot[..., perm], x[..., n_rot:]), axis=-1)
    r = rope_neox(deint, pos, inv_freq, attention_scaling, n_rot)
    y[..., perm] = r[..., :n_rot]
    return y


def rope_cases():
    cases = []
    specs = [
        dict(name="default-neox", style="neox", S=64, n_rot=64, base=10000.0, scaling="none"),
        dict(name="default-norm", style="norm", S=64, n_rot=64, base=10000.0, scaling="none"),
        dict(name="partial-neox", style="neox", S=96, n_rot=32, base=10000.0, scaling="none"),
        dict(name="partial-norm", style="norm", S=80, n_rot=40, base=500000.0, scaling="none"),
        dict(name="linear", style="neox", S=64, n_rot=64, base=10000.0, scaling="linear", factor=4.0),
        dict(name="llama3", style="neox", S=128, n_rot=128, base=500000.0, scaling="llama3", factor=8.0,
             low_freq_factor=1.0, high_freq_factor=4.0, orig_max_pos=8192),
        dict(name="llama3-norm", style="norm", S=64, n_rot=64, base=500000.0, scaling="llama3", factor=32.0,
             low_freq_factor=1.0, high_freq_factor=4.0, orig_max_pos=8192),
        dict(name="yarn", style="neox", S=128, n_rot=128, base=1000000.0, scaling="yarn", factor=4.0,
             orig_max_pos=32768),
        dict(name="yarn-mscale", style="neox", S=64, n_rot=64, base=10000.0, scaling="yarn", factor=40.0,
             orig_max_pos=4096, beta_fast=32.0, beta_slow=1.0, mscale=1.0, mscale_all_dim=0.707),
        dict(name="yarn-notrunc-attn", style="neox", S=64, n_rot=64, base=150000.0, scaling="yarn", factor=32.0,
             orig_max_pos=4096, attn_factor=1.25, truncate=False),
    ]
    for spec in specs:
        T, H, S, n_rot = 6, 3, spec["S"], spec["n_rot"]
        pos = np.array([0, 1, 7, 100, 2047, 9000], dtype=np.int64)
        x = rng.standard_normal((T, H, S)).astype(F32)
        sc = spec["scaling"]
        if sc == "none":
            inv, attn = default_inv_freq(spec["base"], n_rot), 1.0
        elif sc == "linear":
            inv, attn = linear_inv_freq(spec["base"], n_rot, spec["factor"])
        elif sc == "llama3":
            inv, attn = llama3_inv_freq(spec["base"], n_rot, spec["factor"], spec["low_freq_factor"],
                                        spec["high_freq_factor"], spec["orig_max_pos"])
        else:
            inv, attn = yarn_inv_freq(spec["base"], n_rot, spec["factor"], spec["orig_max_pos"],
                                      spec.get("beta_fast"), spec.get("beta_slow"), spec.get("attn_factor"),
                                      spec.get("mscale"), spec.get("mscale_all_dim"), spec.get("truncate", True))
        fn = rope_neox if spec["style"] == "neox" else rope_norm
        y = fn(x, pos, inv.astype(F32), attn, n_rot)
        c = dict(spec)
        c.update(T=T, H=H, pos=pos.tolist(), x=[float(v) for v in x.reshape(-1)],
                 y=[float(v) for v in y.reshape(-1)], inv_freq=[float(v) for v in inv], attn_scale=float(attn))
        cases.append(c)
    with open(os.path.join(OUT, "rope.json"), "w") as f:
        json.dump({"version": 1, "generator": "tools/gen_quant_fixtures.py", "cases": cases}, f)
    return len(cases)


if __name__ == "__main__":
    os.makedirs(OUT, exist_ok=True)
    nd = write_dequant()
    nr = rope_cases()
    print(f"wrote {nd} dequant cases and {nr} rope cases to {os.path.normpath(OUT)}")
