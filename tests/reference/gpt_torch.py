"""GPT-2 in PyTorch, written to be read against troupe's model/gpt.cc.

Pre-LN blocks, fused qkv, 4C MLP with tanh-GELU, final LN, LM head tied to
the token embedding, LayerNorm eps 1e-5, no dropout. Linear weights are
PyTorch's (out, in); Hugging Face GPT-2 files hold Conv1D weights as (in, out),
which save/load transpose. Used by make_gpt_fixture.py (the agreement test's
fixture) and bench/train_torch.py (the speed anchor).
"""
import json
import math
import struct

import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self, C, NH):
        super().__init__()
        self.NH = NH
        self.ln_1 = nn.LayerNorm(C, eps=1e-5)
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C, eps=1e-5)
        self.c_fc = nn.Linear(C, 4 * C)
        self.mlp_proj = nn.Linear(4 * C, C)

    def attention(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, self.NH, C // self.NH).transpose(1, 2)
        k = k.view(B, T, self.NH, C // self.NH).transpose(1, 2)
        v = v.view(B, T, self.NH, C // self.NH).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)

    def forward(self, x):
        x = x + self.attention(self.ln_1(x))
        x = x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))
        return x


class GPT(nn.Module):
    def __init__(self, L, C, NH, T, V):
        super().__init__()
        self.L, self.C, self.NH, self.T, self.V = L, C, NH, T, V
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(T, C)
        self.h = nn.ModuleList([Block(C, NH) for _ in range(L)])
        self.ln_f = nn.LayerNorm(C, eps=1e-5)

    def init_gpt2(self, generator):
        std = 0.02
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif "ln_" in name:
                nn.init.ones_(p)
            elif name.endswith("c_proj.weight") or name.endswith("mlp_proj.weight"):
                with torch.no_grad():
                    p.normal_(0.0, std / math.sqrt(2 * self.L), generator=generator)
            else:
                with torch.no_grad():
                    p.normal_(0.0, std, generator=generator)

    def forward(self, tokens, targets=None):
        B, T = tokens.shape
        x = self.wte(tokens) + self.wpe(torch.arange(T))
        for block in self.h:
            x = block(x)
        logits = self.ln_f(x) @ self.wte.weight.t()
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, self.V), targets.reshape(-1))
        return logits, loss

    # Hugging Face GPT-2 names; `conv1d` marks weights stored as (in, out).
    def hf_tensors(self):
        out = [("wte.weight", self.wte.weight, False), ("wpe.weight", self.wpe.weight, False)]
        for i, b in enumerate(self.h):
            p = f"h.{i}."
            out += [
                (p + "ln_1.weight", b.ln_1.weight, False), (p + "ln_1.bias", b.ln_1.bias, False),
                (p + "attn.c_attn.weight", b.c_attn.weight, True),
                (p + "attn.c_attn.bias", b.c_attn.bias, False),
                (p + "attn.c_proj.weight", b.c_proj.weight, True),
                (p + "attn.c_proj.bias", b.c_proj.bias, False),
                (p + "ln_2.weight", b.ln_2.weight, False), (p + "ln_2.bias", b.ln_2.bias, False),
                (p + "mlp.c_fc.weight", b.c_fc.weight, True),
                (p + "mlp.c_fc.bias", b.c_fc.bias, False),
                (p + "mlp.c_proj.weight", b.mlp_proj.weight, True),
                (p + "mlp.c_proj.bias", b.mlp_proj.bias, False),
            ]
        out += [("ln_f.weight", self.ln_f.weight, False), ("ln_f.bias", self.ln_f.bias, False)]
        return out

    def metadata(self):
        return {"format": "pt", "n_layer": str(self.L), "n_embd": str(self.C),
                "n_head": str(self.NH), "vocab_size": str(self.V), "n_ctx": str(self.T)}

    def param_groups(self, weight_decay):
        """Megatron's groups: no decay on biases and LayerNorm parameters."""
        decay, no_decay = [], []
        for name, p in self.named_parameters():
            (no_decay if name.endswith("bias") or "ln_" in name else decay).append(p)
        return [{"params": decay, "weight_decay": weight_decay},
                {"params": no_decay, "weight_decay": 0.0}]


_DTYPES = {torch.float32: "F32", torch.int32: "I32", torch.float64: "F64"}


def write_safetensors(path, tensors, metadata=None):
    """Writes [(name, tensor)] in the safetensors format (no third-party package)."""
    header, blobs, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for name, t in tensors:
        t = t.detach().contiguous()
        data = t.numpy().tobytes()
        header[name] = {"dtype": _DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    inv = {v: k for k, v in _DTYPES.items()}
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        t = torch.frombuffer(bytearray(data[b:end]), dtype=inv[e["dtype"]])
        out[name] = t.reshape(e["shape"])
    return out


def save_weights(model, path):
    tensors = [(n, p.t() if conv1d else p) for n, p, conv1d in model.hf_tensors()]
    write_safetensors(path, tensors, model.metadata())
