#!/usr/bin/env bash
# The prefix cache on the CPU (issue 19): SmolLM2-135M (the default model) on two inputs made by
# tools/gen_prefix_inputs.py from examples/eval-2000.jsonl, each run with and without the cache in one go:
#   sys600-24    24 rows sharing a ~600-token system prompt, 8 new tokens each (the issue's user check);
#   docqa-10x10  10 documents x 10 questions (the issue's CPU benchmark).
# For each: whole-job seconds, prompt tokens computed (prompt tokens less cached_tokens), the summary lines, and
# whether the answers are the same row by row (tools/same_answers.py).  What bounds the figure: a CPU pass costs
# its FLOPs, so the job's time follows the prompt tokens computed; the bound printed is off_time x computed_on /
# computed_off plus the decode time the cache cannot save.
# usage: bench/prefix_cpu.sh OUT_DIR   (needs ./spill from `make` and the default model from tools/setup.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: bench/prefix_cpu.sh OUT_DIR}
mkdir -p "$out"
python3 tools/gen_prefix_inputs.py "$out"
{
    echo "# prefix cache, CPU, $(git rev-parse --short HEAD), $(date -u +%FT%TZ), $(nproc) cores"
    echo "# load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
} > "$out/report.md"
for input in sys600-24 docqa-10x10; do
    for mode in off on; do
        dir="$out/$input-$mode"
        rm -rf "$dir"
        t0=$(date +%s.%N)
        ./spill run smollm2:135m "$out/$input.jsonl" -o "$dir" --cpu --prefix-cache "$mode" --quiet \
            > "$out/$input-$mode.log" 2>&1
        t1=$(date +%s.%N)
        python3 - "$dir/results.jsonl" "$input" "$mode" "$t0" "$t1" >> "$out/report.md" <<'EOF'
import json, sys
path, name, mode, t0, t1 = sys.argv[1:]
prompt = cached = gen = rows = 0
for line in open(path, encoding="utf-8"):
    u = json.loads(line)["response"]["body"]["usage"]
    rows += 1
    prompt += u["prompt_tokens"]
    gen += u["completion_tokens"]
    cached += u.get("prompt_tokens_details", {}).get("cached_tokens", 0)
print(f"{name} prefix-cache {mode}: {rows} rows, {float(t1) - float(t0):.1f} s, prompt tokens {prompt}, "
      f"cached {cached}, computed {prompt - cached}, generated {gen}")
EOF
        grep -h "^prefix cache:\|^done:" "$out/$input-$mode.log" | sed 's/^/    /' >> "$out/report.md" || true
    done
    echo "    same answers: $(python3 tools/same_answers.py "$out/$input-off/results.jsonl" \
        "$out/$input-on/results.jsonl" | head -1)" >> "$out/report.md"
done
cat "$out/report.md"
