"""serve_client.py — drives `spill serve` with the official openai client (test_serve.c runs it).

usage: serve_client.py SPILL_BIN MODEL PORT WORKDIR
Starts the server itself (so that it can kill -9 and restart it), with SPILL_HOME=WORKDIR/home.
Prints one line per check and exits 1 on the first failure.
"""
import http.client, json, os, signal, socket, subprocess, sys, time

import openai

BIN, MODEL, PORT, WORK = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
KEY = "sk-spill-test-key"
checks = 0


def ok(cond, what):
    global checks
    if not cond:
        print("FAIL:", what)
        sys.exit(1)
    checks += 1
    print("ok", what)


def start():
    env = dict(os.environ, SPILL_HOME=os.path.join(WORK, "home"))
    log = open(os.path.join(WORK, "serve.log"), "a")
    p = subprocess.Popen([BIN, "serve", "--model", MODEL, "--model", MODEL2, "--port", str(PORT), "--keys", keys,
                          "--max-upload", "64K"], env=env, stdout=log, stderr=log)
    for _ in range(200):
        try:
            c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=2)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                return p
        except OSError:
            time.sleep(0.05)
    ok(False, "the server answers /health")


def raw(method, path, body=None, headers=None):
    c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=10)
    c.request(method, path, body=body, headers=headers or {})
    r = c.getresponse()
    return r.status, r.read()


def rows_file(name, n, tokens):
    path = os.path.join(WORK, name)
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
                                "body": {"model": "tiny", "temperature": 0, "max_tokens": tokens + 12 * i,
                                         "messages": [{"role": "user", "content": f"count to {i}"}]}}) + "\n")
    return path


def wait(client, bid, states, secs=120):
    t = time.time()
    while time.time() - t < secs:
        b = client.batches.retrieve(bid)
        if b.status in states:
            return b
        time.sleep(0.2)
    ok(False, f"batch {bid} reaches {states}")


def worker_log(bid):
    """(pids of the workers that ran the batch, the "model opened" lines) from the batch's log (run_worker.c)."""
    text = open(os.path.join(WORK, "home", "serve", "batches", bid + ".log")).read()
    pids = {l.split()[2].rstrip(":") for l in text.splitlines() if l.startswith("spill worker ") and ": job " in l}
    return pids, text.count("model opened")


def answers(client, b):
    out = {}
    if b.output_file_id:
        for line in client.files.content(b.output_file_id).text.splitlines():
            j = json.loads(line)
            out[j["custom_id"]] = j["response"]["body"]["choices"][0]["message"]["content"]
    return out


# a second model for the worker switch: the tiny fixture under another path (the worker's key is the path)
MODEL2 = os.path.join(WORK, "tiny-copy.gguf")
with open(MODEL, "rb") as src, open(MODEL2, "wb") as dst:
    dst.write(src.read())
keys = os.path.join(WORK, "keys")
with open(keys, "w") as f:
    f.write("# test keys\n" + KEY + "\n")
os.chmod(keys, 0o644)
env = dict(os.environ, SPILL_HOME=os.path.join(WORK, "home"))
r = subprocess.run([BIN, "serve", "--model", MODEL, "--port", str(PORT), "--keys", keys], env=env,
                   capture_output=True, text=True)
ok(r.returncode == 2 and "readable by every user" in r.stderr, "a world-readable keys file is refused")
os.chmod(keys, 0o600)

import atexit
srv = start()
atexit.register(lambda: srv.kill())
client = openai.OpenAI(base_url=f"http://127.0.0.1:{PORT}/v1", api_key=KEY, max_retries=0)

# abuse: keys
for hdr in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic " + KEY}):
    for path in ("/v1/files", "/v1/batches", "/v1/models"):
        st, body = raw("GET", path, headers=hdr)
        ok(st == 401 and json.loads(body)["error"]["code"] == "invalid_api_key", f"401 for {path} with {hdr}")
st, body = raw("GET", "/")
ok(st == 200 and b"batch_" not in body and b"file-" not in body, "the status page shell shows nothing of the store")

