#!/usr/bin/env bash
# device_prefix70b.sh — issue 19's H200 benchmark: shared 1,000-token documents x 30 questions of 50 tokens each,
# 128 new tokens, on the 70B shape with int8 KV, with and without the prefix cache, in one call:
#   run(command="tar -xJf .carry/pack.tar.xz && OUT=$OUT/prefix70b tools/device_prefix70b.sh", carry=[".carry/pack.tar.xz"])
# The one-GPU machine has 128 GiB of RAM, so the 80 layers (141 GB bf16) cannot be pinned: the model is LAYERS
# (default 16) of the 70B's layers (spill synth --sparse: throughput only), every layer streamed from pinned RAM each
# pass, and the KV memory is capped at LAYERS/80 of the 130.5 GB the 80-layer model gets on this GPU (int8 pages:
# bench/results/device-b1-80-p1000-int8-run13), so a row costs the KV share it would cost at 80 layers and the rows
# per pass are the 80-layer model's.  Pass times are LAYERS/80 of the 80-layer model's; the ratios on vs off are
# what the benchmark reports.
# DOCS documents (default 72) x 30 questions = 2,160 rows, file order document by document.  Writes the two runs'
# logs and pass logs, and summary.txt: rows per pass (the pre-run batch and the largest pass), prompt tokens computed,
# whole-job decode tok/s (wall time from start to done, ready time included), the answers compared.
# A dry run of the script on the CPU: SPILL=./spill MODEL=tests/data/tiny/tiny-smollm2.gguf ENGINE=--cpu DOCS=2
#   (the tiny model's context is 512: LEN=200 makes the documents 200 tokens)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/results/device-prefix70b}
. tools/device_env.sh
LAYERS=${LAYERS:-16}
DOCS=${DOCS:-72}
SPILL=${SPILL:-$BIN/spill-cuda}
M=${MODEL:-/tmp/s70b-L$LAYERS-bf16-sparse.gguf}
ENGINE=${ENGINE:---gpu --stream --resident-layers 0 --kv-dtype int8}
KVCAP=${KVCAP:-$(python3 -c "print(int(130.52e9 * $LAYERS / 80))")}
[ -f "$M" ] || runlog synth 600 "$SPILL" synth --like llama3-70b --layers "$LAYERS" --quant bf16 --sparse -o "$M"
python3 - "$DOCS" "${LEN:-1000}" "${VOCAB:-120000}" <<'PY'
import json, random, sys
docs, length, vocab = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
with open("/tmp/px70.jsonl", "w") as f:
    for d in range(docs):
        rd = random.Random(1000 + d)
        doc = [rd.randrange(300, vocab) for _ in range(length)]
        for q in range(30):
            rq = random.Random(d * 100 + q)
            f.write(json.dumps({"custom_id": f"d{d}-q{q}", "method": "POST", "url": "/v1/completions",
                                "body": {"model": "s70b", "prompt": doc + [rq.randrange(300, vocab) for _ in range(50)],
                                         "max_tokens": 128, "temperature": 0}}) + "\n")
PY
for mode in off on; do
    rm -rf "/tmp/jpx-$mode"
    s=$(date +%s.%N)
    runlog "run-$mode" "${RUN_TIMEOUT:-420}" "$SPILL" run "$M" /tmp/px70.jsonl -o "/tmp/jpx-$mode" $ENGINE --kv-mem "$KVCAP" --prefix-cache "$mode" --pass-log "$OUT/passes-$mode.csv"
    echo "$(date +%s.%N) $s" > "$OUT/wall-$mode.txt"
done
python3 - "$OUT" "$LAYERS" "$DOCS" "$KVCAP" <<'PY' 2>&1 | tee "$OUT/summary.txt"
import csv, re, statistics as st, sys
out, layers, docs, kvcap = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
print(f"70B shape, {layers} of 80 layers bf16 streamed from pinned RAM, int8 KV capped at {kvcap/1e9:.1f} GB "
      f"({layers}/80 of the 80-layer model's 130.5 GB), {docs} documents of 1,000 tokens x 30 questions of 50 tokens, "
      f"128 new tokens, greedy")
res = {}
for mode in ("off", "on"):
    try:
        P = list(csv.DictReader(open(f"{out}/passes-{mode}.csv")))
        log = open(f"{out}/run-{mode}.log").read()
        end, start = map(float, open(f"{out}/wall-{mode}.txt").read().split())
    except OSError as e:
        print(f"{mode}: no figures ({e})")
        continue
    if not P:
        print(f"{mode}: no passes logged")
        continue
    batch = re.search(r"· batch (\d+)", log)
    maxr = max(int(p["seqs"]) for p in P)
    full = [float(p["seconds"]) for p in P if int(p["seqs"]) == maxr and int(p["prefill_tokens"]) == 0]
    dec = sum(int(p["decode_tokens"]) for p in P)
    pre = sum(int(p["prefill_tokens"]) for p in P)
    wall = end - start
    done = [l for l in log.splitlines() if l.startswith("done") or l.startswith("prefix cache")]
    res[mode] = dict(maxr=maxr, tok=dec / wall, passes=len(P))
    print(f"{mode}: pre-run batch {batch.group(1) if batch else '?'}; largest pass {maxr} rows; {len(P)} passes; "
          f"prompt tokens computed {pre}; full-batch clean passes {len(full)} median "
          f"{st.median(full) if full else float('nan'):.3f} s; {dec} tokens in {wall:.1f} s = {dec / wall:.0f} tok/s "
          f"whole job (pass time alone {dec / float(P[-1]['elapsed']):.0f} tok/s)")
    for l in done:
        print(f"  {mode}: {l}")
if len(res) == 2:
    print(f"prefix cache on vs off: {res['on']['maxr'] / res['off']['maxr']:.2f}x the rows per pass (target >= 3x), "
          f"{res['on']['tok'] / res['off']['tok']:.2f}x the whole-job tok/s (target >= 2.5x), "
          f"{res['off']['passes']} -> {res['on']['passes']} passes")
PY
{ echo "answers, cache on vs off:"; python3 tools/same_answers.py /tmp/jpx-off/results.jsonl /tmp/jpx-on/results.jsonl; } 2>&1 | tee -a "$OUT/summary.txt"
[ -z "${MODEL:-}" ] && rm -f "$M"
exit $FAILED
