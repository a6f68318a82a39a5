#!/usr/bin/env python3
"""Reference outputs of llama.cpp (llama-cpp-python, built from source) for the
real default model, SmolLM2-135M-Instruct Q4_1: tests/data/llamacpp/smollm2.json.

For 20 chat prompts (rendered with the model's own template by jinja2, tokenized
by llama.cpp): llama.cpp's greedy generation (stops at EOS, at most 128 tokens),
and a teacher-forced pass over prompt + 128 greedy tokens (EOS suppressed) that
records, at every position, llama.cpp's top-1 token and the log-prob of the next
forced token.  tests/test_llamacpp.c feeds spill the same sequences.

    pip install llama-cpp-python jinja2 gguf     (tools/setup.sh --refs)
    python3 tools/gen_llamacpp_ref.py [MODEL.gguf]
"""
import json
import os
import sys

import gguf
import jinja2
import numpy as np
from llama_cpp import Llama

MODEL = sys.argv[1] if len(sys.argv) > 1 else os.path.expanduser(
    "~/.streamweights/models/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf")
OUT = "tests/data/llamacpp/smollm2.json"
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


def main():
    r = gguf.GGUFReader(MODEL)
    f = r.fields["tokenizer.chat_template"]
    tmpl = bytes(f.parts[f.data[0]]).decode()
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    t = env.from_string(tmpl)
    llm = Llama(model_path=MODEL, n_ctx=512, n_threads=2, n_batch=512, logits_all=True, verbose=False, seed=0)
    eos = llm.token_eos()
    out = {"model": os.path.basename(MODEL), "new_tokens": NEW, "llama_cpp_python": __import__("llama_cpp").__version__,
           "prompts": []}
    for q in QUESTIONS:
        text = t.render(messages=[{"role": "user", "content": q}], add_generation_prompt=True)
        ids = llm.tokenize(text.encode(), add_bos=False, special=True)
        # greedy generation, stopping at EOS
        llm.reset()
        greedy = []
        for tok in llm.generate(ids, temp=0.0, top_k=1, top_p=1.0, repeat_penalty=1.0, reset=True):
            if tok == eos or len(greedy) >= NEW:
                break
            greedy.append(tok)
        # teacher-forced sequence: prompt + 128 greedy tokens with EOS suppressed
        llm.reset()
        llm.eval(ids)
        seq = list(ids)
        for _ in range(NEW):
            logits = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float64)
            logits[eos] = -np.inf
            nxt = int(np.argmax(logits))
            seq.append(nxt)
            llm.eval([nxt])
        scores = np.array(llm.scores[: len(seq)], dtype=np.float64)  # (len(seq), V) logits
        lse = np.log(np.exp(scores - scores.max(axis=1, keepdims=True)).sum(axis=1)) + scores.max(axis=1)
        top1 = scores.argmax(axis=1).tolist()
        lp = [float(scores[i, seq[i + 1]] - lse[i]) for i in range(len(seq) - 1)]
        out["prompts"].append({"question": q, "n_prompt": len(ids), "ids": seq, "greedy": greedy,
                               "top1": top1[:len(seq) - 1], "logprob_next": lp})
        print(q, len(ids), len(greedy), flush=True)
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as fh:
        json.dump(out, fh, separators=(",", ":"))


if __name__ == "__main__":
    main()