# upload, create, poll, download
inp = rows_file("in.jsonl", 6, 8)
f = client.files.create(file=open(inp, "rb"), purpose="batch")
ok(f.id.startswith("file-") and f.bytes == os.path.getsize(inp) and f.purpose == "batch", "upload")
ok(client.files.retrieve(f.id).filename == "in.jsonl", "retrieve a file")
ok(client.files.content(f.id).content == open(inp, "rb").read(), "file content round-trips")
b = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h",
                          metadata={"k": "v"})
ok(b.status == "validating" and b.request_counts.total == 0 and b.expires_at == b.created_at + 86400, "create")
b = wait(client, b.id, ("completed", "failed"))
ok(b.status == "completed" and b.request_counts.completed == 6 and b.request_counts.failed == 0, "batch completes")
ref = answers(client, b)
ok(sorted(ref) == [f"r{i}" for i in range(6)], "the output file holds every row once")
ok(client.files.retrieve(b.output_file_id).purpose == "batch_output", "the output file's purpose")

# the resident worker (issue 17): a second batch for the same model runs on the same worker, which opened the
# model once, and answers as a fresh `spill run` of the same input does (greedy: equal, not close)
b2 = wait(client, client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions",
                                        completion_window="24h").id, ("completed", "failed"))
ok(b2.status == "completed" and b2.request_counts.completed == 6, "a second batch for the same model completes")
(p1, o1), (p2, o2) = worker_log(b.id), worker_log(b2.id)
ok(len(p1) == 1 and p1 == p2, f"both batches ran on one worker (pid {p1}, {p2})")
ok(o1 == 1 and o2 == 0, f"the worker opened the model once ({o1} + {o2} opens)")
fresh = os.path.join(WORK, "fresh")
r = subprocess.run([BIN, "run", MODEL, inp, "-o", fresh, "--quiet"], env=env, capture_output=True, text=True)
fr = {}
for line in open(os.path.join(fresh, "results.jsonl")) if r.returncode == 0 else []:
    j = json.loads(line)
    fr[j["custom_id"]] = j["response"]["body"]["choices"][0]["message"]["content"]
ok(r.returncode == 0 and answers(client, b2) == fr == ref, "the reused worker's answers equal a fresh spill run's")
# a batch naming the second model: another worker, which opens that model
inp2 = os.path.join(WORK, "in2.jsonl")
with open(inp2, "w") as fh:
    for line in open(inp):
        j = json.loads(line)
        j["body"]["model"] = MODEL2
        fh.write(json.dumps(j) + "\n")
b3 = wait(client, client.batches.create(input_file_id=client.files.create(file=open(inp2, "rb"), purpose="batch").id,
                                        endpoint="/v1/chat/completions", completion_window="24h").id,
          ("completed", "failed"))
p3, o3 = worker_log(b3.id)
ok(b3.status == "completed" and len(p3) == 1 and p3 != p1 and o3 == 1 and answers(client, b3) == ref,
   "a batch for another model switches workers (a new pid that opens its model) and answers the same")

# a file that fails validation: errors with line numbers
bad = os.path.join(WORK, "bad.jsonl")
with open(bad, "w") as fh:
    fh.write(open(inp).readline())
    fh.write(open(inp).readline())  # duplicate custom_id on line 2
fb = client.files.create(file=open(bad, "rb"), purpose="batch")
bb = wait(client, client.batches.create(input_file_id=fb.id, endpoint="/v1/chat/completions",
                                        completion_window="24h").id, ("failed", "completed"))
ok(bb.status == "failed" and bb.errors.data[0].line == 2 and bb.errors.data[0].code == "duplicate_custom_id",
   "validation failure: errors name the line")
fm = client.files.create(file=open(inp, "rb"), purpose="batch")
bm = wait(client, client.batches.create(input_file_id=fm.id, endpoint="/v1/completions",
                                        completion_window="24h").id, ("failed", "completed"))
ok(bm.status == "failed" and bm.errors.data[0].code == "url_mismatch", "url_mismatch against the endpoint")

# pagination
ids, page = [], client.batches.list(limit=1)
for x in page:
    ids.append(x.id)
ok(len(ids) == 5 and len(set(ids)) == 5, "batches list paginates (limit=1) over all five")
fids = [x.id for x in client.files.list()]
ok(len(fids) >= 4 and len(set(fids)) == len(fids), "files list")

