#!/usr/bin/env python3
"""Writes the fp8 safetensors fixtures of tests/test_fp8.c from the fp32 reference model
tests/data/ref/llama_gqa_s64 (numpy only: the E4M3FN encoder is a nearest-value search over the 254 finite
codes, ties to the even code, an algorithm independent of the C one in src/model/quant.c).

    .venv/bin/python tools/gen_fp8_fixture.py [OUTDIR]     (default tests/data/fp8)

OUTDIR/llama_fp8/        config.json (+ a quantization_config), generation_config.json, model.safetensors:
                         the reference model with its layer matrices as F8_E4M3 and their scales, three ways:
                           layer 0          weight_scale [N, 1] F32             (per row, amax/448)
                           layer 1 k, v, o  weight_scale [] F32 (k: BF16)       (per tensor)
                           layer 1 q, gate, up, down  weight_scale_inv [ceil(N/128), ceil(K/128)] F32 (per block)
                         embeddings, head and norms stay F32, as fp8 checkpoints keep them.
OUTDIR/llama_fp8/expected.bin  the first 4 rows of every fp8 matrix dequantized here (e4m3 * scale in fp32):
                         char magic[8] "SPLFP801"; u32 n; n x {u32 name_len; name; u32 rows; u32 K; f32[rows*K]}
OUTDIR/bad_shape/, bad_missing/   one F8_E4M3 q_proj each, with a scale of shape [3] / with no scale at all.
"""
import json
import os
import shutil
import struct
import sys

import numpy as np

SRC = "tests/data/ref/llama_gqa_s64"


def e4m3_table():
    """The 256 codes' values (NaN for 0x7F/0xFF), from the format's definition."""
    t = np.zeros(256, dtype=np.float64)
    for c in range(256):
        s = -1.0 if c & 0x80 else 1.0
        e, m = (c >> 3) & 15, c & 7
        if e == 15 and m == 7:
            t[c] = np.nan
        elif e == 0:
            t[c] = s * m * 2.0 ** -9
        else:
            t[c] = s * (1 + m / 8) * 2.0 ** (e - 7)
    return t


TAB = e4m3_table()
FINITE = np.array([c for c in range(256) if not np.isnan(TAB[c]) and c != 0x80])  # one zero code
VALS = TAB[FINITE]
ORDER = np.argsort(VALS)
SV, SC = VALS[ORDER], FINITE[ORDER]


def encode(x):
    """fp32 array -> e4m3 codes, round to nearest, ties to the even code, saturating at +-448."""
    x = np.clip(np.asarray(x, dtype=np.float64), -448.0, 448.0)
    i = np.clip(np.searchsorted(SV, x), 1, len(SV) - 1)
    lo, hi = SV[i - 1], SV[i]
    pick_hi = (hi - x < x - lo) | ((hi - x == x - lo) & (SC[i] % 2 == 0))
    codes = np.where(pick_hi, SC[i], SC[i - 1]).astype(np.uint8)
    return np.where(np.signbit(x) & (codes == 0), 0x80, codes).astype(np.uint8)


