#!/usr/bin/env python3
"""Validates spill output lines (results.jsonl / errors.jsonl) with the
official `openai` package's types (pip install openai).

usage: python3 tools/check_output_schema.py FILE.jsonl [...]

For each line:
  - envelope (openai-python has no BatchRequestOutput type; formats.md §1.2):
    keys id ("batch_req_…"), custom_id (str), response, error, optional spill;
    exactly one of response / error is non-null unless response is an HTTP
    error (status >= 400), in which case error is null;
  - body of a 200 response: openai.types.chat.ChatCompletion,
    openai.types.Completion or (object "list") openai.types.CreateEmbeddingResponse
    via pydantic model_validate, and no key the type does not declare anywhere
    in the tree (the models allow extras, so a misspelt key would otherwise
    pass silently); a base64 embedding (encoding_format "base64": a string
    where the type has List[float]) must decode to whole little-endian float32
    values, which are checked in its place, as the openai client decodes them;
  - body of a 4xx/5xx response: {"error": openai.types.shared.ErrorObject};
  - non-HTTP error: {code: str, message: str}.
Exits 1 on the first bad line, printing file:line and the reason.

tests/test_output.c writes its lines to $SPILL_OUTPUT_SAMPLES when set:
  SPILL_OUTPUT_SAMPLES=/tmp/s.jsonl build/asan/tests/test_output && python3 tools/check_output_schema.py /tmp/s.jsonl
"""
import base64
import json
import struct
import sys

import pydantic
from openai.types import Completion, CreateEmbeddingResponse
from openai.types.chat import ChatCompletion
from openai.types.shared import ErrorObject


def no_extras(m, path="body"):
    if isinstance(m, pydantic.BaseModel):
        extra = getattr(m, "__pydantic_extra__", None) or {}
        if extra:
            raise ValueError(f"{path}: keys not in the openai type: {sorted(extra)}")
        for name in type(m).model_fields:
            no_extras(getattr(m, name), f"{path}.{name}")
    elif isinstance(m, list):
        for i, x in enumerate(m):
            no_extras(x, f"{path}[{i}]")


def echo_first_null(body):
    """An echo + logprobs completion's first prompt token has no log-prob: the API (and vLLM) send null for it in
    token_logprobs and top_logprobs, which openai-python's Completion type does not allow (its lists hold floats
    and dicts only).  Only that first entry may be null (an echoed prompt's first token);
    it is replaced by a placeholder for the type check and every other entry is checked as it is."""
    body = json.loads(json.dumps(body))
    for ch in body.get("choices") or []:
        lp = ch.get("logprobs")
        if not isinstance(lp, dict):
            continue
        tl, tt = lp.get("token_logprobs"), lp.get("top_logprobs")
        if isinstance(tl, list) and tl and tl[0] is None:
            tl[0] = 0.0
            if isinstance(tt, list) and tt and tt[0] is None:
                tt[0] = {}
    return body


def embeddings_decoded(body):
    """A CreateEmbeddingResponse body with each base64 embedding replaced by the float32 list it encodes."""
    body = json.loads(json.dumps(body))
    for d in body.get("data") or []:
        e = d.get("embedding") if isinstance(d, dict) else None
        if isinstance(e, str):
            raw = base64.b64decode(e, validate=True)
            if len(raw) % 4:
                raise ValueError(f"base64 embedding {d.get('index')} is {len(raw)} bytes, not whole float32 values")
            d["embedding"] = list(struct.unpack(f"<{len(raw) // 4}f", raw))
    return body


def check_line(obj):
    if not isinstance(obj, dict):
        raise ValueError("not an object")
    keys = set(obj)
    if not {"id", "custom_id", "response", "error"} <= keys or keys - {"id", "custom_id", "response", "error", "spill"}:
        raise ValueError(f"envelope keys {sorted(keys)}")
    if not (isinstance(obj["id"], str) and obj["id"].startswith("batch_req_")):
        raise ValueError("id must be a string starting with batch_req_")
    if not isinstance(obj["custom_id"], str):
        raise ValueError("custom_id must be a string")
    resp, err = obj["response"], obj["error"]
    if resp is None:
        if not (isinstance(err, dict) and set(err) == {"code", "message"}
                and all(isinstance(v, str) for v in err.values())):
            raise ValueError("response null needs error {code, message}")
        return "error"
    if err is not None:
        raise ValueError("response and error both set")
    if set(resp) != {"status_code", "request_id", "body"} or not isinstance(resp["status_code"], int):
        raise ValueError(f"response keys {sorted(resp)}")
    body = resp["body"]
    if resp["status_code"] == 200 and body.get("object") == "list":
        m = CreateEmbeddingResponse.model_validate(embeddings_decoded(body))
        no_extras(m)
        return "embedding list"
    if resp["status_code"] == 200:
        model = ChatCompletion if body.get("object") == "chat.completion" else Completion
        m = model.model_validate(echo_first_null(body) if model is Completion else body)
        no_extras(m)
        return body["object"]
    if not (400 <= resp["status_code"] <= 599) or set(body) != {"error"}:
        raise ValueError("non-200 response needs status 4xx/5xx and body {error}")
    e = ErrorObject.model_validate(body["error"])
    no_extras(e, "body.error")
    if set(body["error"]) != {"message", "type", "param", "code"}:
        raise ValueError(f"body.error keys {sorted(body['error'])}")
    return "http_error"


def main():
    counts = {}
    for path in sys.argv[1:]:
        with open(path, "rb") as f:
            for n, raw in enumerate(f, 1):
                try:
                    kind = check_line(json.loads(raw))
                except Exception as e:  # noqa: BLE001 — report any failure with its line
                    print(f"{path}:{n}: {e}")
                    return 1
                counts[kind] = counts.get(kind, 0) + 1
    print("ok:", ", ".join(f"{v} {k}" for k, v in sorted(counts.items())) or "no lines")
    return 0


if __name__ == "__main__":
    sys.exit(main())
