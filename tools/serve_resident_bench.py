"""Per-batch wall time: a fresh `spill run` child per batch vs jobs on one `spill worker` (the 2nd..Nth).

usage: .venv/bin/python tools/serve_resident_bench.py ./spill MODEL.gguf   (4 rows of 16 tokens, 5 batches each;
the worker is driven over its own protocol, run_worker.c, as spill serve drives it; answers compared for equality)
"""
import json, os, subprocess, sys, tempfile, time
BIN, MODEL, N = sys.argv[1], sys.argv[2], 5
W = tempfile.mkdtemp(prefix="spill-resident-")
env = dict(os.environ, SPILL_HOME=W + "/home")
inp = W + "/in.jsonl"
with open(inp, "w") as f:
    for i in range(4):
        f.write(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
                            "body": {"model": "m", "temperature": 0, "max_tokens": 16,
                                     "messages": [{"role": "user", "content": f"count to {i}"}]}}) + "\n")
fresh, ready_f = [], []
for k in range(N):
    t = time.time()
    r = subprocess.run([BIN, "run", MODEL, inp, "-o", f"{W}/f{k}", "--quiet", "--pass-log", f"{W}/f{k}.csv"],
                       env=env, capture_output=True)
    fresh.append(time.time() - t); assert r.returncode == 0, r.stderr
    out = (r.stdout + r.stderr).decode()
    ready_f.append(float(out.split("ready in ")[1].split(" s")[0]))
rd, wr = os.pipe()
p = subprocess.Popen([BIN, "worker", MODEL], stdin=subprocess.PIPE, env=env, pass_fds=(wr,) if wr == 3 else (),
                     preexec_fn=lambda: (os.dup2(wr, 3)), close_fds=False)
os.close(wr); ans = os.fdopen(rd)
warm = []
for k in range(N + 1):
    t = time.time()
    p.stdin.write(f"run\t{inp}\t{W}/w{k}\t{W}/w{k}.csv\t{W}/w{k}.log\n".encode()); p.stdin.flush()
    code = int(ans.readline()); warm.append(time.time() - t); assert code == 0, open(f"{W}/w{k}.log").read()
p.stdin.close(); p.wait()
ra = lambda d: [json.loads(l)["response"]["body"]["choices"][0]["message"]["content"] for l in open(d + "/results.jsonl")]
print("fresh child per batch (s):", " ".join(f"{x:.3f}" for x in fresh), " median %.3f" % sorted(fresh)[N // 2])
print("worker job 1 (opens the model) (s): %.3f" % warm[0])
print("reused worker, jobs 2..%d (s):" % (N + 1), " ".join(f"{x:.3f}" for x in warm[1:]), " median %.3f" % sorted(warm[1:])[N // 2])
ready_w = [float(open(f"{W}/w{k}.log").read().split("ready in ")[1].split(" s")[0]) for k in range(N + 1)]
print("pre-run 'ready in' (open to first pass): fresh", ready_f, "worker", ready_w)
print("answers equal (fresh vs reused):", all(ra(f"{W}/f0") == ra(f"{W}/w{k}") for k in range(N + 1)))
