#!/usr/bin/env python3
"""structured_check.py — structured output checked end to end by an independent validator.

Writes N chat rows (default 500) with response_format json_schema (five schemas in OpenAI's strict style:
every property required, additionalProperties false, strings bounded) and json_object, at temperature 1 with
a seed per row; runs `spill run` on them; then parses every answer with Python's json and validates it with
the `jsonschema` package (Draft 2020-12, formats checked: uuid, date, date-time, time).  Prints one line per
schema and a total: rows, finish reasons, parsed, valid, mean and max completion tokens.  Exit 1 when a row
that finished `stop` does not parse or validate, or a `length` row stopped short of max_tokens.

    .venv/bin/python tools/structured_check.py [--rows 500] [--model smollm2:135m] [--spill ./spill]
        [--out DIR] [--max-tokens 256] [--temperature 1] [--validate-only DIR] [-- extra spill run options]
    python3 tools/structured_check.py --docs FILE     (tests/test_grammar.c: documents the grammar accepted)

Needs: pip install jsonschema rfc3339-validator (the venv tools/setup.sh makes).
"""
import argparse, json, os, re, subprocess, sys, tempfile

import jsonschema

S = lambda n: {"type": "string", "maxLength": n}
OBJ = lambda props: {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}

SCHEMAS = {
    "person": OBJ({"name": S(40), "age": {"type": "integer", "minimum": 0, "maximum": 120},
                   "email": {"type": ["string", "null"], "maxLength": 60},
                   "status": {"enum": ["active", "inactive", "banned"]},
                   "tags": {"type": "array", "items": S(16), "maxItems": 3}}),
    "sentiment": OBJ({"label": {"enum": ["positive", "negative", "neutral"]}, "confidence": {"type": "number"},
                      "reason": S(80)}),
    "product": OBJ({"title": S(60), "price": {"type": "number"}, "in_stock": {"type": "boolean"},
                    "categories": {"type": "array", "minItems": 1, "maxItems": 3,
                                   "items": {"enum": ["food", "tools", "toys", "books", "garden", "other"]}},
                    "released": {"type": "string", "format": "date"}}),
    "event": OBJ({"id": {"type": "string", "format": "uuid"}, "start": {"type": "string", "format": "date-time"},
                  "attendees": {"type": "array", "maxItems": 3,
                                "items": OBJ({"name": S(30), "role": {"enum": ["host", "guest", "speaker"]}})},
                  "cancelled": {"type": "boolean"}}),
    "recipe": {"$defs": {"ingredient": OBJ({"item": S(30), "grams": {"type": "integer", "minimum": 0,
                                                                      "maximum": 2000}})},
               **OBJ({"dish": S(40), "servings": {"type": "integer", "minimum": 1, "maximum": 12},
                      "ingredients": {"type": "array", "minItems": 1, "maxItems": 4,
                                      "items": {"$ref": "#/$defs/ingredient"}},
                      "vegetarian": {"type": "boolean"}, "notes": {"anyOf": [S(80), {"type": "null"}]}})},
}
PROMPTS = {
    "person": ["Describe a fictional person.", "Make up a customer profile.", "Invent a user for a forum.",
               "Describe a teacher from Paris.", "Give me a profile of a retired pilot."],
    "sentiment": ["Classify: 'I loved this film, the cast was great.'", "Classify: 'The delivery was late again.'",
                  "Classify: 'It works. Nothing special.'", "Classify: 'Worst purchase of my life.'",
                  "Classify: 'What a lovely surprise this morning!'"],
    "product": ["Describe a garden hose for a shop.", "Describe a children's book for sale.",
                "Make a listing for a hammer.", "Describe a box of chocolates for a store.",
                "Make a product entry for a board game."],
    "event": ["Create a calendar event for a team meeting.", "Plan a birthday party entry.",
              "Make an event record for a conference talk.", "Describe a dinner reservation as an event.",
              "Create an event for a football match."],
    "recipe": ["Give me a recipe for pancakes.", "A simple tomato soup recipe.", "How do I make a salad?",
               "A recipe for chocolate cake.", "Write a recipe for rice and beans."],
    "json_object": ["Return a JSON object describing the weather today.", "Give a JSON object with two facts about cats.",
                    "Answer in JSON: what is the capital of France?", "Return JSON with a title and a year for a movie.",
                    "Give me a JSON object with a name and a city."],
}


