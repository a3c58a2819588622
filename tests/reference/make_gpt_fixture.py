#!/usr/bin/python3
"""Makes the PyTorch fixture of troupe's GPT agreement test (tests/gpt_reference_test.cc).

Builds the `tiny` GPT (L=4, C=64, NH=4, T=64, V=512) with GPT-2 initialisation
from a fixed torch seed, writes its weights as Hugging Face GPT-2 safetensors,
runs one batch forward and backward, then 10 AdamW steps on that batch, and
writes inputs, logits, loss, every gradient and the 10 losses. Run with
Debian's python3-torch:

    /usr/bin/python3 tests/reference/make_gpt_fixture.py tests/reference/data
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt_torch import GPT, save_weights, write_safetensors  # noqa: E402

# The optimizer settings the C++ test repeats.
B, STEPS = 4, 10
LR, WD, BETAS, EPS, CLIP = 1e-3, 0.1, (0.9, 0.95), 1e-8, 1.0


def main(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(1234)
    model = GPT(L=4, C=64, NH=4, T=64, V=512)
    model.init_gpt2(g)
    save_weights(model, os.path.join(out_dir, "tiny_weights.safetensors"))

    tokens = torch.randint(0, model.V, (B, model.T + 1), generator=g)
    inputs, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    logits, loss = model(inputs, targets)
    loss.backward()
    fixture = [("inputs", inputs.to(torch.int32)), ("targets", targets.to(torch.int32)),
               ("logits", logits), ("loss", loss.reshape(1))]
    for name, p, conv1d in model.hf_tensors():
        grad = p.grad.t() if conv1d else p.grad
        fixture.append(("grad." + name, grad))

    opt = torch.optim.AdamW(model.param_groups(WD), lr=LR, betas=BETAS, eps=EPS)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad(set_to_none=True)
        _, loss = model(inputs, targets)
        losses.append(loss.item())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
    fixture.append(("losses", torch.tensor(losses, dtype=torch.float32)))
    meta = {"lr": str(LR), "weight_decay": str(WD), "beta1": str(BETAS[0]),
            "beta2": str(BETAS[1]), "eps": str(EPS), "clip_grad": str(CLIP),
            "torch": torch.__version__}
    write_safetensors(os.path.join(out_dir, "tiny_fixture.safetensors"), fixture, meta)
    print("losses:", " ".join(f"{l:.6f}" for l in losses))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "data"))
