#!/usr/bin/env bash
# device_run30.sh — the H200 figures issue 20 and issue 17 still lacked, in one call (run from the repo root after
# tar -xJf .carry/pack.tar.xz; binaries from tools/device_build.sh):
#   tests   the GPU tests (tools/cuda_device_run.sh tests)
#   verify  issue 20's verify-pass cost against k: a 70B-shaped sparse model (spill synth --like llama3-70b,
#           LAYERS of its 80 layers, bf16) streamed from pinned RAM, ROWS rows (default 680: what the 80-layer model
#           holds with int8 KV at 1,000-token prompts) of 1,000 prompt tokens, then decode passes feeding every row
#           1 + K tokens with every position's logits (spill bench --verify K), K = KS (default 0 1 2 3 4 6 8).  Per
#           pass the copy is the same whatever K; the figure is the pass time against K's.  The KV here is bf16
#           and LAYERS < 80: the pass time per layer is what scales (copy and compute both per layer).
#   spec    --speculate on the GPU engine: MODEL_SPEC (default the real SmolLM2 at $SMOL, else the tiny fixture)
#           on the first 50 QA and 50 summary rows (the tiny fixture's 512-token context holds them) of examples/eval-2000.jsonl, --gpu with --speculate lookup
#           and off; answers compared row by row, tokens/row/pass and whole-job tok/s from each run's summary.
#   serve   spill-cuda serve on the tiny fixture: a batch uploaded, created, polled to completion and its output
#           downloaded with curl (the official client is not on this machine); its lines counted and checked.
#   worker  spill-cuda serve's resident worker: two 40-row batches for the tiny fixture through curl, one worker pid,
#           one "model opened", answers equal between the batches
#   tilemin the verify sweep at KS with SPILL_CUDA_TILE_MIN=8 (the attention plan before 1b69c5c) and the default
#   chunk   tools/device_chunk.sh as a refilling job: q4, ROWS_C rows (default 1,024) at --batch BATCH_C (256)
#           of 1,000-token prompts and 64 new tokens, adaptive prompt budget vs the constant 8,192.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/results/device-run30}
. tools/device_env.sh
B=${B:-$BIN/spill-cuda}
GPUFLAG=${GPUFLAG:---gpu}  # --cpu for a dry run here with B=./spill
LAYERS=${LAYERS:-8}
ROWS=${ROWS:-680}
KS=${KS:-0 1 2 3 4 6 8}
SMOL=${SMOL:-/tmp/smol.gguf}
for s in ${*:-tests verify spec serve chunk}; do
    case $s in
    tests)
        OUT=$OUT/tests tools/cuda_device_run.sh tests > "$OUT/tests_run.log" 2>&1
        log "tests rc=$?"
        grep -E "checks" "$OUT/tests/tests.log" | tail -6
        ;;
    verify)
        M=/tmp/s70b-L$LAYERS-bf16.gguf
        [ -f "$M" ] || runlog synth_bf16 600 "$B" synth --like llama3-70b --layers "$LAYERS" --sparse -o "$M"
        for k in $KS; do
            runlog "verify_k$k" 300 "$B" bench "$M" --tiers gpu-pinned --batches "$ROWS" --prompt 1000 --gen 6 \
                --verify "$k" --seconds 60 -o "$OUT/verify_k$k"
            grep -E "^gpu-pinned +$ROWS" "$OUT/verify_k$k.log" | tail -1
        done
        python3 - "$OUT" "$KS" "$ROWS" "$LAYERS" <<'PY' 2>&1 | tee "$OUT/verify_summary.txt"
import csv, sys
out, ks, rows, layers = sys.argv[1], sys.argv[2].split(), int(sys.argv[3]), int(sys.argv[4])
print(f"verify-pass cost, 70B shape, {layers} of 80 layers bf16 streamed from pinned RAM, {rows} rows of 1,000 "
      "prompt tokens, every row fed 1 + K tokens a pass (spill bench --verify K)")
base = None
for k in ks:
    try:
        r = [x for x in csv.reader(l for l in open(f"{out}/verify_k{k}/bench.csv") if not l.startswith("#"))][1:]
        ms = float(r[-1][6])
    except (OSError, IndexError, ValueError) as e:
        print(f"K={k}: no figure ({e})")
        continue
    base = base or ms
    print(f"K={k}: {ms:.1f} ms a pass = {ms / base:.3f}x K=0's; {rows * (1 + int(k))} tokens fed; "
          f"80 layers: {ms * 80 / layers / 1e3:.3f} s a pass")
