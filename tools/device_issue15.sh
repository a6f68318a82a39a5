#!/usr/bin/env bash
# device_issue15.sh — issues 15/16 on the H200 machine (run from the repo root after tar -xJf .carry/pack.tar.xz):
#   tests  the GPU tests (tools/cuda_device_run.sh tests)
#   e2e    spill-cuda on the tiny SmolLM2-vocabulary fixture: batch from memory vs --batch 16 (GPU) vs the CPU, with
#          response_format rows (grammar rows are sampled on the host) and --quant q4 (the cached copy on the GPU)
#   mem    a 70B-shaped sparse bf16 model (8 of its layers, spill synth), 2,048 rows of 128 prompt tokens and 64 new
#          tokens: the batch from memory against --batch 2048 in the same call (pre-run lines, tok/s)
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/results/issue15-local}
. tools/device_env.sh  # log, runlog, LD_LIBRARY_PATH, BIN, SPILL_HOME
B=.carry/bin/spill-cuda
{ ldconfig -p | grep -E "libcurl" ; ldd $B | grep -E "not found|curl"; } > "$OUT/libs.txt" 2>&1
for s in ${*:-tests e2e mem}; do
    case $s in
    tests)
        OUT=$OUT/tests tools/cuda_device_run.sh tests > "$OUT/tests_run.log" 2>&1; log "tests rc=$?"
        grep -E "checks" "$OUT/tests/tests.log" | tail -5
        ;;
    e2e)
        python3 - <<'PY'
import json
with open("/tmp/e15.jsonl", "w") as f:
    for i in range(96):
        body = {"model": "tiny", "messages": [{"role": "user", "content": f"Question {i} about {i*37%1000}."}],
                "max_tokens": 8 + i % 24, "temperature": 0}
        if i % 4 == 1:
            body.update(temperature=0.8, seed=i)
        if i % 3 == 2:
            body["response_format"] = {"type": "json_schema", "json_schema": {"name": "a", "strict": True, "schema": {
                "type": "object", "properties": {"answer": {"type": "string", "maxLength": 12},
                "n": {"type": "integer"}}, "required": ["answer", "n"], "additionalProperties": False}}}
            body["max_tokens"] = 48
        f.write(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}) + "\n")
PY
        M=tests/data/tiny/tiny-smollm2.gguf
        { $B run $M /tmp/e15.jsonl -o /tmp/je_mem --gpu; echo "exit $?";
          $B run $M /tmp/e15.jsonl -o /tmp/je_b16 --gpu --batch 16 --quiet; echo "exit $?";
          $B run $M /tmp/e15.jsonl -o /tmp/je_cpu --cpu --quiet; echo "exit $?";
          $B run $M /tmp/e15.jsonl -o /tmp/je_q4 --gpu --quant q4; echo "exit $?";
          $B run $M /tmp/e15.jsonl -o /tmp/je_q4c --cpu --quant q4 --quiet; echo "exit $?"; } > "$OUT/e2e.log" 2>&1
        python3 - >> "$OUT/e2e.log" 2>&1 <<'PY'
import json
def load(d):
    out = {}
    for l in open(f"{d}/results.jsonl"):
        o = json.loads(l)
        out[o["custom_id"]] = o["response"]["body"]["choices"][0]
    return out
mem, b16, cpu, q4, q4c = (load(d) for d in ("/tmp/je_mem", "/tmp/je_b16", "/tmp/je_cpu", "/tmp/je_q4", "/tmp/je_q4c"))
greedy = [f"r{i}" for i in range(96) if i % 4 != 1]
def same(a, b, ids):
    return sum(a[k]["message"]["content"] == b[k]["message"]["content"] for k in ids)
print(f"rows: mem {len(mem)} b16 {len(b16)} cpu {len(cpu)} q4 {len(q4)} q4-cpu {len(q4c)}")
print(f"GPU batch from memory = GPU --batch 16 on {same(mem, b16, list(mem))} of {len(mem)} rows (sampled rows included)")
print(f"GPU from memory = CPU on {same(mem, cpu, greedy)} of {len(greedy)} greedy rows")
print(f"GPU q4 = CPU q4 on {same(q4, q4c, greedy)} of {len(greedy)} greedy rows")
ok = bad = 0
for d in (mem, cpu, q4):
    for i in range(96):
        if i % 3 != 2: continue
        c = d[f"r{i}"]
        try:
            v = json.loads(c["message"]["content"]); good = set(v) == {"answer", "n"} and isinstance(v["n"], int) and isinstance(v["answer"], str) and len(v["answer"]) <= 12
        except Exception:
            good = False
        ok += good; bad += not good
print(f"json_schema rows: {ok} parse and validate, {bad} do not (finish reasons GPU: "
      f"{sorted(set(mem[f'r{i}']['finish_reason'] for i in range(96) if i % 3 == 2))})")
PY
        log "e2e done"; tail -8 "$OUT/e2e.log"
        ;;
    mem)
        M=/tmp/s70b8-sparse.gguf
        [ -f $M ] || { /usr/bin/time -f "synth %e s" $B synth --like llama3-70b --layers 8 --quant bf16 --sparse -o $M > "$OUT/synth.log" 2>&1; }
        python3 - <<'PY'
import json, random
random.seed(0)
with open("/tmp/m15.jsonl", "w") as f:
    for i in range(2048):
        f.write(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/completions",
                            "body": {"model": "s", "prompt": [random.randrange(300, 120000) for _ in range(128)],
                                     "max_tokens": 64, "temperature": 0}}) + "\n")
PY
        for v in mem b2048; do
            extra=""; [ $v = b2048 ] && extra="--batch 2048"
            rm -rf /tmp/jm_$v
            timeout 200 $B run $M /tmp/m15.jsonl -o /tmp/jm_$v --gpu --kv-dtype int8 $extra --pass-log "$OUT/mem_${v}_passes.csv" > "$OUT/mem_$v.log" 2>&1
            log "mem $v exit $?"
            grep -E "^spill run|^done|preempt" "$OUT/mem_$v.log" | cut -c1-600
        done
        ;;
    esac
done
