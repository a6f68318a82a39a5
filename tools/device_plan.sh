#!/usr/bin/env bash
# device_plan.sh — the GPU memory planner on the H200: one 8B-shaped bf16 model (spill synth), one job of
# 256 short rows, run with all the HBM and under --gpu-mem caps of 40, 24 and 12 GB.  Prints each run's
# pre-run line (the HBM plan) and done line, and checks that every split gives the same answers
# (streamed and resident layers run the same kernels on the same bytes).
# Expects the static build/cuda/spill-cuda in .carry/bin (carry .carry/bin).
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
B=.carry/bin/spill-cuda
M=/tmp/s8b.gguf
[ -f $M ] || { /usr/bin/time -f "synth %e s" $B synth --like llama3-8b --quant bf16 -o $M > "$OUT/synth.log" 2>&1; }
python3 - <<'PY'
import json
with open("/tmp/plan.jsonl", "w") as f:
    for i in range(256):
        f.write(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/completions",
                            "body": {"model": "s8b", "prompt": f"Row {i}: " + "lorem ipsum dolor " * (2 + i % 20),
                                     "max_tokens": 16, "temperature": 0}}) + "\n")
PY
for cap in all 40G 24G 12G; do
    extra=""; [ $cap != all ] && extra="--gpu-mem $cap"
    rm -rf /tmp/jp_$cap
    timeout 150 $B run $M /tmp/plan.jsonl -o /tmp/jp_$cap --gpu --batch 256 $extra > "$OUT/plan_$cap.log" 2>&1
    echo "cap $cap exit $?" >> "$OUT/plan_$cap.log"
done
python3 - > "$OUT/plan_compare.txt" 2>&1 <<'PY'
import json
def load(d):
    try:
        return {json.loads(l)["custom_id"]: json.loads(l)["response"]["body"]["choices"][0]["text"]
                for l in open(d + "/results.jsonl")}
    except OSError:
        return {}
ref = load("/tmp/jp_all")
for cap in ["40G", "24G", "12G"]:
    got = load(f"/tmp/jp_{cap}")
    same = sum(got.get(k) == v for k, v in ref.items())
    print(f"cap {cap}: {len(got)} rows, {same}/{len(ref)} identical to the uncapped run")
PY
grep -h -o "engine GPU[^·]*· KV[^·]*\|done:.*\|cap .* exit .*" "$OUT"/plan_*.log
cat "$OUT/plan_compare.txt"
