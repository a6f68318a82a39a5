#!/usr/bin/env bash
# device_house.sh — the house issue's check on the H200 machine, in one call: `make test-cuda`'s binaries
# (tools/cuda_device_run.sh tests), the B1-style pass (8B-shaped bf16, all 32 layers streamed from pinned RAM,
# 1,024 decode rows) with this tree's bench_pass and with the binary built before the refactor, alternating
# (new, old, new, old), and `spill run` on the GPU with both binaries and on the CPU: answers compared row by row.
# Expects .carry/bin (tools/device_build.sh) and .carry/base (the same binaries built from the commit before the
# refactor); carry both.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
for d in /usr/local/cuda/lib64 /usr/local/cuda-13.0/lib64; do [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"; done
OUT=$OUT/tests tools/cuda_device_run.sh tests > "$OUT/tests_summary.log" 2>&1
echo "tests rc=$?" | tee -a "$OUT/summary.txt"
grep -h "checks\|rc=" "$OUT/tests/run.log" "$OUT/tests/tests.log" | tail -n 12 | tee -a "$OUT/summary.txt"
for run in new1 old1 new2 old2; do
    B=.carry/bin/bench_pass; [[ $run == old* ]] && B=.carry/base/bench_pass
    timeout 120 $B --label 8b --batches 1024 --prefill-rows 0 > "$OUT/b1_$run.log" 2>&1
    echo "b1 $run rc=$?: $(grep -E '^8b +streamed +decode' "$OUT/b1_$run.log" | awk '{print "pass_ms", $6, "limit_ms", $7, "ratio", $8, "tok/s", $11}')" | tee -a "$OUT/summary.txt"
done
python3 - <<'PY'
import json
with open("/tmp/e2e.jsonl", "w") as f:
    for i in range(64):
        body = {"model": "tiny", "messages": [{"role": "user", "content": f"Question {i} about {i*37%1000}."}],
                "max_tokens": 8 + i % 24, "temperature": 0}
        if i % 4 == 1:
            body.update(temperature=0.8, seed=i)
        f.write(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}) + "\n")
PY
M=tests/data/tiny/tiny-smollm2.gguf
.carry/bin/spill-cuda run $M /tmp/e2e.jsonl -o /tmp/jg_new --gpu --batch 16 --quiet > "$OUT/e2e.log" 2>&1; echo "gpu new exit $?" >> "$OUT/e2e.log"
.carry/base/spill-cuda run $M /tmp/e2e.jsonl -o /tmp/jg_old --gpu --batch 16 --quiet >> "$OUT/e2e.log" 2>&1; echo "gpu old exit $?" >> "$OUT/e2e.log"
.carry/bin/spill-cuda run $M /tmp/e2e.jsonl -o /tmp/jc_new --cpu --batch 16 --quiet >> "$OUT/e2e.log" 2>&1; echo "cpu new exit $?" >> "$OUT/e2e.log"
{ echo "GPU new vs GPU old:"; python3 tools/same_answers.py /tmp/jg_new/results.jsonl /tmp/jg_old/results.jsonl;
  echo "GPU new vs CPU new:"; python3 tools/same_answers.py /tmp/jg_new/results.jsonl /tmp/jc_new/results.jsonl; } >> "$OUT/e2e.log" 2>&1
tail -n 12 "$OUT/e2e.log" | tee -a "$OUT/summary.txt"
# the GPU switches now reach the engine through the run options (base/settings.h): profile, fp32 tiles, alloc pin
SPILL_CUDA_PROF=1 SPILL_CUDA_ATT=fp32 SPILL_CUDA_PIN=alloc .carry/bin/spill-cuda run $M /tmp/e2e.jsonl -o /tmp/jg_env \
    --gpu --batch 16 --stream --resident-layers 0 --quiet > "$OUT/e2e_env.log" 2>&1
echo "gpu with SPILL_CUDA_PROF/ATT/PIN exit $?; profile lines: $(grep -c 'gemm q,k,v\|attention' "$OUT/e2e_env.log"); pinned by: $(grep -o 'cudaHostAlloc\|registered' "$OUT/e2e_env.log" | head -1)" | tee -a "$OUT/summary.txt"
SPILL_CUDA_ATT=fp64 .carry/bin/spill-cuda run $M /tmp/e2e.jsonl -o /tmp/jg_bad --gpu --quiet > "$OUT/e2e_bad.log" 2>&1
echo "SPILL_CUDA_ATT=fp64: exit $? ($(head -c 160 "$OUT/e2e_bad.log"))" | tee -a "$OUT/summary.txt"
