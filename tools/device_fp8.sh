#!/usr/bin/env bash
# device_fp8.sh — issue 18 item 2 (fp8 weights) on the H200 machine, in one call.  Run from the repo root after
# tools/device_build.sh on the dev machine:
#   run(command="tar -xJf .carry/pack.tar.xz && tools/device_fp8.sh", carry=[".carry/pack.tar.xz"])
# Steps (all by default; or name some: tools/device_fp8.sh tests bench pass):
#   tests  build/cuda/test_cuda_fp8 (activation quantizer = the host's bit for bit; the fp8 GEMM in every scale mode
#          against a host emulation and the CPU fp8 matmul; the CUDA engine on an fp8 model against the CPU engine),
#          then test_cuda_ops and test_cuda_engine (nothing else regressed)
#   bench  bench_fp8: the fp8 GEMM against bf16 at the 70B shapes (8192x8192, 28672x8192, 8192x28672) for 1,024,
#          2,048 and 4,096 rows, TFLOP/s against the H200's dense peaks
#   pass   a 70B-shaped model (spill synth --like llama3-70b --layers $LAYERS --quant fp8 --sparse), every layer
#          streamed from pinned RAM each pass (--gpu --stream --resident-layers 0), ROWS rows of 8 prompt tokens and
#          24 new ones, for ROWS in $ROWS_LIST; the full-batch decode passes' median s/pass against the layer bytes /
#          55 GB/s, written as issue 18's weights-speed records to $OUT/weights-speed.jsonl; PASS_BF16=1 adds the
#          bf16 file at 2,048 rows as a same-machine baseline
# Everything lands under $OUT (default bench/results/device-fp8); every command is echoed before it runs.  A failing
# step is logged with its exit code and the script goes on; the exit code is 1 when any step failed.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/results/device-fp8}
. tools/device_env.sh  # log, runlog, FAILED, LD_LIBRARY_PATH, BIN, SPILL_HOME
[ -x "$BIN/test_cuda_fp8" ] || BIN=build/cuda
for f in test_cuda_fp8 bench_fp8 spill-cuda; do
    if [ ! -x "$BIN/$f" ]; then
        log "missing $BIN/$f: run tools/device_build.sh on the dev machine first"
        exit 1
    fi
done
if ldd "$BIN/test_cuda_fp8" | grep -q "not found"; then
    log "binaries cannot load here: $(ldd "$BIN/test_cuda_fp8" | grep 'not found' | tr '\n' ' ')"
    exit 1
fi
{ nvidia-smi; nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,pcie.link.gen.current,pcie.link.width.current --format=csv; uname -a; nproc; free -g; } > "$OUT/machine.txt" 2>&1 || true
log "binaries: $BIN; commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
LAYERS=${LAYERS:-16}
ROWS_LIST=${ROWS_LIST:-1024 2048 4096}
MACHINE=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || echo unknown)

for s in ${*:-tests bench pass}; do
    case $s in
    tests)
        runlog test_cuda_fp8 300 "$BIN/test_cuda_fp8"
        grep -E "fp8 GEMM|engine fp8|refuses|checks" "$OUT/test_cuda_fp8.log" | tail -30 || true
        runlog test_cuda_ops 120 "$BIN/test_cuda_ops"
        runlog test_cuda_engine 180 "$BIN/test_cuda_engine"
        grep -hE "checks" "$OUT/test_cuda_ops.log" "$OUT/test_cuda_engine.log" | tail -4 || true
        ;;
    bench)
        runlog bench_fp8 300 "$BIN/bench_fp8" --json "$OUT/bench_fp8.jsonl"
        cat "$OUT/bench_fp8.log"
        ;;
    pass)
        MAXR=0
        for r in $ROWS_LIST; do [ "$r" -gt "$MAXR" ] && MAXR=$r; done
        python3 - "$MAXR" <<'PY'
import json, random, sys
random.seed(0)
with open("/tmp/fp8_rows.jsonl", "w") as f:
    for i in range(int(sys.argv[1])):
        f.write(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/completions",
                            "body": {"model": "s70b", "prompt": [random.randrange(300, 120000) for _ in range(8)],
                                     "max_tokens": 24, "temperature": 0}}) + "\n")
PY
        QUANTS="fp8"
        [ "${PASS_BF16:-0}" = 1 ] && QUANTS="fp8 bf16"
        for q in $QUANTS; do
            M=/tmp/s70b-L$LAYERS-$q.gguf
            [ -f "$M" ] || runlog "synth_$q" 600 "$BIN/spill-cuda" synth --like llama3-70b --layers "$LAYERS" --quant "$q" --sparse -o "$M"
            [ -f "$M" ] || continue
            log "model $M: $(du -h --apparent-size "$M" | cut -f1)"
            rl=$ROWS_LIST
            [ "$q" = bf16 ] && rl=2048
            for r in $rl; do
                head -n "$r" /tmp/fp8_rows.jsonl > /tmp/fp8_in.jsonl
                rm -rf /tmp/jfp8
                runlog "run_${q}_$r" 600 "$BIN/spill-cuda" run "$M" /tmp/fp8_in.jsonl -o /tmp/jfp8 --gpu --stream \
                    --resident-layers 0 --batch "$r" --pass-log "$OUT/passes_${q}_$r.csv"
                grep -E "^done|weights" "$OUT/run_${q}_$r.log" | tail -2 || true
                python3 - "$OUT" "$q" "$r" "$LAYERS" "$MACHINE" "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" <<'PY' || true
import csv, json, re, statistics, sys
out, q, rows, layers, machine, commit = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6]
try:
    P = list(csv.DictReader(open(f"{out}/passes_{q}_{rows}.csv")))
    gb = float(re.search(r"weights: ([0-9.]+) GB streamed per pass", open(f"{out}/run_{q}_{rows}.log").read()).group(1))
except (OSError, AttributeError) as e:
    print(f"{q} {rows}: no pass figures ({e})")
    sys.exit(0)
full = [float(p["seconds"]) for p in P if int(p["seqs"]) == rows and int(p["prefill_tokens"]) == 0]
if not full:
    print(f"{q} {rows}: no full-batch decode pass in the log")
    sys.exit(0)
t, link = statistics.median(full), gb * 1e9 / 55e9
line = (f"{q}: {rows} rows, {layers} layers, median full-batch decode pass {t:.3f} s over {len(full)} passes; "
        f"{gb:.2f} GB streamed / 55 GB/s = {link:.3f} s ({t/link:.2f}x); {rows/t:.0f} tok/s")
print(line)
with open(f"{out}/summary.txt", "a") as f:
    f.write(line + "\n")
with open(f"{out}/weights-speed.jsonl", "a") as f:
    f.write(json.dumps({"weights": q, "rows": rows, "layers": layers, "s_per_pass": round(t, 4),
                        "link_s": round(link, 4), "ratio": round(t / link, 3), "tok_s": round(rows / t, 1),
                        "commit": commit, "machine": machine}) + "\n")
PY
            done
            rm -f "$M"
        done
        ;;
    *)
        log "unknown step $s (tests, bench, pass)"
        FAILED=1
        ;;
    esac
done
[ -f "$OUT/summary.txt" ] && cat "$OUT/summary.txt"
log "done; failed=$FAILED; results in $OUT"
exit $FAILED
