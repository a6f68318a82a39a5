#!/usr/bin/env bash
# device_resident_q.sh — issue 18 item 3 on the H200: a quantized 70B that fits HBM whole stays resident.
#   run(command="tar -xJf .carry/pack.tar.xz && OUT=$OUT/resq tools/device_resident_q.sh", carry=[".carry/pack.tar.xz"])
# The 80-layer 70B shape in q4 (spill synth --quant q4 --sparse: ~40 GB; layer matrices are holes, so the bytes and
# the kernels' work are real, the values zeros), `spill run --gpu` with the planner's own split (no --stream): the
# pre-run line says what it picked; ROWS_LIST rows (default 1024 2048 4096) of 8 prompt tokens and 24 new ones; the
# full-batch decode passes' median s/pass from --pass-log, tok/s, against the HBM roofline (weights once per pass
# at 4.8 TB/s) and the GEMM time at the GEMM rate bench_fp8 measured for bf16 (~750-860 TF/s: run 28).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/results/device-resident-q}
. tools/device_env.sh
Q=${Q:-q4}
LAYERS=${LAYERS:-80}
ROWS_LIST=${ROWS_LIST:-1024 2048 4096}
M=/tmp/s70b-L$LAYERS-$Q-sparse.gguf
[ -f "$M" ] || runlog synth 600 "$BIN/spill-cuda" synth --like llama3-70b --layers "$LAYERS" --quant "$Q" --sparse -o "$M"
log "model $M: $(du -h --apparent-size "$M" | cut -f1)"
python3 - <<'PY'
import json, random
random.seed(0)
with open("/tmp/resq.jsonl", "w") as f:
    for i in range(4096):
        f.write(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/completions",
                            "body": {"model": "s70b", "prompt": [random.randrange(300, 120000) for _ in range(8)],
                                     "max_tokens": 24, "temperature": 0}}) + "\n")
PY
for r in $ROWS_LIST; do
    head -n "$r" /tmp/resq.jsonl > /tmp/resq_in.jsonl
    rm -rf /tmp/jresq
    runlog "run_$r" 300 "$BIN/spill-cuda" run "$M" /tmp/resq_in.jsonl -o /tmp/jresq --gpu --batch "$r" \
        --pass-log "$OUT/passes_$r.csv"
    grep -o "HBM plan[^·]*" "$OUT/run_$r.log" | head -1
    python3 - "$OUT" "$r" "$LAYERS" <<'PY' | tee -a "$OUT/summary.txt"
import csv, statistics, sys
out, rows, layers = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
P = list(csv.DictReader(open(f"{out}/passes_{rows}.csv")))
mx = max(int(p["seqs"]) for p in P)
full = [float(p["seconds"]) for p in P if int(p["seqs"]) == mx and int(p["prefill_tokens"]) == 0]
t = statistics.median(full)
params = layers * (8192 * (8192 + 2 * 1024 + 8192) + 3 * 8192 * 28672)
gemm = 2 * params * mx / 800e12
print(f"{rows} rows ({mx} in flight): median full-batch pass {t:.4f} s over {len(full)} passes = {mx / t:.0f} tok/s; "
      f"GEMMs at 800 TF/s {gemm:.4f} s, weights once from HBM ({params * 0.5625 / 1e9:.1f} GB q4 at 4.8 TB/s) "
      f"{params * 0.5625 / 4.8e12:.4f} s")
PY
done
grep -h "^spill run" "$OUT"/run_*.log | cut -c1-600 > "$OUT/prerun.txt"
rm -f "$M"
exit $FAILED
