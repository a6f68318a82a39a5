#!/usr/bin/env python3
"""gen_prompt_fixtures.py — a tiny Hugging Face model directory whose config.json
has no bos_token_id, and the prompts transformers builds from it.

Writes tests/data/prompt/hf-nobos/:
  config.json            llama, 2 layers, D 64, V = the tokenizer's; no bos_token_id and an
                         eos_token_id list (<|im_end|>, </s>), no generation_config.json
  tokenizer.json         byte-level BPE: the 256 byte symbols, merges learnt by the small
                         deterministic trainer below, added specials <s> </s> <|im_start|> <|im_end|>
  tokenizer_config.json  bos_token "<s>", eos_token "</s>", added_tokens_decoder, a chat template
                         that prints both
  model.safetensors      random F32 weights (seed fixed) so `spill run` can answer rows
  expected.json          {"format": "spill-prompt-hf", "version": 1, "transformers", "bos_token",
                         "eos_token", "chats": [{id, messages, text, ids}], "completions": [{text, ids}],
                         "special_cases": [{name, tokenizer_config, special_tokens_map, bos_token,
                         eos_token}]}: transformers' AutoTokenizer.apply_chat_template(messages,
                         add_generation_prompt=True) text and ids, tokenizer(text).input_ids, and the
                         bos/eos a tokenizer loaded from those two files has

What transformers renders there (the case tests/test_prompt.c pins): bos_token and eos_token are
tokenizer_config.json's strings, whatever config.json says about ids.

Usage: python3 tools/gen_prompt_fixtures.py   (from the repo root, with transformers, tokenizers, numpy and
jinja2 importable; no torch needed; deterministic)
"""
import json
import os
import struct
import sys

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from tokenizers.pre_tokenizers import ByteLevel

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "data", "prompt", "hf-nobos")
FORMAT_VERSION = 1
N_MERGES = 96
SEED = 20260201

CORPUS = [
    "You are a helpful assistant.", "Hello! How are you today?", "What is the capital of France?",
    "The capital of France is Paris.", "Write a short poem about the sea.", "system", "user", "assistant",
    "Please answer in one sentence.", "Thank you, that was helpful.",
]

TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
            "{% if m['role'] == 'assistant' %}{{ eos_token }}{% endif %}{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

SPECIALS = ["<s>", "</s>", "<|im_start|>", "<|im_end|>"]

CHATS = [
    ("user", [{"role": "user", "content": "Hello!"}]),
    ("system_user", [{"role": "system", "content": "You are a helpful assistant."},
                     {"role": "user", "content": "What is the capital of France?"}]),
    ("two_turns", [{"role": "user", "content": "Hello! How are you today?"},
                   {"role": "assistant", "content": "Thank you, I am well."},
                   {"role": "user", "content": "Write a short poem about the sea."}]),
    ("unicode", [{"role": "user", "content": "Grüße, 世界! ☃"}]),
]
COMPLETIONS = ["The capital of France is", "Hello <s> world </s>"]


def byte_symbols():
    """GPT-2's bytes_to_unicode: the printable stand-in of each byte, in byte order."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    table = dict(zip(bs, (chr(c) for c in cs)))
    return [table[b] for b in range(256)]


def train_merges(words, n_merges):
    """Plain BPE: repeatedly merge the most frequent adjacent pair, ties broken by the pair's
    spelling, so the result depends only on the corpus (tokenizers' trainer does not promise that)."""
    seqs = [list(w) for w in words]
    merges = []
    for _ in range(n_merges):
        counts = {}
        for s in seqs:
            for a, b in zip(s, s[1:]):
                counts[(a, b)] = counts.get((a, b), 0) + 1
        if not counts:
            break
        best = min(counts, key=lambda p: (-counts[p], p))
        merges.append(best)
        for s in seqs:
            i = 0
            while i < len(s) - 1:
                if (s[i], s[i + 1]) == best:
                    s[i:i + 2] = [s[i] + s[i + 1]]
                else:
                    i += 1
    return merges


def build_tokenizer():
    sym = byte_symbols()
    pre = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    words = []
    for line in CORPUS:
        words += [w for w, _ in pre.pre_tokenize_str(line)]
    merges = train_merges(words, N_MERGES)
    vocab = {s: i for i, s in enumerate(sym)}
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    tok = Tokenizer(models.BPE(vocab, merges))
    tok.pre_tokenizer = ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIALS)
    return tok


