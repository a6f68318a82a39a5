#!/usr/bin/env bash
# device_share.sh — issue 21 item 1's one-GPU check and issue 17's kept pinned copy, on the H200 machine (run from
# the repo root after tar -xJf .carry/pack.tar.xz; binaries from tools/device_build.sh):
#   tests   the GPU tests (tools/cuda_device_run.sh tests): the engine's open changed
#   share   a llama3-8b-shaped bf16 model (spill synth, LAYERS layers, default 16), every layer streamed from
#           pinned RAM (--stream --resident-layers 0), ROWS rows (default 96) of 64 random prompt tokens, 32 new
#           tokens, greedy: (1) one process runs them all; (2) two processes run one half each at the same time on
#           the one GPU, the streamed layers in the host's one shared copy (engine/host_share.h, the default);
#           (3) the same two with SPILL_CUDA_PIN=register (a private copy each).  Every process's VmRSS, RssShmem,
#           RssAnon and Pss sampled every 0.2 s (peaks kept), the shared directory's use, and the answers of (2) and
#           (3) compared row by row with (1)'s.
#   worker  spill worker (serve's resident runner) given the same model and options, two jobs: the second job's
#           open maps the copy the first one read (keep mode) — its open line and open time against the first's.
#   wres    spill worker with the model resident in HBM: the second job's open against the first's
#   mpi     two MPI ranks on the one GPU (spill-cuda-mpi under mpirun -np 2) running one job: the tiny fixture on 100
#           eval-2000 rows against one process, and the 8B-shaped model with both ranks' memory sampled
#   draft   --speculate draft beside the GPU target (issue 20): the tiny fixture with its draft on the CPU engine,
#           100 rows of examples/eval-2000.jsonl, draft vs off, answers compared row by row.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/results/device-share}
. tools/device_env.sh
B=${B:-$BIN/spill-cuda}
GPUFLAG=${GPUFLAG:---gpu --stream --resident-layers 0} # B=./spill GPUFLAG=--cpu for a dry run here
LAYERS=${LAYERS:-16}
ROWS=${ROWS:-96}
M=${M:-/tmp/s8b-L$LAYERS.gguf}
SHM=${SPILL_SHM_DIR:-/dev/shm}

# sample FILE PID...: one line every 0.2 s while any PID lives: unix time, the host's used memory (MemTotal -
# MemAvailable) and Shmem (kB, /proc/meminfo), then for each PID its VmRSS RssAnon RssShmem Pss (kB; 0 once gone)
# and the shared directory's used kB
sample() {
    local f=$1
    shift
    : > "$f"
    while kill -0 "$@" 2>/dev/null; do
        {
            printf '%s ' "$(date +%s.%N)"
            awk '/^MemTotal:/ {t=$2} /^MemAvailable:/ {a=$2} /^Shmem:/ {s=$2} END {printf "%d %d ", t-a, s}' /proc/meminfo
            for p in "$@"; do
                awk '/^VmRSS:/ {r=$2} /^RssAnon:/ {a=$2} /^RssShmem:/ {s=$2} END {printf "%d %d %d ", r, a, s}' \
                    /proc/$p/status 2>/dev/null || printf '0 0 0 '
                awk '/^Pss:/ {p=$2} END {printf "%d ", p}' /proc/$p/smaps_rollup 2>/dev/null || printf '0 '
            done
            df -k --output=used "$SHM" 2>/dev/null | tail -1
        } >> "$f"
        sleep 0.2
    done
}
# base FILE: the host's used memory and Shmem before a run (kB)
base() { awk '/^MemTotal:/ {t=$2} /^MemAvailable:/ {a=$2} /^Shmem:/ {s=$2} END {print t-a, s}' /proc/meminfo > "$1"; }