# abuse: size, multipart, ids
big = b"x" * (70 * 1024)
st, body = raw("POST", "/v1/files", body=big, headers={"Authorization": "Bearer " + KEY,
               "Content-Type": "multipart/form-data; boundary=zz"})
ok(st == 413, "413 for an upload above --max-upload (Content-Length)")
try:
    client.files.create(file=("big.jsonl", big), purpose="batch")
    ok(False, "oversize upload refused")
except openai.APIStatusError as e:
    ok(e.status_code == 413, "413 through the client")
st, body = raw("POST", "/v1/files", body=b"--zz\r\nbroken", headers={"Authorization": "Bearer " + KEY,
               "Content-Type": "multipart/form-data; boundary=zz"})
ok(st == 400, "400 for malformed multipart")
st, body = raw("POST", "/v1/files", body=b"{}", headers={"Authorization": "Bearer " + KEY,
               "Content-Type": "application/json"})
ok(st == 400, "400 for an upload that is not multipart")
for bad_id in ("../../etc/passwd", "file-..%2F..%2Fetc%2Fpasswd", "file-%00aaaaaaaaaaaaaaaaaaaaaaa",
               f.id + "%00", f.id[:-1] + "/", "file-" + "a" * 25, "batch_" + "../" * 8):
    for path in (f"/v1/files/{bad_id}", f"/v1/files/{bad_id}/content", f"/v1/batches/{bad_id}"):
        st, body = raw("GET", path, headers={"Authorization": "Bearer " + KEY})
        ok(st == 404 and b"root:" not in body, f"404 for {path}")

# a slow client holds a connection while a batch runs; cancel mid-run keeps the answered rows
slow = socket.create_connection(("127.0.0.1", PORT))
slow.send(b"POST /v1/batches HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode() +
          b"\r\nContent-Length: 100\r\n\r\n{")
long_in = rows_file("long.jsonl", 40, 5)
fl = client.files.create(file=open(long_in, "rb"), purpose="batch")
bl = client.batches.create(input_file_id=fl.id, endpoint="/v1/chat/completions", completion_window="24h")
t = time.time()
while time.time() - t < 120:
    x = client.batches.retrieve(bl.id)
    if x.request_counts.completed >= 1:
        break
    time.sleep(0.1)
ok(x.status == "in_progress" and 0 < x.request_counts.completed < 40, "request_counts grow while it runs")
# the status page's view of the running batch (GET /v1/batches/{id}/progress): a key needed; the counts as the API's
st, _ = raw("GET", f"/v1/batches/{bl.id}/progress")
ok(st == 401, "the running batch's progress needs a key")
st, body = raw("GET", f"/v1/batches/{bl.id}/progress", headers={"Authorization": "Bearer " + KEY})
pj = json.loads(body) if st == 200 else {}
ok(st == 200 and pj["counts"]["total"] == 40 and pj["counts"]["completed"] >= x.request_counts.completed,
   "the progress counts agree with request_counts")
ok(pj.get("plan", "").startswith(("spill run: ", "spill resume: ")), "the progress shows the job's pre-run line")
ok(pj["passes"] >= 1 and pj["chart_tok_s"].lstrip().startswith("<") and "</svg>" in pj["chart_seconds"],
   "the progress carries the pass charts (SVG)")
ok(all(t["custom_id"] in {f"r{i}" for i in range(40)} and t["status_code"] == 200 for t in pj["tail"]) and pj["tail"],
   "the progress's tail holds answered rows")
c = client.batches.cancel(bl.id)
ok(c.status == "cancelling", "cancel → cancelling")
c = wait(client, bl.id, ("cancelled",))
got = answers(client, c)
ok(c.request_counts.completed == len(got) and len(got) >= 1 and len(got) < 40,
   f"cancelled keeps the {len(got)} answered rows in the output file")
slow.close()

# the completion window runs out mid-batch (spill takes "2s" as well as OpenAI's "24h"): expired, the answered rows
# in the output file, every other row once in the error file with code batch_expired, counted as failed
st, body = raw("POST", "/v1/batches", body=json.dumps({"input_file_id": fl.id, "endpoint": "/v1/chat/completions",
               "completion_window": "25x"}), headers={"Authorization": "Bearer " + KEY, "Content-Type": "application/json"})