def write_safetensors(path, tensors):
    """safetensors layout: u64 header length, JSON header (name -> dtype, shape, data_offsets), data."""
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name], dtype="<f4")
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + a.nbytes]}
        blobs.append(a.tobytes())
        off += a.nbytes
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def special_cases(added):
    """Where transformers takes bos_token / eos_token from when both files are there: tokenizer_config.json
    (tokenizer_class set, the class's own defaults out of the picture) and special_tokens_map.json, which
    transformers 5 reads only when the config has no added_tokens_decoder.  Each case is loaded from a
    scratch directory beside the fixture's tokenizer.json."""
    import shutil
    import tempfile

    from transformers import AutoTokenizer

    cls = {"tokenizer_class": "PreTrainedTokenizerFast"}
    cases = [
        ("config_wins", dict(cls, bos_token="<s>", eos_token="</s>", added_tokens_decoder=added),
         {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>"}),
        ("legacy_map_wins", dict(cls, bos_token="<s>", eos_token="</s>"),
         {"bos_token": "<|im_start|>", "eos_token": {"content": "<|im_end|>", "lstrip": False, "normalized": False,
                                                     "rstrip": False, "single_word": False}}),
        ("null_bos", dict(cls, bos_token=None, eos_token="</s>", added_tokens_decoder=added), None),
        ("absent", dict(cls, added_tokens_decoder=added), None),
        ("map_only", dict(cls), {"bos_token": "<s>"}),
    ]
    out = []
    for name, cfg, smap in cases:
        d = tempfile.mkdtemp()
        try:
            shutil.copy(os.path.join(OUT, "tokenizer.json"), d)
            with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
                json.dump(cfg, f)
            if smap is not None:
                with open(os.path.join(d, "special_tokens_map.json"), "w") as f:
                    json.dump(smap, f)
            ht = AutoTokenizer.from_pretrained(d)
            out.append({"name": name, "tokenizer_config": cfg, "special_tokens_map": smap,
                        "bos_token": ht.bos_token, "eos_token": ht.eos_token})
        finally:
            shutil.rmtree(d)
    return out


def compact(exp):
    """expected.json with one case per line (ids arrays stay on their line)."""
    head = {k: v for k, v in exp.items() if not isinstance(v, list)}
    parts = [json.dumps(head, ensure_ascii=False)[:-1]]
    for k, v in exp.items():
        if isinstance(v, list):
            rows = ",\n  ".join(json.dumps(x, ensure_ascii=False) for x in v)
            parts.append(', "%s": [\n  %s\n ]' % (k, rows))
    return "".join(parts) + "}"


def main():
    os.makedirs(OUT, exist_ok=True)
    tok = build_tokenizer()
    V = tok.get_vocab_size()
    tok.save(os.path.join(OUT, "tokenizer.json"))
    ids = {s: tok.token_to_id(s) for s in SPECIALS}
    added = {str(ids[s]): {"content": s, "lstrip": False, "normalized": False, "rstrip": False,
                           "single_word": False, "special": True} for s in SPECIALS}
    tcfg = {
        "added_tokens_decoder": added,
        "bos_token": "<s>",
        "eos_token": "</s>",
        "chat_template": TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 512,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    with open(os.path.join(OUT, "tokenizer_config.json"), "w") as f:
        json.dump(tcfg, f, indent=2, ensure_ascii=False)
        f.write("\n")
    D, F, L, H, K, S = 64, 128, 2, 4, 2, 16
    cfg = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": V, "hidden_size": D,
        "intermediate_size": F, "num_hidden_layers": L, "num_attention_heads": H, "num_key_value_heads": K,
        "head_dim": S, "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "tie_word_embeddings": True, "eos_token_id": [ids["<|im_end|>"], ids["</s>"]],
    }
    with open(os.path.join(OUT, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    rng = np.random.default_rng(SEED)
    w = {"model.embed_tokens.weight": rng.normal(0, 0.5, (V, D)), "model.norm.weight": 1 + rng.normal(0, 0.1, D)}
    for l in range(L):
        p = "model.layers.%d." % l
        for name, shape in [("self_attn.q_proj", (H * S, D)), ("self_attn.k_proj", (K * S, D)),
                            ("self_attn.v_proj", (K * S, D)), ("self_attn.o_proj", (D, H * S)),
                            ("mlp.gate_proj", (F, D)), ("mlp.up_proj", (F, D)), ("mlp.down_proj", (D, F))]:
            w[p + name + ".weight"] = rng.normal(0, 0.2, shape)
        w[p + "input_layernorm.weight"] = 1 + rng.normal(0, 0.1, D)
        w[p + "post_attention_layernorm.weight"] = 1 + rng.normal(0, 0.1, D)
    write_safetensors(os.path.join(OUT, "model.safetensors"), w)

    from transformers import AutoTokenizer

    ht = AutoTokenizer.from_pretrained(OUT)
    exp = {"format": "spill-prompt-hf", "version": FORMAT_VERSION, "transformers": __import__("transformers").__version__,
           "bos_token": ht.bos_token, "eos_token": ht.eos_token, "chats": [], "completions": []}
    for cid, msgs in CHATS:
        text = ht.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
        got = ht.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
        got = got["input_ids"] if isinstance(got, dict) or hasattr(got, "keys") else got
        exp["chats"].append({"id": cid, "messages": msgs, "text": text, "ids": list(got)})
    for text in COMPLETIONS:
        exp["completions"].append({"text": text, "ids": ht(text)["input_ids"]})
    exp["special_cases"] = special_cases(added)
    with open(os.path.join(OUT, "expected.json"), "w", encoding="utf-8") as f:
        f.write(compact(exp) + "\n")
    print("wrote", OUT, "V =", V, "bos", repr(ht.bos_token), "eos", repr(ht.eos_token), file=sys.stderr)


if __name__ == "__main__":
    main()
