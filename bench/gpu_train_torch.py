#!/usr/bin/env python3
"""PyTorch's own GPT-2 124M training step at troupe's gpt2-124m shapes
(B 8, T 1024, C 768, 12 layers of 12 heads, V 50257 padded to 50304, the LM
head tied to wte, pre-LN, tanh GELU, no dropout): bf16 autocast, fp32
master weights, scaled_dot_product_attention (its flash kernel), fused
AdamW; eager and torch.compile, each in its own timed loop. One JSON line
per mode: {"impl": "torch-eager" | "torch-compile", "tokens_per_s": median
over the timed steps, "step_ms", "warmup_s" (torch.compile's compile is in
it)}. scripts/gpu-check runs it after troupe's speed run and reports both
beside troupe's tokens/s, with one MFU formula for all three."""
import argparse
import json
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

B, T, C, NH, L, V, Vp = 8, 1024, 768, 12, 12, 50257, 50304


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.c_attn, self.c_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.c_fc, self.mlp_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

    def forward(self, x):
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, NH, C // NH).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(Vp, C), nn.Embedding(T, C)
        self.h = nn.ModuleList(Block() for _ in range(L))
        self.ln_f = nn.LayerNorm(C)
        for name, p in self.named_parameters():  # GPT-2's initialisation
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * L) if name.endswith("c_proj.weight") or \
                    name.endswith("mlp_proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for block in self.h:
            x = block(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)  # tied LM head
        return F.cross_entropy(logits[..., :V].float().view(-1, V), targets.view(-1))


def run(mode, steps, warmup):
    torch.manual_seed(0)
    dev = torch.device("cuda")
    model = GPT().to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1,
                            fused=True)
    step_model = torch.compile(model) if mode == "torch-compile" else model
    g = torch.Generator(device=dev).manual_seed(1)
    idx = torch.randint(0, V, (B, T), device=dev, generator=g)
    targets = torch.randint(0, V, (B, T), device=dev, generator=g)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = step_model(idx, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    t0 = time.perf_counter()
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    warmup_s = time.perf_counter() - t0
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        loss = step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    times.sort()
    step_s = times[len(times) // 2]
    print(json.dumps({"impl": mode, "B": B, "T": T, "dtype": "bf16-autocast",
                      "tokens_per_s": round(B * T / step_s, 1), "step_ms": round(step_s * 1e3, 3),
                      "warmup_s": round(warmup_s, 1), "loss": round(float(loss), 4)}), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--modes", default="torch-eager,torch-compile")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = True  # PyTorch's usual setting (autocast is bf16)
    for mode in args.modes.split(","):
        run(mode, args.steps, args.warmup)


if __name__ == "__main__":
    main()
