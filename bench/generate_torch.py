#!/usr/bin/python3
"""The speed anchor of `scripts/bench generate`: greedy generation with a KV
cache in PyTorch eager on the CPU (Debian's python3-torch), the same weights,
prompt ids, token count and thread count as `troupe generate`.

The loop is the usual eager one (Hugging Face's past_key_values, nanoGPT's
generate with a cache): the prompt's forward fills each layer's k and v, then
every step feeds one token and appends its k and v.

Prints one JSON object: {"impl": "pytorch", "tokens": [...], "seconds": ...,
"tokens_per_s": ...}. Run it with OPENBLAS_CORETYPE set (scripts/bench does).
"""
import argparse
import json
import os
import struct
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "reference"))
from gpt_torch import GPT, read_safetensors  # noqa: E402


def load(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        meta = json.loads(f.read(n)).get("__metadata__", {})
    L, C, NH, T, V = (int(meta[k]) for k in ("n_layer", "n_embd", "n_head", "n_ctx", "vocab_size"))
    model = GPT(L, C, NH, T, V)
    tensors = read_safetensors(path)
    with torch.no_grad():
        for name, p, conv1d in model.hf_tensors():
            t = tensors[name]
            p.copy_(t.t() if conv1d else t)
    return model.eval()


def block_step(block, x, cache):
    """One block over the new positions x (B, n, C); cache: [k, v] or None."""
    B, n, C = x.shape
    NH = block.NH
    q, k, v = block.c_attn(block.ln_1(x)).split(C, dim=2)
    q, k, v = (t.view(B, n, NH, C // NH).transpose(1, 2) for t in (q, k, v))
    if cache[0] is not None:
        k = torch.cat([cache[0], k], dim=2)
        v = torch.cat([cache[1], v], dim=2)
    cache[0], cache[1] = k, v
    y = _attention(q, k, v, n)
    x = x + block.c_proj(y.transpose(1, 2).contiguous().view(B, n, C))
    return x + block.mlp_proj(F.gelu(block.c_fc(block.ln_2(x)), approximate="tanh"))


def _attention(q, k, v, n):
    att = (q @ k.transpose(-2, -1)) / (k.size(-1) ** 0.5)
    if n > 1:  # the prompt: causal; a single new position sees every cached one
        P = k.size(2)
        mask = torch.ones(n, P, dtype=torch.bool).tril(diagonal=P - n)
        att = att.masked_fill(~mask, float("-inf"))
    return att.softmax(dim=-1) @ v


@torch.no_grad()
def generate(model, prompt, n):
    caches = [[None, None] for _ in model.h]
    ids = torch.tensor([prompt])
    pos, out = 0, []
    for _ in range(n):
        x = model.wte(ids) + model.wpe(torch.arange(pos, pos + ids.size(1)))
        for block, cache in zip(model.h, caches):
            x = block_step(block, x, cache)
        logits = model.ln_f(x[:, -1]) @ model.wte.weight.t()
        pos += ids.size(1)
        nxt = int(logits.argmax(dim=-1))
        out.append(nxt)
        ids = torch.tensor([[nxt]])
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--weights", required=True)
    ap.add_argument("--prompt-ids", required=True, help="comma-separated ids")
    ap.add_argument("--max-new-tokens", type=int, default=200)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    model = load(a.weights)
    prompt = [int(x) for x in a.prompt_ids.split(",")]
    generate(model, prompt, 8)  # warm-up
    best, tokens = None, None
    for _ in range(a.rounds):
        t0 = time.perf_counter()
        tokens = generate(model, prompt, a.max_new_tokens)
        s = time.perf_counter() - t0
        best = s if best is None else min(best, s)
    print(json.dumps({"impl": "pytorch", "tokens": tokens, "seconds": best,
                      "tokens_per_s": a.max_new_tokens / best, "threads": a.threads,
                      "torch": torch.__version__,
                      "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE", "")}))


if __name__ == "__main__":
    main()
