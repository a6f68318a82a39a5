#!/usr/bin/env bash
# device_b3big.sh — spill's side of B3 at its best batch without re-running the peer (when device time is
# short): the 8B-shaped bf16 model from `spill synth` (the B2 model, same shapes as tools/b3_accelerate.py's
# checkpoint), 2,048 rows of 128 random token ids, 8 new tokens, greedy; prompt chunks of 16,384 tokens,
# KV for every row at once, segment profile on (SPILL_CUDA_PROF=1).  Compare with the accelerate figures
# measured by tools/b3_accelerate.py on the same machine type.
# Expects the static build/cuda/spill-cuda in .carry/bin (carry .carry/bin).
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
B=.carry/bin/spill-cuda
M=/tmp/s8b.gguf
ROWS=${1:-2048}
[ -f $M ] || /usr/bin/time -f "synth %e s" $B synth --like llama3-8b --quant bf16 -o $M > "$OUT/synth.log" 2>&1
sync
python3 - "$ROWS" <<'PY'
import json, random, sys
random.seed(0)
with open("/tmp/b3big.jsonl", "w") as f:
    for i in range(int(sys.argv[1])):
        f.write(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/completions",
                            "body": {"model": "s8b", "prompt": [random.randrange(3, 49000) for _ in range(128)],
                                     "max_tokens": 8, "temperature": 0}}) + "\n")
PY
rm -rf /tmp/jb3big
SPILL_CUDA_PROF=1 timeout 200 $B run $M /tmp/b3big.jsonl -o /tmp/jb3big --gpu --stream --batch "$ROWS" \
    --prefill-chunk 16384 --kv-mem 110G --pass-log "$OUT/b3big_passes.csv" > "$OUT/b3big.log" 2>&1
echo "b3big exit $?" >> "$OUT/b3big.log"
grep -h "done:" "$OUT/b3big.log"
