#!/usr/bin/env bash
# device_issue19.sh — the prefix cache (issue 19) on the H200 machine, in one call, after tools/device_build.sh:
#   run(command="tar -xJf .carry/pack.tar.xz && OUT=$OUT tools/device_issue19.sh", carry=[".carry/pack.tar.xz"])
# Steps:
#   tests   test_cuda_engine and test_cuda_ops (the KV page bookkeeping the CUDA engine shares with kv.c changed)
#   tiny    the 100-row docqa input (bench/results/cpu-prefix/docqa-10x10.jsonl, 10 documents x 10 questions) on
#           tests/data/tiny/tiny-smollm2.gguf: --gpu with the cache on and off, and the CPU engine with it on; the
#           answers compared (tools/same_answers.py) GPU on vs GPU off, and GPU on vs CPU on; the summary lines
# Everything lands under $OUT (default bench/results/device-issue19).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/results/device-issue19}
. tools/device_env.sh
IN=bench/results/cpu-prefix/docqa-10x10.jsonl
M=tests/data/tiny/tiny-smollm2.gguf
for s in ${*:-tests tiny}; do
    case $s in
    tests)
        runlog test_cuda_ops 300 "$BIN/test_cuda_ops"
        runlog test_cuda_engine 300 "$BIN/test_cuda_engine"
        grep -hE "checks" "$OUT/test_cuda_ops.log" "$OUT/test_cuda_engine.log" | tail -4 || true
        ;;
    tiny)
        for mode in on off; do
            rm -rf "/tmp/px-gpu-$mode"
            runlog "gpu-$mode" 300 "$BIN/spill-cuda" run "$M" "$IN" -o "/tmp/px-gpu-$mode" --gpu --prefix-cache "$mode"
        done
        rm -rf /tmp/px-cpu-on
        runlog cpu-on 300 "$BIN/spill-cuda" run "$M" "$IN" -o /tmp/px-cpu-on --cpu
        { echo "GPU on vs GPU off:"; python3 tools/same_answers.py /tmp/px-gpu-off/results.jsonl /tmp/px-gpu-on/results.jsonl
          echo "GPU on vs CPU on:"; python3 tools/same_answers.py /tmp/px-cpu-on/results.jsonl /tmp/px-gpu-on/results.jsonl
          grep -h "^prefix cache:\|^done:" "$OUT"/gpu-on.log "$OUT"/gpu-off.log "$OUT"/cpu-on.log; } > "$OUT/compare.log" 2>&1
        cat "$OUT/compare.log"
        ;;
    esac
done
exit $FAILED