PY
        ;;
    spec)
        M=${MODEL_SPEC:-$SMOL}
        [ -f "$M" ] || M=tests/data/tiny/tiny-smollm2.gguf
        spec_rows
        for mode in lookup off; do
            rm -rf /tmp/jspec-$mode
            runlog "spec_$mode" 400 "$B" run "$M" /tmp/spec.jsonl -o /tmp/jspec-$mode $GPUFLAG --speculate $mode \
                --pass-log "$OUT/spec_passes_$mode.csv"
            cp /tmp/jspec-$mode/results.jsonl "$OUT/spec_results_$mode.jsonl" 2>/dev/null
            grep -E "^done|tok/row/pass|accepted" "$OUT/spec_$mode.log" | tail -3
        done
        python3 - "$OUT" "$M" <<'PY' 2>&1 | tee "$OUT/spec_summary.txt"
import json, sys
out, m = sys.argv[1], sys.argv[2]
a = {}
for mode in ("lookup", "off"):
    try:
        a[mode] = {json.loads(l)["custom_id"]: json.loads(l)["response"]["body"]["choices"][0]["message"]["content"]
                   for l in open(f"{out}/spec_results_{mode}.jsonl")}
    except (OSError, ValueError, KeyError) as e:
        print(f"{mode}: no results ({e})")
if len(a) == 2:
    same = sum(a["lookup"][k] == a["off"].get(k) for k in a["lookup"])
    print(f"{m}: --gpu --speculate lookup vs off: {same} of {len(a['lookup'])} answers equal")
PY
        ;;
    serve)
        H=/tmp/servehome
        rm -rf $H && mkdir -p $H
        python3 - <<'PY'
import json
with open("/tmp/serve.jsonl", "w") as f:
    for i in range(40):
        f.write(json.dumps({"custom_id": f"s{i}", "method": "POST", "url": "/v1/chat/completions",
                            "body": {"model": "tiny", "messages": [{"role": "user", "content": f"Count to {i}."}],
                                     "max_tokens": 24, "temperature": 0}}) + "\n")
