#!/usr/bin/python3
"""One transformer layer's activations per micro-batch, as troupe allocates
them, beside Korthikanti et al. 2022's formulas (Table 2), for each
recompute mode and for sequence parallelism.

Measured: `troupe train` prints what each stage's micro-batch keeps (the
device's byte count); the difference between a model of 2 layers and one
of 1 layer is one layer's. The formulas, per layer, s = T, b = B, h = C,
a = NH, t = tp:
  paper (16-bit, dropout)   none 34sbh + 5as^2b; selective 34sbh;
                            full 2sbh; tp divides all but 10sbh, sequence
                            parallelism all of it
  troupe (fp32, no dropout) the paper's tensors without the dropout masks
                            and outputs, in 4 bytes: none 64sbh + 4as^2b +
                            16sb (LayerNorm mean and rstd), selective
                            64sbh + 16sb, full 4sbh (the layer's input)
With flash attention (--attention-kernel flash, the CPU's default) the
scores are never kept: none and selective are both 64sbh + 16sb + 4asb
(each row's log-sum-exp), and the paper's none is its selective.

  bench/activation_memory.py [TROUPE]     (default build/launcher/troupe)
"""
import os
import re
import subprocess
import sys
os.environ.setdefault("TROUPE_DEVICE", "cpu")  # the CPU (a GPU host defaults to cuda)

TROUPE = sys.argv[1] if len(sys.argv) > 1 else "build/launcher/troupe"
MODELS = {"cpu-small": (256, 1, 256, 4), "gpt2-124m": (1024, 1, 768, 12)}  # s, b, h, a
MIB = 1 << 20


def measured(model, layers, flags):
    p = subprocess.run([TROUPE, "train", "--model", model, "--layers", str(layers), "--steps", "0",
                        "--micro-batch-size", "1", "--threads", "1", *flags],
                       capture_output=True, text=True, check=True)
    m = re.search(r"activations per micro-batch \(MiB.*?\): ([0-9.]+)", p.stdout)
    return float(m.group(1))


def paper(s, b, h, a, t, mode, sp, kernel):
    sbh = s * b * h
    if mode == "full":
        return 2 * sbh / (t if sp else 1)
    if kernel == "flash":
        mode = "selective"  # no 5as/h term
    if mode == "selective":
        return sbh * 34 / t if sp else sbh * (10 + 24 / t)
    return sbh * (34 + 5 * a * s / h) / t if sp else sbh * (10 + 24 / t + 5 * a * s / (h * t))


def troupe(s, b, h, a, t, mode, sp, kernel):
    sb, sbh = s * b, s * b * h
    regions, rest = 4 * (4 * sbh + 4 * sb), 4 * 12 * sbh / t  # LN/residual; qkv, atty, fc
    if mode == "full":
        return 4 * sbh / (t if sp else 1)
    kept = regions / (t if sp else 1) + rest
    if kernel == "flash":
        return kept + 4 * a * s * b / t  # the log-sum-exps
    return kept if mode == "selective" else kept + 4 * a * s * s * b / t


rows = []
for model, (s, b, h, a) in MODELS.items():
    for kernel, mode, t, sp in [
            ("reference", "none", 1, False), ("reference", "selective", 1, False),
            ("reference", "full", 1, False), ("reference", "none", 2, False),
            ("reference", "none", 2, True), ("reference", "selective", 2, True),
            ("flash", "none", 1, False), ("flash", "selective", 1, False),
            ("flash", "none", 2, True)]:
        flags = ["--attention-kernel", kernel]
        flags += [] if mode == "none" else ["--recompute-granularity", mode]
        if t > 1:
            flags += ["--tp", str(t)]
        if sp:
            flags += ["--sequence-parallel"]
        layer = (measured(model, 2, flags) - measured(model, 1, flags)) * MIB
        rows.append((model, f"{kernel[:5]} " + mode + (f", tp {t}" if t > 1 else "") +
                     (", SP" if sp else ""),
                     layer / MIB, troupe(s, b, h, a, t, mode, sp, kernel) / MIB,
                     paper(s, b, h, a, t, mode, sp, kernel) / MIB))
print(f"{'model':10} {'kernel, mode':22} {'measured':>10} {'fp32 formula':>13} {'paper 16-bit':>13}"
      f" {'measured/paper':>15}   (MiB a layer, micro-batch of 1)")
for r in rows:
    print(f"{r[0]:10} {r[1]:22} {r[2]:10.3f} {r[3]:13.3f} {r[4]:13.3f} {r[2] / r[4]:15.2f}")
