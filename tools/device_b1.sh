#!/usr/bin/env bash
# device_b1.sh — B1 through `spill run` on the H200: a 70B-shaped bf16 model (spill synth; 30 of its 80 layers,
# 55 GB: what the 64 GiB disk holds — B1 asks for 40), every layer streamed from pinned host RAM each pass,
# 1,024 rows of 128-token prompts, max_tokens 128.  Step `fixed`: --resident-layers 0 (HBM holds only the
# layers in flight); step `plan`: the HBM planner's own split.  Logs HBM use every 0.5 s.
# LAYERS=80 SPARSE=1 (the two-GPU machine, 256 GiB RAM, 128 GiB disk): all 80 layers (141 GB) from a sparse
# synth file whose layer matrices are holes (zeros on a small disk; globals and norms real) — throughput only.
# KV=int8: int8 KV pages (--kv-dtype int8).  PROMPT=1000: B5's long prompts (the summary gives passes carrying
# prefill against clean decode passes).
# Expects the static build/cuda/spill-cuda in .carry/bin (carry .carry/bin).
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
B=.carry/bin/spill-cuda
LAYERS=${LAYERS:-30}
SPARSE=${SPARSE:-0}
M=/tmp/s70b${LAYERS}$([ "$SPARSE" = 1 ] && echo -sparse).gguf
steps=${*:-fixed}
[ -f $M ] || { /usr/bin/time -f "synth %e s" $B synth --like llama3-70b --layers $LAYERS --quant bf16 \
    $([ "$SPARSE" = 1 ] && echo --sparse) -o $M > "$OUT/synth.log" 2>&1; }
# ROWS rows of PROMPT random token ids (default 1,024 x 128; PROMPT=1000 for the long-prompt tier), 128 new tokens
python3 - "${ROWS:-1024}" "${PROMPT:-128}" <<'PY'
import json, random, sys
rows, plen = int(sys.argv[1]), int(sys.argv[2])
random.seed(0)
with open("/tmp/b1.jsonl", "w") as f:
    for i in range(rows):
        f.write(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/completions",
                            "body": {"model": "s70b", "prompt": [random.randrange(300, 120000) for _ in range(plen)],
                                     "max_tokens": 128, "temperature": 0}}) + "\n")
PY
for step in $steps; do
    extra=""; [ $step = fixed ] && extra="--resident-layers 0 --stream"
    [ -n "${KV:-}" ] && extra="$extra --kv-dtype $KV"
    [ $step = plan ] && extra="--stream"
    nvidia-smi --query-gpu=timestamp,memory.used --format=csv,noheader -lms 500 > "$OUT/hbm_$step.csv" 2>/dev/null &
    smi=$!
    rm -rf /tmp/jb1_$step
    /usr/bin/time -v timeout ${B1_TIMEOUT:-500} $B run $M /tmp/b1.jsonl -o /tmp/jb1_$step --gpu --batch ${ROWS:-1024} $extra \
        --pass-log "$OUT/b1_${step}_passes.csv" > "$OUT/b1_$step.log" 2>&1
    echo "b1 $step exit $?" >> "$OUT/b1_$step.log"
    kill $smi
    python3 - "$OUT" "$step" <<'PY'
import csv, sys, statistics as st
out, step = sys.argv[1], sys.argv[2]
P = list(csv.DictReader(open(f"{out}/b1_{step}_passes.csv")))
clean = [float(p["seconds"]) for p in P if int(p["prefill_tokens"]) == 0]
pre = [p for p in P if int(p["prefill_tokens"]) > 0]
hbm = [int(l.split(",")[1].split()[0]) for l in open(f"{out}/hbm_{step}.csv") if "MiB" in l]
dec = sum(int(p["decode_tokens"]) for p in P)
pt = sum(int(p["prefill_tokens"]) for p in P)
tot = float(P[-1]["elapsed"])
full = [float(p["seconds"]) for p in P if int(p["prefill_tokens"]) == 0 and int(p["seqs"]) == max(int(q["seqs"]) for q in P)]
mixed = [float(p["seconds"]) for p in pre if int(p["decode_tokens"]) > 0]
if clean and mixed:
    print(f"{step}: passes carrying prefill and decode: median {st.median(mixed):.3f} s = "
          f"{st.median(mixed) / st.median(clean):.2f}x a clean decode pass")
if full:
    print(f"{step}: at the full batch ({max(int(p['seqs']) for p in P)} rows): {len(full)} clean passes, median "
          f"{st.median(full):.3f} s = {max(int(p['seqs']) for p in P) / st.median(full):.0f} tok/s")
print(f"{step}: {len(P)} passes, {tot:.1f} s; clean decode passes {len(clean)} median {st.median(clean):.3f} s; "
      f"prefill passes {len(pre)} ({pt} tokens, {pt / sum(float(p['seconds']) for p in pre):.0f} tok/s); "
      f"decode {dec} tokens = {dec / tot:.0f} tok/s overall; rows per pass max {max(int(p['seqs']) for p in P)}; "
      f"peak HBM {max(hbm) if hbm else 0} MiB")
PY
done 2>&1 | tee "$OUT/b1_summary.txt"
grep -h "engine GPU\|done:\|exit\|Maximum resident" "$OUT"/b1_*.log | cut -c1-400
