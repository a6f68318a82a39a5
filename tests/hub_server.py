#!/usr/bin/env python3
"""hub_server.py — a local stand-in for the Hugging Face Hub, for tests/test_hub.c (standard library only).

    python3 tests/hub_server.py LOG      (run from the repository root; prints the port it listens on)

Serves, in the Hub's URL layout, GET /api/models/{org}/{name}/revision/{rev}?blobs=true (the commit and the
siblings with size, blobId and lfs.sha256) and GET /{org}/{name}/resolve/{rev}/{file} (the bytes, honouring
"Range: bytes=N-"), with the Hub's error headers (X-Error-Code: RepositoryNotFound, RevisionNotFound,
EntryNotFound, GatedRepo).  Every request is appended to LOG as one JSON line {"path", "range", "auth"}.

Repos (the files of tests/data/prompt/hf-nobos, a tiny llama with a tokenizer and chat template, unless said):
  test/tiny                    revisions main and v1
  Qwen/Qwen2.5-0.5B-Instruct   what the curated tag qwen2.5:0.5b downloads
  test/gated                   401 without "Authorization: Bearer hf_test_token"
  test/badsum                  model.safetensors listed with a wrong sha256 (every copy fails the check)
  test/flaky                   model.safetensors corrupted on its first download only
  test/drop                    the first download of model.safetensors stops halfway and drops the connection
  test/redirect                model.safetensors answers 302 to /lfs/<sha256>, as LFS files do
  test/mamba                   config.json says model_type mamba
  test/gguf                    tiny-smollm2.Q8_0.gguf (tests/data/tiny/tiny-smollm2.gguf) and a README
"""
import hashlib
import http.server
import json
import os
import socket
import sys
import threading
import urllib.parse

HF = "tests/data/prompt/hf-nobos"
TOKEN = "hf_test_token"
LFS = (".safetensors", ".gguf")


def read(p):
    with open(p, "rb") as f:
        return f.read()


def hf_files():
    return {n: read(os.path.join(HF, n)) for n in sorted(os.listdir(HF))}


def build():
    base = hf_files()
    mamba = dict(base)
    cfg = json.loads(base["config.json"])
    cfg["model_type"] = "mamba"
    cfg["architectures"] = ["MambaForCausalLM"]
    mamba["config.json"] = json.dumps(cfg, indent=2).encode()
    gguf = {"tiny-smollm2.Q8_0.gguf": read("tests/data/tiny/tiny-smollm2.gguf"), "README.md": b"# tiny\n"}
    return {
        "test/tiny": {"revs": {"main": "a" * 40, "v1": "b" * 40}, "files": base},
        "Qwen/Qwen2.5-0.5B-Instruct": {"revs": {"main": "c" * 40}, "files": base},
        "test/gated": {"revs": {"main": "d" * 40}, "files": base, "gated": True},
        "test/badsum": {"revs": {"main": "e" * 40}, "files": base, "badsum": "model.safetensors"},
        "test/flaky": {"revs": {"main": "f" * 40}, "files": base, "flaky": "model.safetensors"},
        "test/drop": {"revs": {"main": "1" * 40}, "files": base, "drop": "model.safetensors"},
        "test/redirect": {"revs": {"main": "2" * 40}, "files": base, "redirect": "model.safetensors"},
        "test/mamba": {"revs": {"main": "3" * 40}, "files": mamba},
        "test/gguf": {"revs": {"main": "4" * 40}, "files": gguf, "gguf": "llama"},
    }


REPOS = build()
LOCK = threading.Lock()
SEEN = {}  # (repo, file) -> downloads served


def sibling(name, data, repo):
    s = {"rfilename": name, "size": len(data),
         "blobId": hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()}
    if name.endswith(LFS):
        sha = hashlib.sha256(data).hexdigest()
        if repo.get("badsum") == name:
            sha = "0" * 64
        s["lfs"] = {"sha256": sha, "size": len(data), "pointerSize": 134}
    return s


