"""bench_serve.py — 1,000 concurrent polls of GET /v1/batches/{id} against `spill serve` while a batch runs.

usage: bench_serve.py SPILL_BIN MODEL [PORT] [CONCURRENCY] [ROUNDS]
Starts the server (SPILL_HOME in a temporary directory), uploads a batch that keeps the worker busy, then opens
CONCURRENCY connections at once, each sending ROUNDS GET requests one after another (keep-alive), and reports the
latency percentiles of every GET.  Reported, not asserted (target: p99 under 100 ms).
"""
import asyncio, json, os, subprocess, sys, tempfile, time, urllib.request

BIN, MODEL = sys.argv[1], sys.argv[2]
PORT = int(sys.argv[3]) if len(sys.argv) > 3 else 18500
CONC = int(sys.argv[4]) if len(sys.argv) > 4 else 1000
ROUNDS = int(sys.argv[5]) if len(sys.argv) > 5 else 5
KEY = "sk-bench"


def api(method, path, body=None, ctype="application/json"):
    req = urllib.request.Request(f"http://127.0.0.1:{PORT}{path}", data=body, method=method,
                                 headers={"Authorization": "Bearer " + KEY, "Content-Type": ctype})
    return json.load(urllib.request.urlopen(req))


async def poller(path, lat):
    r, w = await asyncio.open_connection("127.0.0.1", PORT)
    msg = f"GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n\r\n".encode()
    for _ in range(ROUNDS):
        t = time.perf_counter()
        w.write(msg)
        await w.drain()
        head = await r.readuntil(b"\r\n\r\n")
        n = int([l for l in head.split(b"\r\n") if l.lower().startswith(b"content-length:")][0].split(b":")[1])
        await r.readexactly(n)
        lat.append(time.perf_counter() - t)
    w.close()


async def main(path):
    lat = []
    t = time.perf_counter()
    await asyncio.gather(*(poller(path, lat) for _ in range(CONC)))
    return lat, time.perf_counter() - t


with tempfile.TemporaryDirectory() as d:
    keys = os.path.join(d, "keys")
    open(keys, "w").write(KEY + "\n")
    os.chmod(keys, 0o600)
    srv = subprocess.Popen([BIN, "serve", "--model", MODEL, "--port", str(PORT), "--keys", keys],
                           env=dict(os.environ, SPILL_HOME=os.path.join(d, "home")),
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.5)
        rows = "".join(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
                                   "body": {"model": "tiny", "max_tokens": 400, "temperature": 0,
                                            "messages": [{"role": "user", "content": f"row {i}"}]}}) + "\n"
                       for i in range(200))
        b = "zzbench"
        body = (f"--{b}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n--{b}\r\n"
                f"Content-Disposition: form-data; name=\"file\"; filename=\"in.jsonl\"\r\n\r\n{rows}\r\n--{b}--\r\n")
        f = api("POST", "/v1/files", body.encode(), "multipart/form-data; boundary=" + b)
        bt = api("POST", "/v1/batches", json.dumps({"input_file_id": f["id"], "endpoint": "/v1/chat/completions",
                                                    "completion_window": "24h"}).encode())
        while api("GET", "/v1/batches/" + bt["id"])["status"] != "in_progress":
            time.sleep(0.05)
        lat, wall = asyncio.run(main("/v1/batches/" + bt["id"]))
        during = api("GET", "/v1/batches/" + bt["id"])
        lat.sort()
        q = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))] * 1000
        print(f"spill serve: {CONC} concurrent connections x {ROUNDS} GET /v1/batches/ID each = {len(lat)} requests "
              f"in {wall:.2f} s ({len(lat) / wall:.0f} req/s) while a batch ran (status {during['status']}, "
              f"{during['request_counts']['completed']}/{during['request_counts']['total']} rows done)")
        print(f"GET latency ms: p50 {q(0.50):.1f}  p90 {q(0.90):.1f}  p99 {q(0.99):.1f}  max {lat[-1] * 1000:.1f}"
              f"  (target p99 < 100 ms)")
    finally:
        srv.kill()
        srv.wait()