# prep: the model (spill synth) and the input rows, all and in two halves, unless they are there
prep() {
    [ -f "$M" ] || runlog synth 600 "$B" synth --like llama3-8b --layers "$LAYERS" --quant bf16 -o "$M"
    python3 - "$ROWS" <<'PY'
import json, random, sys
rows = int(sys.argv[1])
random.seed(1)
lines = [json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/completions",
                 "body": {"model": "s8b", "prompt": [random.randrange(300, 120000) for _ in range(64)],
                          "max_tokens": 32, "temperature": 0}}) for i in range(rows)]
open("/tmp/sh_all.jsonl", "w").write("\n".join(lines) + "\n")
open("/tmp/sh_a.jsonl", "w").write("\n".join(lines[0::2]) + "\n")
open("/tmp/sh_b.jsonl", "w").write("\n".join(lines[1::2]) + "\n")
PY
}

for s in ${*:-tests share worker draft}; do
    case $s in
    tests)
        OUT=$OUT/tests tools/cuda_device_run.sh tests > "$OUT/tests_run.log" 2>&1
        log "tests rc=$?"
        grep -E "checks" "$OUT/tests/tests.log" | tail -8
        ;;
    share)
        df -h "$SHM" /tmp > "$OUT/share_df.txt" 2>&1
        cat /sys/kernel/mm/transparent_hugepage/shmem_enabled >> "$OUT/share_df.txt" 2>&1
        prep
        for part in all a b; do # each part alone, one process: the answers the two at once must give
            rm -rf /tmp/jsh_one_$part
            log "share: one process, rows $part"
            base "$OUT/share_one_${part}_base.txt"
            $B run "$M" /tmp/sh_$part.jsonl -o /tmp/jsh_one_$part $GPUFLAG > "$OUT/share_one_$part.log" 2>&1 &
            P=$!
            sample "$OUT/share_one_${part}_mem.txt" $P &
            wait $P
            log "share one $part rc=$?"
        done
        for mode in shared register; do
            rm -rf /tmp/jsh_${mode}_a /tmp/jsh_${mode}_b
            log "share: two processes at once, one half each, SPILL_CUDA_PIN=$mode"
            base "$OUT/share_${mode}_base.txt"
            SPILL_CUDA_PIN=$mode $B run "$M" /tmp/sh_a.jsonl -o /tmp/jsh_${mode}_a $GPUFLAG > "$OUT/share_${mode}_a.log" 2>&1 &
            PA=$!
            sleep 1 # A creates the copy; B opens while A fills it (it waits, then maps it)
            SPILL_CUDA_PIN=$mode $B run "$M" /tmp/sh_b.jsonl -o /tmp/jsh_${mode}_b $GPUFLAG > "$OUT/share_${mode}_b.log" 2>&1 &
            PB=$!
            sample "$OUT/share_${mode}_mem.txt" $PA $PB &
            wait $PA; ra=$?
            wait $PB; rb=$?
            log "share $mode rc=$ra,$rb"
            ls -la "$SHM" >> "$OUT/share_${mode}_shm_after.txt" 2>&1
        done
        python3 - "$OUT" <<'PY' 2>&1 | tee "$OUT/share_summary.txt"
import json, sys
out = sys.argv[1]
G = 1048576.0
def answers(d):
    try:
        return {json.loads(l)["custom_id"]: json.loads(l)["response"]["body"]["choices"][0]["text"]
                for l in open(f"{d}/results.jsonl")}
    except (OSError, ValueError, KeyError) as e:
        print(f"{d}: no results ({e})")
        return {}