def make_rows(n, max_tokens, temperature):
    kinds = list(SCHEMAS) + ["json_object"]
    rows = []
    for i in range(n):
        k = kinds[i % len(kinds)]
        p = PROMPTS[k][(i // len(kinds)) % len(PROMPTS[k])]
        rf = ({"type": "json_object"} if k == "json_object" else
              {"type": "json_schema", "json_schema": {"name": k, "schema": SCHEMAS[k], "strict": True}})
        rows.append({"custom_id": f"{k}-{i}", "method": "POST", "url": "/v1/chat/completions",
                     "body": {"model": "x", "messages": [{"role": "user", "content": p}], "max_tokens": max_tokens,
                              "temperature": temperature, "seed": i, "response_format": rf}})
    return rows


HOST_LABEL = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")


def is_hostname(s):
    """RFC 1123 host names (jsonschema checks "hostname" only with the fqdn package, which may be absent)."""
    return isinstance(s, str) and 0 < len(s) <= 253 and all(HOST_LABEL.match(x) for x in s.split("."))


def check_docs(path):
    """--docs FILE: lines {"schema": S, "doc": TEXT, "valid": bool}; each TEXT must parse, and validate under S
    (Draft 2020-12, formats checked; hostname by is_hostname) exactly when valid is true.  Exit 1 otherwise."""
    fc = jsonschema.FormatChecker()
    fc.checks("hostname")(is_hostname)
    n = bad = 0
    for line in open(path):
        o = json.loads(line)
        n += 1
        try:
            v = json.loads(o["doc"])
            jsonschema.Draft202012Validator(o["schema"], format_checker=fc).validate(v)
            ok, why = True, ""
        except (ValueError, jsonschema.ValidationError) as e:
            ok, why = False, getattr(e, "message", str(e))
        if ok != o.get("valid", True):
            bad += 1
            print(f"line {n}: {'valid' if ok else 'invalid'} ({why}), want {'valid' if o.get('valid', True) else 'invalid'}: {o['doc'][:300]!r}")
    print(f"docs: {n} checked, {bad} problems")
    sys.exit(1 if bad else 0)


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--docs":
        check_docs(sys.argv[2])
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=500)
    ap.add_argument("--model", default="smollm2:135m")
    ap.add_argument("--spill", default="./spill")
    ap.add_argument("--out")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--validate-only")
    ap.add_argument("extra", nargs="*")
    a = ap.parse_args()
    out = a.validate_only or a.out or tempfile.mkdtemp(prefix="structured_")
    if not a.validate_only:
        os.makedirs(out, exist_ok=True)
        inp = os.path.join(out, "input.jsonl")
        with open(inp, "w") as f:
            for r in make_rows(a.rows, a.max_tokens, a.temperature):
                f.write(json.dumps(r) + "\n")
        cmd = [a.spill, "run", a.model, inp, "-o", os.path.join(out, "job"), "--quiet"] + a.extra
        print("$", " ".join(cmd), flush=True)
        rc = subprocess.run(cmd).returncode
        if rc:
            sys.exit(f"spill run exited {rc}")
    job = os.path.join(out, "job") if os.path.isdir(os.path.join(out, "job")) else out
    fc = jsonschema.FormatChecker()
    stats, bad = {}, 0
    for line in open(os.path.join(job, "results.jsonl")):
        o = json.loads(line)
        k = o["custom_id"].rsplit("-", 1)[0]
        b = o["response"]["body"]
        ch = b["choices"][0]
        fin, ntok, text = ch["finish_reason"], b["usage"]["completion_tokens"], ch["message"]["content"]
        s = stats.setdefault(k, {"rows": 0, "stop": 0, "length": 0, "parsed": 0, "valid": 0, "tok": [], "tok_stop": []})
        s["rows"] += 1
        s[fin] = s.get(fin, 0) + 1
        s["tok"].append(ntok)
        if fin != "stop":
            if ntok != a.max_tokens:
                bad += 1
                print(f"{o['custom_id']}: finish {fin} after {ntok} tokens")
            continue
        s["tok_stop"].append(ntok)
        try:
            v = json.loads(text)
            s["parsed"] += 1
        except ValueError as e:
            bad += 1
            print(f"{o['custom_id']}: does not parse ({e}): {text[:300]!r}")
            continue
        try:
            if k == "json_object":
                if not isinstance(v, dict):
                    raise jsonschema.ValidationError("not an object")
            else:
                jsonschema.Draft202012Validator(SCHEMAS[k], format_checker=fc).validate(v)
            s["valid"] += 1
        except jsonschema.ValidationError as e:
            bad += 1
            print(f"{o['custom_id']}: does not validate ({e.message}): {text[:300]!r}")
    n_err = sum(1 for _ in open(os.path.join(job, "errors.jsonl"))) if os.path.exists(os.path.join(job, "errors.jsonl")) else 0
    tot = {"rows": 0, "stop": 0, "length": 0, "parsed": 0, "valid": 0, "tok": [], "tok_stop": []}
    print(f"{'schema':12} {'rows':>5} {'stop':>5} {'length':>6} {'parsed':>6} {'valid':>6} {'mean tok':>8} "
          f"{'mean stop':>9} {'max':>4}")
    for k, s in sorted(stats.items()) + [("total", tot)]:
        if k != "total":
            for f in tot:
                tot[f] += s[f]
        mt = sum(s["tok"]) / max(1, len(s["tok"]))
        ms = sum(s["tok_stop"]) / max(1, len(s["tok_stop"]))
        print(f"{k:12} {s['rows']:5} {s['stop']:5} {s['length']:6} {s['parsed']:6} {s['valid']:6} {mt:8.1f} "
              f"{ms:9.1f} {max(s['tok'] or [0]):4}")
    print(f"errors.jsonl: {n_err} lines; problems: {bad}")
    sys.exit(1 if bad or n_err else 0)


if __name__ == "__main__":
    main()
