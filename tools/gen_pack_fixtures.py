#!/usr/bin/env python3
"""Writes tests/data/pack/quantize.bin, the fixture of tests/test_pack.c: fp32 rows and the bytes the
reference quantizer (gguf-py `gguf.quants.quantize`, a bit-exact numpy port of ggml-quants.c's
quantize_row_*_ref) makes of them, for Q8_0, Q4_0, Q4_1, F16 and BF16.

Layout (little-endian):
    "SPPK" u32 version=1 u32 n_cases
    n_cases x { u32 ggml_type, u32 n_elems, u32 n_bytes, f32 x[n_elems], u8 expected[n_bytes] }

Each case is one row of 32-element blocks mixing: Gaussian weights (std 0.02, the usual scale), blocks
of wildly different magnitudes (1e-6 .. 1e3), and hand-made edge blocks: all zeros, a constant, a single
non-zero, the largest magnitude reached by a negative and a positive value (Q4_0 takes the first),
values lying exactly on half steps of the grid (rounding ties), fp16-subnormal scales, and a block of
integers.  Deterministic (fixed seed).  Run from the repo root: python3 tools/gen_pack_fixtures.py
"""
import os
import struct

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import quants

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "pack")
rng = np.random.default_rng(20261130)


def edge_blocks():
    b = []
    b.append(np.zeros(32))
    b.append(np.full(32, 0.37))
    z = np.zeros(32); z[5] = -3.0; b.append(z)
    t = rng.normal(0, 0.5, 32); t[3] = -2.0; t[17] = 2.0; b.append(t)      # tie: -max first
    t = rng.normal(0, 0.5, 32); t[3] = 2.0; t[17] = -2.0; b.append(t)      # tie: +max first
    d = 1.0 / 127
    b.append((np.arange(32) - 16 + 0.5) * d)                             # Q8_0 half steps
    b.append((np.arange(32) % 16 - 8 + 0.5) * (4.0 / 8))                 # Q4_0 half steps (max 4 at... )
    b.append(np.linspace(-1, 1, 32))
    b.append(rng.normal(0, 1e-6, 32))                                     # subnormal fp16 scales
    b.append(np.round(rng.normal(0, 20, 32)))                             # integers
    b.append(-np.abs(rng.normal(0, 1, 32)))                               # all negative
    b.append(np.abs(rng.normal(0, 1, 32)) + 5)                            # all positive, offset
    return b


def row():
    blocks = [rng.normal(0, 0.02, 32) for _ in range(160)]
    blocks += [rng.normal(0, 1, 32) * 10.0 ** rng.uniform(-6, 3) for _ in range(80)]
    blocks += edge_blocks()
    return np.concatenate(blocks).astype(np.float32)


def main():
    os.makedirs(OUT, exist_ok=True)
    cases = []
    for qt in (Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.F16, Q.BF16):
        x = row()
        y = quants.quantize(x.reshape(1, -1), qt).reshape(-1).view(np.uint8)
        cases.append((int(qt), x, y.tobytes()))
    with open(os.path.join(OUT, "quantize.bin"), "wb") as f:
        f.write(b"SPPK" + struct.pack("<II", 1, len(cases)))
        for qt, x, y in cases:
            f.write(struct.pack("<III", qt, x.size, len(y)))
            f.write(x.astype("<f4").tobytes())
            f.write(y)
    print("wrote", os.path.join(OUT, "quantize.bin"), sum(12 + x.size * 4 + len(y) for _, x, y in cases), "bytes")


if __name__ == "__main__":
    main()
