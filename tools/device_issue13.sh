#!/usr/bin/env bash
# device_issue13.sh — issue 13 on the H200 machine (run from the repo root after tar -xJf .carry/pack.tar.xz):
#   refs    tools/gen_lora_refs.py: peft adapters of the tiny reference models + transformers+peft fp32 logits
#           (returned as $OUT/peft_ref.tar.xz: commit it under tests/data/lora/peft_ref/)
#   tests   the GPU tests (tools/cuda_device_run.sh tests: ops, engine x3 settings — LoRA cases included)
#   distill tools/device_distill.sh (GPU echo vs transformers, --score checks, the --score benchmark)
#   lora    bench_pass with 0, 1 and 8 adapters of rank 16 on the 8B shape at 1,024 rows, resident and streamed
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/results/issue13-local}
. tools/device_env.sh  # log, runlog, LD_LIBRARY_PATH, BIN, SPILL_HOME
for s in ${*:-refs tests}; do
    case $s in
    refs)
        log "gen_lora_refs"
        timeout 240 python3 tools/gen_lora_refs.py /tmp/peft_ref > "$OUT/refs.log" 2>&1; log "refs rc=$?"
        tail -5 "$OUT/refs.log"
        tar -C /tmp -cJf "$OUT/peft_ref.tar.xz" peft_ref 2>/dev/null
        ;;
    tests)
        OUT=$OUT/tests tools/cuda_device_run.sh tests > "$OUT/tests_run.log" 2>&1; log "tests rc=$?"
        grep -E "rc=|failed|checks" "$OUT/tests/run.log" "$OUT/tests/tests.log" | tail -20
        ;;
    distill)
        OUT=$OUT/distill tools/device_distill.sh > "$OUT/distill_run.log" 2>&1; log "distill rc=$?"
        cat "$OUT/distill/check.txt" "$OUT/distill/score_bench.txt" 2>/dev/null | tail -25
        ;;
    lora)
        for n in 0 1 8; do
            log "bench_pass 8B, 1024 rows, $n adapters of rank 16"
            timeout 150 .carry/bin/bench_pass --label 8b-lora$n --csv "$OUT/bench_lora.csv" --batches 1024 \
                --prefill-rows 8 --resident-too --adapters $n --rank 16 >> "$OUT/bench_lora.log" 2>&1
            log "rc=$?"
        done
        grep -E "lora|pass|ms" "$OUT/bench_lora.log" | tail -30
        ;;
    esac
done
