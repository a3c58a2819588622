#!/usr/bin/env python3
"""PyTorch's time for the ops bench/gpu_ops_bench.cc times, at the same
shapes on the same GPU and in the same --dtype (bf16 by default; f32),
one JSON object per line (ms per call; 3 warm-ups, then --reps calls
between two synchronisations). TF32 is off, as troupe's fp32 GEMMs. As
troupe keeps them, LayerNorm statistics, the loss, the weight gradient the
backward GEMM adds into and AdamW's tensors are fp32. Each line names the
PyTorch call it times ("torch"). Attention is timed as troupe computes it
(the T x T probabilities materialised) and, for reference, as PyTorch's
fused scaled_dot_product_attention (its flash kernel in bf16)."""
import argparse
import json
import time

import torch
import torch.nn.functional as F

B, T, C, NH, V, Vp, L = 8, 1024, 768, 12, 50257, 50304, 12
N = B * T


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--dtype", choices=["bf16", "f32"], default="bf16")
    args = ap.parse_args()
    reps = args.reps
    dt = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(1)

    def rnd32(*shape, scale=0.02):
        return torch.randn(*shape, device=dev, generator=g) * scale

    def rnd(*shape, scale=0.02):
        return rnd32(*shape, scale=scale).to(dt)

    def time_op(name, flop, fn, torch_call):
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
        ms = (time.perf_counter() - t0) * 1e3 / reps
        print(json.dumps({"op": name, "ms": round(ms, 4), "dtype": args.dtype, "torch": torch_call,
                          "tflops": round(flop / ms * 1e-9, 2) if flop else 0.0}), flush=True)

    tokens = torch.randint(0, V, (B, T), device=dev)
    targets = torch.randint(0, V, (N,), device=dev)
    wte, wpe, x = rnd(Vp, C), rnd(T, C), rnd(N, C, scale=1.0)
    lnw, lnb = rnd(C), rnd(C)
    qkv = rnd(B, T, 3 * C, scale=1.0)
    h, gl = rnd(N, 4 * C, scale=1.0), rnd(N, 4 * C)
    wqkv, bqkv, w4, b4, wp, bp = rnd(3 * C, C), rnd(3 * C), rnd(4 * C, C), rnd(4 * C), rnd(C, 4 * C), rnd(C)
    logits = rnd(N, Vp, scale=1.0)
    gwte = rnd32(Vp, C)  # a main gradient: the norm is of those
    dx, dw4, db4 = rnd(N, C), rnd32(4 * C, C), rnd32(4 * C)  # dw4, db4: fp32 main gradients
    pos = torch.arange(T, device=dev)
    mask = torch.ones(T, T, device=dev, dtype=torch.bool).tril()
    hs = C // NH

    def heads():
        q, k, v = qkv.split(C, dim=2)
        return [t.view(B, T, NH, hs).transpose(1, 2) for t in (q, k, v)]

    def attention_materialised():
        q, k, v = heads()
        att = (q @ k.transpose(-2, -1)) * (hs ** -0.5)
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        return (att @ v).transpose(1, 2).reshape(B, T, C)

    def attention_sdpa():
        q, k, v = heads()
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def matmul_backward():
        dinp = gl @ w4  # (N, 4C) . (4C, C)
        dw4.add_(gl.t() @ x)  # (PyTorch adds a bf16 product into the fp32 main gradient)
        db4.add_(gl.sum(0, dtype=torch.float32))
        return dinp

    dwp, dbp = rnd32(C, 4 * C), rnd32(C)  # fp32 main gradients

    def matmul_backward_gelu():
        dgl = dx @ wp  # (N, C) . (C, 4C)
        dwp.add_(dx.t() @ gl)
        dbp.add_(dx.sum(0, dtype=torch.float32))
        dh = torch.ops.aten.gelu_backward(dgl, h, approximate="tanh")
        db4.add_(dh.sum(0, dtype=torch.float32))
        return dh

    bt = float(N)
    with torch.no_grad():
        time_op("embedding_forward", 0, lambda: F.embedding(tokens, wte) + wpe[pos],
                "F.embedding(tokens, wte) + wpe[pos] (two kernels)")
        time_op("layernorm_forward", 0, lambda: F.layer_norm(x, (C,), lnw, lnb), "F.layer_norm")
        time_op("matmul_forward_qkv", 2 * bt * C * 3 * C, lambda: F.linear(x, wqkv, bqkv),
                "F.linear")
        time_op("matmul_forward_fc", 2 * bt * C * 4 * C, lambda: F.linear(x, w4, b4), "F.linear")
        time_op("matmul_forward_proj", 2 * bt * C * 4 * C, lambda: F.linear(gl, wp, bp),
                "F.linear")
        time_op("matmul_forward_lm_head", 2 * bt * C * Vp, lambda: F.linear(x, wte), "F.linear")
        time_op("matmul_backward_fc", 4 * bt * C * 4 * C, matmul_backward,
                "gl @ w4; dw4.add_(gl.t() @ x); db4.add_(gl.sum(0))")
        time_op("gelu_forward", 0, lambda: F.gelu(h, approximate="tanh"),
                "F.gelu(approximate='tanh')")
        time_op("matmul_gelu_forward_fc", 2 * bt * C * 4 * C,
                lambda: F.gelu(F.linear(x, w4, b4), approximate="tanh"),
                "F.linear, then F.gelu(approximate='tanh') (unfused: what eager runs)")
        time_op("matmul_backward_gelu_proj", 4 * bt * C * 4 * C, matmul_backward_gelu,
                "dx @ wp; dwp.add_(dx.t() @ gl); dbp.add_(dx.sum(0)); "
                "aten.gelu_backward(tanh); db4.add_(dh.sum(0)) (unfused)")
        time_op("attention_forward", 4.0 * B * T * T * C / 2, attention_materialised,
                "q @ k^T, masked_fill, softmax, @ v (T x T materialised)")
        time_op("attention_forward_sdpa", 4.0 * B * T * T * C / 2, attention_sdpa,
                "F.scaled_dot_product_attention(is_causal=True)")
        # Flash attention's shapes (gpu_ops_bench.cc's names): SDPA, its flash
        # kernel in bf16, forward and forward + backward.
        for Ta in (1024, 4096, 8192):
            for hs_a in (64, 128):
                Ba, NHa = 8192 // Ta, 12 if hs_a == 64 else 16
                Ca = NHa * hs_a
                # q, k, v as views of one (B, T, 3C) tensor, as troupe reads them
                qkv_a = torch.randn(Ba, Ta, 3 * Ca, device=dev, dtype=dt)

                def split(t, Ba=Ba, Ta=Ta, NHa=NHa, hs_a=hs_a, Ca=Ca):
                    return [x.view(Ba, Ta, NHa, hs_a).transpose(1, 2) for x in t.split(Ca, dim=2)]

                q, k, v = split(qkv_a)
                dy = torch.randn_like(q)
                fwd = 4.0 * Ba * NHa * Ta * Ta * hs_a / 2
                name = f"T{Ta}_hs{hs_a}"
                time_op(f"attention_fwd_{name}", fwd,
                        lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                        "F.scaled_dot_product_attention(is_causal=True)")
                qkv_g = qkv_a.detach().requires_grad_()

                def fwd_bwd(qkv_g=qkv_g, dy=dy, split=split):
                    with torch.enable_grad():
                        qg, kg, vg = split(qkv_g)
                        y = F.scaled_dot_product_attention(qg, kg, vg, is_causal=True)
                        # the gradient of qkv, not accumulated into .grad
                        return torch.autograd.grad(y, qkv_g, dy)

                time_op(f"attention_fwdbwd_{name}", 3.5 * fwd, fwd_bwd,
                        "SDPA(is_causal=True) on views of one qkv, forward, then autograd.grad")
        time_op("crossentropy_forward", 0, lambda: F.cross_entropy(logits[:, :V].float(), targets),
                "F.cross_entropy(logits[:, :V].float()) (fp32 loss, as troupe's)")
        time_op("residual_forward", 0, lambda: x + dx, "x + dx")
        time_op("squared_norm_wte", 0, lambda: gwte.double().square().sum(),
                "g.double().square().sum() (fp32 main gradient)")
    shapes = [(Vp, C), (T, C)]
    for _ in range(L):
        shapes += [(C,), (C,), (3 * C, C), (3 * C,), (C, C), (C,), (C,), (C,), (4 * C, C), (4 * C,),
                   (C, 4 * C), (C,)]
    shapes += [(C,), (C,)]
    params = [torch.nn.Parameter(rnd32(*s)) for s in shapes]  # fp32 master, as troupe's
    for p in params:
        p.grad = rnd32(*p.shape)
    opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.1, fused=True)
    if dt == torch.float32:
        time_op("adamw_many_gpt2_124m", 0, opt.step, "torch.optim.AdamW(fused=True).step")
    else:
        # troupe's bf16 step also writes the bf16 compute copy of the master
        copies = [p.detach().to(dt) for p in params]

        def step_and_copy():
            opt.step()
            with torch.no_grad():
                torch._foreach_copy_(copies, [p.detach() for p in params])

        time_op("adamw_many_gpt2_124m", 0, step_and_copy,
                "torch.optim.AdamW(fused=True).step, then torch._foreach_copy_ into bf16 copies")


if __name__ == "__main__":
    main()
