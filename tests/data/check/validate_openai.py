#!/usr/bin/env python3
"""validate_openai.py — cross-checks the good batch corpus against the official
`openai` package's request types (pip install openai; skipped if absent).

Each good/*.jsonl batch body is validated with pydantic against
CompletionCreateParamsNonStreaming (chat or completions, by url); fine-tuning
lines' messages against ChatCompletionMessageParam.  The types are TypedDicts,
so this checks field types and shapes, not ranges or unknown keys (TypedDict
validation ignores extras) — the C corpus covers those.
Run from the repo root: python3 tests/data/check/validate_openai.py
"""
import glob, json, os, sys

try:
    import pydantic
    from openai.types.chat import completion_create_params as chat_params
    from openai.types.chat import ChatCompletionMessageParam
    from openai.types import completion_create_params as compl_params
except ImportError as e:
    print("skipped: %s" % e)
    sys.exit(0)

HERE = os.path.dirname(os.path.abspath(__file__))
chat = pydantic.TypeAdapter(chat_params.CompletionCreateParamsNonStreaming)
compl = pydantic.TypeAdapter(compl_params.CompletionCreateParamsNonStreaming)
msgs = pydantic.TypeAdapter(list[ChatCompletionMessageParam])
n = bad = 0
for path in sorted(glob.glob(os.path.join(HERE, "good", "*.jsonl"))):
    with open(path, encoding="utf-8", newline="") as f:
        for i, raw in enumerate(f, 1):
            line = raw.strip()
            if not line:
                continue
            o = json.loads(line)
            try:
                if "body" in o:
                    assert o["method"] == "POST" and isinstance(o["custom_id"], str) and o["custom_id"]
                    (chat if o["url"] == "/v1/chat/completions" else compl).validate_python(o["body"], strict=False)
                else:
                    m = [{k: v for k, v in x.items() if k != "weight"} for x in o["messages"]]  # FT-only field
                    msgs.validate_python(m)
                n += 1
            except Exception as e:  # noqa: BLE001 — report and count any rejection
                bad += 1
                print("%s line %d: rejected by openai types: %s" % (os.path.basename(path), i, str(e)[:300]))
print("openai %s: %d good lines validated, %d rejected" % (__import__("openai").__version__, n, bad))
sys.exit(1 if bad else 0)