def mem(name, npids):
    """peaks over the samples: host used memory and Shmem above the baseline; per process VmRSS, RssShmem, Pss;
    the sum of the processes' Pss at one instant (shared pages counted once in all)"""
    try:
        b = [float(x) for x in open(f"{out}/{name}_base.txt").read().split()]
        S = [[float(x) for x in l.split()] for l in open(f"{out}/{name}_mem.txt")]
        S = [r for r in S if len(r) == 3 + 4 * npids + 1]
    except (OSError, ValueError):
        return None
    if not S:
        return None
    p = {"used": max(r[1] for r in S) - b[0], "shmem": max(r[2] for r in S) - b[1],
         "pss_sum": max(sum(r[3 + 4 * i + 3] for i in range(npids)) for r in S),
         "shm_dir": max(r[-1] for r in S)}
    for i in range(npids):
        p[f"rss{i}"] = max(r[3 + 4 * i] for r in S)
        p[f"shmem{i}"] = max(r[3 + 4 * i + 2] for r in S)
    return {k: round(v / G, 2) for k, v in p.items()}
def weights(log):
    try:
        return next((l.strip() for l in open(log) if l.startswith("weights:")), "(no weights line)")
    except OSError:
        return "(no log)"
one = {p: answers(f"/tmp/jsh_one_{p}") for p in ("all", "a", "b")}
for p in ("all", "a", "b"):
    print(f"one process, rows {p}: {len(one[p])} answered; memory GiB above the idle host {mem(f'share_one_{p}', 1)}")
    print(f"  {weights(f'{out}/share_one_{p}.log')}")
halves = {**one["a"], **one["b"]}
print(f"batch-size control: rows a and b run apart (48-row batches) equal the 96-row run on "
      f"{sum(halves.get(k) == v for k, v in one['all'].items())} of {len(one['all'])} (bf16 GEMMs round differently "
      f"at another batch size; random weights leave small logit margins)")
res = {}
for mode in ("shared", "register"):
    a, b = answers(f"/tmp/jsh_{mode}_a"), answers(f"/tmp/jsh_{mode}_b")
    res[mode] = {**a, **b}
    same = sum(res[mode].get(k) == v for k, v in halves.items())
    print(f"SPILL_CUDA_PIN={mode}: two processes at once on the one GPU, {len(a)} + {len(b)} rows; answers equal to "
          f"the same rows run alone: {same} of {len(halves)}")
    print(f"  memory GiB above the idle host (peaks): {mem(f'share_{mode}', 2)}")
    for n in ("a", "b"):
        print(f"  process {n}: {weights(f'{out}/share_{mode}_{n}.log')}")
if len(res) == 2:
    print(f"shared vs register answers: {sum(res['shared'].get(k) == v for k, v in res['register'].items())} of "
          f"{len(res['register'])} equal")
