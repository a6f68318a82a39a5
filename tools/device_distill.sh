#!/usr/bin/env bash
# device_distill.sh — issue 13's GPU checks and the --score benchmark on the H200 machine, in one call:
#   1. echo log-probs on the GPU vs transformers (each tests/data/ref model with the byte tokenizer beside it)
#   2. spill distill --score on the GPU: equal to the GPU's echo of the same ids bit for bit, and within the
#      bf16 bound of the CPU engine's scores (tiny-smollm2, its chat template)
#   3. the --score benchmark: echo rows (512-token prompts, max_tokens 0: prompt-only passes, a log-prob per
#      token) on an 8B-shaped bf16 model held in HBM; tokens/s and TFLOP/s against the ~700 TFLOP/s bf16 rate
# Writes under $OUT: the jobs' pass logs, check.txt (tools/distill_check.py) and score_bench.txt.
#   run(command="tar -xJf .carry/pack.tar.xz && OUT=$OUT tools/device_distill.sh", carry=[".carry/pack.tar.xz"])
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/results/distill-local}
. tools/device_env.sh  # log, runlog, LD_LIBRARY_PATH, BIN, SPILL_HOME
W=/tmp/distill
rm -rf $W && mkdir -p $W

# 1. echo vs transformers
for m in tests/data/ref/*/; do
    n=$(basename "$m")
    [ -f "$m/ref.bin" ] || continue
    mkdir -p $W/m-$n
    ln -sf "$PWD/$m/config.json" "$PWD/$m/model.safetensors" $W/m-$n/
    ln -sf "$PWD/tests/data/ref/tokenizer_bytes256.json" $W/m-$n/tokenizer.json
    python3 tools/distill_check.py echo-input "$m/ref.bin" $W/echo-$n.jsonl
    timeout 60 $BIN/spill-cuda run $W/m-$n $W/echo-$n.jsonl -o $W/job-$n --gpu --prefill-chunk 7 --batch 2 --quiet \
        > $W/log-$n.txt 2>&1 || log "echo $n: exit $? ($(tail -1 $W/log-$n.txt))"
done
python3 tools/distill_check.py echo-compare $W > "$OUT/check.txt" 2>&1
log "echo vs transformers: $(tail -1 "$OUT/check.txt")"

# 2. --score on the GPU vs its echo and vs the CPU
python3 tools/distill_check.py score-input $W/score.jsonl
for dev in gpu cpu; do
    timeout 120 $BIN/spill-cuda distill tests/data/tiny/tiny-smollm2.gguf $W/score.jsonl --score --logprobs 2 \
        --$dev -o $W/score-$dev --quiet > $W/score-$dev.log 2>&1 || log "score $dev: exit $?"
done
python3 tools/distill_check.py score-echo-input $W/score-gpu/results.jsonl $W/score-echo.jsonl
timeout 120 $BIN/spill-cuda run tests/data/tiny/tiny-smollm2.gguf $W/score-echo.jsonl --gpu -o $W/score-echo --quiet \
    > $W/score-echo.log 2>&1 || log "score echo: exit $?"
python3 tools/distill_check.py score-compare $W >> "$OUT/check.txt" 2>&1
log "score: $(tail -2 "$OUT/check.txt" | tr '\n' ' ')"

# 3. the --score benchmark
if [ "${BENCH:-1}" = 1 ]; then
    log "synth llama3-8b bf16 (sparse)"
    timeout 120 $BIN/spill-cuda synth --like llama3-8b --quant bf16 --sparse -o $W/m8b.gguf > "$OUT/synth.log" 2>&1
    python3 tools/distill_check.py bench-input $W/bench.jsonl ${ROWS:-2048} ${TOKENS:-512}
    log "echo-score ${ROWS:-2048} rows x ${TOKENS:-512} tokens on the GPU, weights resident"
    timeout 300 $BIN/spill-cuda run $W/m8b.gguf $W/bench.jsonl --gpu -o $W/bench-job --pass-log "$OUT/score_passes.csv" \
        --quiet > "$OUT/score_bench.log" 2>&1 || log "bench: exit $?"
    python3 tools/distill_check.py bench-report "$OUT/score_passes.csv" $W/m8b.gguf ${TOKENS:-512} \
        > "$OUT/score_bench.txt" 2>&1
    cat "$OUT/score_bench.txt" | tee -a "$OUT/run.log"
fi
