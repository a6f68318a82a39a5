#!/usr/bin/env python3
# test_metrics.c's scorer: reads the row metric_score sends (one JSON line on
# stdin), checks its shape, and prints 1 when the answer equals expected
# (trimmed, case-insensitive), else 0.  Expected values that start with
# "say:" print the rest verbatim instead (0.5, True, a log line then a score).
import json
import sys

row = json.loads(sys.stdin.read())
keys = set(row)
if keys not in ({"custom_id", "messages", "expected", "answer"}, {"custom_id", "prompt", "expected", "answer"}):
    print("unexpected keys %s" % sorted(keys), file=sys.stderr)
    sys.exit(3)
exp = row["expected"]
if isinstance(exp, str) and exp.startswith("say:"):
    sys.stdout.write(exp[4:])
    sys.exit(0)
print(1 if row["answer"].strip().lower() == str(exp).strip().lower() else 0)
