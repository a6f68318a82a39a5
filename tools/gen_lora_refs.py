#!/usr/bin/env python3
"""gen_lora_refs.py — reference logits of tiny models with LoRA adapters, from transformers + peft.

For tiny models of tests/data/ref/<base>/ (config.json + model.safetensors, tools/gen_ref_models.py) this makes
LoRA adapters with peft (LoraConfig(..., init_lora_weights=False) + get_peft_model; then A and B are redrawn
from a seeded generator so that B is non-zero and scale·B·A is a visible but modest change, |·| ~ 0.03 against
base weights of std 0.1), saves each with save_pretrained and records the logits of base + adapter (unmerged,
peft's own forward) in fp32 on the CPU, eager attention:

    OUTDIR/<variant>/adapter_config.json + adapter_model.safetensors + ref.bin
    OUTDIR/llama_gqa_s64_all7_mlx/adapter_config.json + adapters.safetensors + ref.bin
        the same adapter as llama_gqa_s64_all7 in mlx-lm's layout (lora_a = A.T [in, r], lora_b = B.T [r, out],
        lora_parameters.scale = peft's scaling, used as given), so its ref.bin is the same logits

ref.bin is tools/gen_ref_models.py's SPLREF01 (little-endian):
    char magic[8] = "SPLREF01"; u32 n_rows; u32 vocab;
    per row: u32 n_prompt; u32 n_total; i32 ids[n_total]; f32 logits[n_total][vocab]
with the same prompt logic: three random prompts of 5, 13 and 23 tokens, 32 greedy tokens of the adapted model,
then one teacher-forced forward over prompt + generated tokens.  tests/test_lora.c runs the CPU engine on
base + the saved adapter through the same rows and compares every position (|Δlogit| ≤ 1e-4).

Run on a machine with torch, transformers and peft (the GPU machine; the reference itself is computed on the CPU
so it does not depend on TF32 / cuBLAS settings), from the repo root:
    python3 tools/gen_lora_refs.py [OUTDIR]          (default tests/data/lora/peft_ref)
then commit OUTDIR.
"""
import json
import os
import shutil
import struct
import sys

import torch
import transformers as tf
from peft import LoraConfig, PeftModel, get_peft_model
from peft.tuners.lora import LoraLayer
from safetensors.torch import load_file, save_file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REF = os.path.join("tests", "data", "ref")  # relative to ROOT: the saved configs name their base by this path
PROMPTS = [5, 13, 23]
NEW = 32
ALL7 = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

# variant -> (base, LoraConfig arguments).  tests/test_lora.c's PEFT_REFS lists the same names.
VARIANTS = {
    "llama_gqa_s64_all7": ("llama_gqa_s64", dict(r=4, lora_alpha=8, target_modules=ALL7, use_rslora=False)),
    "llama_gqa_s64_qv_rs": ("llama_gqa_s64", dict(r=8, lora_alpha=4, target_modules=["q_proj", "v_proj"],
                                                  use_rslora=True, rank_pattern={"v_proj": 4},
                                                  alpha_pattern={"layers.1.self_attn.q_proj": 12})),
    "qwen2_bias_all7_rs": ("qwen2_bias", dict(r=4, lora_alpha=8, target_modules=ALL7, use_rslora=True)),
    "phi3_plain_tied_fused": ("phi3_plain_tied", dict(r=4, lora_alpha=8, use_rslora=False,
                                                      target_modules=["qkv_proj", "o_proj", "gate_up_proj",
                                                                      "down_proj"])),
    "qwen3_moe_top8_attn": ("qwen3_moe_top8", dict(r=4, lora_alpha=4, use_rslora=True,
                                                   target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])),
}
MLX_FROM = "llama_gqa_s64_all7"


def load_base(name):
    d = os.path.join(REF, name)
    try:
        return tf.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager")
    except TypeError:  # transformers 4 spells it torch_dtype
        return tf.AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float32, attn_implementation="eager")


def redraw(model, g):
    """A ~ N(0, 0.1), B ~ N(0, 0.03 / (scale * sqrt(r) * 0.1)) for every LoRA layer, so that scale * B @ A has
    entries of about 0.03 whatever the layer's r and scale (peft's init_lora_weights=False leaves nn.Linear's
    default init, which makes B non-zero too but of a size that depends on r)."""
    n = 0
    for name, mod in sorted(model.named_modules(), key=lambda kv: kv[0]):
        if not isinstance(mod, LoraLayer) or "default" not in mod.lora_A:
            continue
        r, s = mod.r["default"], mod.scaling["default"]
        A, B = mod.lora_A["default"].weight, mod.lora_B["default"].weight
        A.copy_(0.1 * torch.randn(A.shape, generator=g))
        B.copy_((0.03 / (s * r ** 0.5 * 0.1)) * torch.randn(B.shape, generator=g))
        n += 1
    return n


