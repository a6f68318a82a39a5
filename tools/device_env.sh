#!/usr/bin/env bash
# device_env.sh — sourced by the H200 scripts (tools/device_*.sh): the CUDA and pip-installed NVIDIA libraries on
# LD_LIBRARY_PATH, BIN (the carried binaries, .carry/bin, else build/cuda), OUT made, machine.txt written, and
# log / runlog (and spec_rows, the eval rows the spec/draft/mpi steps run).  runlog NAME TIMEOUT CMD... echoes the command, runs it under timeout into $OUT/NAME.log and
# records its exit code (FAILED=1 on a failure; the script goes on).  Older scripts still carry their own copy of
# this preamble; new ones source this file.
mkdir -p "$OUT"
log() { echo "[$(date +%H:%M:%S)] $*" | tee -a "$OUT/run.log"; }
runlog() {
    local name=$1 t=$2
    shift 2
    log "run: $* > $OUT/$name.log"
    local rc=0
    timeout "$t" "$@" > "$OUT/$name.log" 2>&1 || rc=$?
    log "$name rc=$rc"
    [ $rc -eq 0 ] || FAILED=1
    return 0
}
FAILED=0
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib; do
    [ -d "$d" ] && LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
done
for d in $(python3 -c 'import nvidia, os; print(" ".join(os.path.join(p, s, "lib") for p in nvidia.__path__ for s in os.listdir(p)))' 2>/dev/null || true); do
    [ -d "$d" ] && LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}:$d"
done
export LD_LIBRARY_PATH
BIN=${BIN:-.carry/bin}
[ -x "$BIN/spill-cuda" ] || BIN=build/cuda
{ nvidia-smi; uname -a; nproc; free -g; } > "$OUT/machine.txt" 2>&1 || true
export SPILL_HOME=${SPILL_HOME:-/tmp/spillhome}

# spec_rows: /tmp/spec.jsonl, the first 50 qa and 50 summary rows of examples/eval-2000.jsonl (what the tiny
# fixture's 512-token context holds)
spec_rows() {
    python3 - <<'PY'
import json
doc, summ = [], []
for l in open("examples/eval-2000.jsonl"):
    j = json.loads(l)
    (doc if j["custom_id"].startswith("qa") else summ if j["custom_id"].startswith("sum") else []).append(j)
with open("/tmp/spec.jsonl", "w") as f:
    for j in doc[:50] + summ[:50]:
        j.pop("expected", None)
        f.write(json.dumps(j) + "\n")
PY
}
