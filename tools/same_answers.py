#!/usr/bin/env python3
"""Compares two spill results.jsonl files row by row, by custom_id, ignoring what differs between runs by design
(line and response ids, created timestamps, the run stamp): each row's status, choices (text, finish_reason,
logprobs) and usage must be identical — usage's prompt_tokens_details aside: cached_tokens says how the schedule
shared prefixes (and is 0 with --prefix-cache off), not what the row answered.

usage: python3 tools/same_answers.py A/results.jsonl B/results.jsonl   (exit 1 and the first differences otherwise)
"""
import json
import sys


def rows(path):
    out = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            o = json.loads(line)
            r = o.get("response") or {}
            b = r.get("body") or {}
            usage = dict(b.get("usage") or {})
            usage.pop("prompt_tokens_details", None)
            out[o["custom_id"]] = (r.get("status_code"), b.get("choices"), usage, o.get("error"))
    return out


a, b = rows(sys.argv[1]), rows(sys.argv[2])
diff = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
print(f"{len(a)} and {len(b)} rows; {len(a.keys() & b.keys()) - len([k for k in diff if k in a and k in b])} identical, "
      f"{len(diff)} different or missing")
for k in diff[:5]:
    print(f"  {k}:\n    {str(a.get(k))[:300]}\n    {str(b.get(k))[:300]}")
sys.exit(1 if diff else 0)
