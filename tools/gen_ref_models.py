#!/usr/bin/env python3
"""Builds tiny random-weight models of each supported architecture with torch +
transformers and records their reference logits (fp32, eager attention).

Run on a machine with torch (python3 tools/gen_ref_models.py OUTDIR [name,name]: only those) (the GPU machine has it; CPU is used for the fp32
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

# Issue 12's families.  Each runs its own conventions at sizes where they bite: windows shorter than the rows,
# softcaps small enough to clip random-weight scores, query_pre_attn_scalar other than the head size, longrope
# whose short and long factors both get used, partial rotary, dense layers among sparse ones, top-k 1/2/8.
NEW_MODELS = {
    "gemma2_softcap_window": (tf.Gemma2Config, dict(num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                                    query_pre_attn_scalar=24, sliding_window=8,
                                                    attn_logit_softcapping=1.0, final_logit_softcapping=3.0,
                                                    tie_word_embeddings=True, rope_theta=10000.0,
                                                    layer_types=["sliding_attention", "full_attention"])),
    "gemma3_local_linear": (tf.Gemma3TextConfig, dict(num_hidden_layers=3, num_attention_heads=4,
                                                      num_key_value_heads=2, head_dim=32, query_pre_attn_scalar=48,
                                                      sliding_window=8, tie_word_embeddings=False,
                                                      layer_types=["sliding_attention", "full_attention",
                                                                   "sliding_attention"],
                                                      rope_parameters={
                                                          "sliding_attention": {"rope_type": "default",
                                                                                "rope_theta": 10000.0},
                                                          "full_attention": {"rope_type": "linear", "factor": 2.0,
                                                                             "rope_theta": 1000000.0}})),
    "phi3_longrope_partial": (tf.Phi3Config, dict(num_attention_heads=4, num_key_value_heads=2,
                                                  tie_word_embeddings=False, partial_rotary_factor=0.5,
                                                  max_position_embeddings=64, original_max_position_embeddings=16,
                                                  rope_scaling={"rope_type": "longrope", "rope_theta": 10000.0,
                                                                "short_factor": [1.0, 1.3, 1.7, 2.2],
                                                                "long_factor": [1.5, 3.0, 6.0, 12.0]})),
    "phi3_plain_tied": (tf.Phi3Config, dict(num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=True,
                                            rope_theta=10000.0, original_max_position_embeddings=256)),
    "mixtral_top2": (tf.MixtralConfig, dict(num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                            intermediate_size=32, num_local_experts=4, num_experts_per_tok=2,
                                            tie_word_embeddings=False, rope_theta=1000000.0)),
    "qwen2_moe_shared": (tf.Qwen2MoeConfig, dict(num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                                                 intermediate_size=64, moe_intermediate_size=32,
                                                 shared_expert_intermediate_size=48, num_experts=8,
                                                 num_experts_per_tok=2, norm_topk_prob=False, mlp_only_layers=[1],
                                                 decoder_sparse_step=1, tie_word_embeddings=True,
                                                 rope_theta=1000000.0)),
    "qwen2_moe_top1_step2": (tf.Qwen2MoeConfig, dict(num_hidden_layers=3, num_attention_heads=4,
                                                     num_key_value_heads=2, intermediate_size=64,
                                                     moe_intermediate_size=32, shared_expert_intermediate_size=32,
                                                     num_experts=4, num_experts_per_tok=1, norm_topk_prob=True,
                                                     mlp_only_layers=[], decoder_sparse_step=2,
                                                     tie_word_embeddings=False, rope_theta=1000000.0)),
    "qwen3_moe_top8": (tf.Qwen3MoeConfig, dict(num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                               moe_intermediate_size=32, num_experts=16, num_experts_per_tok=8,
                                               norm_topk_prob=True, tie_word_embeddings=True,
                                               rope_theta=1000000.0)),
}
# Fixtures whose reference is computed the way transformers generates (prompt in one forward, then one token at a
# time against the cache), because the pass itself depends on the row's length (longrope picks its factors per
# forward from the current length).
INCREMENTAL = {"phi3_longrope_partial"}
# Fixtures that also get the experts as transformers 5 holds them in memory (mlp.experts.gate_up_proj /
# down_proj, 3-D), beside save_pretrained's per-expert layout: model_fused.safetensors.
FUSED = {"mixtral_top2", "qwen3_moe_top8"}


def v4_config(d):
    """The same model's config as transformers 4 wrote it: rope_theta + rope_scaling (+ rope_local_base_freq),
    sliding_window_pattern instead of layer_types, num_experts for Qwen MoE, top-level partial_rotary_factor."""
    d = dict(d)
    rp = d.pop("rope_parameters", None) or {}
    if "full_attention" in rp:
        full, loc = rp["full_attention"], rp.get("sliding_attention", {})
        d["rope_theta"] = full.get("rope_theta", 10000.0)
        if "rope_theta" in loc:
            d["rope_local_base_freq"] = loc["rope_theta"]
        sc = {k: v for k, v in full.items() if k != "rope_theta"}
    else:
        d["rope_theta"] = rp.get("rope_theta", d.get("rope_theta", 10000.0))
        sc = {k: v for k, v in rp.items() if k not in ("rope_theta", "partial_rotary_factor")}
        if "partial_rotary_factor" in rp:
            d["partial_rotary_factor"] = rp["partial_rotary_factor"]
    if sc.get("rope_type", sc.get("type", "default")) != "default":
        if "original_max_position_embeddings" in sc:
            d["original_max_position_embeddings"] = sc.pop("original_max_position_embeddings")
        if sc.get("rope_type") == "longrope":
            sc = {"type": "longrope", "short_factor": sc["short_factor"], "long_factor": sc["long_factor"]}
        d["rope_scaling"] = sc
    else:
        d["rope_scaling"] = None
    lt = d.pop("layer_types", None)
    if lt and "sliding_attention" in lt and "full_attention" in lt:
        d["sliding_window_pattern"] = lt.index("full_attention") + 1
    if d.get("model_type", "").startswith("qwen") and "num_local_experts" in d:
        d["num_experts"] = d.pop("num_local_experts")
    return d


def randomise(model, g):
    # std 0.1 (not the 0.02 init) so logits are peaked enough for the comparison to mean something;
    # norm weights around 1 and non-zero biases so every parameter is exercised.  Gemma stores norm weights as
    # w - 1 (applied as 1 + w): around 0 there, so the applied scale is around 1 as in the other families (around
    # 2 made the bf16 GPU engine's error 5x the other fixtures', measured with bf16 rounding emulated on the CPU).
    gemma = model.config.model_type.startswith("gemma")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and gemma:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            elif "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))


def main():
    out = sys.argv[1]
    torch.set_grad_enabled(False)
    only = sys.argv[2].split(",") if len(sys.argv) > 2 else None
    for name, (cls, extra) in {**MODELS, **NEW_MODELS}.items():
        if only and name not in only:
            continue
        g = torch.Generator().manual_seed(1234)
        cfg = cls(**{**BASE, **extra})
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
            if name in INCREMENTAL:
                step = model(gen[:, :n], use_cache=True)
                parts, past = [step.logits[0].float()], step.past_key_values
                for i in range(n, gen.shape[1]):
                    step = model(gen[:, i:i + 1], past_key_values=past, use_cache=True)
                    parts.append(step.logits[0].float())
                    past = step.past_key_values
                logits = torch.cat(parts)[:gen.shape[1]]
            else:
                logits = model(gen).logits[0].float()
            rows.append((n, gen[0].tolist(), logits))
        with open(os.path.join(d, "config.json")) as f:
            saved = json.load(f)
        if name in NEW_MODELS:
            with open(os.path.join(d, "config_v4.json"), "w") as f:
                json.dump(v4_config(saved), f, indent=2)
        if name in FUSED:
            from safetensors.torch import save_file
            sd = {k: v.detach().contiguous().clone() for k, v in model.state_dict().items()}
            if saved.get("tie_word_embeddings"):
                sd.pop("lm_head.weight", None)
            save_file(sd, os.path.join(d, "model_fused.safetensors"), metadata={"format": "pt"})
            print(name, "fused keys", [k for k in sd if "layers.0.mlp" in k])
        with open(os.path.join(d, "ref.bin"), "wb") as f:
            f.write(b"SPLREF01" + struct.pack("<II", len(rows), V))
            for n, ids, logits in rows:
                f.write(struct.pack("<II", n, len(ids)))
                f.write(struct.pack(f"<{len(ids)}i", *ids))
                f.write(logits.contiguous().numpy().astype("<f4").tobytes())
        print(name, "ok", [len(r[1]) for r in rows], "logit std", float(rows[0][2].std()))


if __name__ == "__main__":
    main()
