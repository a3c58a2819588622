#!/usr/bin/python3
"""The speed anchor of `scripts/bench train`: one training step of a GPT in
PyTorch eager on the CPU (Debian's python3-torch), the same model, batch and
thread count as troupe's bench/train_step.cc.

Prints one JSON object: {"impl": "pytorch", "step_s": median, "tokens_per_s": ...}.
Run it with OPENBLAS_CORETYPE set to the CPU's real type (scripts/bench does),
or Debian's OpenBLAS 0.3.21 picks slow Prescott kernels on newer Xeons.
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "reference"))
from gpt_torch import GPT  # noqa: E402

PRESETS = {"cpu-small": (4, 256, 4, 256, 50257), "tiny": (4, 64, 4, 64, 512)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="cpu-small", choices=sorted(PRESETS))
    ap.add_argument("--micro-batch-size", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    L, C, NH, T, V = PRESETS[a.model]
    g = torch.Generator().manual_seed(1)
    model = GPT(L, C, NH, T, V)
    model.init_gpt2(g)
    opt = torch.optim.AdamW(model.param_groups(0.1), lr=1e-4, betas=(0.9, 0.95), eps=1e-8)
    tokens = torch.randint(0, V, (a.micro_batch_size, T + 1), generator=g)
    x, y = tokens[:, :-1], tokens[:, 1:]
    times = []
    for i in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if i >= a.warmup:
            times.append(time.perf_counter() - t0)
    step = statistics.median(times)
    print(json.dumps({"impl": "pytorch", "model": a.model, "B": a.micro_batch_size, "T": T,
                      "threads": a.threads, "step_s": step,
                      "tokens_per_s": a.micro_batch_size * T / step,
                      "torch": torch.__version__,
                      "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE", "")}))


if __name__ == "__main__":
    main()