PY
        ;;
    wres)
        # spill worker with the model resident in HBM (no options: the planner keeps the 9 GB in HBM), two jobs:
        # what the second job's open costs when only the host side is kept (the engine uploads the layers again)
        prep
        rm -rf /tmp/jwr1 /tmp/jwr2
        printf 'run\t/tmp/sh_all.jsonl\t/tmp/jwr1\t%s\t%s\nrun\t/tmp/sh_all.jsonl\t/tmp/jwr2\t%s\t%s\n' \
            "$OUT/wres_1.csv" "$OUT/wres_1.log" "$OUT/wres_2.csv" "$OUT/wres_2.log" |
            timeout 400 $B worker "$M" --gpu 3> "$OUT/wres_answers.txt" > "$OUT/wres.log" 2>&1
        log "wres rc=$? answers $(tr '\n' ' ' < "$OUT/wres_answers.txt")"
        for n in 1 2; do
            grep -o 'engine GPU[^·]*·\|ready in [0-9.]* s' "$OUT/wres_$n.log" | tr '\n' ' '
            grep -E '^done' "$OUT/wres_$n.log"
        done | tee "$OUT/wres_summary.txt"
        ;;
    worker)
        rm -rf /tmp/jw1 /tmp/jw2
        printf 'run\t/tmp/sh_all.jsonl\t/tmp/jw1\t%s\t%s\nrun\t/tmp/sh_all.jsonl\t/tmp/jw2\t%s\t%s\n' \
            "$OUT/worker_1.csv" "$OUT/worker_1.log" "$OUT/worker_2.csv" "$OUT/worker_2.log" |
            timeout 400 $B worker "$M" $GPUFLAG 3> "$OUT/worker_answers.txt" > "$OUT/worker.log" 2>&1
        log "worker rc=$? answers $(tr '\n' ' ' < "$OUT/worker_answers.txt")"
        ls -la "$SHM" > "$OUT/worker_shm_after.txt" 2>&1
        {
            for n in 1 2; do
                echo "job $n: $(grep -E 'streamed per pass' "$OUT/worker_$n.log" | head -1)"
                grep -E 'model opened|ready in|opened in' "$OUT/worker_$n.log" | head -3
            done
            python3 - <<'PY'
import json
a = [{json.loads(l)["custom_id"]: json.loads(l)["response"]["body"]["choices"][0]["text"]
      for l in open(f"/tmp/jw{n}/results.jsonl")} for n in (1, 2)]
one = {json.loads(l)["custom_id"]: json.loads(l)["response"]["body"]["choices"][0]["text"]
       for l in open("/tmp/jsh_one_all/results.jsonl")}
print(f"answers: job 2 = job 1 on {sum(a[1].get(k) == v for k, v in a[0].items())} of {len(a[0])}; "
      f"job 1 = the one-process run on {sum(one.get(k) == v for k, v in a[0].items())} of {len(one)}")
PY
        } 2>&1 | tee "$OUT/worker_summary.txt"
        ;;
    mpi)
        # two MPI ranks on the one GPU (spill-cuda-mpi, mpirun -np 2): one job, rows handed out by rank 0, the host's
        # one shared copy (the default for ranks); (1) the tiny fixture on 100 eval-2000 rows, answers against one
        # process; (2) the 8B-shaped model of `share` (run it first) on ROWS rows, memory sampled over both ranks
        MB=${MB:-$BIN/spill-cuda-mpi}
        MPIRUN="mpirun --allow-run-as-root --oversubscribe -np 2 -x SPILL_HOME -x LD_LIBRARY_PATH"
        spec_rows
        T=tests/data/tiny/tiny-smollm2.gguf
        rm -rf /tmp/jmt1 /tmp/jmt2
        runlog mpi_tiny_one 300 "$B" run "$T" /tmp/spec.jsonl -o /tmp/jmt1 $GPUFLAG
        runlog mpi_tiny_two 300 $MPIRUN "$MB" run "$T" /tmp/spec.jsonl -o /tmp/jmt2 $GPUFLAG
        tail -3 "$OUT/mpi_tiny_two.log"
        if [ -f "$M" ]; then
            rm -rf /tmp/jm8
            base "$OUT/mpi_8b_base.txt"
            $MPIRUN "$MB" run "$M" /tmp/sh_all.jsonl -o /tmp/jm8 $GPUFLAG > "$OUT/mpi_8b.log" 2>&1 &
            P=$!
            pids=""
            for i in $(seq 1 50); do
                pids=$(pgrep -f "^$MB run $M" | tr '\n' ' ')
                [ $(echo $pids | wc -w) -ge 2 ] && break
                sleep 0.1
            done
            log "mpi 8b: ranks $pids"
            [ -n "$pids" ] && sample "$OUT/mpi_8b_mem.txt" $pids &
            wait $P
            log "mpi 8b rc=$?"
            cp /tmp/jm8/manifest.json "$OUT/mpi_8b_manifest.json" 2>/dev/null
        fi
        python3 - "$OUT" <<'PY' 2>&1 | tee "$OUT/mpi_summary.txt"
import json, sys
out = sys.argv[1]
G = 1048576.0
def answers(path, chat):
    try:
        rows = [json.loads(l) for l in open(path)]
    except (OSError, ValueError) as e:
        print(f"{path}: {e}")
        return {}
    c = [r["custom_id"] for r in rows]
    if len(c) != len(set(c)):
        print(f"{path}: {len(c) - len(set(c))} custom_ids twice")
    f = (lambda b: b["choices"][0]["message"]["content"]) if chat else (lambda b: b["choices"][0]["text"])
    return {r["custom_id"]: f(r["response"]["body"]) for r in rows}