class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def error(self, status, code, text):
        body = json.dumps({"error": text}).encode()
        self.send_response(status)
        self.send_header("X-Error-Code", code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def repo_rev(self, org, name, rev):
        repo = REPOS.get(org + "/" + name)
        if repo is None:
            self.error(404, "RepositoryNotFound", "Repository not found")
            return None
        if repo.get("gated") and self.headers.get("Authorization") != "Bearer " + TOKEN:
            self.error(401, "GatedRepo", "Access to this model is restricted: you must be authenticated.")
            return None
        if rev not in repo["revs"]:
            self.error(404, "RevisionNotFound", "Invalid rev id: " + rev)
            return None
        return repo

    def send_bytes(self, data, extra=None):
        start, rng = 0, self.headers.get("Range")
        if rng and rng.startswith("bytes=") and rng.endswith("-"):
            start = int(rng[6:-1])
        if start:
            self.send_response(206)
            self.send_header("Content-Range", "bytes %d-%d/%d" % (start, len(data) - 1, len(data)))
        else:
            self.send_response(200)
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", str(len(data) - start))
        self.end_headers()
        return data[start:]

    def do_GET(self):
        url = urllib.parse.urlsplit(self.path)
        path = urllib.parse.unquote(url.path)
        with LOCK, open(LOG, "a") as log:
            log.write(json.dumps({"path": path, "range": self.headers.get("Range"),
                                  "auth": self.headers.get("Authorization")}) + "\n")
        parts = path.strip("/").split("/")
        if len(parts) >= 6 and parts[:2] == ["api", "models"] and parts[4] == "revision":
            repo = self.repo_rev(parts[2], parts[3], "/".join(parts[5:]))
            if repo is None:
                return
            rev = "/".join(parts[5:])
            info = {"id": parts[2] + "/" + parts[3], "sha": repo["revs"][rev], "gated": bool(repo.get("gated")),
                    "siblings": [sibling(n, d, repo) for n, d in repo["files"].items()]}
            if repo.get("gguf"):
                info["gguf"] = {"architecture": repo["gguf"], "total": 1000}
            body = json.dumps(info).encode()
            self.wfile.write(self.send_bytes(body, {"Content-Type": "application/json"}))
            return
        if len(parts) == 2 and parts[0] == "lfs":
            for repo in REPOS.values():
                for d in repo["files"].values():
                    if hashlib.sha256(d).hexdigest() == parts[1]:
                        self.wfile.write(self.send_bytes(d))
                        return
            self.error(404, "EntryNotFound", "no such object")
            return
        if len(parts) >= 5 and parts[2] == "resolve":
            repo = self.repo_rev(parts[0], parts[1], parts[3])
            if repo is None:
                return
            name = "/".join(parts[4:])
            data = repo["files"].get(name)
            if data is None:
                self.error(404, "EntryNotFound", "Entry not found")
                return
            key = (parts[0] + "/" + parts[1], name)
            with LOCK:
                SEEN[key] = SEEN.get(key, 0) + 1
                first = SEEN[key] == 1
            commit = {"X-Repo-Commit": repo["revs"][parts[3]]}
            if repo.get("redirect") == name:
                self.send_response(302)
                self.send_header("Location", "/lfs/" + hashlib.sha256(data).hexdigest())
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            if repo.get("flaky") == name and first:
                data = bytes([data[0] ^ 0xFF]) + data[1:]
            body = self.send_bytes(data, commit)
            if repo.get("drop") == name and first:
                self.wfile.write(body[: len(body) // 2])
                self.wfile.flush()
                self.connection.shutdown(socket.SHUT_RDWR)
                self.close_connection = True
                return
            self.wfile.write(body)
            return
        self.error(404, "RepositoryNotFound", "no such route")


if __name__ == "__main__":
    LOG = sys.argv[1]
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(srv.server_address[1], flush=True)
    srv.serve_forever()
