#!/usr/bin/env python3
"""Builds tiny random-weight models of each supported architecture with torch +
transformers and records their reference logits (fp32, eager attention).

Run on a machine with torch (the GPU machine has it; CPU is used for the fp32
reference so results do not depend on TF32/cuBLAS settings):
    python3 tools/gen_ref_models.py OUTDIR
Each model lands in OUTDIR/<name>/ as config.json + model.safetensors +
ref.bin.  ref.bin layout (little-endian):
    char magic[8] = "SPLREF01"; u32 n_rows; u32 vocab;
    per row: u32 n_prompt; u32 n_total; i32 ids[n_total]; f32 logits[n_total][vocab]
logits[i] is the model's output at position i (the distribution of token i+1),
from one full teacher-forced forward over prompt + 32 greedy tokens; the C test
prefills the prompt and then decodes the recorded tokens one by one, batched
with the other rows at different lengths.
"""
import json
import os
import struct
import sys

import torch
import transformers as tf

V = 256
PROMPTS = [5, 13, 23]
NEW = 32

BASE = dict(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=2, rms_norm_eps=1e-5,
            max_position_embeddings=256, bos_token_id=1, eos_token_id=2, pad_token_id=0)

MODELS = {
    "llama_gqa_s64": (tf.LlamaConfig, dict(num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                                           tie_word_embeddings=False, rope_theta=10000.0)),
    "llama_mha_s128_tied_llama3": (tf.LlamaConfig, dict(num_attention_heads=2, num_key_value_heads=2, head_dim=128,
                                                        tie_word_embeddings=True, rope_theta=500000.0,
                                                        rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                                                      "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                                      "original_max_position_embeddings": 32})),
    "llama_mqa_linear": (tf.LlamaConfig, dict(num_attention_heads=4, num_key_value_heads=1, head_dim=64,
                                              tie_word_embeddings=False, rope_theta=10000.0,
                                              rope_scaling={"rope_type": "linear", "factor": 2.0})),
    "llama_yarn": (tf.LlamaConfig, dict(num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                                        tie_word_embeddings=False, rope_theta=10000.0,
                                        rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                                      "original_max_position_embeddings": 32})),
    "qwen2_bias": (tf.Qwen2Config, dict(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                                        rope_theta=1000000.0)),
    "qwen3_qknorm": (tf.Qwen3Config, dict(num_attention_heads=4, num_key_value_heads=2, head_dim=128,
                                          tie_word_embeddings=False, rope_theta=1000000.0)),
    "mistral_window8": (tf.MistralConfig, dict(num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                                               tie_word_embeddings=False, rope_theta=10000.0, sliding_window=8)),
}


def randomise(model, g):
    # std 0.1 (not the 0.02 init) so logits are peaked enough for the comparison to mean something;
    # norm weights around 1 and non-zero biases so every parameter is exercised.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))


def main():
    out = sys.argv[1]
    torch.set_grad_enabled(False)
    for name, (cls, extra) in MODELS.items():
        g = torch.Generator().manual_seed(1234)
        cfg = cls(**BASE, **extra)
        cfg._attn_implementation = "eager"
        model = tf.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager", torch_dtype=torch.float32)
        randomise(model, g)
        model.eval()
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        model.save_pretrained(d, safe_serialization=True)
        rows = []
        for n in PROMPTS:
            ids = torch.randint(3, V, (1, n), generator=g)
            gen = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=NEW,
                                 min_new_tokens=NEW, eos_token_id=None, pad_token_id=0)
            logits = model(gen).logits[0].float()
            rows.append((n, gen[0].tolist(), logits))
        with open(os.path.join(d, "ref.bin"), "wb") as f:
            f.write(b"SPLREF01" + struct.pack("<II", len(rows), V))
            for n, ids, logits in rows:
                f.write(struct.pack("<II", n, len(ids)))
                f.write(struct.pack(f"<{len(ids)}i", *ids))
                f.write(logits.contiguous().numpy().astype("<f4").tobytes())
        print(name, "ok", [len(r[1]) for r in rows], "logit std", float(rows[0][2].std()))


if __name__ == "__main__":
    main()
