#!/usr/bin/env python3
"""Writes tests/data/tiny/tiny-smollm2.gguf: SmolLM2's real vocabulary, merges and
chat template with a tiny random-weight llama body (D=32, 2 layers), so the
CLI tests (spill run / resume / streaming / preemption) run a real tokenizer
and template end to end in seconds.  Matrices Q8_0 (the embedding too), norms F32.

    python3 tools/gen_tiny_gguf.py ~/.streamweights/models/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf

Optional third and fourth arguments: the weights' seed (default 7) and the layer count (default 2).  The draft
fixtures of --speculate draft (tests/test_draft.c) are made with them:

    python3 tools/gen_tiny_gguf.py tests/data/tiny/tiny-smollm2.gguf tests/data/tiny/tiny-smollm2-draft.gguf 11 1
    python3 tools/gen_tiny_gguf.py tests/data/tok/bpe_qwen2.gguf tests/data/tiny/tiny-othervocab.gguf 7 1

(the first: the same vocabulary, other weights; the second: another vocabulary, which a draft must not have).
"""
import sys

import numpy as np
import gguf

src = gguf.GGUFReader(sys.argv[1])
out = sys.argv[2] if len(sys.argv) > 2 else "tests/data/tiny/tiny-smollm2.gguf"
seed = int(sys.argv[3]) if len(sys.argv) > 3 else 7
D, L, H, K, F = 32, int(sys.argv[4]) if len(sys.argv) > 4 else 2, 4, 2, 64
S = D // H
w = gguf.GGUFWriter(out, "llama")
w.add_name("tiny-smollm2 (random weights, SmolLM2 vocabulary)")
w.add_context_length(512)
w.add_embedding_length(D)
w.add_block_count(L)
w.add_feed_forward_length(F)
w.add_head_count(H)
w.add_head_count_kv(K)
w.add_rope_dimension_count(S)
w.add_rope_freq_base(10000.0)
w.add_layer_norm_rms_eps(1e-5)
w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)

for name, field in src.fields.items():
    if not name.startswith("tokenizer."):
        continue
    vtype = field.types[0]
    if vtype == gguf.GGUFValueType.ARRAY:
        sub = field.types[1]
        if sub == gguf.GGUFValueType.STRING:
            vals = [bytes(field.parts[i]).decode("utf-8") for i in field.data]
        else:
            vals = [field.parts[i].tolist()[0] for i in field.data]
        w.add_array(name, vals)
    elif vtype == gguf.GGUFValueType.STRING:
        w.add_string(name, bytes(field.parts[field.data[0]]).decode("utf-8"))
    else:
        val = field.parts[field.data[0]].tolist()[0]
        {gguf.GGUFValueType.UINT32: w.add_uint32, gguf.GGUFValueType.INT32: w.add_int32,
         gguf.GGUFValueType.BOOL: w.add_bool, gguf.GGUFValueType.FLOAT32: w.add_float32,
         gguf.GGUFValueType.UINT64: w.add_uint64}[vtype](name, val)

V = len(src.fields["tokenizer.ggml.tokens"].data)
rng = np.random.default_rng(seed)


def mat(n_out, n_in, std=0.3):
    a = (rng.standard_normal((n_out, n_in)) * std).astype(np.float32)
    return gguf.quants.quantize(a, gguf.GGMLQuantizationType.Q8_0), gguf.GGMLQuantizationType.Q8_0


def add(name, arr_type):
    arr, t = arr_type
    w.add_tensor(name, arr, raw_dtype=t)


add("token_embd.weight", mat(V, D, 1.0))
w.add_tensor("output_norm.weight", (1 + 0.1 * rng.standard_normal(D)).astype(np.float32))
for l in range(L):
    w.add_tensor(f"blk.{l}.attn_norm.weight", (1 + 0.1 * rng.standard_normal(D)).astype(np.float32))
    add(f"blk.{l}.attn_q.weight", mat(H * S, D))
    add(f"blk.{l}.attn_k.weight", mat(K * S, D))
    add(f"blk.{l}.attn_v.weight", mat(K * S, D))
    add(f"blk.{l}.attn_output.weight", mat(D, H * S))
    w.add_tensor(f"blk.{l}.ffn_norm.weight", (1 + 0.1 * rng.standard_normal(D)).astype(np.float32))
    add(f"blk.{l}.ffn_gate.weight", mat(F, D))
    add(f"blk.{l}.ffn_up.weight", mat(F, D))
    add(f"blk.{l}.ffn_down.weight", mat(D, F))
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
print(out)
