#!/usr/bin/env python3
"""Reference outputs of llama.cpp (llama-cpp-python, built from source) for a
real GGUF model: tests/data/llamacpp/NAME.json (smollm2.json for the default
model SmolLM2-135M-Instruct Q4_1, gemma3.json for gemma3:270m).

For 20 chat prompts (rendered by jinja2 with the model's own template, or, for
a file that has none, spill's built-in src/model/templates/<arch>.jinja — the
one spill renders for that curated file; tokenized by llama.cpp): llama.cpp's
greedy generation (stops at any end-of-generation token llama.cpp declares:
EOS, Gemma's <end_of_turn>, ...; at most 128 tokens), and a teacher-forced pass
over prompt + 128 greedy tokens (those stop tokens suppressed) that records, at
every position, llama.cpp's top-1 token and the log-prob of the next forced
token.  tests/test_llamacpp.c feeds spill the same sequences.

    pip install llama-cpp-python jinja2 gguf     (tools/setup.sh --refs)
    python3 tools/gen_llamacpp_ref.py ~/.streamweights/models/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf smollm2
    python3 tools/gen_llamacpp_ref.py ~/.streamweights/models/gemma3-270m/gemma-3-270m-q4_k_m.gguf gemma3
(smollm2.json also carries "fp32", added afterwards by tools/gen_fp32_ref.py.)
"""
import json
import os
import sys

import gguf
import jinja2
import numpy as np
import llama_cpp
from llama_cpp import Llama

NEW = 128

QUESTIONS = [
    "What is the capital of France?", "Write a haiku about the sea.", "Explain photosynthesis in one sentence.",
    "List three prime numbers.", "What is 17 plus 25?", "Translate 'good morning' into Spanish.",
    "Give me a tip for learning to code.", "Why is the sky blue?", "Name a famous painter.",
    "What does a compiler do?", "Describe a cat in five words.", "How many legs does a spider have?",
    "Suggest a name for a bakery.", "What is the boiling point of water?", "Summarise the plot of Cinderella.",
    "Who wrote Romeo and Juliet?", "What is machine learning?", "Give an example of a renewable energy source.",
    "Write one sentence about autumn.", "What is the largest planet in our solar system?",
]


def gguf_str(r, key):
    f = r.fields.get(key)
    return bytes(f.parts[f.data[0]]).decode() if f else None


def template_of(r):
    """(template source, where it came from): the GGUF's own, else spill's built-in for its architecture."""
    t = gguf_str(r, "tokenizer.chat_template")
    if t is not None:
        return t, "gguf tokenizer.chat_template"
    path = os.path.join("src", "model", "templates", gguf_str(r, "general.architecture") + ".jinja")
    with open(path, encoding="utf-8", newline="") as fh:
        return fh.read(), path


def raise_exception(msg):
    raise jinja2.exceptions.TemplateError(msg)


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: gen_llamacpp_ref.py MODEL.gguf NAME   (writes tests/data/llamacpp/NAME.json)")
    model, name = sys.argv[1], sys.argv[2]
    out_path = os.path.join("tests", "data", "llamacpp", name + ".json")
    r = gguf.GGUFReader(model)
    src, where = template_of(r)
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    t = env.from_string(src)
    llm = Llama(model_path=model, n_ctx=512, n_threads=2, n_batch=512, logits_all=True, verbose=False, seed=0)
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    n_vocab = llm.n_vocab()
    stops = [i for i in range(n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, i)]
    piece = lambda i: llm.detokenize([i], special=True).decode(errors="replace")
    # the template's special tokens as spill passes them for a GGUF: the pieces of the bos/eos ids
    specials = {"bos_token": piece(llm.token_bos()), "eos_token": piece(llm.token_eos())}
    out = {"model": os.path.basename(model), "template": where, "new_tokens": NEW,
           "llama_cpp_python": llama_cpp.__version__, "stop_ids": stops, "prompts": []}
    for q in QUESTIONS:
        text = t.render(messages=[{"role": "user", "content": q}], add_generation_prompt=True, **specials)
        ids = llm.tokenize(text.encode(), add_bos=False, special=True)
        # greedy generation, stopping at an end-of-generation token
        llm.reset()
        greedy = []
        for tok in llm.generate(ids, temp=0.0, top_k=1, top_p=1.0, repeat_penalty=1.0, reset=True):
            if tok in stops or len(greedy) >= NEW:
                break
            greedy.append(tok)
        # teacher-forced sequence: prompt + 128 greedy tokens with the stop tokens suppressed
        llm.reset()
        llm.eval(ids)
        seq = list(ids)
        for _ in range(NEW):
            logits = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float64)
            logits[stops] = -np.inf
            nxt = int(np.argmax(logits))
            seq.append(nxt)
            llm.eval([nxt])
        scores = np.array(llm.scores[: len(seq)], dtype=np.float64)  # (len(seq), V) logits
        lse = np.log(np.exp(scores - scores.max(axis=1, keepdims=True)).sum(axis=1)) + scores.max(axis=1)
        top1 = scores.argmax(axis=1).tolist()
        lp = [float(scores[i, seq[i + 1]] - lse[i]) for i in range(len(seq) - 1)]
        out["prompts"].append({"question": q, "n_prompt": len(ids), "ids": seq, "greedy": greedy,
                               "top1": top1[:len(seq) - 1], "logprob_next": lp})
        print(q, len(ids), len(greedy), repr(llm.detokenize(greedy).decode(errors="replace")[:80]), flush=True)
    os.makedirs(os.path.dirname(out_path), exist_ok=True)
    with open(out_path, "w") as fh:
        json.dump(out, fh, separators=(",", ":"))


if __name__ == "__main__":
    main()
