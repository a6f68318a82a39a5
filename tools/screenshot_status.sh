#!/usr/bin/env bash
# tools/screenshot_status.sh [OUT_DIR] — spill serve's status page in headless Chromium during a run.
# Starts ./spill serve on the tiny model (SPILL_HOME in a temp dir), runs one short batch to completion and
# starts a long one, then (1) dumps the page's DOM once the short batch is done and checks that the numbers the
# page shows (completed / failed / total) equal GET /v1/batches' request_counts, and (2) screenshots the page
# while the long batch runs (with the running job's view: charts, plan, tail), and (3) screenshots the page of a
# `spill run --status-port` job.  OUT_DIR (default bench/results/serve-status) gets status.png, run.png, check.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench/results/serve-status}
mkdir -p "$out"
work=$(mktemp -d)
port=${PORT:-18777}
key=sk-shot-$RANDOM$RANDOM
echo "$key" > "$work/keys"; chmod 600 "$work/keys"
SPILL_HOME=$work/home ./spill serve --model tests/data/tiny/tiny-smollm2.gguf --port "$port" --keys "$work/keys" \
    > "$work/serve.log" 2>&1 &
srv=$!
trap 'kill $srv 2>/dev/null; rm -rf "$work"' EXIT
sleep 1
api() { curl -sf -H "Authorization: Bearer $key" "$@"; }
rows() { for i in $(seq 1 "$1"); do
    echo "{\"custom_id\":\"r$i\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{\"model\":\"tiny\",\"max_tokens\":$(( $2 + 7 * i )),\"messages\":[{\"role\":\"user\",\"content\":\"row $i\"}]}}"
done > "$work/in$1.jsonl"; }
batch() { local f; f=$(api -F purpose=batch -F file=@"$1" "http://127.0.0.1:$port/v1/files" | python3 -c 'import json,sys;print(json.load(sys.stdin)["id"])')
    api -H 'Content-Type: application/json' -d "{\"input_file_id\":\"$f\",\"endpoint\":\"/v1/chat/completions\",\"completion_window\":\"24h\"}" \
        "http://127.0.0.1:$port/v1/batches" | python3 -c 'import json,sys;print(json.load(sys.stdin)["id"])'; }
status() { api "http://127.0.0.1:$port/v1/batches/$1" | python3 -c 'import json,sys;print(json.load(sys.stdin)["status"])'; }
rows 12 4; b1=$(batch "$work/in12.jsonl")
until [ "$(status "$b1")" = completed ]; do sleep 0.3; done
chrome="chromium --headless --no-sandbox --disable-gpu --virtual-time-budget=4000"
$chrome --dump-dom "http://127.0.0.1:$port/#key=$key" > "$work/dom.html" 2>/dev/null
api "http://127.0.0.1:$port/v1/batches" > "$work/api.json"
python3 - "$work/dom.html" "$work/api.json" "$b1" > "$out/check.txt" <<'PY'
import json, re, sys
dom, api, bid = open(sys.argv[1]).read(), json.load(open(sys.argv[2])), sys.argv[3]
row = re.search(r'<tr data-id="%s">(.*?)</tr>' % bid, dom, re.S).group(1)
shown = {k: int(re.search(r'class="%s">(\d+)<' % k, row).group(1)) for k in ("completed", "failed", "total")}
want = next(b for b in api["data"] if b["id"] == bid)["request_counts"]
print("page", shown, "api", want)
sys.exit(0 if shown == want else 1)
PY
echo "status page numbers equal GET /v1/batches request_counts: $(cat "$out/check.txt")"
rows 60 40; b2=$(batch "$work/in60.jsonl")
until [ "$(status "$b2")" = in_progress ]; do sleep 0.2; done
sleep 2
$chrome --window-size=1100,1500 --screenshot="$out/status.png" "http://127.0.0.1:$port/#key=$key" 2>/dev/null
echo "screenshot: $out/status.png"
# (3) spill run --status-port: the page of a job started on the command line, during its passes
rows 200 60
rport=$((port + 1))
./spill run tests/data/tiny/tiny-smollm2.gguf "$work/in200.jsonl" -o "$work/runjob" --cpu --batch 4 --status-port "$rport" \
    --quiet > /dev/null 2> "$work/run.err" &
job=$!
until grep -q "status page at" "$work/run.err" 2>/dev/null; do sleep 0.2; done
url=$(sed -n 's/.*status page at //p' "$work/run.err")
sleep 4
$chrome --window-size=1100,1500 --screenshot="$out/run.png" "$url" 2>/dev/null
kill $job 2>/dev/null || true
echo "screenshot: $out/run.png"