def read_st(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        h = json.loads(f.read(n))
        data = f.read()
    out = {}
    for k, v in h.items():
        if k == "__metadata__":
            continue
        b, e = v["data_offsets"]
        assert v["dtype"] == "F32"
        out[k] = np.frombuffer(data[b:e], dtype="<f4").reshape(v["shape"])
    return out


def to_bf16(x):
    u = np.asarray(x, dtype="<f4").view("<u4").astype(np.uint64)
    return (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF).astype("<u2")


def write_st(path, tensors):
    """tensors: list of (name, dtype, shape, bytes) in file order."""
    header, off = {}, 0
    for name, dt, shape, raw in tensors:
        header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(raw)]}
        off += len(raw)
    hj = json.dumps(header, separators=(",", ":")).encode()
    hj += b" " * ((8 - len(hj) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for _, _, _, raw in tensors:
            f.write(raw)


def dequant(codes, scale_full):
    return (TAB[codes].astype(np.float32) * scale_full.astype(np.float32)).astype(np.float32)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/data/fp8"
    W = read_st(os.path.join(SRC, "model.safetensors"))
    d = os.path.join(out, "llama_fp8")
    os.makedirs(d, exist_ok=True)
    cfg = json.load(open(os.path.join(SRC, "config.json")))
    cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                  "ignored_layers": ["lm_head"]}
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"), indent=2)
    shutil.copy(os.path.join(SRC, "generation_config.json"), d)
    tensors, expected = [], []
    for name in sorted(W):
        w = W[name].astype(np.float32)
        if w.ndim != 2 or not name.startswith("model.layers."):
            tensors.append((name, "F32", w.shape, w.astype("<f4").tobytes()))
            continue
        N, K = w.shape
        layer = int(name.split(".")[2])
        proj = name.split(".")[-2]
        if layer == 0:  # per row
            s = (np.abs(w).max(axis=1, keepdims=True) / np.float32(448)).astype(np.float32)
            codes = encode(w / s)
            full = np.broadcast_to(s, w.shape)
            sc = (name + "_scale", "F32", [N, 1], s.astype("<f4").tobytes())
        elif proj in ("k_proj", "v_proj", "o_proj"):  # per tensor
            s = np.float32(np.abs(w).max() / np.float32(448))
            if proj == "k_proj":  # a BF16 scale: the codes are made against the scale as stored
                sb = to_bf16(np.array([s]))
                s = np.float32((sb.astype(np.uint32) << 16).view("<f4")[0])
                sc = (name + "_scale", "BF16", [], sb.tobytes())
            else:
                sc = (name + "_scale", "F32", [], np.array([s], dtype="<f4").tobytes())
            codes = encode(w / s)
            full = np.full(w.shape, s, dtype=np.float32)
        else:  # per 128x128 block
            bn, bk = (N + 127) // 128, (K + 127) // 128
            s = np.zeros((bn, bk), dtype=np.float32)
            full = np.zeros(w.shape, dtype=np.float32)
            for i in range(bn):
                for j in range(bk):
                    blk = w[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128]
                    s[i, j] = np.abs(blk).max() / np.float32(448)
                    full[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128] = s[i, j]
            codes = encode(w / full)
            sc = (name + "_scale_inv", "F32", [bn, bk], s.astype("<f4").tobytes())
        tensors.append((name, "F8_E4M3", [N, K], codes.tobytes()))
        tensors.append(sc)
        expected.append((name, dequant(codes, full)[:4]))
    write_st(os.path.join(d, "model.safetensors"), tensors)
    with open(os.path.join(d, "expected.bin"), "wb") as f:
        f.write(b"SPLFP801" + struct.pack("<I", len(expected)))
        for name, x in expected:
            nb = name.encode()
            f.write(struct.pack("<I", len(nb)) + nb + struct.pack("<II", *x.shape) + x.astype("<f4").tobytes())
    # bad fixtures: one small fp8 matrix with a wrong-shaped scale, and one without a scale
    q = W["model.layers.0.self_attn.q_proj.weight"][:32, :16].astype(np.float32)
    codes = encode(q / (np.abs(q).max() / 448)).tobytes()
    for bad, extra in (("bad_shape", [("model.layers.0.self_attn.q_proj.weight_scale", "F32", [3],
                                       np.ones(3, dtype="<f4").tobytes())]), ("bad_missing", [])):
        bd = os.path.join(out, bad)
        os.makedirs(bd, exist_ok=True)
        json.dump(cfg, open(os.path.join(bd, "config.json"), "w"), indent=2)
        write_st(os.path.join(bd, "model.safetensors"),
                 [("model.layers.0.self_attn.q_proj.weight", "F8_E4M3", [32, 16], codes)] + extra)
    print("wrote", out)


if __name__ == "__main__":
    main()
