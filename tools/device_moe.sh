#!/usr/bin/env bash
# device_moe.sh — issue 12's MoE benchmarks on the H200 machine, in one call: for each shape (spill synth
# --like mixtral-8x7b / qwen3-30b-a3b, q8, --sparse: layer matrices are holes, so the file takes no disk and the
# pinned arena fills fast; routers and norms are real, so routing is varied), a spill run on the GPU with every
# layer streamed from pinned RAM (--resident-layers 0) at 256, 1024 and 4096 rows, and a small job (1, 4, 16
# rows) whose expert visits show what reading only the hit experts would save.  Writes under $OUT: the pass
# logs, the runs' output, and summary.txt (tools/moe_report.py: pass time against streamed bytes / 55 GB/s,
# tok/s at each batch).
#   run(command="tar -xJf .carry/pack.tar.xz && OUT=$OUT tools/device_moe.sh", carry=[".carry/pack.tar.xz"])
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/results/moe-local}
. tools/device_env.sh  # log, runlog, LD_LIBRARY_PATH, BIN, SPILL_HOME
W=/tmp/moe
mkdir -p $W
rows() { # rows N FILE: N completions rows of short prompts, up to 8 tokens each
    python3 - "$1" "$2" <<'EOF'
import json, sys
n, path = int(sys.argv[1]), sys.argv[2]
with open(path, "w") as f:
    for i in range(n):
        f.write(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/completions",
                            "body": {"model": "m", "prompt": f"row {i} of {n}: the", "max_tokens": 8,
                                     "temperature": 0}}) + "\n")
EOF
}
for shape in ${SHAPES:-mixtral-8x7b qwen3-30b-a3b}; do
    log "synth $shape"
    timeout 120 $BIN/spill-cuda synth --like $shape --quant q8 --sparse -o $W/$shape.gguf > "$OUT/$shape-synth.log" 2>&1
    $BIN/spill-cuda models show $W/$shape.gguf > "$OUT/$shape-show.txt" 2>&1
    for n in ${BATCHES:-1 4 16 256 1024 4096}; do
        rows $n $W/in$n.jsonl
        rm -rf $W/job
        log "$shape rows=$n"
        timeout 240 $BIN/spill-cuda run $W/$shape.gguf $W/in$n.jsonl -o $W/job --gpu --stream --resident-layers 0 --batch $n \
            --pass-log "$OUT/$shape-$n-passes.csv" > "$OUT/$shape-$n.log" 2>&1
        log "rc=$? $(tail -1 "$OUT/$shape-$n.log")"
    done
    rm -f $W/$shape.gguf
done
python3 tools/moe_report.py "$OUT" > "$OUT/summary.txt" 2>&1
cat "$OUT/summary.txt"
