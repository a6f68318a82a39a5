#!/usr/bin/env python3
"""Writes the two inputs of the prefix-cache benchmark (bench/prefix_cpu.sh, issue 19) from
examples/eval-2000.jsonl's doc-QA rows:

  docqa-10x10.jsonl  10 documents x 10 questions each: each doc-* row's document (its system message, and the
                     first 15 sentences of its "Document:" block), asked ten questions about its own sentences ("The A B in C was
                     V by N in YEAR." -> "in which year was the B in C V by N?"), max_tokens 8, greedy;
  sys600-24.jsonl    24 chat rows sharing one ~600-token system prompt (32 sentences of five documents as a catalogue)
                     with short questions, 8 new tokens each, greedy — the issue's "as a user sees it" check.

usage: python3 tools/gen_prefix_inputs.py OUT_DIR   (deterministic: the same files every time)
"""
import json
import re
import sys

SENT = re.compile(r"The (\w+) (\w+) in (\w+) was (\w+) by (\w+) in (\d{4})\.")


def doc_rows(path):
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            o = json.loads(line)
            if o["custom_id"].startswith("doc-"):
                out.append(o)
    return out


def document_of(row):
    user = row["body"]["messages"][1]["content"]
    start = user.index("Document:\n") + len("Document:\n")
    end = user.index("\n\nQuestion:")
    return user[:start], user[start:end]


def row(cid, messages, max_tokens=8):
    return {"custom_id": cid, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "smollm2:135m", "messages": messages, "max_tokens": max_tokens, "temperature": 0}}


def main():
    out = sys.argv[1]
    docs = doc_rows("examples/eval-2000.jsonl")
    lines = []
    for d in range(10):
        src = docs[d]
        system = src["body"]["messages"][0]
        head, text = document_of(src)
        text = " ".join(m.group(0) for m in list(SENT.finditer(text))[:15])  # ~300 tokens: a CPU job of minutes
        facts = SENT.findall(text)
        for q in range(10):
            adj, noun, town, verb, who, _year = facts[q % len(facts)]
            question = f"According to the document, in which year was the {noun} in {town} {verb} by {who}?"
            lines.append(row(f"d{d}-q{q}", [system, {"role": "user", "content":
                                                    f"{head}{text}\n\nQuestion: {question}"}]))
    # the file a user would write: one row per question, documents in order
    with open(f"{out}/docqa-10x10.jsonl", "w", encoding="utf-8") as f:
        for o in lines:
            f.write(json.dumps(o) + "\n")

    sentences = [m.group(0) for k in range(5) for m in SENT.finditer(document_of(docs[10 + k])[1])]
    catalogue = " ".join(sentences[:32])  # ~600 tokens with the chat template's frame
    system = {"role": "system", "content": "You answer questions about this catalogue of buildings, with the year "
              "only.\n\nCatalogue:\n" + catalogue}
    facts = SENT.findall(catalogue)
    with open(f"{out}/sys600-24.jsonl", "w", encoding="utf-8") as f:
        for q in range(24):
            adj, noun, town, verb, who, _year = facts[(q * 7) % len(facts)]
            f.write(json.dumps(row(f"s{q}", [system, {"role": "user", "content":
                                                     f"When was the {adj} {noun} in {town} {verb}?"}])) + "\n")


if __name__ == "__main__":
    main()
