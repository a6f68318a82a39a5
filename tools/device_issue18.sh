#!/usr/bin/env bash
# device_issue18.sh — issue 18's dequantizer on the H200 machine (run from the repo root after
# tar -xJf .carry/pack.tar.xz; binaries from tools/device_build.sh):
#   kernels bench_dequant: each type's dequant alone (block vs generic kernel: ms, GB/s read and written, TB/s) on
#          70B-shaped matrices, and the bf16 cuBLAS GEMM of the same shapes at 2,048 and 4,096 rows
#   tests  the GPU tests (tools/cuda_device_run.sh tests): every type's GPU dequant = quant_dequant_row bit for bit
#   dq     a 70B-shaped sparse model (spill synth --like llama3-70b, LAYERS of its layers, q4 and q8), every layer
#          streamed from pinned RAM each pass (--gpu --stream --resident-layers 0), ROWS rows of 8 prompt tokens
#          and 24 new tokens; the same job with the block dequantizer (default) and the generic one
#          (SPILL_DEQUANT=generic) in one call: the full-batch decode passes' median time against the layer
#          bytes / 55 GB/s.  ROWS may list several batch sizes (each its own job); KINDS (default "block generic")
#          the dequantizers to run; QUANTS (default "q4 q8").
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/results/issue18-local}
. tools/device_env.sh  # log, runlog, LD_LIBRARY_PATH, BIN, SPILL_HOME
B=.carry/bin/spill-cuda
LAYERS=${LAYERS:-16}
ROWS=${ROWS:-2048}
KINDS=${KINDS:-block generic}
QUANTS=${QUANTS:-q4 q8}
for s in ${*:-tests dq}; do
    case $s in
    kernels)
        timeout 300 .carry/bin/bench_dequant --json "$OUT/bench_dequant.jsonl" > "$OUT/bench_dequant.txt" 2>&1
        log "bench_dequant rc=$?"
        cat "$OUT/bench_dequant.txt"
        ;;
    tests)
        OUT=$OUT/tests tools/cuda_device_run.sh tests > "$OUT/tests_run.log" 2>&1; log "tests rc=$?"
        grep -E "checks" "$OUT/tests/tests.log" | tail -5
        ;;
    dq)
        for q in $QUANTS; do
            M=/tmp/s70b-$q.gguf
            [ -f $M ] || timeout 200 $B synth --like llama3-70b --layers $LAYERS --quant $q --sparse -o $M \
                > "$OUT/synth_$q.log" 2>&1
            log "synth $q rc=$? $(du -h --apparent-size $M | cut -f1)"
            for rows in $ROWS; do
            python3 - "$rows" <<'PY'
import json, random, sys
random.seed(0)
with open("/tmp/dq.jsonl", "w") as f:
    for i in range(int(sys.argv[1])):
        f.write(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/completions",
                            "body": {"model": "s70b", "prompt": [random.randrange(300, 120000) for _ in range(8)],
                                     "max_tokens": 24, "temperature": 0}}) + "\n")
PY
            for k in $KINDS; do
                rm -rf /tmp/jdq
                e=""; [ $k = generic ] && e="SPILL_DEQUANT=generic"
                env $e timeout 200 $B run $M /tmp/dq.jsonl -o /tmp/jdq --gpu --stream --resident-layers 0 \
                    --batch $rows --pass-log "$OUT/passes_${q}_${k}_$rows.csv" > "$OUT/run_${q}_${k}_$rows.log" 2>&1
                log "$q $k $rows rc=$?"
                grep -E "^done|weights" "$OUT/run_${q}_${k}_$rows.log" | tail -2
            done
            python3 - "$OUT" "$q" "$rows" "$LAYERS" "$KINDS" <<'PY'
import csv, json, re, statistics, sys
out, q, rows, layers, kinds = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5].split()
with open(f"{out}/summary.txt", "a") as f, open(f"{out}/weights-speed.jsonl", "a") as js:
    for k in kinds:
        try:
            P = list(csv.DictReader(open(f"{out}/passes_{q}_{k}_{rows}.csv")))
            gb = float(re.search(r"weights: ([0-9.]+) GB streamed per pass", open(f"{out}/run_{q}_{k}_{rows}.log").read()).group(1))
        except (OSError, AttributeError):
            continue
        full = [float(p["seconds"]) for p in P if int(p["seqs"]) == rows and int(p["prefill_tokens"]) == 0]
        if not full:
            continue
        t, limit = statistics.median(full), gb * 1e9 / 55e9
        line = (f"{q} {k}: {layers} layers, {rows} rows, median full-batch decode pass {t*1e3:.1f} ms over {len(full)} "
                f"passes; {gb:.2f} GB streamed / 55 GB/s = {limit*1e3:.1f} ms ({t/limit:.3f}x); {rows/t:.0f} tok/s")
        print(line)
        f.write(line + "\n")
        js.write(json.dumps({"weights": q, "rows": rows, "layers": layers, "s_per_pass": round(t, 4),
                             "link_s": round(limit, 4), "ratio": round(t / limit, 3), "tok_s": round(rows / t, 1),
                             "passes": len(full), "dequant": k}) + "\n")
PY
            done
            rm -f $M
        done
        ;;
    esac
done