def rows_of(model, vocab, g):
    rows = []
    for n in PROMPTS:
        ids = torch.randint(3, vocab, (1, n), generator=g)
        gen = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=NEW,
                             min_new_tokens=NEW, eos_token_id=None, pad_token_id=0)
        logits = model(input_ids=gen).logits[0].float()
        rows.append((n, gen[0].tolist(), logits))
    return rows


def write_ref(path, rows, vocab):
    with open(path, "wb") as f:
        f.write(b"SPLREF01" + struct.pack("<II", len(rows), vocab))
        for n, ids, logits in rows:
            f.write(struct.pack("<II", n, len(ids)))
            f.write(struct.pack(f"<{len(ids)}i", *ids))
            f.write(logits.contiguous().numpy().astype("<f4").tobytes())


def write_mlx(src, dst, num_layers):
    """The PEFT adapter in src in mlx-lm's layout (formats.md §7)."""
    with open(os.path.join(src, "adapter_config.json")) as f:
        pc = json.load(f)
    if pc.get("use_rslora") or pc.get("rank_pattern") or pc.get("alpha_pattern"):
        raise SystemExit(f"{src}: mlx-lm has one plain scale; pick an adapter without rsLoRA or patterns")
    sd = load_file(os.path.join(src, "adapter_model.safetensors"))
    out, keys = {}, set()
    prefix = "base_model.model."
    for k, v in sd.items():
        assert k.startswith(prefix) and k.endswith(".weight"), k
        k = k[len(prefix):-len(".weight")]
        mod, factor = k.rsplit(".", 1)
        keys.add(mod.split(".", 3)[3])  # after model.layers.N.
        out[f"{mod}.{'lora_a' if factor == 'lora_A' else 'lora_b'}"] = v.t().contiguous()
    os.makedirs(dst, exist_ok=True)
    save_file(out, os.path.join(dst, "adapters.safetensors"), metadata={"format": "mlx"})
    cfg = {"model": pc.get("base_model_name_or_path"), "fine_tune_type": "lora", "num_layers": num_layers,
           "lora_parameters": {"rank": pc["r"], "scale": pc["lora_alpha"] / pc["r"], "dropout": 0.0,
                               "keys": sorted(keys)}}
    with open(os.path.join(dst, "adapter_config.json"), "w") as f:
        json.dump(cfg, f, indent=2)


def main():
    out = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else os.path.join(ROOT, "tests", "data", "lora", "peft_ref")
    os.chdir(ROOT)
    torch.set_grad_enabled(False)
    for i, (variant, (base, kw)) in enumerate(VARIANTS.items()):
        model = load_base(base)
        vocab, n_layers = model.config.vocab_size, model.config.num_hidden_layers
        cfg = LoraConfig(task_type="CAUSAL_LM", lora_dropout=0.0, bias="none", init_lora_weights=False, **kw)
        model = get_peft_model(model, cfg)
        n = redraw(model, torch.Generator().manual_seed(5000 + i))
        model.eval()
        d = os.path.join(out, variant)
        shutil.rmtree(d, ignore_errors=True)
        model.save_pretrained(d)
        if os.path.exists(os.path.join(d, "README.md")):  # peft's model card: nothing the test reads
            os.remove(os.path.join(d, "README.md"))
        rows = rows_of(model, vocab, torch.Generator().manual_seed(1234))
        write_ref(os.path.join(d, "ref.bin"), rows, vocab)
        # the saved adapter is what the C test loads: reload it into a fresh base and check it gives these logits
        again = PeftModel.from_pretrained(load_base(base), d).eval()
        delta = max(float((again(input_ids=torch.tensor([ids])).logits[0].float() - lg).abs().max())
                    for _, ids, lg in rows)
        assert delta < 1e-5, (variant, delta)
        print(variant, "ok:", n, "LoRA layers, rows", [len(r[1]) for r in rows], "logit std",
              float(rows[0][2].std()), "reload delta", delta)
        if variant == MLX_FROM:
            m = os.path.join(out, variant + "_mlx")
            shutil.rmtree(m, ignore_errors=True)
            write_mlx(d, m, n_layers)
            shutil.copy(os.path.join(d, "ref.bin"), os.path.join(m, "ref.bin"))
            print(variant + "_mlx", "ok")


if __name__ == "__main__":
    main()
