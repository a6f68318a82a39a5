#!/usr/bin/env python3
"""make_bad_adapters.py — malformed LoRA adapters for tests/test_lora.c, one fault per directory.

Writes tests/data/bad_adapters/<case>/ (an adapter of tests/data/ref/<base>/ with one thing wrong) and
expected.tsv: "<case>\\t<base>\\t<text the refusal must contain>".  The loader must refuse each with one sentence
naming that thing; nothing is compared word for word, so the sentences can be reworded without touching this.
Numpy only; safetensors written by hand (make_lora_fixtures.write_st).

Run from anywhere with a Python that has numpy:  python3 tools/make_bad_adapters.py
"""
import json
import os
import shutil
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_lora_fixtures import ROOT, mlx_config, peft_config, write_json, write_st  # noqa: E402

OUT = os.path.join(ROOT, "tests", "data", "bad_adapters")
rng = np.random.default_rng(77)

# llama_gqa_s64: D 64, 4 heads of 64 (HS 256), 2 kv heads (KS 128), F 128, 2 layers
LLAMA = "llama_gqa_s64"
P = "base_model.model.model.layers"


def pair(layer, module, r, in_dim, out_dim, dtype="F32", suffix=".weight"):
    A = rng.normal(0, 0.1, (r, in_dim)).astype(np.float32)
    B = rng.normal(0, 0.1, (out_dim, r)).astype(np.float32)
    return [(f"{P}.{layer}.{module}.lora_A{suffix}", dtype, A), (f"{P}.{layer}.{module}.lora_B{suffix}", dtype, B)]


def q_pair(layer=0, r=4):
    return pair(layer, "self_attn.q_proj", r, 64, 256)


