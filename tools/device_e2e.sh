#!/usr/bin/env bash
# device_e2e.sh — one run on the GPU machine: `spill run` end to end on the GPU
# (tiny SmolLM2-vocabulary fixture, GPU vs CPU answers) and benchmark B3
# (HF accelerate offload vs spill streaming the same 8B-shaped checkpoint).
# Expects the static build/cuda/spill-cuda copied to .carry/bin (carry .carry/bin).
#   tools/device_e2e.sh [e2e] [b3] [b5]
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
B=.carry/bin/spill-cuda
steps=${*:-e2e b3}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/machine.txt" 2>&1
nproc >> "$OUT/machine.txt"; free -g >> "$OUT/machine.txt"

if [[ " $steps " == *" e2e "* ]]; then
    python3 - <<'PY'
import json
with open("/tmp/e2e.jsonl", "w") as f:
    for i in range(64):
        body = {"model": "tiny", "messages": [{"role": "user", "content": f"Question {i} about {i*37%1000}."}],
                "max_tokens": 8 + i % 24, "temperature": 0}
        if i % 4 == 1:
            body.update(temperature=0.8, seed=i)
        f.write(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}) + "\n")
PY
    { $B run tests/data/tiny/tiny-smollm2.gguf /tmp/e2e.jsonl -o /tmp/jg --gpu --batch 16;
      echo "exit $?";
      $B run tests/data/tiny/tiny-smollm2.gguf /tmp/e2e.jsonl -o /tmp/jc --cpu --batch 16 --quiet;
      echo "exit $?"; } > "$OUT/e2e.log" 2>&1
    python3 - >> "$OUT/e2e.log" 2>&1 <<'PY'
import json
def load(d):
    out = {}
    for l in open(d + "/results.jsonl"):
        o = json.loads(l); b = o["response"]["body"]
        out[o["custom_id"]] = [c["message"]["content"] for c in b["choices"]]
    return out
g, c = load("/tmp/jg"), load("/tmp/jc")
same = sum(g[k] == c.get(k) for k in g)
print(f"GPU rows {len(g)}, CPU rows {len(c)}, identical answers {same}/{len(g)}")
PY
    cp /tmp/jg/manifest.json "$OUT/e2e_gpu_manifest.json" 2>/dev/null
fi

if [[ " $steps " == *" b3 "* ]]; then
    mkdir -p /tmp/b3model
    cp tests/data/tok/smollm2.tokenizer.json /tmp/b3model/tokenizer.json
    PYTHONUNBUFFERED=1 timeout ${B3_TIMEOUT:-420} python3 tools/b3_accelerate.py /tmp/b3model "$OUT/b3" "$B" --cap-gib 6 \
        --batch 64 --big ${B3_BIG:-1024} > "$OUT/b3.log" 2>&1
    echo "b3 exit $?" >> "$OUT/b3.log"

fi
if [[ " $steps " == *" b5 "* ]]; then
    [ -f /tmp/b3model/config.json ] || { echo "b5 needs the b3 model"; exit 1; }
    PYTHONUNBUFFERED=1 timeout 300 python3 tools/b5_refill.py /tmp/b3model "$OUT/b5" "$B" --rows 384 --batch 192 \
        --chunk 2048 > "$OUT/b5.log" 2>&1
    echo "b5 exit $?" >> "$OUT/b5.log"
fi
ls -la "$OUT" "$OUT/b3" "$OUT/b5" 2>/dev/null
