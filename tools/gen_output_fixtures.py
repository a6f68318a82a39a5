#!/usr/bin/env python3
"""Writes tests/data/output/reference.json: what the reference implementations
say about the two conversions output.c must get exactly right.

  "floats": [[bits, text], ...]  float32 bit pattern, numpy's shortest repr
            (str(np.float32)), which output.c's logprob writer must match as a
            double (same value; formatting may differ, e.g. 1e-05 vs 1e-5).
  "utf8":   [[in_hex, out_hex], ...]  bytes, and Python's
            bytes.decode("utf-8", errors="replace") re-encoded: the text
            output.c must put in "content"/"text".

Deterministic (seeded).  Run from the repo root: python3 tools/gen_output_fixtures.py
"""
import json
import os
import random
import struct

import numpy as np

rng = random.Random(20261130)

floats = []
def add_float(x):
    f = np.float32(x)
    if not np.isfinite(f):
        return
    bits = struct.unpack("<I", struct.pack("<f", float(f)))[0]
    floats.append([bits, str(f)])

for x in [0.0, -0.0, -0.01, -4.5, -9999.0, -1e-5, -1e-45, -3.4028235e38, -0.1, -1.0, -2.0, -100.0]:
    add_float(x)
for _ in range(600):                       # typical logprobs
    add_float(-rng.uniform(0, 30))
for _ in range(300):                       # near-certain tokens
    add_float(-rng.expovariate(1.0) * 10 ** -rng.randint(1, 9))
for _ in range(300):                       # any bit pattern of a finite negative float
    bits = rng.getrandbits(31) | 0x80000000
    if (bits >> 23) & 0xFF != 0xFF:
        floats.append([bits, str(np.frombuffer(struct.pack("<I", bits), dtype="<f4")[0])])

pieces = [b"a", b"\xc3\xa9", b"\xe2\x82\xac", b"\xf0\x9f\x98\x80", b"\xff", b"\xc0\x80", b"\xed\xa0\x80",
          b"\xe0\x80", b"\xe2\x82", b"\xf0\x9f\x98", b"\xf4\x90\x80\x80", b"\xf5", b"\x80", b"\xbf", b"\xe0\xa0",
          b"\xf0\x90", b"\xf4\x8f\xbf", b"\xc2", b"\xed\x9f\xbf", b" "]
utf8 = []
for _ in range(500):
    if rng.random() < 0.5:
        s = b"".join(rng.choice(pieces) for _ in range(rng.randint(1, 8)))
    else:
        s = bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 12)))
    utf8.append([s.hex(), s.decode("utf-8", errors="replace").encode("utf-8").hex()])

out = os.path.join(os.path.dirname(__file__), "..", "tests", "data", "output", "reference.json")
with open(out, "w") as f:
    json.dump({"generator": "tools/gen_output_fixtures.py", "numpy": np.__version__,
               "floats": floats, "utf8": utf8}, f, separators=(",", ":"))
    f.write("\n")
print(f"wrote {out}: {len(floats)} floats, {len(utf8)} byte strings")