ok(st == 400 and b"completion_window" in body, "400 for a completion_window that is not a duration")
be = client.batches.create(input_file_id=fl.id, endpoint="/v1/chat/completions", completion_window="2s")
ok(be.expires_at - be.created_at == 2, "expires_at = created_at + the window")
e = wait(client, be.id, ("expired", "completed"), 120)
ok(e.status == "expired" and e.expired_at and e.expired_at >= e.expires_at, "the batch expires at its window's end")
got_e = answers(client, e)
err_lines = [json.loads(l) for l in client.files.content(e.error_file_id).text.splitlines()] if e.error_file_id else []
exp_ids = [l["custom_id"] for l in err_lines if (l.get("error") or {}).get("code") == "batch_expired"]
ok(len(exp_ids) >= 1 and e.request_counts.failed == len(err_lines) and e.request_counts.completed == len(got_e),
   f"expired: {len(got_e)} answered rows kept, {len(exp_ids)} batch_expired lines, counted as failed")
ok(sorted(list(got_e) + exp_ids) == sorted(f"r{i}" for i in range(40)) and e.request_counts.total == 40,
   "every row once: answered or expired")

# kill -9 mid-batch, restart: the same results as uninterrupted
fk = client.files.create(file=open(long_in, "rb"), purpose="batch")
refb = wait(client, client.batches.create(input_file_id=fk.id, endpoint="/v1/chat/completions",
                                          completion_window="24h").id, ("completed",), 300)
want = answers(client, refb)
ok(worker_log(refb.id)[0] == worker_log(bl.id)[0] and worker_log(refb.id)[1] == 0,
   "after the cancel (and the expiry) the same worker, model kept, completes the next batch")
bk = client.batches.create(input_file_id=fk.id, endpoint="/v1/chat/completions", completion_window="24h")
t = time.time()
while time.time() - t < 120:
    x = client.batches.retrieve(bk.id)
    if x.request_counts.completed >= 2:
        break
    time.sleep(0.1)
srv.send_signal(signal.SIGKILL)
srv.wait()
time.sleep(0.5)
srv = start()
atexit.register(lambda: srv.kill())
x = wait(client, bk.id, ("completed", "failed"), 300)
lines = client.files.content(x.output_file_id).text.splitlines()
ids = [json.loads(l)["custom_id"] for l in lines]
ok(x.status == "completed" and len(ids) == 40 and len(set(ids)) == 40, "after kill -9 and restart: 40 rows, none twice")
ok(answers(client, x) == want, "the same answers as the uninterrupted batch")

# kill -9 of the worker (not the server) mid-batch: a fresh worker resumes the batch; no row lost or twice
bw = client.batches.create(input_file_id=fk.id, endpoint="/v1/chat/completions", completion_window="24h")
t = time.time()
while time.time() - t < 120:
    x = client.batches.retrieve(bw.id)
    if x.request_counts.completed >= 2:
        break
    time.sleep(0.1)
dead = worker_log(bw.id)[0]
for pid in dead:
    os.kill(int(pid), signal.SIGKILL)
x = wait(client, bw.id, ("completed", "failed"), 300)
ids = [json.loads(l)["custom_id"] for l in client.files.content(x.output_file_id).text.splitlines()]
pw = worker_log(bw.id)[0]
ok(x.status == "completed" and len(ids) == 40 and len(set(ids)) == 40 and answers(client, x) == want and
   len(dead) == 1 and len(pw) == 2, "a worker killed mid-batch: a fresh one resumes it, every row once, same answers")

# an embeddings batch through the gateway: CreateEmbeddingResponse bodies in the output file
emb_in = os.path.join(WORK, "emb.jsonl")
with open(emb_in, "w") as fh:
    for i in range(3):
        fh.write(json.dumps({"custom_id": f"e{i}", "method": "POST", "url": "/v1/embeddings",
                            "body": {"model": "tiny", "input": [f"text {i}", "another"]}}) + "\n")
fe = client.files.create(file=open(emb_in, "rb"), purpose="batch")
eb = wait(client, client.batches.create(input_file_id=fe.id, endpoint="/v1/embeddings", completion_window="24h").id,
          ("completed", "failed"), 120)