def peft_case(name, tensors, config=None, weights="adapter_model.safetensors", **cfg):
    d = os.path.join(OUT, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    c = config or peft_config(LLAMA, 4, 8, ["q_proj", "v_proj"])
    c.update(cfg)
    write_json(os.path.join(d, "adapter_config.json"), c)
    if tensors is not None:
        write_st(os.path.join(d, weights), tensors, {"format": "pt"})
    return d


def main():
    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(OUT)
    cases = []

    peft_case("dora", q_pair() + [(f"{P}.0.self_attn.q_proj.lora_magnitude_vector", "F32", np.ones(256, np.float32))],
              use_dora=True)
    cases.append(("dora", LLAMA, "use_dora"))

    peft_case("dora_magnitude", q_pair() + [(f"{P}.0.self_attn.q_proj.lora_magnitude_vector", "F32",
                                             np.ones(256, np.float32))])
    cases.append(("dora_magnitude", LLAMA, "DoRA magnitude"))

    # a full fine-tune saved where the adapter's weights go: whole q_proj / v_proj weights
    peft_case("full_finetune", [(f"{P}.0.self_attn.q_proj.weight", "F16",
                                 rng.normal(0, 0.1, (256, 64)).astype(np.float32))])
    cases.append(("full_finetune", LLAMA, "whole weight"))

    # made for a base with D 128 and 8 heads
    peft_case("other_base", pair(0, "self_attn.q_proj", 4, 128, 512))
    cases.append(("other_base", LLAMA, "another base"))

    # the config says r = 8, the factors have rank 4
    peft_case("rank_mismatch", q_pair(r=4), r=8)
    cases.append(("rank_mismatch", LLAMA, "rank 4"))

    # rank_pattern says q_proj has rank 2; the file's has 4
    peft_case("rank_pattern_mismatch", q_pair(r=4), rank_pattern={"q_proj": 2})
    cases.append(("rank_pattern_mismatch", LLAMA, "rank_pattern"))

    peft_case("unknown_target", q_pair() + pair(0, "mlp.fc_in", 4, 64, 128), target_modules=["q_proj", "fc_in"])
    cases.append(("unknown_target", LLAMA, "fc_in"))

    # the same module named in the tensors only (target_modules a regex)
    peft_case("unknown_tensor", q_pair() + pair(0, "self_attn.rotary_emb", 4, 64, 64),
              target_modules=".*(q_proj|rotary_emb)")
    cases.append(("unknown_tensor", LLAMA, "self_attn.rotary_emb"))

    peft_case("modules_to_save", q_pair(), modules_to_save=["lm_head"])
    cases.append(("modules_to_save", LLAMA, "lm_head"))

    peft_case("lm_head_target", q_pair() + [("base_model.model.lm_head.lora_A.weight", "F32",
                                             rng.normal(0, 0.1, (4, 64)).astype(np.float32)),
                                            ("base_model.model.lm_head.lora_B.weight", "F32",
                                             rng.normal(0, 0.1, (256, 4)).astype(np.float32))])
    cases.append(("lm_head_target", LLAMA, "LM head"))

    peft_case("embedding_target", q_pair() + [("base_model.model.model.embed_tokens.lora_embedding_A", "F32",
                                               rng.normal(0, 0.1, (4, 256)).astype(np.float32))])
    cases.append(("embedding_target", LLAMA, "embeddings"))

    peft_case("bias_all", q_pair(), bias="all")
    cases.append(("bias_all", LLAMA, "bias is all"))

    t = q_pair()
    t[1][2][7, 2] = np.nan
    peft_case("nan_in_b", t)
    cases.append(("nan_in_b", LLAMA, "NaN"))

    t = pair(0, "self_attn.v_proj", 4, 64, 128, dtype="F16")
    t[0][2][1, 1] = np.inf
    peft_case("inf_in_a_f16", t)
    cases.append(("inf_in_a_f16", LLAMA, "infinity"))

    peft_case("missing_weights", None)
    cases.append(("missing_weights", LLAMA, "no adapter_model.safetensors"))

    d = os.path.join(OUT, "missing_config")
    os.makedirs(d)
    write_st(os.path.join(d, "adapter_model.safetensors"), q_pair(), {"format": "pt"})
    cases.append(("missing_config", LLAMA, "no adapter_config.json"))

    peft_case("missing_b", q_pair()[:1])
    cases.append(("missing_b", LLAMA, "no matching lora_B"))

    peft_case("layer_beyond", q_pair(layer=5))
    cases.append(("layer_beyond", LLAMA, "layer 5"))

    peft_case("not_lora", q_pair(), peft_type="LOHA")
    cases.append(("not_lora", LLAMA, "LOHA"))

    peft_case("int_dtype", [(n, "F32", x) for n, _, x in q_pair()[:1]] +
              [(q_pair()[1][0], "F32", np.zeros((256, 4), np.float32))])
    # rewrite B as I32 by hand: same bytes, another dtype
    path = os.path.join(OUT, "int_dtype", "adapter_model.safetensors")
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    header[q_pair()[1][0]]["dtype"] = "I32"
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + data)
    cases.append(("int_dtype", LLAMA, "I32"))

    # the header length says 4,000 bytes; the file has fewer
    d = peft_case("truncated_header", q_pair())
    path = os.path.join(d, "adapter_model.safetensors")
    with open(path, "rb") as f:
        raw = f.read()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", 4000) + raw[8:200])
    cases.append(("truncated_header", LLAMA, "adapter_model.safetensors"))

    # an MoE base: an expert's gate_proj adapted
    peft_case("moe_expert", pair(0, "self_attn.q_proj", 4, 64, 128) + pair(0, "mlp.experts.3.gate_proj", 4, 64, 32),
              config=peft_config("qwen3_moe_top8", 4, 8, ["q_proj", "gate_proj"]))
    cases.append(("moe_expert", "qwen3_moe_top8", "expert"))

    # mlx-lm
    def mlx_case(name, config, tensors):
        d = os.path.join(OUT, name)
        os.makedirs(d)
        write_json(os.path.join(d, "adapter_config.json"), config)
        write_st(os.path.join(d, "adapters.safetensors"), tensors, {"format": "mlx"})

    mlx_q = [("model.layers.1.self_attn.q_proj.lora_a", "F32", rng.normal(0, 0.1, (64, 4)).astype(np.float32)),
             ("model.layers.1.self_attn.q_proj.lora_b", "F32", rng.normal(0, 0.1, (4, 256)).astype(np.float32))]
    c = mlx_config(LLAMA, 4, 2.0, ["self_attn.q_proj"], 1)
    del c["lora_parameters"]
    mlx_case("mlx_no_lora_parameters", c, mlx_q)
    cases.append(("mlx_no_lora_parameters", LLAMA, "lora_parameters"))

    mlx_case("mlx_dora", mlx_config(LLAMA, 4, 2.0, ["self_attn.q_proj"], 1, fine_tune_type="dora"), mlx_q)
    cases.append(("mlx_dora", LLAMA, "dora"))

    mlx_case("mlx_outside_num_layers",
             mlx_config(LLAMA, 4, 2.0, ["self_attn.q_proj"], 1),
             [(n.replace("layers.1", "layers.0"), dt, x) for n, dt, x in mlx_q])
    cases.append(("mlx_outside_num_layers", LLAMA, "num_layers"))

    # PEFT's orientation in an mlx-lm file: lora_a [r, in] reads as rank 64 against the config's 4
    mlx_case("mlx_peft_orientation", mlx_config(LLAMA, 4, 2.0, ["self_attn.q_proj"], 1),
             [(mlx_q[0][0], "F32", mlx_q[0][2].T.copy()), (mlx_q[1][0], "F32", mlx_q[1][2].T.copy())])
    cases.append(("mlx_peft_orientation", LLAMA, "disagree"))

    with open(os.path.join(OUT, "expected.tsv"), "w") as f:
        for c in cases:
            f.write("\t".join(c) + "\n")
    print(len(cases), "cases")


if __name__ == "__main__":
    main()
