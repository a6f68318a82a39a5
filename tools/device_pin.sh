#!/usr/bin/env bash
# device_pin.sh — how long opening a streamed model takes, by pinning method: the 40-layer 70B shape (70 GB,
# sparse synth) with every layer streamed from pinned RAM, 16 rows of 64-token prompts, 4 new tokens, opened
# with the default (read into anonymous memory by several threads, then cudaHostRegister) and with
# SPILL_CUDA_PIN=alloc (cudaHostAlloc first, then the reads), alternating; the `weights:` lines give the split,
# and the answers of all runs must be identical.
# Expects the static build/cuda/spill-cuda in .carry/bin (carry .carry/bin).
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
B=.carry/bin/spill-cuda
M=/tmp/s70b40-sparse.gguf
[ -f $M ] || $B synth --like llama3-70b --layers ${LAYERS:-40} --quant bf16 --sparse -o $M > "$OUT/pin_synth.log" 2>&1
python3 - <<'PY'
import json, random
random.seed(1)
with open("/tmp/pin.jsonl", "w") as f:
    for i in range(16):
        f.write(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/completions",
                            "body": {"model": "s70b", "prompt": [random.randrange(300, 120000) for _ in range(64)],
                                     "max_tokens": 4, "temperature": 0}}) + "\n")
PY
for run in register1 alloc1 register2 alloc2; do
    env=""; [[ $run == alloc* ]] && env="SPILL_CUDA_PIN=alloc"
    rm -rf /tmp/jpin_$run
    /usr/bin/time -f "wall %e s, max RSS %M KB" env $env timeout 150 $B run $M /tmp/pin.jsonl -o /tmp/jpin_$run --gpu \
        --batch 16 --resident-layers 0 --stream > "$OUT/pin_$run.log" 2>&1
    echo "$run exit $?" >> "$OUT/pin_$run.log"
    echo "$run: $(grep -o 'ready in [0-9.]* s' "$OUT/pin_$run.log") · $(grep -h 'weights:' "$OUT/pin_$run.log" | grep -o 'at open.*') · $(tail -n 2 "$OUT/pin_$run.log" | tr '\n' ' ')"
done | tee "$OUT/pin_summary.txt"
python3 - >> "$OUT/pin_summary.txt" <<'PY'
import json, glob
ans = {}
for d in sorted(glob.glob("/tmp/jpin_*")):
    try:
        ans[d] = {json.loads(l)["custom_id"]: json.loads(l)["response"]["body"]["choices"][0]["text"]
                  for l in open(d + "/results.jsonl")}
    except OSError as e:
        ans[d] = str(e)
ref = next(iter(ans.values()))
print("answers identical across runs:", all(v == ref for v in ans.values()), {k: len(v) for k, v in ans.items()})
PY
tail -n 1 "$OUT/pin_summary.txt"