elines = [json.loads(l) for l in client.files.content(eb.output_file_id).text.splitlines()] if eb.output_file_id else []
ok(eb.status == "completed" and len(elines) == 3 and all(
    openai.types.CreateEmbeddingResponse.model_validate(l["response"]["body"]).data[1].index == 1 for l in elines),
   "an embeddings batch answers CreateEmbeddingResponse bodies")

# spill run --status-port: the same view for a job started on the command line, on 127.0.0.1 with a printed key
sp = PORT + 1 if PORT < 65535 else PORT - 1
run_in = rows_file("status.jsonl", 24, 30)
log = open(os.path.join(WORK, "status-run.log"), "w+")
env = dict(os.environ, SPILL_HOME=os.path.join(WORK, "home"))
run = subprocess.Popen([BIN, "run", MODEL, run_in, "-o", os.path.join(WORK, "status-job"), "--cpu", "--batch", "2",
                        "--status-port", str(sp), "--quiet"], env=env, stdout=subprocess.DEVNULL, stderr=log)
url = None
t = time.time()
while time.time() - t < 60 and url is None and run.poll() is None:
    log.seek(0)
    for line in log:
        if "status page at http://127.0.0.1:" in line:
            url = line.split("status page at ")[1].strip()
    time.sleep(0.05)
ok(url is not None and "#key=" in url, "spill run --status-port prints the page's URL with a key")
rkey = url.split("#key=")[1]
def sget(path, key=None):
    c = http.client.HTTPConnection("127.0.0.1", sp, timeout=10)
    c.request("GET", path, headers={"Authorization": "Bearer " + key} if key else {})
    r = c.getresponse()
    return r.status, r.read()
st, page = sget("/")
ok(st == 200 and b"/progress" in page and b"<script>" in page and b"r0" not in page, "the run's page shell")
st, _ = sget("/progress")
ok(st == 401, "the run's progress needs its key")
st, _ = sget("/progress", "0" * 32)
ok(st == 401, "a wrong key is refused")
seen = None
t = time.time()
while time.time() - t < 60 and run.poll() is None:
    st, body = sget("/progress", rkey)
    pj = json.loads(body)
    if pj["passes"] >= 2 and pj["tail"]:
        seen = pj
        break
    time.sleep(0.1)
ok(seen is not None and seen["counts"]["total"] == 24 and seen["plan"].startswith("spill run: ") and
   "</svg>" in seen["chart_tok_s"] and seen["last_pass"]["rows"] >= 1, "the run's progress while it runs")
ok(run.wait(120) == 0, "the job with a status page completes")
# delete
d = client.files.delete(f.id)
ok(d.deleted and d.id == f.id, "delete a file")
st, _ = raw("GET", f"/v1/files/{f.id}", headers={"Authorization": "Bearer " + KEY})
ok(st == 404, "a deleted file is gone")
srv.send_signal(signal.SIGTERM)
srv.wait(30)

# IPv6: --host ::1 (when this machine has IPv6 loopback; containers often lack it)
try:
    probe = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    probe.bind(("::1", 0))
    probe.close()
    have6 = True
except OSError:
    have6 = False
if have6:
    p6 = PORT + 2 if PORT < 65533 else PORT - 2
    s6 = subprocess.Popen([BIN, "serve", "--model", MODEL, "--host", "::1", "--port", str(p6), "--keys", keys], env=env,
                          stdout=subprocess.DEVNULL, stderr=open(os.path.join(WORK, "serve6.log"), "w"))
    st6 = None
    for _ in range(200):
        try:
            c = http.client.HTTPConnection("::1", p6, timeout=2)
            c.request("GET", "/v1/models", headers={"Authorization": "Bearer " + KEY})
            r6 = c.getresponse()
            st6 = r6.status, json.loads(r6.read())
            break
        except OSError:
            time.sleep(0.05)
    ok(st6 is not None and st6[0] == 200 and st6[1]["data"], "--host ::1 serves over IPv6")
    s6.send_signal(signal.SIGTERM)
    s6.wait(30)
else:
    print("skip: no IPv6 loopback here; --host ::1 not checked")
print(f"{checks} checks passed")