a, b = answers("/tmp/jmt1/results.jsonl", True), answers("/tmp/jmt2/results.jsonl", True)
print(f"tiny fixture, 100 eval-2000 rows: mpirun -np 2 on the one GPU answered {len(b)} rows, {sum(b.get(k) == v for k, v in a.items())} "
      f"of {len(a)} equal to one process")
try:
    man = json.load(open(f"{out}/mpi_8b_manifest.json"))
    print(f"8B-shaped: manifest mpi = {json.dumps(man.get('mpi'))[:400]}")
except (OSError, ValueError):
    pass
one = answers("/tmp/jsh_one_all/results.jsonl", False)
m8 = answers("/tmp/jm8/results.jsonl", False)
if m8:
    print(f"8B-shaped, {len(one)} rows: mpirun -np 2 answered {len(m8)}, {sum(m8.get(k) == v for k, v in one.items())} equal to "
          f"one process (its rows ride in other batches: see share's batch-size control)")
try:
    bs = [float(x) for x in open(f"{out}/mpi_8b_base.txt").read().split()]
    S = [[float(x) for x in l.split()] for l in open(f"{out}/mpi_8b_mem.txt")]
    S = [r for r in S if len(r) == 3 + 8 + 1]
    if S:
        print(f"  memory above the idle host (peaks, GiB): used {(max(r[1] for r in S) - bs[0]) / G:.2f}, Shmem "
              f"{(max(r[2] for r in S) - bs[1]) / G:.2f}, the ranks' Pss summed at one instant "
              f"{max(r[6] + r[10] for r in S) / G:.2f}, each rank's VmRSS {max(r[3] for r in S) / G:.2f} and "
              f"{max(r[7] for r in S) / G:.2f} (RssShmem {max(r[5] for r in S) / G:.2f}, {max(r[9] for r in S) / G:.2f})")
except (OSError, ValueError):
    pass
PY
        grep -h '^weights:' "$OUT/mpi_8b.log" 2>/dev/null | head -2
        ;;
    draft)
        # --speculate draft beside the GPU target (the draft on the CPU engine, its pages in host RAM): the tiny
        # fixture and its draft on 100 rows of examples/eval-2000.jsonl (50 qa, 50 summary), draft vs off
        spec_rows
        T=tests/data/tiny/tiny-smollm2.gguf
        D=tests/data/tiny/tiny-smollm2-draft.gguf
        for mode in "draft:$D" off; do
            n=${mode%%:*}
            rm -rf /tmp/jdr-$n
            runlog "draft_$n" 400 "$B" run "$T" /tmp/spec.jsonl -o /tmp/jdr-$n --gpu --speculate "$mode" \
                --pass-log "$OUT/draft_passes_$n.csv"
            grep -E "^done|tokens per row per pass|draft model|accept" "$OUT/draft_$n.log" | tail -4
        done
        python3 - <<'PY' 2>&1 | tee "$OUT/draft_summary.txt"
import json
a = {}
for n in ("draft", "off"):
    try:
        a[n] = {json.loads(l)["custom_id"]: json.loads(l)["response"]["body"]["choices"][0]["message"]["content"]
                for l in open(f"/tmp/jdr-{n}/results.jsonl")}
    except (OSError, ValueError, KeyError) as e:
        print(f"{n}: no results ({e})")
if len(a) == 2:
    print(f"--gpu --speculate draft (tiny fixture, its draft on the CPU engine) vs off: "
          f"{sum(a['draft'][k] == a['off'].get(k) for k in a['draft'])} of {len(a['draft'])} answers equal")
PY
        ;;
    *)
        log "unknown step $s"
        ;;
    esac
done
exit $FAILED