PY
        SPILL_HOME=$H "$B" serve --model tests/data/tiny/tiny-smollm2.gguf --port 8123 > "$OUT/serve.log" 2>&1 &
        SP=$!
        sleep 2
        U=http://127.0.0.1:8123
        curl -s $U/health > "$OUT/serve_health.json"
        FID=$(curl -s $U/v1/files -F purpose=batch -F file=@/tmp/serve.jsonl | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
        BID=$(curl -s $U/v1/batches -H 'Content-Type: application/json' \
            -d "{\"input_file_id\":\"$FID\",\"endpoint\":\"/v1/chat/completions\",\"completion_window\":\"24h\"}" |
            python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
        log "serve: file $FID batch $BID"
        st=""
        for i in $(seq 1 120); do
            curl -s $U/v1/batches/$BID > "$OUT/serve_batch.json"
            st=$(python3 -c 'import json; print(json.load(open("'"$OUT/serve_batch.json"'"))["status"])' 2>/dev/null)
            [ "$st" = completed ] || [ "$st" = failed ] && break
            sleep 1
        done
        OF=$(python3 -c 'import json; print(json.load(open("'"$OUT/serve_batch.json"'")).get("output_file_id") or "")')
        [ -n "$OF" ] && curl -s $U/v1/files/$OF/content > "$OUT/serve_output.jsonl"
        kill $SP
        wait $SP 2>/dev/null
        cp $H/serve/batches/*.log "$OUT/" 2>/dev/null
        python3 - "$OUT" "$st" <<'PY' 2>&1 | tee "$OUT/serve_summary.txt"
import json, sys
out, st = sys.argv[1], sys.argv[2]
try:
    lines = [json.loads(l) for l in open(f"{out}/serve_output.jsonl")]
except (OSError, ValueError) as e:
    lines = []
    print(f"no output file ({e})")
ok = sum(1 for l in lines if l.get("response", {}).get("status_code") == 200 and
         l["response"]["body"]["choices"][0]["message"]["content"] is not None)
ids = {l.get("custom_id") for l in lines}
b = json.load(open(f"{out}/serve_batch.json"))
print(f"spill-cuda serve: batch {st}, request_counts {b.get('request_counts')}, {len(lines)} output lines, {ok} "
      f"answered with 200, {len(ids)} distinct custom_ids of 40")
PY
        ;;
    worker)
        # serve's resident worker on the GPU binary: two batches for the same model, one worker, one model open
        H=/tmp/servehome2
        rm -rf $H && mkdir -p $H
        python3 - <<'PY'
import json
with open("/tmp/serve.jsonl", "w") as f:
    for i in range(40):
        f.write(json.dumps({"custom_id": f"s{i}", "method": "POST", "url": "/v1/chat/completions",
                            "body": {"model": "tiny", "messages": [{"role": "user", "content": f"Count to {i}."}],
                                     "max_tokens": 24, "temperature": 0}}) + "\n")
PY
        SPILL_HOME=$H "$B" serve --model tests/data/tiny/tiny-smollm2.gguf --port 8124 > "$OUT/worker_serve.log" 2>&1 &
        SP=$!
        sleep 2
        U=http://127.0.0.1:8124
        for n in 1 2; do
            FID=$(curl -s $U/v1/files -F purpose=batch -F file=@/tmp/serve.jsonl | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
            BID=$(curl -s $U/v1/batches -H 'Content-Type: application/json' \
                -d "{\"input_file_id\":\"$FID\",\"endpoint\":\"/v1/chat/completions\",\"completion_window\":\"24h\"}" |
                python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
            for i in $(seq 1 120); do
                curl -s $U/v1/batches/$BID > "$OUT/worker_batch$n.json"
                st=$(python3 -c 'import json; print(json.load(open("'"$OUT/worker_batch$n.json"'"))["status"])' 2>/dev/null)
                [ "$st" = completed ] || [ "$st" = failed ] && break
                sleep 1
            done
            OF=$(python3 -c 'import json; print(json.load(open("'"$OUT/worker_batch$n.json"'")).get("output_file_id") or "")')
            [ -n "$OF" ] && curl -s $U/v1/files/$OF/content > "$OUT/worker_output$n.jsonl"
            log "worker: batch $n $BID $st"
        done
        kill $SP
        wait $SP 2>/dev/null
        cat $H/serve/batches/*.log > "$OUT/worker_batches.log" 2>/dev/null
        {
            echo "worker lines: $(grep -c 'spill worker' "$OUT/worker_batches.log")"
            echo "distinct worker pids: $(grep -o 'spill worker [0-9]*' "$OUT/worker_batches.log" | sort -u | wc -l)"
            echo "model opened: $(grep -c 'model opened' "$OUT/worker_batches.log")"
            for n in 1 2; do
                echo "batch $n: $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1])).get("request_counts"))' "$OUT/worker_batch$n.json") lines $(wc -l < "$OUT/worker_output$n.jsonl" 2>/dev/null)"
            done
            python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
a = [{json.loads(l)["custom_id"]: json.loads(l)["response"]["body"]["choices"][0]["message"]["content"]
      for l in open(f"{out}/worker_output{n}.jsonl")} for n in (1, 2)]
print(f"answers equal between the two batches: {sum(a[0][k] == a[1].get(k) for k in a[0])} of {len(a[0])}")
PY
        } 2>&1 | tee "$OUT/worker_summary.txt"
        ;;
    tilemin)
        # the attention plan's threshold A/B: SPILL_CUDA_TILE_MIN=8 (before 1b69c5c) against the default, at K in KS
        M=/tmp/s70b-L$LAYERS-bf16.gguf
        [ -f "$M" ] || runlog synth_bf16 600 "$B" synth --like llama3-70b --layers "$LAYERS" --sparse -o "$M"
        for k in $KS; do
            for tm in ${TMS:-8 default}; do
                if [ "$tm" = default ]; then unset SPILL_CUDA_TILE_MIN; else export SPILL_CUDA_TILE_MIN=$tm; fi
                runlog "tile${tm}_k$k" 300 "$B" bench "$M" --tiers gpu-pinned --batches "$ROWS" --prompt 1000 \
                    --gen 6 --verify "$k" --seconds 60 -o "$OUT/tile${tm}_k$k"
                echo "tile-min $tm K=$k: $(grep -E "^gpu-pinned +$ROWS " "$OUT/tile${tm}_k$k.log" | tail -1)" |
                    tee -a "$OUT/tilemin_summary.txt"
            done
        done
        unset SPILL_CUDA_TILE_MIN
        ;;
    chunk)
        OUT=$OUT/chunk QUANTS=q4 ROWS=${ROWS_C:-1024} BATCH=${BATCH_C:-256} tools/device_chunk.sh chunk
        ;;
    *)
        log "unknown step $s (steps: tests verify spec serve worker tilemin chunk)"
        FAILED=1
        ;;
    esac
done
exit $FAILED
