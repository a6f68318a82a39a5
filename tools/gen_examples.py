#!/usr/bin/env python3
"""Generates examples/sample-20.jsonl and examples/eval-2000.jsonl (OpenAI Batch lines).

The 2,000-row eval mirrors the prototype's job: a third short QA, a third
summarisation, a third document QA over ~1,000-token synthetic documents;
max_tokens 128; every QA row carries `expected` so `spill eval` can score it.
Everything is built from small word tables with a fixed seed: no copied text.
"""
import json
import random
import sys

R = random.Random(20261130)
MODEL = "smollm2:135m"

COUNTRIES = [("France", "Paris"), ("Japan", "Tokyo"), ("Italy", "Rome"), ("Spain", "Madrid"), ("Egypt", "Cairo"),
             ("Canada", "Ottawa"), ("Kenya", "Nairobi"), ("Peru", "Lima"), ("Norway", "Oslo"), ("Chile", "Santiago"),
             ("Germany", "Berlin"), ("India", "New Delhi"), ("Brazil", "Brasilia"), ("Greece", "Athens"),
             ("Poland", "Warsaw"), ("Ireland", "Dublin"), ("Portugal", "Lisbon"), ("Austria", "Vienna")]
NAMES = ["Ada", "Bruno", "Chen", "Dalia", "Emeka", "Farah", "Goran", "Hana", "Ivo", "Jun", "Kofi", "Lena", "Mateo",
         "Nadia", "Omar", "Priya", "Quinn", "Rosa", "Sven", "Tala"]
TOWNS = ["Brackenford", "Millhaven", "Eastmoor", "Larkspur", "Westvale", "Thornbury", "Ashcombe", "Redwater"]
THINGS = ["bridge", "library", "market", "observatory", "harbour", "orchard", "railway", "museum", "mill", "school"]
VERBS = ["built", "repaired", "expanded", "designed", "funded", "opened", "renamed", "moved"]
ADJ = ["old", "narrow", "busy", "quiet", "tall", "wooden", "stone", "bright", "small", "famous"]
TOPICS = ["the weekly farmers' market", "a new bicycle lane", "the town's water supply", "a school science fair",
          "the winter festival", "a flood on the river", "the library's late opening hours", "a local football match"]


def chat(cid, user, max_tokens=128, system=None, expected=None):
    msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
    line = {"custom_id": cid, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": MODEL, "messages": msgs, "max_tokens": max_tokens, "temperature": 0}}
    if expected is not None:
        line["expected"] = expected
    return line


def short_qa(i):
    kind = R.randrange(3)
    if kind == 0:
        c, cap = R.choice(COUNTRIES)
        return chat(f"qa-{i}", f"What is the capital of {c}? Answer with the city name only.", expected=cap)
    if kind == 1:
        a, b = R.randrange(2, 99), R.randrange(2, 99)
        return chat(f"qa-{i}", f"What is {a} plus {b}? Reply with just the number.", expected=str(a + b))
    n = R.choice(NAMES)
    k = R.randrange(3, 12)
    return chat(f"qa-{i}", f"{n} has {k} apples and eats one. How many apples are left? Reply with a number.",
                expected=str(k - 1))


def sentence():
    return (f"The {R.choice(ADJ)} {R.choice(THINGS)} in {R.choice(TOWNS)} was {R.choice(VERBS)} by "
            f"{R.choice(NAMES)} in {R.randrange(1850, 2024)}.")


def summarise(i):
    topic = R.choice(TOPICS)
    body = " ".join([f"Residents of {R.choice(TOWNS)} gathered to discuss {topic}."] +
                    [sentence() for _ in range(R.randrange(6, 14))])
    return chat(f"sum-{i}", f"Summarise the following report in two sentences.\n\n{body}")


def doc_qa(i):
    facts = [sentence() for _ in range(60)]  # ~1,000 tokens
    key_name, key_year = R.choice(NAMES), R.randrange(1850, 2024)
    key_town, key_thing = R.choice(TOWNS), R.choice(THINGS)
    facts.insert(R.randrange(len(facts)),
                 f"The {key_thing} in {key_town} was first opened by {key_name} in {key_year}.")
    doc = " ".join(facts)
    q = f"According to the document, in which year was the {key_thing} in {key_town} first opened by {key_name}?"
    return chat(f"doc-{i}", f"Read the document and answer the question.\n\nDocument:\n{doc}\n\nQuestion: {q}",
                system="Answer using only the document. Reply with the year.", expected=str(key_year))


def write(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "examples"
    rows = [short_qa(i) for i in range(667)] + [summarise(i) for i in range(667)] + [doc_qa(i) for i in range(666)]
    write(f"{out}/eval-2000.jsonl", rows)
    sample = [short_qa(1000 + i) for i in range(8)] + [summarise(1000 + i) for i in range(8)] + \
             [doc_qa(1000 + i) for i in range(4)]
    for r in sample:  # the sample is a plain batch file: no eval column
        r.pop("expected", None)
    write(f"{out}/sample-20.jsonl", sample)


if __name__ == "__main__":
    main()
